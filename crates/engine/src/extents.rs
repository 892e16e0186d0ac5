//! Data movement: the allocated extents of a volume or snapshot, the extents
//! that changed between two points of a lineage, and a stream of chunks that
//! carries them into another volume. Remote clone, replica rebuild and
//! backup build on exactly this.

use crate::copy::{CopyControl, CopyProgress};
use crate::error::Result;
use crate::format::*;
use crate::io::Volume;
use crate::ops::VolumeInfo;
use crate::pool::Pool;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtentKind {
    /// Mapped data.
    Data,
    /// Unmapped: reads as zeros, holds no space.
    Hole,
    /// In a diff: was data in the base, reads as zeros now.
    Zero,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    pub kind: ExtentKind,
}

/// A volume's live data or one of its snapshots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Volume(String),
    Snapshot(String, String),
}

impl Target {
    pub fn snapshot(volume: &str, snapshot: &str) -> Target {
        Target::Snapshot(volume.into(), snapshot.into())
    }
    pub fn volume(volume: &str) -> Target {
        Target::Volume(volume.into())
    }
}

fn push(out: &mut Vec<Extent>, offset: u64, len: u64, kind: ExtentKind) {
    if len == 0 {
        return;
    }
    if let Some(last) = out.last_mut() {
        if last.kind == kind && last.offset + last.len == offset {
            last.len += len;
            return;
        }
    }
    out.push(Extent { offset, len, kind });
}

/// Turn block indexes (sorted) with kinds into byte extents clipped to [lo, hi).
fn to_extents(
    blocks: &[(u64, ExtentKind)],
    lo: u64,
    hi: u64,
    gaps: Option<ExtentKind>,
) -> Vec<Extent> {
    let bs = BLOCK as u64;
    let mut out = Vec::new();
    let mut at = lo;
    for &(idx, kind) in blocks {
        let s = (idx * bs).max(lo);
        let e = ((idx + 1) * bs).min(hi);
        if s >= e {
            continue;
        }
        if let Some(g) = gaps {
            push(&mut out, at, s - at, g);
        }
        push(&mut out, s, e - s, kind);
        at = e;
    }
    if let Some(g) = gaps {
        push(&mut out, at, hi.saturating_sub(at), g);
    }
    out
}

impl Pool {
    /// Open a target for reading (a volume read-write, a snapshot read-only).
    pub fn open_target(&self, t: &Target) -> Result<Volume> {
        match t {
            Target::Volume(v) => self.open_volume(v),
            Target::Snapshot(v, s) => self.open_snapshot(v, s),
        }
    }
}

impl Volume {
    /// Data and hole extents covering [offset, offset+len), clipped to the size.
    pub fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let (blocks, lo, hi) = self.pool.with_meta(|m| {
            let (root, levels, size) = self.view(m)?;
            let hi = offset.saturating_add(len).min(size);
            if offset >= hi {
                return Ok((Vec::new(), offset, offset));
            }
            let mut v = Vec::new();
            let (blo, bhi) = (offset / BLOCK as u64, hi.div_ceil(BLOCK as u64));
            m.tree_walk(root, levels, blo, bhi, &mut |i, _| {
                v.push((i, ExtentKind::Data))
            })?;
            Ok((v, offset, hi))
        })?;
        Ok(to_extents(&blocks, lo, hi, Some(ExtentKind::Hole)))
    }
}

impl Pool {
    /// What changed from `from` (None: an empty volume) to `to`: Data where
    /// `to` holds different data, Zero where `from` had data and `to` has
    /// none. Unchanged ranges are left out; shared subtrees are skipped, so
    /// the cost follows the size of the change.
    pub fn diff(&self, from: Option<&Target>, to: &Target) -> Result<Vec<Extent>> {
        let tv = self.open_target(to)?;
        let fv = from.map(|f| self.open_target(f)).transpose()?;
        let _g = crate::order::gate_shared(&tv.gate, tv.id);
        let (blocks, size) = self.with_meta(|m| {
            let (tr, tl, ts) = tv.view(m)?;
            let (fr, fl, fs) = match &fv {
                Some(f) => f.view(m)?,
                None => (0, 1, 0),
            };
            let size = ts.max(fs);
            let mut v = Vec::new();
            m.tree_compare((fr, fl), (tr, tl), 0, u64::MAX, false, &mut |i, _a, b| {
                v.push((
                    i,
                    if b != 0 {
                        ExtentKind::Data
                    } else {
                        ExtentKind::Zero
                    },
                ))
            })?;
            Ok((v, ts.min(size)))
        })?;
        Ok(to_extents(&blocks, 0, size, None))
    }

