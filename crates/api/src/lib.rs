//! Lamina's resource types as they cross a process boundary: the daemon's
//! HTTP/JSON API, read by the `lamina` CLI (through `lamina-client`), the
//! CSI driver and the Kubernetes controllers. It owns the wire shapes and the size syntax only; it must not
//! depend on the engine or do I/O.

mod code;
pub mod freeze;
mod schedule;
mod selector;
mod size;
mod space;
pub use code::ErrorCode;
pub use schedule::{
    DeleteScheduleQuery, KeptSnapshot, RunOutcome, Schedule, ScheduleDeleted, ScheduleRun,
    ScheduleSpec, ScheduleVolume, SnapshotsAction,
};
pub use selector::{LabelSelector, SelectorError};
pub use size::{format_size, parse_size};
pub use space::{PoolSpace, PruneResult, PruneSnapshots, PrunedSnapshot};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// The API's path prefix.
pub const API_PREFIX: &str = "/v1";
/// Header carrying the bearer token on TCP.
pub const AUTH_HEADER: &str = "authorization";

/// How a volume relates to the snapshot it was cloned from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum CloneState {
    /// Not a clone.
    None,
    /// Shares blocks with its origin snapshot.
    Linked,
    /// A flatten is copying the shared blocks.
    Flattening,
    /// Was cloned; shares nothing with its origin any more.
    Independent,
    /// A full clone is still copying data into it (not usable yet).
    Copying,
}

/// Where a clone came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Origin {
    /// Volume of the origin snapshot (absent if deleted since).
    pub volume: Option<String>,
    /// The origin snapshot (absent if deleted since).
    pub snapshot: Option<String>,
}

/// An NBD export of a volume or snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Export {
    /// NBD URI clients connect to (`nbd+unix:///NAME?socket=...` or `nbd://HOST:PORT/NAME`).
    pub uri: String,
    /// The export's name on the NBD server.
    pub name: String,
    pub read_only: bool,
    /// NBD clients connected to it now. They see the size the export had
    /// when they connected: after an expand they must reconnect.
    #[serde(default)]
    pub connections: u32,
    /// The file on the daemon's host that serves the same volume
    /// (`attach?file=true`), for a loop device: absent when none is served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// How the message of a refused `attach?file=true` begins (`503`
/// Unavailable): the node serves no files (`lamina serve --files off`, or
/// no FUSE on its host), and the caller should use the NBD export instead.
pub const FILES_REFUSED: &str = "this node serves no files";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Volume {
    /// The pool's id of the volume: never reused, so it tells a volume from
    /// a later one of the same name (CSI volume ids carry it).
    #[serde(default)]
    pub id: u64,
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Creation time, RFC 3339.
    pub created: String,
    /// Bytes of data mapped in the volume.
    pub allocated_bytes: u64,
    /// Bytes of data only the live volume references (what its own writes
    /// hold; deleting every snapshot would not free them).
    #[serde(default)]
    pub exclusive_bytes: u64,
    /// Bytes of data the volume shares with its snapshots or clone origin:
    /// `allocated_bytes - exclusive_bytes`.
    #[serde(default)]
    pub shared_bytes: u64,
    /// Snapshot the live data descends from.
    pub parent_snapshot: Option<String>,
    /// The snapshot a linked clone still shares blocks with; absent for a
    /// volume that was never a clone or no longer shares anything (flattened,
    /// or a finished full clone).
    pub origin: Option<Origin>,
    pub clone_state: CloneState,
    /// Set while the volume is exported over NBD.
    pub export: Option<Export>,
    /// Operation still running on the volume (a full clone or a flatten).
    pub operation: Option<String>,
    /// The volume's labels (schedules select volumes by them).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// A replicated volume's replicas; absent for a volume of one replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<Replication>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Snapshot {
    /// The pool's id of the snapshot: never reused.
    #[serde(default)]
    pub id: u64,
    pub volume: String,
    /// The pool's id of the snapshot's volume.
    #[serde(default)]
    pub volume_id: u64,
    /// Its volume was deleted (the snapshot stays): `volume` is the name
    /// it had, which a new volume may have taken since. `VOLUME@VOLUME_ID`
    /// names the deleted volume alone wherever a snapshot's volume is
    /// named (`VOLUME` alone does while no live volume has the name and
    /// one deleted volume had it).
    #[serde(default)]
    pub volume_deleted: bool,
    pub name: String,
    /// Creation time, RFC 3339.
    pub created: String,
    pub parent: Option<String>,
    pub children: Vec<String>,
    /// Made by the system (e.g. for a clone from a volume), not a user.
    pub system: bool,
    pub labels: BTreeMap<String, String>,
    /// Size of the volume when the snapshot was taken: what a restore gives.
    pub restore_size: u64,
    /// Bytes of data mapped in the snapshot.
    pub allocated_bytes: u64,
    /// Bytes only this snapshot holds: what deleting it frees.
    pub exclusive_bytes: u64,
    /// Bytes it shares with its volume, other snapshots or clones:
    /// `allocated_bytes - exclusive_bytes`.
    #[serde(default)]
    pub shared_bytes: u64,
    /// Linked clones made from this snapshot (volume names). They keep their
    /// data if the snapshot is deleted.
    #[serde(default)]
    pub clones: Vec<String>,
    pub export: Option<Export>,
}

