//! The `lamina` binary, and `lamina serve` as a guarded child process.

use crate::command::try_run_for;
use crate::{poll_until, run, Out};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// How long the daemon may take to answer after it starts (a restart after
/// SIGKILL replays the log and resumes operations first).
pub const START_LIMIT: Duration = Duration::from_secs(60);
/// How long the daemon may take to exit after SIGTERM.
pub const STOP_LIMIT: Duration = Duration::from_secs(60);
/// How long [`Lamina::built`]'s `cargo build` may take (a cold build of the
/// CLI on two busy cores).
const BUILD_LIMIT: Duration = Duration::from_secs(30 * 60);
/// How much of the daemon's log a failing test prints (its end).
const LOG_TAIL: usize = 64 << 10;

/// The `lamina` binary to run. A test of the package that builds it holds
/// one as `const LAMINA: Lamina = Lamina::new(env!("CARGO_BIN_EXE_lamina"));`,
/// another package's test gets it from [`Lamina::built`], and a program
/// that chose its own binary (the benchmarks' release build) from
/// [`Lamina::from_path`].
#[derive(Clone, Debug)]
pub struct Lamina {
    bin: Bin,
}

#[derive(Clone, Debug)]
enum Bin {
    Static(&'static str),
    Owned(PathBuf),
}

impl Lamina {
    pub const fn new(bin: &'static str) -> Lamina {
        Lamina {
            bin: Bin::Static(bin),
        }
    }

    /// The binary at `bin`.
    pub fn from_path(bin: impl Into<PathBuf>) -> Lamina {
        Lamina {
            bin: Bin::Owned(bin.into()),
        }
    }

    /// This workspace's `lamina`, brought up to date first: `cargo build -p
    /// lamina-cli --bin lamina` (the cargo that builds this harness, in the
    /// workspace it belongs to), once per process, and the binary cargo
    /// reports it built. For the tests of a package other than the CLI's,
    /// for which cargo sets no `CARGO_BIN_EXE_lamina`: cargo decides
    /// whether the binary is stale, never a guess from a target directory.
    /// The test fails with cargo's output if the build does.
    #[track_caller]
    pub fn built() -> Lamina {
        static BUILT: OnceLock<PathBuf> = OnceLock::new();
        Lamina::from_path(BUILT.get_or_init(build_lamina).clone())
    }

    /// Where the binary is.
    pub fn bin(&self) -> &Path {
        match &self.bin {
            Bin::Static(s) => Path::new(s),
            Bin::Owned(p) => p,
        }
    }

    /// The CLI with none of the caller's `LAMINA_*` settings.
    pub fn cmd(&self) -> Command {
        clear_lamina_vars(Command::new(self.bin()))
    }

