//! What snapshots hold: each snapshot's exclusive size (cached while the
//! pool's sharing generation holds), what deleting a set of snapshots would
//! free (the deletion's refcount arithmetic, run without writing it), and
//! the pool's snapshot-only space (by difference: every referenced block
//! less what volumes, clone links and the catalog reach). Everything here
//! reads; nothing may change a refcount, a tree or the catalog. Why each
//! figure is exact, and what each walk costs, is in `docs/space.md`.

use crate::error::{Error, Result};
use crate::format::*;
use crate::meta::Meta;
use crate::ops::Freed;
use crate::pool::Pool;
use crate::storage::BlockFile;
use std::collections::HashMap;

/// Blocks per page of a [`BlockSet`].
const SET_PAGE: u64 = 1 << 15;

/// A set of block numbers, one bit each, in pages of 32,768 blocks made on
/// first use: a set over the regions live trees touch costs an eighth of a
/// byte per block of those regions (32 MiB for a TiB) plus a pointer per
/// page of the pool, and each lookup is an index, not a hash.
struct BlockSet {
    pages: Vec<Option<Box<[u64; (SET_PAGE / 64) as usize]>>>,
    len: u64,
}

impl BlockSet {
    /// A set for blocks below `total`.
    fn new(total: u64) -> BlockSet {
        BlockSet {
            pages: (0..total.div_ceil(SET_PAGE)).map(|_| None).collect(),
            len: 0,
        }
    }

    fn slot(b: u64) -> (usize, usize, u64) {
        (
            (b / SET_PAGE) as usize,
            ((b % SET_PAGE) / 64) as usize,
            1 << (b % 64),
        )
    }

    /// Whether `b` was not in the set yet. A block past the pool's end
    /// (only a corrupt tree holds one) is refused, not stored.
    fn insert(&mut self, b: u64) -> Result<bool> {
        let (page, word, bit) = Self::slot(b);
        let p = self
            .pages
            .get_mut(page)
            .ok_or_else(|| Error::corrupt(b, "a tree points past the end of the pool"))?
            .get_or_insert_with(|| Box::new([0; (SET_PAGE / 64) as usize]));
        if p[word] & bit != 0 {
            return Ok(false);
        }
        p[word] |= bit;
        self.len += 1;
        Ok(true)
    }

    fn contains(&self, b: u64) -> bool {
        let (page, word, bit) = Self::slot(b);
        matches!(self.pages.get(page), Some(Some(p)) if p[word] & bit != 0)
    }
}

/// An exclusive-footprint walk: of a snapshot, which can stop between any
/// two nodes and go on in a later hold of the metadata lock, or of any tree
/// in one go. A listing walks the sizes its cache lacks in slices of about
/// a millisecond of the lock; a walk that could stop only between two
/// snapshots would hold it for a whole snapshot's tree, tens of
/// milliseconds a snapshot on a deep volume with a cold page cache, and
/// the volume's reads would all but stop for the whole listing
/// (docs/space.md).
///
/// Between two holds a snapshot's own tree does not change (no snapshot's
/// tree does while it exists), but refcounts and the tree walked beside may:
/// - the counts so far stand only if neither the sharing generation nor
///   this snapshot's charge count moved (see `Meta::exclusive_charges`);
///   otherwise the walk starts over, and after [`MAX_RESTARTS`] it finishes
///   in the hold it is in, so that a stream of changes cannot keep it going
///   for ever;
/// - the snapshot must still exist with the same root, or its nodes may be
///   freed: the walk ends as [`Walked::Gone`];
/// - a node queued in an earlier hold has the node beside it looked up
///   again, by its place, in the neighbour's tree as it is now: the one
///   found then may since have been copied and freed.
pub struct ExclusiveWalk {
    /// The snapshot (none: a tree walked in one go, beside nothing).
    id: Option<u64>,
    root: u64,
    levels: u8,
    /// (sharing generation, the snapshot's charge count) when the counts
    /// began.
    token: (u64, u64),
    /// Nodes still to enter.
    stack: Vec<Pending>,
    /// (nodes, data) counted so far.
    counts: (u64, u64),
    /// Holds of the lock the walk has run in.
    hold: u64,
    restarts: u32,
    started: bool,
    /// Nodes entered, restarts included.
    entered: u64,
}

/// A node an exclusive walk has still to enter.
struct Pending {
    block: u64,
    level: u8,
    /// The first block index it covers: its place in the tree.
    first: u64,
    /// The node at the same place in the tree walked beside (0: none), as
    /// found in hold `hold`.
    other: u64,
    hold: u64,
}

/// Restarts after which a paused walk runs to its end in one hold.
const MAX_RESTARTS: u32 = 2;

