//! The journal of index changes (`journal.lam`): what a volume's writes and
//! snapshots did to the index, as small logical records, so that a flush or
//! a snapshot is durable once its data is synced and a few bytes per
//! changed block are appended here, instead of after every metadata page
//! the writes changed went into the page log (`wal.rs`). Pages still reach
//! the page log, in fewer, larger commits; the superblock of each says up to
//! which record it holds (`journal_covered`). Opening a pool replays the
//! page log, then applies the records after that one through the same
//! index functions the writes ran, and commits the result. This file owns
//! the record and frame encoding and the file's appends, scan and reset; it
//! knows nothing of trees (the pool applies records). Byte layout in
//! docs/on-disk-format.md.

use crate::error::{Error, Result};
use crate::format::{get_u32, get_u64, put_u32, put_u64, read_labels, BLOCK, R};
use crate::latch::Latch;
use crate::storage::BlockFile;
use std::sync::Arc;

const HEADER_MAGIC: u32 = u32::from_le_bytes(*b"LMJL");
const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"LMJF");
const FRAME_HEADER: usize = 64;
/// Frames start after the header area.
pub const JOURNAL_START: u64 = BLOCK as u64;
/// Header slots, written alternately (as the page log's).
const SLOTS: [u64; 2] = [0, 512];
const VERSION: u32 = 1;

const OP_MAP: u8 = 1;
const OP_UNMAP: u8 = 2;
const OP_SNAPSHOT: u8 = 3;

/// One change to the index, as the write or snapshot that made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Blocks `first..first + n` of volume `vol` now map to the data blocks
    /// `block..block + n`, written before the record.
    Map {
        vol: u64,
        first: u64,
        n: u32,
        block: u64,
    },
    /// Block `idx` of volume `vol` is unmapped.
    Unmap { vol: u64, idx: u64 },
    /// Snapshot `id` of volume `vol` as it was at this point.
    Snapshot {
        vol: u64,
        id: u64,
        created: u64,
        system: bool,
        name: String,
        labels: Vec<(String, String)>,
    },
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u16).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

impl Op {
    /// Append the record's bytes to `out`. Names and labels are checked
    /// before a snapshot is made (255 and 2,048 bytes at most), so their
    /// lengths fit the u16 fields.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Op::Map {
                vol,
                first,
                n,
                block,
            } => {
                out.push(OP_MAP);
                out.extend_from_slice(&vol.to_le_bytes());
                out.extend_from_slice(&first.to_le_bytes());
                out.extend_from_slice(&n.to_le_bytes());
                out.extend_from_slice(&block.to_le_bytes());
            }
            Op::Unmap { vol, idx } => {
                out.push(OP_UNMAP);
                out.extend_from_slice(&vol.to_le_bytes());
                out.extend_from_slice(&idx.to_le_bytes());
            }
            Op::Snapshot {
                vol,
                id,
                created,
                system,
                name,
                labels,
            } => {
                out.push(OP_SNAPSHOT);
                out.extend_from_slice(&vol.to_le_bytes());
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&created.to_le_bytes());
                out.push(*system as u8);
                put_str(out, name);
                out.extend_from_slice(&(labels.len() as u16).to_le_bytes());
                for (k, v) in labels {
                    put_str(out, k);
                    put_str(out, v);
                }
            }
        }
    }
}

/// Decode exactly `count` records filling `payload`. Anything else (cut
/// short, an unknown kind, bytes left over) is `corrupt metadata`, never a
/// panic.
pub fn decode(payload: &[u8], count: u32) -> Result<Vec<Op>> {
    let bad = |detail: String| Error::corrupt(0, detail);
    let mut r = R::new(payload, 0);
    let mut ops = Vec::with_capacity((count as usize).min(payload.len()));
    for _ in 0..count {
        let op = match r.u8()? {
            OP_MAP => {
                let (vol, first, n, block) = (r.u64()?, r.u64()?, r.u32()?, r.u64()?);
                if n == 0 || block == 0 || block.checked_add(n as u64).is_none() {
                    return Err(bad(format!("map record of {n} blocks at block {block}")));
                }
                Op::Map {
                    vol,
                    first,
                    n,
                    block,
                }
            }
            OP_UNMAP => Op::Unmap {
                vol: r.u64()?,
                idx: r.u64()?,
            },
            OP_SNAPSHOT => {
                let (vol, id, created) = (r.u64()?, r.u64()?, r.u64()?);
                let system = match r.u8()? {
                    0 => false,
                    1 => true,
                    x => return Err(bad(format!("snapshot record with system flag {x}"))),
                };
                Op::Snapshot {
                    vol,
                    id,
                    created,
                    system,
                    name: r.str()?,
                    labels: read_labels(&mut r)?,
                }
            }
            k => {
                let at = r.at() - 1;
                return Err(bad(format!("unknown record kind {k} at byte {at}")));
            }
        };
        ops.push(op);
    }
    if r.at() != payload.len() {
        return Err(bad(format!(
            "{} bytes left after {count} records",
            payload.len() - r.at()
        )));
    }
    Ok(ops)
}

