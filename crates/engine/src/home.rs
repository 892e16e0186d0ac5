//! Copying committed log images home ahead of the checkpoint.
//!
//! A checkpoint copies every page image in the log to its home in the pool
//! file, syncs, and starts the log afresh; it runs inside the commit that
//! finds the log full, so under a write load, without this file, one commit
//! in a dozen or so (a snapshot's, a client's flush) would wait for tens of
//! megabytes of page writes (docs/design.md, "Copies home, written out a
//! few at a time"). Here the writeback thread copies committed images home
//! while the log fills, so the checkpoint writes only the images logged
//! since.
//!
//! Why this is safe without changing the log: a committed image written
//! home early is exactly what a replay (or the checkpoint) would write
//! there later, and until the checkpoint the log keeps it, so a crash that
//! tears the early write is repaired by the replay at the next open, as a
//! crash in the middle of a checkpoint is. No block whose image is in the
//! log is reused before the checkpoint (`release_freed` holds them back),
//! so an early write never lands on data. What must not happen is reading
//! an image from a log that a checkpoint has meanwhile reset and a later
//! commit overwritten: copies hold `homing` shared for the whole batch and
//! a checkpoint takes it exclusively.
//!
//! Invariant: `homed[b] == off` only if the image at log offset `off`, the
//! committed image of block `b` when it was copied, is at `b`'s home (not
//! necessarily durable: the checkpoint's sync covers it). The checkpoint
//! skips exactly those blocks whose latest image is still that one.

use crate::error::Result;
use crate::format::{new_page, BLOCK};
use crate::order::Rank;
use crate::pool::Pool;
use std::sync::atomic::Ordering;

/// Images copied home per batch: a checkpoint waits for at most one batch.
pub(crate) const HOME_BATCH: usize = 512;

/// Copies written out together before the next are written: what a
/// commit's sync that starts meanwhile may find in flight. A whole batch
/// in flight at once would make a snapshot's sync that starts then wait
/// for all of it (docs/design.md, "Copies home, written out a few at a
/// time"). While a batch is written out, a checkpoint waits for it (it
/// takes `homing`).
const HOME_IN_FLIGHT: usize = 64;

impl Pool {
    /// Copy home the next `max` committed log images not looked at yet
    /// (fewer if some were replaced since); how many were copied. The
    /// writeback thread calls this once the log is a quarter full; tests
    /// call it by hand.
    #[doc(hidden)]
    pub fn home_ahead(&self, max: usize) -> Result<usize> {
        let _batch = crate::order::hold(Rank::Homing, 0, || {
            self.inner.homing.read().unwrap_or_else(|p| p.into_inner())
        });
        // The next images in log order (commits queue them), not a walk of
        // the whole log index: this runs beside the I/O path, which takes
        // the metadata mutex too.
        let next: Vec<(u64, u64)> = {
            let mut q = crate::order::hold(Rank::Leaf, 0, || {
                self.inner.to_home.lock().unwrap_or_else(|p| p.into_inner())
            });
            let n = q.len().min(max);
            q.drain(..n).collect()
        };
        if next.is_empty() {
            return Ok(0);
        }
        // An image a later commit replaced is skipped: its replacement is
        // further on in the queue.
        let mut batch: Vec<(u64, u64)> = {
            let m = self.lock_meta();
            next.into_iter()
                .filter(|(b, off)| m.wal_index.get(b) == Some(off))
                .collect()
        };
        if batch.is_empty() {
            return Ok(0);
        }
        self.inner.latch.check()?;
        batch.sort_unstable();
        let (log, pool) = (&self.inner.log, &self.inner.file);
        let mut page = new_page();
        for part in batch.chunks(HOME_IN_FLIGHT) {
            for &(block, off) in part {
                let r = log.read_at(&mut page[..], off);
                self.inner
                    .latch
                    .io("read log to copy home", log.path(), off, r)?;
                let at = block * BLOCK as u64;
                let r = pool.write_at(&page[..], at);
                self.inner.latch.io("copy page home", pool.path(), at, r)?;
            }
            let ranges: Vec<(u64, u64)> = part
                .iter()
                .map(|&(b, _)| (b * BLOCK as u64, BLOCK as u64))
                .collect();
            let at = ranges[0].0;
            let r = pool.write_out(&ranges);
            self.inner
                .latch
                .io("write copies home", pool.path(), at, r)?;
        }
        let n = batch.len();
        crate::order::hold(Rank::Leaf, 0, || {
            self.inner.homed.lock().unwrap_or_else(|p| p.into_inner())
        })
        .extend(batch);
        Ok(n)
    }

    /// The writeback thread's share: copy images home while the log is
    /// more than a quarter full, a batch at a time (each written out before
    /// the next, see `HOME_IN_FLIGHT`).
    pub(crate) fn home_while_filling(&self) -> Result<()> {
        let capacity = self.inner.opts.wal_bytes;
        let mut total = 0;
        while self.inner.log_used.load(Ordering::Relaxed) > capacity / 4 && !self.stopping() {
            total += self.home_ahead(HOME_BATCH)?;
            if crate::order::hold(Rank::Leaf, 0, || {
                self.inner.to_home.lock().unwrap_or_else(|p| p.into_inner())
            })
            .is_empty()
            {
                break;
            }
        }
        if total > 0 {
            tracing::debug!(
                pages = total,
                "copied log images home ahead of the checkpoint"
            );
        }
        Ok(())
    }
}
