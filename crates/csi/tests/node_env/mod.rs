//! The node tests' environment: a real Lamina daemon (the server crate's
//! `run`, as `lamina serve` runs it, on a runtime of its own so that the
//! test's blocking I/O cannot starve it) in a temporary directory, the CSI
//! driver served in Mode::All on a unix socket there, and gRPC clients over
//! that socket. The daemon runs in process because Cargo gives the `lamina`
//! binary's path only to the CLI crate's tests. It serves no files, so
//! staging falls back to nbdfuse (see `spawn_daemon_with`).
//!
//! Every call is bounded in time (a hang fails the test, naming the call).
//! Dropping the environment removes whatever a failing test left on the
//! machine under its directory (mounts, loop devices, nbdfuse processes)
//! and stops the driver and the daemon.

#![allow(dead_code)]

use lamina_csi::proto::controller_client::ControllerClient;
use lamina_csi::proto::group_controller_client::GroupControllerClient;
use lamina_csi::proto::node_client::NodeClient;
use lamina_csi::proto::volume_capability::{access_mode, AccessMode, AccessType};
use lamina_csi::proto::volume_capability::{BlockVolume, MountVolume};
use lamina_csi::proto::*;
use lamina_test_support::{try_run, wait_until, COMMAND_LIMIT};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// The bound on one gRPC call or a start or stop (a hang guard, not a
/// measurement).
pub const LIMIT: Duration = COMMAND_LIMIT;

pub struct Env {
    dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
    daemon_stop: Option<tokio::sync::oneshot::Sender<()>>,
    daemon: Option<tokio::task::JoinHandle<Result<(), lamina_server::ServerError>>>,
    csi_stop: Option<tokio::sync::oneshot::Sender<()>>,
    csi: Option<tokio::task::JoinHandle<Result<(), lamina_csi::Error>>>,
    pub client: lamina_client::Client,
    channel: Option<Channel>,
}

impl Env {
    #[track_caller]
    pub fn start() -> Env {
        let (dir, rt) = temp_dir_and_runtime("lcsi");
        let data = dir.path().join("data");
        let (daemon, tx, client) = spawn_daemon(&rt, &data);
        let mut env = Env {
            dir,
            rt,
            daemon_stop: Some(tx),
            daemon: Some(daemon),
            csi_stop: None,
            csi: None,
            client,
            channel: None,
        };
        env.start_csi();
        env
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn state_dir(&self) -> PathBuf {
        self.path("state")
    }

    fn socket(&self) -> PathBuf {
        self.path("csi.sock")
    }

    /// Serve the driver (all services) on the environment's socket, with
    /// the node service's records in `state/`.
    fn start_csi(&mut self) {
        let opts = lamina_csi::Options {
            mode: lamina_csi::Mode::All,
            endpoint: format!("unix://{}", self.socket().display()),
            driver_name: lamina_csi::DRIVER_NAME.into(),
            node_id: "node-1".into(),
            storage_node: "node-1".into(),
            nodes: lamina_csi::NodeSource::Single,
            state_dir: self.state_dir(),
            freeze_socket: Some(self.path("data").join(lamina_api::freeze::SOCKET)),
            client: self.client.clone(),
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        self.csi = Some(self.rt.spawn(lamina_csi::serve(opts, async {
            let _ = rx.await;
        })));
        self.csi_stop = Some(tx);
        self.channel = Some(connect(&self.rt, &self.socket()));
    }

    /// Stop the driver and serve a new one over the same state directory:
    /// a restart of the node plugin (nothing in memory survives it).
    #[track_caller]
    pub fn restart_csi(&mut self) {
        self.stop_csi().unwrap_or_else(|e| panic!("{e}"));
        self.start_csi();
    }

    fn stop_csi(&mut self) -> Result<(), String> {
        self.channel = None;
        if let Some(tx) = self.csi_stop.take() {
            let _ = tx.send(());
        }
        let Some(h) = self.csi.take() else {
            return Ok(());
        };
        match self
            .rt
            .block_on(async { tokio::time::timeout(LIMIT, h).await })
        {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(format!("the CSI server failed: {e}")),
            Ok(Err(e)) => Err(format!("the CSI server panicked: {e}")),
            Err(_) => Err(format!("the CSI server did not stop within {LIMIT:?}")),
        }
    }

    pub fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel.clone().expect("the driver is served"))
    }

