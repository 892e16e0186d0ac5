//! The copy-on-write radix tree that maps a volume's block index to a data
//! block: one flattened index per volume or snapshot, so a lookup costs the
//! tree's height whatever the number of snapshots. Sharing uses lazy
//! refcounts: a snapshot or clone takes one reference on the root; a node is
//! copied ("shadowed") only when a write reaches it while it is shared, and
//! the copy takes a reference on each child. Freeing walks only nodes whose
//! count reaches zero, so it costs what it frees.

use crate::error::{Error, Result};
use crate::format::*;
use crate::meta::Meta;

/// Blocks covered by one entry of a node at `level`.
pub fn span(level: u8) -> u64 {
    (FANOUT as u64).pow(level as u32)
}

/// Tree height needed to address `blocks` blocks.
pub fn levels_for(blocks: u64) -> u8 {
    let mut l = 1;
    while span(l) < blocks {
        l += 1;
    }
    l
}

pub(crate) fn slot(idx: u64, level: u8) -> usize {
    ((idx / span(level)) % FANOUT as u64) as usize
}

/// A subtree seen at a level: a real node of `level`, or (when `level` is
/// lower than the level it is viewed at) an older, shorter tree that an
/// expansion placed at index 0.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Sub {
    block: u64,
    level: u8,
}

impl Meta {
    pub(crate) fn node_entries(&mut self, block: u64, level: u8) -> Result<Box<[u64; FANOUT]>> {
        let p = self.page(block, MAGIC_NODE)?;
        if node::level(p) != level {
            return Err(Error::corrupt(
                block,
                format!(
                    "node of level {} where level {level} was expected",
                    node::level(p)
                ),
            ));
        }
        let mut e = Box::new([0u64; FANOUT]);
        for (i, v) in e.iter_mut().enumerate() {
            *v = node::entry(p, i);
        }
        Ok(e)
    }

    /// The value at `idx`: a data block, or 0 for unmapped.
    pub fn tree_lookup(&mut self, root: u64, levels: u8, idx: u64) -> Result<u64> {
        let mut b = root;
        for l in (0..levels).rev() {
            if b == 0 {
                return Ok(0);
            }
            let p = self.page(b, MAGIC_NODE)?;
            if node::level(p) != l {
                return Err(Error::corrupt(b, "node level does not match its depth"));
            }
            b = node::entry(p, slot(idx, l));
        }
        Ok(b)
    }

    /// The leaf node holding `idx` (0 if none) and whether the path to it
    /// (leaf included) is referenced only once, i.e. writable in place.
    /// With `check` false, exclusivity is not computed (and reported true).
    pub fn tree_leaf(
        &mut self,
        root: u64,
        levels: u8,
        idx: u64,
        check: bool,
    ) -> Result<(u64, bool)> {
        let mut b = root;
        let mut exclusive = true;
        for l in (0..levels).rev() {
            if b == 0 {
                return Ok((0, exclusive));
            }
            if check {
                exclusive &= self.rc(b)? == 1;
            }
            if l == 0 {
                break;
            }
            let p = self.page(b, MAGIC_NODE)?;
            if node::level(p) != l {
                return Err(Error::corrupt(b, "node level does not match its depth"));
            }
            b = node::entry(p, slot(idx, l));
        }
        Ok((b, exclusive))
    }

    /// Data blocks of `n` consecutive indexes from `first` (0 = unmapped).
    pub fn map_range(&mut self, root: u64, levels: u8, first: u64, n: u64) -> Result<Vec<u64>> {
        let mut out = Vec::with_capacity(n as usize);
        let end = first + n;
        let mut idx = first;
        while idx < end {
            let leaf_end = end.min((idx / FANOUT as u64 + 1) * FANOUT as u64);
            let (leaf, _) = self.tree_leaf(root, levels, idx, false)?;
            if leaf == 0 {
                out.extend(std::iter::repeat_n(0, (leaf_end - idx) as usize));
            } else {
                let p = self.page(leaf, MAGIC_NODE)?;
                out.extend((idx..leaf_end).map(|i| node::entry(p, (i % FANOUT as u64) as usize)));
            }
            idx = leaf_end;
        }
        Ok(out)
    }

    /// Entry `i` of leaf node `leaf`.
    pub fn leaf_entry(&mut self, leaf: u64, i: usize) -> Result<u64> {
        Ok(node::entry(self.page(leaf, MAGIC_NODE)?, i))
    }