    /// A stream of the changes from `from` to `to`, data read lazily in
    /// pieces of at most 1 MiB. Apply it with [`Volume::apply`].
    pub fn export(&self, from: Option<&Target>, to: &Target) -> Result<Export> {
        let extents = self.diff(from, to)?;
        Ok(Export {
            source: self.open_target(to)?,
            extents,
            next: 0,
            within: 0,
        })
    }

    /// A full, independent copy of a snapshot as a new volume. `progress`
    /// gets (bytes copied, bytes to copy). Moves only allocated data.
    pub fn full_clone(
        &self,
        volume: &str,
        snapshot: &str,
        new_name: &str,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<VolumeInfo> {
        let src = Target::snapshot(volume, snapshot);
        let size = self.open_target(&src)?.size()?;
        self.create_volume(new_name, size)?;
        struct Report<'a>(&'a mut dyn FnMut(u64, u64));
        impl CopyControl for Report<'_> {
            fn progress(&mut self, p: &CopyProgress) {
                (self.0)(p.done_bytes, p.total_bytes)
            }
        }
        self.copy_into(&src, new_name, 0, u64::MAX, &mut Report(progress))?;
        self.volume_info_by_name(new_name)
    }
}

/// One piece of an export stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Chunk {
    Data { offset: u64, bytes: Vec<u8> },
    Zero { offset: u64, len: u64 },
}

/// Changes from one point of a lineage to another, as chunks.
pub struct Export {
    pub(crate) source: Volume,
    extents: Vec<Extent>,
    next: usize,
    within: u64,
}

const PIECE: u64 = 1 << 20;

impl Export {
    pub fn extents(&self) -> &[Extent] {
        &self.extents
    }

    /// Bytes of data the stream will carry (from where it stands now).
    pub fn data_bytes(&self) -> u64 {
        self.extents[self.next.min(self.extents.len())..]
            .iter()
            .filter(|e| e.kind == ExtentKind::Data)
            .map(|e| e.len)
            .sum::<u64>()
            - self.within
    }

    /// Start the stream at `offset` without reading what lies before it:
    /// extents that end at or below `offset` are dropped, the one that
    /// straddles it is cut there. Returns the bytes of data skipped. Only
    /// moves forward: an offset behind the stream's position skips nothing.
    pub fn skip_to(&mut self, offset: u64) -> u64 {
        let mut skipped = 0;
        while let Some(e) = self.extents.get_mut(self.next) {
            let at = e.offset + self.within;
            if at >= offset {
                break;
            }
            let end = e.offset + e.len;
            let cut = end.min(offset) - at;
            if e.kind == ExtentKind::Data {
                skipped += cut;
            }
            if end <= offset {
                self.next += 1;
                self.within = 0;
            } else if e.kind == ExtentKind::Data {
                self.within += cut;
            } else {
                // A Zero extent is sent whole: shorten it instead.
                e.offset = offset;
                e.len = end - offset;
            }
        }
        skipped
    }
}

/// One piece of an export stream, its data not yet read: what
/// [`Export::next_piece`] gives a caller that reads data into a buffer of
/// its own ([`Export::read_piece`]) instead of a new one per chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    Data { offset: u64, len: u64 },
    Zero { offset: u64, len: u64 },
}

impl Export {
    /// Step past the next piece (data in pieces of at most 1 MiB) without
    /// reading it; `None` at the end of the stream.
    pub fn next_piece(&mut self) -> Option<Piece> {
        let e = *self.extents.get(self.next)?;
        match e.kind {
            ExtentKind::Data => {
                let len = (e.len - self.within).min(PIECE);
                let offset = e.offset + self.within;
                self.within += len;
                if self.within == e.len {
                    self.next += 1;
                    self.within = 0;
                }
                Some(Piece::Data { offset, len })
            }
            _ => {
                self.next += 1;
                Some(Piece::Zero {
                    offset: e.offset,
                    len: e.len,
                })
            }
        }
    }

