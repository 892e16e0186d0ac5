//! The custom resources, group `lamina.io`, version `v1alpha1`, both
//! namespaced (they live in Lamina's namespace): their Rust types are the
//! source of the CRDs (schemas, printer columns, CEL rules for the immutable
//! fields).

// Each printcolumn(...) repeats `type_ = ...`: clippy takes them for
// duplicated attributes of one item.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The group of Lamina's resources.
pub const GROUP: &str = "lamina.io";
/// Label on every Snapshot naming its (engine) volume, so the snapshots of a
/// volume are found without reading all of them.
pub const VOLUME_LABEL: &str = "lamina.io/volume";
/// Label on Secrets that describe a node daemon (value: the node's name).
pub use lamina_node_secrets::NODE_LABEL;

/// A Lamina volume on one node.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "lamina.io",
    version = "v1alpha1",
    kind = "Volume",
    namespaced,
    status = "VolumeStatus",
    shortname = "lvol",
    category = "lamina",
    validation = Rule::new("self.spec.node == oldSelf.spec.node || (has(self.status) && has(self.status.replicaSet) && self.status.replicaSet.frontEnd == self.spec.node)").message("spec.node is immutable, but for a replicated volume taken over by the node its status.replicaSet names as front end"),
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.node"),
    printcolumn(name = "Size", type_ = "string", json_path = ".spec.size"),
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "Attached", type_ = "boolean", json_path = ".status.attached"),
    printcolumn(
        name = "Replicas",
        type_ = "string",
        json_path = ".status.replication.state"
    ),
    printcolumn(
        name = "Clone",
        type_ = "string",
        json_path = ".status.clone.state",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSpec {
    /// The engine's name of the volume when it differs from metadata.name
    /// (engine names allow '_' and 255 characters). Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z0-9][a-z0-9._-]{0,254}$"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("volumeName is immutable"))]
    pub volume_name: Option<String>,
    /// Size: bytes, or a quantity with a binary or decimal suffix (10Gi, 1G).
    /// It may grow, never shrink.
    #[schemars(regex(pattern = r"^[1-9][0-9]*(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"))]
    pub size: String,
    /// The node whose daemon holds the volume (a replicated volume's front
    /// end). Immutable, but for a replicated volume taken over by another
    /// node: it moves to the node its status.replicaSet names.
    #[schemars(regex(pattern = r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$"))]
    pub node: String,
    /// What the volume starts from. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("dataSource is immutable"))]
    pub data_source: Option<DataSource>,
}

/// A volume's source: a Snapshot resource, or a volume as it is now.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataSource {
    pub kind: SourceKind,
    /// The Snapshot resource's name (kind Snapshot, same namespace) or the
    /// engine volume's name (kind Volume).
    #[schemars(length(min = 1, max = 255))]
    pub name: String,
    /// Linked (shares blocks, made at once) or full (an independent copy,
    /// made in the background).
    #[serde(default)]
    pub mode: CloneMode,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum SourceKind {
    Snapshot,
    Volume,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CloneMode {
    #[default]
    Linked,
    Full,
}

/// What the daemon says of the volume.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStatus {
    /// Pending (not made yet), Cloning (a full clone copying), Ready,
    /// Failed (could not be made; see the conditions), Missing (the daemon
    /// no longer has it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The engine's id of the volume (never reused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    /// Size in bytes as the daemon has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// Exported over NBD now.
    #[serde(default)]
    pub attached: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone: Option<CloneStatus>,
    /// A replicated volume's replicas, as its front end's daemon (this
    /// resource's node) records them; absent for a volume of one replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<ReplicationStatus>,
    /// A replicated volume's replica set as the cluster agrees on it: written
    /// only by the front end's daemon, each change with a resourceVersion
    /// precondition, before the daemon acts on it (docs/replicas.md, "The
    /// shared record"). The controllers never write it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_set: Option<SharedReplicaSet>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The replica set's shared record.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SharedReplicaSet {
    /// The node whose daemon holds the volume's front end: only it changes
    /// this record.
    pub front_end: String,
    /// The last generation a front end took; replicas refuse every request
    /// of a lower one.
    pub generation: u64,
    /// Every replica, the front end's node's first (unless it holds none).
    pub replicas: Vec<SharedReplica>,
    /// The front end's node holds no replica: it reaches every one over
    /// the network. Always written: the daemon's merge patch must clear it
    /// when a front end holding a replica takes the volume back.
    #[serde(default)]
    pub diskless: bool,
}

/// One replica in the shared record.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SharedReplica {
    pub node: String,
    /// Why it was faulted; absent while healthy (it holds every
    /// acknowledged write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub faulted: Option<String>,
}

/// A replicated volume's state and replicas.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicationStatus {
    /// Healthy (every replica is), Degraded (some replica is faulted or
    /// rebuilding, at least one is healthy) or Unavailable (none is).
    pub state: String,
    /// The node whose daemon serves the volume's I/O (its front end).
    pub front_end: String,
    /// The generation the front end last took (0: never served yet); every
    /// replica refuses requests of a lower one.
    pub generation: u64,
    /// In order, the front end's node first.
    #[serde(default)]
    pub replicas: Vec<ReplicaStatus>,
}

/// One replica.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaStatus {
    pub node: String,
    /// Healthy (holds every acknowledged write), Faulted (may miss some;
    /// neither written nor read) or Rebuilding (faulted, and being sent
    /// what it lacks).
    pub state: String,
    /// Why it was faulted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Since when it is in this state (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// A rebuild's progress through its round under way, in percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<u8>,
    /// Bytes sent to it by its rebuild so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_bytes: Option<u64>,
    /// Bytes per second its rebuild sends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u64>,
    /// Seconds until its rebuild's round under way ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<u64>,
}