    /// The CLI run by a command prefix that execs it (`unshare --mount`),
    /// with none of the caller's `LAMINA_*` settings.
    pub fn cmd_in(&self, prefix: &[&str]) -> Command {
        let Some((first, rest)) = prefix.split_first() else {
            return self.cmd();
        };
        let mut c = Command::new(first);
        c.args(rest).arg(self.bin());
        clear_lamina_vars(c)
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
    /// before answering (e.g. its port was taken in the meantime) or did
    /// not answer within [`START_LIMIT`].
    pub fn start_with(&self, extra: &[&str]) -> Result<Daemon, StartError> {
        self.start_in(&[], extra)
    }

    /// [`Lamina::start_with`], the daemon run by a command prefix (e.g.
    /// `nsenter --net=...`, see [`crate::netns::Host::prefix`]) that must
    /// exec it, so that the pid it gets is the daemon's; the CLI still
    /// reaches it on its data directory's unix socket.
    pub fn start_in(&self, prefix: &[String], extra: &[&str]) -> Result<Daemon, StartError> {
        self.serve().prefix(prefix).args(extra).start()
    }

    /// `lamina serve` to be set up further: where its data and log go,
    /// what runs it, its arguments and environment.
    pub fn serve(&self) -> Serve {
        Serve {
            lamina: self.clone(),
            data: None,
            log: None,
            prefix: Vec::new(),
            args: Vec::new(),
            env: Vec::new(),
        }
    }
}

/// Run `cargo build` for the `lamina` binary; the path cargo reports.
fn build_lamina() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut c = Command::new(env!("CARGO"));
    // The test profile, not dev: `cargo test` has already built every
    // dependency in it (workspace-wide profile settings differ from dev's,
    // Cargo.toml), so this build compiles only the few crates whose features
    // differ, about 20 units. In dev it compiled the whole tree a second
    // time, minutes of a CI run spent inside the first test that asked.
    c.args([
        "build",
        "--profile",
        "test",
        "-p",
        "lamina-cli",
        "--bin",
        "lamina",
        "--features",
        "testing",
    ])
    .arg("--message-format=json-render-diagnostics")
    .current_dir(&workspace);
    let out = try_run_for(&mut c, BUILD_LIMIT).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "{} failed ({}):\n{}",
        out.what,
        out.status,
        out.stderr
    );
    // One JSON message a line; the binary's artifact names its executable.
    let exe = out.stdout.lines().find_map(|l| {
        let m: serde_json::Value = serde_json::from_str(l).ok()?;
        let is_bin = m["reason"] == "compiler-artifact" && m["target"]["name"] == "lamina";
        is_bin.then(|| m["executable"].as_str().map(PathBuf::from))?
    });
    exe.unwrap_or_else(|| panic!("{} named no lamina executable:\n{}", out.what, out.stdout))
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

/// `lamina serve` before it starts ([`Lamina::serve`]): by default in a new
/// temporary directory under `/tmp` (removed with the [`Daemon`]), its
/// stderr in `daemon.log` there, run by nothing, with no extra arguments.
pub struct Serve {
    lamina: Lamina,
    data: Option<PathBuf>,
    log: Option<PathBuf>,
    prefix: Vec<String>,
    args: Vec<String>,
    env: Vec<(OsString, OsString)>,
}

impl Serve {
    /// The data directory to use (made if missing, kept after the daemon
    /// stops; a pool already there is opened as it is). Unix socket paths
    /// are limited to 108 bytes: keep it short.
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Serve {
        self.data = Some(dir.into());
        self
    }

    /// Where the daemon's stderr and stdout go (appended to).
    pub fn log(mut self, file: impl Into<PathBuf>) -> Serve {
        self.log = Some(file.into());
        self
    }

    /// A command prefix that execs the daemon (`nsenter --net=...`).
    pub fn prefix(mut self, prefix: &[String]) -> Serve {
        self.prefix = prefix.to_vec();
        self
    }

    /// More `serve` arguments.
    pub fn args<S: AsRef<str>>(mut self, args: impl IntoIterator<Item = S>) -> Serve {
        self.args
            .extend(args.into_iter().map(|s| s.as_ref().to_string()));
        self
    }

