//! Fail points at every step of every metadata update: a scripted workload
//! runs once to count its mutating I/O operations, then once per operation
//! with the disk failing from that operation on. After each failure the
//! pool's latch must be set, naming the failure, and every later request
//! must be refused with the latch's error and do no I/O. Then the process
//! "loses power" (unsynced writes dropped or torn), the pool is reopened,
//! and it must be consistent (check passes) and hold exactly the state
//! before the failing step or, for a step that may have committed, after it.

mod common;

use common::*;
use lamina_engine::sim::SimBackend;
use lamina_engine::{Pool, PoolOptions, Result};
use std::collections::BTreeSet;
use std::sync::Arc;

const BIG: u64 = 1 << 30;

type EngineFn = Box<dyn Fn(&Pool) -> Result<()>>;
type ModelFn = Box<dyn Fn(&mut Model)>;

struct Step {
    name: &'static str,
    /// Commits before returning: a failure may leave it done or not done.
    commits: bool,
    engine: EngineFn,
    model: ModelFn,
}

fn write(vol: &'static str, blocks: &'static [u64], seed: u8, delta: u64) -> Step {
    Step {
        name: "write",
        commits: false,
        engine: Box::new(move |p| {
            let h = p.open_volume(vol)?;
            for &b in blocks {
                let off = b * BS + delta;
                h.write(off, &pattern(seed, off, BS as usize))?;
            }
            Ok(())
        }),
        model: Box::new(move |m| {
            let v = m.vols.get_mut(vol).unwrap();
            for &b in blocks {
                let off = b * BS + delta;
                v.write(off, &pattern(seed, off, BS as usize));
            }
        }),
    }
}

fn step(
    name: &'static str,
    engine: impl Fn(&Pool) -> Result<()> + 'static,
    model: impl Fn(&mut Model) + 'static,
) -> Step {
    Step {
        name,
        commits: true,
        engine: Box::new(engine),
        model: Box::new(model),
    }
}

fn snap_of(m: &Model, v: &str) -> MVol {
    let mut s = m.vols[v].clone();
    s.clone = false;
    s
}

