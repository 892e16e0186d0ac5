//! A bounded cache of metadata pages with CLOCK eviction. Dirty pages (changed
//! since the last commit) stay pinned until a commit writes them to the
//! write-ahead log; clean pages are dropped freely, since the log or the
//! pool file holds them. Memory stays bounded by `capacity` pages plus the
//! dirty pages of one transaction, whatever the size of the volumes.

use crate::format::Page;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes a block number for the cache's index. The default SipHash showed
/// up at about 3% of the daemon's time on the I/O path; block numbers come
/// from the pool's own index, never from a client, so resistance to chosen
/// keys buys nothing here. One multiply and a fold spread the bits.
#[derive(Default)]
pub struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b) ^ self.0.rotate_left(8));
        }
    }

    fn write_u64(&mut self, x: u64) {
        let h = (x ^ (x >> 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 29);
    }
}

type BlockMap<V> = HashMap<u64, V, BuildHasherDefault<BlockHasher>>;

struct Slot {
    block: u64,
    page: Box<Page>,
    /// 0 when clean; otherwise the modification sequence of the last change.
    dirty_seq: u64,
    referenced: bool,
}

/// The fewest pages a cache holds, whatever capacity it is given.
pub(crate) const MIN_PAGES: usize = 64;

pub struct Cache {
    index: BlockMap<usize>,
    slots: Vec<Slot>,
    hand: usize,
    capacity: usize,
    dirty: usize,
    seq: u64,
    /// Set by every change (a page made dirty, inserted dirty or
    /// forgotten); the metadata's journal bookkeeping clears it
    /// (`Meta::note_untracked`).
    pub touched: bool,
}

impl Cache {
    pub fn new(capacity: usize) -> Self {
        Cache {
            index: BlockMap::default(),
            slots: Vec::new(),
            hand: 0,
            capacity: capacity.max(MIN_PAGES),
            dirty: 0,
            seq: 0,
            touched: false,
        }
    }

    pub fn dirty_count(&self) -> usize {
        self.dirty
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn get(&mut self, block: u64) -> Option<&Page> {
        let i = *self.index.get(&block)?;
        let s = &mut self.slots[i];
        s.referenced = true;
        Some(&s.page)
    }

    /// A page to change; it becomes dirty.
    pub fn get_mut(&mut self, block: u64) -> Option<&mut Page> {
        let i = *self.index.get(&block)?;
        self.touched = true;
        self.seq += 1;
        let s = &mut self.slots[i];
        if s.dirty_seq == 0 {
            self.dirty += 1;
        }
        s.dirty_seq = self.seq;
        s.referenced = true;
        Some(&mut s.page)
    }

    /// Insert a page read from disk (clean) or freshly made (dirty).
    pub fn insert(&mut self, block: u64, page: Box<Page>, dirty: bool) {
        let dirty_seq = if dirty {
            self.touched = true;
            self.seq += 1;
            self.dirty += 1;
            self.seq
        } else {
            0
        };
        if let Some(&i) = self.index.get(&block) {
            let s = &mut self.slots[i];
            if s.dirty_seq != 0 {
                self.dirty -= 1;
            }
            s.page = page;
            s.dirty_seq = dirty_seq;
            return;
        }
        let slot = Slot {
            block,
            page,
            dirty_seq,
            referenced: true,
        };
        if self.slots.len() < self.capacity {
            self.index.insert(block, self.slots.len());
            self.slots.push(slot);
            return;
        }
        // CLOCK: two sweeps at most find a clean, unreferenced page.
        let n = self.slots.len();
        for _ in 0..2 * n {
            let i = self.hand;
            self.hand = (self.hand + 1) % n;
            let s = &mut self.slots[i];
            if s.dirty_seq != 0 {
                continue;
            }
            if s.referenced {
                s.referenced = false;
                continue;
            }
            self.index.remove(&s.block);
            self.index.insert(block, i);
            self.slots[i] = slot;
            return;
        }
        // Everything is dirty: grow past the capacity until the next commit.
        self.index.insert(block, self.slots.len());
        self.slots.push(slot);
    }

    /// Drop a page from the cache (its block was freed).
    pub fn forget(&mut self, block: u64) {
        self.touched = true;
        if let Some(&i) = self.index.get(&block) {
            let s = &mut self.slots[i];
            if s.dirty_seq != 0 {
                s.dirty_seq = 0;
                self.dirty -= 1;
            }
            // Leave the slot in place but unreachable; it will be reused.
            self.index.remove(&block);
            s.block = u64::MAX;
            s.referenced = false;
        }
    }

    /// Every dirty page: (block, modification sequence, a copy of the page).
    pub fn dirty_pages(&self) -> Vec<(u64, u64, Box<Page>)> {
        self.slots
            .iter()
            .filter(|s| s.dirty_seq != 0 && s.block != u64::MAX)
            .map(|s| (s.block, s.dirty_seq, s.page.clone()))
            .collect()
    }

    /// Mark pages clean after a commit, unless changed again since.
    pub fn mark_clean(&mut self, pages: &[(u64, u64)]) {
        for &(block, seq) in pages {
            if let Some(&i) = self.index.get(&block) {
                let s = &mut self.slots[i];
                if s.dirty_seq == seq {
                    s.dirty_seq = 0;
                    self.dirty -= 1;
                }
            }
        }
        // Shrink back toward the capacity once pages are clean again.
        while self.slots.len() > self.capacity {
            let last = self.slots.len() - 1;
            if self.slots[last].dirty_seq != 0 {
                break;
            }
            let b = self.slots[last].block;
            if b != u64::MAX {
                self.index.remove(&b);
            }
            self.slots.pop();
            if self.hand >= self.slots.len() {
                self.hand = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::new_page;

    #[test]
    fn evicts_clean_keeps_dirty() {
        let mut c = Cache::new(64);
        for b in 0..64 {
            c.insert(b, new_page(), b < 10);
        }
        for b in 64..200 {
            c.insert(b, new_page(), false);
        }
        assert!(c.len() <= 64);
        for b in 0..10 {
            assert!(c.get(b).is_some(), "dirty page {b} evicted");
        }
        let d: Vec<_> = c.dirty_pages().iter().map(|(b, s, _)| (*b, *s)).collect();
        assert_eq!(d.len(), 10);
        c.get_mut(3).unwrap()[0] = 1; // changed again after collection
        c.mark_clean(&d);
        assert_eq!(c.dirty_count(), 1);
    }
}