impl Snapshot {
    /// How to name this snapshot's volume so that the daemon reaches it
    /// alone: its name, or `NAME@ID` once the volume was deleted.
    pub fn volume_reference(&self) -> String {
        if self.volume_deleted {
            format!("{}@{}", self.volume, self.volume_id)
        } else {
            self.volume.clone()
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreateVolume {
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Labels; the `lamina.io/` prefix is the system's.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Other nodes that hold a replica each, by name in the node list (at
    /// most 2: a volume has 1 to 3 replicas, and this node holds the
    /// first). Empty: one replica, here, as a volume has always had.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<String>,
}

/// A replica to add to a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AddReplica {
    /// The node to hold it, by name in the node list; not this node, nor
    /// one holding a replica of the volume already.
    pub node: String,
}

/// A replicated volume's replicas and the front end's generation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Replication {
    /// The generation the front end last activated the replicas at (0:
    /// never served yet); every replica refuses requests of a lower one.
    pub generation: u64,
    pub state: ReplicationState,
    /// In order: this node's replica first (unless it holds none).
    pub replicas: Vec<ReplicaInfo>,
    /// This node's front end holds no replica of the volume: it reaches
    /// every one over the network (docs/replicas.md, "A front end with no
    /// replica").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub diskless: bool,
}

/// Whether a replicated volume has all its replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReplicationState {
    /// Every replica is healthy.
    Healthy,
    /// Some replica is faulted; at least one is healthy.
    Degraded,
    /// No replica is healthy.
    Unavailable,
}

/// One replica of a replicated volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReplicaInfo {
    /// The node that holds it.
    pub node: String,
    /// Its transfer listener (`HOST:PORT`) as the front end reaches it:
    /// its node's address in the node list, else the one recorded with it
    /// (`unlisted:0` for a replica whose node was not listed when the
    /// volume was taken over); absent for this node's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    pub state: ReplicaState,
    /// Why it was faulted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Since when it is in this state (RFC 3339, UTC).
    pub since: String,
    /// Its rebuild under way, while it is rebuilding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuild: Option<RebuildProgress>,
    /// Its last rebuild that ended healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rebuild: Option<RebuildDone>,
}

/// A replica's rebuild under way: it is sent only what it lacks, in
/// rounds (docs/replicas.md, "Rebuilds").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RebuildProgress {
    /// Bytes of data sent to it since the rebuild began.
    pub sent_bytes: u64,
    /// The round under way: bytes of data it sends, and of them sent.
    pub round_bytes: u64,
    pub round_sent_bytes: u64,
    /// When the rebuild began (RFC 3339, UTC).
    pub started: String,
    /// Bytes sent per second since it began.
    pub rate_bytes_per_second: u64,
    /// Seconds until the round under way ends, at that rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<u64>,
}

/// A rebuild that ended with the replica healthy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RebuildDone {
    /// Bytes of data sent to it.
    pub sent_bytes: u64,
    /// When it began and ended (RFC 3339, UTC).
    pub started: String,
    pub ended: String,
}

/// A replica's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReplicaState {
    /// Holds every acknowledged write.
    Healthy,
    /// Out of the healthy set: it may miss acknowledged writes, and is
    /// neither written nor read until it is rebuilt.
    Faulted,
    /// Faulted, and being sent what it lacks (`rebuild` says how far).
    Rebuilding,
}

/// A volume's new labels (`PUT /v1/volumes/{name}/labels`): they replace
/// the old ones.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SetLabels {
    pub labels: BTreeMap<String, String>,
}

