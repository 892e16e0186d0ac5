//! A real `lamina serve` in its own data directory, driven through its HTTP
//! API with the same client the `lamina` command uses.

use super::proc::{self, Server};
use anyhow::{bail, Context, Result};
use hyper::Method;
use lamina_cli::client::{seg, Client};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub struct Lamina {
    pub server: Server,
    pub data: PathBuf,
    client: Client,
    rt: tokio::runtime::Runtime,
}

impl Lamina {
    /// Start the daemon on `data` (made if missing; a pool already there is
    /// opened as it is).
    pub fn start(bin: &Path, data: &Path, log_dir: &Path) -> Result<Lamina> {
        std::fs::create_dir_all(data)?;
        let layout = lamina_server::Layout::new(data);
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(data)
            .env("RUST_LOG", "warn");
        let name = format!(
            "lamina-{}",
            data.file_name().unwrap_or_default().to_string_lossy()
        );
        let server = Server::start(&name, cmd, log_dir, &layout.api_socket)?;
        // The NBD socket comes up beside the API socket.
        let t = Instant::now();
        while !layout.nbd_socket.exists() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Lamina {
            server,
            data: data.to_path_buf(),
            client: Client::new(data, None, None)?,
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
        })
    }

    pub fn pid(&self) -> u32 {
        self.server.pid()
    }

    pub fn call(&self, method: Method, path: &str, body: Option<Value>) -> Result<Value> {
        let a = self
            .rt
            .block_on(self.client.call(method.clone(), path, body))?;
        Ok(a.body)
    }

    pub fn create_volume(&self, name: &str, size: u64) -> Result<()> {
        self.call(
            Method::POST,
            "/v1/volumes",
            Some(json!({"name": name, "size": size})),
        )?;
        Ok(())
    }

    /// Attach a volume; its NBD URI.
    pub fn attach(&self, volume: &str) -> Result<String> {
        let v = self.call(
            Method::POST,
            &format!("/v1/volumes/{}/attach", seg(volume)),
            None,
        )?;
        uri(&v)
    }

    pub fn detach(&self, volume: &str) -> Result<()> {
        self.call(
            Method::POST,
            &format!("/v1/volumes/{}/detach", seg(volume)),
            None,
        )?;
        Ok(())
    }

    /// Take a snapshot; how long the API took to answer.
    pub fn snapshot(&self, volume: &str, name: &str) -> Result<Duration> {
        let t = Instant::now();
        self.call(
            Method::POST,
            &format!("/v1/volumes/{}/snapshots", seg(volume)),
            Some(json!({"name": name})),
        )?;
        Ok(t.elapsed())
    }

    pub fn delete_snapshot(&self, volume: &str, name: &str) -> Result<Duration> {
        let t = Instant::now();
        self.call(
            Method::DELETE,
            &format!("/v1/volumes/{}/snapshots/{}", seg(volume), seg(name)),
            None,
        )?;
        Ok(t.elapsed())
    }

    pub fn delete_volume(&self, volume: &str, with_snapshots: bool) -> Result<()> {
        let q = if with_snapshots {
            "?with_snapshots=true"
        } else {
            ""
        };
        self.call(
            Method::DELETE,
            &format!("/v1/volumes/{}{q}", seg(volume)),
            None,
        )?;
        Ok(())
    }

    /// Create a clone of a snapshot; the API's answer (`volume`, and
    /// `operation` for a full clone).
    pub fn clone_snapshot(
        &self,
        name: &str,
        volume: &str,
        snapshot: &str,
        full: bool,
    ) -> Result<Value> {
        self.call(
            Method::POST,
            "/v1/clones",
            Some(json!({"name": name, "from_snapshot": format!("{volume}/{snapshot}"), "full": full})),
        )
    }

    /// Create a clone of a volume as it is now (the daemon takes a system
    /// snapshot of it first); the API's answer, as for `clone_snapshot`.
    pub fn clone_volume(&self, name: &str, volume: &str, full: bool) -> Result<Value> {
        self.call(
            Method::POST,
            "/v1/clones",
            Some(json!({"name": name, "from_volume": volume, "full": full})),
        )
    }

    /// Wait for an operation to finish, asking every `every` (short when
    /// the wait is timed); error if it failed.
    pub fn wait_operation(&self, id: &str, every: Duration) -> Result<Value> {
        loop {
            let op = self.operation(id)?;
            match op["state"].as_str().unwrap_or("") {
                "succeeded" => return Ok(op),
                "failed" => bail!("operation {id} failed: {}", op["error"]),
                _ => std::thread::sleep(every),
            }
        }
    }

    /// An operation as the API describes it now.
    pub fn operation(&self, id: &str) -> Result<Value> {
        self.call(Method::GET, &format!("/v1/operations/{}", seg(id)), None)
    }

    pub fn list_all_snapshots(&self) -> Result<Vec<Value>> {
        let v = self.call(Method::GET, "/v1/snapshots", None)?;
        Ok(v.as_array().cloned().unwrap_or_default())
    }

    /// Bytes of the pool in use, as the daemon reports them.
    pub fn used(&self) -> Result<u64> {
        let h = self.call(Method::GET, "/v1/health", None)?;
        h["pool_used_bytes"]
            .as_u64()
            .context("health has no pool_used_bytes")
    }

    pub fn rss_mib(&self) -> f64 {
        proc::rss_mib(self.pid())
    }

    pub fn written(&self) -> u64 {
        proc::written(self.pid())
    }
}

/// The NBD URI of an attached volume or snapshot, from the API's answer.
pub fn uri(v: &Value) -> Result<String> {
    v["uri"]
        .as_str()
        .or(v["export"]["uri"].as_str())
        .map(String::from)
        .with_context(|| format!("no export in {v}"))
}
