//! Running the system tools the node service drives (mount, losetup, mkfs,
//! blkid, resize2fs, ...): each under a time limit, killed past it, and
//! with its stderr in the error when it fails.

use super::Error;
use std::process::Stdio;
use std::time::Duration;

/// The limit for quick commands (mount, losetup, blkid, ...).
pub const QUICK: Duration = Duration::from_secs(60);
/// The limit for commands whose work grows with the volume (mkfs, resize).
pub const SLOW: Duration = Duration::from_secs(600);

/// What a command printed.
#[derive(Debug)]
pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// The command line, for messages and logs.
fn describe(prog: &str, args: &[&str]) -> String {
    std::iter::once(prog)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Run `prog args` to its end within `limit`, whatever its exit code.
pub async fn output(prog: &str, args: &[&str], limit: Duration) -> Result<Output, Error> {
    let cmd = describe(prog, args);
    tracing::debug!(%cmd, "running");
    let child = tokio::process::Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| Error::Spawn {
            cmd: cmd.clone(),
            source,
        })?;
    let out = match tokio::time::timeout(limit, child.wait_with_output()).await {
        // Dropping the future dropped the child, which kills it.
        Err(_) => return Err(Error::Timeout { cmd, limit }),
        Ok(Err(source)) => return Err(Error::Spawn { cmd, source }),
        Ok(Ok(o)) => o,
    };
    let o = Output {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    tracing::debug!(%cmd, code = ?o.code, stderr = %o.stderr.trim(), "finished");
    Ok(o)
}

/// Run `prog args`; it must exit 0. Returns stdout.
pub async fn run(prog: &str, args: &[&str], limit: Duration) -> Result<String, Error> {
    let o = output(prog, args, limit).await?;
    if o.success() {
        return Ok(o.stdout);
    }
    Err(failed(prog, args, &o))
}

/// The error for a command that exited with a failure.
pub fn failed(prog: &str, args: &[&str], o: &Output) -> Error {
    let mut text = o.stderr.trim().to_string();
    if text.is_empty() {
        text = o.stdout.trim().to_string();
    }
    Error::Command {
        cmd: describe(prog, args),
        code: o.code,
        stderr: text,
    }
}

/// Whether a program is on PATH (an executable file).
pub fn on_path(prog: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            std::fs::metadata(d.join(prog))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}
