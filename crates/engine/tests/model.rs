//! Model-based property test: random sequences of every engine operation,
//! checked after each step against an in-memory model, including reads of
//! every live snapshot and clone, across reopen and simulated power cuts.

mod common;

use common::*;
use lamina_engine::sim::SimBackend;
use lamina_engine::{Pool, PoolOptions};
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::sync::Arc;

const VOLS: [&str; 4] = ["a", "b", "c", "d"];
const SNAPS: [&str; 3] = ["s1", "s2", "s3"];
const SMALL: u64 = 37 * BS + 1024;
/// Just under the two-level capacity (504^2 blocks), so expansion adds a level.
const BIG: u64 = 253_900 * BS;

#[derive(Clone, Debug)]
enum Op {
    Create(usize, bool),
    Write(usize, usize, usize, usize, u8),
    Zero(usize, usize, usize, usize),
    TrimAll(usize),
    Flush,
    Snap(usize, usize),
    /// A group snapshot of the volumes whose bits are set (in the order
    /// of the bits from the top when the flag is set).
    Group(u8, usize, bool),
    DelSnap(usize, usize),
    /// Delete the snapshots whose bits are set, together, after asking
    /// what that frees; the pool's check must count exactly that gone.
    DelSnaps(usize, u8),
    Revert(usize, usize),
    Clone(usize, usize, usize),
    Flatten(usize),
    DelVol(usize, bool),
    /// On a snapshot of a deleted (retired) volume, the `pick`-th in the
    /// model: 0 delete it, 1 clone it into the volume `n`, 2 name its
    /// volume by the old name alone (list its snapshots, delete this one).
    OnRetired(usize, usize, usize),
    Expand(usize),
    Reclaim,
    /// Copy up to this many committed log images home ahead of the
    /// checkpoint (what the writeback thread does as the log fills).
    Home(usize),
    Reopen,
    Crash(Option<u64>),
    Check,
}

fn op() -> impl Strategy<Value = Op> {
    let v = 0..VOLS.len();
    let s = 0..SNAPS.len();
    prop_oneof![
        2 => (v.clone(), any::<bool>()).prop_map(|(a, b)| Op::Create(a, b)),
        12 => (v.clone(), 0..8usize, 0..4usize, 0..7usize, any::<u8>()).prop_map(|(a, b, c, d, e)| Op::Write(a, b, c, d, e)),
        3 => (v.clone(), 0..8usize, 0..4usize, 0..5usize).prop_map(|(a, b, c, d)| Op::Zero(a, b, c, d)),
        1 => v.clone().prop_map(Op::TrimAll),
        2 => Just(Op::Flush),
        4 => (v.clone(), s.clone()).prop_map(|(a, b)| Op::Snap(a, b)),
        2 => (0..16u8, s.clone(), any::<bool>()).prop_map(|(a, b, c)| Op::Group(a, b, c)),
        2 => (v.clone(), s.clone()).prop_map(|(a, b)| Op::DelSnap(a, b)),
        2 => (v.clone(), 1..8u8).prop_map(|(a, b)| Op::DelSnaps(a, b)),
        2 => (v.clone(), s.clone()).prop_map(|(a, b)| Op::Revert(a, b)),
        2 => (v.clone(), s.clone(), v.clone()).prop_map(|(a, b, c)| Op::Clone(a, b, c)),
        1 => v.clone().prop_map(Op::Flatten),
        2 => (v.clone(), any::<bool>()).prop_map(|(a, b)| Op::DelVol(a, b)),
        3 => (0..8usize, 0..3usize, v.clone()).prop_map(|(a, b, c)| Op::OnRetired(a, b, c)),
        1 => v.clone().prop_map(Op::Expand),
        1 => Just(Op::Reclaim),
        2 => (1..200usize).prop_map(Op::Home),
        1 => Just(Op::Reopen),
        1 => prop::option::of(any::<u64>()).prop_map(Op::Crash),
        1 => Just(Op::Check),
    ]
}