/// Filters of `GET /v1/volumes` (query parameters).
#[derive(
    Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema, utoipa::IntoParams,
)]
#[into_params(parameter_in = Query)]
pub struct VolumeFilter {
    /// Only volumes whose labels match: `key=value[,key=value...]`.
    pub selector: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExpandVolume {
    /// New size in bytes; shrinking is refused.
    pub size: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreateSnapshot {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Take it with the volume's filesystem frozen where a node plugin
    /// has it mounted (docs/csi-node.md, "Frozen snapshots"): the snapshot
    /// then needs no journal replay. Without a mount there is nothing to
    /// freeze; an attached volume that no node plugin serves freezes for
    /// is refused (409), one whose plugin does not answer is 503, and a
    /// freeze that lapsed before the thaw keeps nothing (503).
    #[serde(default, skip_serializing_if = "is_false")]
    pub freeze: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Filters of `GET /v1/snapshots` (query parameters), oldest first.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema, utoipa::IntoParams,
)]
#[into_params(parameter_in = Query)]
pub struct SnapshotFilter {
    /// Only snapshots with this name (of any volume).
    pub name: Option<String>,
    /// Only the snapshot with this id.
    #[serde(default, deserialize_with = "at_most::<_, u64, MAX_QUERY_ID>")]
    pub id: Option<u64>,
    /// Only the snapshots made by this schedule (its name now; they are
    /// found by its id, so a rename keeps them).
    pub schedule: Option<String>,
}

/// Label every snapshot of a group snapshot carries; its value is the
/// group's name, which is also each member snapshot's name.
pub const GROUP_LABEL: &str = "lamina.io/group";

/// Label every snapshot a schedule made carries; its value is the
/// schedule's id (never its name, so a renamed schedule keeps its
/// snapshots). Like [`GROUP_LABEL`], no user may set it.
pub const SCHEDULE_LABEL: &str = "lamina.io/schedule";

/// Label a volume made to be another node's replica carries; its value is
/// the node of the front end it serves. Such a volume is part of that
/// node's volume of the same name (its `replication` lists it), not a
/// volume of its own: Kubernetes' side (the CSI driver, the controllers)
/// passes over it.
pub const REPLICA_OF_LABEL: &str = "lamina.io/replica-of";

/// Label the CSI driver gives a replicated volume: how many replicas its
/// StorageClass asks for, which Lamina's controllers keep it at.
pub const REPLICAS_WANTED_LABEL: &str = "csi.lamina.io/replicas";

/// Label the CSI node plugin gives a replicated volume it takes over (its
/// pod moved to a node holding a replica: docs/csi.md): the CSI volume id
/// the volume was made with, which names another node's volume (the
/// front end's then, and its pool id). The CSI driver finds the volume by
/// it wherever its front end has moved since.
pub const CSI_VOLUME_ID_LABEL: &str = "csi.lamina.io/volume-id";

/// Snapshots of several volumes taken at one instant (one engine
/// transaction): crash-consistent across the volumes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreateSnapshotGroup {
    /// The group's name; each volume's snapshot gets this name.
    pub name: String,
    /// The volumes, at least one, each once.
    pub volumes: Vec<String>,
    /// Labels every member snapshot carries (besides [`GROUP_LABEL`]).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Every member's filesystem frozen while the group is taken, as
    /// [`CreateSnapshot::freeze`].
    #[serde(default, skip_serializing_if = "is_false")]
    pub freeze: bool,
}

/// A group snapshot: its members, one per volume, ordered by volume name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotGroup {
    pub name: String,
    /// Creation time, RFC 3339 (the same instant for every member).
    pub created: String,
    pub snapshots: Vec<Snapshot>,
}

/// A new volume from a snapshot (`from_snapshot`, as `VOLUME/SNAPSHOT`) or
/// from a volume as it is now (`from_volume`, which takes a system snapshot).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreateClone {
    pub name: String,
    pub from_snapshot: Option<String>,
    pub from_volume: Option<String>,
    /// An independent copy of the data instead of a linked clone.
    #[serde(default)]
    pub full: bool,
    /// The snapshot is on another node: this node pulls its data over the
    /// transfer protocol (always a full copy; `from_snapshot` names it on
    /// that node).
    #[serde(default)]
    pub from_node: Option<PeerNode>,
}

/// Another Lamina node, as the transfer protocol reaches it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PeerNode {
    /// The node's name: its transfer certificate must carry it.
    pub name: String,
    /// Its transfer listener, `HOST:PORT`; empty or absent: the address
    /// the daemon's node list has for `name` (`POST /v1/nodes`).
    #[serde(default)]
    pub address: String,
}

/// A node in the daemon's node list: another Lamina node it reaches by
/// name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Node {
    /// The node's name: its transfer certificate must carry it.
    pub name: String,
    /// Its transfer listener, `HOST:PORT`.
    pub address: String,
    /// When it was added (RFC 3339, UTC).
    pub added: String,
}

