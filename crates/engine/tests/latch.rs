//! The I/O-failure latch, one fail point per kind of failure: a data write,
//! a data sync (at a flush, at a snapshot, and ahead of them), a log
//! append, a log sync, each step of a checkpoint and of a copy home ahead
//! of it, and the punch of blocks freed by reclaim. For each: the call
//! that hits the failure errors (with the I/O error, not the latch's), the
//! pool names the failure, every later request is refused with the latch's
//! error and does no I/O, and after a power cut and a reopen the pool
//! passes `check` and holds exactly what was acknowledged (flushed or
//! committed) before the failure.

mod common;

use common::*;
use lamina_engine::sim::{SimBackend, SimOp};
use lamina_engine::{Error, Pool, PoolOptions, Result, JOURNAL_FILE, POOL_FILE, WAL_FILE};
use std::collections::BTreeSet;
use std::sync::Arc;

const SIZE: u64 = 1 << 24;

fn opts() -> PoolOptions {
    PoolOptions {
        cache_bytes: 64 * 4096,
        journal_bytes: 16 << 20,
        wal_bytes: 4 << 20,
        max_dirty_pages: usize::MAX,
        max_bytes: 0,
        background: false,
    }
}

fn write(pool: &Pool, model: &mut Model, vol: &str, blocks: &[u64], seed: u8) -> Result<()> {
    let h = pool.open_volume(vol)?;
    for &b in blocks {
        let data = pattern(seed, b * BS, BS as usize);
        h.write(b * BS, &data)?;
        model.vols.get_mut(vol).unwrap().write(b * BS, &data);
    }
    Ok(())
}

/// A pool with two volumes, a snapshot, data in the log and in place, and
/// a deleted snapshot whose blocks reclaim has yet to free. Returns it with
/// the model of what it holds, all of it committed.
fn setup() -> (Arc<SimBackend>, Pool, Model) {
    let backend = Arc::new(SimBackend::new());
    let pool = Pool::create(backend.clone(), opts()).unwrap();
    let mut m = Model::default();
    for v in ["a", "b"] {
        pool.create_volume(v, SIZE).unwrap();
        m.vols.insert(v.into(), MVol::new(SIZE));
    }
    write(&pool, &mut m, "a", &[0, 1, 2, 3, 600], 1).unwrap();
    pool.create_snapshot("a", "s", &[]).unwrap();
    let mut snap = m.vols["a"].clone();
    snap.clone = false;
    m.snaps.insert(("a".into(), "s".into()), snap);
    write(&pool, &mut m, "a", &[2, 3, 4], 2).unwrap();
    write(&pool, &mut m, "b", &[7, 8], 3).unwrap();
    pool.create_snapshot("b", "old", &[]).unwrap();
    write(&pool, &mut m, "b", &[7, 8], 4).unwrap();
    pool.delete_snapshot("b", "old").unwrap();
    pool.commit().unwrap();
    (backend, pool, m)
}