/// Where [`Meta::step_exclusive`] left a walk.
#[derive(Debug, PartialEq, Eq)]
pub enum Walked {
    /// Its (nodes, data), now in the cache.
    Done((u64, u64)),
    /// The deadline passed: step it again in a later hold.
    Paused,
    /// The snapshot was deleted (or replaced) meanwhile.
    Gone,
}

impl ExclusiveWalk {
    /// A walk of snapshot `id`'s tree (`root`, `levels`), resumable.
    pub fn of_snapshot(id: u64, root: u64, levels: u8) -> ExclusiveWalk {
        ExclusiveWalk {
            id: Some(id),
            ..ExclusiveWalk::of_tree(root, levels)
        }
    }

    /// A walk of any tree, beside nothing, run in one go.
    fn of_tree(root: u64, levels: u8) -> ExclusiveWalk {
        ExclusiveWalk {
            id: None,
            root,
            levels,
            token: (0, 0),
            stack: Vec::new(),
            counts: (0, 0),
            hold: 0,
            restarts: 0,
            started: false,
            entered: 0,
        }
    }
}

/// Nodes of a paused walk read ahead before its next slice.
const READ_AHEAD: usize = 256;

/// A slice that entered fewer nodes than this was waiting for the disk:
/// the listing reads ahead before the next one. One that found its pages
/// cached enters hundreds in a millisecond, and reading ahead would only
/// add system calls between its slices.
pub const SLOW_SLICE: u64 = 32;

impl ExclusiveWalk {
    /// Nodes this walk has entered so far, restarts included.
    pub fn entered(&self) -> u64 {
        self.entered
    }

    /// Read what this paused walk enters next into the page cache, outside
    /// the metadata lock (the caller must not hold it): its next nodes and
    /// the nodes beside them, then the refcount pages of the entries in
    /// which those differ. A slice that finds them cached takes microseconds
    /// a node instead of a disk read each while the volumes' look-ups wait
    /// (docs/space.md). Only a hint: the pages are read from the pool file
    /// without checks and may be stale (a newer copy in the page log, a
    /// neighbour changed since); the walk reads each again, under the lock,
    /// the usual way.
    pub fn read_ahead(&self, file: &dyn BlockFile) {
        let next = &self.stack[self.stack.len().saturating_sub(READ_AHEAD)..];
        // Entries come from pages read without checks (a node's newer copy
        // may be in the page log, and the pool file's block still hold what
        // a client once wrote there): any value, so offsets are checked.
        let at = |b: u64| {
            b.checked_mul(BLOCK as u64)
                .filter(|&o| o <= i64::MAX as u64)
        };
        let hint = |b: u64| {
            if let Some(o) = at(b) {
                file.will_need(o, BLOCK as u64);
            }
        };
        for p in next {
            hint(p.block);
            if p.other != 0 {
                hint(p.other);
            }
        }
        let read = |b: u64| -> Option<Box<Page>> {
            let mut page = Box::new([0u8; BLOCK]);
            file.read_at(&mut page[..], at(b)?).ok()?;
            (get_u32(&page[..], 0) == MAGIC_NODE).then_some(page)
        };
        let mut rc_pages = Vec::new();
        for p in next.iter().filter(|p| p.level == 0) {
            let Some(ours) = read(p.block) else { continue };
            let beside = match p.other {
                0 => None,
                o => read(o),
            };
            for i in 0..FANOUT {
                let e = node::entry(&ours, i);
                let o = beside.as_ref().map_or(0, |x| node::entry(x, i));
                if e != 0 && e != o {
                    rc_pages.push(rc_page_of(e));
                }
            }
        }
        rc_pages.sort_unstable();
        rc_pages.dedup();
        for b in rc_pages {
            hint(b);
        }
    }
}

impl Meta {
    /// Blocks referenced by this tree and by nothing else (its exclusive
    /// footprint), counting nodes and data separately. Shared subtrees are
    /// not entered, so this costs only the exclusive part.
    pub fn tree_exclusive(&mut self, root: u64, levels: u8) -> Result<(u64, u64)> {
        let mut w = ExclusiveWalk::of_tree(root, levels);
        match self.step_exclusive(&mut w, None)? {
            Walked::Done(counts) => Ok(counts),
            w => unreachable!("a walk with no snapshot and no deadline ends: {w:?}"),
        }
    }

