//! The metadata state of an open pool, guarded by one mutex in the pool:
//! cached pages, refcounts, the allocator and the in-memory catalog, plus the
//! collection step of a commit. Tree algorithms are in `tree.rs`; the catalog
//! in `catalog.rs`. Nothing here does data I/O on volumes.

use crate::cache::Cache;
use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::format::*;
use crate::storage::BlockFile;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

pub struct Meta {
    pub sb: Superblock,
    pub sb_dirty: bool,
    pub cache: Cache,
    /// Latest committed image in the log of pages not yet checkpointed home.
    pub wal_index: HashMap<u64, u64>,
    pub pool: Arc<dyn BlockFile>,
    pub wal_file: Arc<dyn BlockFile>,
    pub catalog: Catalog,
    /// Blocks freed in the transaction being built.
    pub freed: Vec<u64>,
    /// Freed blocks whose freeing is not yet committed: the committed state
    /// still references them, so they must not be reused or overwritten.
    pub unavailable: HashSet<u64>,
    /// Blocks handed to writers that have not yet been installed in a tree.
    pub reserved: HashSet<u64>,
    cursor_group: u64,
    /// Where in the cursor group the next search for a free block starts:
    /// just past the last block found, so a run of allocations does not
    /// rescan the blocks it has just taken.
    cursor_index: u64,
    /// Groups known to have no allocatable block.
    full: Vec<bool>,
    /// The sharing generation: moves on every refcount change to or from a
    /// count of two or more (an incref, or a decref of a shared block), the
    /// only changes that can alter what any tree holds exclusively.
    /// Allocating (0 to 1) and freeing an unshared block (1 to 0) leave it:
    /// such a block is reachable from one tree only, through nodes that tree
    /// holds alone, and that tree is the one changing.
    pub shared_gen: u64,
    /// Whose exclusive footprint the refcount changes being made can alter
    /// (see [`Charge`]); `All` outside [`Meta::charged`].
    charge: Charge,
    /// Each volume's base, where known: the live snapshot its tree was
    /// identical to when it last became shared (the snapshot just taken of
    /// it, the one it was reverted to, or a linked clone's origin). Every
    /// node the volume did not allocate since is in that snapshot's tree.
    /// Kept in memory only (empty after a restart, which is merely slower:
    /// see [`Charge`]); a base whose snapshot is deleted is forgotten.
    pub bases: HashMap<u64, u64>,
    /// Snapshots' exclusive footprints (nodes, data) by snapshot id, with
    /// the sharing generation each was computed at: true while the
    /// generation has not moved, since a snapshot's tree never changes.
    pub exclusive_cache: HashMap<u64, (u64, (u64, u64))>,
    /// How many times each snapshot's footprint was charged alone (see
    /// [`Charge`]): with `shared_gen`, what tells a walk of that footprint
    /// paused between two holds of the lock whether its counts still hold
    /// (`space.rs`, `ExclusiveWalk`). Entries go with the cache's.
    pub exclusive_charges: HashMap<u64, u64>,
    /// Journal records made and not yet in the journal (`journal.rs`).
    pub queue: crate::journal::Queue,
    /// Times a change was found that no journal record describes (a volume
    /// created, a snapshot deleted, a reclaim step: anything made outside
    /// [`Meta::journaled`]); and how many of those the last durable
    /// page-log commit holds. A journal commit is possible only while the
    /// two are equal: the journal alone cannot make such a change durable.
    pub untracked: u64,
    pub untracked_durable: u64,
    /// Set while the journal is applied at open (`replay.rs`): see
    /// [`Meta::alloc_meta`].
    pub replaying: bool,
    /// Free blocks the file system found no space for while replaying.
    no_room: HashSet<u64>,
    /// While replaying: data blocks that records still to be applied
    /// install, with how many of them do. Kept from the allocator until the
    /// last: a block installed, freed by a later record and installed again
    /// by a later one still must not become an index node in between.
    pub replay_installs: HashMap<u64, u32>,
}

/// Whose exclusive footprints a refcount change can alter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Charge {
    /// Any snapshot's: the sharing generation moves, every cached
    /// footprint goes stale.
    All,
    /// This snapshot's alone (a volume writing beside its base): only its
    /// cached footprint goes.
    One(u64),
}