fn script() -> Vec<Step> {
    let k = |a: &str, b: &str| (a.to_string(), b.to_string());
    vec![
        step(
            "create a",
            |p| p.create_volume("a", BIG).map(drop),
            |m| {
                m.vols.insert("a".into(), MVol::new(BIG));
            },
        ),
        write("a", &[0, 1, 2, 503, 504, 100_000, 262_143], 1, 0),
        step("flush", |p| p.commit(), |_| {}),
        step(
            "snapshot a@s1",
            |p| p.create_snapshot("a", "s1", &[]).map(drop),
            move |m| {
                let s = snap_of(m, "a");
                m.snaps.insert(k("a", "s1"), s);
            },
        ),
        write("a", &[1, 504, 100_001], 2, 7),
        Step {
            name: "trim",
            commits: false,
            engine: Box::new(|p| p.open_volume("a")?.trim(0, 3 * BS)),
            model: Box::new(|m| m.vols.get_mut("a").unwrap().zero(0, 3 * BS)),
        },
        step(
            "clone a@s1 -> b",
            |p| p.clone_snapshot("a", "s1", "b").map(drop),
            move |m| {
                let mut c = m.snaps[&k("a", "s1")].clone();
                c.clone = true;
                m.vols.insert("b".into(), c);
            },
        ),
        write("b", &[2, 505, 262_142], 3, 100),
        step(
            "snapshot b@t1",
            |p| p.create_snapshot("b", "t1", &[]).map(drop),
            move |m| {
                let s = snap_of(m, "b");
                m.snaps.insert(k("b", "t1"), s);
            },
        ),
        step(
            "group a,b @g",
            |p| p.create_snapshot_group(&["b", "a"], "g", &[]).map(drop),
            move |m| {
                for v in ["a", "b"] {
                    let s = snap_of(m, v);
                    m.snaps.insert(k(v, "g"), s);
                }
            },
        ),
        step("flatten b", |p| p.flatten("b").map(drop), |_| {}),
        step(
            "delete a@s1",
            |p| p.delete_snapshot("a", "s1"),
            move |m| {
                m.snaps.remove(&k("a", "s1"));
            },
        ),
        step("reclaim", |p| p.reclaim_all().map(drop), |_| {}),
        step(
            "snapshot a@s2",
            |p| p.create_snapshot("a", "s2", &[]).map(drop),
            move |m| {
                let s = snap_of(m, "a");
                m.snaps.insert(k("a", "s2"), s);
            },
        ),
        write("a", &[0, 9, 504], 4, 0),
        step(
            "revert a to s2",
            |p| p.revert_volume("a", "s2").map(drop),
            move |m| {
                let s = m.snaps[&k("a", "s2")].clone();
                *m.vols.get_mut("a").unwrap() = s;
            },
        ),
        step(
            "expand a",
            |p| p.expand_volume("a", 300 * BIG).map(drop),
            |m| m.vols.get_mut("a").unwrap().size = 300 * BIG,
        ),
        write("a", &[78_000_000], 5, 0),
        step(
            "delete b",
            |p| p.delete_volume("b", true),
            |m| {
                m.vols.remove("b");
                m.snaps.retain(|(v, _), _| v != "b");
            },
        ),
        // Retirement: a volume deleted with snapshots and a linked clone
        // of one keeps them, named `a@ID`; its name is free at once; its
        // record goes with the last of them.
        step(
            "clone a@s2 -> c",
            |p| p.clone_snapshot("a", "s2", "c").map(drop),
            move |m| {
                let mut c = m.snaps[&k("a", "s2")].clone();
                c.clone = true;
                m.vols.insert("c".into(), c);
            },
        ),
        step(
            "delete a, keeping its snapshots",
            |p| p.delete_volume("a", false),
            move |m| {
                m.vols.remove("a");
                let old = format!("a@{}", A_ID);
                for s in ["s2", "g"] {
                    let snap = m.snaps.remove(&k("a", s)).unwrap();
                    m.snaps.insert(k(&old, s), snap);
                }
            },
        ),
        step(
            "create a again",
            |p| p.create_volume("a", BIG).map(drop),
            |m| {
                m.vols.insert("a".into(), MVol::new(BIG));
            },
        ),
        step(
            "clone a@ID/g -> d",
            |p| p.clone_snapshot(&format!("a@{A_ID}"), "g", "d").map(drop),
            move |m| {
                let mut c = m.snaps[&k(&format!("a@{A_ID}"), "g")].clone();
                c.clone = true;
                m.vols.insert("d".into(), c);
            },
        ),
        step(
            "delete a@ID/s2",
            |p| p.delete_snapshot(&format!("a@{A_ID}"), "s2"),
            move |m| {
                m.snaps.remove(&k(&format!("a@{A_ID}"), "s2"));
            },
        ),
        step(
            "delete a@ID/g",
            |p| p.delete_snapshot(&format!("a@{A_ID}"), "g"),
            move |m| {
                m.snaps.remove(&k(&format!("a@{A_ID}"), "g"));
            },
        ),
        step(
            "delete c",
            |p| p.delete_volume("c", false),
            |m| {
                m.vols.remove("c");
            },
        ),
        step(
            "delete d, the retired a's last clone",
            |p| p.delete_volume("d", false),
            |m| {
                m.vols.remove("d");
            },
        ),
        step("reclaim", |p| p.reclaim_all().map(drop), |_| {}),
        step("checkpoint", |p| p.checkpoint(), |_| {}),
    ]
}

/// The pool id of the script's first volume `a` (the first object made).
const A_ID: u64 = 1;

/// (volume, block) pairs whose content differs between two models.
fn differing(a: &Model, b: &Model) -> BTreeSet<(String, u64)> {
    let mut out = BTreeSet::new();
    for (n, va) in &a.vols {
        let Some(vb) = b.vols.get(n) else { continue };
        for blk in va.blocks.keys().chain(vb.blocks.keys()) {
            if va.blocks.get(blk) != vb.blocks.get(blk) {
                out.insert((n.clone(), *blk));
            }
        }
    }
    out
}

fn opts() -> PoolOptions {
    PoolOptions {
        cache_bytes: 64 * 4096,
        wal_bytes: 256 << 10,
        journal_bytes: 64 << 10, // small, so the journal fills and starts afresh often
        max_dirty_pages: usize::MAX,
        max_bytes: 0,
        background: false,
    }
}

