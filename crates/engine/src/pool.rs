//! The pool: opening and creating it, the locks that order I/O against
//! snapshots, the commit that makes everything durable, and the background
//! threads (reclaim of deleted trees, flatten of clones). Operations on
//! volumes and snapshots are in `ops.rs`, the I/O path in `io.rs`.
//!
//! The locks and the one order they are taken in are on [`Inner`]. Data is
//! read and written with the metadata mutex released.
//!
//! Every write, sync and punch of the pool's files goes through the pool's
//! latch (`latch.rs`): the first failure makes the pool refuse requests
//! until it is reopened.

use crate::error::{Error, IoFailure, Result};
use crate::format::*;
use crate::journal::Journal;
use crate::latch::Latch;
use crate::meta::Meta;
use crate::order::{hold, Held, Rank};
use crate::storage::{Backend, BlockFile, DirBackend};
use crate::wal::Wal;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

pub const POOL_FILE: &str = "pool.lam";
pub const WAL_FILE: &str = "wal.lam";
pub const JOURNAL_FILE: &str = "journal.lam";
const STRIPES: usize = 1024;
fn stripe_of(vol: u64, idx: u64) -> usize {
    let h =
        (vol.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ idx.wrapping_mul(0xC2B2_AE3D_27D4_EB4F)) >> 32;
    (h as usize) % STRIPES
}

/// How often the writeback thread copies log images home and looks for
/// changed pages to commit in the background.
const WRITEBACK_EVERY: Duration = Duration::from_millis(10);

/// Tunables of an open pool.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// Bytes of metadata pages kept in memory.
    pub cache_bytes: usize,
    /// Size of the write-ahead log before a checkpoint.
    pub wal_bytes: u64,
    /// Size of the journal of index changes (`journal.rs`).
    pub journal_bytes: u64,
    /// Changed metadata pages that force a commit through the page log.
    pub max_dirty_pages: usize,
    /// Capacity limit in bytes for a new pool (0: the disk's).
    pub max_bytes: u64,
    /// Run reclaim and flatten in background threads (tests may step them by hand).
    pub background: bool,
}

impl PoolOptions {
    /// Default of [`PoolOptions::cache_bytes`].
    pub const CACHE_BYTES: usize = 64 << 20;
    /// The least [`PoolOptions::cache_bytes`] counts for: the cache holds
    /// at least this much whatever it is given.
    pub const MIN_CACHE_BYTES: usize = crate::cache::MIN_PAGES * crate::format::BLOCK;
    /// Default of [`PoolOptions::wal_bytes`].
    pub const WAL_BYTES: u64 = 64 << 20;
    /// Default of [`PoolOptions::journal_bytes`].
    pub const JOURNAL_BYTES: u64 = 16 << 20;
    /// Default of [`PoolOptions::max_dirty_pages`].
    pub const MAX_DIRTY_PAGES: usize = 4096;
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            cache_bytes: PoolOptions::CACHE_BYTES,
            wal_bytes: PoolOptions::WAL_BYTES,
            journal_bytes: PoolOptions::JOURNAL_BYTES,
            max_dirty_pages: PoolOptions::MAX_DIRTY_PAGES,
            max_bytes: 0,
            background: true,
        }
    }
}

