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

use crate::error::ServerError;
use lamina_api::{OperationKind, OperationState};
use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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

pub struct Store {
    pub(crate) db: Db,
    path: PathBuf,
}

/// A table of string keys and values (the records' tables).
pub(crate) type StrTable = TableDefinition<'static, &'static str, &'static str>;

/// One key of a string table as it must be after the store reopens: a
/// value, or none (removed).
struct Fixup {
    table: StrTable,
    key: String,
    value: Option<String>,
    /// The write's place in commit order ([`Db::seq`]).
    seq: u64,
}

/// What a write that fails on an I/O error leaves behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnFailure {
    /// Nothing: its caller answers an error, so after the store reopens
    /// every key it touched holds what it held before (redb cannot say
    /// whether a commit that failed reached the disk).
    Undo,
    /// The write itself, made when the store reopens: it records a change
    /// already made (an operation's end), which must not be lost.
    Keep,
}

/// The redb database, reopened after an I/O error.
///
/// redb latches its first I/O error (a full file system, say): every
/// transaction after it fails with `PreviousIo` until the database is
/// closed and opened again. So the first such error marks the store
/// broken; every later call (and `GET /v1/health`) tries to reopen it
/// first, and fails with the reason while it cannot be opened. Reopening
/// needs every handle of the old database gone (redb locks the file): a
/// call that still holds one makes the attempt fail, and the next call
/// tries again.
///
/// Writes that redb may have lost in between are written again when it
/// reopens, before anything else, in one durable transaction ([`Fixup`]):
/// those committed without a sync since the last synced commit (a
/// snapshot's done mark, see [`Store::put_op`]), and those that failed:
/// undone, or kept ([`OnFailure`]). They live in memory only: a daemon
/// stopped while its store is broken loses them, and its restart sees the
/// store's last synced commit, as after a crash.
pub(crate) struct Db {
    path: PathBuf,
    inner: Mutex<DbInner>,
    /// Mirrors `DbInner::broken`, read without the lock.
    broken: AtomicBool,
    /// Numbers write transactions in commit order (taken while one is
    /// open: redb runs one at a time), so that a synced commit drops
    /// exactly the fixups of the commits before it.
    seq: AtomicU64,
}

struct DbInner {
    /// None while broken and not reopened yet.
    db: Option<Arc<Database>>,
    /// Why the store is broken, while it is.
    broken: Option<String>,
    /// To write when the store reopens, in this order.
    fixups: Vec<Fixup>,
}

/// Whether a redb error is the file's (an I/O error, or the latch of an
/// earlier one): the database must be reopened.
fn io_failure(e: &redb::Error) -> bool {
    matches!(e, redb::Error::Io(_) | redb::Error::PreviousIo)
}

