//! The daemon's typed records: an export to restore at start, and an
//! operation (what it does, its state, and its copy's progress), as the
//! store keeps them in JSON (docs/daemon.md describes the format). Types
//! only: reading and writing them is `Store`'s.

use lamina_api::{OperationKind, OperationState};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// An export to restore at start.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExportRec {
    pub volume: String,
    pub snapshot: Option<String>,
    /// Also served as a file (`DATA/files/NAME`); absent in records written
    /// before files existed.
    #[serde(default)]
    pub file: bool,
}

/// Where a clone's data comes from.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "from", rename_all = "kebab-case")]
pub enum CloneSource {
    /// A snapshot, as it is.
    Snapshot { volume: String, snapshot: String },
    /// A volume as it is when the clone runs (through a system snapshot).
    Volume { volume: String },
    /// A snapshot on another node, pulled over the transfer protocol.
    Remote {
        node: String,
        address: String,
        volume: String,
        snapshot: String,
    },
}

impl CloneSource {
    /// The volume of this node the clone reads (none for another node's).
    pub fn local_volume(&self) -> Option<&str> {
        match self {
            CloneSource::Snapshot { volume, .. } | CloneSource::Volume { volume } => Some(volume),
            CloneSource::Remote { .. } => None,
        }
    }

    /// As the API shows it: `VOLUME/SNAPSHOT`, `VOLUME`, or
    /// `NODE:VOLUME/SNAPSHOT`.
    pub fn api_form(&self) -> String {
        match self {
            CloneSource::Snapshot { volume, snapshot } => format!("{volume}/{snapshot}"),
            CloneSource::Volume { volume } => volume.clone(),
            CloneSource::Remote {
                node,
                volume,
                snapshot,
                ..
            } => format!("{node}:{volume}/{snapshot}"),
        }
    }
}

impl std::fmt::Display for CloneSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloneSource::Snapshot { volume, snapshot } => write!(f, "snapshot {volume}/{snapshot}"),
            CloneSource::Volume { volume } => write!(f, "volume {volume}"),
            CloneSource::Remote {
                node,
                address,
                volume,
                snapshot,
            } => write!(f, "snapshot {volume}/{snapshot} of node {node} ({address})"),
        }
    }
}

/// Every change the daemon makes, with exactly the arguments it needs to
/// be run again after a restart.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Op {
    CreateVolume {
        name: String,
        size: u64,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        labels: BTreeMap<String, String>,
        /// Other nodes holding a replica each (docs/replicas.md).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        replicas: Vec<String>,
    },
    /// Replace a volume's labels.
    SetVolumeLabels {
        name: String,
        labels: BTreeMap<String, String>,
    },
    ExpandVolume {
        name: String,
        size: u64,
    },
    DeleteVolume {
        name: String,
        with_snapshots: bool,
    },
    CreateSnapshot {
        volume: String,
        name: String,
        labels: BTreeMap<String, String>,
    },
    DeleteSnapshot {
        volume: String,
        name: String,
    },
    Revert {
        volume: String,
        snapshot: String,
    },
    Flatten {
        name: String,
    },
    Clone {
        name: String,
        source: CloneSource,
        full: bool,
    },
    /// A group snapshot `name` of `volumes` (sorted, each once).
    CreateSnapshotGroup {
        name: String,
        volumes: Vec<String>,
        labels: BTreeMap<String, String>,
    },
    /// Delete every member of group snapshot `name`; `volumes` (sorted)
    /// held one when the request came.
    DeleteSnapshotGroup {
        name: String,
        volumes: Vec<String>,
    },
    /// A replica of `volume` on node `node` (docs/replicas.md).
    AddReplica {
        volume: String,
        node: String,
    },
    RemoveReplica {
        volume: String,
        node: String,
    },
}

impl Op {
    /// The volume the operation changes: operations on one volume run one
    /// at a time (a clone changes the new volume). A group operation
    /// changes several: this is the first by name (see [`Op::volumes`]).
    pub fn volume(&self) -> &str {
        match self {
            Op::CreateSnapshotGroup { volumes, name, .. }
            | Op::DeleteSnapshotGroup { volumes, name } => {
                volumes.first().map(String::as_str).unwrap_or(name)
            }
            Op::CreateVolume { name, .. }
            | Op::SetVolumeLabels { name, .. }
            | Op::ExpandVolume { name, .. }
            | Op::DeleteVolume { name, .. }
            | Op::Flatten { name }
            | Op::Clone { name, .. } => name,
            Op::CreateSnapshot { volume, .. }
            | Op::DeleteSnapshot { volume, .. }
            | Op::Revert { volume, .. }
            | Op::AddReplica { volume, .. }
            | Op::RemoveReplica { volume, .. } => volume,
        }
    }

