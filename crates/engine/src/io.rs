//! The I/O path: reads, writes, write-zeroes and trim at any byte offset and
//! length, on a handle to a volume (read-write) or a snapshot (read-only).
//!
//! A write to a block that the volume alone references goes in place. A
//! write to an unmapped or shared block goes to a newly reserved block,
//! written before the index points at it, so a crash never exposes a block
//! whose data was not written. Unaligned writes read, merge and write the
//! whole block under the block's stripe lock.

use crate::error::{Error, Result};
use crate::format::*;
use crate::journal::Op;
use crate::meta::Meta;
use crate::pool::Pool;
use std::sync::{Arc, RwLock};

/// Most whole blocks one index pass of a write covers (1 MiB).
const RUN: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Volume,
    Snapshot,
}

/// An open volume or snapshot. Cheap to clone; many may be open at once.
#[derive(Clone)]
pub struct Volume {
    pub(crate) pool: Pool,
    pub(crate) id: u64,
    name: String,
    kind: Kind,
    pub(crate) gate: Arc<RwLock<()>>,
}

enum Plan {
    Nothing,
    InPlace(u64),
    New { old: u64, new: u64 },
}

impl Pool {
    /// Open a volume for I/O.
    pub fn open_volume(&self, name: &str) -> Result<Volume> {
        let id = self.lock_meta().catalog.volume_id(name)?;
        Ok(Volume {
            pool: self.clone(),
            id,
            name: name.to_string(),
            kind: Kind::Volume,
            gate: self.gate(id),
        })
    }

    /// Open a snapshot for reading.
    pub fn open_snapshot(&self, volume: &str, snapshot: &str) -> Result<Volume> {
        let (_, id) = self.lock_meta().catalog.snapshot_ids(volume, snapshot)?;
        Ok(Volume {
            pool: self.clone(),
            id,
            name: format!("{volume}@{snapshot}"),
            kind: Kind::Snapshot,
            gate: self.gate(id),
        })
    }

    /// Write `part` at byte `at` of block `idx` of volume `id`.
    pub(crate) fn write_block(&self, id: u64, idx: u64, part: &[u8], at: usize) -> Result<()> {
        let _s = self.stripe(id, idx);
        let zero = part.iter().all(|&b| b == 0);
        let plan = self.with_meta(|m| {
            let (root, levels) = vol_root(m, id)?;
            let (leaf, excl) = m.tree_leaf(root, levels, idx, true)?;
            let cur = if leaf == 0 {
                0
            } else {
                m.leaf_entry(leaf, (idx % FANOUT as u64) as usize)?
            };
            if cur == 0 && zero {
                Ok(Plan::Nothing)
            } else if cur != 0 && excl && m.rc(cur)? == 1 {
                Ok(Plan::InPlace(cur))
            } else {
                Ok(Plan::New {
                    old: cur,
                    new: m.reserve_data()?,
                })
            }
        })?;
        match plan {
            Plan::Nothing => Ok(()),
            Plan::InPlace(b) => self.data_write(part, b * BLOCK as u64 + at as u64),
            Plan::New { old, new } => {
                let mut buf;
                let data = if part.len() == BLOCK {
                    part
                } else {
                    buf = vec![0u8; BLOCK];
                    if old != 0 {
                        self.data_read(&mut buf, old * BLOCK as u64)?;
                    }
                    buf[at..at + part.len()].copy_from_slice(part);
                    &buf[..]
                };
                self.cow_install(id, idx, new, data)
            }
        }
    }

