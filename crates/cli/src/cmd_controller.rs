//! `lamina controller`: Lamina's Kubernetes controllers (crates/controller)
//! as a long-running process, and `lamina crds`, which prints their CRDs.
//! The controller has its own flags (a namespace, a Lease), parsed apart
//! from the API commands'.

use anyhow::{Context, Result};
use clap::Parser;

/// Run Lamina's Kubernetes controllers: mirror every node daemon's volumes
/// and snapshots into Volume and Snapshot resources and act on the
/// resources people create or delete. The kubeconfig is found as kubectl
/// finds it (KUBECONFIG, ~/.kube/config, or the pod's service account).
#[derive(Parser, Debug)]
#[command(name = "lamina controller", version)]
pub struct ControllerCli {
    /// Lamina's namespace: its resources, node Secrets and Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "lamina-system")]
    namespace: String,
    /// This replica's name in the Lease [default: POD_NAME, else the host name].
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// The Lease only the active replica holds.
    #[arg(long, default_value = "lamina-controller")]
    lease_name: String,
    /// How long the lease holds without renewal: the longest a standby
    /// waits after the active replica dies (e.g. 15s).
    #[arg(long, default_value = "15s")]
    lease_duration: humantime::Duration,
    /// Serve Prometheus metrics at ADDR/metrics (e.g. 0.0.0.0:9090).
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Replace a replicated volume's replica faulted this long on a node
    /// silent this long (its daemon unreachable, or its node Secret gone)
    /// with a new replica on another node (e.g. 10min).
    #[arg(long, default_value = "10min")]
    replace_replicas_after: humantime::Duration,
}

/// `lamina controller ARGS...`; `args` starts with the program name.
pub fn main(mut args: Vec<std::ffi::OsString>) -> Result<()> {
    args.remove(1);
    let cli = ControllerCli::parse_from(args);
    let opts = lamina_controller::Options {
        namespace: cli.namespace,
        identity: cli.identity.unwrap_or_else(super::cmd_csi::hostname),
        lease_name: cli.lease_name,
        lease_duration: std::time::Duration::from(cli.lease_duration)
            .as_secs()
            .max(1),
        metrics_listen: cli.metrics_listen,
        replace_replicas_after: cli.replace_replicas_after.into(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("lamina-controller")
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let shutdown = super::shutdown_signal()?;
        lamina_controller::run(opts, shutdown)
            .await
            .context("running the controllers")
    })
}

/// `lamina crds`: the CustomResourceDefinitions, as YAML for kubectl apply.
pub fn crds() -> Result<()> {
    crate::output::out!(
        "{}",
        lamina_controller::crds_yaml().context("rendering the CRDs")?
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_controller_command_line_is_consistent() {
        ControllerCli::command().debug_assert();
        let c = ControllerCli::try_parse_from([
            "lamina controller",
            "--namespace",
            "lamina",
            "--identity",
            "a",
            "--lease-duration",
            "5s",
            "--metrics-listen",
            "127.0.0.1:9090",
        ])
        .unwrap();
        assert_eq!(
            (c.namespace.as_str(), c.identity.as_deref()),
            ("lamina", Some("a"))
        );
        assert_eq!(std::time::Duration::from(c.lease_duration).as_secs(), 5);
        assert!(
            ControllerCli::try_parse_from(["lamina controller", "--lease-duration", "soon"])
                .is_err()
        );
    }
}