    pub fn ctl(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel.clone().expect("the driver is served"))
    }

    pub fn group(&self) -> GroupControllerClient<Channel> {
        GroupControllerClient::new(self.channel.clone().expect("the driver is served"))
    }

    /// Run one call on the environment's runtime; a hang fails the test.
    #[track_caller]
    pub fn call<T>(&self, what: &str, f: impl Future<Output = T>) -> T {
        match self
            .rt
            .block_on(async { tokio::time::timeout(LIMIT, f).await })
        {
            Ok(v) => v,
            Err(_) => panic!("{what} did not answer within {LIMIT:?}"),
        }
    }

    /// A volume made through the driver's CreateVolume; its CSI id.
    #[track_caller]
    pub fn create_volume(&self, name: &str, size: u64) -> String {
        let req = create_request(name, size);
        let v = self
            .call("CreateVolume", self.ctl().create_volume(req))
            .unwrap_or_else(|s| panic!("CreateVolume {name}: {s:?}"))
            .into_inner()
            .volume
            .expect("a volume");
        v.volume_id
    }

    pub fn stage(
        &self,
        id: &str,
        staging: &Path,
        cap: VolumeCapability,
    ) -> Result<(), tonic::Status> {
        let req = NodeStageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(cap),
            ..Default::default()
        };
        self.call("NodeStageVolume", self.node().node_stage_volume(req))
            .map(drop)
    }

    pub fn unstage(&self, id: &str, staging: &Path) -> Result<(), tonic::Status> {
        let req = NodeUnstageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
        };
        self.call("NodeUnstageVolume", self.node().node_unstage_volume(req))
            .map(drop)
    }

    pub fn publish(
        &self,
        id: &str,
        staging: &Path,
        target: &Path,
        cap: VolumeCapability,
        readonly: bool,
    ) -> Result<(), tonic::Status> {
        let req = NodePublishVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(cap),
            readonly,
            ..Default::default()
        };
        self.call("NodePublishVolume", self.node().node_publish_volume(req))
            .map(drop)
    }

    pub fn unpublish(&self, id: &str, target: &Path) -> Result<(), tonic::Status> {
        let req = NodeUnpublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.display().to_string(),
        };
        self.call(
            "NodeUnpublishVolume",
            self.node().node_unpublish_volume(req),
        )
        .map(drop)
    }

    pub fn stats(
        &self,
        id: &str,
        path: &Path,
    ) -> Result<NodeGetVolumeStatsResponse, tonic::Status> {
        let req = NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            volume_path: path.display().to_string(),
            staging_target_path: String::new(),
        };
        self.call("NodeGetVolumeStats", self.node().node_get_volume_stats(req))
            .map(|r| r.into_inner())
    }

    pub fn expand(&self, id: &str, path: &Path, required: u64) -> Result<i64, tonic::Status> {
        let req = NodeExpandVolumeRequest {
            volume_id: id.into(),
            volume_path: path.display().to_string(),
            capacity_range: Some(CapacityRange {
                required_bytes: required as i64,
                limit_bytes: 0,
            }),
            ..Default::default()
        };
        self.call("NodeExpandVolume", self.node().node_expand_volume(req))
            .map(|r| r.into_inner().capacity_bytes)
    }

    /// The daemon's view of a volume.
    #[track_caller]
    pub fn volume(&self, name: &str) -> lamina_api::Volume {
        self.call("get_volume", self.client.get_volume(name))
            .unwrap_or_else(|e| panic!("get volume {name}: {e}"))
    }

    /// Loop devices whose backing file is under this environment.
    pub fn loops(&self) -> Vec<String> {
        let root = self.root().to_string_lossy().into_owned();
        let mut out = Vec::new();
        for e in std::fs::read_dir("/sys/block").unwrap().flatten() {
            let b = std::fs::read_to_string(e.path().join("loop/backing_file")).unwrap_or_default();
            if b.starts_with(&root) {
                out.push(format!("/dev/{}", e.file_name().to_string_lossy()));
            }
        }
        out
    }

    /// Live nbdfuse processes serving files under this environment.
    pub fn nbdfuse_pids(&self) -> Vec<u32> {
        let root = self.root().to_string_lossy().into_owned();
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let args: Vec<String> = cmd
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let zombie = stat
                .rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
            if !zombie
                && args.first().is_some_and(|a| a.ends_with("nbdfuse"))
                && args.iter().any(|a| a.starts_with(&root))
            {
                out.push(pid);
            }
        }
        out
    }

    /// Mount points under this environment, deepest last.
    pub fn mounts(&self) -> Vec<PathBuf> {
        let root = self.root().to_string_lossy().into_owned();
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        text.lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(&root))
            .map(PathBuf::from)
            .collect()
    }

    /// Nothing of the node's work is left on the machine or in the daemon.
    #[track_caller]
    pub fn assert_clean(&self, volume: &str) {
        assert_eq!(self.mounts(), Vec::<PathBuf>::new(), "mounts left");
        assert_eq!(self.loops(), Vec::<String>::new(), "loop devices left");
        assert_eq!(self.nbdfuse_pids(), Vec::<u32>::new(), "nbdfuse left");
        assert_eq!(self.volume(volume).export, None, "the export is left");
        let records: Vec<_> = std::fs::read_dir(self.state_dir().join("volumes"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(records.is_empty(), "records left: {records:?}");
    }

    /// Remove what a failing test left: loop devices, mounts, nbdfuse.
    fn sweep(&self) {
        // Loop devices first: they are found by their backing file's path,
        // which a lazy unmount of nbdfuse's directory would hide. A loop
        // device still mounted goes when its mount does.
        for l in self.loops() {
            let _ = try_run(Command::new("losetup").arg("-d").arg(l));
        }
        for m in self.mounts().iter().rev() {
            // A filesystem a failed freeze test left frozen would keep
            // its writers waiting after a lazy unmount.
            let _ = try_run(Command::new("fsfreeze").arg("-u").arg(m));
            let _ = try_run(Command::new("umount").arg("-l").arg(m));
        }
        for pid in self.nbdfuse_pids() {
            let _ = try_run(Command::new("kill").arg("-9").arg(pid.to_string()));
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let failing = std::thread::panicking();
        self.sweep();
        let mut errors = Vec::new();
        if let Err(e) = self.stop_csi() {
            errors.push(e);
        }
        if let Some(tx) = self.daemon_stop.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.daemon.take() {
            match self
                .rt
                .block_on(async { tokio::time::timeout(LIMIT, h).await })
            {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => errors.push(format!("the daemon failed: {e}")),
                Ok(Err(e)) => errors.push(format!("the daemon panicked: {e}")),
                Err(_) => errors.push(format!("the daemon did not stop within {LIMIT:?}")),
            }
        }
        if !errors.is_empty() {
            // A second panic while unwinding would abort the test binary.
            if failing {
                eprintln!("{}", errors.join("\n"));
            } else {
                panic!("{}", errors.join("\n"));
            }
        }
    }
}

pub fn cap(access: AccessType, mode: access_mode::Mode) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(access),
    }
}

