//! The daemon's own records in redb: NBD exports (so they come back after a
//! restart), operation records (written before an operation runs, so a
//! daemon killed mid-operation finishes it at restart), and the activation
//! generations of the engine's volumes (docs/volume-io.md). The engine's
//! metadata is not here: the pool keeps its own, crash-consistently.
//!
//! Records are typed ([`OpRec`], [`ExportRec`]) and stored as JSON under a
//! record-format version kept in the `meta` table. Opening a store written
//! by an older daemon migrates its records; a record that cannot be read is
//! an error naming it, never a default value. `docs/daemon.md` describes
//! the format.

mod db;
mod nodes;
mod records;
mod replicas;

use db::Fail;
pub(crate) use db::{Db, OnFailure, StrTable};
pub use nodes::{Added, NodeRec};
pub use records::{CloneSource, CopyRec, ExportRec, Op, OpRec, PeerRec};
pub use replicas::{
    LastRebuild, RebuildRec, ReplicaRec, ReplicaSetRec, RoundRec, SharedRecord, SharedRecordError,
    SharedSet, MAX_REPLICAS,
};

use crate::error::ServerError;
use lamina_api::OperationState;
use redb::{ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::Serialize;
use std::path::{Path, PathBuf};

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const EXPORTS: TableDefinition<&str, &str> = TableDefinition::new("exports");
const OPERATIONS: TableDefinition<&str, &str> = TableDefinition::new("operations");
/// Each engine volume's highest activation generation, by volume id (ids
/// are never reused: a volume made again under a name starts afresh).
const GENERATIONS: TableDefinition<u64, u64> = TableDefinition::new("generations");
const VERSION_KEY: &str = "record_version";

/// The record format this daemon writes. 1: operations as a kind string
/// and untyped JSON arguments (before issue 9); 2: typed operations; 3: the
/// same, with group snapshot operations (a format-2 store is read as it is:
/// only the version is rewritten, so that an older daemon refuses the store
/// by its version rather than by a record it cannot read); 4: remote clones
/// (their source, and the copy's snapshot id and byte counts; a format-3
/// store is read as it is, the same way); 5: volume labels (a volume's
/// create with labels, and `set-volume-labels`; a format-4 store is read as
/// it is, the same way); 6: replicated volumes (a volume's create with
/// replicas, `add-replica` and `remove-replica`, and the `replica_sets`
/// table; a format-5 store is read as it is, the same way); 7: a faulted
/// replica of this node's keeps the regions it missed (`missed_regions`: a
/// format-6 store is read as it is, the same way, and an older daemon must
/// not clean regions without keeping them); 8: a front end holding no
/// replica (a replica set `diskless`, with the volume's `size`: a format-7
/// store is read as it is, the same way, and an older daemon must not take
/// such a record for its local volume's).
pub const RECORD_VERSION: u64 = 8;

pub struct Store {
    pub(crate) db: Db,
    path: PathBuf,
    /// Called after a replica set's record changed in what it shows
    /// (`Store::on_replica_set_change`).
    replica_set_changed: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Where replica sets are recorded first, and this node's name
    /// (`Store::share_replica_sets`).
    shared: std::sync::OnceLock<(std::sync::Arc<dyn SharedRecord>, String)>,
    /// One lock per replicated volume, ordering its record's changes.
    replica_set_locks:
        std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<std::sync::Mutex<()>>>>,
}

/// Whether a record was written, or kept to be written when the store
/// reopens ([`Store::put_op_end`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    Now,
    AtReopen,
}

