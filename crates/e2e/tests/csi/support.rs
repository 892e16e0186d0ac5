//! A real `lamina serve` and a real `lamina csi --mode all` beside it, and
//! gRPC clients of the driver's services over its unix socket.

#![allow(dead_code)]

use crate::LAMINA;
use lamina_csi::proto::controller_client::ControllerClient;
use lamina_csi::proto::group_controller_client::GroupControllerClient;
use lamina_csi::proto::node_client::NodeClient;
use lamina_test_support::{run, wait_until, Daemon};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint, Uri};

pub struct Csi {
    /// Dropped after the driver (fields drop in order).
    child: Child,
    pub daemon: Daemon,
    pub sock: PathBuf,
    pub rt: tokio::runtime::Runtime,
    channel: Channel,
    /// The driver runs in a mount namespace of its own (`unshare`), as in
    /// the node pod's container: see [`Csi::start_in_mount_namespace`].
    own_ns: bool,
}

impl Csi {
    #[track_caller]
    pub fn start() -> Csi {
        Csi::start_with(false)
    }

    /// The driver in a mount namespace of its own, as the chart's node
    /// plugin runs in its container: the daemon's data directory is made a
    /// shared mount first (the chart's Bidirectional propagation), so the
    /// daemon's FUSE files reach the driver and the driver's staging and
    /// publish mounts (under the data directory here) reach this test. Each
    /// driver's namespace ends with it, and with it the driver's copies of
    /// the mounts it opened.
    #[track_caller]
    pub fn start_in_mount_namespace() -> Csi {
        Csi::start_with(true)
    }

    #[track_caller]
    fn start_with(own_ns: bool) -> Csi {
        let daemon = LAMINA.start();
        if own_ns {
            let d = daemon.data().display().to_string();
            run(Command::new("mount").args(["--bind", &d, &d])).ok();
            run(Command::new("mount").args(["--make-rshared", &d])).ok();
        }
        let sock = daemon.data().join("csi.sock");
        let child = spawn_driver(&daemon, &sock, own_ns);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let channel = connect(&rt, &sock);
        Csi {
            child,
            daemon,
            sock,
            rt,
            channel,
            own_ns,
        }
    }

    /// Kill the driver with SIGKILL (it cleans nothing up) and start a new
    /// one on the same socket and state directory.
    #[track_caller]
    pub fn kill_and_restart_driver(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.child = spawn_driver(&self.daemon, &self.sock, self.own_ns);
        self.channel = connect(&self.rt, &self.sock);
    }

    pub fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel.clone())
    }

    pub fn group(&self) -> GroupControllerClient<Channel> {
        GroupControllerClient::new(self.channel.clone())
    }

    pub fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel.clone())
    }

    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.daemon.data().join("csi.log")).unwrap_or_default()
    }
}

#[track_caller]
fn spawn_driver(daemon: &Daemon, sock: &Path, own_ns: bool) -> Child {
    // A socket left by a killed driver: wait for the new one's.
    let _ = std::fs::remove_file(sock);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(daemon.data().join("csi.log"))
        .unwrap();
    // unshare(1) execs the driver: the child's pid is the driver's.
    let prefix: &[&str] = match own_ns {
        true => &["unshare", "--mount", "--propagation", "unchanged"],
        false => &[],
    };
    let child = LAMINA
        .cmd_in(prefix)
        .args([
            "csi",
            "--mode",
            "all",
            "--node-id",
            "test-node",
            "--endpoint",
        ])
        .arg(format!("unix://{}", sock.display()))
        .arg("--data-dir")
        .arg(daemon.data())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start lamina csi");
    wait_until("the CSI socket", Duration::from_secs(30), || {
        sock.exists().then_some(())
    });
    child
}

#[track_caller]
fn connect(rt: &tokio::runtime::Runtime, sock: &Path) -> Channel {
    let path = sock.to_path_buf();
    let connector = tower::service_fn(move |_: Uri| {
        let p = path.clone();
        async move {
            let s = tokio::net::UnixStream::connect(p).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
        }
    });
    rt.block_on(Endpoint::from_static("http://csi.invalid").connect_with_connector(connector))
        .expect("connect to the CSI socket")
}

impl Drop for Csi {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid, which has not been reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let stopped = lamina_test_support::poll_until(Duration::from_secs(20), || {
            self.child.try_wait().ok().flatten()
        });
        if stopped.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
            if !std::thread::panicking() {
                panic!("lamina csi did not stop within 20 s of SIGTERM");
            }
        }
        if std::thread::panicking() {
            eprintln!("lamina csi log:\n{}", self.log());
        }
        if self.own_ns {
            // The daemon stops first (its FUSE files are under the shared
            // mount), then the mount goes, so its directory can be removed.
            if let Err(e) = self.daemon.try_stop() {
                eprintln!("{e}");
            }
            let d = self.daemon.data().display().to_string();
            let _ = lamina_test_support::try_run(Command::new("umount").args(["--recursive", &d]));
        }
    }
}