/// The state of an open pool, shared by every handle.
///
/// # Lock order
///
/// Every lock the engine takes, outermost first. A thread holding one may
/// take only locks further down the list; locks of the same rank are taken
/// only in the order given. `docs/design.md` ("Concurrency") refers here.
///
/// 1. A **gate** (`gates`' entries, one `RwLock` per volume or snapshot id;
///    `Volume` keeps its own): I/O holds it shared, snapshot,
///    revert, expand, delete and a flatten's end exclusively. Several only
///    in ascending id: a group snapshot takes its volumes' in ascending id
///    (`group.rs`), a snapshot delete its volume's, then the snapshot's,
///    whose id is higher (`ops.rs`, `remove_snapshot`). No other path holds
///    two gates.
/// 2. A block **stripe** (`stripes`). Several only in ascending stripe
///    index (`Pool::stripes`); a single-block writer holds one at a time.
///    Under it only `meta` is taken (and files are read and written).
/// 3. The **log** (`wal`): the commit lock. A page-log commit and a
///    checkpoint hold it while they take `meta` and `to_home`, and a
///    checkpoint `homing` (and what is under it), then `journal`
///    (`commit.rs`).
/// 4. The **journal** (`journal`). A journal commit holds it while it takes
///    `meta`, `awaiting_checkpoint` and `read_barrier` (then `meta`)
///    (`commit_with`, `release_freed`); a checkpoint takes it under `wal`.
///    Never held while `wal` is taken.
/// 5. **`homing`**: a batch of copies home holds it shared, a checkpoint
///    (under `wal`) exclusively; under it `to_home`, `homed`,
///    `awaiting_checkpoint`, `read_barrier` and `meta` are taken
///    (`home.rs`, `checkpoint_locked`).
/// 6. The **read barrier** (`read_barrier`): a read holds it shared (under
///    its gate) while it looks blocks up under `meta` and reads them;
///    releasing freed blocks holds it exclusively while it takes `meta`.
/// 7. The **metadata mutex** (`meta`). Under it only leaves are taken: a
///    volume's delete stops its flatten (`flatten`, then that flatten's
///    `FlattenProgress::error`).
/// 8. Leaves, under which no other lock is taken: `gates` (the table; a
///    gate is looked up while another gate may be held), `flatten`, then a
///    `FlattenProgress`'s `error`, `to_home`, `homed`,
///    `awaiting_checkpoint`, `wake`'s mutex and `threads`; inside the file
///    layer, `storage.rs`'s bulk-write window and the simulated
///    files' state (`sim.rs`), taken only within one file call.
///
/// Commits (`Pool::commit` and what calls it) run with a gate held or
/// none, never with a stripe, the read barrier or `meta` held.
///
/// Checked in debug builds (`order.rs`): every one of these locks is taken
/// through `order::hold` with its rank (gates by id, stripes by index), and
/// taking one that does not come after every lock the thread holds panics
/// before it waits, so every engine test checks the order on the paths it
/// runs. Not instrumented: `wake`'s mutex (its guard goes to its condition
/// variable) and `threads`, each taken in one statement that takes nothing
/// else.
pub(crate) struct Inner {
    pub backend: Arc<dyn Backend>,
    pub meta: Mutex<Meta>,
    /// The log; holding it is holding the commit lock.
    pub wal: Mutex<Wal>,
    /// The journal of index changes; taken after the log, only by commits.
    pub journal: Mutex<Journal>,
    /// Commits made since the pool was opened, by where they went.
    pub commits: CommitCounts,
    pub file: Arc<dyn BlockFile>,
    /// Set by the first I/O failure; see `latch.rs`.
    pub latch: Arc<Latch>,
    /// Reads hold it shared while they use block numbers looked up under the
    /// metadata mutex; releasing freed blocks to the allocator takes it
    /// exclusively, so no read ever sees a block reused under it.
    pub read_barrier: RwLock<()>,
    pub stripes: Vec<Mutex<()>>,
    gates: Mutex<HashMap<u64, Arc<RwLock<()>>>>,
    pub opts: PoolOptions,
    stop: AtomicBool,
    wake: (Mutex<bool>, Condvar),
    /// Data bytes written through the page cache since the flusher last
    /// synced the data file (`flusher.rs`).
    pub unsynced: AtomicU64,
    threads: Mutex<Vec<JoinHandle<()>>>,
    pub flatten: Mutex<HashMap<u64, Arc<FlattenProgress>>>,
    /// Blocks freed but kept back until the next checkpoint, because the log
    /// still holds an image of them that a replay would write home.
    pub awaiting_checkpoint: Mutex<Vec<u64>>,
    /// The log file, for copying images home ahead (see `home.rs`).
    pub log: Arc<dyn BlockFile>,
    /// Bytes of the log in use (its append position), for the writeback
    /// thread's decision to copy images home ahead.
    pub log_used: AtomicU64,
    /// Log images already copied home: block -> log offset (`home.rs`).
    pub homed: Mutex<HashMap<u64, u64>>,
    /// Log images committed since the checkpoint and not yet looked at by
    /// the copy home, in log order: (block, log offset) (`home.rs`).
    pub to_home: Mutex<std::collections::VecDeque<(u64, u64)>>,
    /// Held shared while images are copied home ahead, exclusively by a
    /// checkpoint (`home.rs`).
    pub homing: RwLock<()>,
}

/// Commits since a pool was opened that wrote something, by where they
/// went: records to the journal, or pages to the page log.
#[derive(Debug, Default)]
pub struct CommitCounts {
    pub journal: AtomicU64,
    pub pages: AtomicU64,
}