    /// An environment variable of the daemon (the caller's `LAMINA_*` are
    /// never passed on; one set here is).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Serve {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Start it and wait until it answers. An error if it could not be
    /// started, exited before answering, or did not answer within
    /// [`START_LIMIT`] (it is killed then).
    pub fn start(self) -> Result<Daemon, StartError> {
        let dir = match self.data {
            Some(d) => {
                std::fs::create_dir_all(&d).map_err(|source| StartError::DataDir {
                    dir: d.clone(),
                    source,
                })?;
                DataDir::Given(d)
            }
            // A short path: unix socket paths are limited to 108 bytes.
            None => DataDir::Temp(
                tempfile::Builder::new()
                    .prefix("lamina-test")
                    .tempdir_in("/tmp")
                    .map_err(|source| StartError::DataDir {
                        dir: "/tmp".into(),
                        source,
                    })?,
            ),
        };
        let log = self.log.unwrap_or_else(|| dir.path().join("daemon.log"));
        let mut d = Daemon {
            lamina: self.lamina,
            dir,
            log,
            extra: self.args,
            prefix: self.prefix,
            env: self.env,
            child: None,
            stop_limit: STOP_LIMIT,
        };
        d.spawn()?;
        Ok(d)
    }
}

/// Where a daemon keeps its data.
enum DataDir {
    /// Made for it, removed with it.
    Temp(tempfile::TempDir),
    /// The caller's.
    Given(PathBuf),
}

impl DataDir {
    fn path(&self) -> &Path {
        match self {
            DataDir::Temp(t) => t.path(),
            DataDir::Given(p) => p,
        }
    }
}

/// Why a daemon did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("lamina serve exited with {status} before answering; its log:\n{log}")]
    Exited { status: ExitStatus, log: String },
    #[error("lamina serve did not answer within {limit:?} (killed); its log:\n{log}")]
    Silent { limit: Duration, log: String },
    #[error("cannot run {bin}: {source}")]
    Spawn { bin: String, source: std::io::Error },
    #[error("cannot make the data directory {dir}: {source}")]
    DataDir {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// Why a daemon did not stop.
#[derive(Debug, thiserror::Error)]
pub enum StopError {
    #[error("lamina serve did not exit within {limit:?} of SIGTERM (killed); its log:\n{log}")]
    Hung { limit: Duration, log: String },
}

/// `lamina serve`, a child process. Dropping it stops it (SIGTERM); the
/// test fails if it has not exited within [`STOP_LIMIT`], and if the test
/// is failing already, the daemon's log is printed. A program that must
/// not panic stops it first with [`Daemon::try_stop`].
pub struct Daemon {
    lamina: Lamina,
    dir: DataDir,
    log: PathBuf,
    extra: Vec<String>,
    /// What runs `lamina serve` (empty: nothing, it runs itself).
    prefix: Vec<String>,
    env: Vec<(OsString, OsString)>,
    child: Option<Child>,
    /// [`STOP_LIMIT`], shorter in the harness's own tests.
    pub(crate) stop_limit: Duration,
}

impl Daemon {
    /// The data directory (removed when the daemon is dropped, unless the
    /// caller chose it: [`Serve::data_dir`]).
    pub fn data(&self) -> &Path {
        self.dir.path()
    }

    /// Everything the daemon wrote to its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The end of the log, as a failure prints it.
    pub fn log_tail(&self) -> String {
        tail(&self.log()).to_string()
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
    fn spawn(&mut self) -> Result<(), StartError> {
        let bin = self.lamina.bin().display().to_string();
        let spawn_error = |source| StartError::Spawn {
            bin: bin.clone(),
            source,
        };
        // Appended to, so that a restarted daemon's log follows the first one's.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(spawn_error)?;
        let out = log.try_clone().map_err(spawn_error)?;
        let mut cmd = match self.prefix.split_first() {
            None => self.lamina.cmd(),
            Some((program, args)) => {
                // The prefix passes its environment on to the daemon.
                let mut c = clear_lamina_vars(Command::new(program));
                c.args(args).arg(self.lamina.bin());
                c
            }
        };
        let child = cmd
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .arg("serve")
            .arg("--data-dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(log)
            .spawn()
            .map_err(spawn_error)?;
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
                Err(StartError::Silent {
                    limit: START_LIMIT,
                    log: self.log_tail(),
                })
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

    /// The extra `serve` arguments it was started with.
    pub fn extra(&self) -> Vec<String> {
        self.extra.clone()
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
        self.try_stop().unwrap_or_else(|e| panic!("{e}"))
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

    /// SIGTERM, then wait at most [`STOP_LIMIT`]; past it, SIGKILL and an
    /// error. Its exit status, `None` if it was not running.
    pub fn try_stop(&mut self) -> Result<Option<ExitStatus>, StopError> {
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
                Err(StopError::Hung {
                    limit,
                    log: self.log_tail(),
                })
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
        match self.try_stop() {
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