/// One transaction's worth of changed pages, ready for the log.
pub struct Collected {
    /// The last journal record this transaction holds.
    pub covered: u64,
    /// The count of untracked changes it holds ([`Meta::untracked`]).
    pub untracked: u64,
    pub pages: Vec<(u64, Box<Page>)>,
    pub seqs: Vec<(u64, u64)>,
    pub freed: Vec<u64>,
}

impl Meta {
    pub fn new(
        sb: Superblock,
        cache_pages: usize,
        wal_index: HashMap<u64, u64>,
        pool: Arc<dyn BlockFile>,
        wal_file: Arc<dyn BlockFile>,
    ) -> Meta {
        let groups = (sb.total_blocks / GROUP) as usize;
        Meta {
            sb,
            sb_dirty: false,
            cache: Cache::new(cache_pages),
            wal_index,
            pool,
            wal_file,
            catalog: Catalog::default(),
            freed: Vec::new(),
            unavailable: HashSet::new(),
            reserved: HashSet::new(),
            cursor_group: 0,
            cursor_index: 0,
            full: vec![false; groups],
            shared_gen: 0,
            charge: Charge::All,
            bases: HashMap::new(),
            exclusive_cache: HashMap::new(),
            exclusive_charges: HashMap::new(),
            queue: crate::journal::Queue::new(1),
            untracked: 0,
            untracked_durable: 0,
            replaying: false,
            no_room: HashSet::new(),
            replay_installs: HashMap::new(),
        }
    }

    /// Count changes made since the last look that no journal record
    /// describes (pages or records changed outside [`Meta::journaled`]).
    pub fn note_untracked(&mut self) {
        if self.cache.touched || self.catalog.touched {
            self.untracked += 1;
        }
        self.cache.touched = false;
        self.catalog.touched = false;
    }

    /// Whether appending the queued records makes every change made so far
    /// durable (no change outside them awaits a page-log commit).
    pub fn journal_suffices(&mut self) -> bool {
        self.note_untracked();
        self.untracked == self.untracked_durable
    }

    /// Run `f`, a change to the index that the journal records it returns describe
    /// (a write mapping or unmapping blocks, a snapshot), and queue the
    /// records it returns for the next commit. If `f` fails, whatever it
    /// changed is left to the page log (counted as untracked).
    pub fn journaled<T>(
        &mut self,
        f: impl FnOnce(&mut Meta) -> Result<(T, Vec<crate::journal::Op>)>,
    ) -> Result<T> {
        self.note_untracked();
        match f(self) {
            Ok((v, ops)) => {
                self.cache.touched = false;
                self.catalog.touched = false;
                ops.iter().for_each(|op| self.queue.push(op));
                Ok(v)
            }
            Err(e) => {
                self.untracked += 1;
                Err(e)
            }
        }
    }

    /// Run `f` (a volume writing its own tree: copies on write, data
    /// replaced or unmapped) with its refcount changes charged to the
    /// volume's base snapshot `base`, or to every snapshot if it has none
    /// known. Why one snapshot is enough: a copy on write drops a reference
    /// on a shared node or block; if one is left, its holder is a node of
    /// the base's tree (the volume's tree was the base's, and the base's
    /// never changes) or of a deleted tree awaiting reclaim, so only the
    /// base can come to reach it alone. The references it adds (on the
    /// copied node's children) make blocks shared that only a shared node
    /// led to: nobody counted them. The engine's model test checks every
    /// listed exclusive size against a fresh walk after every operation.
    pub fn charged<T>(
        &mut self,
        base: Option<u64>,
        f: impl FnOnce(&mut Meta) -> Result<T>,
    ) -> Result<T> {
        self.charge = base.map_or(Charge::All, Charge::One);
        let r = f(self);
        self.end_charge();
        r
    }

    /// [`Meta::charged`] to volume `vid`'s base, if it has one known: how
    /// the volume's own writes, copies and unmaps run.
    pub fn charged_to_volume<T>(
        &mut self,
        vid: u64,
        f: impl FnOnce(&mut Meta) -> Result<T>,
    ) -> Result<T> {
        let base = self.bases.get(&vid).copied();
        self.charged(base, f)
    }

    /// Back to charging every snapshot (see [`Meta::charged`]).
    pub fn end_charge(&mut self) {
        self.charge = Charge::All;
    }

