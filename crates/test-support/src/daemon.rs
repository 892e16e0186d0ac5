//! The `lamina` binary, and `lamina serve` as a guarded child process.

use crate::{poll_until, run, Out};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// How long the daemon may take to answer after it starts (a restart after
/// SIGKILL replays the log and resumes operations first).
pub const START_LIMIT: Duration = Duration::from_secs(60);
/// How long the daemon may take to exit after SIGTERM.
pub const STOP_LIMIT: Duration = Duration::from_secs(60);
/// How much of the daemon's log a failing test prints (its end).
const LOG_TAIL: usize = 64 << 10;

/// The `lamina` binary under test. A test file holds one as
/// `const LAMINA: Lamina = Lamina::new(env!("CARGO_BIN_EXE_lamina"));`.
#[derive(Clone, Copy, Debug)]
pub struct Lamina {
    bin: &'static str,
}

impl Lamina {
    pub const fn new(bin: &'static str) -> Lamina {
        Lamina { bin }
    }

    /// The CLI with none of the caller's `LAMINA_*` settings.
    pub fn cmd(&self) -> Command {
        clear_lamina_vars(Command::new(self.bin))
    }

    /// The CLI pointed at a data directory.
    pub fn at(&self, data: &Path) -> Command {
        let mut c = self.cmd();
        c.arg("--data-dir").arg(data);
        c
    }

    /// `lamina serve` in a new temporary data directory, answering.
    #[track_caller]
    pub fn start(&self) -> Daemon {
        self.start_with(&[])
            .unwrap_or_else(|e| panic!("lamina serve did not start: {e}"))
    }

    /// Start with extra `serve` arguments. An error if the daemon exited
    /// before answering (e.g. its port was taken in the meantime); the test
    /// fails if it neither exits nor answers within [`START_LIMIT`].
    #[track_caller]
    pub fn start_with(&self, extra: &[&str]) -> Result<Daemon, StartError> {
        self.start_in(&[], extra)
    }

    /// [`Lamina::start_with`], the daemon run by a command prefix (e.g.
    /// `ip netns exec NS`, see [`crate::netns::Host::prefix`]) that must
    /// exec it, so that the pid it gets is the daemon's; the CLI still
    /// reaches it on its data directory's unix socket.
    #[track_caller]
    pub fn start_in(&self, prefix: &[String], extra: &[&str]) -> Result<Daemon, StartError> {
        // A short path: unix socket paths are limited to 108 bytes.
        let dir = tempfile::Builder::new()
            .prefix("lamina-test")
            .tempdir_in("/tmp")
            .expect("temp dir");
        let mut d = Daemon {
            lamina: *self,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            prefix: prefix.to_vec(),
            child: None,
            stop_limit: STOP_LIMIT,
        };
        d.spawn()?;
        Ok(d)
    }
}

/// `c` with none of the caller's `LAMINA_*` variables.
fn clear_lamina_vars(mut c: Command) -> Command {
    for (key, _) in std::env::vars_os() {
        if key.as_encoded_bytes().starts_with(b"LAMINA_") {
            c.env_remove(key);
        }
    }
    c
}

/// Why a daemon did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("lamina serve exited with {status} before answering; its log:\n{log}")]
    Exited { status: ExitStatus, log: String },
}

/// `lamina serve` in a temporary data directory. Dropping it stops it
/// (SIGTERM); the test fails if it has not exited within [`STOP_LIMIT`], and
/// if the test is failing already, the daemon's log is printed.
pub struct Daemon {
    lamina: Lamina,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    /// What runs `lamina serve` (empty: nothing, it runs itself).
    prefix: Vec<String>,
    child: Option<Child>,
    /// [`STOP_LIMIT`], shorter in the harness's own tests.
    pub(crate) stop_limit: Duration,
}

impl Daemon {
    /// The data directory (removed when the daemon is dropped).
    pub fn data(&self) -> &Path {
        self.dir.path()
    }

