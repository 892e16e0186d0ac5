//! Opening the journal of index changes (`journal.rs`) and giving back,
//! when a pool opens, the changes its records describe past the last
//! page-log commit: each record is applied through the same function the
//! write or snapshot ran (so the index, refcounts and catalog come out as
//! they were), with checks first, so that a record that does not fit the
//! pool is refused by name instead of applied. Also the upgrade of a pool
//! of format version 1, which had no journal. The pool then commits what
//! was given back through the page log and starts the journal afresh.

use crate::error::{Error, Result};
use crate::format::*;
use crate::journal::{Journal, Op};
use crate::latch::Latch;
use crate::meta::Meta;
use crate::pool::{Pool, PoolOptions, JOURNAL_FILE};
use crate::storage::{Backend, BlockFile};
use std::sync::Arc;

/// Open (or, for a version-1 pool, create) the journal and apply its
/// records after the last one the page log holds. Returns the journal,
/// whether the pool was upgraded, and how many records were applied.
pub(crate) fn open_journal(
    backend: &Arc<dyn Backend>,
    latch: &Arc<Latch>,
    meta: &mut Meta,
    opts: &PoolOptions,
) -> Result<(Journal, bool, usize)> {
    let loc = backend.location().to_path_buf();
    let pool_id = meta.sb.pool_id;
    if meta.sb.version == FORMAT_VERSION_NO_JOURNAL {
        // A pool written before the journal: make one, then (the caller
        // checkpoints) the superblock of version 2 that says it exists.
        let f = backend
            .open(JOURNAL_FILE, true)
            .map_err(|e| Error::io("create journal", &loc, 0, e))?;
        let j = Journal::create(f, latch.clone(), pool_id, opts.journal_bytes, 1)?;
        meta.sb.version = FORMAT_VERSION;
        meta.sb_dirty = true;
        tracing::info!(pool = %loc.display(), "upgraded the pool to format version {FORMAT_VERSION} (journal of index changes)");
        return Ok((j, true, 0));
    }
    let f = open_file(backend, false)?;
    let (j, records) = Journal::open(f, latch.clone(), pool_id, opts.journal_bytes)?;
    meta.queue = crate::journal::Queue::new(meta.sb.journal_covered + 1);
    let n = replay(meta, records)?;
    if n > 0 {
        tracing::info!(pool = %loc.display(), records = n, "applied the journal");
    }
    Ok((j, false, n))
}

/// Apply the journal's records in memory only, reading it without writing
/// (`Pool::open_meta_read_only`). A pool of version 1 has no journal:
/// nothing to apply (its next open makes one). Returns how many records
/// were applied.
pub(crate) fn apply_read_only(
    backend: &Arc<dyn Backend>,
    latch: &Arc<Latch>,
    meta: &mut Meta,
    opts: &PoolOptions,
) -> Result<usize> {
    if meta.sb.version == FORMAT_VERSION_NO_JOURNAL {
        return Ok(0);
    }
    let f = open_file(backend, true)?;
    let (_, records) = Journal::open(f, latch.clone(), meta.sb.pool_id, opts.journal_bytes)?;
    meta.queue = crate::journal::Queue::new(meta.sb.journal_covered + 1);
    replay(meta, records)
}

/// The journal file, which must exist; `read_only`: opened to be read only.
fn open_file(backend: &Arc<dyn Backend>, read_only: bool) -> Result<Arc<dyn BlockFile>> {
    let loc = backend.location();
    if !backend.exists(JOURNAL_FILE) {
        return Err(Error::NotAPool {
            path: loc.to_path_buf(),
            detail: format!(
                "{JOURNAL_FILE} is missing: it may hold acknowledged writes, so the pool is not opened without it"
            ),
        });
    }
    let f = if read_only {
        backend.open_read(JOURNAL_FILE)
    } else {
        backend.open(JOURNAL_FILE, false)
    };
    f.map_err(|e| Error::io("open journal", loc, 0, e))
}

fn bad(lseq: u64, detail: String) -> Error {
    Error::corrupt(0, format!("journal record {lseq}: {detail}"))
}

