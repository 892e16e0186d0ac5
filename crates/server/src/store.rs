//! The daemon's own records in redb: NBD exports (so they come back after a
//! restart) and operation records (written before an operation runs, so a
//! daemon killed mid-operation finishes it at restart). The engine's
//! metadata is not here: the pool keeps its own, crash-consistently.
//!
//! Records are typed ([`OpRec`], [`ExportRec`]) and stored as JSON under a
//! record-format version kept in the `meta` table. Opening a store written
//! by an older daemon migrates its records; a record that cannot be read is
//! an error naming it, never a default value. `docs/daemon.md` describes
//! the format.

use crate::error::ServerError;
use lamina_api::{OperationKind, OperationState};
use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const EXPORTS: TableDefinition<&str, &str> = TableDefinition::new("exports");
const OPERATIONS: TableDefinition<&str, &str> = TableDefinition::new("operations");
const VERSION_KEY: &str = "record_version";

/// The record format this daemon writes. 1: operations as a kind string
/// and untyped JSON arguments (before issue 9); 2: typed operations; 3: the
/// same, with group snapshot operations (a format-2 store is read as it is:
/// only the version is rewritten, so that an older daemon refuses the store
/// by its version rather than by a record it cannot read); 4: remote clones
/// (their source, and the copy's snapshot id and byte counts; a format-3
/// store is read as it is, the same way); 5: volume labels (a volume's
/// create with labels, and `set-volume-labels`; a format-4 store is read as
/// it is, the same way).
pub const RECORD_VERSION: u64 = 5;

/// An export to restore at start.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExportRec {
    pub volume: String,
    pub snapshot: Option<String>,
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
            | Op::Revert { volume, .. } => volume,
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

pub struct Store {
    pub(crate) db: Database,
    path: PathBuf,
}

impl Store {
    /// Open (or create) the store, migrating records of an older format.
    pub fn open(path: &Path) -> Result<Store, ServerError> {
        let db = Database::create(path)?;
        let store = Store {
            db,
            path: path.to_path_buf(),
        };
        let w = store.db.begin_write()?;
        let version = {
            let mut meta = w.open_table(META)?;
            let ops = w.open_table(OPERATIONS)?;
            w.open_table(EXPORTS)?;
            let v = meta.get(VERSION_KEY)?.map(|v| v.value());
            match v {
                Some(v) => v,
                // A new store, or one from before versions were recorded.
                None if ops.is_empty()? => {
                    meta.insert(VERSION_KEY, RECORD_VERSION)?;
                    RECORD_VERSION
                }
                None => 1,
            }
        };
        w.commit()?;
        match version {
            RECORD_VERSION => {}
            1 => store.migrate_v1()?,
            2..=4 => store.set_version(version)?,
            newer => {
                return Err(ServerError::Store(format!(
                    "{}: record format {newer} was written by a newer lamina (this one reads up to {RECORD_VERSION}); run that version",
                    path.display()
                )))
            }
        }
        // Every record must be readable now: refuse to start otherwise,
        // rather than run with a record silently missing.
        store.ops()?;
        store.exports()?;
        Ok(store)
    }

    /// Rewrite format-1 operation records as typed ones, in one transaction.
    fn migrate_v1(&self) -> Result<(), ServerError> {
        let w = self.db.begin_write()?;
        {
            let mut t = w.open_table(OPERATIONS)?;
            let mut out = Vec::new();
            for item in t.iter()? {
                let (k, v) = item?;
                let rec = crate::migrate::v1_to_v2(v.value())
                    .map_err(|e| self.unreadable(k.value(), &e))?;
                out.push((k.value().to_string(), serde_json::to_string(&rec)?));
            }
            for (k, v) in out {
                t.insert(k.as_str(), v.as_str())?;
            }
            w.open_table(META)?.insert(VERSION_KEY, RECORD_VERSION)?;
        }
        w.commit()?;
        tracing::info!(store = %self.path.display(), "operation records migrated to format {RECORD_VERSION}");
        Ok(())
    }

    /// A store whose records this daemon reads as they are: record the
    /// current version.
    fn set_version(&self, from: u64) -> Result<(), ServerError> {
        let w = self.db.begin_write()?;
        w.open_table(META)?.insert(VERSION_KEY, RECORD_VERSION)?;
        w.commit()?;
        tracing::info!(store = %self.path.display(), from, "record format version now {RECORD_VERSION}");
        Ok(())
    }

