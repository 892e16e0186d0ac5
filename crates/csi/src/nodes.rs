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
    /// Its zone, when known here; otherwise its Node's label
    /// `topology.kubernetes.io/zone` (watched with the node Secrets).
    pub zone: Option<String>,
}

/// The label of a Node that names its zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// A node picked for an RPC: its name and daemon.
#[derive(Clone)]
pub(crate) struct Picked {
    pub name: String,
    pub client: Client,
    pub transfer_address: Option<String>,
    pub zone: Option<String>,
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
    /// The zones of the cluster's Nodes, by node name.
    zones: RwLock<BTreeMap<String, String>>,
}

impl NodeSet {
    pub fn single(name: &str, client: Client) -> NodeSet {
        let node = StorageNode {
            client,
            transfer_address: None,
            zone: None,
        };
        NodeSet {
            default: name.to_string(),
            qualified: false,
            nodes: RwLock::new([(name.to_string(), node)].into()),
            zones: RwLock::default(),
        }
    }

    /// Several nodes; ids carry the node, and those without one name
    /// `default`.
    pub fn multi(default: &str, nodes: BTreeMap<String, StorageNode>) -> NodeSet {
        NodeSet {
            default: default.to_string(),
            qualified: true,
            nodes: RwLock::new(nodes),
            zones: RwLock::default(),
        }
    }

    pub fn replace(&self, nodes: BTreeMap<String, StorageNode>) {
        *self.nodes.write().unwrap_or_else(|p| p.into_inner()) = nodes;
    }

    /// The zones of the cluster's Nodes (their [`ZONE_LABEL`]), by name.
    pub fn replace_zones(&self, zones: BTreeMap<String, String>) {
        *self.zones.write().unwrap_or_else(|p| p.into_inner()) = zones;
    }

    fn zone_of(&self, name: &str, n: &StorageNode) -> Option<String> {
        n.zone.clone().or_else(|| {
            self.zones
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(name)
                .cloned()
        })
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
            zone: self.zone_of(name, n),
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
                zone: self.zone_of(name, n),
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
    tokio::spawn(watch_zones(set.clone(), client.clone()));
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
                            zone: None,
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

/// Keep `set`'s zones equal to the Nodes' [`ZONE_LABEL`]s until the process
/// ends (the controller's ServiceAccount may watch Nodes: csi-provisioner
/// does for topology). A watch that fails is logged and started again.
async fn watch_zones(set: std::sync::Arc<NodeSet>, client: kube::Client) {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Node;
    use kube::runtime::watcher;
    use kube::ResourceExt;
    let api: kube::Api<Node> = kube::Api::all(client);
    let zone = |n: &Node| n.labels().get(ZONE_LABEL).cloned();
    let mut zones = BTreeMap::new();
    let mut init: Option<BTreeMap<String, String>> = None;
    let mut events = watcher(api, watcher::Config::default()).boxed();
    while let Some(ev) = events.next().await {
        match ev {
            Ok(watcher::Event::Init) => init = Some(BTreeMap::new()),
            Ok(watcher::Event::InitApply(n)) => {
                if let (Some(i), Some(z)) = (init.as_mut(), zone(&n)) {
                    i.insert(n.name_any(), z);
                }
            }
            Ok(watcher::Event::InitDone) => zones = init.take().unwrap_or_default(),
            Ok(watcher::Event::Apply(n)) => match zone(&n) {
                Some(z) => {
                    zones.insert(n.name_any(), z);
                }
                None => {
                    zones.remove(&n.name_any());
                }
            },
            Ok(watcher::Event::Delete(n)) => {
                zones.remove(&n.name_any());
            }
            Err(e) => {
                tracing::warn!(error = %e, "watching Nodes for their zones");
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                continue;
            }
        }
        if init.is_none() {
            set.replace_zones(zones.clone());
        }
    }
}