    /// The tree snapshot `id`'s exclusive walk goes beside: its volume's
    /// next snapshot, or the live volume after the last one, if of the same
    /// height (a volume grown since has a taller tree).
    ///
    /// An entry equal to the other tree's at the same place is shared
    /// without asking its refcount: every node the walk enters has one
    /// parent, so the other tree's node there is a different one, and a
    /// block two nodes point at has two references. Only the entries that
    /// differ cost a refcount read. Beside a neighbour in the same history
    /// that is the few blocks rewritten between the two, not every entry of
    /// every leaf the two no longer share. The result is the same whichever
    /// tree is beside, or none.
    fn neighbour(&self, id: u64, levels: u8) -> Option<u64> {
        let vol = self.catalog.snapshot(id)?.volume;
        let (root, l) = match self.catalog.next_snapshot_of(vol, id) {
            Some(n) => (n.root, n.levels),
            None => match self.catalog.get(vol)? {
                Record::Volume(v) => (v.root, v.levels),
                Record::Snapshot(_) | Record::Retired(_) => return None,
            },
        };
        (root != 0 && l == levels).then_some(root)
    }

    /// The node at `level` covering block index `first` in the tree that
    /// snapshot `id`'s walk goes beside, as that tree is now (0: none).
    fn neighbour_at(&mut self, id: u64, levels: u8, level: u8, first: u64) -> Result<u64> {
        let Some(mut b) = self.neighbour(id, levels) else {
            return Ok(0);
        };
        let mut l = levels - 1;
        while l > level && b != 0 {
            b = self.node_entries(b, l)?[crate::tree::slot(first, l)];
            l -= 1;
        }
        Ok(b)
    }

    /// Snapshot `id`'s exclusive (nodes, data) if the cache holds it at the
    /// current sharing generation.
    pub fn cached_exclusive(&self, id: u64) -> Option<(u64, u64)> {
        self.exclusive_cache
            .get(&id)
            .filter(|(gen, _)| *gen == self.shared_gen)
            .map(|&(_, counts)| counts)
    }

    /// [`Meta::tree_exclusive`] of snapshot `id`'s tree, from the cache
    /// while the sharing generation has not moved (see `shared_gen`),
    /// walked in one go otherwise.
    pub fn snapshot_exclusive(&mut self, id: u64, root: u64, levels: u8) -> Result<(u64, u64)> {
        let mut w = ExclusiveWalk::of_snapshot(id, root, levels);
        match self.step_exclusive(&mut w, None)? {
            Walked::Done(counts) => Ok(counts),
            _ => Err(Error::corrupt(
                root,
                format!("snapshot {id}'s record changed while its size was walked under the lock"),
            )),
        }
    }

    /// (sharing generation, snapshot `id`'s charge count).
    fn exclusive_token(&self, id: u64) -> (u64, u64) {
        let charges = self.exclusive_charges.get(&id).copied().unwrap_or(0);
        (self.shared_gen, charges)
    }

