//! Shared by the CLI's integration tests: the real daemon (`lamina serve`)
//! as a child process in a temporary data directory, stopped with SIGTERM
//! by a guard, and the CLI run as child processes with time limits.

#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long one CLI command or system tool may take before the test fails
/// (generous: CI runs on 2 busy cores).
const COMMAND_LIMIT: Duration = Duration::from_secs(120);
/// How long the daemon may take to answer after it starts.
const START_LIMIT: Duration = Duration::from_secs(30);
/// How long the daemon may take to stop after SIGTERM.
const STOP_LIMIT: Duration = Duration::from_secs(60);

pub const BIN: &str = env!("CARGO_BIN_EXE_lamina");

/// What a finished command printed and how it exited.
#[derive(Debug)]
pub struct Out {
    pub what: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Must have succeeded; returns stdout.
    #[track_caller]
    pub fn ok(self) -> String {
        assert!(
            self.status.success(),
            "{} failed ({}):\nstdout: {}\nstderr: {}",
            self.what,
            self.status,
            self.stdout,
            self.stderr
        );
        self.stdout
    }

    /// Must have failed with exit code `code`; returns stderr.
    #[track_caller]
    pub fn fails(self, code: i32) -> String {
        assert_eq!(
            self.code(),
            Some(code),
            "{} should have exited with {code}:\nstdout: {}\nstderr: {}",
            self.what,
            self.stdout,
            self.stderr
        );
        self.stderr
    }
}

/// Run a command to its end (killed after [`COMMAND_LIMIT`]), capturing its output.
pub fn run(cmd: &mut Command) -> Out {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let mut so = child.stdout.take().expect("stdout");
    let mut se = child.stderr.take().expect("stderr");
    let t1 = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let t2 = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + COMMAND_LIMIT;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {COMMAND_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Out {
        what,
        status,
        stdout: t1.join().unwrap(),
        stderr: t2.join().unwrap(),
    }
}

/// The CLI with a clean environment (none of the caller's LAMINA_* settings).
pub fn lamina_cmd() -> Command {
    let mut c = Command::new(BIN);
    for v in [
        "LAMINA_DATA_DIR",
        "LAMINA_ENDPOINT",
        "LAMINA_TOKEN",
        "LAMINA_LOG",
    ] {
        c.env_remove(v);
    }
    c
}

/// Fail (not skip) when a system tool the test drives is missing.
#[track_caller]
pub fn need(tool: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "`{tool}` is not installed: apt-get install {package}"
    );
}

/// A free TCP port on the loopback interface (free when asked, at least).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind a port")
        .local_addr()
        .unwrap()
        .port()
}

/// `lamina serve` in a temporary data directory; SIGTERM (then SIGKILL if
/// it hangs) on drop.
pub struct Daemon {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Daemon {
    pub fn start() -> Daemon {
        Self::start_with(&[]).unwrap_or_else(|log| panic!("lamina serve did not start:\n{log}"))
    }

    /// Start with extra `serve` arguments; `Err(log)` if the daemon exited
    /// before answering (e.g. its port was taken in the meantime).
    pub fn start_with(extra: &[&str]) -> Result<Daemon, String> {
        // Short paths: unix socket paths are limited to 108 bytes.
        let dir = tempfile::Builder::new()
            .prefix("lamina-cli")
            .tempdir_in("/tmp")
            .expect("temp dir");
        let log = std::fs::File::create(dir.path().join("daemon.log")).expect("log file");
        let child = lamina_cmd()
            .arg("serve")
            .arg("--data-dir")
            .arg(dir.path())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start lamina serve");
        let mut d = Daemon {
            dir,
            child: Some(child),
        };
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if d.lamina(&["volume", "list"]).status.success() {
                return Ok(d);
            }
            if let Some(st) = d.child.as_mut().unwrap().try_wait().expect("wait") {
                d.child = None;
                return Err(format!("lamina serve exited with {st}:\n{}", d.log()));
            }
            assert!(
                Instant::now() < deadline,
                "lamina serve did not answer within {START_LIMIT:?}:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn data(&self) -> &Path {
        self.dir.path()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    /// The CLI pointed at this daemon's data directory.
    pub fn cmd(&self) -> Command {
        let mut c = lamina_cmd();
        c.arg("--data-dir").arg(self.dir.path());
        c
    }

    pub fn lamina(&self, args: &[&str]) -> Out {
        run(self.cmd().args(args))
    }

    /// Run the CLI; it must succeed. Returns stdout.
    #[track_caller]
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.lamina(args);
        assert!(
            o.status.success(),
            "lamina {args:?} failed ({}):\nstdout: {}\nstderr: {}\ndaemon log:\n{}",
            o.status,
            o.stdout,
            o.stderr,
            self.log()
        );
        o.stdout
    }

    /// Run the CLI; it must fail with exit code 1. Returns stderr.
    #[track_caller]
    pub fn err(&self, args: &[&str]) -> String {
        self.lamina(args).fails(1)
    }

    /// Run the CLI with `-o json` and parse what it printed.
    #[track_caller]
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let out = self.ok(&a);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("lamina {a:?} printed {out:?}: {e}"))
    }

    /// SIGTERM and wait: the exit status (None if it had to be killed).
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        // SAFETY: kill(2) on the pid of a child we own and have not reaped.
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_LIMIT;
        loop {
            if let Some(st) = c.try_wait().expect("wait") {
                return Some(st);
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stop with SIGTERM; it must exit 0.
    #[track_caller]
    pub fn stop_cleanly(mut self) {
        let st = self.stop();
        assert!(
            st.is_some_and(|s| s.success()),
            "lamina serve did not exit 0 after SIGTERM ({st:?}):\n{}",
            self.log()
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Path of a data directory's file, as a string.
pub fn path_str(p: PathBuf) -> String {
    p.to_str().expect("utf-8 path").to_string()
}
