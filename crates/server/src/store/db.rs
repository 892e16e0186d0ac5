//! The redb database under the store, and its one I/O-failure latch: the
//! first I/O error marks it broken, later calls reopen it, and the writes
//! redb may have lost in between are written again first ([`Db`]). It
//! knows tables and transactions, not records: those are
//! `Store`'s.

use crate::error::ServerError;
use redb::{Database, TableDefinition};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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
    pub(super) fn open(path: &Path) -> Result<Db, ServerError> {
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

    /// Whether an I/O error broke the store and it has not reopened since
    /// (no lock, no I/O).
    pub(super) fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
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
    pub(super) fn check(&self) -> Result<(), ServerError> {
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
    pub(super) fn commit(
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
    pub(super) fn read<T>(
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
pub(super) enum Fail {
    Redb(Box<redb::Error>),
    Other(Box<ServerError>),
}

impl Fail {
    pub(super) fn other(e: ServerError) -> Fail {
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
