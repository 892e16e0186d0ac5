//! The processes the suite starts: servers that must be up before a case
//! runs and gone after it (`Server`, stopped on drop), one-shot commands
//! whose failure stops the case with their output (`run`), and what
//! `/proc` says about a process (RSS, bytes written).

use anyhow::{bail, Context, Result};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    pub name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Server {
    /// Start `cmd` with its output in `log_dir/<name>.log`, and wait until
    /// `socket` accepts a connection.
    pub fn start(name: &str, cmd: Command, log_dir: &Path, socket: &Path) -> Result<Server> {
        let _ = std::fs::remove_file(socket);
        let what = format!("listen on {}", socket.display());
        Server::start_until(name, cmd, log_dir, &what, || {
            UnixStream::connect(socket).is_ok()
        })
    }

    /// Start `cmd` with its output in `log_dir/<name>.log`, and wait until
    /// `ready` says it serves (`what` names that in the error of a server
    /// that never does: a TCP export in another network namespace, say).
    pub fn start_until(
        name: &str,
        mut cmd: Command,
        log_dir: &Path,
        what: &str,
        mut ready: impl FnMut() -> bool,
    ) -> Result<Server> {
        let log = log_dir.join(format!("{name}.log"));
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {name}: {cmd:?}"))?;
        let mut s = Server {
            name: name.into(),
            child: Some(child),
            log,
        };
        let t = Instant::now();
        loop {
            if ready() {
                return Ok(s);
            }
            if let Some(st) = s.child.as_mut().unwrap().try_wait()? {
                bail!("{name} exited with {st} before listening: {}", s.log_tail());
            }
            if t.elapsed() > Duration::from_secs(30) {
                bail!("{name} did not {what} in 30 s: {}", s.log_tail());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    pub fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// SIGTERM, then SIGKILL after 20 s.
    pub fn stop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(20) {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("  {} ignored SIGTERM for 20 s: killed", self.name);
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Run a command to completion; its stdout, or an error with its output.
pub fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "{cmd:?} failed with {}:\n{}{}",
            out.status,
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}

fn proc_field(pid: u32, file: &str, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// Resident memory of a process, MiB.
pub fn rss_mib(pid: u32) -> f64 {
    proc_field(pid, "status", "VmRSS:").unwrap_or(0) as f64 / 1024.0
}

/// Bytes of storage a process has caused to be written so far: counted
/// when it dirties a page of a file (or writes with O_DIRECT), so replies
/// on sockets are not in it and rewriting a still-dirty page counts once.
pub fn written(pid: u32) -> u64 {
    proc_field(pid, "io", "write_bytes:").unwrap_or(0)
}

/// CPU time a process has used so far, user and system, all its threads
/// (`/proc/PID/stat`'s `utime` and `stime`), in seconds; 0 once it is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The fields after the command name (which may hold spaces), from the
    // third (state) on: utime is the 14th, stime the 15th.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return 0.0;
    };
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse().ok())
        .collect();
    // SAFETY: sysconf(3) reads a constant of the system.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    match (f.as_slice(), ticks) {
        ([u, s], t) if t > 0 => (u + s) as f64 / t as f64,
        _ => 0.0,
    }
}

pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Write back every dirty page of the machine (sync(2)), so that what runs
/// next does not pay for the writeback of what ran before.
pub fn sync_disks() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}
