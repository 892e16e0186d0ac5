//! The write-ahead log that makes every metadata update atomic. A transaction
//! is a run of page frames (the full new image of each changed page) ended by
//! a commit frame; it counts only once the commit frame is on disk with a
//! valid checksum. Pages reach their home in the pool file only at a
//! checkpoint, which copies the log's images home, syncs, and then advances
//! the log's start. Replaying the log is idempotent, so a crash at any step
//! of a checkpoint is repaired by the next open. See docs/on-disk-format.md.

use crate::error::{Error, Result};
use crate::format::{get_u32, get_u64, put_u32, put_u64, Page, BLOCK};
use crate::latch::Latch;
use crate::storage::BlockFile;
use std::collections::HashMap;
use std::sync::Arc;

pub const WAL_MAGIC: u32 = u32::from_le_bytes(*b"LMWL");
const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"LMWF");
pub const FRAME_HEADER: usize = 64;
/// Log records start after the header area.
pub const WAL_START: u64 = BLOCK as u64;
const KIND_PAGE: u8 = 1;
const KIND_COMMIT: u8 = 2;
/// The header is kept in two 512-byte slots, written alternately, so a torn
/// header write never loses the log.
const SLOTS: [u64; 2] = [0, 512];

pub struct Wal {
    pub file: Arc<dyn BlockFile>,
    /// The pool's I/O-failure latch: every write and sync of the log, and
    /// every step of a checkpoint, goes through it.
    latch: Arc<Latch>,
    pool_id: [u8; 16],
    /// Transaction id the next commit will carry.
    pub next_txn: u64,
    /// Where the next frame goes.
    pub pos: u64,
    /// Header sequence, to pick the newer slot.
    header_seq: u64,
    /// Size the log is allowed to reach before a checkpoint.
    pub capacity: u64,
}

/// What a scan of the log found: the latest committed image of each page.
pub struct Replay {
    /// block -> offset of its latest committed image in the log.
    pub index: HashMap<u64, u64>,
    pub transactions: u64,
}

fn frame_crc(h: &[u8], page: Option<&[u8]>) -> u32 {
    let c = crc32c::crc32c(&h[0..4]);
    let c = crc32c::crc32c_append(c, &h[8..FRAME_HEADER]);
    match page {
        Some(p) => crc32c::crc32c_append(c, p),
        None => c,
    }
}

impl Wal {
    /// Write a fresh log header for a new pool.
    pub fn pool_id(&self) -> [u8; 16] {
        self.pool_id
    }

    pub fn create(
        file: Arc<dyn BlockFile>,
        latch: Arc<Latch>,
        pool_id: [u8; 16],
        capacity: u64,
    ) -> Result<Wal> {
        let mut wal = Wal {
            file,
            latch,
            pool_id,
            next_txn: 1,
            pos: WAL_START,
            header_seq: 0,
            capacity,
        };
        let r = wal.file.allocate(0, capacity);
        wal.latch.io("preallocate log", wal.file.path(), 0, r)?;
        wal.write_header()?;
        wal.write_header()?;
        Ok(wal)
    }

    fn write_header(&mut self) -> Result<()> {
        self.header_seq += 1;
        let mut h = [0u8; 64];
        put_u32(&mut h, 0, WAL_MAGIC);
        put_u64(&mut h, 8, self.header_seq);
        put_u64(&mut h, 16, self.next_txn);
        h[24..40].copy_from_slice(&self.pool_id);
        put_u32(&mut h, 40, 1); // log format version
        let crc = frame_crc(&h, None);
        put_u32(&mut h, 4, crc);
        let slot = SLOTS[(self.header_seq % 2) as usize];
        let path = self.file.path();
        let r = self.file.write_at(&h, slot);
        self.latch.io("write log header", path, slot, r)?;
        let r = self.file.sync();
        self.latch.io("sync log header", path, slot, r)
    }

    /// Open an existing log and find every committed transaction in it. The
    /// pool's identity comes from the log header, since the superblock's home
    /// copy may be older than the log (or torn by a crash mid-checkpoint).
    pub fn open(
        file: Arc<dyn BlockFile>,
        latch: Arc<Latch>,
        capacity: u64,
    ) -> Result<(Wal, Replay)> {
        let mut best: Option<(u64, u64, [u8; 16])> = None; // (seq, start txn, pool id)
        for slot in SLOTS {
            let mut h = [0u8; 64];
            file.read_at(&mut h, slot)
                .map_err(|e| Error::io("read log header", file.path(), slot, e))?;
            if get_u32(&h, 0) != WAL_MAGIC || get_u32(&h, 4) != frame_crc(&h, None) {
                continue;
            }
            let (seq, start) = (get_u64(&h, 8), get_u64(&h, 16));
            if best.is_none_or(|(s, _, _)| seq > s) {
                best = Some((seq, start, h[24..40].try_into().unwrap()));
            }
        }
        let (header_seq, start, pool_id) = best.ok_or_else(|| Error::NotAPool {
            path: file.path().to_path_buf(),
            detail: "no valid log header for this pool".into(),
        })?;
        let mut wal = Wal {
            file,
            latch,
            pool_id,
            next_txn: start,
            pos: WAL_START,
            header_seq,
            capacity,
        };
        let replay = wal.scan()?;
        Ok((wal, replay))
    }

