//! `lamina schedule-controller`: the SnapshotSchedule controller
//! (crates/snapshot-schedules) as a long-running process, with its own
//! flags.

use anyhow::{Context, Result};
use clap::Parser;

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
    testing: crate::test_flags::TestFlags,
}

/// `lamina schedule-controller ARGS...`; `args` starts with the program name.
pub fn main(mut args: Vec<std::ffi::OsString>) -> Result<()> {
    args.remove(1);
    let cli = ScheduleControllerCli::parse_from(args);
    let (clock, crash_at) = cli.testing.schedules();
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
