//! The one harness Lamina's daemon tests and benchmarks share: it starts
//! `lamina serve` (in a temporary data directory, or one the caller
//! chooses), runs the `lamina` CLI and system tools against it, puts
//! daemons in network namespaces of their own, and makes sure none of that
//! can hang a run or pass on a machine that lacks what it needs. It owns
//! process handling only: it must not link the engine, the server or the
//! CLI, so that what it drives is always the real binary, as a user runs it.
//!
//! The rules it keeps:
//! - every command, the daemon's start and its stop run under a time limit
//!   (generous: they guard against hangs, they measure nothing); past it the
//!   process is killed and the test fails, naming what hung;
//! - the `lamina` processes it starts see none of the caller's `LAMINA_*`
//!   environment variables;
//! - waiting is polling a condition until a deadline ([`wait_until`]), never a
//!   fixed sleep that orders events;
//! - a missing system tool fails the test and names the Debian package
//!   ([`need`]); nothing is skipped;
//! - a [`Daemon`] is a guard: dropping it sends SIGTERM and fails the test if
//!   the daemon does not exit in time, and when the test is already failing
//!   it prints the daemon's log.
//!
//! The binary comes from the caller. The CLI's own tests pass
//! `Lamina::new(env!("CARGO_BIN_EXE_lamina"))`: Cargo sets that variable only
//! for integration tests of the package that builds the binary, and builds it
//! fresh before running them. Tests of other packages (the end-to-end suites
//! of lamina-e2e, the controllers') take [`Lamina::built`], which runs
//! `cargo build --profile test -p lamina-cli --bin lamina --features testing`
//! (the profile whose dependencies `cargo test` has built) and takes the
//! path Cargo reports, so that they never pick up a binary left by an earlier
//! build. Either way the binary takes `lamina serve`'s hidden test flags
//! (`--test-clock`, `--test-crash-at`): lamina-cli's dev-dependency turns on
//! lamina-server's `testing` feature whenever tests are built, and the nested
//! build asks for it; a plain `cargo build` of the binary has no test flags
//! (lamina-server's `cfg_testing!`).
//!
//! [`netns`] puts several daemons on one machine, each in a network
//! namespace of its own joined to one switch, for the cross-node tests and
//! the benchmarks' cross-node case.
//!
//! In tests, failures are panics with context: a failure here is a failed
//! test. What a program that reports errors needs has a fallible form:
//! starting and stopping a daemon ([`Serve::start`], [`StartError`] — also
//! for a start a test may retry, a TCP port taken between choosing and
//! binding it —, [`Daemon::try_stop`]), making a net ([`netns::Net::try_new`]).

mod clock;
mod command;
mod daemon;
pub mod netns;
#[cfg(test)]
mod tests;
mod tools;

pub use clock::{prometheus_sample, TestClock};
pub use command::{run, try_run, Out, COMMAND_LIMIT};
pub use daemon::{Daemon, Lamina, Serve, StartError, StopError, START_LIMIT, STOP_LIMIT};
pub use tools::{fio_report, need, qemu_img_compare, qemu_io};

use std::time::{Duration, Instant};

/// How often [`wait_until`] and [`poll_until`] look again.
const POLL: Duration = Duration::from_millis(20);

/// Call `probe` until it returns `Some`, for at most `limit`; `None` if it
/// never did.
pub fn poll_until<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// Call `probe` until it returns `Some`; the test fails, naming `what`, if
/// that has not happened within `limit`.
#[track_caller]
pub fn wait_until<T>(what: &str, limit: Duration, probe: impl FnMut() -> Option<T>) -> T {
    match poll_until(limit, probe) {
        Some(v) => v,
        None => panic!("gave up after {limit:?} waiting for {what}"),
    }
}

/// A free TCP port on the loopback interface (free when asked, at least:
/// another process may take it before the caller binds it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a loopback port")
        .port()
}