/// Records made in memory and not yet in the journal, encoded, in order.
#[derive(Default)]
pub struct Queue {
    bytes: Vec<u8>,
    /// Where each record starts in `bytes`.
    starts: Vec<usize>,
    /// Sequence number of the first record queued.
    first: u64,
    /// Sequence number the next record will get.
    pub next: u64,
}

impl Queue {
    pub fn new(next: u64) -> Queue {
        Queue {
            next,
            ..Queue::default()
        }
    }

    pub fn push(&mut self, op: &Op) {
        if self.starts.is_empty() {
            self.first = self.next;
        }
        self.starts.push(self.bytes.len());
        op.encode(&mut self.bytes);
        self.next += 1;
    }

    /// (first sequence number, bytes) of what is queued.
    pub fn peek(&self) -> Option<(u64, usize)> {
        (!self.starts.is_empty()).then_some((self.first, self.bytes.len()))
    }

    /// Everything queued, for a journal commit: (first sequence number,
    /// count, bytes).
    pub fn take(&mut self) -> Option<(u64, u32, Vec<u8>)> {
        if self.starts.is_empty() {
            return None;
        }
        let n = self.starts.len() as u32;
        self.starts.clear();
        Some((self.first, n, std::mem::take(&mut self.bytes)))
    }

    /// Forget the records up to `covered`: a durable page-log commit
    /// holds their changes.
    pub fn drop_through(&mut self, covered: u64) {
        if self.starts.is_empty() || covered < self.first {
            return;
        }
        let n = ((covered - self.first + 1) as usize).min(self.starts.len());
        let cut = self.starts.get(n).copied().unwrap_or(self.bytes.len());
        self.bytes.drain(..cut);
        self.starts.drain(..n);
        self.starts.iter_mut().for_each(|s| *s -= cut);
        self.first += n as u64;
    }
}

fn crc(h: &[u8], payload: &[u8]) -> u32 {
    let c = crc32c::crc32c(&h[0..4]);
    let c = crc32c::crc32c_append(c, &h[8..h.len()]);
    crc32c::crc32c_append(c, payload)
}

pub struct Journal {
    file: Arc<dyn BlockFile>,
    latch: Arc<Latch>,
    pool_id: [u8; 16],
    header_seq: u64,
    /// Sequence number the next frame must start at or after.
    pub next: u64,
    /// Where the next frame goes.
    pub pos: u64,
    pub capacity: u64,
}

impl Journal {
    /// A new, empty journal whose first record will be `start`.
    pub fn create(
        file: Arc<dyn BlockFile>,
        latch: Arc<Latch>,
        pool_id: [u8; 16],
        capacity: u64,
        start: u64,
    ) -> Result<Journal> {
        // Nothing from an earlier file (an upgrade cut short) may read as
        // a frame.
        let r = file.set_len(0);
        latch.io("truncate journal", file.path(), 0, r)?;
        let r = file.allocate(0, capacity);
        latch.io("preallocate journal", file.path(), 0, r)?;
        let mut j = Journal {
            file,
            latch,
            pool_id,
            header_seq: 0,
            next: start,
            pos: JOURNAL_START,
            capacity,
        };
        j.reset(start)?;
        j.reset(start)?;
        Ok(j)
    }

