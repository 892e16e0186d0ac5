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

impl Meta {
    /// Blocks referenced by this tree and by nothing else (its exclusive
    /// footprint), counting nodes and data separately. Shared subtrees are
    /// not entered, so this costs only the exclusive part.
    pub fn tree_exclusive(&mut self, root: u64, levels: u8) -> Result<(u64, u64)> {
        self.tree_exclusive_beside(root, levels, None)
    }

    /// [`Meta::tree_exclusive`], walked beside another tree of the same
    /// height (`beside`: its root). An entry equal to the other tree's at
    /// the same place is shared without asking its refcount: every node the
    /// walk enters has one parent, so the other tree's node there is a
    /// different one, and a block two nodes point at has two references.
    /// Only the entries that differ cost a refcount read. Beside a
    /// neighbour in the same history (the next snapshot, or the volume after
    /// its last one) that is the few blocks rewritten between the two, not
    /// every entry of every leaf the two no longer share. The result is the
    /// same whichever tree is beside, or none.
    fn tree_exclusive_beside(
        &mut self,
        root: u64,
        levels: u8,
        beside: Option<u64>,
    ) -> Result<(u64, u64)> {
        if root == 0 || self.rc(root)? != 1 {
            return Ok((0, 0));
        }
        let mut counts = (0u64, 0u64);
        self.exclusive_rec(root, beside.unwrap_or(0), levels - 1, &mut counts)?;
        Ok(counts)
    }

    /// The tree snapshot `id`'s exclusive walk goes beside: its volume's
    /// next snapshot, or the live volume after the last one, if of the same
    /// height (a volume grown since has a taller tree).
    fn neighbour(&self, id: u64, levels: u8) -> Option<u64> {
        let vol = self.catalog.snapshot(id)?.volume;
        let (root, l) = match self.catalog.next_snapshot_of(vol, id) {
            Some(n) => (n.root, n.levels),
            None => match self.catalog.get(vol)? {
                Record::Volume(v) => (v.root, v.levels),
                Record::Snapshot(_) => return None,
            },
        };
        (root != 0 && l == levels).then_some(root)
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
    /// while the sharing generation has not moved (see `shared_gen`).
    pub fn snapshot_exclusive(&mut self, id: u64, root: u64, levels: u8) -> Result<(u64, u64)> {
        if let Some(counts) = self.cached_exclusive(id) {
            return Ok(counts);
        }
        tracing::trace!(
            snapshot = id,
            shared_gen = self.shared_gen,
            "exclusive size walked"
        );
        let beside = self.neighbour(id, levels);
        let counts = self.tree_exclusive_beside(root, levels, beside)?;
        // Entries of deleted snapshots are dropped once they could be half
        // the cache (the bound is O(1): this runs for every snapshot listed).
        if self.exclusive_cache.len() > 2 * self.catalog.record_count() + 64 {
            let catalog = &self.catalog;
            self.exclusive_cache
                .retain(|id, _| catalog.snapshot(*id).is_some());
        }
        self.exclusive_cache.insert(id, (self.shared_gen, counts));
        Ok(counts)
    }

    /// A node's non-empty entries, each with its refcount.
    fn children_rc(&mut self, b: u64, level: u8) -> Result<(Vec<u64>, Vec<u32>)> {
        let entries = self.node_entries(b, level)?;
        let children: Vec<u64> = entries.iter().copied().filter(|&e| e != 0).collect();
        let mut rcs = Vec::with_capacity(children.len());
        self.rc_many(&children, &mut rcs)?;
        Ok((children, rcs))
    }

    /// Count node `b` (at `level`, held by one parent alone) and what under
    /// it only it holds; `other` is the node at the same place in the tree
    /// walked beside (0: none).
    fn exclusive_rec(
        &mut self,
        b: u64,
        other: u64,
        level: u8,
        counts: &mut (u64, u64),
    ) -> Result<()> {
        debug_assert_ne!(b, other, "a node with one parent is in one tree");
        counts.0 += 1;
        let entries = self.node_entries(b, level)?;
        let beside = match other {
            0 => None,
            o => Some(self.node_entries(o, level)?),
        };
        let mut children = Vec::new();
        let mut others = Vec::new();
        for (i, &e) in entries.iter().enumerate() {
            let o = beside.as_ref().map_or(0, |x| x[i]);
            if e != 0 && e != o {
                children.push(e);
                others.push(o);
            }
        }
        let mut rcs = Vec::with_capacity(children.len());
        self.rc_many(&children, &mut rcs)?;
        for ((&e, &o), &rc) in children.iter().zip(&others).zip(&rcs) {
            if rc != 1 {
                continue;
            }
            if level == 0 {
                counts.1 += 1;
            } else {
                self.exclusive_rec(e, o, level - 1, counts)?;
            }
        }
        Ok(())
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
            let vid = m.catalog.volume_id(volume)?;
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

    fn freed((nodes, data): (u64, u64)) -> Freed {
        Freed {
            data_bytes: data * BLOCK as u64,
            metadata_bytes: nodes * BLOCK as u64,
        }
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn a_volume_writing_beside_its_base_leaves_older_snapshots_sizes_cached() {
        let opts = PoolOptions {
            background: false,
            ..PoolOptions::default()
        };
        let p = Pool::create(Arc::new(SimBackend::new()), opts).unwrap();
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
