//! The storage nodes the controller drives: one (the daemon of the
//! command line, ids without a node) or several, read from the node
//! Secrets (`--nodes-from-secrets`, ids carry the node). An RPC reaches the
//! node its id names; a node not in the set is UNAVAILABLE, never treated
//! as empty.

use crate::proto::Topology;
use lamina_client::Client;
use std::collections::BTreeMap;
use std::sync::RwLock;
use tonic::Status;

/// One node's daemon.
#[derive(Clone)]
pub struct StorageNode {
    pub client: Client,
    /// Its transfer listener (`HOST:PORT`), which other nodes pull from.
    pub transfer_address: Option<String>,
}

/// A node picked for an RPC: its name and daemon.
#[derive(Clone)]
pub(crate) struct Picked {
    pub name: String,
    pub client: Client,
    pub transfer_address: Option<String>,
}

/// Where the node set comes from.
#[derive(Clone)]
pub enum NodeSource {
    /// One node: `Options::storage_node`, reached with `Options::client`.
    Single,
    /// The node Secrets of this namespace, kept up to date by a watch.
    Secrets { namespace: String },
    /// A fixed set (tests, or a program embedding the driver).
    Fixed(BTreeMap<String, StorageNode>),
}

impl std::fmt::Debug for NodeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeSource::Single => f.write_str("Single"),
            NodeSource::Secrets { namespace } => write!(f, "Secrets({namespace})"),
            NodeSource::Fixed(n) => write!(f, "Fixed({:?})", n.keys().collect::<Vec<_>>()),
        }
    }
}

pub struct NodeSet {
    /// The node an id without a node names.
    default: String,
    /// Whether ids carry the node.
    qualified: bool,
    nodes: RwLock<BTreeMap<String, StorageNode>>,
}

impl NodeSet {
    pub fn single(name: &str, client: Client) -> NodeSet {
        let node = StorageNode {
            client,
            transfer_address: None,
        };
        NodeSet {
            default: name.to_string(),
            qualified: false,
            nodes: RwLock::new([(name.to_string(), node)].into()),
        }
    }

    /// Several nodes; ids carry the node, and those without one name
    /// `default`.
    pub fn multi(default: &str, nodes: BTreeMap<String, StorageNode>) -> NodeSet {
        NodeSet {
            default: default.to_string(),
            qualified: true,
            nodes: RwLock::new(nodes),
        }
    }

    pub fn replace(&self, nodes: BTreeMap<String, StorageNode>) {
        *self.nodes.write().unwrap_or_else(|p| p.into_inner()) = nodes;
    }

    pub(crate) fn qualified(&self) -> bool {
        self.qualified
    }

    /// The node an id's node names (None: the default), or UNAVAILABLE.
    pub(crate) fn get(&self, node: Option<&str>) -> Result<Picked, Status> {
        let name = node.unwrap_or(&self.default);
        let nodes = self.nodes.read().unwrap_or_else(|p| p.into_inner());
        let n = nodes.get(name).ok_or_else(|| {
            Status::unavailable(format!(
                "storage node {name:?} is not known to the CSI controller (no node Secret names it)"
            ))
        })?;
        Ok(Picked {
            name: name.to_string(),
            client: n.client.clone(),
            transfer_address: n.transfer_address.clone(),
        })
    }

    pub(crate) fn all(&self) -> Vec<Picked> {
        let nodes = self.nodes.read().unwrap_or_else(|p| p.into_inner());
        nodes
            .iter()
            .map(|(name, n)| Picked {
                name: name.clone(),
                client: n.client.clone(),
                transfer_address: n.transfer_address.clone(),
            })
            .collect()
    }

    /// The node an id should carry for a volume on `node`.
    pub(crate) fn qualifier(&self, node: &str) -> Option<String> {
        self.qualified.then(|| node.to_string())
    }
}

/// A node's topology: the one segment naming it.
pub fn topology_of(node: &str) -> Topology {
    Topology {
        segments: [(crate::TOPOLOGY_KEY.to_string(), node.to_string())].into(),
    }
}

/// Keep `set` equal to the node Secrets of `namespace` until the process
/// ends. A Secret that cannot be used is logged and left out.
pub async fn watch_secrets(set: std::sync::Arc<NodeSet>, namespace: String) {
    use futures::StreamExt;
    let client = loop {
        match kube::Client::try_default().await {
            Ok(c) => break c,
            Err(e) => {
                tracing::warn!(error = %e, "no Kubernetes client for the node Secrets; trying again");
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            }
        }
    };
    let api = kube::Api::namespaced(client, &namespace);
    let mut sets = lamina_node_secrets::watch(api).boxed();
    while let Some(secrets) = sets.next().await {
        let mut nodes = BTreeMap::new();
        for s in secrets.values() {
            let (name, spec) = match lamina_node_secrets::node_of(s) {
                Ok(x) => x,
                Err(why) => {
                    tracing::warn!("node Secret left out: {why}");
                    continue;
                }
            };
            match Client::tcp(&spec.endpoint, Some(&spec.token)) {
                Ok(client) => {
                    nodes.insert(
                        name,
                        StorageNode {
                            client,
                            transfer_address: spec.transfer_address,
                        },
                    );
                }
                Err(e) => {
                    tracing::warn!(node = %name, endpoint = %spec.endpoint, error = %e, "node Secret left out")
                }
            }
        }
        tracing::info!(nodes = ?nodes.keys().collect::<Vec<_>>(), "storage nodes");
        set.replace(nodes);
    }
}