    /// Read a data piece [`Export::next_piece`] gave into `buf` (its
    /// length).
    pub fn read_piece(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.source.read(offset, buf)
    }
}

impl Iterator for Export {
    type Item = Result<Chunk>;

    fn next(&mut self) -> Option<Result<Chunk>> {
        Some(match self.next_piece()? {
            Piece::Data { offset, len } => {
                let mut bytes = vec![0u8; len as usize];
                self.read_piece(offset, &mut bytes)
                    .map(|_| Chunk::Data { offset, bytes })
            }
            Piece::Zero { offset, len } => Ok(Chunk::Zero { offset, len }),
        })
    }
}

impl Volume {
    /// Apply one chunk of an export stream (its data as bulk: see
    /// [`Volume::write_bulk`]).
    pub fn apply(&self, chunk: &Chunk) -> Result<()> {
        match chunk {
            Chunk::Data { offset, bytes } => self.write_bulk(*offset, bytes),
            Chunk::Zero { offset, len } => self.write_zeroes(*offset, *len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolOptions;

    #[test]
    fn skip_to_starts_the_stream_at_an_offset() {
        let d = tempfile::tempdir().unwrap();
        let p = Pool::create_dir(d.path(), PoolOptions::default()).unwrap();
        p.create_volume("v", 16 << 20).unwrap();
        let v = p.open_volume("v").unwrap();
        // Data at [1 MiB, 3 MiB) and [8 MiB, 8 MiB + 4 KiB).
        v.write(1 << 20, &vec![7u8; 2 << 20]).unwrap();
        v.write(8 << 20, &[9u8; 4096]).unwrap();
        p.create_snapshot("v", "s", &[]).unwrap();
        let t = Target::snapshot("v", "s");
        let full: u64 = (2 << 20) + 4096;

        let mut e = p.export(None, &t).unwrap();
        assert_eq!(e.data_bytes(), full);
        // Cut the first extent in its middle.
        let at = (2 << 20) + 512;
        assert_eq!(e.skip_to(at), at - (1 << 20));
        assert_eq!(e.data_bytes(), full - (at - (1 << 20)));
        let chunks: Vec<Chunk> = e.map(|c| c.unwrap()).collect();
        assert!(matches!(&chunks[0], Chunk::Data { offset, bytes }
            if *offset == at && bytes.len() as u64 == (3 << 20) - at && bytes.iter().all(|&b| b == 7)));
        assert!(matches!(&chunks[1], Chunk::Data { offset, bytes }
            if *offset == 8 << 20 && bytes.len() == 4096));
        assert_eq!(chunks.len(), 2);

        // Past the first extent: it is dropped whole; past all: nothing left.
        let mut e = p.export(None, &t).unwrap();
        assert_eq!(e.skip_to(5 << 20), 2 << 20);
        assert_eq!(
            e.next().unwrap().unwrap(),
            Chunk::Data {
                offset: 8 << 20,
                bytes: vec![9; 4096]
            }
        );
        let mut e = p.export(None, &t).unwrap();
        assert_eq!(e.skip_to(16 << 20), full);
        assert!(e.next().is_none());
        // Backwards skips nothing.
        let mut e = p.export(None, &t).unwrap();
        e.skip_to(8 << 20);
        assert_eq!(e.skip_to(0), 0);

        // A Zero extent (in a diff) straddling the offset is shortened.
        v.write_zeroes(1 << 20, 2 << 20).unwrap();
        p.create_snapshot("v", "s2", &[]).unwrap();
        let mut e = p.export(Some(&t), &Target::snapshot("v", "s2")).unwrap();
        assert_eq!(e.skip_to(2 << 20), 0);
        assert_eq!(
            e.next().unwrap().unwrap(),
            Chunk::Zero {
                offset: 2 << 20,
                len: 1 << 20
            }
        );
    }
}