/// A node to add to the daemon's node list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AddNode {
    /// A DNS name of at most 63 characters (lowercase letters, digits,
    /// `-` and `.`, starting and ending with a letter or digit), as its
    /// certificate names it.
    pub name: String,
    /// Its transfer listener, `HOST:PORT` (an IPv6 host in brackets).
    pub address: String,
}

/// Why a copy from another node failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum FailureReason {
    /// The source snapshot is gone (or was replaced by another of that name).
    SnapshotMissing,
    /// The source node did not answer within the retry window.
    SourceUnreachable,
    /// This node's pool is full.
    NoSpace,
    /// The peers did not accept each other's credentials.
    Refused,
    /// A chunk arrived damaged.
    Checksum,
    /// The peer broke the protocol (or speaks another version).
    Protocol,
    /// A local I/O error.
    Io,
}

impl FailureReason {
    /// As written on the wire (`snapshot-missing`...).
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::SnapshotMissing => "snapshot-missing",
            FailureReason::SourceUnreachable => "source-unreachable",
            FailureReason::NoSpace => "no-space",
            FailureReason::Refused => "refused",
            FailureReason::Checksum => "checksum",
            FailureReason::Protocol => "protocol",
            FailureReason::Io => "io",
        }
    }
}

/// The answer to a clone request: the volume, and for a full clone the
/// operation copying the data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CloneCreated {
    pub volume: Volume,
    pub operation: Option<Operation>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OperationState {
    Running,
    Succeeded,
    Failed,
}

/// What an operation does. Every change to a volume is recorded as one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum OperationKind {
    CreateVolume,
    ExpandVolume,
    DeleteVolume,
    CreateSnapshot,
    DeleteSnapshot,
    Revert,
    Flatten,
    /// A linked clone (done at once).
    Clone,
    /// A full clone: a background copy of the data.
    FullClone,
    /// A clone of another node's snapshot: a background pull of its data.
    RemoteClone,
    /// A group snapshot: one snapshot of each of several volumes at once.
    CreateSnapshotGroup,
    /// The deletion of every member of a group snapshot.
    DeleteSnapshotGroup,
    /// A volume's labels replaced.
    SetVolumeLabels,
    /// A replica added to a volume (its copy runs as the replica's rebuild).
    AddReplica,
    /// A replica taken out of a volume.
    RemoveReplica,
}

impl OperationKind {
    /// The kind as written on the wire (`create-volume`, `full-clone`...).
    pub fn as_str(self) -> &'static str {
        match self {
            OperationKind::CreateVolume => "create-volume",
            OperationKind::ExpandVolume => "expand-volume",
            OperationKind::DeleteVolume => "delete-volume",
            OperationKind::CreateSnapshot => "create-snapshot",
            OperationKind::DeleteSnapshot => "delete-snapshot",
            OperationKind::Revert => "revert",
            OperationKind::Flatten => "flatten",
            OperationKind::Clone => "clone",
            OperationKind::FullClone => "full-clone",
            OperationKind::RemoteClone => "remote-clone",
            OperationKind::CreateSnapshotGroup => "create-snapshot-group",
            OperationKind::DeleteSnapshotGroup => "delete-snapshot-group",
            OperationKind::SetVolumeLabels => "set-volume-labels",
            OperationKind::AddReplica => "add-replica",
            OperationKind::RemoveReplica => "remove-replica",
        }
    }
}

impl std::fmt::Display for OperationKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A recorded operation: every change is written down before it runs;
/// full clones and flattens run on in the background.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Operation {
    pub id: String,
    pub kind: OperationKind,
    /// The volume it works on.
    pub volume: String,
    pub state: OperationState,
    /// Bytes done and to do.
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub started: String,
    pub error: Option<String>,
    /// For a clone: what it was made from, `VOLUME/SNAPSHOT` or `VOLUME`
    /// (`NODE:VOLUME/SNAPSHOT` from another node).
    #[serde(default)]
    pub source: Option<String>,
    /// Why it failed, for a copy from another node.
    #[serde(default)]
    pub reason: Option<FailureReason>,
    /// A copy from another node: data bytes received more than once
    /// (after an interruption, from its last durable offset on).
    #[serde(default)]
    pub resent_bytes: u64,
    /// A copy from another node: bytes received on the wire, framing
    /// included (TLS records not counted).
    #[serde(default)]
    pub wire_bytes: u64,
    /// While a copy runs: its rate since it (re)started, bytes per second.
    #[serde(default)]
    pub rate_bytes_per_sec: Option<u64>,
    /// While a copy runs: seconds left at that rate.
    #[serde(default)]
    pub eta_seconds: Option<u64>,
}