impl Store {
    /// Open (or create) the store, migrating records of an older format.
    pub fn open(path: &Path) -> Result<Store, ServerError> {
        let store = Store {
            db: Db::open(path)?,
            path: path.to_path_buf(),
            replica_set_changed: std::sync::OnceLock::new(),
            shared: std::sync::OnceLock::new(),
            replica_set_locks: Default::default(),
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
            2..=7 => store.set_version(version)?,
            newer => {
                return Err(ServerError::Unreadable(format!(
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

    /// Whether the store can be used, reopening it first if an I/O error
    /// broke it: the error says why not.
    pub fn check(&self) -> Result<(), ServerError> {
        self.db.check()
    }

    /// Whether an I/O error broke the store and it has not reopened since
    /// (no lock, no I/O: [`Store::check`] tries to reopen it).
    pub fn is_broken(&self) -> bool {
        self.db.is_broken()
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
        ServerError::Unreadable(format!(
            "{}: operation record {id:?} cannot be read: {e}. Volumes and snapshots live in the pool and are not affected; to start without the operation history, move this file aside",
            self.path.display()
        ))
    }

    fn put<T: Serialize>(
        &self,
        table: TableDefinition<'static, &'static str, &'static str>,
        key: &str,
        v: &T,
    ) -> Result<(), ServerError> {
        let json = serde_json::to_string(v)?;
        self.db.write(
            &[(table, key, Some(&json))],
            redb::Durability::Immediate,
            OnFailure::Undo,
        )
    }

    fn remove(
        &self,
        table: TableDefinition<'static, &'static str, &'static str>,
        keys: &[&str],
    ) -> Result<(), ServerError> {
        let changes: Vec<_> = keys.iter().map(|k| (table, *k, None)).collect();
        self.db
            .write(&changes, redb::Durability::Immediate, OnFailure::Undo)
    }

    pub fn put_export(&self, name: &str, rec: &ExportRec) -> Result<(), ServerError> {
        self.put(EXPORTS, name, rec)
    }
    pub fn remove_export(&self, name: &str) -> Result<(), ServerError> {
        self.remove(EXPORTS, &[name])
    }
    pub fn exports(&self) -> Result<Vec<(String, ExportRec)>, ServerError> {
        self.db.read(|r| {
            let t = r.open_table(EXPORTS)?;
            let mut out = Vec::new();
            for item in t.iter()? {
                let (k, v) = item?;
                let rec = serde_json::from_str(v.value()).map_err(|e| {
                    Fail::other(ServerError::record(format!(
                        "{}: export record {:?}",
                        self.path.display(),
                        k.value()
                    ))(e))
                })?;
                out.push((k.value().to_string(), rec));
            }
            Ok(out)
        })
    }

    /// Write an operation record. It is durable when this returns, except
    /// the done mark of an operation whose rerun changes nothing
    /// ([`Op::rerun_changes_nothing`]): that one is durable with the next
    /// record written (redb makes an earlier commit durable with a later
    /// durable one, and at a clean stop when the database closes), and if
    /// the daemon dies first, the restart finds the operation running,
    /// runs it again and marks it done. It saves a snapshot one sync of
    /// the store (docs/bench-history.md, "Copies home, written out a few at
    /// a time", has the figures). A record that fails to be written is not
    /// there when the store reopens.
    pub fn put_op(&self, op: &OpRec) -> Result<(), ServerError> {
        self.write_op(op, OnFailure::Undo)
    }

    /// Write the record of an operation's end, whose change is made (or
    /// failed, changing nothing): if the store cannot write it now, it
    /// keeps it and writes it when the store reopens
    /// ([`Written::AtReopen`]). Until then the store holds the record as
    /// it was (running), which a restart would run again.
    pub fn put_op_end(&self, op: &OpRec) -> Result<Written, ServerError> {
        match self.write_op(op, OnFailure::Keep) {
            Ok(()) => Ok(Written::Now),
            Err(ServerError::StoreUnavailable(why)) => {
                tracing::warn!(id = %op.id, store = %why, "an operation's end is recorded when the store reopens");
                Ok(Written::AtReopen)
            }
            Err(e) => Err(e),
        }
    }

    fn write_op(&self, op: &OpRec, on_failure: OnFailure) -> Result<(), ServerError> {
        let lazy = op.state == OperationState::Succeeded && op.op.rerun_changes_nothing();
        let durability = if lazy {
            redb::Durability::None
        } else {
            redb::Durability::Immediate
        };
        let json = serde_json::to_string(op)?;
        self.db.write(
            &[(OPERATIONS, op.id.as_str(), Some(json.as_str()))],
            durability,
            on_failure,
        )
    }

    pub fn op(&self, id: &str) -> Result<Option<OpRec>, ServerError> {
        self.db.read(|r| {
            let t = r.open_table(OPERATIONS)?;
            let v = t.get(id)?;
            match v {
                Some(v) => {
                    Ok(Some(serde_json::from_str(v.value()).map_err(|e| {
                        Fail::other(self.unreadable(id, &e.to_string()))
                    })?))
                }
                None => Ok(None),
            }
        })
    }

    /// Every operation record, in id order (which is start order).
    pub fn ops(&self) -> Result<Vec<OpRec>, ServerError> {
        self.db.read(|r| {
            let t = r.open_table(OPERATIONS)?;
            let mut out = Vec::new();
            for item in t.iter()? {
                let (k, v) = item?;
                out.push(
                    serde_json::from_str(v.value())
                        .map_err(|e| Fail::other(self.unreadable(k.value(), &e.to_string())))?,
                );
            }
            Ok(out)
        })
    }

    pub fn remove_ops(&self, ids: &[&str]) -> Result<(), ServerError> {
        self.remove(OPERATIONS, ids)
    }

    /// Engine volume `id`'s highest activation generation (0: none saved).
    pub fn generation(&self, id: u64) -> Result<u64, ServerError> {
        self.db.read(|r| {
            let t = match r.open_table(GENERATIONS) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
                Err(e) => return Err(e.into()),
            };
            Ok(t.get(id)?.map_or(0, |g| g.value()))
        })
    }

    /// Save engine volume `id`'s highest activation generation, durable on
    /// return (a synced commit). A failure answers an error: the caller
    /// does not hold the generation (docs/volume-io.md).
    pub fn put_generation(&self, id: u64, generation: u64) -> Result<(), ServerError> {
        self.db.commit(|w| {
            w.open_table(GENERATIONS)?.insert(id, generation)?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests;