impl Db {
    fn open(path: &Path) -> Result<Db, ServerError> {
        let db = Database::create(path)?;
        Ok(Db {
            path: path.to_path_buf(),
            inner: Mutex::new(DbInner {
                db: Some(Arc::new(db)),
                broken: None,
                fixups: Vec::new(),
            }),
            broken: AtomicBool::new(false),
            seq: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DbInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The database, reopened first if an I/O error broke it.
    fn get(&self) -> Result<Arc<Database>, ServerError> {
        let mut inner = self.lock();
        if inner.broken.is_some() {
            self.reopen(&mut inner)?;
        }
        match &inner.db {
            Some(db) => Ok(db.clone()),
            None => Err(self.unavailable(&inner)),
        }
    }

    fn unavailable(&self, inner: &DbInner) -> ServerError {
        ServerError::StoreUnavailable(format!(
            "{}: {}",
            self.path.display(),
            inner.broken.as_deref().unwrap_or("not open")
        ))
    }

    /// Mark the store broken by `e`, if it is an I/O error; `e` as the
    /// caller's error.
    fn failed(&self, inner: &mut DbInner, e: redb::Error) -> ServerError {
        if !io_failure(&e) {
            return e.into();
        }
        self.broken.store(true, Ordering::Release);
        if inner.broken.is_none() {
            tracing::error!(store = %self.path.display(), error = %e, "the store failed: every call that needs it fails until it can be reopened");
        }
        // `PreviousIo` says nothing of the cause: keep the first error.
        if inner.broken.is_none() || !matches!(e, redb::Error::PreviousIo) {
            inner.broken = Some(e.to_string());
        }
        self.unavailable(inner)
    }

    /// Close the broken database and open it again, then write its
    /// fixups. Leaves it broken (with the new reason) if either fails.
    fn reopen(&self, inner: &mut DbInner) -> Result<(), ServerError> {
        // Ours goes first: redb refuses to open a file it holds open.
        inner.db = None;
        let db = match Database::create(&self.path) {
            Ok(db) => db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                // A call still holds the old database: the next one tries
                // again.
                return Err(self.unavailable(inner));
            }
            Err(e) => {
                inner.broken = Some(format!("reopening: {e}"));
                return Err(self.unavailable(inner));
            }
        };
        if !inner.fixups.is_empty() {
            inner.fixups.sort_by_key(|f| f.seq);
            let written = (|| -> Result<(), Fail> {
                let w = db.begin_write()?;
                for f in &inner.fixups {
                    let mut t = w.open_table(f.table)?;
                    match &f.value {
                        Some(v) => t.insert(f.key.as_str(), v.as_str())?,
                        None => t.remove(f.key.as_str())?,
                    };
                }
                w.commit()?;
                Ok(())
            })();
            if let Err(e) = written {
                let e = match e {
                    Fail::Redb(e) => e.to_string(),
                    Fail::Other(e) => e.to_string(),
                };
                inner.broken = Some(format!("reopening: {e}"));
                return Err(self.unavailable(inner));
            }
        }
        tracing::info!(store = %self.path.display(), rewritten = inner.fixups.len(), "the store is open again");
        inner.fixups.clear();
        inner.broken = None;
        inner.db = Some(Arc::new(db));
        self.broken.store(false, Ordering::Release);
        Ok(())
    }

    /// Reopen the store if it is broken; an error while it cannot be.
    fn check(&self) -> Result<(), ServerError> {
        self.get().map(|_| ())
    }

    /// A read transaction.
    pub(crate) fn begin_read(&self) -> Result<redb::ReadTransaction, ServerError> {
        let db = self.get()?;
        db.begin_read()
            .map_err(|e| self.failed(&mut self.lock(), e.into()))
    }

    /// A write transaction. Its commit's failure is seen by the next call
    /// (redb latches it): the schedules' records write this way. The
    /// operation and export records go through [`Db::write`], which also
    /// keeps what a failure must not lose.
    pub(crate) fn begin_write(&self) -> Result<redb::WriteTransaction, ServerError> {
        let db = self.get()?;
        match db.begin_write() {
            Ok(w) => Ok(w),
            Err(e) => {
                drop(db);
                let e = self.failed(&mut self.lock(), e.into());
                if !matches!(e, ServerError::StoreUnavailable(_)) {
                    return Err(e);
                }
                // An earlier commit failed: reopen now, once.
                self.get()?
                    .begin_write()
                    .map_err(|e| self.failed(&mut self.lock(), e.into()))
            }
        }
    }

    /// Write with `f` in one synced transaction; an I/O error marks the
    /// store broken. Nothing is kept for the reopen: the caller answers an
    /// error.
    fn commit(
        &self,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<(), Fail>,
    ) -> Result<(), ServerError> {
        let w = self.begin_write()?;
        let result = f(&w).and_then(|()| -> Result<(), Fail> {
            w.commit()?;
            Ok(())
        });
        result.map_err(|e| match e {
            Fail::Redb(e) => self.failed(&mut self.lock(), *e),
            Fail::Other(e) => *e,
        })
    }

    /// Read with `f`; an I/O error marks the store broken.
    fn read<T>(
        &self,
        f: impl FnOnce(&redb::ReadTransaction) -> Result<T, Fail>,
    ) -> Result<T, ServerError> {
        let r = self.begin_read()?;
        f(&r).map_err(|e| match e {
            Fail::Redb(e) => self.failed(&mut self.lock(), *e),
            Fail::Other(e) => *e,
        })
    }

    /// Set (`Some`) or remove (`None`) keys of string tables in one
    /// transaction.
    pub(crate) fn write(
        &self,
        changes: &[(StrTable, &str, Option<&str>)],
        durability: redb::Durability,
        on_failure: OnFailure,
    ) -> Result<(), ServerError> {
        let fixups = |seq: u64| {
            changes.iter().map(move |&(table, k, v)| Fixup {
                table,
                key: k.to_string(),
                value: v.map(str::to_string),
                seq,
            })
        };
        // After every write that began (which all failed too).
        let keep = |inner: &mut DbInner| {
            if on_failure == OnFailure::Keep {
                inner.fixups.extend(fixups(u64::MAX));
            }
        };
        let db = match self.get() {
            Ok(db) => db,
            Err(e) => {
                keep(&mut self.lock());
                return Err(e);
            }
        };
        let mut before = Vec::new();
        let mut seq = u64::MAX;
        let result = (|| -> Result<(), Fail> {
            let mut w = db.begin_write()?;
            seq = self.seq.fetch_add(1, Ordering::Relaxed);
            w.set_durability(durability);
            for &(table, k, v) in changes {
                let mut t = w.open_table(table)?;
                {
                    let old = match v {
                        Some(v) => t.insert(k, v)?,
                        None => t.remove(k)?,
                    };
                    before.push(Fixup {
                        table,
                        key: k.to_string(),
                        value: old.map(|g| g.value().to_string()),
                        seq,
                    });
                }
            }
            w.commit()?;
            Ok(())
        })();
        drop(db);
        let mut inner = self.lock();
        match result {
            Ok(()) if matches!(durability, redb::Durability::Immediate) => {
                // A synced commit makes every earlier one durable.
                inner.fixups.retain(|f| f.seq > seq);
                Ok(())
            }
            Ok(()) => {
                // Lost if the store fails before the next synced commit.
                inner.fixups.extend(fixups(seq));
                Ok(())
            }
            Err(Fail::Redb(e)) if io_failure(&e) => {
                match on_failure {
                    OnFailure::Undo => inner.fixups.extend(before),
                    OnFailure::Keep => inner.fixups.extend(fixups(seq)),
                }
                Err(self.failed(&mut inner, *e))
            }
            Err(Fail::Redb(e)) => Err((*e).into()),
            Err(Fail::Other(e)) => Err(*e),
        }
    }
}

/// What a store transaction fails with (boxed: redb's errors are large).
enum Fail {
    Redb(Box<redb::Error>),
    Other(Box<ServerError>),
}

impl Fail {
    fn other(e: ServerError) -> Fail {
        Fail::Other(Box::new(e))
    }
}

macro_rules! fail_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Fail {
            fn from(e: $t) -> Self {
                Fail::Redb(Box::new(e.into()))
            }
        }
    )*};
}
fail_from!(
    redb::StorageError,
    redb::TableError,
    redb::TransactionError,
    redb::CommitError
);

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
        self.db.broken.load(Ordering::Acquire)
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

    /// A tmpfs of its own, unmounted when dropped (the tests run as root).
    struct Tmpfs {
        dir: tempfile::TempDir,
    }

    impl Tmpfs {
        fn mount(size: &str) -> Tmpfs {
            let dir = tempfile::tempdir().unwrap();
            let out = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(dir.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "mount: {out:?}");
            Tmpfs { dir }
        }

        fn path(&self) -> &Path {
            self.dir.path()
        }

        /// Take every free byte with a file outside the store; its path.
        fn fill(&self) -> PathBuf {
            use std::io::Write;
            let path = self.path().join("filler");
            let mut f = std::fs::File::create(&path).unwrap();
            let chunk = vec![0x55u8; 4096];
            loop {
                match f.write(&chunk) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                    Err(e) => panic!("filling: {e}"),
                }
            }
            path
        }
    }

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }

    /// redb latches its first I/O error: the store reopens it once it can,
    /// and then holds what its callers were told. A record whose write
    /// failed is not there; an operation's end kept for the reopen is; a
    /// done mark committed without a sync before the failure is too.
    #[test]
    fn a_store_broken_by_a_full_file_system_reopens_and_holds_what_was_answered() {
        let fs = Tmpfs::mount("2m");
        let path = fs.path().join("store.redb");
        let s = Store::open(&path).unwrap();
        // Records big enough to need new pages, each followed by a
        // snapshot's done mark (committed without a sync), until one
        // cannot be written.
        let big = |i: usize| {
            rec(
                &format!("op-{i:05}"),
                Op::CreateVolume {
                    name: format!("v{i}"),
                    size: 4096,
                    labels: [("k".to_string(), "x".repeat(16 << 10))].into(),
                },
            )
        };
        let done_mark = |i: usize| {
            let mut r = rec(
                &format!("op-{i:05}-s"),
                Op::CreateSnapshot {
                    volume: "v".into(),
                    name: format!("s{i}"),
                    labels: Default::default(),
                },
            );
            r.state = OperationState::Succeeded;
            r
        };
        s.put_op(&big(0)).unwrap();
        let mut written = vec![big(0)];
        let filler = fs.fill();
        let mut failed = None;
        'fill: for i in 1..1000 {
            for r in [big(i), done_mark(i)] {
                match s.put_op(&r) {
                    Ok(()) => written.push(r),
                    Err(e) => {
                        failed = Some((r, e));
                        break 'fill;
                    }
                }
            }
        }
        let (lost, e) = failed.expect("the file system fills up");
        assert!(matches!(e, ServerError::StoreUnavailable(_)), "{e}");
        assert!(e.to_string().contains("No space left"), "{e}");
        let mut end = written[0].clone();
        end.state = OperationState::Failed;
        end.error = Some("it failed".into());
        // The next write fails too, unless the store reopened in place.
        let kept = s.put_op_end(&end).unwrap();
        std::fs::remove_file(filler).unwrap();
        // Space is back: the next call reopens the store.
        s.check().unwrap();
        assert_eq!(s.op(&lost.id).unwrap(), None, "a failed write is undone");
        let state = |r: Option<OpRec>| r.map(|r| (r.state, r.error));
        assert_eq!(
            state(s.op(&end.id).unwrap()),
            state(Some(end.clone())),
            "the end kept for the reopen ({kept:?}) is written"
        );
        for r in &written[1..] {
            assert_eq!(s.op(&r.id).unwrap().as_ref(), Some(r));
        }
        s.put_op(&lost).unwrap();
        // All of it on disk.
        drop(s);
        let s = Store::open(&path).unwrap();
        assert_eq!(s.ops().unwrap().len(), written.len() + 1);
        assert_eq!(s.op(&end.id).unwrap(), Some(end));
        assert_eq!(s.op(&lost.id).unwrap(), Some(lost));
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