struct Case {
    name: &'static str,
    file: &'static str,
    op: SimOp,
    /// Which such operation on that file, counted from the trigger's start.
    nth: u64,
    /// The latch's record of the failure: its operation.
    failed_op: &'static str,
    /// The request that hits the fail point; it may change the model only
    /// by what it has been acknowledged.
    trigger: fn(&Pool, &mut Model) -> Result<()>,
    /// The trigger itself reports the failure (false: its own work was
    /// durable before the failure, as for a punch after a commit).
    trigger_fails: bool,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "data write",
            file: POOL_FILE,
            op: SimOp::Write,
            nth: 1,
            failed_op: "write data",
            trigger: |p, m| write(p, &mut m.clone(), "a", &[40], 5),
            trigger_fails: true,
        },
        Case {
            name: "data write in place",
            file: POOL_FILE,
            op: SimOp::Write,
            nth: 1,
            failed_op: "write data",
            trigger: |p, m| write(p, &mut m.clone(), "a", &[4], 5),
            trigger_fails: true,
        },
        Case {
            name: "data sync at a flush",
            file: POOL_FILE,
            op: SimOp::Sync,
            nth: 1,
            failed_op: "sync pool",
            trigger: |p, m| {
                write(p, &mut m.clone(), "a", &[41, 0], 6)?;
                p.open_volume("a")?.flush()
            },
            trigger_fails: true,
        },
        Case {
            // The flusher's step (`Pool::sync_ahead`): nothing waits for
            // it, so the latch is what reports it.
            name: "data sync ahead",
            file: POOL_FILE,
            op: SimOp::Sync,
            nth: 1,
            failed_op: "sync data ahead",
            trigger: |p, m| {
                write(p, &mut m.clone(), "a", &[42, 1], 9)?;
                assert!(p.sync_ahead()?, "data was written: it must sync");
                Ok(())
            },
            trigger_fails: true,
        },
        Case {
            name: "data sync at a snapshot",
            file: POOL_FILE,
            op: SimOp::Sync,
            nth: 1,
            failed_op: "sync pool",
            trigger: |p, _| p.create_snapshot("a", "s2", &[]).map(drop),
            trigger_fails: true,
        },
        Case {
            name: "log append",
            file: WAL_FILE,
            op: SimOp::Write,
            nth: 1,
            failed_op: "append to log",
            // A new volume is not a journal record: its commit goes to
            // the page log, with the write before it.
            trigger: |p, m| {
                write(p, &mut m.clone(), "b", &[42], 7)?;
                p.create_volume("c", SIZE).map(drop)
            },
            trigger_fails: true,
        },
        Case {
            name: "journal append",
            file: JOURNAL_FILE,
            op: SimOp::Write,
            nth: 1,
            failed_op: "append to journal",
            trigger: |p, m| {
                write(p, &mut m.clone(), "b", &[42], 7)?;
                p.open_volume("b")?.flush()
            },
            trigger_fails: true,
        },
        Case {
            name: "journal sync",
            file: JOURNAL_FILE,
            op: SimOp::Sync,
            nth: 1,
            failed_op: "sync journal",
            trigger: |p, m| {
                write(p, &mut m.clone(), "a", &[43], 8)?;
                p.create_snapshot("a", "s3", &[]).map(drop)
            },
            trigger_fails: true,
        },
        Case {
            name: "log sync",
            file: WAL_FILE,
            op: SimOp::Sync,
            nth: 1,
            failed_op: "sync log",
            trigger: |p, _| p.create_volume("c", SIZE).map(drop),
            trigger_fails: true,
        },
        Case {
            name: "checkpoint: page written home",
            file: POOL_FILE,
            op: SimOp::Write,
            nth: 1,
            failed_op: "write page home",
            trigger: |p, _| p.checkpoint(),
            trigger_fails: true,
        },
        Case {
            // setup()'s last commit went to the page log (a snapshot's
            // deletion): its images wait to be copied home.
            name: "copy home: page written",
            file: POOL_FILE,
            op: SimOp::Write,
            nth: 1,
            failed_op: "copy page home",
            trigger: |p, _| p.home_ahead(usize::MAX).map(drop),
            trigger_fails: true,
        },
        Case {
            name: "copy home: written out",
            file: POOL_FILE,
            op: SimOp::WriteOut,
            nth: 1,
            failed_op: "write copies home",
            trigger: |p, _| p.home_ahead(usize::MAX).map(drop),
            trigger_fails: true,
        },
        Case {
            // The first sync is the commit's, of the data file.
            name: "checkpoint: pool sync",
            file: POOL_FILE,
            op: SimOp::Sync,
            nth: 2,
            failed_op: "sync pool at a checkpoint",
            trigger: |p, _| p.checkpoint(),
            trigger_fails: true,
        },
        Case {
            name: "checkpoint: log header",
            file: WAL_FILE,
            op: SimOp::Write,
            nth: 1,
            failed_op: "write log header",
            trigger: |p, _| p.checkpoint(),
            trigger_fails: true,
        },
        Case {
            // Reclaim commits, then punches what it freed: the commit holds.
            name: "reclaim: punch of freed blocks",
            file: POOL_FILE,
            op: SimOp::Punch,
            nth: 1,
            failed_op: "punch freed blocks",
            trigger: |p, _| p.reclaim_all().map(drop),
            trigger_fails: false,
        },
    ]
}

