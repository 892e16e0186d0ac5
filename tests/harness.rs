//! Shared by the end-to-end tests: start `lamina serve` in a temporary data
//! directory, run the `lamina` CLI against it, and check for the system
//! tools the tests drive. The binary is the one `cargo test --workspace`
//! builds (the lamina-cli package's); run `cargo build -p lamina-cli` first
//! when running this package alone.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `lamina` binary next to this test's target directory.
pub fn lamina_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/lamina
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target directory");
    let bin = dir.join("lamina");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p lamina-cli` (cargo test --workspace builds it)",
        bin.display()
    );
    bin
}

/// Fail (not skip) when a tool the test needs is missing.
pub fn need(tool: &str, package: &str) {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "`{tool}` is not installed: apt-get install {package}"
    );
}

/// Run a command, returning its output; panics if it cannot start.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Run a command that must succeed; returns stdout.
pub fn ok(cmd: &mut Command) -> String {
    let o = run(cmd);
    assert!(
        o.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A daemon in a temporary data directory, stopped (SIGTERM) on drop.
pub struct Daemon {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Daemon {
    pub fn start() -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("lamina-e2e")
            .tempdir()
            .expect("temp dir");
        let mut d = Daemon { dir, child: None };
        d.spawn();
        d
    }

    pub fn data(&self) -> &Path {
        self.dir.path()
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("daemon.log")).expect("log file");
        let child = Command::new(lamina_bin())
            .args(["serve", "--data-dir"])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start lamina serve");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let o = self.lamina(&["volume", "list"]);
            if o.status.success() {
                return;
            }
            if let Some(st) = self.child.as_mut().unwrap().try_wait().expect("wait") {
                panic!("lamina serve exited with {st}: {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "lamina serve did not come up: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    /// Run the CLI against this daemon.
    pub fn lamina(&self, args: &[&str]) -> Output {
        run(Command::new(lamina_bin())
            .arg("--data-dir")
            .arg(self.dir.path())
            .args(args))
    }

    /// Run the CLI; it must succeed. Returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.lamina(args);
        assert!(
            o.status.success(),
            "lamina {args:?} failed:\nstdout: {}\nstderr: {}\ndaemon log:\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
            self.log()
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Attach and return the NBD URI (the `uri` field of the JSON output).
    pub fn attach(&self, args: &[&str]) -> String {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let out = self.ok(&a);
        let v: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("attach printed {out:?}: {e}"));
        v["uri"].as_str().expect("uri field").to_string()
    }

    /// SIGKILL, as a crash would.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait; returns whether it exited cleanly.
    pub fn stop(&mut self) -> bool {
        match self.child.take() {
            Some(mut c) => {
                // SAFETY: kill(2) with a pid we own; no memory is involved.
                unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
                c.wait().map(|s| s.success()).unwrap_or(false)
            }
            None => true,
        }
    }

    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}