    /// Write whole blocks `first..` of volume `id` from `data` with as few
    /// data writes as the layout allows, when every block of the run goes
    /// in place (exclusive to the volume) or every block is new (unmapped,
    /// not all zeros): one index pass and one write per physically
    /// contiguous stretch instead of one of each per block. `Ok(false)`
    /// (nothing done) for a mixed run, which the caller writes block by
    /// block. With `bulk`, new blocks are written as bulk data
    /// ([`crate::storage::BlockFile::write_bulk`]).
    pub(crate) fn write_run(&self, id: u64, first: u64, data: &[u8], bulk: bool) -> Result<bool> {
        let n = data.len() / BLOCK;
        let _s = self.stripes(id, first, n as u64);
        let plan = self.with_meta(|m| {
            let (root, levels) = vol_root(m, id)?;
            let mut cur = Vec::with_capacity(n);
            let mut in_place = true;
            for idx in first..first + n as u64 {
                let (leaf, excl) = m.tree_leaf(root, levels, idx, true)?;
                let c = if leaf == 0 {
                    0
                } else {
                    m.leaf_entry(leaf, (idx % FANOUT as u64) as usize)?
                };
                in_place &= c != 0 && excl && m.rc(c)? == 1;
                cur.push(c);
            }
            if in_place {
                return Ok(Some((cur, false)));
            }
            let fresh = cur.iter().all(|&c| c == 0)
                && data.chunks(BLOCK).all(|b| b.iter().any(|&x| x != 0));
            if !fresh {
                return Ok(None);
            }
            let mut new = Vec::with_capacity(n);
            for _ in 0..n {
                match m.reserve_data() {
                    Ok(b) => new.push(b),
                    Err(e) => {
                        new.iter().for_each(|&b| m.unreserve(b));
                        return Err(e);
                    }
                }
            }
            Ok(Some((new, true)))
        })?;
        let Some((blocks, fresh)) = plan else {
            return Ok(false);
        };
        let mut i = 0;
        while i < n {
            let mut j = i + 1;
            while j < n && blocks[j] == blocks[j - 1] + 1 {
                j += 1;
            }
            let (buf, at) = (&data[i * BLOCK..j * BLOCK], blocks[i] * BLOCK as u64);
            if let Err(e) = self.data_write_to(buf, at, bulk && fresh) {
                if fresh {
                    let mut m = self.lock_meta();
                    blocks.iter().for_each(|&b| m.unreserve(b));
                }
                return Err(e);
            }
            i = j;
        }
        if !fresh {
            return Ok(true);
        }
        self.with_meta(|m| Self::install_journaled(m, id, first, &blocks))?;
        Ok(true)
    }

    /// [`Pool::install_run`] as a journalled change: one `Map` record per
    /// run of consecutive data blocks. Replaying the journal calls it too.
    pub(crate) fn install_journaled(
        m: &mut crate::meta::Meta,
        id: u64,
        first: u64,
        blocks: &[u64],
    ) -> Result<()> {
        m.journaled(|m| {
            m.charged_to_volume(id, |m| Self::install_run(m, id, first, blocks))?;
            let mut ops = Vec::new();
            let mut i = 0;
            while i < blocks.len() {
                let mut j = i + 1;
                while j < blocks.len() && blocks[j] == blocks[j - 1] + 1 {
                    j += 1;
                }
                ops.push(Op::Map {
                    vol: id,
                    first: first + i as u64,
                    n: (j - i) as u32,
                    block: blocks[i],
                });
                i = j;
            }
            Ok(((), ops))
        })
    }

    /// Point blocks `first..` of volume `id` at the fresh data blocks
    /// `blocks` ([`Pool::write_run`]); on an error the blocks not yet
    /// installed are released.
    fn install_run(m: &mut crate::meta::Meta, id: u64, first: u64, blocks: &[u64]) -> Result<()> {
        for (k, &b) in blocks.iter().enumerate() {
            let installed = vol_root(m, id).and_then(|(mut root, levels)| {
                let r = m.tree_set(&mut root, levels, first + k as u64, b);
                if root != m.catalog.volume(id).root {
                    m.catalog.volume_mut(id).root = root;
                }
                r
            });
            let old = match installed {
                Ok(o) => o,
                Err(e) => {
                    blocks[k..].iter().for_each(|&b| m.unreserve(b));
                    return Err(e);
                }
            };
            m.install_data(b)?;
            if old != 0 {
                // Not expected (the stripes keep the run unmapped), but
                // never leak a block.
                m.release_block(old, false)?;
            } else {
                m.catalog.volume_mut(id).mapped += 1;
            }
        }
        Ok(())
    }