    /// Make a node writable: if shared, copy it, give the copy's children a
    /// reference each, and drop one reference on the original.
    fn make_exclusive(&mut self, b: u64) -> Result<u64> {
        if self.rc(b)? == 1 {
            return Ok(b);
        }
        let src = Box::new(*self.page(b, MAGIC_NODE)?);
        let level = node::level(&src);
        let nb = self.alloc_node(level)?;
        let children: Vec<u64> = (0..FANOUT)
            .map(|i| node::entry(&src, i))
            .filter(|&e| e != 0)
            .collect();
        self.incref_many(&children)?;
        let dst = self.page_mut(nb, MAGIC_NODE)?;
        dst[HEADER..].copy_from_slice(&src[HEADER..]);
        self.decref(b)?;
        Ok(nb)
    }

    /// Set the value at `idx`, shadowing shared nodes on the way; returns the
    /// old value, whose reference now belongs to the caller.
    pub fn tree_set(&mut self, root: &mut u64, levels: u8, idx: u64, value: u64) -> Result<u64> {
        if *root == 0 {
            if value == 0 {
                return Ok(0);
            }
            *root = self.alloc_node(levels - 1)?;
        } else {
            *root = self.make_exclusive(*root)?;
        }
        let mut b = *root;
        for l in (1..levels).rev() {
            let s = slot(idx, l);
            let p = self.page(b, MAGIC_NODE)?;
            if node::level(p) != l {
                return Err(Error::corrupt(b, "node level does not match its depth"));
            }
            let child = node::entry(p, s);
            let nc = if child == 0 {
                if value == 0 {
                    return Ok(0);
                }
                self.alloc_node(l - 1)?
            } else {
                self.make_exclusive(child)?
            };
            if nc != child {
                node::set_entry(self.page_mut(b, MAGIC_NODE)?, s, nc);
            }
            b = nc;
        }
        let p = self.page_mut(b, MAGIC_NODE)?;
        let s = slot(idx, 0);
        let old = node::entry(p, s);
        node::set_entry(p, s, value);
        Ok(old)
    }

    /// Drop one reference on a node (`is_node`) or data block; a node that
    /// reaches zero goes on the dead list for reclaim, a data block is freed.
    pub fn release_block(&mut self, b: u64, is_node: bool) -> Result<()> {
        if self.decref(b)? != 0 {
            return Ok(());
        }
        if is_node {
            let head = self.sb.dead_head;
            node::set_next_dead(self.page_mut(b, MAGIC_NODE)?, head);
            self.set_rc(b, RC_DEAD)?;
            self.sb.dead_head = b;
            self.sb_dirty = true;
        } else {
            self.free(b);
        }
        Ok(())
    }

    /// Drop a root's reference.
    pub fn release_root(&mut self, root: u64) -> Result<()> {
        if root != 0 {
            self.release_block(root, true)?;
        }
        Ok(())
    }

    /// Reclaim up to `budget` dead nodes; returns how many were reclaimed.
    pub fn reclaim(&mut self, budget: usize) -> Result<usize> {
        let mut n = 0;
        while n < budget && self.sb.dead_head != 0 {
            let b = self.sb.dead_head;
            if self.rc(b)? != RC_DEAD {
                return Err(Error::corrupt(
                    b,
                    "node on the dead list is not marked dead",
                ));
            }
            let p = self.page(b, MAGIC_NODE)?;
            let (next, level) = (node::next_dead(p), node::level(p));
            let entries = self.node_entries(b, level)?;
            self.sb.dead_head = next;
            self.sb_dirty = true;
            for &e in entries.iter().filter(|&&e| e != 0) {
                self.release_block(e, level > 0)?;
            }
            self.set_rc(b, 0)?;
            self.free(b);
            n += 1;
        }
        Ok(n)
    }