fn opts() -> PoolOptions {
    PoolOptions {
        cache_bytes: 64 * 4096,  // small, so pages are evicted and read back
        wal_bytes: 1 << 20,      // small, so checkpoints happen often
        journal_bytes: 64 << 10, // small, so the journal fills and starts afresh often
        max_dirty_pages: usize::MAX,
        max_bytes: 0,
        background: false,
    }
}

/// Byte offset for a position index within a volume of `size`.
fn offset(size: u64, pos: usize, delta: usize) -> u64 {
    let blocks = size / BS;
    let hot = [
        0,
        1,
        503,
        504,
        1007,
        blocks / 2,
        blocks.saturating_sub(1),
        blocks.saturating_sub(3),
    ];
    let b = hot[pos].min(blocks.saturating_sub(1));
    let d = [0u64, 1, 511, 4095][delta];
    (b * BS + d).min(size - 1)
}

// Whole-block runs (2, 8, 40 blocks) take the engine's run path.
const LENS: [u64; 7] = [1, 512, BS, BS + 1, 2 * BS + 3, 8 * BS, 40 * BS];

struct Run {
    backend: Arc<SimBackend>,
    pool: Option<Pool>,
    model: Model,
    durable: Model,
    unflushed: BTreeSet<(String, u64)>,
}

impl Run {
    fn pool(&self) -> &Pool {
        self.pool.as_ref().unwrap()
    }

    /// The model's references (`NAME@ID`) of retired volumes once named `name`.
    fn retired_refs(&self, name: &str) -> BTreeSet<String> {
        self.model
            .snaps
            .keys()
            .filter(|(r, _)| r.split_once('@').is_some_and(|(n, _)| n == name))
            .map(|(r, _)| r.clone())
            .collect()
    }

    /// An operation on snapshot `snap` of volume `name` (no live volume in
    /// the model has it) answered `r`: the name reaches the one retired
    /// volume that had it, or an error. The pool may hold retired volumes
    /// the model does not know (kept for their linked clones alone), so a
    /// name the model sees once may still be ambiguous. Returns the model's
    /// key of the snapshot reached.
    fn by_old_name<T: std::fmt::Debug>(
        &self,
        name: &str,
        snap: &str,
        r: &lamina_engine::Result<T>,
    ) -> Option<(String, String)> {
        let refs = self.retired_refs(name);
        let key = |r: &String| (r.clone(), snap.to_string());
        match r {
            Ok(_) => {
                assert_eq!(refs.len(), 1, "{name} reached one retired volume: {r:?}");
                let k = key(refs.first().unwrap());
                assert!(self.model.snaps.contains_key(&k), "{k:?}");
                Some(k)
            }
            Err(lamina_engine::Error::AmbiguousVolume { references, .. }) => {
                assert!(references.len() >= 2, "{references:?}");
                assert!(
                    refs.iter().all(|r| references.contains(r)),
                    "{refs:?} {references:?}"
                );
                None
            }
            Err(e) => {
                assert!(
                    refs.len() != 1 || !self.model.snaps.contains_key(&key(refs.first().unwrap())),
                    "{name}/{snap} is in the model as {refs:?}, yet: {e}"
                );
                None
            }
        }
    }

    /// A commit happened: the model as it is now is durable.
    fn committed(&mut self) {
        self.durable = self.model.clone();
        self.unflushed.clear();
    }

