//! `lamina csi`: the CSI driver (crates/csi) as a long-running process.
//! Its flags follow CSI drivers' conventions (`--endpoint` is the CSI
//! socket), so it is parsed on its own rather than with the API commands,
//! whose global `--endpoint` is the daemon's address.

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ModeArg {
    /// Identity, controller and group controller: one per cluster.
    Controller,
    /// Identity and node: one per node, beside the node's daemon.
    Node,
    /// Everything in one process (one machine; csi-sanity).
    All,
}

/// Run Lamina's CSI driver (CSI spec v1.12.0) on a unix socket, driving a
/// Lamina daemon (`lamina serve`) through its API.
#[derive(Parser, Debug)]
#[command(name = "lamina csi", version)]
pub struct CsiCli {
    /// Which services to serve.
    #[arg(long, value_enum, default_value = "all")]
    mode: ModeArg,
    /// The CSI socket, unix:///PATH.
    #[arg(long, env = "CSI_ENDPOINT", default_value = "unix:///csi/csi.sock")]
    endpoint: String,
    /// This node's name (Kubernetes: the node name) [default: the host name].
    #[arg(long, env = "NODE_NAME")]
    node_id: Option<String>,
    /// The node whose daemon the controller drives; with --nodes-from-secrets,
    /// the node that ids without a node name [default: --node-id].
    #[arg(long)]
    storage_node: Option<String>,
    /// The controller drives every node of the node Secrets (label
    /// lamina.io/node; keys endpoint, token, transfer-address) in --namespace.
    #[arg(long)]
    nodes_from_secrets: bool,
    /// The namespace of the node Secrets.
    #[arg(long, env = "POD_NAMESPACE", default_value = "lamina-system")]
    namespace: String,
    /// The driver's name.
    #[arg(long, default_value = lamina_csi::DRIVER_NAME)]
    driver_name: String,
    /// The daemon's data directory, to reach it on DIR/api.sock [default: as `lamina serve`].
    #[arg(long, env = "LAMINA_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Reach the daemon over TCP instead, e.g. http://10.0.0.5:7480 (needs the token).
    #[arg(long, env = "LAMINA_ENDPOINT", value_name = "URL")]
    lamina_endpoint: Option<String>,
    /// Bearer token for --lamina-endpoint [default: DIR/token when readable].
    #[arg(long, env = "LAMINA_TOKEN", hide_env_values = true)]
    lamina_token: Option<String>,
    /// Where the node service records what it staged and published [default: DIR/csi-node].
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
}

pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// `lamina csi ARGS...`; `args` starts with the program name.
pub fn main(args: Vec<std::ffi::OsString>) -> Result<()> {
    let mut args = args;
    // "lamina csi --mode ..." parses as "lamina csi" "--mode ...".
    args.remove(1);
    let cli = CsiCli::parse_from(args);
    let data_dir = super::data_dir(cli.data_dir.clone());
    let client = super::make_client(
        &data_dir,
        cli.lamina_endpoint.as_deref(),
        cli.lamina_token.as_deref(),
    )?;
    let node_id = cli.node_id.clone().unwrap_or_else(hostname);
    let opts = lamina_csi::Options {
        mode: match cli.mode {
            ModeArg::Controller => lamina_csi::Mode::Controller,
            ModeArg::Node => lamina_csi::Mode::Node,
            ModeArg::All => lamina_csi::Mode::All,
        },
        endpoint: cli.endpoint.clone(),
        driver_name: cli.driver_name.clone(),
        storage_node: cli.storage_node.clone().unwrap_or_else(|| node_id.clone()),
        nodes: if cli.nodes_from_secrets {
            lamina_csi::NodeSource::Secrets {
                namespace: cli.namespace.clone(),
            }
        } else {
            lamina_csi::NodeSource::Single
        },
        node_id,
        state_dir: cli
            .state_dir
            .clone()
            .unwrap_or_else(|| data_dir.join("csi-node")),
        // The daemon finds the node plugin's freeze service in its data
        // directory; a plugin that reaches its daemon over TCP shares none.
        freeze_socket: client
            .is_unix()
            .then(|| data_dir.join(lamina_api::freeze::SOCKET)),
        client,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("lamina-csi")
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let shutdown = super::shutdown_signal()?;
        lamina_csi::serve(opts, shutdown)
            .await
            .context("serving CSI")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_csi_command_line_is_consistent() {
        CsiCli::command().debug_assert();
        let c = CsiCli::try_parse_from([
            "lamina csi",
            "--mode",
            "node",
            "--endpoint",
            "unix:///x/csi.sock",
        ])
        .unwrap();
        assert!(matches!(c.mode, ModeArg::Node));
        assert_eq!(c.endpoint, "unix:///x/csi.sock");
        assert!(!c.nodes_from_secrets);
        let c = CsiCli::try_parse_from([
            "lamina csi",
            "--mode",
            "controller",
            "--nodes-from-secrets",
            "--namespace",
            "lamina",
        ])
        .unwrap();
        assert!(c.nodes_from_secrets && c.namespace == "lamina");
        assert!(CsiCli::try_parse_from(["lamina csi", "--mode", "both"]).is_err());
    }
}