    /// Give block `idx` of volume `id` a private copy if it shares it (flatten).
    pub(crate) fn unshare_block(&self, id: u64, idx: u64) -> Result<bool> {
        let _s = self.stripe(id, idx);
        let plan = self.with_meta(|m| {
            let (root, levels) = vol_root(m, id)?;
            let (leaf, excl) = m.tree_leaf(root, levels, idx, true)?;
            let cur = if leaf == 0 {
                0
            } else {
                m.leaf_entry(leaf, (idx % FANOUT as u64) as usize)?
            };
            if cur == 0 || (excl && m.rc(cur)? == 1) {
                Ok(Plan::Nothing)
            } else {
                Ok(Plan::New {
                    old: cur,
                    new: m.reserve_data()?,
                })
            }
        })?;
        let Plan::New { old, new } = plan else {
            return Ok(false);
        };
        let mut buf = vec![0u8; BLOCK];
        if let Err(e) = self.data_read(&mut buf, old * BLOCK as u64) {
            self.lock_meta().unreserve(new);
            return Err(e);
        }
        self.cow_install(id, idx, new, &buf)?;
        Ok(true)
    }

    /// Write a full block to a reserved block, then point the index at it.
    fn cow_install(&self, id: u64, idx: u64, new: u64, data: &[u8]) -> Result<()> {
        if let Err(e) = self.data_write(data, new * BLOCK as u64) {
            self.lock_meta().unreserve(new);
            return Err(e);
        }
        self.with_meta(|m| Self::install_journaled(m, id, idx, &[new]))
    }

    /// Unmap whole block `idx` of volume `id`.
    fn unmap_block(&self, id: u64, idx: u64) -> Result<()> {
        let _s = self.stripe(id, idx);
        self.with_meta(|m| Self::unmap_journaled(m, id, idx))
    }

    /// Unmap block `idx` of volume `id` as a journalled change (an `Unmap`
    /// record if it was mapped). Replaying the journal calls it too.
    pub(crate) fn unmap_journaled(m: &mut crate::meta::Meta, id: u64, idx: u64) -> Result<()> {
        let (mut root, levels) = vol_root(m, id)?;
        if m.tree_lookup(root, levels, idx)? == 0 {
            return Ok(());
        }
        m.journaled(|m| {
            m.charged_to_volume(id, |m| {
                let r = m.tree_set(&mut root, levels, idx, 0);
                if root != m.catalog.volume(id).root {
                    m.catalog.volume_mut(id).root = root;
                }
                let old = r?;
                if old != 0 {
                    m.catalog.volume_mut(id).mapped -= 1;
                    m.release_block(old, false)?;
                }
                Ok(())
            })?;
            Ok(((), vec![Op::Unmap { vol: id, idx }]))
        })
    }

    /// Write data blocks. A failure sets the latch, except a full disk:
    /// the caller then releases the block it reserved, and nothing changed.
    fn data_write(&self, buf: &[u8], at: u64) -> Result<()> {
        self.data_write_to(buf, at, false)
    }

