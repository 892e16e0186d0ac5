//! qemu-storage-daemon serving a qcow2 image over NBD, driven over QMP:
//! the user's alternative for live snapshots and for deleting a layer
//! (`block-commit`).
//!
//! The QMP client is written here because QMP is one JSON object per line
//! over a unix socket (a greeting, `qmp_capabilities`, then commands whose
//! answer is `return` or `error`, with events in between); a crate for it
//! would bring more than these few lines.

use super::proc::Server;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub struct Qmp<S: std::io::Read + Write> {
    reader: BufReader<S>,
    writer: S,
    /// Events received while waiting for answers, oldest first.
    pub events: Vec<Value>,
}

impl Qmp<UnixStream> {
    /// Connect to the QMP socket `path` of a server just started (waiting
    /// up to 10 s for it to listen), and shake hands.
    pub fn connect(path: &Path) -> Result<Qmp<UnixStream>> {
        let t = Instant::now();
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if t.elapsed() > Duration::from_secs(10) => {
                    return Err(e).with_context(|| format!("connecting to {}", path.display()))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        Qmp::handshake(stream.try_clone()?, stream)
    }
}

impl<S: std::io::Read + Write> Qmp<S> {
    /// Read the greeting and leave capabilities negotiation mode.
    pub fn handshake(reader: S, writer: S) -> Result<Qmp<S>> {
        let mut q = Qmp {
            reader: BufReader::new(reader),
            writer,
            events: Vec::new(),
        };
        let greeting = q.message()?;
        if greeting.get("QMP").is_none() {
            bail!("not a QMP greeting: {greeting}");
        }
        q.execute("qmp_capabilities", json!({}))?;
        Ok(q)
    }

    fn message(&mut self) -> Result<Value> {
        let mut line = String::new();
        loop {
            line.clear();
            if self
                .reader
                .read_line(&mut line)
                .context("reading from QMP")?
                == 0
            {
                bail!("QMP connection closed");
            }
            if !line.trim().is_empty() {
                return serde_json::from_str(line.trim())
                    .with_context(|| format!("QMP sent {line:?}"));
            }
        }
    }

    /// Run a command; its `return` value, or its error as an error.
    pub fn execute(&mut self, command: &str, arguments: Value) -> Result<Value> {
        let mut req = json!({ "execute": command });
        if arguments.as_object().is_some_and(|o| !o.is_empty()) {
            req["arguments"] = arguments;
        }
        writeln!(self.writer, "{req}").context("writing to QMP")?;
        self.writer.flush()?;
        loop {
            let m = self.message()?;
            if let Some(r) = m.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = m.get("error") {
                bail!(
                    "QMP {command} failed: {} ({})",
                    e["desc"].as_str().unwrap_or("?"),
                    e["class"].as_str().unwrap_or("?")
                );
            }
            if m.get("event").is_some() {
                self.events.push(m);
                continue;
            }
            bail!("unexpected QMP message: {m}");
        }
    }
}

/// A running qemu-storage-daemon with one qcow2 image exported over NBD.
pub struct Qsd {
    pub server: Server,
    pub qmp: Qmp<UnixStream>,
    pub uri: String,
    /// Node name of the image the export writes to (the top of the chain).
    pub top: String,
    dir: PathBuf,
    overlays: usize,
}

impl Qsd {
    pub fn start(name: &str, image: &Path, dir: &Path) -> Result<Qsd> {
        let nbd = dir.join(format!("{name}.sock"));
        let qmp = dir.join(format!("{name}.qmp"));
        let _ = std::fs::remove_file(&qmp);
        let mut c = Command::new("qemu-storage-daemon");
        c.arg("--blockdev")
            .arg(format!(
                "driver=file,node-name=file0,filename={}",
                image.display()
            ))
            .arg("--blockdev")
            .arg("driver=qcow2,node-name=disk,file=file0")
            .arg("--nbd-server")
            .arg(format!("addr.type=unix,addr.path={}", nbd.display()))
            .arg("--export")
            .arg("type=nbd,id=exp0,node-name=disk,name=disk,writable=on")
            .arg("--chardev")
            .arg(format!(
                "socket,id=qmp0,path={},server=on,wait=off",
                qmp.display()
            ))
            .arg("--monitor")
            .arg("chardev=qmp0");
        let server = Server::start(name, c, dir, &nbd)?;
        let q = Qmp::connect(&qmp)?;
        Ok(Qsd {
            server,
            qmp: q,
            uri: format!("nbd+unix:///disk?socket={}", nbd.display()),
            top: "disk".into(),
            dir: dir.to_path_buf(),
            overlays: 0,
        })
    }