/// Apply the records after `meta.sb.journal_covered`, in order.
fn replay(meta: &mut Meta, records: Vec<(u64, Op)>) -> Result<usize> {
    let covered = meta.sb.journal_covered;
    let records: Vec<(u64, Op)> = records.into_iter().filter(|(l, _)| *l > covered).collect();
    if records.is_empty() {
        return Ok(0);
    }
    // Frames may skip records the page log took, never one it did not.
    for (want, (lseq, _)) in (covered + 1..).zip(records.iter()) {
        if *lseq != want {
            return Err(bad(
                *lseq,
                format!(
                    "records {want} to {} are missing (the pool holds records up to {covered})",
                    lseq - 1
                ),
            ));
        }
    }
    // Every data block a record installs is kept from the allocator until
    // the last record that installs it is applied, so that no node made
    // while replaying lands on one.
    for (lseq, op) in &records {
        if let Op::Map { block, n, .. } = op {
            for b in *block..*block + *n as u64 {
                if is_system_block(b) {
                    return Err(bad(
                        *lseq,
                        format!("data block {b} is not a data block of the pool"),
                    ));
                }
                // The pool grew to hold it before the crash; it grows again
                // (growing is not journalled, see `Meta::grow`).
                meta.grow_over(b)?;
                meta.reserved.insert(b);
                *meta.replay_installs.entry(b).or_default() += 1;
            }
        }
    }
    let last = records.last().map(|(l, _)| *l).unwrap_or(covered);
    // New index nodes and record pages go where the killed process already
    // took disk space for them, so that a pool killed on a full disk opens
    // again (see `Meta::alloc_meta`).
    meta.replaying = true;
    let applied = records
        .iter()
        .try_for_each(|(lseq, op)| apply(meta, *lseq, op));
    meta.end_replay();
    applied?;
    // What applying them queued again is in the page-log commit the open
    // makes next; numbering goes on after the last record read.
    let next = meta.queue.next.max(last + 1);
    meta.queue = crate::journal::Queue::new(next);
    // A block freed by one record and installed by a later one was freed,
    // then reused, before the crash: it is in use now, and must be
    // neither punched nor handed out again.
    let mut kept = Vec::new();
    for b in std::mem::take(&mut meta.freed) {
        if meta.rc(b)? == 0 {
            kept.push(b);
        } else {
            meta.unavailable.remove(&b);
        }
    }
    meta.freed = kept;
    Ok(records.len())
}

fn volume_blocks(meta: &Meta, lseq: u64, vol: u64) -> Result<u64> {
    match meta.catalog.get(vol) {
        Some(Record::Volume(v)) => Ok(v.size.div_ceil(BLOCK as u64)),
        _ => Err(bad(lseq, format!("volume #{vol} does not exist"))),
    }
}

fn apply(meta: &mut Meta, lseq: u64, op: &Op) -> Result<()> {
    match op {
        Op::Map {
            vol,
            first,
            n,
            block,
        } => {
            let size = volume_blocks(meta, lseq, *vol)?;
            if first.checked_add(*n as u64).is_none_or(|end| end > size) {
                return Err(bad(
                    lseq,
                    format!("blocks {first}+{n} are past the volume's end"),
                ));
            }
            let blocks: Vec<u64> = (*block..*block + *n as u64).collect();
            for &b in &blocks {
                let rc = meta.rc(b)?;
                if rc != 0 {
                    return Err(bad(
                        lseq,
                        format!("installs block {b}, which is in use ({rc:#x})"),
                    ));
                }
            }
            Pool::install_journaled(meta, *vol, *first, &blocks)?;
            for b in blocks {
                if let Some(n) = meta.replay_installs.get_mut(&b) {
                    *n -= 1;
                    if *n == 0 {
                        meta.replay_installs.remove(&b);
                    }
                }
            }
            Ok(())
        }
        Op::Unmap { vol, idx } => {
            if *idx >= volume_blocks(meta, lseq, *vol)? {
                return Err(bad(lseq, format!("block {idx} is past the volume's end")));
            }
            Pool::unmap_journaled(meta, *vol, *idx)
        }
        Op::Snapshot {
            vol,
            id,
            created,
            system,
            name,
            labels,
        } => {
            volume_blocks(meta, lseq, *vol)?;
            if meta.sb.next_id > *id {
                return Err(bad(lseq, format!("snapshot id {id} was already given out")));
            }
            meta.sb.next_id = *id;
            Pool::new_snapshot(meta, *vol, name.clone(), labels, *system, *created).map(|_| ())
        }
    }
}