    /// Open the journal and read every durable frame, in order: the
    /// records with their sequence numbers. A frame whose checksum holds
    /// but whose records do not decode is corruption, not a torn tail.
    pub fn open(
        file: Arc<dyn BlockFile>,
        latch: Arc<Latch>,
        pool_id: [u8; 16],
        capacity: u64,
    ) -> Result<(Journal, Vec<(u64, Op)>)> {
        let path = file.path().to_path_buf();
        let mut best: Option<(u64, u64)> = None;
        for slot in SLOTS {
            let mut h = [0u8; 64];
            file.read_at(&mut h, slot)
                .map_err(|e| Error::io("read journal header", &path, slot, e))?;
            if get_u32(&h, 0) != HEADER_MAGIC
                || get_u32(&h, 4) != crc(&h, &[])
                || h[24..40] != pool_id
            {
                continue;
            }
            if get_u32(&h, 40) != VERSION {
                return Err(Error::NotAPool {
                    path,
                    detail: format!("journal version {}; this build reads 1", get_u32(&h, 40)),
                });
            }
            let (seq, start) = (get_u64(&h, 8), get_u64(&h, 16));
            if best.is_none_or(|(s, _)| seq > s) {
                best = Some((seq, start));
            }
        }
        let (header_seq, start) = best.ok_or_else(|| Error::NotAPool {
            path: path.clone(),
            detail: "no valid journal header for this pool".into(),
        })?;
        let mut j = Journal {
            file,
            latch,
            pool_id,
            header_seq,
            next: start,
            pos: JOURNAL_START,
            capacity,
        };
        let ops = j.scan()?;
        Ok((j, ops))
    }

    fn scan(&mut self) -> Result<Vec<(u64, Op)>> {
        let path = self.file.path().to_path_buf();
        let end = self
            .file
            .len()
            .map_err(|e| Error::io("stat journal", &path, 0, e))?;
        let mut out = Vec::new();
        while self.pos + FRAME_HEADER as u64 <= end {
            let mut h = [0u8; FRAME_HEADER];
            self.file
                .read_at(&mut h, self.pos)
                .map_err(|e| Error::io("read journal", &path, self.pos, e))?;
            let (first, count, len) = (get_u64(&h, 8), get_u32(&h, 16), get_u32(&h, 20) as u64);
            let body = self.pos + FRAME_HEADER as u64;
            // A frame starts where the one before it ended, or later: the
            // records between went to the page log before any commit took
            // them to the journal (the replay checks that the page log does
            // hold them). A frame left from before the last reset holds
            // only records before `start`, so it ends the scan.
            if get_u32(&h, 0) != FRAME_MAGIC
                || first < self.next
                || h[24..40] != self.pool_id
                || count == 0
                || body + len > end
            {
                break;
            }
            let mut payload = vec![0u8; len as usize];
            self.file
                .read_at(&mut payload, body)
                .map_err(|e| Error::io("read journal", &path, body, e))?;
            if get_u32(&h, 4) != crc(&h, &payload) {
                break;
            }
            let ops = decode(&payload, count).map_err(|e| {
                let detail = match e {
                    Error::Corrupt { detail, .. } => detail,
                    e => e.to_string(),
                };
                Error::corrupt(
                    0,
                    format!(
                        "journal {} frame at byte {}: {detail}",
                        path.display(),
                        self.pos
                    ),
                )
            })?;
            out.extend((first..).zip(ops));
            self.next = first + count as u64;
            self.pos = body + len;
        }
        Ok(out)
    }

    /// Whether a frame of `payload` bytes whose first record is `first`
    /// can be appended: it fits before the end, and a scan would read it
    /// (it starts where the last frame ended, or later).
    pub fn takes(&self, first: u64, payload: usize) -> bool {
        first >= self.next && self.pos + (FRAME_HEADER + payload) as u64 <= self.capacity
    }

    /// Append the records `first..first + count` (encoded in `payload`)
    /// as one frame and make it durable. `first` must be at least
    /// `self.next` ([`Journal::takes`]).
    pub fn append(&mut self, first: u64, count: u32, payload: &[u8]) -> Result<()> {
        debug_assert!(
            first >= self.next,
            "journal records out of order: {first} after {}",
            self.next
        );
        let mut buf = Vec::with_capacity(FRAME_HEADER + payload.len());
        buf.resize(FRAME_HEADER, 0);
        put_u32(&mut buf, 0, FRAME_MAGIC);
        put_u64(&mut buf, 8, first);
        put_u32(&mut buf, 16, count);
        put_u32(&mut buf, 20, payload.len() as u32);
        buf[24..40].copy_from_slice(&self.pool_id);
        let c = crc(&buf[..FRAME_HEADER], payload);
        put_u32(&mut buf, 4, c);
        buf.extend_from_slice(payload);
        let (at, path) = (self.pos, self.file.path());
        let r = self.file.write_at(&buf, at);
        self.latch.io("append to journal", path, at, r)?;
        let r = self.file.sync();
        self.latch.io("sync journal", path, at, r)?;
        self.pos += buf.len() as u64;
        self.next = first + count as u64;
        Ok(())
    }