/// Filters of `GET /v1/operations` (query parameters), newest first.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema, utoipa::IntoParams,
)]
#[into_params(parameter_in = Query)]
pub struct OperationFilter {
    /// Only operations on this volume.
    pub volume: Option<String>,
    /// Only operations in this state.
    pub state: Option<OperationState>,
    /// At most this many (the newest); at most [`MAX_OPERATIONS_LIMIT`].
    #[serde(
        default,
        deserialize_with = "at_most::<_, u32, { MAX_OPERATIONS_LIMIT as u64 }>"
    )]
    pub limit: Option<u32>,
}

/// The largest `limit` of `GET /v1/operations`: what the document's int32
/// allows (a larger one is refused, not cut).
pub const MAX_OPERATIONS_LIMIT: u32 = i32::MAX as u32;

/// The largest id or sequence number a query takes: what the document's
/// int64 allows (ids and sequences count up from 1 and never get there).
pub const MAX_QUERY_ID: u64 = i64::MAX as u64;

/// A query parameter refused above `MAX` (as the document declares it),
/// instead of cut or taken past what it declares.
fn at_most<'de, D, T, const MAX: u64>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Into<u64> + Copy,
{
    let v = T::deserialize(d)?;
    let n: u64 = v.into();
    if n > MAX {
        return Err(serde::de::Error::invalid_value(
            serde::de::Unexpected::Unsigned(n),
            &format!("at most {MAX}").as_str(),
        ));
    }
    Ok(Some(v))
}

/// The answer to a delete or a detach. Removing what is already absent
/// succeeds (`existed: false`): callers such as CSI retry every call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Removed {
    /// What was removed, e.g. `volume data`, `snapshot data/before`,
    /// `export data`.
    pub what: String,
    /// False when there was nothing to remove.
    pub existed: bool,
    /// What the removal left behind, and why: a removed replica's volume
    /// on its node, when that node could not delete it (absent when
    /// nothing was left).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left: Option<String>,
}

/// Every error the API returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiError {
    /// What kind of error: [`ErrorCode`], snake_case on the wire.
    pub code: ErrorCode,
    /// What was wrong.
    pub message: String,
    /// What to do about it, when there is something to say.
    pub hint: Option<String>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.message)?;
        if let Some(h) = &self.hint {
            write!(f, " ({h})")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiError {}

/// Daemon identity and health.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub version: String,
    pub data_dir: String,
    pub nbd_socket: String,
    pub volumes: u64,
    pub snapshots: u64,
    pub pool_used_bytes: u64,
    /// Bytes new data can still take: the pool's free space plus what its
    /// filesystem can still give, up to the pool's cap if it has one.
    #[serde(default)]
    pub capacity_bytes: u64,
    /// What needs an operator's attention (a pool past its high-water
    /// mark).
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// Where the daemon's change sequence stands (`GET /v1/changes`). `seq`
/// moves on every change visible in the volume and snapshot lists (each
/// operation recorded or ended, a background clone or flatten's progress and
/// end, an attach or detach); `epoch` is new at every daemon start, so a
/// watcher notices a restart (its sequence starts again at 1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Changes {
    pub epoch: String,
    pub seq: u64,
}

/// Query of `GET /v1/changes`: answer at once if the sequence is past
/// `after` (or the daemon's epoch is not `epoch`), else wait up to
/// `wait_ms` (at most [`MAX_CHANGES_WAIT_MS`]; more is refused) for a
/// change.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema, utoipa::IntoParams,
)]
#[into_params(parameter_in = Query)]
pub struct ChangesQuery {
    /// The last sequence the caller saw; absent answers at once.
    #[serde(default, deserialize_with = "at_most::<_, u64, MAX_QUERY_ID>")]
    pub after: Option<u64>,
    /// The epoch the caller saw `after` in; another epoch answers at once.
    pub epoch: Option<String>,
    /// How long to wait for a change, in milliseconds (default 0, at most
    /// [`MAX_CHANGES_WAIT_MS`]; more is refused).
    #[serde(default, deserialize_with = "at_most::<_, u64, MAX_CHANGES_WAIT_MS>")]
    pub wait_ms: Option<u64>,
}

/// The longest a `GET /v1/changes` waits: 300 s.
pub const MAX_CHANGES_WAIT_MS: u64 = 300_000;