    fn unreadable(&self, id: &str, e: &str) -> ServerError {
        ServerError::Store(format!(
            "{}: operation record {id:?} cannot be read: {e}. Volumes and snapshots live in the pool and are not affected; to start without the operation history, move this file aside",
            self.path.display()
        ))
    }

    fn put<T: Serialize>(
        &self,
        table: TableDefinition<&str, &str>,
        key: &str,
        v: &T,
    ) -> Result<(), ServerError> {
        self.put_with(table, key, v, redb::Durability::Immediate)
    }

    fn put_with<T: Serialize>(
        &self,
        table: TableDefinition<&str, &str>,
        key: &str,
        v: &T,
        durability: redb::Durability,
    ) -> Result<(), ServerError> {
        let json = serde_json::to_string(v)?;
        let mut w = self.db.begin_write()?;
        w.set_durability(durability);
        w.open_table(table)?.insert(key, json.as_str())?;
        w.commit()?;
        Ok(())
    }

    fn remove(&self, table: TableDefinition<&str, &str>, keys: &[&str]) -> Result<(), ServerError> {
        let w = self.db.begin_write()?;
        {
            let mut t = w.open_table(table)?;
            for k in keys {
                t.remove(*k)?;
            }
        }
        w.commit()?;
        Ok(())
    }

