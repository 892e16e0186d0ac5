//! Running one command to its end under a time limit.

use crate::poll_until;
use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

/// How long one CLI command or system tool may take before the test fails
/// (generous: CI runs on 2 busy cores; this catches hangs, it times nothing).
pub const COMMAND_LIMIT: Duration = Duration::from_secs(120);

/// What a finished command printed and how it exited.
#[derive(Debug)]
pub struct Out {
    /// The command, for messages.
    pub what: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// It must have succeeded; returns stdout.
    #[track_caller]
    pub fn ok(self) -> String {
        self.ok_else(String::new)
    }

    /// [`Out::ok`], with `more` (say, a daemon's log) added to the failure.
    #[track_caller]
    pub(crate) fn ok_else(self, more: impl FnOnce() -> String) -> String {
        if !self.status.success() {
            panic!(
                "{} failed ({}):\nstdout: {}\nstderr: {}{}",
                self.what,
                self.status,
                self.stdout,
                self.stderr,
                more()
            );
        }
        self.stdout
    }

    /// It must have been refused: an exit status of the CLI's own (1, or
    /// 2 to 10 for a daemon's error code: docs/daemon.md's table, which
    /// `lamina`'s unit tests hold it to), never success or a signal, and an
    /// `error: ` on stderr. Returns stderr.
    #[track_caller]
    pub fn refused(self) -> String {
        assert!(
            matches!(self.code(), Some(1..=10)) && self.stderr.contains("error: "),
            "{} should have been refused (exit status 1 to 10, `error: ` on stderr), got {:?}:\nstdout: {}\nstderr: {}",
            self.what,
            self.code(),
            self.stdout,
            self.stderr
        );
        self.stderr
    }

    /// It must have failed with exit code `code`; returns stderr.
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

/// Run a command to its end with no input, capturing its output. The test
/// fails if it cannot start or has not finished within [`COMMAND_LIMIT`]
/// (it is killed first).
#[track_caller]
pub fn run(cmd: &mut Command) -> Out {
    try_run(cmd).unwrap_or_else(|e| panic!("{e}"))
}

/// [`run`] without failing the test: for cleanup in a `Drop`, where a second
/// panic during a failing test would abort the whole test binary.
pub fn try_run(cmd: &mut Command) -> Result<Out, String> {
    try_run_for(cmd, COMMAND_LIMIT)
}

/// [`try_run`] with another time limit (the harness's own tests).
pub(crate) fn try_run_for(cmd: &mut Command, limit: Duration) -> Result<Out, String> {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = poll_until(limit, || match child.try_wait() {
        Ok(st) => st.map(Ok),
        Err(e) => Some(Err(e)),
    });
    let status = match status {
        Some(Ok(st)) => st,
        Some(Err(e)) => return Err(format!("waiting for {what}: {e}")),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{what} did not finish within {limit:?}"));
        }
    };
    Ok(Out {
        what,
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// Read a pipe to its end on a thread of its own, so that a full pipe never
/// blocks the child.
fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}