    fn scan(&mut self) -> Result<Replay> {
        let mut index = HashMap::new();
        let mut pending: Vec<(u64, u64)> = Vec::new();
        let mut pos = WAL_START;
        let mut transactions = 0;
        let end = self
            .file
            .len()
            .map_err(|e| Error::io("stat log", self.file.path(), 0, e))?;
        let mut page = vec![0u8; BLOCK];
        while pos + FRAME_HEADER as u64 <= end {
            let mut h = [0u8; FRAME_HEADER];
            self.file
                .read_at(&mut h, pos)
                .map_err(|e| Error::io("read log", self.file.path(), pos, e))?;
            if get_u32(&h, 0) != FRAME_MAGIC
                || get_u64(&h, 8) != self.next_txn
                || h[32..48] != self.pool_id
            {
                break;
            }
            match h[24] {
                KIND_PAGE => {
                    let at = pos + FRAME_HEADER as u64;
                    self.file
                        .read_at(&mut page, at)
                        .map_err(|e| Error::io("read log", self.file.path(), at, e))?;
                    if get_u32(&h, 4) != frame_crc(&h, Some(&page)) {
                        break;
                    }
                    pending.push((get_u64(&h, 16), at));
                    pos = at + BLOCK as u64;
                }
                KIND_COMMIT => {
                    if get_u32(&h, 4) != frame_crc(&h, None)
                        || get_u32(&h, 28) as usize != pending.len()
                    {
                        break;
                    }
                    index.extend(pending.drain(..));
                    transactions += 1;
                    self.next_txn += 1;
                    pos += FRAME_HEADER as u64;
                    self.pos = pos;
                }
                _ => break,
            }
        }
        Ok(Replay {
            index,
            transactions,
        })
    }

    /// Append one transaction and make it durable. Returns the log offset of
    /// each page image, in the order given.
    pub fn append(&mut self, pages: &[(u64, Box<Page>)]) -> Result<Vec<u64>> {
        let txn = self.next_txn;
        let mut buf = Vec::with_capacity(pages.len() * (FRAME_HEADER + BLOCK) + FRAME_HEADER);
        let mut offsets = Vec::with_capacity(pages.len());
        for (block, page) in pages {
            let mut h = [0u8; FRAME_HEADER];
            put_u32(&mut h, 0, FRAME_MAGIC);
            put_u64(&mut h, 8, txn);
            put_u64(&mut h, 16, *block);
            h[24] = KIND_PAGE;
            h[32..48].copy_from_slice(&self.pool_id);
            let crc = frame_crc(&h, Some(&page[..]));
            put_u32(&mut h, 4, crc);
            buf.extend_from_slice(&h);
            offsets.push(self.pos + buf.len() as u64);
            buf.extend_from_slice(&page[..]);
        }
        let mut h = [0u8; FRAME_HEADER];
        put_u32(&mut h, 0, FRAME_MAGIC);
        put_u64(&mut h, 8, txn);
        h[24] = KIND_COMMIT;
        put_u32(&mut h, 28, pages.len() as u32);
        h[32..48].copy_from_slice(&self.pool_id);
        let crc = frame_crc(&h, None);
        put_u32(&mut h, 4, crc);
        buf.extend_from_slice(&h);
        let at = self.pos;
        let path = self.file.path();
        let r = self.file.write_at(&buf, at);
        self.latch.io("append to log", path, at, r)?;
        let r = self.file.sync();
        self.latch.io("sync log", path, at, r)?;
        self.pos += buf.len() as u64;
        self.next_txn += 1;
        Ok(offsets)
    }

    /// Copy every image named by `index` to its home in `pool`, make that
    /// durable, then start the log afresh; returns how many were copied.
    /// Images `homed` names (block -> the offset of the image already
    /// copied home, see `home.rs`) are not copied again. Any failure sets
    /// the latch, even a failed read of the log: a checkpoint stopped
    /// half-way has written some pages home, and only a replay of the log
    /// repairs that.
    pub fn checkpoint(
        &mut self,
        index: &HashMap<u64, u64>,
        homed: &HashMap<u64, u64>,
        pool: &dyn BlockFile,
    ) -> Result<usize> {
        let mut page = crate::format::new_page();
        let mut entries: Vec<(&u64, &u64)> = index
            .iter()
            .filter(|(b, off)| homed.get(b) != Some(off))
            .collect();
        entries.sort();
        let written = entries.len();
        for (&block, &off) in entries {
            let r = self.file.read_at(&mut page[..], off);
            self.latch
                .io("read log for a checkpoint", self.file.path(), off, r)?;
            let at = block * BLOCK as u64;
            let r = pool.write_at(&page[..], at);
            self.latch.io("write page home", pool.path(), at, r)?;
        }
        let r = pool.sync();
        self.latch
            .io("sync pool at a checkpoint", pool.path(), 0, r)?;
        self.write_header()?;
        self.pos = WAL_START;
        Ok(written)
    }
}