    pub fn put_export(&self, name: &str, rec: &ExportRec) -> Result<(), ServerError> {
        self.put(EXPORTS, name, rec)
    }
    pub fn remove_export(&self, name: &str) -> Result<(), ServerError> {
        self.remove(EXPORTS, &[name])
    }
    pub fn exports(&self) -> Result<Vec<(String, ExportRec)>, ServerError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(EXPORTS)?;
        let mut out = Vec::new();
        for item in t.iter()? {
            let (k, v) = item?;
            let rec = serde_json::from_str(v.value()).map_err(|e| {
                ServerError::Store(format!(
                    "{}: export record {:?} cannot be read: {e}",
                    self.path.display(),
                    k.value()
                ))
            })?;
            out.push((k.value().to_string(), rec));
        }
        Ok(out)
    }

    /// Write an operation record. It is durable when this returns, except
    /// the done mark of an operation whose rerun changes nothing
    /// ([`Op::rerun_changes_nothing`]): that one is durable with the next
    /// record written (redb makes an earlier commit durable with a later
    /// durable one, and at a clean stop when the database closes), and if
    /// the daemon dies first, the restart finds the operation running,
    /// runs it again and marks it done. It saves a snapshot one sync of
    /// the store (docs/design.md, "Copies home, written out a few at a
    /// time", has the figures).
    pub fn put_op(&self, op: &OpRec) -> Result<(), ServerError> {
        let lazy = op.state == OperationState::Succeeded && op.op.rerun_changes_nothing();
        let durability = if lazy {
            redb::Durability::None
        } else {
            redb::Durability::Immediate
        };
        self.put_with(OPERATIONS, &op.id, op, durability)
    }

    pub fn op(&self, id: &str) -> Result<Option<OpRec>, ServerError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(OPERATIONS)?;
        let v = t.get(id)?;
        match v {
            Some(v) => Ok(Some(
                serde_json::from_str(v.value()).map_err(|e| self.unreadable(id, &e.to_string()))?,
            )),
            None => Ok(None),
        }
    }

    /// Every operation record, in id order (which is start order).
    pub fn ops(&self) -> Result<Vec<OpRec>, ServerError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(OPERATIONS)?;
        let mut out = Vec::new();
        for item in t.iter()? {
            let (k, v) = item?;
            out.push(
                serde_json::from_str(v.value())
                    .map_err(|e| self.unreadable(k.value(), &e.to_string()))?,
            );
        }
        Ok(out)
    }

    pub fn remove_ops(&self, ids: &[&str]) -> Result<(), ServerError> {
        self.remove(OPERATIONS, ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, op: Op) -> OpRec {
        OpRec {
            id: id.into(),
            op,
            state: OperationState::Running,
            started: "2026-01-01T00:00:00Z".into(),
            error: None,
            done_bytes: 0,
            total_bytes: 0,
            copy: None,
            reason: None,
        }
    }

    #[test]
    fn records_round_trip_and_a_bad_one_is_named() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("store.redb");
        let s = Store::open(&path).unwrap();
        let r = rec(
            "op-1",
            Op::Clone {
                name: "x".into(),
                source: CloneSource::Volume {
                    volume: "src".into(),
                },
                full: true,
            },
        );
        s.put_op(&r).unwrap();
        assert_eq!(s.op("op-1").unwrap(), Some(r.clone()));
        assert_eq!(r.op.kind(), OperationKind::FullClone);
        // A record that does not decode is an error naming it.
        s.put(
            OPERATIONS,
            "op-2",
            &serde_json::json!({"op": {"kind": "create-volume", "name": "v"}}),
        )
        .unwrap();
        let e = s.ops().unwrap_err().to_string();
        assert!(e.contains("op-2") && e.contains("size"), "{e}");
        drop(s);
        let e = Store::open(&path)
            .err()
            .expect("refuses to start")
            .to_string();
        assert!(
            e.contains("op-2") && e.contains("move this file aside"),
            "{e}"
        );
    }

    #[test]
    fn a_format_1_store_is_migrated_when_opened() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("store.redb");
        {
            // What a daemon from before issue 9 left: no version, untyped records.
            let db = Database::create(&path).unwrap();
            let w = db.begin_write().unwrap();
            w.open_table(OPERATIONS)
                .unwrap()
                .insert(
                    "op-1",
                    r#"{"id":"op-1","kind":"create-volume","volume":"v","args":{"name":"v","size":4096},"state":"succeeded","done_bytes":0,"total_bytes":0,"started":"2026-01-01T00:00:00Z","error":null}"#,
                )
                .unwrap();
            w.commit().unwrap();
        }
        let s = Store::open(&path).unwrap();
        let ops = s.ops().unwrap();
        assert_eq!(
            ops[0].op,
            Op::CreateVolume {
                name: "v".into(),
                size: 4096,
                labels: Default::default(),
            }
        );
        assert_eq!(ops[0].state, OperationState::Succeeded);
        let r = s.db.begin_read().unwrap();
        let v = r
            .open_table(META)
            .unwrap()
            .get(VERSION_KEY)
            .unwrap()
            .unwrap()
            .value();
        assert_eq!(v, RECORD_VERSION);
    }

    #[test]
    fn a_format_2_store_is_read_as_it_is_and_a_group_record_round_trips() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("store.redb");
        let r = rec(
            "op-1",
            Op::CreateSnapshot {
                volume: "v".into(),
                name: "s".into(),
                labels: Default::default(),
            },
        );
        {
            let s = Store::open(&path).unwrap();
            s.put_op(&r).unwrap();
            let w = s.db.begin_write().unwrap();
            w.open_table(META).unwrap().insert(VERSION_KEY, 2).unwrap();
            w.commit().unwrap();
        }
        let s = Store::open(&path).unwrap();
        assert_eq!(s.ops().unwrap(), vec![r]);
        let v = s.db.begin_read().unwrap();
        let v = v.open_table(META).unwrap().get(VERSION_KEY).unwrap();
        assert_eq!(v.unwrap().value(), RECORD_VERSION);
        let g = rec(
            "op-2",
            Op::CreateSnapshotGroup {
                name: "g".into(),
                volumes: vec!["a".into(), "b".into()],
                labels: [("k".to_string(), "v".to_string())].into(),
            },
        );
        s.put_op(&g).unwrap();
        assert_eq!(s.op("op-2").unwrap(), Some(g.clone()));
        assert_eq!(g.op.kind(), OperationKind::CreateSnapshotGroup);
        assert_eq!((g.volume(), g.op.volumes()), ("a", vec!["a", "b"]));
    }

    #[test]
    fn a_newer_format_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("store.redb");
        let s = Store::open(&path).unwrap();
        let w = s.db.begin_write().unwrap();
        w.open_table(META).unwrap().insert(VERSION_KEY, 99).unwrap();
        w.commit().unwrap();
        drop(s);
        let e = Store::open(&path).err().unwrap().to_string();
        assert!(e.contains("newer lamina"), "{e}");
    }
}