/// Where a clone came from and how its copy goes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CloneStatus {
    /// `VOLUME/SNAPSHOT` or `VOLUME` it was made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// initiated, completed or failed.
    pub state: String,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Percent copied (a full clone), 0 to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<u8>,
    /// Bytes per second copied so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u64>,
    /// Seconds left at that rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<u64>,
}

/// One engine snapshot; there is one for every snapshot the daemons hold,
/// system-made ones included.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "lamina.io",
    version = "v1alpha1",
    kind = "Snapshot",
    namespaced,
    status = "SnapshotStatus",
    shortname = "lsnap",
    category = "lamina",
    printcolumn(name = "Volume", type_ = "string", json_path = ".spec.volume"),
    printcolumn(name = "Size", type_ = "integer", json_path = ".status.size"),
    printcolumn(name = "Ready", type_ = "boolean", json_path = ".status.readyToUse"),
    printcolumn(name = "Parent", type_ = "string", json_path = ".status.parent"),
    printcolumn(
        name = "User",
        type_ = "boolean",
        json_path = ".status.userCreated",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("!self.createSnapshot || !has(self.snapshotName) || !self.snapshotName.startsWith('.')").message("names starting with '.' are the system's: they cannot be requested"))]
#[serde(rename_all = "camelCase")]
pub struct SnapshotSpec {
    /// The engine volume the snapshot belongs to. Immutable.
    #[schemars(regex(pattern = r"^[a-z0-9][a-z0-9._-]{0,254}$"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("volume is immutable"))]
    pub volume: String,
    /// The engine's name of the snapshot when it differs from
    /// metadata.name (system snapshots start with '.'). Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z0-9.][a-z0-9._-]{0,254}$"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("snapshotName is immutable"))]
    pub snapshot_name: Option<String>,
    /// Take the snapshot (a resource made for an existing snapshot has false).
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("createSnapshot is immutable"))]
    pub create_snapshot: bool,
    /// Labels the engine snapshot carries.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("labels are immutable"))]
    pub labels: BTreeMap<String, String>,
}

/// What the daemon says of the snapshot.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatus {
    /// The snapshot before it in its volume's history (engine name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The snapshots after it (engine names).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub children: BTreeMap<String, bool>,
    /// Being deleted from the engine.
    #[serde(default)]
    pub mark_removed: bool,
    /// Made by a user (CLI, CSI, kubectl), not by the system.
    #[serde(default)]
    pub user_created: bool,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<String>,
    /// Bytes only this snapshot holds: what deleting it frees.
    #[serde(default)]
    pub size: u64,
    /// Size of the volume when it was taken: what a restore gives.
    #[serde(default)]
    pub restore_size: u64,
    #[serde(default)]
    pub ready_to_use: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The node whose daemon holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The engine's id (never reused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
}

impl Snapshot {
    /// The engine's name of the snapshot.
    pub fn engine_name(&self) -> &str {
        self.spec
            .snapshot_name
            .as_deref()
            .or(self.metadata.name.as_deref())
            .unwrap_or_default()
    }
}

impl Volume {
    /// The engine's name of the volume.
    pub fn engine_name(&self) -> &str {
        self.spec
            .volume_name
            .as_deref()
            .or(self.metadata.name.as_deref())
            .unwrap_or_default()
    }
}

/// The CRDs.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        Volume::crd(),
        Snapshot::crd(),
        lamina_snapshot_schedules::SnapshotSchedule::crd(),
    ]
    .into_iter()
    .map(|c| {
        // schemars writes Rust's unsigned formats, which the API server
        // does not know (kubectl warns of them): OpenAPI's instead.
        let mut v = serde_json::to_value(&c).unwrap_or_default();
        openapi_formats(&mut v);
        serde_json::from_value(v).unwrap_or(c)
    })
    .collect()
}

fn openapi_formats(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            if let Some(f) = m.get_mut("format") {
                match f.as_str() {
                    Some("uint64") => *f = "int64".into(),
                    Some("uint8" | "uint16" | "uint32") => *f = "int32".into(),
                    _ => {}
                }
            }
            m.values_mut().for_each(openapi_formats);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(openapi_formats),
        _ => {}
    }
}

/// The CRDs as one YAML stream (`lamina crds`, `kubectl apply -f -`).
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for c in crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&c)?);
    }
    Ok(out)
}

/// Bytes of a size as written in a Volume's spec (`10Gi`, `1G`, `4096`).
pub fn parse_quantity(s: &str) -> Option<u64> {
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let n: u64 = s[..digits].parse().ok()?;
    let mult: u64 = match &s[digits..] {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        _ => return None,
    };
    n.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("4096"), Some(4096));
        assert_eq!(parse_quantity("10Gi"), Some(10 << 30));
        assert_eq!(parse_quantity("1G"), Some(1_000_000_000));
        assert_eq!(parse_quantity("1Xi"), None);
        assert_eq!(parse_quantity("Gi"), None);
        assert_eq!(parse_quantity("99999999999999Pi"), None);
    }

    #[test]
    fn the_crds_carry_columns_validation_and_immutable_rules() {
        let y = crds_yaml().unwrap();
        for want in [
            "name: snapshots.lamina.io",
            "name: volumes.lamina.io",
            "jsonPath: .spec.volume",
            "jsonPath: .status.readyToUse",
            "jsonPath: .status.parent",
            "rule: self == oldSelf",
            "message: volume is immutable",
            "message: spec.node is immutable, but for a replicated volume taken over",
            "pattern: ^[1-9][0-9]*(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$",
            "scope: Namespaced",
            "subresources:",
            "format: int64",
        ] {
            assert!(y.contains(want), "CRDs lack {want:?}");
        }
        assert!(!y.contains("format: uint"), "only OpenAPI's formats");
    }
}
