//! Group snapshots: all members or none, one creation time, the group label;
//! and crash consistency across volumes under a write load: one writer
//! writes a global sequence round-robin over three volumes (each write
//! returning before the next begins) while groups are taken, and every
//! group must hold a prefix of the sequence, including every write that
//! returned before the group began. The run is measured in writes, not
//! time: each group waits for a number of writes since the one before.

mod common;

use common::*;
use lamina_engine::{Error, Pool, GROUP_LABEL};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

fn names(p: &Pool) -> Vec<(String, String)> {
    p.list_all_snapshots()
        .unwrap()
        .into_iter()
        .map(|s| (s.volume, s.name))
        .collect()
}

fn l(k: &str, v: &str) -> (String, String) {
    (k.to_string(), v.to_string())
}

#[test]
fn a_group_is_one_instant_with_one_time_and_its_label() {
    let (_d, p) = pool();
    for (v, fill) in [("a", 1u8), ("b", 2), ("c", 3)] {
        p.create_volume(v, 1 << 20).unwrap();
        p.open_volume(v).unwrap().write(0, &[fill; 4096]).unwrap();
    }
    p.create_snapshot("b", "old", &[]).unwrap();
    let g = p
        .create_snapshot_group(&["c", "a", "b"], "g1", &[l("app", "db")])
        .unwrap();
    let vols: Vec<&str> = g.iter().map(|s| s.volume.as_str()).collect();
    assert_eq!(vols, ["c", "a", "b"], "members in the order asked");
    assert!(g
        .iter()
        .all(|s| s.name == "g1" && s.created == g[0].created));
    for s in &g {
        let mut want = vec![l(GROUP_LABEL, "g1"), l("app", "db")];
        want.sort();
        let mut got = s.labels.clone();
        got.sort();
        assert_eq!(got, want, "{}", s.volume);
    }
    assert_eq!(g[2].parent.as_deref(), Some("old"));
    // The members hold the data of that instant; later writes do not show.
    for (v, fill) in [("a", 1u8), ("b", 2), ("c", 3)] {
        p.open_volume(v).unwrap().write(0, &[9; 4096]).unwrap();
        let mut buf = [0u8; 4096];
        p.open_snapshot(v, "g1").unwrap().read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == fill), "{v}@g1");
        assert_eq!(
            p.volume_info_by_name(v).unwrap().parent_snapshot.as_deref(),
            Some("g1")
        );
    }
    let r = p.check().unwrap();
    assert!(r.is_ok(), "{:?}", r.problems);
}

