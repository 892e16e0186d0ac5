//! Syncing the data file ahead of the commits that need it.
//!
//! Every commit (a snapshot, a client's flush, a create or delete) syncs
//! the data file, and each of the daemon's durable store records syncs its
//! own file; a sync ends with a flush of the device's write cache. On the
//! virtual disks Lamina runs on, that flush takes about as long as the
//! writes it covers took to arrive, so the longer since the last sync, the
//! longer the next (docs/design.md, "Syncing ahead"; the figures are in
//! docs/bench-history.md). Starting writeback early instead moves data from
//! the page cache to the device but leaves it in the device's cache, where
//! the next flush pays for it.
//!
//! So the flusher thread syncs the data file every `SYNC_AHEAD_EVERY`
//! while data is being written, and a commit's own sync, or a store
//! record's, finds only about that long of writes unflushed. It changes no durability
//! rule: syncing the data file more often than the commits do only makes
//! acknowledged writes durable sooner; what makes them part of the pool's
//! committed state is still a commit. A failed sync sets the latch, as a
//! commit's would: after a failed `fsync` the kernel may have dropped the
//! pages it could not write, so the next sync would not report them.
//!
//! This file owns the thread's step and its pace; the thread is started
//! with the pool's other background threads (`pool.rs`).

use crate::error::Result;
use crate::pool::Pool;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How often the data file is synced while data is written: short enough
/// that a commit finds little to flush, long enough that the syncs do not
/// crowd the commits' own (a shorter period gave the same median snapshot
/// time and slower outliers: docs/bench-history.md, "Syncing ahead").
const SYNC_AHEAD_EVERY: Duration = Duration::from_millis(10);

impl Pool {
    /// Sync the data file if data was written to it through the page cache
    /// since the last sync of it (this one's or a commit's); whether it
    /// synced. The flusher thread calls this every `SYNC_AHEAD_EVERY`;
    /// tests call it by hand.
    #[doc(hidden)]
    pub fn sync_ahead(&self) -> Result<bool> {
        if self.inner.unsynced.load(Ordering::Relaxed) == 0 {
            return Ok(false);
        }
        self.sync_data("sync data ahead").map(|()| true)
    }

    pub(crate) fn flusher_loop(&self) {
        while !self.stopping() {
            std::thread::sleep(SYNC_AHEAD_EVERY);
            if self.inner.latch.check().is_err() {
                continue;
            }
            // A failure set the latch; the next request reports it.
            if let Err(e) = self.sync_ahead() {
                tracing::warn!(error = %e, "background data sync failed");
            }
        }
    }
}