    /// Walk on until the walk ends or `deadline` passes (none: to the end).
    /// A snapshot's finished walk goes into the cache.
    pub fn step_exclusive(
        &mut self,
        w: &mut ExclusiveWalk,
        deadline: Option<std::time::Instant>,
    ) -> Result<Walked> {
        w.hold += 1;
        let token = match w.id {
            Some(id) => {
                if let Some(counts) = self.cached_exclusive(id) {
                    return Ok(Walked::Done(counts));
                }
                match self.catalog.snapshot(id) {
                    Some(s) if (s.root, s.levels) == (w.root, w.levels) => {}
                    _ => return Ok(Walked::Gone),
                }
                self.exclusive_token(id)
            }
            None => (0, 0),
        };
        if !w.started || token != w.token {
            if w.started {
                w.restarts += 1;
                tracing::trace!(snapshot = ?w.id, restarts = w.restarts, "exclusive walk restarted");
            }
            w.started = true;
            w.token = token;
            w.counts = (0, 0);
            w.stack.clear();
            if w.root != 0 && self.rc(w.root)? == 1 {
                let other = match w.id {
                    Some(id) => self.neighbour(id, w.levels).unwrap_or(0),
                    None => 0,
                };
                w.stack.push(Pending {
                    block: w.root,
                    level: w.levels - 1,
                    first: 0,
                    other,
                    hold: w.hold,
                });
            }
        }
        let deadline = deadline.filter(|_| w.id.is_some() && w.restarts < MAX_RESTARTS);
        while let Some(p) = w.stack.pop() {
            let other = match w.id {
                Some(id) if p.hold != w.hold => {
                    self.neighbour_at(id, w.levels, p.level, p.first)?
                }
                _ => p.other,
            };
            self.exclusive_node(w, &p, other)?;
            if !w.stack.is_empty() && deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return Ok(Walked::Paused);
            }
        }
        if let Some(id) = w.id {
            tracing::trace!(
                snapshot = id,
                shared_gen = self.shared_gen,
                "exclusive size walked"
            );
            self.cache_exclusive(id, w.counts);
        }
        Ok(Walked::Done(w.counts))
    }

    /// Count node `p` (held by one parent alone) and queue what under it
    /// only it holds; `other` is the node at the same place in the tree
    /// walked beside (0: none).
    fn exclusive_node(&mut self, w: &mut ExclusiveWalk, p: &Pending, other: u64) -> Result<()> {
        debug_assert_ne!(p.block, other, "a node with one parent is in one tree");
        w.counts.0 += 1;
        w.entered += 1;
        let entries = self.node_entries(p.block, p.level)?;
        let beside = match other {
            0 => None,
            o => Some(self.node_entries(o, p.level)?),
        };
        let mut children = Vec::new();
        let mut at = Vec::new();
        for (i, &e) in entries.iter().enumerate() {
            let o = beside.as_ref().map_or(0, |x| x[i]);
            if e != 0 && e != o {
                children.push(e);
                at.push((i as u64, o));
            }
        }
        let mut rcs = Vec::with_capacity(children.len());
        self.rc_many(&children, &mut rcs)?;
        // Queued last first, so that the walk goes in index order.
        for ((&e, &(i, o)), &rc) in children.iter().zip(&at).zip(&rcs).rev() {
            if rc != 1 {
                continue;
            }
            if p.level == 0 {
                w.counts.1 += 1;
            } else {
                w.stack.push(Pending {
                    block: e,
                    level: p.level - 1,
                    first: p.first + i * crate::tree::span(p.level),
                    other: o,
                    hold: w.hold,
                });
            }
        }
        Ok(())
    }

    /// Cache snapshot `id`'s footprint at the current sharing generation.
    fn cache_exclusive(&mut self, id: u64, counts: (u64, u64)) {
        // Entries of deleted snapshots are dropped once they could be half
        // the cache (the bound is O(1): this runs for every snapshot listed).
        if self.exclusive_cache.len() > 2 * self.catalog.record_count() + 64 {
            let catalog = &self.catalog;
            self.exclusive_cache
                .retain(|id, _| catalog.snapshot(*id).is_some());
            self.exclusive_charges
                .retain(|id, _| catalog.snapshot(*id).is_some());
        }
        self.exclusive_cache.insert(id, (self.shared_gen, counts));
    }

    /// A node's non-empty entries, each with its refcount.
    fn children_rc(&mut self, b: u64, level: u8) -> Result<(Vec<u64>, Vec<u32>)> {
        let entries = self.node_entries(b, level)?;
        let children: Vec<u64> = entries.iter().copied().filter(|&e| e != 0).collect();
        let mut rcs = Vec::with_capacity(children.len());
        self.rc_many(&children, &mut rcs)?;
        Ok((children, rcs))
    }

    /// Blocks that deleting all of these trees together would free, as
    /// (nodes, data): each root loses one reference, and every block whose
    /// references all come from blocks so freed is freed in turn. This runs
    /// the deletion's refcount arithmetic without writing it, so it is exact
    /// (a block shared only among the given trees counts once, which no sum
    /// of per-tree exclusive sizes gives) and costs only the freed part and
    /// its edge. Nodes already on the dead list are not counted.
    pub fn trees_freed(&mut self, roots: &[(u64, u8)]) -> Result<(u64, u64)> {
        let mut dropped: HashMap<u64, u32> = HashMap::new();
        let mut counts = (0u64, 0u64);
        for &(root, levels) in roots {
            if root == 0 {
                continue;
            }
            let d = dropped.entry(root).or_insert(0);
            *d += 1;
            let d = *d;
            if self.rc(root)? == d {
                self.freed_rec(root, levels - 1, &mut dropped, &mut counts)?;
            }
        }
        Ok(counts)
    }

    /// Node `b` (at `level`) has lost its last reference: count it, and drop
    /// one reference from each of its children.
    fn freed_rec(
        &mut self,
        b: u64,
        level: u8,
        dropped: &mut HashMap<u64, u32>,
        counts: &mut (u64, u64),
    ) -> Result<()> {
        counts.0 += 1;
        let (children, rcs) = self.children_rc(b, level)?;
        for (&e, &rc) in children.iter().zip(&rcs) {
            let d = dropped.entry(e).or_insert(0);
            *d += 1;
            if *d != rc {
                continue;
            }
            if level == 0 {
                counts.1 += 1;
            } else {
                self.freed_rec(e, level - 1, dropped, counts)?;
            }
        }
        Ok(())
    }

    /// Mark node `b` (at `level`) and everything under it, entering each
    /// node once.
    fn mark_live(&mut self, b: u64, level: u8, live: &mut BlockSet) -> Result<()> {
        if !live.insert(b)? {
            return Ok(());
        }
        let entries = self.node_entries(b, level)?;
        for &e in entries.iter().filter(|&&e| e != 0) {
            if level == 0 {
                live.insert(e)?;
            } else {
                self.mark_live(e, level - 1, live)?;
            }
        }
        Ok(())
    }

    /// Nodes under snapshot node `b` (at `level`, itself included) that
    /// nothing live reaches, each counted once. Leaves are counted from
    /// their parents' entries, never read, so this reads only the interior
    /// nodes (one in 504 of a tree's nodes).
    fn count_unreached_nodes(
        &mut self,
        b: u64,
        level: u8,
        live: &BlockSet,
        seen: &mut BlockSet,
    ) -> Result<u64> {
        if live.contains(b) || !seen.insert(b)? {
            return Ok(0);
        }
        if level == 0 {
            return Ok(1);
        }
        let entries = self.node_entries(b, level)?;
        let mut n = 1;
        for &e in entries.iter().filter(|&&e| e != 0) {
            n += self.count_unreached_nodes(e, level - 1, live, seen)?;
        }
        Ok(n)
    }

    /// Blocks whose refcount `keep` accepts: one read of every refcount
    /// page (the pool's used blocks, and the difference's referenced ones).
    pub(crate) fn count_refcounts(&mut self, keep: impl Fn(u32) -> bool) -> Result<u64> {
        let mut n = 0;
        for g in 0..self.sb.total_blocks / GROUP {
            let p = self.page(g * GROUP + 1, MAGIC_RC)?;
            n += (0..GROUP as usize).filter(|&i| keep(rc::get(p, i))).count() as u64;
        }
        Ok(n)
    }

    /// What deleting every snapshot would free, as (nodes, data).
    ///
    /// With no dead tree awaiting reclaim, every referenced block is reached
    /// from the catalog, a volume, a clone link or a snapshot (the pool
    /// check verifies this between any two holds of the lock), so the blocks only
    /// snapshots reach are the referenced blocks less those the others
    /// reach: the walk costs the live trees and the snapshots' interior
    /// nodes, however much history the snapshots hold. The nodes among them
    /// are counted by walking the snapshots' trees down to the first node
    /// something live reaches. While reclaim is pending, dead trees still
    /// hold references this cannot attribute, and the deletion is simulated
    /// instead ([`Meta::trees_freed`]), at a cost in proportion to what it
    /// frees.
    pub fn snapshot_only(&mut self) -> Result<(u64, u64)> {
        let snapshots: Vec<(u64, u8)> = self
            .catalog
            .snapshots()
            .filter(|s| s.root != 0)
            .map(|s| (s.root, s.levels))
            .collect();
        if self.sb.dead_head != 0 {
            return self.trees_freed(&snapshots);
        }
        let mut live = BlockSet::new(self.sb.total_blocks);
        let mut roots = vec![(self.sb.catalog_root, self.sb.catalog_levels)];
        for v in self.catalog.volumes() {
            roots.push((v.root, v.levels));
            if let Some(o) = &v.origin {
                roots.push((o.root, o.levels));
            }
        }
        for (root, levels) in roots {
            if root != 0 {
                self.mark_live(root, levels - 1, &mut live)?;
            }
        }
        let mut seen = BlockSet::new(self.sb.total_blocks);
        let mut nodes = 0;
        for (root, levels) in snapshots {
            nodes += self.count_unreached_nodes(root, levels - 1, &live, &mut seen)?;
        }
        // System blocks and dead nodes have refcounts of their own, above RC_MAX.
        let referenced = self.count_refcounts(|rc| (1..=RC_MAX).contains(&rc))?;
        referenced
            .checked_sub(live.len + nodes)
            .map(|data| (nodes, data))
            .ok_or_else(|| {
                Error::corrupt(
                    0,
                    format!(
                        "{referenced} blocks referenced, fewer than the {} live and {nodes} snapshot index blocks reached",
                        live.len
                    ),
                )
            })
    }
}

