//! Serving the services on the CSI endpoint (a unix socket), by mode.

use crate::controller::ControllerService;
use crate::group::GroupService;

use crate::identity::IdentityService;
use crate::node::{self, NodeService};
use crate::nodes::{NodeSet, NodeSource};
use crate::proto::controller_server::ControllerServer;
use crate::proto::group_controller_server::GroupControllerServer;

use crate::proto::identity_server::IdentityServer;
use crate::proto::node_server::NodeServer;
use lamina_client::Client;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

/// Which services this process serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Identity, controller and group controller (one per cluster).
    Controller,
    /// Identity and node (one per node).
    Node,
    /// All of them (one machine, and csi-sanity).
    All,
}

#[derive(Clone, Debug)]
pub struct Options {
    pub mode: Mode,
    /// `unix:///path/to/csi.sock` (or `unix:/path`, or a bare path).
    pub endpoint: String,
    pub driver_name: String,
    /// This node's name.
    pub node_id: String,
    /// The node whose daemon the controller drives (with `NodeSource::Single`),
    /// and the node ids without a node name (with several nodes).
    pub storage_node: String,
    /// The nodes the controller drives.
    pub nodes: NodeSource,
    /// The node service's records.
    pub state_dir: PathBuf,
    /// Where the node service serves the daemon's freezes
    /// (`DATA_DIR/freeze.sock`, `lamina_api::freeze`); `None`: nowhere.
    pub freeze_socket: Option<PathBuf>,
    /// This node's daemon (the node service, the identity's probe, and the
    /// controller's one node with `NodeSource::Single`).
    pub client: Client,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("CSI endpoint {0:?}: expected unix:///PATH")]
    Endpoint(String),
    #[error("cannot listen on {path}: {source}")]
    Listen {
        path: String,
        source: std::io::Error,
    },
    #[error("the node service: {0}")]
    Node(#[from] node::Error),
    #[error("gRPC server: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// The socket path of a CSI endpoint.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, Error> {
    let p = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    if p.is_empty() || !p.starts_with('/') {
        return Err(Error::Endpoint(endpoint.to_string()));
    }
    Ok(PathBuf::from(p))
}

/// Serve until `shutdown` completes. A stale socket file from an earlier
/// run is replaced.
pub async fn serve(opts: Options, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    let path = socket_path(&opts.endpoint)?;
    let listen_err = |source| Error::Listen {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(listen_err)?;
    }
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(listen_err(e)),
    }
    let listener = tokio::net::UnixListener::bind(&path).map_err(listen_err)?;
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let controller = matches!(opts.mode, Mode::Controller | Mode::All);
    let node = matches!(opts.mode, Mode::Node | Mode::All);
    let set = match &opts.nodes {
        NodeSource::Single => NodeSet::single(&opts.storage_node, opts.client.clone()),
        NodeSource::Fixed(nodes) => NodeSet::multi(&opts.storage_node, nodes.clone()),
        NodeSource::Secrets { .. } => NodeSet::multi(&opts.storage_node, Default::default()),
    };
    let set = Arc::new(set);
    if let (true, NodeSource::Secrets { namespace }) = (controller, &opts.nodes) {
        tokio::spawn(crate::nodes::watch_secrets(set.clone(), namespace.clone()));
    }
    let identity = IdentityService {
        name: opts.driver_name.clone(),
        client: opts.client.clone(),
        controller,
        // A controller of several nodes has no daemon of its own: it is
        // ready when it knows a node.
        nodes: (opts.mode == Mode::Controller && !matches!(opts.nodes, NodeSource::Single))
            .then(|| set.clone()),
    };
    let mut router = tonic::transport::Server::builder()
        .trace_fn(|r| tracing::info_span!("csi", method = %r.uri().path()))
        .add_service(IdentityServer::new(identity));
    if controller {
        let c = Arc::new(ControllerService::new(set));
        router = router
            .add_service(ControllerServer::from_arc(c.clone()))
            .add_service(GroupControllerServer::new(GroupService::new(c)));
    }
    let mut freezes = None;
    if node {
        let n = NodeService::new(
            opts.client.clone(),
            node::Config {
                node_id: opts.node_id.clone(),
                state_dir: opts.state_dir.clone(),
            },
        )?;
        let f = n.freezer();
        let _ = tokio::task::spawn_blocking(move || f.recover()).await;
        if let Some(socket) = opts.freeze_socket.clone() {
            let f = n.freezer();
            freezes = Some(tokio::spawn(async move {
                if let Err(e) = node::freeze::serve(f, socket.clone()).await {
                    tracing::error!(socket = %socket.display(), error = %e, "the freeze service stopped");
                }
            }));
        }
        router = router.add_service(NodeServer::new(n));
    }
    tracing::info!(socket = %path.display(), mode = ?opts.mode, "CSI driver listening");
    router
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    // The freeze service goes with the node service (its freezes' holds
    // with it: a plugin started again thaws what they held). Awaited, so
    // that its listener is closed and its socket unlinked before this
    // returns: a plugin served next in the same process would otherwise
    // find the old socket still answering, take it for another plugin's
    // and serve no freezes.
    if let Some(f) = freezes {
        f.abort();
        let _ = f.await;
    }
    let _ = std::fs::remove_file(&path);
    Ok(())
}