    /// Whether running the operation again after it succeeded changes
    /// nothing, whatever was written to the volumes since: true only of a
    /// snapshot's (or a group snapshot's) creation, which finds the
    /// snapshot there and answers it as it is. Not of a revert, say: run
    /// again, it would throw away what was written to the volume since. A
    /// snapshot deleted (or its volume reverted) since is no exception:
    /// that operation wrote a synced record, which made this one's done
    /// mark durable too.
    pub fn rerun_changes_nothing(&self) -> bool {
        matches!(
            self,
            Op::CreateSnapshot { .. } | Op::CreateSnapshotGroup { .. }
        )
    }

    /// Every volume the operation changes, sorted.
    pub fn volumes(&self) -> Vec<&str> {
        match self {
            Op::CreateSnapshotGroup { volumes, .. } | Op::DeleteSnapshotGroup { volumes, .. } => {
                volumes.iter().map(String::as_str).collect()
            }
            other => vec![other.volume()],
        }
    }

    pub fn kind(&self) -> OperationKind {
        match self {
            Op::CreateSnapshotGroup { .. } => OperationKind::CreateSnapshotGroup,
            Op::DeleteSnapshotGroup { .. } => OperationKind::DeleteSnapshotGroup,
            Op::CreateVolume { .. } => OperationKind::CreateVolume,
            Op::SetVolumeLabels { .. } => OperationKind::SetVolumeLabels,
            Op::ExpandVolume { .. } => OperationKind::ExpandVolume,
            Op::DeleteVolume { .. } => OperationKind::DeleteVolume,
            Op::CreateSnapshot { .. } => OperationKind::CreateSnapshot,
            Op::DeleteSnapshot { .. } => OperationKind::DeleteSnapshot,
            Op::Revert { .. } => OperationKind::Revert,
            Op::Flatten { .. } => OperationKind::Flatten,
            Op::Clone {
                source: CloneSource::Remote { .. },
                ..
            } => OperationKind::RemoteClone,
            Op::Clone { full: false, .. } => OperationKind::Clone,
            Op::Clone { full: true, .. } => OperationKind::FullClone,
            Op::AddReplica { .. } => OperationKind::AddReplica,
            Op::RemoveReplica { .. } => OperationKind::RemoveReplica,
        }
    }
}

/// A full clone's copy: what it reads and how far it is durable.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CopyRec {
    /// The snapshot it copies from (on the source node, for a remote clone).
    pub volume: String,
    pub snapshot: String,
    /// The snapshot was taken by the system for this copy, and is deleted
    /// when the copy ends, however it ends.
    pub system: bool,
    /// Everything below this offset is durable in the new volume.
    pub resume_offset: u64,
    /// A remote clone: the source snapshot's id when the copy started; a
    /// resume from a snapshot of the same name but another id is refused.
    #[serde(default)]
    pub snapshot_id: u64,
    /// A remote clone: data bytes received over all its attempts (recorded
    /// at each checkpoint and at most a second apart).
    #[serde(default)]
    pub received_bytes: u64,
    /// A remote clone: of those, bytes received more than once (recorded
    /// with them; absent in records of versions that did not keep it).
    #[serde(default)]
    pub resent_bytes: Option<u64>,
    /// A remote clone: bytes received on the wire over all its attempts.
    #[serde(default)]
    pub wire_bytes: u64,
    /// A remote clone: other nodes that may hold the same snapshot (the
    /// other replicas of its volume), as the sources named them, in the
    /// order they are tried when the source in use is lost. Each is asked
    /// for the snapshot of the recorded `snapshot_id`, never another.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub others: Vec<PeerRec>,
}

/// Another node a remote clone may pull from.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PeerRec {
    pub node: String,
    /// Its transfer listener, `HOST:PORT`.
    pub address: String,
}

impl CopyRec {
    /// A copy of `volume`'s snapshot `snapshot` that has not started: nothing
    /// durable, received or resent yet.
    pub fn new(volume: String, snapshot: String, system: bool) -> CopyRec {
        CopyRec {
            volume,
            snapshot,
            system,
            resume_offset: 0,
            snapshot_id: 0,
            received_bytes: 0,
            resent_bytes: None,
            wire_bytes: 0,
            others: Vec::new(),
        }
    }
}

/// A recorded operation.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct OpRec {
    pub id: String,
    pub op: Op,
    pub state: OperationState,
    /// RFC 3339.
    pub started: String,
    pub error: Option<String>,
    /// Bytes done and to do (copies and flattens).
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// Set once a full clone knows what it copies.
    pub copy: Option<CopyRec>,
    /// Why a remote clone failed.
    #[serde(default)]
    pub reason: Option<lamina_api::FailureReason>,
}

impl OpRec {
    pub fn volume(&self) -> &str {
        self.op.volume()
    }
}