fn run(name: &str) {
    let all = cases();
    let case = all.iter().find(|c| c.name == name).expect("no such case");
    let (backend, pool, mut model) = setup();
    assert!(pool.failure().is_none());
    backend.fail_on(case.file, case.op, case.nth);
    let r = (case.trigger)(&pool, &mut model);
    assert!(
        !backend.aimed(),
        "{}: the fail point was never reached",
        case.name
    );
    match (&r, case.trigger_fails) {
        (Err(Error::Unavailable(_)), _) => {
            panic!("{}: the failing call must report its own error", case.name)
        }
        (Err(e), true) => assert!(
            e.to_string().contains("injected failure"),
            "{}: {e}",
            case.name
        ),
        (Ok(()), true) => panic!("{}: the call that failed succeeded", case.name),
        (_, false) => {}
    }
    let first = pool
        .failure()
        .unwrap_or_else(|| panic!("{}: the latch is not set", case.name));
    assert_eq!(first.op, case.failed_op, "{}: {first}", case.name);
    assert!(first.path.ends_with(case.file), "{}: {first}", case.name);
    assert!(first.cause.contains("injected failure"), "{first}");

    // The disk is healthy again: the refusals come from the latch alone.
    backend.fail_after(None);
    let b = backend.clone();
    assert_refused(&pool, &first, Some(&move || b.ops()));

    // Reopen after a power cut: exactly what was acknowledged.
    pool.abandon();
    backend.crash(None);
    let pool = Pool::open(backend.clone(), opts()).unwrap();
    assert!(pool.failure().is_none(), "a reopened pool starts healthy");
    let report = pool.check().unwrap();
    assert!(
        report.is_ok(),
        "{}: check: {:?}",
        case.name,
        report.problems
    );
    if let Err(e) = model.compare(&pool, &BTreeSet::new()) {
        panic!("{}: after reopening: {e}", case.name);
    }
    // And it works again.
    write(&pool, &mut model, "a", &[43], 8).unwrap();
    pool.create_snapshot("a", "after", &[]).unwrap();
    pool.close().unwrap();
}

#[test]
fn data_write_failure_latches() {
    run("data write");
    run("data write in place");
}

#[test]
fn data_sync_failure_latches() {
    run("data sync at a flush");
    run("data sync ahead");
    run("data sync at a snapshot");
}

#[test]
fn log_append_failure_latches() {
    run("log append");
}

#[test]
fn journal_append_failure_latches() {
    run("journal append");
}

#[test]
fn journal_sync_failure_latches() {
    run("journal sync");
}

#[test]
fn log_sync_failure_latches() {
    run("log sync");
}

#[test]
fn checkpoint_failure_latches() {
    run("checkpoint: page written home");
    run("checkpoint: pool sync");
    run("checkpoint: log header");
}

#[test]
fn copy_home_failure_latches() {
    run("copy home: page written");
    run("copy home: written out");
}

#[test]
fn reclaim_punch_failure_latches() {
    run("reclaim: punch of freed blocks");
}

/// A full disk is not a failure: the writer gets `no space left`, and the
/// pool keeps serving.
#[test]
fn a_full_disk_does_not_latch() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create_dir(
        dir.path(),
        PoolOptions {
            max_bytes: 20 << 20,
            background: false,
            ..PoolOptions::default()
        },
    )
    .unwrap();
    pool.create_volume("v", 1 << 30).unwrap();
    let h = pool.open_volume("v").unwrap();
    let mut full = None;
    for b in 0..(1u64 << 15) {
        if let Err(e) = h.write(b * BS, &[1; 4096]) {
            full = Some(e);
            break;
        }
    }
    let e = full.expect("the pool never filled");
    assert!(e.is_no_space(), "{e}");
    assert!(pool.failure().is_none(), "a full pool must not latch");
    h.flush().unwrap();
    pool.close().unwrap();
}

/// The flusher's step syncs exactly what was written through the page
/// cache since the last one: an overwrite in place (no metadata changes,
/// so no commit would carry it) survives a power cut after it, and is lost
/// without it; with nothing written, it does not sync.
#[test]
fn sync_ahead_makes_written_data_durable() {
    let backend = Arc::new(SimBackend::new());
    let pool = Pool::create(backend.clone(), opts()).unwrap();
    pool.create_volume("v", SIZE).unwrap();
    let h = pool.open_volume("v").unwrap();
    let old = pattern(1, 0, BS as usize);
    h.write(0, &old).unwrap();
    h.write(BS, &old).unwrap();
    pool.commit().unwrap();
    assert!(
        !pool.sync_ahead().unwrap(),
        "the commit left nothing to sync"
    );

    // Block 0 is overwritten and synced ahead; block 1 after that, not.
    let new = pattern(2, 0, BS as usize);
    h.write(0, &new).unwrap();
    let ops = backend.ops();
    assert!(pool.sync_ahead().unwrap());
    assert!(backend.ops() > ops, "it must reach the disk");
    assert!(!pool.sync_ahead().unwrap(), "nothing written since");
    h.write(BS, &new).unwrap();
    drop(h);
    pool.abandon();
    backend.crash(None);

    let pool = Pool::open(backend.clone(), opts()).unwrap();
    let h = pool.open_volume("v").unwrap();
    let mut buf = vec![0u8; BS as usize];
    h.read(0, &mut buf).unwrap();
    assert!(
        buf == new,
        "block 0 was synced ahead: its new data must survive"
    );
    h.read(BS, &mut buf).unwrap();
    assert!(buf == old, "block 1 was never synced: the cut loses it");
    assert!(pool.check().unwrap().is_ok());
}