    /// Every (index, value) with a non-zero value, in index order.
    pub fn tree_entries(&mut self, root: u64, levels: u8) -> Result<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        self.tree_walk(root, levels, 0, u64::MAX, &mut |i, v| out.push((i, v)))?;
        Ok(out)
    }

    /// Visit non-zero values with index in [lo, hi), in order.
    pub fn tree_walk(
        &mut self,
        root: u64,
        levels: u8,
        lo: u64,
        hi: u64,
        f: &mut dyn FnMut(u64, u64),
    ) -> Result<()> {
        if root != 0 {
            self.walk_rec(root, levels - 1, 0, lo, hi, f)?;
        }
        Ok(())
    }

    fn walk_rec(
        &mut self,
        b: u64,
        level: u8,
        base: u64,
        lo: u64,
        hi: u64,
        f: &mut dyn FnMut(u64, u64),
    ) -> Result<()> {
        let entries = self.node_entries(b, level)?;
        let sp = span(level);
        for (i, &e) in entries.iter().enumerate() {
            let start = base + i as u64 * sp;
            if e == 0 || start.saturating_add(sp) <= lo || start >= hi {
                continue;
            }
            if level == 0 {
                f(start, e);
            } else {
                self.walk_rec(e, level - 1, start, lo, hi, f)?;
            }
        }
        Ok(())
    }

    fn sub_entries(&mut self, s: Sub, level: u8) -> Result<Box<[u64; FANOUT]>> {
        if s.block == 0 {
            return Ok(Box::new([0; FANOUT]));
        }
        if s.level == level {
            return self.node_entries(s.block, level);
        }
        // A shorter tree lifted to this level: it sits at index 0.
        let mut e = Box::new([0u64; FANOUT]);
        e[0] = s.block;
        Ok(e)
    }

    fn child(s: Sub, level: u8, e: u64) -> Sub {
        if s.level == level {
            Sub {
                block: e,
                level: level.saturating_sub(1),
            }
        } else {
            Sub {
                block: e,
                level: s.level,
            }
        }
    }

    /// Compare two trees (heights may differ) over [lo, hi). Calls `f(index,
    /// a, b)` for every leaf slot where the values differ and, with
    /// `want_equal`, where they are equal and non-zero. Identical subtrees
    /// are skipped unless `want_equal`, so a diff costs what changed.
    #[allow(clippy::too_many_arguments)]
    pub fn tree_compare(
        &mut self,
        (ra, la): (u64, u8),
        (rb, lb): (u64, u8),
        lo: u64,
        hi: u64,
        want_equal: bool,
        f: &mut dyn FnMut(u64, u64, u64),
    ) -> Result<()> {
        let top = la.max(lb) - 1;
        let a = Sub {
            block: ra,
            level: la - 1,
        };
        let b = Sub {
            block: rb,
            level: lb - 1,
        };
        self.compare_rec(a, b, top, 0, lo, hi, want_equal, f)
    }

    #[allow(clippy::too_many_arguments)]
    fn compare_rec(
        &mut self,
        a: Sub,
        b: Sub,
        level: u8,
        base: u64,
        lo: u64,
        hi: u64,
        want_equal: bool,
        f: &mut dyn FnMut(u64, u64, u64),
    ) -> Result<()> {
        if a == b && (!want_equal || a.block == 0) {
            return Ok(());
        }
        let ea = self.sub_entries(a, level)?;
        let eb = self.sub_entries(b, level)?;
        let sp = span(level);
        for i in 0..FANOUT {
            let start = base + i as u64 * sp;
            if start.saturating_add(sp) <= lo || start >= hi {
                continue;
            }
            let (va, vb) = (ea[i], eb[i]);
            if level == 0 {
                if va != vb || (want_equal && va != 0) {
                    f(start, va, vb);
                }
            } else if va != 0 || vb != 0 {
                let ca = Self::child(a, level, va);
                let cb = Self::child(b, level, vb);
                self.compare_rec(ca, cb, level - 1, start, lo, hi, want_equal, f)?;
            }
        }
        Ok(())
    }

    /// Raise a tree's height so it covers `blocks` (volume expansion): new
    /// roots are stacked on top with the old root at index 0.
    pub fn tree_grow(&mut self, root: &mut u64, levels: &mut u8, blocks: u64) -> Result<()> {
        let want = levels_for(blocks);
        if want > MAX_LEVELS {
            return Err(Error::InvalidArgument(format!(
                "{blocks} blocks exceed the largest volume"
            )));
        }
        while *levels < want {
            if *root != 0 {
                let top = self.alloc_node(*levels)?;
                node::set_entry(self.page_mut(top, MAGIC_NODE)?, 0, *root);
                *root = top;
            }
            *levels += 1;
        }
        Ok(())
    }
}