    /// [`Pool::data_write`], with `bulk` as bulk data
    /// ([`crate::storage::BlockFile::write_bulk`]): its writeback is
    /// already started, and the copy that writes it syncs on its own pace,
    /// so the flusher (`flusher.rs`) does not count it; a commit's sync is
    /// still what makes it durable.
    fn data_write_to(&self, buf: &[u8], at: u64, bulk: bool) -> Result<()> {
        let latch = &self.inner.latch;
        latch.check()?;
        let f = &self.inner.file;
        if bulk {
            return latch.data_io("write data", f.path(), at, f.write_bulk(buf, at));
        }
        latch.data_io("write data", f.path(), at, f.write_cached(buf, at))?;
        // Counted once written: a sync that starts after this is sure to
        // cover it (`Pool::sync_data` clears the count before syncing).
        self.inner
            .unsynced
            .fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Read data blocks, unless the latch is set (see `latch.rs` on why
    /// reads are refused too). A failed read changes nothing: no latch.
    fn data_read(&self, buf: &mut [u8], at: u64) -> Result<()> {
        self.inner.latch.check()?;
        let f = &self.inner.file;
        f.read_at(buf, at)
            .map_err(|e| Error::io("read data", f.path(), at, e))
    }
}

fn vol_root(m: &Meta, id: u64) -> Result<(u64, u8)> {
    match m.catalog.get(id) {
        Some(Record::Volume(v)) => Ok((v.root, v.levels)),
        _ => Err(Error::VolumeNotFound(format!("#{id} (deleted)"))),
    }
}

impl Volume {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn read_only(&self) -> bool {
        self.kind == Kind::Snapshot
    }

    /// (root, levels, size) of what this handle reads.
    pub(crate) fn view(&self, m: &Meta) -> Result<(u64, u8, u64)> {
        match (m.catalog.get(self.id), self.kind) {
            (Some(Record::Volume(v)), Kind::Volume) => Ok((v.root, v.levels, v.size)),
            (Some(Record::Snapshot(s)), Kind::Snapshot) => Ok((s.root, s.levels, s.size)),
            (_, Kind::Volume) => Err(Error::VolumeNotFound(self.name.clone())),
            (_, Kind::Snapshot) => {
                let (v, s) = self.name.rsplit_once('@').unwrap_or((&self.name, ""));
                Err(Error::SnapshotNotFound {
                    volume: v.into(),
                    snapshot: s.into(),
                })
            }
        }
    }

    pub fn size(&self) -> Result<u64> {
        let m = self.pool.lock_meta();
        Ok(self.view(&m)?.2)
    }

    fn check_range(&self, size: u64, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(Error::OutOfRange {
                target: self.name.clone(),
                offset,
                len,
                size,
            }),
        }
    }

    fn writable(&self) -> Result<()> {
        if self.read_only() {
            return Err(Error::ReadOnly(format!("snapshot {}", self.name)));
        }
        Ok(())
    }

    /// Read `buf.len()` bytes at `offset`; unmapped ranges read as zeros.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let _g = crate::order::gate_shared(&self.gate, self.id);
        let len = buf.len() as u64;
        let _barrier = crate::order::hold(crate::order::Rank::ReadBarrier, 0, || {
            self.pool
                .inner
                .read_barrier
                .read()
                .unwrap_or_else(|p| p.into_inner())
        });
        let (map, first) = self.pool.with_meta(|m| {
            let (root, levels, size) = self.view(m)?;
            self.check_range(size, offset, len)?;
            if len == 0 {
                return Ok((Vec::new(), 0));
            }
            let first = offset / BLOCK as u64;
            let last = (offset + len - 1) / BLOCK as u64;
            Ok((m.map_range(root, levels, first, last - first + 1)?, first))
        })?;
        let mut i = 0;
        while i < map.len() {
            // Coalesce runs of physically consecutive blocks into one read.
            let mut j = i + 1;
            while j < map.len()
                && (map[i] == 0) == (map[j] == 0)
                && (map[i] == 0 || map[j] == map[j - 1] + 1)
            {
                j += 1;
            }
            let run_start = ((first + i as u64) * BLOCK as u64).max(offset);
            let run_end = ((first + j as u64) * BLOCK as u64).min(offset + len);
            let dst = &mut buf[(run_start - offset) as usize..(run_end - offset) as usize];
            if map[i] == 0 {
                dst.fill(0);
            } else {
                let phys = map[i] * BLOCK as u64 + (run_start - (first + i as u64) * BLOCK as u64);
                self.pool.data_read(dst, phys)?;
            }
            i = j;
        }
        Ok(())
    }