impl Pool {
    /// What deleting these snapshots of `volume` together would free:
    /// exact, from the refcounts (see `Meta::trees_freed`); blocks shared
    /// only among them count, which the sum of their exclusive sizes misses.
    /// A name given twice counts once.
    pub fn freed_by_deleting(&self, volume: &str, snapshots: &[String]) -> Result<Freed> {
        self.with_meta(|m| {
            let vid = m.catalog.owner_id(volume)?;
            let mut ids = Vec::with_capacity(snapshots.len());
            for s in snapshots {
                ids.push(m.catalog.snapshot_id(vid, s)?);
            }
            ids.sort_unstable();
            ids.dedup();
            let roots: Vec<(u64, u8)> = ids
                .iter()
                .map(|&id| {
                    let s = m.catalog.snapshot(id).expect("indexed");
                    (s.root, s.levels)
                })
                .collect();
            Ok(Self::freed(m.trees_freed(&roots)?))
        })
    }

    /// Space only snapshots hold: what deleting every snapshot in the pool
    /// (system snapshots of linked clones included) would free; blocks a
    /// volume or clone still maps are not in it. Walks the snapshot-only part
    /// of every snapshot's tree under the metadata lock.
    pub fn snapshot_only(&self) -> Result<Freed> {
        self.with_meta(|m| Ok(Self::freed(m.snapshot_only()?)))
    }