/// CreateVolume of `size` bytes, mount access, no source or topology.
pub fn create_request(name: &str, size: u64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: size as i64,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_cap("")],
        ..Default::default()
    }
}

/// A temporary directory under /tmp (short: unix socket paths are limited
/// to 108 bytes) and a runtime of two threads.
pub fn temp_dir_and_runtime(prefix: &str) -> (tempfile::TempDir, tokio::runtime::Runtime) {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .expect("temp dir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    (dir, rt)
}

pub type Daemon = tokio::task::JoinHandle<Result<(), lamina_server::ServerError>>;

/// A daemon on `data` served on `rt` until the sender is used or dropped,
/// once it answers; with its client.
#[track_caller]
pub fn spawn_daemon(
    rt: &tokio::runtime::Runtime,
    data: &Path,
) -> (
    Daemon,
    tokio::sync::oneshot::Sender<()>,
    lamina_client::Client,
) {
    spawn_daemon_with(rt, data, Default::default())
}

/// [`spawn_daemon`] with a transfer configuration (TLS, listener).
#[track_caller]
pub fn spawn_daemon_with(
    rt: &tokio::runtime::Runtime,
    data: &Path,
    transfer: lamina_server::TransferConfig,
) -> (
    Daemon,
    tokio::sync::oneshot::Sender<()>,
    lamina_client::Client,
) {
    std::fs::create_dir_all(data).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    // No files: this daemon runs in the test's process, and a process that
    // serves the FUSE file a mounted filesystem's loop device reads can wait
    // on itself (a test that fails with the filesystem mounted would hang
    // at its exit). These tests stage through nbdfuse, the path of a daemon
    // that serves no files; crates/e2e/tests/csi runs the daemon's files
    // with `lamina serve` in a process of its own.
    let config = lamina_server::Config::new(data)
        .transfer(transfer)
        .files(false);
    let daemon = rt.spawn(lamina_server::run(config, async {
        let _ = rx.await;
    }));
    let client = lamina_client::Client::unix(data.join("api.sock"));
    wait_until("the daemon to answer", LIMIT, || {
        rt.block_on(client.health()).ok()
    });
    (daemon, tx, client)
}

/// A gRPC channel to a driver served on `sock`, once it accepts.
#[track_caller]
pub fn connect(rt: &tokio::runtime::Runtime, sock: &Path) -> Channel {
    wait_until("the CSI socket to accept", LIMIT, || {
        let s = sock.to_path_buf();
        rt.block_on(
            Endpoint::from_static("http://csi.local").connect_with_connector(tower::service_fn(
                move |_| {
                    let s = s.clone();
                    async move {
                        let c = tokio::net::UnixStream::connect(s).await?;
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(c))
                    }
                },
            )),
        )
        .ok()
    })
}

/// Mount access, single node writer, with `fs` ("" for the default).
pub fn mount_cap(fs: &str) -> VolumeCapability {
    cap(
        AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            mount_flags: vec![],
            volume_mount_group: String::new(),
        }),
        access_mode::Mode::SingleNodeWriter,
    )
}

/// Block access, single node writer.
pub fn block_cap() -> VolumeCapability {
    cap(
        AccessType::Block(BlockVolume {}),
        access_mode::Mode::SingleNodeWriter,
    )
}

/// The Lamina name in a CSI volume id (`NAME@ID`).
pub fn name_of(volume_id: &str) -> String {
    volume_id.rsplit_once('@').expect("NAME@ID").0.to_string()
}

/// Deterministic test bytes, different for each `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(7).wrapping_add(u32::from(seed)) as u8 ^ (i >> 12) as u8)
        .collect()
}
