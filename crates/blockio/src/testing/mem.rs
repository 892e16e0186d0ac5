//! An in-memory volume for tests and fuzzing: a `Vec<u8>` behind a mutex
//! with a 4 KiB allocation map, so block status reports real holes. Every
//! frontend's tests (NBD, FUSE) serve it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::{Caps, Extent, InlineIo, IoError, IoErrorKind};

pub const MEM_BLOCK: u64 = 4096;

/// A RAM-backed volume ([`InlineIo`]). Unwritten, trimmed and zeroed whole blocks
/// are holes (reported as hole + zero); partially covered blocks stay
/// allocated.
#[derive(Debug)]
pub struct MemDevice {
    state: Mutex<State>,
    read_only: bool,
    caps: Caps,
    failing: Option<(u64, u64)>,
    flushes: AtomicU64,
}

#[derive(Debug)]
struct State {
    data: Vec<u8>,
    allocated: Vec<bool>,
}

impl MemDevice {
    /// A writable device of `size` bytes, all holes.
    pub fn new(size: usize) -> Self {
        let blocks = (size as u64).div_ceil(MEM_BLOCK) as usize;
        MemDevice {
            state: Mutex::new(State {
                data: vec![0; size],
                allocated: vec![false; blocks],
            }),
            read_only: false,
            caps: Caps::ALL,
            failing: None,
            flushes: AtomicU64::new(0),
        }
    }

    /// Refuses writes (the export is advertised read-only).
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// `write_zeroes` fails with `NotSupported`, as a device that cannot
    /// zero quickly would.
    pub fn without_native_zeroes(mut self) -> Self {
        self.caps.write_zeroes = false;
        self
    }

    /// Declares `caps` instead of everything; operations it leaves out
    /// fail with `NotSupported` (the server must not send them).
    pub fn with_caps(mut self, caps: Caps) -> Self {
        self.caps = caps;
        self
    }

    fn supports(&self, has: bool, what: &str) -> Result<(), IoError> {
        if has {
            Ok(())
        } else {
            Err(IoError::new(
                IoErrorKind::NotSupported,
                format!("in-memory device declared no {what}"),
            ))
        }
    }

    /// Any operation touching `[start, end)` fails with `IoError::Io`.
    pub fn failing(mut self, start: u64, end: u64) -> Self {
        self.failing = Some((start, end));
        self
    }

    /// Stores `data` at `offset` regardless of read-only (test set-up).
    pub fn load(&self, offset: u64, data: &[u8]) {
        let mut s = self.lock();
        let end = (offset as usize + data.len()).min(s.data.len());
        let n = end.saturating_sub(offset as usize);
        s.data[offset as usize..end].copy_from_slice(&data[..n]);
        s.mark(offset, n as u64, true);
    }

    /// A copy of the contents.
    pub fn contents(&self) -> Vec<u8> {
        self.lock().data.clone()
    }

    /// Whether the block holding `offset` is allocated.
    pub fn is_allocated(&self, offset: u64) -> bool {
        self.lock()
            .allocated
            .get((offset / MEM_BLOCK) as usize)
            .copied()
            .unwrap_or(false)
    }

