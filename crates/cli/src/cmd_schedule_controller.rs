//! `lamina schedule-controller`: the SnapshotSchedule controller
//! (crates/snapshot-schedules) as a long-running process, with its own
//! flags.

use anyhow::{Context, Result};
use clap::Parser;
use lamina_schedule::Clock;
use std::sync::Arc;

/// Run SnapshotSchedules: VolumeSnapshots of the PVCs they select, on their
/// cron expression, with retention. The kubeconfig is found as kubectl
/// finds it (KUBECONFIG, ~/.kube/config, or the pod's service account).
/// Run one replica.
#[derive(Parser, Debug)]
#[command(name = "lamina schedule-controller", version)]
pub struct ScheduleControllerCli {
    /// Time between passes over the schedules (a slot is taken at most this late).
    #[arg(long, default_value = "10s")]
    interval: humantime::Duration,
    #[command(flatten)]
    testing: TestFlags,
}

// The test flags exist exactly when lamina-server has its test knobs, as
// `lamina serve`'s do (cmd_serve.rs; `lamina_server::cfg_testing!` says how
// Cargo decides): never in a production build.
lamina_server::cfg_testing!({
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicI64, Ordering};

    /// Knobs for tests, hidden from `--help`.
    #[derive(clap::Args, Debug)]
    struct TestFlags {
        /// Tests only: read the clock (Unix seconds) from FILE.
        #[arg(long, value_name = "FILE", hide = true)]
        test_clock: Option<PathBuf>,
        /// Tests only: abort, as kill -9 would, at this named point.
        #[arg(long, value_name = "POINT", hide = true)]
        test_crash_at: Option<String>,
    }

    impl TestFlags {
        /// The clock and the crash point the flags ask for.
        fn apply(self) -> (Arc<dyn Clock>, Option<String>) {
            let clock: Arc<dyn Clock> = match self.test_clock {
                Some(p) => Arc::new(FileClock(p, AtomicI64::new(0))),
                None => Arc::new(lamina_schedule::SystemClock),
            };
            (clock, self.test_crash_at)
        }
    }

    /// Time from a file the tests move; the last good reading if unreadable.
    struct FileClock(PathBuf, AtomicI64);

    impl Clock for FileClock {
        fn now(&self) -> i64 {
            match std::fs::read_to_string(&self.0)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                Some(t) => {
                    self.1.store(t, Ordering::SeqCst);
                    t
                }
                None => self.1.load(Ordering::SeqCst),
            }
        }
    }
} else {
    /// No test flags in this build.
    #[derive(clap::Args, Debug)]
    struct TestFlags {}

    impl TestFlags {
        fn apply(self) -> (Arc<dyn Clock>, Option<String>) {
            (Arc::new(lamina_schedule::SystemClock), None)
        }
    }
});

/// `lamina schedule-controller ARGS...`; `args` starts with the program name.
pub fn main(mut args: Vec<std::ffi::OsString>) -> Result<()> {
    args.remove(1);
    let cli = ScheduleControllerCli::parse_from(args);
    let (clock, crash_at) = cli.testing.apply();
    let opts = lamina_snapshot_schedules::Options {
        clock,
        interval: cli.interval.into(),
        crash_at,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("lamina-schedules")
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let shutdown = super::shutdown_signal()?;
        let client = kube::Client::try_default()
            .await
            .context("connecting to the API server")?;
        tracing::info!("running SnapshotSchedules");
        lamina_snapshot_schedules::run(client, opts, shutdown)
            .await
            .context("running SnapshotSchedules")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        ScheduleControllerCli::command().debug_assert();
        let c = ScheduleControllerCli::try_parse_from(["x", "--interval", "2s"]).unwrap();
        assert_eq!(std::time::Duration::from(c.interval).as_secs(), 2);
    }
}