    /// [`Pool::snapshot_only`] by simulating the deletion of every
    /// snapshot: the reference the tests hold the difference to.
    #[doc(hidden)]
    pub fn snapshot_only_simulated(&self) -> Result<Freed> {
        self.with_meta(|m| {
            let roots: Vec<(u64, u8)> = m.catalog.snapshots().map(|s| (s.root, s.levels)).collect();
            Ok(Self::freed(m.trees_freed(&roots)?))
        })
    }

    pub(crate) fn freed((nodes, data): (u64, u64)) -> Freed {
        Freed {
            data_bytes: data * BLOCK as u64,
            metadata_bytes: nodes * BLOCK as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ExclusiveWalk, Walked};
    use crate::sim::SimBackend;
    use crate::{Pool, PoolOptions, BLOCK};
    use std::collections::HashMap;
    use std::sync::Arc;

    /// Which of the volume's snapshots have their size cached, by name
    /// (looked up in the cache alone: describing one would walk it).
    fn cached(p: &Pool, ids: &HashMap<String, u64>) -> HashMap<String, bool> {
        let m = p.lock_meta();
        ids.iter()
            .map(|(n, &id)| (n.clone(), m.cached_exclusive(id).is_some()))
            .collect()
    }

    /// Walk snapshot `name` of `v` one node per hold, running `between`
    /// (which may change anything) and then reading ahead between two
    /// holds; returns how it ended, and the holds in which it paused.
    fn walk_node_by_node(p: &Pool, name: &str, mut between: impl FnMut(u64)) -> (Walked, u64) {
        let (_, id) = p.lock_meta().catalog.snapshot_ids("v", name).unwrap();
        let mut w = {
            let m = p.lock_meta();
            let s = m.catalog.snapshot(id).unwrap();
            ExclusiveWalk::of_snapshot(id, s.root, s.levels)
        };
        let mut pauses = 0;
        loop {
            // A deadline already past: one node, then a pause.
            let r = p
                .lock_meta()
                .step_exclusive(&mut w, Some(std::time::Instant::now()))
                .unwrap();
            if r != Walked::Paused {
                return (r, pauses);
            }
            pauses += 1;
            between(pauses);
            // The listing reads ahead between holds: whatever the pool has
            // become meanwhile, a hint must not fail or change anything.
            let file = p.lock_meta().pool.clone();
            w.read_ahead(&*file);
        }
    }

    /// The exact footprint of snapshot `name` now, walked in one go with
    /// nothing beside and no cache.
    fn exact(p: &Pool, name: &str) -> (u64, u64) {
        let mut m = p.lock_meta();
        let (_, id) = m.catalog.snapshot_ids("v", name).unwrap();
        let s = m.catalog.snapshot(id).unwrap().clone();
        m.tree_exclusive(s.root, s.levels).unwrap()
    }

    /// A pool in memory whose reclaim runs only when a test asks.
    fn quiet_pool() -> Pool {
        let opts = PoolOptions {
            background: false,
            ..PoolOptions::default()
        };
        Pool::create(Arc::new(SimBackend::new()), opts).unwrap()
    }

    fn pool_with_history() -> (Pool, crate::Volume) {
        let p = quiet_pool();
        // 4,096 blocks: leaves under a root, a tree of two levels.
        p.create_volume("v", 16 << 20).unwrap();
        let v = p.open_volume("v").unwrap();
        for b in 0..4096u64 {
            v.write(b * BLOCK as u64, &[1; BLOCK]).unwrap();
        }
        for i in 0..4u64 {
            // Rewrites spread over every leaf, so that each snapshot holds
            // a copy of each leaf alone.
            for b in (i..4096).step_by(97) {
                v.write(b * BLOCK as u64, &[i as u8 + 2; BLOCK]).unwrap();
            }
            p.create_snapshot("v", &format!("s{i}"), &[]).unwrap();
        }
        (p, v)
    }

    #[test]
    fn a_walk_paused_at_every_node_counts_what_one_walk_counts() {
        let (p, v) = pool_with_history();
        for i in 0..3 {
            let name = format!("s{i}");
            let (r, pauses) = walk_node_by_node(&p, &name, |_| {});
            assert!(pauses >= 8, "{name}: {pauses} pauses");
            assert_eq!(r, Walked::Done(exact(&p, &name)), "{name}");
        }
        // s3 is the volume's base: it holds nothing alone until the volume
        // copies on write beside it.
        assert_eq!(exact(&p, "s3"), (0, 0));
        for b in [0u64, 600, 1200, 1800] {
            v.write(b * BLOCK as u64, &[8; BLOCK]).unwrap();
        }
        // More copies beside it between holds: its walk starts over, and
        // after MAX_RESTARTS runs to the end in one hold, still exact.
        let mut b = 2400u64;
        let (r, pauses) = walk_node_by_node(&p, "s3", |_| {
            b = (b + 509) % 4096;
            v.write(b * BLOCK as u64, &[9; BLOCK]).unwrap();
        });
        assert!(pauses >= 2, "{pauses} pauses");
        assert_eq!(r, Walked::Done(exact(&p, "s3")));
    }

    /// The snapshot beside a paused walk is deleted, its blocks reclaimed
    /// and written over: the walk still ends exact. (Its neighbour's nodes
    /// are looked up again in the tree beside it now; this test passes
    /// without that too, since here the walk starts over or the freed
    /// blocks read as before.)
    #[test]
    fn a_paused_walk_beside_a_reclaimed_neighbour_stays_exact() {
        let p = quiet_pool();
        p.create_volume("v", 16 << 20).unwrap();
        let v = p.open_volume("v").unwrap();
        let fill = |byte: u8| {
            for b in 0..4096u64 {
                v.write(b * BLOCK as u64, &[byte; BLOCK]).unwrap();
            }
        };
        // Every block rewritten between two snapshots: s2 shares nothing,
        // so deleting and reclaiming it changes no shared count (no restart).
        fill(1);
        p.create_snapshot("v", "s1", &[]).unwrap();
        fill(2);
        p.create_snapshot("v", "s2", &[]).unwrap();
        fill(3);
        p.create_snapshot("v", "s3", &[]).unwrap();
        fill(4);
        let (r, _) = walk_node_by_node(&p, "s1", |n| {
            if n == 1 {
                p.delete_snapshot("v", "s2").unwrap();
                p.reclaim_all().unwrap();
                // New blocks, some of them s2's freed nodes, now data.
                for _ in 0..3 {
                    fill(5);
                    p.create_snapshot("v", &format!("f{}", n), &[]).unwrap();
                    p.delete_snapshot("v", &format!("f{}", n)).unwrap();
                    p.reclaim_all().unwrap();
                }
            }
        });
        assert_eq!(r, Walked::Done(exact(&p, "s1")));
    }

    /// A file whose every block reads as a leaf full of block numbers near
    /// the largest, and which records the hints it is given.
    struct Crafted(std::sync::Mutex<Vec<u64>>);

    impl crate::storage::BlockFile for Crafted {
        fn path(&self) -> &std::path::Path {
            std::path::Path::new("crafted")
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            // Entries differ from block to block, so that a leaf and the one
            // beside it differ everywhere.
            for e in buf.chunks_mut(8) {
                e.copy_from_slice(&(u64::MAX ^ offset).to_le_bytes());
            }
            buf[..4].copy_from_slice(&crate::format::MAGIC_NODE.to_le_bytes());
            buf[24] = 0;
            Ok(())
        }
        fn write_at(&self, _buf: &[u8], _offset: u64) -> std::io::Result<()> {
            Ok(())
        }
        fn will_need(&self, offset: u64, _len: u64) {
            self.0.lock().unwrap().push(offset);
        }
        fn sync(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn punch(&self, _offset: u64, _len: u64) -> std::io::Result<()> {
            Ok(())
        }
        fn allocate(&self, _offset: u64, _len: u64) -> std::io::Result<()> {
            Ok(())
        }
        fn len(&self) -> std::io::Result<u64> {
            Ok(u64::MAX)
        }
        fn set_len(&self, _len: u64) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Read-ahead reads pages without checks: a page that says it is a leaf
    /// of block numbers past any pool (what a stale copy of a block a client
    /// once wrote could hold) gives no offset that overflows, and no panic.
    #[test]
    fn read_ahead_survives_pages_of_any_content() {
        let (p, _v) = pool_with_history();
        let (_, id) = p.lock_meta().catalog.snapshot_ids("v", "s1").unwrap();
        let mut w = {
            let m = p.lock_meta();
            let s = m.catalog.snapshot(id).unwrap();
            ExclusiveWalk::of_snapshot(id, s.root, s.levels)
        };
        let past = Some(std::time::Instant::now());
        // Paused after the root: its leaves are queued.
        assert_eq!(
            p.lock_meta().step_exclusive(&mut w, past).unwrap(),
            Walked::Paused
        );
        let file = Crafted(Default::default());
        w.read_ahead(&file);
        let hints = file.0.into_inner().unwrap();
        assert!(!hints.is_empty());
        assert!(hints.iter().all(|&o| o <= i64::MAX as u64), "{hints:?}");
    }

    /// Whatever happens between two holds (writes, snapshots made and
    /// deleted, reclaim reusing freed blocks, a clone), a walk ends with
    /// the exact footprint at its end, or as gone with its snapshot.
    #[test]
    fn a_paused_walk_ends_exact_whatever_changes_between_holds() {
        for seed in 0..12u64 {
            let (p, v) = pool_with_history();
            let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let walked = format!("s{}", next() % 4);
            let mut made = 4;
            let (r, _) = walk_node_by_node(&p, &walked, |_| {
                let names: Vec<String> = p
                    .list_snapshots("v")
                    .unwrap()
                    .into_iter()
                    .map(|s| s.name)
                    .collect();
                match next() % 6 {
                    0 | 1 => {
                        for _ in 0..next() % 40 {
                            let b = next() % 4096;
                            v.write(b * BLOCK as u64, &[next() as u8; BLOCK]).unwrap();
                        }
                    }
                    2 => {
                        p.create_snapshot("v", &format!("s{made}"), &[]).unwrap();
                        made += 1;
                    }
                    3 => {
                        let n = &names[(next() % names.len() as u64) as usize];
                        if names.len() > 1 && *n != walked {
                            p.delete_snapshot("v", n).unwrap();
                        }
                    }
                    4 => {
                        p.reclaim_all().unwrap();
                    }
                    _ => {
                        let n = &names[(next() % names.len() as u64) as usize];
                        let _ = p.clone_snapshot("v", n, &format!("c{made}"));
                        made += 1;
                    }
                }
            });
            assert_eq!(r, Walked::Done(exact(&p, &walked)), "seed {seed}, {walked}");
            for s in p.list_snapshots("v").unwrap() {
                let walked = p.usage("v", Some(&s.name)).unwrap().exclusive_bytes;
                assert_eq!(s.exclusive_bytes, walked, "seed {seed}, {}", s.name);
                assert_eq!(s.exclusive_bytes, exact(&p, &s.name).1 * BLOCK as u64);
            }
        }
    }

    #[test]
    fn a_walk_whose_snapshot_is_deleted_ends_as_gone_and_one_shared_again_starts_over() {
        let (p, _v) = pool_with_history();
        let (r, _) = walk_node_by_node(&p, "s1", |n| {
            if n == 3 {
                p.delete_snapshot("v", "s1").unwrap();
            }
        });
        assert_eq!(r, Walked::Gone);
        // A linked clone of s2 midway shares its tree: what it held alone
        // is now held by two, and the walk must see that, not its old counts.
        let (r, _) = walk_node_by_node(&p, "s2", |n| {
            if n == 3 {
                p.clone_snapshot("v", "s2", "c").unwrap();
            }
        });
        assert_eq!(r, Walked::Done((0, 0)));
        assert_eq!(exact(&p, "s2"), (0, 0));
    }

    #[test]
    fn a_volume_writing_beside_its_base_leaves_older_snapshots_sizes_cached() {
        let p = quiet_pool();
        p.create_volume("v", 64 << 20).unwrap();
        let v = p.open_volume("v").unwrap();
        for i in 0..5u8 {
            v.write(u64::from(i) * BLOCK as u64, &[i + 1; BLOCK])
                .unwrap();
            p.create_snapshot("v", &format!("s{i}"), &[]).unwrap();
        }
        let ids: HashMap<String, u64> = p
            .list_snapshots("v")
            .unwrap()
            .into_iter()
            .map(|s| (s.name, s.id))
            .collect();
        assert!(cached(&p, &ids).values().all(|&c| c));
        // Copies on write beside s4, the base: only s4's size goes.
        v.write(0, &[9; BLOCK]).unwrap();
        v.write(4 * BLOCK as u64, &[9; BLOCK]).unwrap();
        let c = cached(&p, &ids);
        for i in 0..4 {
            assert!(c[&format!("s{i}")], "s{i}: {c:?}");
        }
        assert!(!c["s4"], "{c:?}");
        // A new snapshot changes no other snapshot's size either.
        p.list_snapshots("v").unwrap();
        p.create_snapshot("v", "s5", &[]).unwrap();
        assert!(cached(&p, &ids).values().all(|&c| c));
        // A linked clone shares s2's root: every size is looked at again.
        p.clone_snapshot("v", "s2", "c").unwrap();
        assert!(cached(&p, &ids).values().all(|&c| !c));
        for s in p.list_snapshots("v").unwrap() {
            let walked = p.usage("v", Some(&s.name)).unwrap().exclusive_bytes;
            assert_eq!(s.exclusive_bytes, walked, "{}", s.name);
        }
    }
}