    /// A refcount moved to or from a count of two or more: the exclusive
    /// footprints it can alter are no longer known.
    fn sharing_changed(&mut self) {
        match self.charge {
            Charge::All => self.shared_gen += 1,
            Charge::One(id) => {
                self.exclusive_cache.remove(&id);
                *self.exclusive_charges.entry(id).or_insert(0) += 1;
            }
        }
    }

    fn load(&mut self, block: u64, magic: u32) -> Result<()> {
        if let Some(p) = self.cache.get(block) {
            if get_u32(p, 0) != magic {
                return Err(Error::corrupt(
                    block,
                    "cached page is of another kind (dangling pointer)",
                ));
            }
            return Ok(());
        }
        if block >= self.sb.total_blocks
            || is_system_block(block) && magic != MAGIC_RC && magic != MAGIC_SUPER
        {
            return Err(Error::corrupt(
                block,
                "pointer to a block outside the pool's metadata",
            ));
        }
        let mut p = new_page();
        match self.wal_index.get(&block) {
            Some(&off) => self
                .wal_file
                .read_at(&mut p[..], off)
                .map_err(|e| Error::io("read log", self.wal_file.path(), off, e))?,
            None => {
                let at = block * BLOCK as u64;
                self.pool
                    .read_at(&mut p[..], at)
                    .map_err(|e| Error::io("read metadata", self.pool.path(), at, e))?
            }
        }
        verify(&p, block, magic)?;
        self.cache.insert(block, p, false);
        Ok(())
    }

    pub fn page(&mut self, block: u64, magic: u32) -> Result<&Page> {
        self.load(block, magic)?;
        Ok(self.cache.get(block).expect("just loaded"))
    }

    pub fn page_mut(&mut self, block: u64, magic: u32) -> Result<&mut Page> {
        self.load(block, magic)?;
        Ok(self.cache.get_mut(block).expect("just loaded"))
    }

    pub fn rc(&mut self, block: u64) -> Result<u32> {
        let p = self.page(rc_page_of(block), MAGIC_RC)?;
        Ok(rc::get(p, (block % GROUP) as usize))
    }

    pub fn set_rc(&mut self, block: u64, v: u32) -> Result<()> {
        let p = self.page_mut(rc_page_of(block), MAGIC_RC)?;
        rc::set(p, (block % GROUP) as usize, v);
        Ok(())
    }

    pub fn incref(&mut self, block: u64) -> Result<()> {
        let v = self.rc(block)?;
        if v == 0 || v > RC_MAX {
            return Err(Error::corrupt(
                block,
                format!("incref of a block with refcount {v:#x}"),
            ));
        }
        if v == RC_MAX {
            return Err(Error::Conflict(format!(
                "block {block} is shared {RC_MAX} times, the limit"
            )));
        }
        self.sharing_changed();
        self.set_rc(block, v + 1)
    }

    /// Refcounts of many blocks, reading each refcount page once per run of
    /// blocks in the same group (a node's children usually are).
    pub fn rc_many(&mut self, blocks: &[u64], out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        let mut i = 0;
        while i < blocks.len() {
            let page = rc_page_of(blocks[i]);
            let p = self.page(page, MAGIC_RC)?;
            while i < blocks.len() && rc_page_of(blocks[i]) == page {
                out.push(rc::get(p, (blocks[i] % GROUP) as usize));
                i += 1;
            }
        }
        Ok(())
    }

    /// One more reference on each of `blocks` (the children of a node being
    /// copied), a refcount page at a time.
    pub fn incref_many(&mut self, blocks: &[u64]) -> Result<()> {
        self.sharing_changed();
        let mut i = 0;
        while i < blocks.len() {
            let page = rc_page_of(blocks[i]);
            let p = self.page_mut(page, MAGIC_RC)?;
            while i < blocks.len() && rc_page_of(blocks[i]) == page {
                let at = (blocks[i] % GROUP) as usize;
                let v = rc::get(p, at);
                if v == 0 || v >= RC_MAX {
                    return Err(Error::corrupt(
                        blocks[i],
                        format!("incref of a block with refcount {v:#x}"),
                    ));
                }
                rc::set(p, at, v + 1);
                i += 1;
            }
        }
        Ok(())
    }

