//! Commits and checkpoints: how changes become durable. A commit goes
//! either to the journal (`journal.rs`: the records of the writes and
//! snapshots since the last page-log commit, after a sync of the data they
//! point at) or to the page log (`wal.rs`: every changed metadata page);
//! a checkpoint copies the page log home and empties both. This file owns
//! the choice between them and the release of freed blocks once their
//! freeing is durable; what a page or a record looks like is in `wal.rs`
//! and `journal.rs`.

use crate::error::Result;
use crate::format::{BLOCK, GROUP};
use crate::journal::Journal;
use crate::order::Rank;
use crate::pool::Pool;
use crate::wal::Wal;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl Pool {
    /// Make every acknowledged write and metadata change durable. A
    /// failure at any step sets the latch (see `latch.rs`). When every
    /// change since the last page-log commit is a journalled one (writes
    /// and snapshots), few enough pages are dirty and the journal has room,
    /// this syncs the data and appends the queued records to the journal;
    /// otherwise it commits every changed page through the page log.
    pub fn commit(&self) -> Result<()> {
        self.commit_with(false)
    }

    /// Commit through the page log, whatever the journal could take.
    pub(crate) fn commit_pages(&self) -> Result<()> {
        self.commit_with(true)
    }

    fn commit_with(&self, pages: bool) -> Result<()> {
        let span = tracing::debug_span!("commit");
        let _span = span.enter();
        let started = Instant::now();
        if !pages {
            // The journal's lock alone: a page-log commit under way (its
            // append can take a while) does not hold this one up. The
            // records taken here never depend on it: it leaves them queued
            // until it is durable, and a change it holds that no record
            // describes keeps this path closed until then.
            let mut journal = crate::order::hold(Rank::Journal, 0, || {
                self.inner.journal.lock().unwrap_or_else(|p| p.into_inner())
            });
            let max_dirty = self.inner.opts.max_dirty_pages;
            let taken = self.with_meta(|m| {
                let room = m
                    .queue
                    .peek()
                    .is_none_or(|(first, len)| journal.takes(first, len));
                Ok(
                    (m.journal_suffices() && m.cache.dirty_count() <= max_dirty && room)
                        .then(|| (m.queue.take(), std::mem::take(&mut m.freed))),
                )
            })?;
            if let Some((records, freed)) = taken {
                return self.commit_journal(&mut journal, records, freed, started);
            }
        }
        let mut wal = crate::order::hold(Rank::Wal, 0, || {
            self.inner.wal.lock().unwrap_or_else(|p| p.into_inner())
        });
        let txn = wal.next_txn;
        let c = self.with_meta(|m| m.collect(txn))?;
        let collected = started.elapsed();
        if let Err(e) = self.sync_data("sync pool") {
            self.lock_meta().uncommitted(c);
            return Err(e);
        }
        let synced = started.elapsed();
        if c.pages.is_empty() && c.freed.is_empty() {
            // Nothing to log: what memory holds is what is durable.
            self.lock_meta().committed(&c, &[]);
            tracing::debug!(
                pages = 0,
                sync_us = synced.as_micros() as u64,
                "data synced, no metadata to log"
            );
            return Ok(());
        }
        let bytes = (c.pages.len() * (BLOCK + 64) + 64) as u64;
        if wal.pos + bytes > wal.capacity {
            if let Err(e) = self.checkpoint_locked(&mut wal) {
                self.lock_meta().uncommitted(c);
                return Err(e);
            }
        }
        let appending = Instant::now();
        let offsets = match wal.append(&c.pages) {
            Ok(o) => o,
            Err(e) => {
                self.lock_meta().uncommitted(c);
                return Err(e);
            }
        };
        let appended = appending.elapsed();
        self.inner.commits.pages.fetch_add(1, Ordering::Relaxed);
        self.lock_meta().committed(&c, &offsets);
        self.inner.log_used.store(wal.pos, Ordering::Relaxed);
        crate::order::hold(Rank::Leaf, 0, || {
            self.inner.to_home.lock().unwrap_or_else(|p| p.into_inner())
        })
        .extend(c.pages.iter().map(|(b, _)| *b).zip(offsets.iter().copied()));
        drop(wal);
        // Once the journal holds only records this commit holds too, and
        // is a quarter full, start it afresh.
        let mut journal = crate::order::hold(Rank::Journal, 0, || {
            self.inner.journal.lock().unwrap_or_else(|p| p.into_inner())
        });
        if journal.pos > journal.capacity / 4 && journal.next <= c.covered + 1 {
            journal.reset(c.covered + 1)?;
        }
        drop(journal);
        let (pages, freed) = (c.pages.len(), c.freed.len());
        self.release_freed(c.freed);
        tracing::debug!(
            txn,
            pages,
            log_bytes = bytes,
            freed,
            collect_us = collected.as_micros() as u64,
            sync_us = (synced - collected).as_micros() as u64,
            append_us = appended.as_micros() as u64,
            total_us = started.elapsed().as_micros() as u64,
            "commit"
        );
        Ok(())
    }

    /// The journal's half of [`Pool::commit`]: sync the data the records
    /// point at, append the records, then let go of the blocks they freed.
    fn commit_journal(
        &self,
        journal: &mut Journal,
        records: Option<(u64, u32, Vec<u8>)>,
        freed: Vec<u64>,
        started: Instant,
    ) -> Result<()> {
        let r = self.sync_data("sync pool").and_then(|()| {
            let synced = started.elapsed();
            if let Some((first, n, bytes)) = &records {
                journal.append(*first, *n, bytes)?;
            }
            Ok(synced)
        });
        let synced = match r {
            Ok(s) => s,
            Err(e) => {
                // The latch is set; the frees stay pending, as a failed
                // page-log commit leaves them.
                self.lock_meta().freed.extend(freed);
                return Err(e);
            }
        };
        let nfreed = freed.len();
        self.release_freed(freed);
        if let Some((_, n, bytes)) = &records {
            self.inner.commits.journal.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                records = n,
                bytes = bytes.len(),
                freed = nfreed,
                sync_us = synced.as_micros() as u64,
                total_us = started.elapsed().as_micros() as u64,
                "journal commit"
            );
        }
        Ok(())
    }

    /// The transaction that freed these blocks is durable: punch them and
    /// let the allocator have them (or keep them back until the next
    /// checkpoint if the log holds an image of them).
    fn release_freed(&self, freed: Vec<u64>) {
        if freed.is_empty() {
            return;
        }
        let (now, later): (Vec<u64>, Vec<u64>) = {
            let m = self.lock_meta();
            freed
                .into_iter()
                .partition(|b| !m.wal_index.contains_key(b))
        };
        crate::order::hold(Rank::Leaf, 0, || {
            self.inner.awaiting_checkpoint.lock().unwrap()
        })
        .extend(later);
        if self.punch(&now).is_err() {
            // The latch is set: nothing is allocated any more.
            return;
        }
        let _barrier = crate::order::hold(Rank::ReadBarrier, 0, || {
            self.inner
                .read_barrier
                .write()
                .unwrap_or_else(|p| p.into_inner())
        });
        self.lock_meta().release(&now);
    }

    /// Deallocate freed blocks. The transaction that freed them is durable
    /// whatever happens here, but a failed punch is a failing disk: it sets
    /// the latch, and the caller's next request is refused.
    fn punch(&self, blocks: &[u64]) -> Result<()> {
        let mut sorted = blocks.to_vec();
        sorted.sort_unstable();
        let f = &self.inner.file;
        let mut i = 0;
        while i < sorted.len() {
            let mut j = i + 1;
            while j < sorted.len() && sorted[j] == sorted[j - 1] + 1 {
                j += 1;
            }
            let (at, len) = (sorted[i] * BLOCK as u64, (j - i) as u64 * BLOCK as u64);
            self.inner
                .latch
                .io("punch freed blocks", f.path(), at, f.punch(at, len))?;
            i = j;
        }
        Ok(())
    }

    fn checkpoint_locked(&self, wal: &mut Wal) -> Result<()> {
        self.inner.latch.check()?;
        let span = tracing::debug_span!("checkpoint");
        let _span = span.enter();
        let started = Instant::now();
        // No copy ahead reads the log while it is reset (`home.rs`).
        let _homing = crate::order::hold(Rank::Homing, 0, || {
            self.inner.homing.write().unwrap_or_else(|p| p.into_inner())
        });
        let index = self.lock_meta().wal_index.clone();
        let homed = std::mem::take(&mut **crate::order::hold(Rank::Leaf, 0, || {
            self.inner.homed.lock().unwrap_or_else(|p| p.into_inner())
        }));
        crate::order::hold(Rank::Leaf, 0, || {
            self.inner.to_home.lock().unwrap_or_else(|p| p.into_inner())
        })
        .clear();
        let written = wal.checkpoint(&index, &homed, self.inner.file.as_ref())?;
        self.lock_meta().wal_index.clear();
        self.inner.log_used.store(wal.pos, Ordering::Relaxed);
        let held = std::mem::take(&mut **crate::order::hold(Rank::Leaf, 0, || {
            self.inner.awaiting_checkpoint.lock().unwrap()
        }));
        // The checkpoint itself is done: a failed punch only sets the latch.
        if self.punch(&held).is_ok() {
            let _barrier = crate::order::hold(Rank::ReadBarrier, 0, || {
                self.inner
                    .read_barrier
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
            });
            self.lock_meta().release(&held);
        }
        tracing::debug!(
            pages = index.len(),
            written,
            bytes = (written * BLOCK) as u64,
            released = held.len(),
            total_us = started.elapsed().as_micros() as u64,
            "checkpoint"
        );
        Ok(())
    }

    /// Commit every changed page, copy the log's pages home and empty
    /// the log and the journal.
    pub fn checkpoint(&self) -> Result<()> {
        self.commit_pages()?;
        let mut wal = crate::order::hold(Rank::Wal, 0, || {
            self.inner.wal.lock().unwrap_or_else(|p| p.into_inner())
        });
        self.checkpoint_locked(&mut wal)?;
        let mut journal = crate::order::hold(Rank::Journal, 0, || {
            self.inner.journal.lock().unwrap_or_else(|p| p.into_inner())
        });
        // With the log held, no commit is under way: the last page-log
        // commit is the state just checkpointed. Writes since then may
        // have reached the journal; it is emptied only if they did not.
        let covered = self.lock_meta().sb.journal_covered;
        if !journal.is_empty() && journal.next <= covered + 1 {
            journal.reset(covered + 1)?;
        }
        Ok(())
    }

    /// Commit every changed page if there are more than a pool may hold
    /// (`max_dirty_pages`); checkpoint if too many freed blocks wait for one.
    pub(crate) fn maybe_commit(&self) -> Result<()> {
        let dirty = self.lock_meta().cache.dirty_count();
        let held = crate::order::hold(Rank::Leaf, 0, || {
            self.inner.awaiting_checkpoint.lock().unwrap()
        })
        .len();
        if dirty > self.inner.opts.max_dirty_pages {
            // The writeback thread commits pages from half of this on;
            // past it, writers wait for a page-log commit themselves.
            self.commit_pages()?;
        }
        if held > 4 * GROUP as usize {
            self.checkpoint()?;
        }
        Ok(())
    }
}