    /// How many times `flush` was called.
    pub fn flush_count(&self) -> u64 {
        self.flushes.load(Ordering::SeqCst)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check(&self, offset: u64, len: u64, write: bool) -> Result<(), IoError> {
        if write && self.read_only {
            return Err(IoError::new(
                IoErrorKind::ReadOnly,
                "in-memory device is read-only",
            ));
        }
        let size = self.lock().data.len() as u64;
        if !matches!(offset.checked_add(len), Some(end) if end <= size) {
            return Err(IoError::new(
                IoErrorKind::Invalid,
                format!("{offset}+{len} beyond {size}"),
            ));
        }
        if let Some((a, b)) = self.failing {
            if offset < b && offset + len > a {
                return Err(IoError::new(
                    IoErrorKind::Io,
                    format!("injected failure at {offset}+{len}"),
                ));
            }
        }
        Ok(())
    }

    fn zero(&self, offset: u64, len: u64, punch: bool) {
        let mut s = self.lock();
        s.data[offset as usize..(offset + len) as usize].fill(0);
        s.mark(offset, len, true);
        if punch {
            // Whole blocks inside the range become holes again.
            let first = offset.div_ceil(MEM_BLOCK);
            let last = (offset + len) / MEM_BLOCK;
            for b in first..last {
                s.allocated[b as usize] = false;
            }
        }
    }
}

impl State {
    fn mark(&mut self, offset: u64, len: u64, allocated: bool) {
        if len == 0 {
            return;
        }
        let first = offset / MEM_BLOCK;
        let last = (offset + len - 1) / MEM_BLOCK;
        for b in first..=last {
            if let Some(a) = self.allocated.get_mut(b as usize) {
                *a = allocated;
            }
        }
    }
}

impl InlineIo for MemDevice {
    fn size(&self) -> Result<u64, IoError> {
        Ok(self.lock().data.len() as u64)
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn caps(&self) -> Caps {
        self.caps
    }

    fn activate(&self, _generation: u64) -> Result<(), IoError> {
        Err(IoError::new(
            IoErrorKind::NotSupported,
            "an in-memory device keeps no generation",
        ))
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        self.check(offset, buf.len() as u64, false)?;
        let s = self.lock();
        buf.copy_from_slice(&s.data[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), IoError> {
        self.supports(!fua || self.caps.fua, "FUA")?;
        self.check(offset, data.len() as u64, true)?;
        let mut s = self.lock();
        s.data[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        s.mark(offset, data.len() as u64, true);
        Ok(())
    }

    fn flush(&self) -> Result<(), IoError> {
        self.supports(self.caps.flush, "flush")?;
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64) -> Result<(), IoError> {
        self.supports(self.caps.trim, "trim")?;
        self.check(offset, len, true)?;
        self.zero(offset, len, true);
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool) -> Result<(), IoError> {
        if !self.caps.write_zeroes {
            return Err(IoError::new(IoErrorKind::NotSupported, "no native zeroing"));
        }
        self.check(offset, len, true)?;
        self.zero(offset, len, may_trim);
        Ok(())
    }

    /// Runs of allocated / unallocated blocks from `offset`. The last extent
    /// runs to the end of its run, possibly past the request, which the
    /// trait allows and the server must clip.
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, IoError> {
        self.supports(self.caps.block_status, "block status")?;
        self.check(offset, len, false)?;
        let s = self.lock();
        let size = s.data.len() as u64;
        let end = offset + len;
        let mut out: Vec<Extent> = Vec::new();
        let mut at = offset;
        while at < end {
            let b = (at / MEM_BLOCK) as usize;
            let alloc = s.allocated[b];
            let mut next = b + 1;
            while next < s.allocated.len() && s.allocated[next] == alloc {
                next += 1;
            }
            let run_end = (next as u64 * MEM_BLOCK).min(size);
            out.push(Extent {
                length: run_end - at,
                hole: !alloc,
                zero: !alloc,
            });
            at = run_end;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IoError, IoErrorKind};

    #[test]
    fn holes_follow_writes_trims_and_zeroes() {
        let d = MemDevice::new(64 * 1024);
        assert_eq!(
            d.block_status(0, 100).unwrap(),
            vec![Extent {
                length: 65536,
                hole: true,
                zero: true
            }]
        );
        d.write(8192, &[1; 100], false).unwrap();
        let e = d.block_status(0, 65536).unwrap();
        assert_eq!(
            e.iter().map(|e| (e.length, e.hole)).collect::<Vec<_>>(),
            vec![(8192, true), (4096, false), (53248, true)]
        );
        d.trim(8192, 4096).unwrap();
        assert!(!d.is_allocated(8192));
        d.write(0, &[2; 8192], false).unwrap();
        d.write_zeroes(100, 8000, true).unwrap(); // no whole block inside
        assert!(d.is_allocated(0) && d.is_allocated(4096));
        d.write_zeroes(0, 8192, false).unwrap();
        assert!(d.is_allocated(0));
        d.write_zeroes(0, 8192, true).unwrap();
        assert!(!d.is_allocated(0) && !d.is_allocated(4096));
        assert!(d.contents().iter().all(|b| *b == 0));
    }

    #[test]
    fn checks_range_read_only_and_failures() {
        let d = MemDevice::new(4096).failing(1000, 1001);
        assert!(matches!(
            d.read(4000, &mut [0; 97]),
            Err(IoError {
                kind: IoErrorKind::Invalid,
                ..
            })
        ));
        assert!(matches!(
            d.read(u64::MAX, &mut [0; 2]),
            Err(IoError {
                kind: IoErrorKind::Invalid,
                ..
            })
        ));
        assert!(matches!(
            d.read(999, &mut [0; 2]),
            Err(IoError {
                kind: IoErrorKind::Io,
                ..
            })
        ));
        let r = MemDevice::new(4096).read_only();
        assert!(matches!(
            r.write(0, &[1], false),
            Err(IoError {
                kind: IoErrorKind::ReadOnly,
                ..
            })
        ));
        r.load(0, &[7; 10]);
        let mut b = [0; 10];
        r.read(0, &mut b).unwrap();
        assert_eq!(b, [7; 10]);
    }
}