    /// Drop one reference; returns the new count.
    pub fn decref(&mut self, block: u64) -> Result<u32> {
        let v = self.rc(block)?;
        if v == 0 || v > RC_MAX {
            return Err(Error::corrupt(
                block,
                format!("decref of a block with refcount {v:#x}"),
            ));
        }
        if v >= 2 {
            self.sharing_changed();
        }
        self.set_rc(block, v - 1)?;
        Ok(v - 1)
    }

    /// A block whose refcount reached zero: reusable once this transaction commits.
    pub fn free(&mut self, block: u64) {
        self.freed.push(block);
        self.unavailable.insert(block);
        self.cache.forget(block);
        if self.replaying {
            // Free at once while replaying (see `alloc_meta`).
            self.full[(block / GROUP) as usize] = false;
        }
    }

    fn find_free(&mut self) -> Result<u64> {
        let groups = self.sb.total_blocks / GROUP;
        for k in 0..groups {
            let g = (self.cursor_group + k) % groups;
            if self.full[g as usize] {
                continue;
            }
            let rcb = g * GROUP + 1;
            self.load(rcb, MAGIC_RC)?;
            let p = self.cache.get(rcb).expect("loaded");
            // In the cursor group, from the hint on, then what is before it
            // (blocks freed behind the cursor).
            let hint = if k == 0 {
                self.cursor_index.min(GROUP)
            } else {
                0
            };
            // While replaying, a block freed by an earlier record is free:
            // see [`Meta::alloc_meta`].
            let found = (hint..GROUP).chain(0..hint).find(|&i| {
                let b = g * GROUP + i;
                rc::get(p, i as usize) == 0
                    && (self.replaying || !self.unavailable.contains(&b))
                    && !self.reserved.contains(&b)
                    && !self.no_room.contains(&b)
                    && !self.replay_installs.contains_key(&b)
            });
            match found {
                Some(i) => {
                    self.cursor_group = g;
                    self.cursor_index = i + 1;
                    return Ok(g * GROUP + i);
                }
                None => self.full[g as usize] = true,
            }
        }
        self.grow()
    }

    fn no_space(&self, detail: String) -> Error {
        Error::NoSpace {
            path: self.pool.path().to_path_buf(),
            detail,
        }
    }

    /// Add one group to the pool; returns its first free block.
    fn grow(&mut self) -> Result<u64> {
        let g = self.sb.total_blocks / GROUP;
        let total = self.sb.total_blocks + GROUP;
        if self.sb.max_blocks != 0 && total > self.sb.max_blocks {
            return Err(self.no_space(format!(
                "the pool's capacity of {} bytes is used up",
                self.sb.max_blocks * BLOCK as u64
            )));
        }
        let rcb = g * GROUP + 1;
        let at = rcb * BLOCK as u64;
        self.pool
            .allocate(at, BLOCK as u64)
            .map_err(|e| Error::io("extend pool", self.pool.path(), at, e))?;
        let mut p = new_page();
        rc::init(&mut p, g);
        rc::set(&mut p, 1, RC_SYSTEM);
        // Growing needs no journal record: replaying the journal grows the
        // pool over every block a record names first (`replay.rs`), to the
        // same groups, whatever the page log last held.
        let touched = self.cache.touched;
        self.cache.insert(rcb, p, true);
        self.cache.touched = touched;
        self.sb.total_blocks = total;
        self.sb_dirty = true;
        self.full.push(false);
        self.cursor_group = g;
        self.cursor_index = 1;
        Ok(g * GROUP)
    }

    /// Add groups until block `b` is in the pool (replaying the journal).
    pub fn grow_over(&mut self, b: u64) -> Result<()> {
        while b >= self.sb.total_blocks {
            self.grow()?;
        }
        Ok(())
    }

