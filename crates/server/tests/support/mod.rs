//! The daemon in this test process (`lamina_server::run` on a temporary
//! data directory, stopped by dropping a guard), raw HTTP/1.1 over its unix
//! socket (these tests check the wire: statuses, bodies, malformed
//! requests), and qemu-io to read and write exports. End-to-end tests of the
//! `lamina` binary use the shared test-support crate instead.

#![allow(dead_code)]

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// A daemon serving a temporary directory until dropped.
pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub rt: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<Result<(), lamina_server::ServerError>>>,
}

impl Daemon {
    pub fn start() -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        Self::start_in(dir)
    }

    pub fn start_in(dir: tempfile::TempDir) -> Daemon {
        Self::start_configured(dir, |_| {})
    }

    /// A daemon with test-only knobs (`lamina_server::Testing`).
    pub fn start_with(dir: tempfile::TempDir, testing: lamina_server::Testing) -> Daemon {
        Self::start_configured(dir, |c| c.testing = testing)
    }

    /// [`Daemon::start_in`] with the configuration changed by `set`.
    pub fn start_configured(
        dir: tempfile::TempDir,
        set: impl FnOnce(&mut lamina_server::Config),
    ) -> Daemon {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let mut config = lamina_server::Config::new(dir.path());
        set(&mut config);
        let done = rt.spawn(lamina_server::run(config, async move {
            let _ = rx.await;
        }));
        let d = Daemon {
            dir,
            rt,
            stop: Some(tx),
            done: Some(done),
        };
        d.wait_until(Duration::from_secs(60), || {
            d.try_get("/v1/health").is_some()
        });
        d
    }

    pub fn socket(&self) -> PathBuf {
        lamina_server::Layout::new(self.dir.path()).api_socket
    }

    /// Poll `f` until it holds; panics after `limit` (a safety net, not a
    /// measurement).
    pub fn wait_until(&self, limit: Duration, mut f: impl FnMut() -> bool) {
        let t = std::time::Instant::now();
        while !f() {
            assert!(t.elapsed() < limit, "condition not met within {limit:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn try_get(&self, path: &str) -> Option<(StatusCode, Value)> {
        self.rt
            .block_on(send(self.socket(), Method::GET, path, None))
            .ok()
            .map(|(s, b)| (s, parse(&b)))
    }

    /// One request; the status and the body (JSON, `Null` when empty).
    pub fn call(&self, method: Method, path: &str, body: Option<&str>) -> (StatusCode, Value) {
        let (s, b) = self
            .rt
            .block_on(send(self.socket(), method, path, body.map(str::to_string)))
            .unwrap();
        (s, parse(&b))
    }

    /// One request with a raw body; the status, the content type and the body text.
    pub fn raw(&self, method: Method, path: &str, body: &str) -> (StatusCode, String, String) {
        self.rt.block_on(async {
            let stream = tokio::net::UnixStream::connect(self.socket())
                .await
                .unwrap();
            let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .unwrap();
            tokio::spawn(conn);
            let req = Request::builder()
                .method(method)
                .uri(path)
                .header("host", "localhost")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body.to_string())))
                .unwrap();
            let resp = tx.send_request(req).await.unwrap();
            let status = resp.status();
            let ct = resp
                .headers()
                .get("content-type")
                .map(|v| v.to_str().unwrap_or("").to_string())
                .unwrap_or_default();
            let b = resp.into_body().collect().await.unwrap().to_bytes();
            (status, ct, String::from_utf8_lossy(&b).into_owned())
        })
    }

    pub fn ok(&self, method: Method, path: &str, body: Option<&str>) -> Value {
        let (s, v) = self.call(method.clone(), path, body);
        assert!(s.is_success(), "{method} {path}: {s} {v}");
        v
    }

    /// Export a volume or snapshot; its NBD URI.
    pub fn attach(&self, path: &str) -> String {
        self.ok(Method::POST, &format!("{path}/attach"), None)["uri"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Stop the daemon and wait for it to end cleanly; the directory stays.
    pub fn stop(mut self) -> tempfile::TempDir {
        self.shutdown();
        let dir = tempfile::tempdir().unwrap();
        std::mem::replace(&mut self.dir, dir)
    }

    fn shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(done) = self.done.take() {
            let r = self
                .rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(120), done).await });
            match r {
                Ok(Ok(Ok(()))) => {}
                other => panic!("the daemon did not stop cleanly: {other:?}"),
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.shutdown();
        }
    }
}

fn parse(b: &Bytes) -> Value {
    if b.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(b)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", String::from_utf8_lossy(b)))
    }
}

pub async fn send(
    socket: PathBuf,
    method: Method,
    path: &str,
    body: Option<String>,
) -> std::io::Result<(StatusCode, Bytes)> {
    let stream = tokio::net::UnixStream::connect(socket).await?;
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost");
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .unwrap();
    let resp = tx.send_request(req).await.map_err(std::io::Error::other)?;
    let status = resp.status();
    let b = resp
        .into_body()
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    Ok((status, b))
}

/// Run qemu-io commands against an NBD URI; panics if any fails.
pub fn qemu_io(uri: &str, cmds: &[&str]) {
    run_qemu_io(uri, cmds, false)
}

/// The same against a read-only export (a snapshot's).
pub fn qemu_io_ro(uri: &str, cmds: &[&str]) {
    run_qemu_io(uri, cmds, true)
}

fn run_qemu_io(uri: &str, cmds: &[&str], read_only: bool) {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    if read_only {
        c.arg("-r");
    }
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    c.arg(uri);
    let o = c
        .output()
        .expect("qemu-io runs (apt-get install qemu-utils)");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success()
            && !out.contains("Pattern verification failed")
            && !out.contains("failed"),
        "qemu-io {cmds:?} on {uri}: {}\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
}