/// Progress of a background flatten, in blocks.
#[derive(Debug, Default)]
pub struct FlattenProgress {
    pub done: AtomicU64,
    pub total: AtomicU64,
    pub finished: AtomicBool,
    pub error: Mutex<Option<String>>,
}

/// An open pool. Cloning is cheap and shares the pool.
#[derive(Clone)]
pub struct Pool {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn random_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    if let Ok(f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = (&f).read_exact(&mut id);
    }
    let t = now_ns().to_le_bytes();
    for (i, b) in t.iter().enumerate() {
        id[i] ^= b;
    }
    id[8] ^= std::process::id() as u8;
    id
}

/// Take the pool's lock on its pool file, or say who holds it.
fn lock(file: &dyn BlockFile, loc: &Path) -> Result<()> {
    match file.try_lock() {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Err(Error::Conflict(format!(
            "the pool in {} is in use by another process (a running `lamina serve`?)",
            loc.display()
        ))),
        Err(e) => Err(Error::io("lock", file.path(), 0, e)),
    }
}

impl Pool {
    /// Create a new pool in a directory (made if missing).
    pub fn create_dir(dir: impl AsRef<Path>, opts: PoolOptions) -> Result<Pool> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create directory", dir, 0, e))?;
        Pool::create(Arc::new(DirBackend::new(dir)), opts)
    }

    /// Open an existing pool in a directory.
    pub fn open_dir(dir: impl AsRef<Path>, opts: PoolOptions) -> Result<Pool> {
        Pool::open(Arc::new(DirBackend::new(dir.as_ref())), opts)
    }

    pub fn create(backend: Arc<dyn Backend>, opts: PoolOptions) -> Result<Pool> {
        let loc = backend.location().to_path_buf();
        if backend.exists(POOL_FILE) {
            return Err(Error::Conflict(format!(
                "{} already holds a pool",
                loc.display()
            )));
        }
        if opts.max_bytes != 0 && opts.max_bytes < 4 * GROUP * BLOCK as u64 {
            return Err(Error::InvalidArgument(format!(
                "a pool needs at least {} bytes",
                4 * GROUP * BLOCK as u64
            )));
        }
        let io = |op, e| Error::io(op, &loc, 0, e);
        let pool_id = random_id();
        let walf = backend
            .open(WAL_FILE, true)
            .map_err(|e| io("create log", e))?;
        // A pool being created has no one to refuse: a failure is returned.
        let latch = Arc::new(Latch::default());
        Wal::create(walf, latch.clone(), pool_id, opts.wal_bytes)?;
        let journalf = backend
            .open(JOURNAL_FILE, true)
            .map_err(|e| io("create journal", e))?;
        Journal::create(journalf, latch.clone(), pool_id, opts.journal_bytes, 1)?;
        let file = backend
            .open(POOL_FILE, true)
            .map_err(|e| io("create pool file", e))?;
        let sb = Superblock {
            pool_id,
            total_blocks: GROUP,
            catalog_root: 0,
            catalog_levels: 1,
            dead_head: 0,
            next_id: 1,
            max_blocks: opts.max_bytes / BLOCK as u64,
            created: now_ns(),
            journal_covered: 0,
            version: FORMAT_VERSION,
        };
        let mut p = new_page();
        sb.encode(&mut p);
        seal(&mut p, 0, 0);
        let mut r = new_page();
        rc::init(&mut r, 0);
        rc::set(&mut r, 0, RC_SYSTEM);
        rc::set(&mut r, 1, RC_SYSTEM);
        seal(&mut r, 1, 0);
        let mut head = vec![0u8; 2 * BLOCK];
        head[..BLOCK].copy_from_slice(&p[..]);
        head[BLOCK..].copy_from_slice(&r[..]);
        let r = file.write_at(&head, 0);
        latch.io("write superblock", file.path(), 0, r)?;
        latch.io("sync superblock", file.path(), 0, file.sync())?;
        drop(file);
        Pool::open(backend, opts)
    }

    pub fn open(backend: Arc<dyn Backend>, opts: PoolOptions) -> Result<Pool> {
        let loc = backend.location().to_path_buf();
        if !backend.exists(POOL_FILE) || !backend.exists(WAL_FILE) {
            return Err(Error::NotAPool {
                path: loc,
                detail: format!("no {POOL_FILE} and {WAL_FILE} here (create a pool first)"),
            });
        }
        let file = backend
            .open(POOL_FILE, false)
            .map_err(|e| Error::io("open", &loc, 0, e))?;
        let walf = backend
            .open(WAL_FILE, false)
            .map_err(|e| Error::io("open", &loc, 0, e))?;
        // One process at a time: a second opener would replay the log and
        // write metadata under the first one's feet.
        lock(file.as_ref(), &loc)?;
        let mut magic = [0u8; 8];
        file.read_at(&mut magic, 0)
            .map_err(|e| Error::io("read", file.path(), 0, e))?;
        if magic[..4] != MAGIC_SUPER.to_le_bytes() {
            return Err(Error::NotAPool {
                path: file.path().to_path_buf(),
                detail: "no Lamina superblock".into(),
            });
        }
        // A failure while opening fails the open: this latch is dropped.
        let latch = Arc::new(Latch::default());
        let (mut wal, replay) = Wal::open(walf.clone(), latch.clone(), opts.wal_bytes)?;
        tracing::info!(pool = %loc.display(), transactions = replay.transactions, pages = replay.index.len(), "replaying log");
        wal.checkpoint(&replay.index, &HashMap::new(), file.as_ref())?;
        let mut p = new_page();
        file.read_at(&mut p[..], 0)
            .map_err(|e| Error::io("read superblock", file.path(), 0, e))?;
        let sb = Superblock::decode(&p)?;
        if sb.pool_id != wal.pool_id() {
            return Err(Error::NotAPool {
                path: loc,
                detail: "the log belongs to another pool".into(),
            });
        }
        let log_used = AtomicU64::new(wal.pos);
        let mut meta = Meta::new(
            sb,
            opts.cache_bytes / BLOCK,
            HashMap::new(),
            file.clone(),
            walf.clone(),
        );
        meta.load_catalog()?;
        let (journal, upgraded, replayed) =
            crate::replay::open_journal(&backend, &latch, &mut meta, &opts)?;
        let flattening: Vec<u64> = meta
            .catalog
            .volumes()
            .filter(|v| v.flattening)
            .map(|v| v.id)
            .collect();
        let inner = Arc::new(Inner {
            backend,
            meta: Mutex::new(meta),
            wal: Mutex::new(wal),
            journal: Mutex::new(journal),
            commits: CommitCounts::default(),
            file,
            latch,
            read_barrier: RwLock::new(()),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            gates: Mutex::new(HashMap::new()),
            opts: opts.clone(),
            stop: AtomicBool::new(false),
            wake: (Mutex::new(false), Condvar::new()),
            unsynced: AtomicU64::new(0),
            threads: Mutex::new(Vec::new()),
            flatten: Mutex::new(HashMap::new()),
            awaiting_checkpoint: Mutex::new(Vec::new()),
            log: walf,
            log_used,
            homed: Mutex::new(HashMap::new()),
            to_home: Mutex::new(std::collections::VecDeque::new()),
            homing: RwLock::new(()),
        });
        let pool = Pool { inner };
        if upgraded || replayed > 0 {
            // Make the upgrade or what the journal gave back part of the
            // checkpointed state, and start the journal afresh.
            pool.checkpoint()?;
        }
        if opts.background {
            let p = pool.clone();
            let t = std::thread::Builder::new()
                .name("lamina-reclaim".into())
                .spawn(move || p.reclaim_loop())
                .expect("spawn reclaim thread");
            pool.inner.threads.lock().unwrap().push(t);
            let p = pool.clone();
            let t = std::thread::Builder::new()
                .name("lamina-writeback".into())
                .spawn(move || p.writeback_loop())
                .expect("spawn writeback thread");
            pool.inner.threads.lock().unwrap().push(t);
            let p = pool.clone();
            let t = std::thread::Builder::new()
                .name("lamina-flusher".into())
                .spawn(move || p.flusher_loop())
                .expect("spawn flusher thread");
            pool.inner.threads.lock().unwrap().push(t);
            for id in flattening {
                pool.start_flatten_thread(id);
            }
        }
        Ok(pool)
    }

    /// The metadata of a pool, opened without writing a byte to any of its
    /// files (`lamina pool check`): the files are opened read-only, the
    /// page log's committed pages are read where they are instead of
    /// copied home, and the journal's records are applied in memory, as an
    /// open would apply them. Takes the pool's lock, as an open does:
    /// a running daemon writes under a reader's feet. Returns the metadata,
    /// the number of page-log transactions read in place and of journal
    /// records applied; the files stay locked while the metadata lives.
    pub(crate) fn open_meta_read_only(
        backend: Arc<dyn Backend>,
        opts: &PoolOptions,
    ) -> Result<(Meta, u64, usize)> {
        let loc = backend.location().to_path_buf();
        if !backend.exists(POOL_FILE) || !backend.exists(WAL_FILE) {
            return Err(Error::NotAPool {
                path: loc,
                detail: format!("no {POOL_FILE} and {WAL_FILE} here"),
            });
        }
        let file = backend
            .open_read(POOL_FILE)
            .map_err(|e| Error::io("open", &loc, 0, e))?;
        let walf = backend
            .open_read(WAL_FILE)
            .map_err(|e| Error::io("open", &loc, 0, e))?;
        lock(file.as_ref(), &loc)?;
        // Nothing is written, so nothing can set it.
        let latch = Arc::new(Latch::default());
        let (wal, replay) = Wal::open(walf.clone(), latch.clone(), opts.wal_bytes)?;
        // The newest superblock is the log's, if the log holds one.
        let mut p = new_page();
        let (f, at) = match replay.index.get(&0) {
            Some(&off) => (&walf, off),
            None => (&file, 0),
        };
        f.read_at(&mut p[..], at)
            .map_err(|e| Error::io("read superblock", f.path(), at, e))?;
        let sb = Superblock::decode(&p)?;
        if sb.pool_id != wal.pool_id() {
            return Err(Error::NotAPool {
                path: loc,
                detail: "the log belongs to another pool".into(),
            });
        }
        let mut meta = Meta::new(sb, opts.cache_bytes / BLOCK, replay.index, file, walf);
        meta.load_catalog()?;
        let records = crate::replay::apply_read_only(&backend, &latch, &mut meta, opts)?;
        Ok((meta, replay.transactions, records))
    }

    /// Commits since the pool was opened that wrote records to the
    /// journal, and that wrote pages to the page log.
    pub fn commit_counts(&self) -> (u64, u64) {
        let c = &self.inner.commits;
        (
            c.journal.load(Ordering::Relaxed),
            c.pages.load(Ordering::Relaxed),
        )
    }

    /// Where the pool lives.
    pub fn location(&self) -> &Path {
        self.inner.backend.location()
    }

    /// The pool's identity: 16 random bytes chosen when it was created,
    /// kept in its superblock, its log and its journal, and never changed.
    /// Two pools (a pool made again in the same place included) have
    /// different ones, so it qualifies what is unique only within a pool
    /// (a snapshot's id) across nodes.
    pub fn pool_id(&self) -> [u8; 16] {
        self.inner
            .wal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pool_id()
    }

    /// The first I/O failure, once one made the pool refuse requests
    /// (until it is reopened); `None` while the pool is healthy.
    pub fn failure(&self) -> Option<Arc<IoFailure>> {
        self.inner.latch.failure()
    }

    /// Run `f` on the metadata under its mutex, unless the latch is set. An
    /// I/O error or a failed page check inside it may have left an update
    /// half-done in memory: it sets the latch.
    pub(crate) fn with_meta<T>(&self, f: impl FnOnce(&mut Meta) -> Result<T>) -> Result<T> {
        let mut m = self.lock_meta();
        self.inner.latch.check()?;
        f(&mut m).map_err(|e| self.inner.latch.error(e, self.inner.file.path()))
    }

    /// Sync the data file (a durability barrier for data writes). Writes
    /// counted before the sync starts are covered by it, so the flusher
    /// need not sync them again.
    pub(crate) fn sync_data(&self, op: &'static str) -> Result<()> {
        self.inner.latch.check()?;
        self.inner.unsynced.swap(0, Ordering::AcqRel);
        let f = &self.inner.file;
        self.inner.latch.io(op, f.path(), 0, f.sync())
    }

    pub(crate) fn lock_meta(&self) -> Held<MutexGuard<'_, Meta>> {
        hold(Rank::Meta, 0, || {
            self.inner.meta.lock().unwrap_or_else(|p| {
                // A panic under the lock may have left a charge set.
                let mut m = p.into_inner();
                m.end_charge();
                m
            })
        })
    }

    pub(crate) fn gate(&self, id: u64) -> Arc<RwLock<()>> {
        hold(Rank::Leaf, 0, || self.inner.gates.lock().unwrap())
            .entry(id)
            .or_default()
            .clone()
    }

    pub(crate) fn drop_gate(&self, id: u64) {
        hold(Rank::Leaf, 0, || self.inner.gates.lock().unwrap()).remove(&id);
    }

    pub(crate) fn stripe(&self, vol: u64, idx: u64) -> Held<MutexGuard<'_, ()>> {
        let i = stripe_of(vol, idx);
        hold(Rank::Stripe, i as u64, || {
            self.inner.stripes[i]
                .lock()
                .unwrap_or_else(|p| p.into_inner())
        })
    }

    /// The stripes of blocks `first..first + n` of a volume, taken in
    /// ascending stripe order (so two runs never wait on each other in a
    /// cycle; single-block lockers hold no stripe while waiting for one).
    pub(crate) fn stripes(&self, vol: u64, first: u64, n: u64) -> Vec<Held<MutexGuard<'_, ()>>> {
        let mut ids: Vec<usize> = (first..first + n).map(|i| stripe_of(vol, i)).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .map(|i| {
                hold(Rank::Stripe, i as u64, || {
                    self.inner.stripes[i]
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                })
            })
            .collect()
    }

    pub(crate) fn wake_background(&self) {
        let (m, c) = &self.inner.wake;
        *m.lock().unwrap() = true;
        c.notify_all();
    }

    /// Reclaim dead trees until none is left, committing as it goes.
    /// Returns the number of tree nodes reclaimed.
    pub fn reclaim_all(&self) -> Result<u64> {
        let mut total = 0;
        loop {
            let n = self.with_meta(|m| m.reclaim(64))?;
            total += n as u64;
            if n == 0 {
                break;
            }
            self.maybe_commit()?;
        }
        if total > 0 {
            self.commit()?;
        }
        Ok(total)
    }

    /// Copies committed log images home while the log fills, and commits
    /// changed pages through the page log in the background. Keeping the
    /// data not yet synced small is the flusher's (`flusher.rs`).
    fn writeback_loop(&self) {
        while !self.inner.stop.load(Ordering::SeqCst) {
            std::thread::sleep(WRITEBACK_EVERY);
            // A failure set the latch (checked below); the next request
            // reports it.
            let _ = self.home_while_filling();
            // Changed pages go to the page log in the background once half
            // of `max_dirty_pages` are dirty, so that writers (which would
            // at the full count) and journal commits do not wait for it.
            let dirty = self.lock_meta().cache.dirty_count();
            if dirty > self.inner.opts.max_dirty_pages / 2 && self.inner.latch.check().is_ok() {
                if let Err(e) = self.commit_pages() {
                    tracing::warn!(error = %e, "background commit failed");
                }
            }
        }
    }

    fn reclaim_loop(&self) {
        let (m, c) = &self.inner.wake;
        while !self.inner.stop.load(Ordering::SeqCst) {
            {
                let mut woken = m.lock().unwrap();
                if !*woken {
                    woken = c.wait_timeout(woken, Duration::from_millis(500)).unwrap().0;
                }
                *woken = false;
            }
            if self.inner.stop.load(Ordering::SeqCst) {
                break;
            }
            if self.inner.latch.check().is_err() {
                // Refused until reopened: nothing to do, nothing to log again.
                continue;
            }
            let mut reclaimed = 0;
            loop {
                if self.inner.stop.load(Ordering::SeqCst) {
                    return;
                }
                match self.with_meta(|m| m.reclaim(64)) {
                    Ok(0) => break,
                    Ok(n) => {
                        reclaimed += n;
                        if let Err(e) = self.maybe_commit() {
                            tracing::warn!(error = %e, "commit during reclaim failed");
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "reclaim failed");
                        break;
                    }
                }
            }
            if reclaimed > 0 {
                if let Err(e) = self.commit() {
                    tracing::warn!(error = %e, "commit after reclaim failed");
                }
            }
        }
    }

    fn stop_threads(&self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        self.wake_background();
        let threads = std::mem::take(&mut *self.inner.threads.lock().unwrap());
        for t in threads {
            let _ = t.join();
        }
    }

    pub(crate) fn stopping(&self) -> bool {
        self.inner.stop.load(Ordering::SeqCst)
    }

    pub(crate) fn add_thread(&self, t: JoinHandle<()>) {
        self.inner.threads.lock().unwrap().push(t);
    }

    /// Stop background work, commit and checkpoint. Handles that are still
    /// open keep working, without background threads.
    pub fn close(self) -> Result<()> {
        self.stop_threads();
        self.checkpoint()
    }

    /// Stop background threads and walk away without committing, as a
    /// killed process would (for crash tests).
    pub fn abandon(self) {
        self.stop_threads();
    }
}