    /// Allocate a metadata block (refcount 1) with disk space reserved for it.
    ///
    /// While the journal is applied at open ([`Meta::replaying`]), a free
    /// block the file system has no space for is passed over for the next
    /// one, and a block freed by an earlier record may be taken. Why: a
    /// pool killed on a full disk must open again, and applying its
    /// journal makes index nodes and record pages anew. The killed process
    /// made the same ones, for the same records on the same state, and
    /// each took disk space then (this function) that nothing gave back:
    /// their refcounts never became durable, so they are free blocks that
    /// still hold their space, and a block it took after freeing it is
    /// freed again by the same record here. So the k-th block asked for
    /// here can always be one of the first k the killed process took, and
    /// the open needs no space the pool did not already hold. Taking a
    /// block freed earlier in the replay is safe there alone: nothing reads
    /// the pool while it opens, the replay commits as one page-log
    /// transaction, and a block that a later record installs as data is
    /// kept from the allocator until then ([`Meta::replay_installs`]). Outside the
    /// replay a full disk is the caller's ENOSPC, as for data.
    pub fn alloc_meta(&mut self) -> Result<u64> {
        loop {
            let b = self.find_free()?;
            let at = b * BLOCK as u64;
            match self.pool.allocate(at, BLOCK as u64) {
                Ok(()) => {
                    self.set_rc(b, 1)?;
                    return Ok(b);
                }
                Err(e)
                    if self.replaying
                        && matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) =>
                {
                    self.no_room.insert(b);
                }
                Err(e) => return Err(Error::io("allocate metadata", self.pool.path(), at, e)),
            }
        }
    }

    /// The journal is applied (or failed to be): back to allocating only
    /// blocks whose freeing is durable, and to trying every free block.
    pub fn end_replay(&mut self) {
        self.replaying = false;
        self.replay_installs.clear();
        if !self.no_room.is_empty() {
            self.no_room.clear();
            self.full.iter_mut().for_each(|f| *f = false);
        }
    }

    /// Allocate a new tree node of the given level, empty and dirty.
    pub fn alloc_node(&mut self, level: u8) -> Result<u64> {
        let b = self.alloc_meta()?;
        let mut p = new_page();
        node::init(&mut p, level);
        self.cache.insert(b, p, true);
        Ok(b)
    }

    /// Reserve a free block for a data write in flight.
    pub fn reserve_data(&mut self) -> Result<u64> {
        let b = self.find_free()?;
        self.reserved.insert(b);
        Ok(b)
    }

    pub fn unreserve(&mut self, b: u64) {
        self.reserved.remove(&b);
        self.full[(b / GROUP) as usize] = false;
    }

    /// Give a reserved data block its first reference.
    pub fn install_data(&mut self, b: u64) -> Result<()> {
        self.reserved.remove(&b);
        self.set_rc(b, 1)
    }

    /// Freed blocks whose freeing has committed become allocatable.
    pub fn release(&mut self, blocks: &[u64]) {
        for b in blocks {
            self.unavailable.remove(b);
            if let Some(f) = self.full.get_mut((b / GROUP) as usize) {
                *f = false;
            }
        }
    }

    /// Gather every change since the last commit as sealed page images.
    pub fn collect(&mut self, txn: u64) -> Result<Collected> {
        // This transaction holds every change so far, journalled or not,
        // and the superblock says up to which record. The queued records
        // stay queued until it is durable: a journal commit may take them
        // first, and must not then depend on this one (`commit.rs`).
        self.note_untracked();
        let covered = self.queue.next - 1;
        if self.sb.journal_covered != covered {
            self.sb.journal_covered = covered;
            self.sb_dirty = true;
        }
        let untracked = self.untracked;
        self.flush_records()?;
        if self.sb_dirty {
            let sb = self.sb.clone();
            let p = self.page_mut(0, MAGIC_SUPER)?;
            sb.encode(p);
            self.sb_dirty = false;
        }
        let mut pages = Vec::new();
        let mut seqs = Vec::new();
        self.cache.touched = false;
        self.catalog.touched = false;
        for (block, seq, mut page) in self.cache.dirty_pages() {
            seal(&mut page, block, txn);
            pages.push((block, page));
            seqs.push((block, seq));
        }
        Ok(Collected {
            covered,
            untracked,
            pages,
            seqs,
            freed: std::mem::take(&mut self.freed),
        })
    }

    /// The log holds the transaction: remember where, and mark pages clean.
    pub fn committed(&mut self, c: &Collected, offsets: &[u64]) {
        self.untracked_durable = self.untracked_durable.max(c.untracked);
        self.queue.drop_through(c.covered);
        for ((block, _), off) in c.pages.iter().zip(offsets) {
            self.wal_index.insert(*block, *off);
        }
        self.cache.mark_clean(&c.seqs);
    }

    /// The commit failed: its frees stay pending for the next one.
    pub fn uncommitted(&mut self, c: Collected) {
        self.freed.extend(c.freed);
    }
}