    /// Everything the daemon wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> std::path::PathBuf {
        self.dir.path().join("daemon.log")
    }

    /// The CLI pointed at this daemon.
    pub fn cmd(&self) -> Command {
        self.lamina.at(self.data())
    }

    /// Run the CLI against this daemon, whatever its outcome.
    #[track_caller]
    pub fn lamina(&self, args: &[&str]) -> Out {
        run(self.cmd().args(args))
    }

    /// Run the CLI; it must succeed. Returns stdout.
    #[track_caller]
    pub fn ok(&self, args: &[&str]) -> String {
        self.lamina(args)
            .ok_else(|| format!("\ndaemon log:\n{}", tail(&self.log())))
    }

    /// Run the CLI; it must be refused (see `Out::refused`).
    /// Returns stderr.
    #[track_caller]
    pub fn err(&self, args: &[&str]) -> String {
        self.lamina(args).refused()
    }

    /// Run the CLI with `-o json`; it must succeed and print one JSON document.
    #[track_caller]
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let out = self.ok(&a);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("lamina {a:?} printed {out:?}: {e}"))
    }

    /// Attach (`volume attach VOL` or `snapshot attach VOL SNAP`) and return
    /// the export's NBD URI.
    #[track_caller]
    pub fn attach(&self, args: &[&str]) -> String {
        let v = self.json(args);
        match v["uri"].as_str() {
            Some(uri) => uri.to_string(),
            None => panic!("lamina {args:?} printed no uri: {v}"),
        }
    }

    /// Start the daemon process and wait until it answers.
    #[track_caller]
    fn spawn(&mut self) -> Result<(), StartError> {
        // Appended to, so that a restarted daemon's log follows the first one's.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("daemon log file");
        let mut cmd = match self.prefix.split_first() {
            None => self.lamina.cmd(),
            Some((program, args)) => {
                // The prefix passes its environment on to the daemon.
                let mut c = clear_lamina_vars(Command::new(program));
                c.args(args).arg(self.lamina.bin);
                c
            }
        };
        let child = cmd
            .arg("serve")
            .arg("--data-dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start lamina serve: {e}"));
        self.child = Some(child);
        let answered = poll_until(START_LIMIT, || {
            if self.lamina(&["volume", "list"]).status.success() {
                return Some(Ok(()));
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            exited.map(|status| {
                self.child = None;
                Err(StartError::Exited {
                    status,
                    log: self.log(),
                })
            })
        });
        match answered {
            Some(r) => r,
            None => {
                self.kill9();
                panic!(
                    "lamina serve did not answer within {START_LIMIT:?}; its log:\n{}",
                    tail(&self.log())
                );
            }
        }
    }

    /// SIGKILL, as a crash would, and reap it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start again on the same data directory after [`Daemon::kill9`] (a
    /// node that stays down a while before it comes back).
    #[track_caller]
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "start_again: the daemon is running");
        self.spawn()
            .unwrap_or_else(|e| panic!("lamina serve did not start again: {e}"));
    }

    /// The `serve` arguments the next start uses (after [`Daemon::kill9`]:
    /// e.g. a daemon started with a crash point comes back without it).
    pub fn set_extra(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(|s| s.to_string()).collect();
    }

    /// Wait for the daemon to exit by itself (e.g. at a crash point): its
    /// status, or None if it still runs after `limit`.
    pub fn wait_exit(&mut self, limit: std::time::Duration) -> Option<ExitStatus> {
        let c = self.child.as_mut()?;
        crate::poll_until(limit, || c.try_wait().ok().flatten())
    }

    /// The daemon's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the daemon process has been started and not stopped or
    /// killed by this guard.
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Kill (SIGKILL) and start again on the same data directory.
    #[track_caller]
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn()
            .unwrap_or_else(|e| panic!("lamina serve did not restart: {e}"));
    }

    /// SIGTERM and wait: its exit status, `None` if it was not running. The
    /// test fails if it has not exited within [`STOP_LIMIT`].
    #[track_caller]
    pub fn stop(&mut self) -> Option<ExitStatus> {
        self.terminate().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Stop with SIGTERM; it must exit 0.
    #[track_caller]
    pub fn stop_cleanly(mut self) {
        let st = self.stop();
        assert!(
            st.is_some_and(|s| s.success()),
            "lamina serve did not exit 0 after SIGTERM ({st:?}); its log:\n{}",
            tail(&self.log())
        );
    }

    /// SIGTERM, then wait at most `stop_limit`; past it, SIGKILL and an error.
    fn terminate(&mut self) -> Result<Option<ExitStatus>, String> {
        let Some(mut c) = self.child.take() else {
            return Ok(None);
        };
        // SAFETY: kill(2) on the pid of a child we own and have not reaped,
        // so the pid cannot have been reused; no memory is involved.
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        let limit = self.stop_limit;
        match poll_until(limit, || c.try_wait().ok().flatten()) {
            Some(st) => Ok(Some(st)),
            None => {
                let _ = c.kill();
                let _ = c.wait();
                Err(format!(
                    "lamina serve did not exit within {limit:?} of SIGTERM (killed); its log:\n{}",
                    tail(&self.log())
                ))
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let failing = std::thread::panicking();
        if failing {
            eprintln!(
                "--- log of lamina serve in {} ---\n{}\n--- end of log ---",
                self.data().display(),
                tail(&self.log())
            );
        }
        match self.terminate() {
            Ok(_) => {}
            // A second panic while unwinding would abort the test binary.
            Err(e) if failing => eprintln!("{e}"),
            Err(e) => panic!("{e}"),
        }
    }
}

/// The end of a log, at most [`LOG_TAIL`] bytes of it.
fn tail(log: &str) -> &str {
    if log.len() <= LOG_TAIL {
        return log;
    }
    let mut start = log.len() - LOG_TAIL;
    while !log.is_char_boundary(start) {
        start += 1;
    }
    &log[start..]
}