    fn step(&mut self, op: &Op) {
        let p = self.pool().clone();
        match *op {
            Op::Create(v, big) => {
                let name = VOLS[v];
                let size = if big { BIG } else { SMALL };
                let r = p.create_volume(name, size);
                if self.model.vols.contains_key(name) {
                    assert!(r.is_err());
                } else {
                    r.unwrap();
                    self.model.vols.insert(name.into(), MVol::new(size));
                    self.committed();
                }
            }
            Op::Write(v, pos, delta, len, _) | Op::Zero(v, pos, delta, len) => {
                let name = VOLS[v];
                let Some(m) = self.model.vols.get_mut(name) else {
                    assert!(p.open_volume(name).is_err());
                    return;
                };
                let off = offset(m.size, pos, delta);
                let len = LENS[len].min(m.size - off);
                let h = p.open_volume(name).unwrap();
                if let Op::Write(.., seed) = *op {
                    let data = pattern(seed, off, len as usize);
                    h.write(off, &data).unwrap();
                    m.write(off, &data);
                } else {
                    h.write_zeroes(off, len).unwrap();
                    m.zero(off, len);
                }
                for b in off / BS..(off + len).div_ceil(BS) {
                    self.unflushed.insert((name.into(), b));
                }
                // Out of range is refused and changes nothing.
                assert!(h.write(m.size - 1, &[1, 2]).is_err());
            }
            Op::TrimAll(v) => {
                let name = VOLS[v];
                let Some(m) = self.model.vols.get_mut(name) else {
                    return;
                };
                p.open_volume(name).unwrap().trim(0, m.size).unwrap();
                for &b in m.blocks.keys() {
                    self.unflushed.insert((name.into(), b));
                }
                let size = m.size;
                m.zero(0, size);
            }
            Op::Flush => {
                p.commit().unwrap();
                self.committed();
            }
            Op::Snap(v, s) => {
                let key = (VOLS[v].to_string(), SNAPS[s].to_string());
                let r = p.create_snapshot(VOLS[v], SNAPS[s], &[("k".into(), "v".into())]);
                match self.model.vols.get(VOLS[v]) {
                    Some(m) if !self.model.snaps.contains_key(&key) => {
                        r.unwrap();
                        let mut snap = m.clone();
                        snap.clone = false;
                        self.model.snaps.insert(key, snap);
                        self.committed();
                    }
                    _ => assert!(r.is_err()),
                }
            }
            Op::Group(mask, s, reverse) => {
                let mut vols: Vec<&str> = (0..VOLS.len())
                    .filter(|i| mask & (1 << i) != 0)
                    .map(|i| VOLS[i])
                    .collect();
                if reverse {
                    vols.reverse();
                }
                let r = p.create_snapshot_group(&vols, SNAPS[s], &[("k".into(), "v".into())]);
                let ok = !vols.is_empty()
                    && vols.iter().all(|v| {
                        self.model.vols.contains_key(*v)
                            && !self
                                .model
                                .snaps
                                .contains_key(&(v.to_string(), SNAPS[s].to_string()))
                    });
                if ok {
                    let g = r.unwrap();
                    assert_eq!(g.len(), vols.len());
                    assert!(g.iter().all(|x| x.created == g[0].created));
                    for v in vols {
                        let mut snap = self.model.vols[v].clone();
                        snap.clone = false;
                        self.model.snaps.insert((v.into(), SNAPS[s].into()), snap);
                    }
                    self.committed();
                } else {
                    // Refused as a whole: the model is unchanged, and so
                    // must be the pool (checked after every step).
                    assert!(r.is_err());
                }
            }
            Op::DelSnap(v, s) => {
                let key = (VOLS[v].to_string(), SNAPS[s].to_string());
                let r = p.delete_snapshot(VOLS[v], SNAPS[s]);
                if !self.model.vols.contains_key(VOLS[v]) {
                    if let Some(k) = self.by_old_name(VOLS[v], SNAPS[s], &r) {
                        self.model.snaps.remove(&k);
                        self.committed();
                    }
                } else if self.model.snaps.remove(&key).is_some() {
                    r.unwrap();
                    self.committed();
                } else {
                    assert!(r.is_err());
                }
            }
            Op::DelSnaps(v, mask) => {
                let names: Vec<String> = (0..SNAPS.len())
                    .filter(|i| mask & (1 << i) != 0)
                    .map(|i| SNAPS[i].to_string())
                    .filter(|s| {
                        self.model
                            .snaps
                            .contains_key(&(VOLS[v].to_string(), s.clone()))
                    })
                    .collect();
                if names.is_empty() {
                    return;
                }
                p.reclaim_all().unwrap();
                let before = p.check().unwrap();
                let freed = p.freed_by_deleting(VOLS[v], &names).unwrap();
                for n in &names {
                    p.delete_snapshot(VOLS[v], n).unwrap();
                    self.model.snaps.remove(&(VOLS[v].to_string(), n.clone()));
                }
                self.committed();
                p.reclaim_all().unwrap();
                let after = p.check().unwrap();
                let ((n0, d0), (n1, d1)) = (before.tree_blocks(), after.tree_blocks());
                assert_eq!(
                    ((n0 - n1) * BS, (d0 - d1) * BS),
                    (freed.metadata_bytes, freed.data_bytes),
                    "index nodes and data freed by deleting {names:?} of {}",
                    VOLS[v]
                );
            }
            Op::Revert(v, s) => {
                let key = (VOLS[v].to_string(), SNAPS[s].to_string());
                let r = p.revert_volume(VOLS[v], SNAPS[s]);
                match self.model.snaps.get(&key) {
                    Some(snap) => {
                        r.unwrap();
                        let m = self.model.vols.get_mut(VOLS[v]).unwrap();
                        let clone = m.clone;
                        *m = snap.clone();
                        m.clone = clone;
                        self.committed();
                    }
                    None => assert!(r.is_err()),
                }
            }
            Op::Clone(v, s, n) => {
                let mut key = (VOLS[v].to_string(), SNAPS[s].to_string());
                let r = p.clone_snapshot(VOLS[v], SNAPS[s], VOLS[n]);
                if !self.model.vols.contains_key(VOLS[v]) {
                    let taken = self.model.vols.contains_key(VOLS[n]);
                    match (&r, taken) {
                        (Ok(_), true) => panic!("a clone took the live name {}", VOLS[n]),
                        (Err(lamina_engine::Error::VolumeExists(_)), true) => return,
                        _ => {}
                    }
                    match self.by_old_name(VOLS[v], SNAPS[s], &r) {
                        Some(k) => key = k,
                        None => return,
                    }
                }
                match self.model.snaps.get(&key) {
                    Some(snap) if !self.model.vols.contains_key(VOLS[n]) => {
                        r.unwrap();
                        let mut c = snap.clone();
                        c.clone = true;
                        self.model.vols.insert(VOLS[n].into(), c);
                        self.committed();
                    }
                    _ => assert!(r.is_err()),
                }
            }
            Op::Flatten(v) => {
                let r = p.flatten(VOLS[v]);
                match self.model.vols.get_mut(VOLS[v]) {
                    Some(m) if m.clone => {
                        // A clone of an empty snapshot shares nothing: refusing is fine.
                        if r.is_ok() {
                            m.clone = false;
                            let info = p.volume_info_by_name(VOLS[v]).unwrap();
                            assert_eq!(info.clone_state, lamina_engine::CloneState::Independent);
                            // Only a flatten that ran committed: a refused one
                            // left unflushed writes unflushed.
                            self.committed();
                        }
                    }
                    _ => assert!(r.is_err(), "flatten of a volume that is no linked clone"),
                }
            }
            Op::DelVol(v, with) => {
                // Always done, snapshots and linked clones or not: without
                // `with`, the snapshots stay, named `NAME@ID` (the volume
                // is retired), and the name is free at once.
                let name = VOLS[v];
                let id = p.volume_info_by_name(name).map(|i| i.id);
                let r = p.delete_volume(name, with);
                if self.model.vols.remove(name).is_some() {
                    r.unwrap();
                    let id = id.unwrap();
                    let mine: Vec<(String, String)> = self
                        .model
                        .snaps
                        .keys()
                        .filter(|(vv, _)| vv == name)
                        .cloned()
                        .collect();
                    for k in mine {
                        let snap = self.model.snaps.remove(&k).unwrap();
                        if !with {
                            self.model.snaps.insert((format!("{name}@{id}"), k.1), snap);
                        }
                    }
                    self.committed();
                    assert!(p.volume_info_by_name(name).is_err());
                } else {
                    assert!(r.is_err());
                }
            }
            Op::OnRetired(pick, what, n) => {
                let keys: Vec<(String, String)> = self
                    .model
                    .snaps
                    .keys()
                    .filter(|(v, _)| v.contains('@'))
                    .cloned()
                    .collect();
                if keys.is_empty() {
                    return;
                }
                let key = keys[pick % keys.len()].clone();
                let (vref, snap) = (&key.0, &key.1);
                match what {
                    0 => {
                        p.delete_snapshot(vref, snap).unwrap();
                        self.model.snaps.remove(&key);
                        self.committed();
                    }
                    1 => {
                        let r = p.clone_snapshot(vref, snap, VOLS[n]);
                        if self.model.vols.contains_key(VOLS[n]) {
                            assert!(r.is_err());
                        } else {
                            // (A clone of an empty snapshot shares nothing: no origin.)
                            if let Some(o) = r.unwrap().origin {
                                assert_eq!(
                                    o.volume.as_deref(),
                                    vref.split_once('@').map(|(n, _)| n)
                                );
                            }
                            let mut c = self.model.snaps[&key].clone();
                            c.clone = true;
                            self.model.vols.insert(VOLS[n].into(), c);
                            self.committed();
                        }
                    }
                    _ => {
                        let name = vref.split_once('@').unwrap().0;
                        if self.model.vols.contains_key(name) {
                            // The live volume has the name: checked elsewhere.
                            return;
                        }
                        let listed = p.list_snapshots(name);
                        if let Some(k) = self.by_old_name(name, snap, &listed) {
                            let mut names: Vec<String> =
                                listed.unwrap().into_iter().map(|s| s.name).collect();
                            names.sort();
                            let want: Vec<String> = self
                                .model
                                .snaps
                                .keys()
                                .filter(|(v, _)| *v == k.0)
                                .map(|(_, s)| s.clone())
                                .collect();
                            assert_eq!(names, want);
                            p.delete_snapshot(name, snap).unwrap();
                            self.model.snaps.remove(&k);
                            self.committed();
                        }
                    }
                }
            }
            Op::Expand(v) => {
                let r = p.expand_volume(VOLS[v], 0);
                assert!(r.is_err(), "size 0 is refused");
                let Some(m) = self.model.vols.get_mut(VOLS[v]) else {
                    return;
                };
                let size = m.size + 1000 * BS + 512;
                p.expand_volume(VOLS[v], size).unwrap();
                m.size = size;
                assert!(
                    p.expand_volume(VOLS[v], size - 1).is_err(),
                    "shrink is refused"
                );
                self.committed();
            }
            Op::Reclaim => {
                p.reclaim_all().unwrap();
            }
            Op::Home(n) => {
                p.home_ahead(n).unwrap();
            }
            Op::Reopen => {
                self.pool.take().unwrap().close().unwrap();
                self.pool = Some(Pool::open(self.backend.clone(), opts()).unwrap());
                self.committed();
            }
            Op::Crash(seed) => {
                self.pool.take().unwrap().abandon();
                self.backend.crash(seed);
                let pool = Pool::open(self.backend.clone(), opts()).unwrap();
                // Durable state, except blocks written since the last commit.
                let mut expect = self.durable.clone();
                for (name, m) in expect.vols.iter_mut() {
                    if let Some(cur) = self.model.vols.get(name) {
                        m.clone = cur.clone;
                    }
                }
                expect.verify(&pool, &self.unflushed);
                // Learn what the unflushed blocks became, then carry on.
                let h: Vec<(String, u64)> = self.unflushed.iter().cloned().collect();
                for (name, b) in h {
                    if let Some(m) = expect.vols.get_mut(&name) {
                        if b * BS >= m.size {
                            continue;
                        }
                        let mut buf = vec![0u8; BS as usize];
                        let n = (m.size - b * BS).min(BS) as usize;
                        pool.open_volume(&name)
                            .unwrap()
                            .read(b * BS, &mut buf[..n])
                            .unwrap();
                        m.blocks.insert(b, buf);
                    }
                }
                self.model = expect;
                self.pool = Some(pool);
                self.committed();
                let report = self.pool().check().unwrap();
                assert!(report.is_ok(), "check after crash: {:?}", report.problems);
            }
            Op::Check => {
                let report = p.check().unwrap();
                assert!(report.is_ok(), "check: {:?}", report.problems);
                self.committed();
            }
        }
    }
}