    /// An internal snapshot of the top image; how long QMP took to answer.
    pub fn internal_snapshot(&mut self, name: &str) -> Result<Duration> {
        let t = Instant::now();
        self.qmp.execute(
            "blockdev-snapshot-internal-sync",
            json!({"device": self.top, "name": name}),
        )?;
        Ok(t.elapsed())
    }

    /// An external snapshot: a new overlay on top, which takes the export's
    /// writes from then on; how long QMP took to answer.
    pub fn external_snapshot(&mut self) -> Result<Duration> {
        self.overlays += 1;
        let node = format!("ov{}", self.overlays);
        let file = self.dir.join(format!("{}-{node}.qcow2", self.server.name));
        let t = Instant::now();
        self.qmp.execute(
            "blockdev-snapshot-sync",
            json!({"node-name": self.top, "snapshot-file": file.display().to_string(),
                   "snapshot-node-name": node, "format": "qcow2"}),
        )?;
        let d = t.elapsed();
        self.top = node;
        Ok(d)
    }

    /// External snapshots taken so far.
    pub fn overlays(&self) -> usize {
        self.overlays
    }

    /// Node names of the qcow2 images in the chain, by file name.
    pub fn qcow2_nodes(&mut self) -> Result<Vec<(String, String)>> {
        let nodes = self.qmp.execute("query-named-block-nodes", json!({}))?;
        Ok(nodes
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| n["drv"] == "qcow2")
            .filter_map(|n| {
                Some((
                    n["node-name"].as_str()?.to_string(),
                    n["file"].as_str()?.to_string(),
                ))
            })
            .collect())
    }

    /// Commit layer `top_node` into `base_node` and wait for the job to end.
    pub fn commit(&mut self, top_node: &str, base_node: &str) -> Result<Duration> {
        let t = Instant::now();
        self.qmp.execute(
            "block-commit",
            json!({"job-id": "commit0", "device": self.top, "top-node": top_node, "base-node": base_node}),
        )?;
        loop {
            let jobs = self.qmp.execute("query-block-jobs", json!({}))?;
            if jobs.as_array().is_none_or(|j| j.is_empty()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let d = t.elapsed();
        if let Some(e) = self
            .qmp
            .events
            .iter()
            .find(|e| e["event"] == "BLOCK_JOB_COMPLETED" && e["data"]["error"].is_string())
        {
            bail!("block-commit failed: {}", e["data"]["error"]);
        }
        if self.qcow2_nodes()?.iter().any(|(n, _)| n == top_node) {
            bail!("block-commit ended but {top_node} is still in the chain");
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A stream that answers from a script and records what was written.
    struct Script {
        input: Cursor<Vec<u8>>,
        output: Vec<u8>,
    }
    impl std::io::Read for Script {
        fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
            self.input.read(b)
        }
    }
    impl Write for Script {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.output.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn script(s: &str) -> Script {
        Script {
            input: Cursor::new(s.as_bytes().to_vec()),
            output: Vec::new(),
        }
    }

    #[test]
    fn answers_errors_and_events() {
        let r = script(concat!(
            "{\"QMP\": {\"version\": {}, \"capabilities\": []}}\r\n",
            "{\"return\": {}}\r\n",
            "{\"event\": \"JOB_STATUS_CHANGE\", \"data\": {}}\r\n",
            "{\"return\": [1, 2]}\r\n",
            "{\"error\": {\"class\": \"GenericError\", \"desc\": \"no such node\"}}\r\n",
        ));
        let mut q = Qmp::handshake(r, script("")).unwrap();
        assert_eq!(
            q.execute("query-block-jobs", json!({})).unwrap(),
            json!([1, 2])
        );
        assert_eq!(q.events.len(), 1);
        let e = q
            .execute("block-commit", json!({"top-node": "x"}))
            .unwrap_err();
        assert!(e.to_string().contains("no such node"), "{e}");
        let sent = String::from_utf8(q.writer.output.clone()).unwrap();
        let lines: Vec<Value> = sent
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0], json!({"execute": "qmp_capabilities"}));
        assert_eq!(lines[2]["arguments"]["top-node"], "x");
        assert!(
            q.execute("x", json!({})).is_err(),
            "a closed stream is an error"
        );
    }

    #[test]
    fn refuses_a_stream_that_is_not_qmp() {
        assert!(Qmp::handshake(script("{\"hello\": 1}\n"), script("")).is_err());
    }
}
