//! A real `lamina serve` in its own data directory, started and stopped by
//! the daemon launcher the tests use (`lamina-test-support`), and driven
//! through its HTTP API through `lamina-client`, as the `lamina` command
//! drives it.

use super::proc;
use anyhow::{bail, Context, Result};
use lamina_api::{
    CloneCreated, CreateClone, CreateSnapshot, CreateVolume, Operation, OperationState, Snapshot,
};
use lamina_client::Client;
use lamina_test_support::Daemon;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub struct Lamina {
    daemon: Daemon,
    pub data: PathBuf,
    client: Client,
    rt: tokio::runtime::Runtime,
}

impl Lamina {
    /// Start the daemon on `data` (made if missing; a pool already there is
    /// opened as it is).
    pub fn start(bin: &Path, data: &Path, log_dir: &Path) -> Result<Lamina> {
        Lamina::start_in(bin, data, log_dir, &[], &[])
    }

    /// [`Lamina::start`] run by a command prefix that execs it (`ip netns
    /// exec NS`), with extra `serve` arguments; the API and NBD sockets are
    /// still unix sockets in `data`. Its log is `log_dir/lamina-NAME.log`,
    /// NAME the data directory's.
    pub fn start_in(
        bin: &Path,
        data: &Path,
        log_dir: &Path,
        prefix: &[String],
        extra: &[String],
    ) -> Result<Lamina> {
        let name = format!(
            "lamina-{}",
            data.file_name().unwrap_or_default().to_string_lossy()
        );
        let daemon = lamina_test_support::Lamina::from_path(bin)
            .serve()
            .data_dir(data)
            .log(log_dir.join(format!("{name}.log")))
            .prefix(prefix)
            .args(extra)
            // The daemon's filter (LAMINA_LOG): warnings, unless the
            // bench is run with LAMINA_BENCH_LOG (`lamina_server=debug`
            // shows where a replicated snapshot's time goes, say).
            .env(
                "LAMINA_LOG",
                std::env::var("LAMINA_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .start()
            .with_context(|| format!("starting {name}"))?;
        // The NBD socket comes up beside the API socket.
        let layout = lamina_server::Layout::new(data);
        let t = Instant::now();
        while !layout.nbd_socket.exists() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Lamina {
            daemon,
            data: data.to_path_buf(),
            client: Client::unix(layout.api_socket),
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
        })
    }

    pub fn pid(&self) -> u32 {
        self.daemon.pid().unwrap_or(0)
    }

    /// Run one client call to its end.
    fn call<T>(&self, f: impl Future<Output = lamina_client::Result<T>>) -> Result<T> {
        Ok(self.rt.block_on(f)?)
    }

    pub fn create_volume(&self, name: &str, size: u64) -> Result<()> {
        let req = CreateVolume {
            name: name.into(),
            size,
            ..Default::default()
        };
        self.call(self.client.create_volume(&req))?;
        Ok(())
    }

    /// A replicated volume: this node's replica and one on each of
    /// `replicas`, other nodes by name in this daemon's node list.
    pub fn create_replicated(&self, name: &str, size: u64, replicas: &[&str]) -> Result<()> {
        let req = CreateVolume {
            name: name.into(),
            size,
            replicas: replicas.iter().map(|r| r.to_string()).collect(),
            ..Default::default()
        };
        self.call(self.client.create_volume(&req))?;
        Ok(())
    }

    /// Add a node to this daemon's node list (`lamina node add`).
    pub fn add_node(&self, name: &str, address: &str) -> Result<()> {
        let req = lamina_api::AddNode {
            name: name.into(),
            address: address.into(),
        };
        self.call(self.client.add_node(&req))?;
        Ok(())
    }

    /// The daemon's Prometheus metrics, as `/metrics` serves them.
    pub fn metrics(&self) -> Result<String> {
        self.call(self.client.metrics())
    }

    /// A volume's description (size, allocated, exclusive and shared bytes).
    pub fn volume(&self, name: &str) -> Result<lamina_api::Volume> {
        self.call(self.client.get_volume(name))
    }

    /// Attach a volume; its NBD URI.
    pub fn attach(&self, volume: &str) -> Result<String> {
        Ok(self.call(self.client.attach_volume(volume))?.uri)
    }

    /// Attach a volume served as a file too (FUSE); the file's path.
    pub fn attach_file(&self, volume: &str) -> Result<PathBuf> {
        let e = self.call(self.client.attach_volume_file(volume))?;
        match e.file {
            Some(f) => Ok(PathBuf::from(f)),
            None => bail!("the daemon attached {volume} with no file"),
        }
    }

    /// Detach a volume (the suite's clients have disconnected by then).
    pub fn detach(&self, volume: &str) -> Result<()> {
        self.call(self.client.detach_volume(volume, false))?;
        Ok(())
    }

    /// Take a snapshot; how long the API took to answer.
    pub fn snapshot(&self, volume: &str, name: &str) -> Result<Duration> {
        let t = Instant::now();
        let req = CreateSnapshot {
            name: name.into(),
            ..Default::default()
        };
        self.call(self.client.create_snapshot(volume, &req))?;
        Ok(t.elapsed())
    }

    pub fn snapshot_info(&self, volume: &str, name: &str) -> Result<Snapshot> {
        self.call(self.client.get_snapshot(volume, name))
    }

    pub fn delete_snapshot(&self, volume: &str, name: &str) -> Result<Duration> {
        let t = Instant::now();
        self.call(self.client.delete_snapshot(volume, name))?;
        Ok(t.elapsed())
    }

    pub fn delete_volume(&self, volume: &str, with_snapshots: bool) -> Result<()> {
        self.call(self.client.delete_volume(volume, with_snapshots))?;
        Ok(())
    }

    /// Create a clone of a snapshot; the API's answer (the volume, and the
    /// operation for a full clone).
    pub fn clone_snapshot(
        &self,
        name: &str,
        volume: &str,
        snapshot: &str,
        full: bool,
    ) -> Result<CloneCreated> {
        let req = CreateClone {
            name: name.into(),
            from_snapshot: Some(format!("{volume}/{snapshot}")),
            from_volume: None,
            full,
            from_node: None,
        };
        Ok(self.call(self.client.create_clone(&req))?.value)
    }

    /// Create a clone of a volume as it is now (the daemon takes a system
    /// snapshot of it first); the API's answer, as for `clone_snapshot`.
    pub fn clone_volume(&self, name: &str, volume: &str, full: bool) -> Result<CloneCreated> {
        let req = CreateClone {
            name: name.into(),
            from_snapshot: None,
            from_volume: Some(volume.into()),
            full,
            from_node: None,
        };
        Ok(self.call(self.client.create_clone(&req))?.value)
    }

    /// Wait for an operation to finish, asking every `every` (short when
    /// the wait is timed); error if it failed.
    pub fn wait_operation(&self, id: &str, every: Duration) -> Result<Operation> {
        loop {
            let op = self.operation(id)?;
            match op.state {
                OperationState::Succeeded => return Ok(op),
                OperationState::Failed => bail!(
                    "operation {id} failed: {}",
                    op.error.as_deref().unwrap_or("no reason recorded")
                ),
                OperationState::Running => std::thread::sleep(every),
            }
        }
    }

    /// An operation as the API describes it now.
    pub fn operation(&self, id: &str) -> Result<Operation> {
        self.call(self.client.get_operation(id))
    }

    /// One volume's snapshots, each with its exclusive bytes.
    pub fn list_snapshots(&self, volume: &str) -> Result<Vec<Snapshot>> {
        self.call(self.client.list_snapshots(volume))
    }

    /// The pool's space (`GET /v1/pool`: walks what only snapshots hold).
    pub fn pool_space(&self) -> Result<lamina_api::PoolSpace> {
        self.call(self.client.pool_space())
    }

    pub fn list_all_snapshots(&self) -> Result<Vec<Snapshot>> {
        self.call(self.client.list_all_snapshots())
    }

    /// Bytes of the pool in use, as the daemon reports them.
    pub fn used(&self) -> Result<u64> {
        Ok(self.call(self.client.health())?.pool_used_bytes)
    }

    /// Wait until the pool's used bytes and the pool files' blocks on disk
    /// stop falling (2 s without change, or at most 5 min): the daemon has
    /// reclaimed what was deleted, and punched it out of its files. The
    /// time of the last fall, measured from `t`.
    pub fn reclaimed(&self, t: Instant) -> Result<Duration> {
        let mut last = (self.used()?, self.disk_bytes());
        let mut last_fall = t.elapsed();
        while t.elapsed() - last_fall < Duration::from_secs(2)
            && t.elapsed() < Duration::from_secs(300)
        {
            std::thread::sleep(Duration::from_millis(20));
            let now = (self.used()?, self.disk_bytes());
            if now.0 < last.0 || now.1 < last.1 {
                last_fall = t.elapsed();
            }
            last = now;
        }
        Ok(last_fall)
    }

    /// Bytes the pool's files hold on disk (their allocated blocks).
    fn disk_bytes(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let Ok(entries) = std::fs::read_dir(self.data.join("pool")) else {
            return 0;
        };
        entries
            .flatten()
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.blocks() * 512)
            .sum()
    }

    pub fn rss_mib(&self) -> f64 {
        proc::rss_mib(self.pid())
    }

    pub fn written(&self) -> u64 {
        proc::written(self.pid())
    }
}

impl Drop for Lamina {
    /// SIGTERM, SIGKILL after the launcher's limit; a daemon that had to be
    /// killed is reported, and the run goes on.
    fn drop(&mut self) {
        if let Err(e) = self.daemon.try_stop() {
            eprintln!("  {e}");
        }
    }
}