#[test]
fn a_refused_group_changes_nothing() {
    let (d, p) = pool();
    for v in ["a", "b", "c"] {
        p.create_volume(v, 1 << 20).unwrap();
    }
    p.create_snapshot("c", "taken", &[]).unwrap();
    let before = names(&p);
    // Ids are handed out in order: a volume made before and one made after
    // show whether a refused group spent one.
    let probe = |p: &Pool, n: &str| p.create_volume(n, 4096).unwrap().id;
    let id0 = probe(&p, "probe0");
    // (volumes, name, labels, what the error says)
    type Case<'a> = (&'a [&'a str], &'a str, Vec<(String, String)>, &'a str);
    let cases: Vec<Case> = vec![
        (&["a", "nope", "b"], "g", vec![], "not found"),
        (&["a", "b", "a"], "g", vec![], "named twice"),
        (&["a", "b", "c"], "taken", vec![], "exists"),
        (&[], "g", vec![], "at least one volume"),
        (&["a", "b"], "Bad Name", vec![], "name"),
        (&["a", "b"], ".system", vec![], "name"),
        (&["a"], "g", vec![l(GROUP_LABEL, "other")], "group's own"),
        (&["a"], "g", vec![l("", "x")], "label"),
        (&["a"], "g", vec![l("k", &"x".repeat(1025))], "label"),
        (&["a"], "g", vec![l("k", "1"), l("k", "2")], "twice"),
    ];
    for (vols, name, labels, want) in cases {
        let e = p.create_snapshot_group(vols, name, &labels).unwrap_err();
        assert!(
            e.to_string().contains(want),
            "{vols:?} {name:?}: {e} (expected {want:?})"
        );
        assert!(
            matches!(
                e,
                Error::VolumeNotFound(_)
                    | Error::SnapshotExists { .. }
                    | Error::InvalidArgument(_)
                    | Error::InvalidName { .. }
            ),
            "{e:?}"
        );
        assert_eq!(names(&p), before, "{vols:?} {name:?} changed the pool");
    }
    // No id was spent on a refused group (the checks come first).
    assert_eq!(probe(&p, "probe1"), id0 + 1);
    // The snapshot that clashed is untouched, and the state survives a reopen.
    p.close().unwrap();
    let p = Pool::open_dir(d.path(), Default::default()).unwrap();
    assert_eq!(names(&p), before);
    assert!(p.check().unwrap().is_ok());
}

/// The writer's count of writes done, the number of groups begun, and the
/// end of the run. The writer keeps at most `LEAD` writes ahead of the
/// last group begun, so that groups land while it writes.
#[derive(Default)]
struct Progress {
    counts: Mutex<(u64, u64)>,
    moved: Condvar,
    stop: AtomicBool,
}

impl Progress {
    fn wrote(&self) {
        self.counts.lock().unwrap().0 += 1;
        self.moved.notify_all();
    }

    fn done(&self) -> u64 {
        self.counts.lock().unwrap().0
    }

    fn begin_group(&self) {
        self.counts.lock().unwrap().1 += 1;
        self.moved.notify_all();
    }

    /// Wait until `f(writes, groups begun)` holds, or the run has ended.
    fn wait(&self, f: impl Fn(u64, u64) -> bool) {
        let mut c = self.counts.lock().unwrap();
        while !f(c.0, c.1) && !self.stop.load(Ordering::SeqCst) {
            c = self.moved.wait(c).unwrap();
        }
    }
}

/// Ends the run when dropped (by return or panic), so no thread waits on one
/// that is gone.
struct EndsRun(Arc<Progress>);

impl Drop for EndsRun {
    fn drop(&mut self) {
        let _c = self.0.counts.lock().unwrap_or_else(|p| p.into_inner());
        self.0.stop.store(true, Ordering::SeqCst);
        self.0.moved.notify_all();
    }
}

const VOLS: [&str; 3] = ["v0", "v1", "v2"];
const GROUPS: u64 = 40;
/// Writes between the starts of two groups.
const WRITES_BETWEEN: u64 = 40;
/// How far the writer may run ahead of the last group begun.
const LEAD: u64 = 400;
const MAX_WRITES: u64 = GROUPS * WRITES_BETWEEN + LEAD;

/// Block contents of sequence number `i`: `i + 1` repeated (zero: absent).
fn block_of(i: u64) -> Vec<u8> {
    (i + 1).to_le_bytes().repeat(BS as usize / 8)
}

/// The sequence numbers a member of a group holds (checking each block is
/// whole and in its place).
fn held(p: &Pool, vol: usize, group: &str, blocks: u64) -> Vec<u64> {
    let h = p.open_snapshot(VOLS[vol], group).unwrap();
    let mut buf = vec![0u8; (blocks * BS) as usize];
    h.read(0, &mut buf).unwrap();
    let mut out = Vec::new();
    for (b, chunk) in buf.chunks(BS as usize).enumerate() {
        if chunk.iter().all(|&x| x == 0) {
            continue;
        }
        let i = b as u64 * 3 + vol as u64;
        assert_eq!(chunk, &block_of(i)[..], "{}@{group} block {b}", VOLS[vol]);
        out.push(i);
    }
    out
}

/// Volumes created in `create_order` (so their ids, which fix the order the
/// group takes their gates in, run with or against the write order).
fn crash_consistent_under_load(create_order: [usize; 3]) {
    let (_d, p) = pool();
    for v in create_order {
        p.create_volume(VOLS[v], MAX_WRITES.div_ceil(3) * BS)
            .unwrap();
    }
    let progress = Arc::new(Progress::default());
    let taken: Arc<Mutex<Vec<(String, u64, u64)>>> = Default::default();
    std::thread::scope(|s| {
        let (pw, prog) = (p.clone(), progress.clone());
        s.spawn(move || {
            let _end = EndsRun(prog.clone());
            let hs: Vec<_> = VOLS.iter().map(|v| pw.open_volume(v).unwrap()).collect();
            for i in 0..MAX_WRITES {
                prog.wait(|_, begun| i < begun * WRITES_BETWEEN + LEAD);
                if prog.stop.load(Ordering::SeqCst) {
                    break;
                }
                hs[(i % 3) as usize]
                    .write(i / 3 * BS, &block_of(i))
                    .unwrap();
                prog.wrote();
            }
        });
        let (ps, prog, taken) = (p.clone(), progress.clone(), taken.clone());
        s.spawn(move || {
            let _end = EndsRun(prog.clone());
            for k in 0..GROUPS {
                prog.wait(|writes, _| writes >= (k + 1) * WRITES_BETWEEN);
                let name = format!("g{k}");
                let before = prog.done();
                prog.begin_group();
                // Members in another order than ids or writes.
                ps.create_snapshot_group(&["v2", "v0", "v1"], &name, &[])
                    .unwrap();
                let after = prog.done();
                taken.lock().unwrap().push((name, before, after));
            }
        });
    });
    let taken = taken.lock().unwrap().clone();
    assert_eq!(taken.len() as u64, GROUPS);
    let blocks = MAX_WRITES.div_ceil(3);
    let mut partial = 0;
    for (g, before, after) in &taken {
        let mut seqs: Vec<u64> = (0..3).flat_map(|v| held(&p, v, g, blocks)).collect();
        seqs.sort_unstable();
        let n = seqs.len() as u64;
        // A prefix: if k is in some member, every j < k is in its member.
        assert!(
            seqs.iter().enumerate().all(|(j, &k)| j as u64 == k),
            "group {g} is not a prefix of the sequence: {} writes, highest {:?}",
            n,
            seqs.last()
        );
        // Every write that returned before the group began is in it, and
        // none that began after it returned.
        assert!(
            *before <= n && n <= *after + 1,
            "group {g}: {n} writes, {before} done before it, {after} after"
        );
        partial += u64::from(n > *before);
    }
    eprintln!(
        "{} groups, {partial} holding writes that returned after they began",
        taken.len()
    );
    let r = p.check().unwrap();
    assert!(r.is_ok(), "{:?}", r.problems);
}

#[test]
fn groups_under_a_write_load_hold_a_prefix_of_the_sequence() {
    crash_consistent_under_load([0, 1, 2]);
}

#[test]
fn groups_are_consistent_whatever_order_gates_are_taken_in() {
    crash_consistent_under_load([2, 0, 1]);
}

/// Two threads take groups of overlapping volume sets in opposite orders
/// while a writer writes: gates taken in id order cannot deadlock, and
/// every group is whole.
#[test]
fn overlapping_groups_in_parallel_do_not_deadlock() {
    let (_d, p) = pool();
    for v in VOLS {
        p.create_volume(v, 1 << 20).unwrap();
    }
    let stop = AtomicBool::new(false);
    let count = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let h = p.open_volume("v1").unwrap();
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                h.write((i % 256) * BS, &block_of(i)).unwrap();
                i += 1;
            }
        });
        const SETS: [&[&str]; 2] = [&["v0", "v1", "v2"], &["v2", "v1"]];
        let threads: Vec<_> = SETS
            .iter()
            .enumerate()
            .map(|(t, set)| {
                let (p, count) = (&p, &count);
                s.spawn(move || {
                    for k in 0..30 {
                        let g = p
                            .create_snapshot_group(set, &format!("t{t}-{k}"), &[])
                            .unwrap();
                        assert_eq!(g.len(), set.len());
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        stop.store(true, Ordering::SeqCst);
    });
    assert_eq!(count.load(Ordering::SeqCst), 60);
    assert_eq!(p.list_snapshots("v1").unwrap().len(), 60);
    assert_eq!(p.list_snapshots("v0").unwrap().len(), 30);
    let r = p.check().unwrap();
    assert!(r.is_ok(), "{:?}", r.problems);
}
