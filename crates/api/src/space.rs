//! Space: the pool's figures (`GET /v1/pool`) and bulk pruning of a
//! volume's snapshots (`POST /v1/volumes/{name}/prune-snapshots`), which
//! says what it deletes and exactly what that frees.

use crate::KeptSnapshot;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The pool's space. Every figure is exact, from the refcounts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PoolSpace {
    /// What the pool can hold: its used bytes plus what new data can still
    /// take (its free blocks, and what its filesystem can still give, up to
    /// its cap).
    pub capacity_bytes: u64,
    /// Bytes in use: data, index and the catalog.
    pub used_bytes: u64,
    /// What new data can still take: `capacity_bytes - used_bytes`.
    pub free_bytes: u64,
    /// Bytes only snapshots hold (data and index, system snapshots of linked
    /// clones included): what deleting every snapshot would free. The rest
    /// of `used_bytes` is held by volumes and clones.
    pub snapshot_only_bytes: u64,
    /// The index part of `snapshot_only_bytes`.
    pub snapshot_only_metadata_bytes: u64,
    pub volumes: u64,
    pub snapshots: u64,
    /// The high-water mark, as the daemon was given it (`90%`, or a size).
    pub high_water: String,
    /// The used bytes at which the mark is passed.
    pub high_water_bytes: u64,
    /// Deleted index nodes are still being reclaimed: `used_bytes` will
    /// drop a little more.
    pub reclaim_pending: bool,
    /// What needs an operator's attention (past the high-water mark).
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// Which of a volume's snapshots to delete. At least one filter is required;
/// a snapshot must match every filter given. System snapshots are never
/// candidates.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PruneSnapshots {
    /// Labels the snapshots carry, `key=value[,key=value...]`.
    #[serde(default)]
    pub selector: Option<String>,
    /// Only snapshots older than this, in seconds, on the daemon's clock
    /// (a scheduled snapshot's age counts from its slot).
    #[serde(default)]
    pub older_than_seconds: Option<u64>,
    /// Only snapshots this schedule made (found by its id, so those made
    /// before a rename too).
    #[serde(default)]
    pub schedule: Option<String>,
    /// Say what would go and what it would free; delete nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// A snapshot a prune deleted (or, in a dry run, would delete).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PrunedSnapshot {
    pub name: String,
    /// Creation time, RFC 3339.
    pub created: String,
    /// What deleting it alone frees.
    pub exclusive_bytes: u64,
}

/// What a prune did, or would do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PruneResult {
    pub volume: String,
    pub dry_run: bool,
    /// Deleted (or to be deleted), oldest first.
    pub deleted: Vec<PrunedSnapshot>,
    /// Matched but kept, with why: linked clones depend on it, it is
    /// attached, a full clone is copying from it, or its delete failed.
    pub kept: Vec<KeptSnapshot>,
    /// Exactly what deleting `deleted` together frees, data and index: more
    /// than the sum of their exclusive bytes when they share blocks only
    /// among themselves.
    pub freed_bytes: u64,
}