    /// Write `data` at `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_with(offset, data, false)
    }

    /// [`Volume::write`] for bulk data nobody is about to read (a copy's
    /// or a restore's stream): runs of new blocks are written back at once
    /// and leave the page cache soon after (`storage::BULK_WINDOW`). What
    /// is written, and when it is durable, is the same.
    pub fn write_bulk(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_with(offset, data, true)
    }

    fn write_with(&self, offset: u64, data: &[u8], bulk: bool) -> Result<()> {
        self.writable()?;
        let _g = crate::order::gate_shared(&self.gate, self.id);
        {
            let m = self.pool.lock_meta();
            self.pool.inner.latch.check()?;
            self.check_range(self.view(&m)?.2, offset, data.len() as u64)?;
        }
        let mut done = 0usize;
        while done < data.len() {
            let at = offset + done as u64;
            let in_block = (at % BLOCK as u64) as usize;
            let whole = (data.len() - done) / BLOCK;
            if in_block == 0 && whole >= 2 {
                let n = whole.min(RUN);
                let part = &data[done..done + n * BLOCK];
                let first = at / BLOCK as u64;
                if !self.pool.write_run(self.id, first, part, bulk)? {
                    for (k, b) in part.chunks(BLOCK).enumerate() {
                        self.pool.write_block(self.id, first + k as u64, b, 0)?;
                    }
                }
                done += n * BLOCK;
                continue;
            }
            let n = (BLOCK - in_block).min(data.len() - done);
            self.pool
                .write_block(self.id, at / BLOCK as u64, &data[done..done + n], in_block)?;
            done += n;
        }
        self.pool.maybe_commit()
    }

    /// Make a range read as zeros, releasing whole blocks it covers. Trim
    /// (discard) and write-zeroes are the same operation here: an unmapped
    /// block reads as zeros, since the index is flat and has no backing file.
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.writable()?;
        let _g = crate::order::gate_shared(&self.gate, self.id);
        {
            let m = self.pool.lock_meta();
            self.pool.inner.latch.check()?;
            self.check_range(self.view(&m)?.2, offset, len)?;
        }
        let end = offset + len;
        let bs = BLOCK as u64;
        let first_full = offset.div_ceil(bs);
        let last_full = end / bs; // exclusive
        let zeros = vec![0u8; BLOCK];
        if first_full >= last_full {
            // Within one or two partial blocks.
            let mut at = offset;
            while at < end {
                let n = (bs - at % bs).min(end - at);
                self.pool.write_block(
                    self.id,
                    at / bs,
                    &zeros[..n as usize],
                    (at % bs) as usize,
                )?;
                at += n;
            }
            return self.pool.maybe_commit();
        }
        if !offset.is_multiple_of(bs) {
            let n = first_full * bs - offset;
            self.pool.write_block(
                self.id,
                offset / bs,
                &zeros[..n as usize],
                (offset % bs) as usize,
            )?;
        }
        if !end.is_multiple_of(bs) {
            self.pool
                .write_block(self.id, last_full, &zeros[..(end % bs) as usize], 0)?;
        }
        // Whole blocks: visit only the mapped ones, a chunk at a time.
        let chunk = 64 * FANOUT as u64;
        let mut lo = first_full;
        while lo < last_full {
            let hi = (lo + chunk).min(last_full);
            let mapped = self.pool.with_meta(|m| {
                let (root, levels, _) = self.view(m)?;
                let mut v = Vec::new();
                m.tree_walk(root, levels, lo, hi, &mut |i, _| v.push(i))?;
                Ok(v)
            })?;
            for idx in mapped {
                self.pool.unmap_block(self.id, idx)?;
            }
            self.pool.maybe_commit()?;
            lo = hi;
        }
        Ok(())
    }

    /// Discard a range (same as [`Volume::write_zeroes`]).
    pub fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.write_zeroes(offset, len)
    }

    /// Durability barrier: every write acknowledged before it survives a crash.
    pub fn flush(&self) -> Result<()> {
        self.pool.commit()
    }
}