    /// Start the journal afresh at record `start`, durably. Only once the
    /// page log holds every record before `start`.
    pub fn reset(&mut self, start: u64) -> Result<()> {
        self.header_seq += 1;
        let mut h = [0u8; 64];
        put_u32(&mut h, 0, HEADER_MAGIC);
        put_u64(&mut h, 8, self.header_seq);
        put_u64(&mut h, 16, start);
        h[24..40].copy_from_slice(&self.pool_id);
        put_u32(&mut h, 40, VERSION);
        let c = crc(&h, &[]);
        put_u32(&mut h, 4, c);
        let slot = SLOTS[(self.header_seq % 2) as usize];
        let path = self.file.path();
        let r = self.file.write_at(&h, slot);
        self.latch.io("write journal header", path, slot, r)?;
        let r = self.file.sync();
        self.latch.io("sync journal header", path, slot, r)?;
        self.next = start;
        self.pos = JOURNAL_START;
        Ok(())
    }

    /// Whether any frame was appended since the last reset.
    pub fn is_empty(&self) -> bool {
        self.pos == JOURNAL_START
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn op() -> impl Strategy<Value = Op> {
        let s = "[a-z0-9.=-]{0,40}";
        prop_oneof![
            (any::<u64>(), any::<u64>(), 1u32..5000, 1u64..u64::MAX / 2).prop_map(
                |(vol, first, n, block)| Op::Map {
                    vol,
                    first,
                    n,
                    block
                }
            ),
            (any::<u64>(), any::<u64>()).prop_map(|(vol, idx)| Op::Unmap { vol, idx }),
            (
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<bool>(),
                s,
                proptest::collection::vec((s, s), 0..4)
            )
                .prop_map(|(vol, id, created, system, name, labels)| Op::Snapshot {
                    vol,
                    id,
                    created,
                    system,
                    name,
                    labels
                }),
        ]
    }

    #[test]
    fn a_queue_drops_what_a_page_commit_covers() {
        let mut q = Queue::new(10);
        for idx in 0..5 {
            q.push(&Op::Unmap { vol: 1, idx });
        }
        q.drop_through(9);
        assert_eq!(q.peek(), Some((10, 5 * 17)));
        q.drop_through(12);
        let (first, n, bytes) = q.take().unwrap();
        assert_eq!((first, n), (13, 2));
        let ops = decode(&bytes, n).unwrap();
        assert_eq!(ops[0], Op::Unmap { vol: 1, idx: 3 });
        q.push(&Op::Unmap { vol: 1, idx: 9 });
        assert_eq!(q.peek(), Some((15, 17)));
        q.drop_through(20);
        assert_eq!((q.peek(), q.next), (None, 16));
    }

    proptest! {
        #[test]
        fn records_decode_to_what_was_encoded(ops in proptest::collection::vec(op(), 1..20)) {
            let mut buf = Vec::new();
            ops.iter().for_each(|o| o.encode(&mut buf));
            prop_assert_eq!(decode(&buf, ops.len() as u32).unwrap(), ops);
        }

        /// The decoder meets arbitrary bytes with an error or records,
        /// never a panic, and never reads past the payload.
        #[test]
        fn any_bytes_decode_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300), count in 0u32..50) {
            let _ = decode(&bytes, count);
        }

        /// A valid payload cut anywhere, or with a byte changed in a
        /// length or kind, is refused or decodes to other records; it
        /// never panics.
        #[test]
        fn damaged_records_are_refused_without_panic(ops in proptest::collection::vec(op(), 1..8), cut in any::<prop::sample::Index>(), flip in any::<prop::sample::Index>(), bit in 0u8..8) {
            let mut buf = Vec::new();
            ops.iter().for_each(|o| o.encode(&mut buf));
            let short = &buf[..cut.index(buf.len())];
            prop_assert!(decode(short, ops.len() as u32).is_err());
            let mut bad = buf.clone();
            let i = flip.index(bad.len());
            bad[i] ^= 1 << bit;
            let _ = decode(&bad, ops.len() as u32);
        }
    }
}