/// The pool's snapshot-only space, counted by difference (referenced less
/// what live trees reach), equals the simulated deletion of every snapshot,
/// with reclaim pending or not.
fn snapshot_only_by_difference_is_exact(p: &Pool) {
    assert_eq!(
        p.snapshot_only().unwrap(),
        p.snapshot_only_simulated().unwrap(),
        "snapshot-only space by difference and by simulated deletion"
    );
}

fn run(ops: Vec<Op>) {
    if std::env::var("MODEL_TRACE").is_ok() {
        eprintln!(
            "case: {} ops, {} writes, {} snaps, {} crashes",
            ops.len(),
            ops.iter().filter(|o| matches!(o, Op::Write(..))).count(),
            ops.iter().filter(|o| matches!(o, Op::Snap(..))).count(),
            ops.iter().filter(|o| matches!(o, Op::Crash(..))).count()
        );
    }
    let backend = Arc::new(SimBackend::new());
    let pool = Pool::create(backend.clone(), opts()).unwrap();
    let mut r = Run {
        backend,
        pool: Some(pool),
        model: Model::default(),
        durable: Model::default(),
        unflushed: BTreeSet::new(),
    };
    for op in [Op::Create(0, true), Op::Create(1, false)]
        .iter()
        .chain(&ops)
    {
        r.step(op);
        r.model.verify(r.pool(), &BTreeSet::new());
        common::cached_exclusive_sizes_are_exact(r.pool());
        snapshot_only_by_difference_is_exact(r.pool());
    }
    // Delete everything: every block must come back. A volume goes
    // whatever depends on it; the snapshots of deleted volumes go last, and
    // the retired volumes' records with them.
    let p = r.pool().clone();
    for v in p.list_volumes() {
        p.delete_volume(&v.name, true).unwrap();
    }
    for s in p.list_all_snapshots().unwrap() {
        assert!(s.volume_deleted, "{s:?}");
        p.delete_snapshot(&volume_reference(&s), &s.name).unwrap();
    }
    p.reclaim_all().unwrap();
    let report = p.check().unwrap();
    assert!(report.is_ok(), "final check: {:?}", report.problems);
    let stats = p.stats().unwrap();
    assert_eq!(stats.volumes + stats.snapshots + stats.retired_volumes, 0);
    // What remains in use is the catalog tree's skeleton only.
    assert!(stats.used_bytes < 64 * BS, "blocks not freed: {stats:?}");
    r.pool.take().unwrap().close().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, max_shrink_iters: 4000, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn engine_matches_model(ops in prop::collection::vec(op(), 1..80)) {
        run(ops);
    }
}

#[test]
fn scripted_lineage() {
    use Op::*;
    run(vec![
        Create(0, true),
        Write(0, 0, 1, 4, 7),
        Write(0, 5, 0, 2, 8),
        Snap(0, 0),
        Write(0, 0, 0, 2, 9),
        Clone(0, 0, 1),
        Group(0b11, 2, true),
        Write(1, 0, 2, 3, 10),
        Snap(1, 1),
        Expand(1),
        Write(1, 6, 0, 2, 11),
        Flatten(1),
        DelSnap(0, 0),
        Reclaim,
        Check,
        Crash(Some(3)),
        Revert(1, 1),
        Reopen,
        Check,
    ]);
}

/// Found by the model test at 4,000 cases: a refused flatten (a clone of an
/// empty snapshot) commits nothing, so a crash after it loses the write
/// before it that was never flushed. The model once took every flatten for
/// a commit.
#[test]
fn a_refused_flatten_commits_nothing() {
    use Op::*;
    run(vec![
        Snap(1, 2),
        Clone(1, 2, 2),
        Write(0, 0, 0, 0, 0),
        Flatten(2),
        Crash(None),
    ]);
}