/// Run the script with the disk failing from mutating operation `fail_at`
/// on (None: never). Returns the step that failed, if any.
fn run(fail_at: Option<u64>, crash_seed: Option<u64>) -> (u64, Option<&'static str>) {
    let backend = Arc::new(SimBackend::new());
    let pool = Pool::create(backend.clone(), opts()).unwrap();
    let start = backend.ops();
    backend.fail_after(fail_at);
    let mut model = Model::default();
    let mut durable = Model::default();
    let mut unflushed: BTreeSet<(String, u64)> = BTreeSet::new();
    let mut failed = None;
    let mut after = None;
    for s in script() {
        match (s.engine)(&pool) {
            Ok(()) => {
                (s.model)(&mut model);
                if s.commits {
                    durable = model.clone();
                }
            }
            Err(e) => {
                assert!(
                    fail_at.is_some(),
                    "step {} failed with no failure injected: {e}",
                    s.name
                );
                // The failing step reports the I/O error itself; a step that
                // meets the latch set by an earlier one (a punch after a
                // commit that succeeded) gets the latch's error.
                if let lamina_engine::Error::Unavailable(f) = &e {
                    assert!(f.cause.contains("injected"), "{}: {e}", s.name);
                }
                let mut a = model.clone();
                (s.model)(&mut a);
                // Blocks written since the last commit (or by the failed
                // write) may hold either version, or a torn mix.
                unflushed = differing(&durable, &model);
                if !s.commits {
                    unflushed.extend(differing(&durable, &a));
                }
                after = s.commits.then_some(a);
                failed = Some(s.name);
                break;
            }
        }
    }
    let ops = backend.ops() - start;
    if failed.is_none() && backend.remaining() == Some(0) {
        // The failure hit a punch of freed space after the last step's
        // commit: every step reported success and must be durable.
        failed = Some("after the last step");
    }
    if failed.is_some() {
        let first = pool
            .failure()
            .unwrap_or_else(|| panic!("fail at op {fail_at:?} in {failed:?}: latch not set"));
        assert!(first.cause.contains("injected"), "{first}");
        // The disk still fails every operation: a refused request that
        // tried one would show in the count.
        let b = backend.clone();
        assert_refused(&pool, &first, Some(&move || b.ops()));
    }
    if failed.is_none() {
        model.verify(&pool, &BTreeSet::new());
        pool.close().unwrap();
        return (ops, None);
    }
    pool.abandon();
    backend.crash(crash_seed);
    let pool = Pool::open(backend.clone(), opts())
        .unwrap_or_else(|e| panic!("reopen after failure at op {fail_at:?} in {failed:?}: {e}"));
    let report = pool.check().unwrap();
    assert!(
        report.is_ok(),
        "fail at op {fail_at:?} in {failed:?}: check: {:?}",
        report.problems
    );
    let before = durable.compare(&pool, &unflushed);
    let after_ok = after.as_ref().map(|a| a.compare(&pool, &BTreeSet::new()));
    match (before, after_ok) {
        (Ok(()), _) | (_, Some(Ok(()))) => {}
        (Err(b), a) => panic!(
            "fail at op {fail_at:?} in {failed:?}: state is neither before ({b}) nor after ({a:?})"
        ),
    }
    // The recovered pool keeps working.
    pool.create_volume("after-crash", 1 << 20).unwrap();
    pool.open_volume("after-crash")
        .unwrap()
        .write(0, &[7; 4096])
        .unwrap();
    pool.close().unwrap();
    (ops, failed)
}

#[test]
fn every_failure_point_recovers() {
    let (total, failed) = run(None, None);
    assert!(failed.is_none());
    assert!(total > 50, "the script should do real work ({total} ops)");
    let mut steps = BTreeSet::new();
    for k in 1..=total {
        let (_, failed) = run(Some(k), if k % 2 == 0 { None } else { Some(k) });
        steps.insert(failed.expect("a failure was injected"));
    }
    eprintln!("{total} failure points; failures landed in {steps:?}");
    // Every kind of step met a failure somewhere inside it.
    assert!(steps.len() >= 12, "failures landed in only {steps:?}");
    // Including the group snapshot: a failure at any step of it leaves all
    // of its members or none.
    assert!(steps.contains("group a,b @g"), "{steps:?}");
}
