//! An in-memory reference model of a pool, and the comparison of a real
//! pool against it, shared by the property and crash tests; and a fresh
//! pool for the API tests.
#![allow(dead_code)]

use lamina_engine::{ExtentKind, Pool, PoolOptions, BLOCK};
use std::collections::{BTreeMap, BTreeSet};

pub const BS: u64 = BLOCK as u64;

/// A new pool in a temporary directory, without background threads (so
/// flatten and reclaim run when called, and tests see their end).
pub fn pool() -> (tempfile::TempDir, Pool) {
    let dir = tempfile::tempdir().unwrap();
    let p = Pool::create_dir(
        dir.path(),
        PoolOptions {
            background: false,
            ..PoolOptions::default()
        },
    )
    .unwrap();
    (dir, p)
}

#[derive(Clone, Debug, Default)]
pub struct MVol {
    pub size: u64,
    pub blocks: BTreeMap<u64, Vec<u8>>,
    /// A linked clone not yet flattened.
    pub clone: bool,
}

impl MVol {
    pub fn new(size: u64) -> Self {
        MVol {
            size,
            ..Default::default()
        }
    }

    pub fn write(&mut self, off: u64, data: &[u8]) {
        let mut done = 0usize;
        while done < data.len() {
            let at = off + done as u64;
            let (b, o) = (at / BS, (at % BS) as usize);
            let n = (BLOCK - o).min(data.len() - done);
            let blk = self.blocks.entry(b).or_insert_with(|| vec![0; BLOCK]);
            blk[o..o + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }

    pub fn zero(&mut self, off: u64, len: u64) {
        let end = off + len;
        let mut at = off;
        while at < end {
            let (b, o) = (at / BS, at % BS);
            let n = (BS - o).min(end - at);
            if n == BS {
                self.blocks.remove(&b);
            } else if let Some(blk) = self.blocks.get_mut(&b) {
                blk[o as usize..(o + n) as usize].fill(0);
            }
            at += n;
        }
    }

    pub fn read_block(&self, b: u64) -> Vec<u8> {
        self.blocks
            .get(&b)
            .cloned()
            .unwrap_or_else(|| vec![0; BLOCK])
    }
}

/// Pattern bytes for a write: depends on the seed and the absolute offset.
pub fn pattern(seed: u8, off: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((off + i).wrapping_mul(31) as u8) ^ seed.wrapping_mul(101) ^ 0x5a)
        .collect()
}

/// Compare one engine volume or snapshot with its model, skipping `skip` blocks.
pub fn compare_one(
    what: &str,
    h: &lamina_engine::Volume,
    m: &MVol,
    skip: &BTreeSet<u64>,
) -> Result<(), String> {
    let e = |x: lamina_engine::Error| format!("{what}: {x}");
    let size = h.size().map_err(e)?;
    if size != m.size {
        return Err(format!("{what}: size {size}, model {}", m.size));
    }
    let mut buf = vec![0u8; BLOCK];
    for (&b, data) in &m.blocks {
        if skip.contains(&b) || b * BS >= m.size {
            continue;
        }
        let n = (m.size - b * BS).min(BS) as usize;
        h.read(b * BS, &mut buf[..n]).map_err(e)?;
        if buf[..n] != data[..n] {
            return Err(format!("{what}: block {b} differs from the model"));
        }
    }
    for x in h.extents(0, m.size).map_err(e)? {
        if x.kind != ExtentKind::Data {
            continue;
        }
        for b in x.offset / BS..(x.offset + x.len).div_ceil(BS) {
            if m.blocks.contains_key(&b) || skip.contains(&b) {
                continue;
            }
            let n = (m.size - b * BS).min(BS) as usize;
            h.read(b * BS, &mut buf[..n]).map_err(e)?;
            if buf[..n].iter().any(|&x| x != 0) {
                return Err(format!("{what}: block {b} has data the model lacks"));
            }
        }
    }
    Ok(())
}

#[derive(Clone, Debug, Default)]
pub struct Model {
    pub vols: BTreeMap<String, MVol>,
    pub snaps: BTreeMap<(String, String), MVol>,
}

impl Model {
    /// Compare the whole pool with the model. `skip` lists (volume, block)
    /// pairs whose content is unknown (written but not flushed before a crash).
    pub fn verify(&self, pool: &Pool, skip: &BTreeSet<(String, u64)>) {
        if let Err(e) = self.compare(pool, skip) {
            panic!("pool differs from the model: {e}");
        }
    }

    pub fn compare(&self, pool: &Pool, skip: &BTreeSet<(String, u64)>) -> Result<(), String> {
        let vols: Vec<String> = pool.list_volumes().into_iter().map(|v| v.name).collect();
        let want: Vec<String> = self.vols.keys().cloned().collect();
        if vols != want {
            return Err(format!("volumes {vols:?}, model {want:?}"));
        }
        for (name, m) in &self.vols {
            let h = pool.open_volume(name).map_err(|e| e.to_string())?;
            let s: BTreeSet<u64> = skip
                .iter()
                .filter(|(v, _)| v == name)
                .map(|(_, b)| *b)
                .collect();
            compare_one(name, &h, m, &s)?;
        }
        let snaps: BTreeSet<(String, String)> = pool
            .list_all_snapshots()
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|s| (volume_reference(&s), s.name))
            .collect();
        let want: BTreeSet<(String, String)> = self.snaps.keys().cloned().collect();
        if snaps != want {
            return Err(format!("snapshots {snaps:?}, model {want:?}"));
        }
        for ((v, s), m) in &self.snaps {
            let h = pool.open_snapshot(v, s).map_err(|e| e.to_string())?;
            compare_one(&format!("{v}@{s}"), &h, m, &BTreeSet::new())?;
        }
        Ok(())
    }
}

/// How a snapshot's volume is named so that the name resolves to it alone:
/// its name while live, `NAME@ID` once it is deleted (retired).
pub fn volume_reference(s: &lamina_engine::SnapshotInfo) -> String {
    if s.volume_deleted {
        format!("{}@{}", s.volume, s.volume_id)
    } else {
        s.volume.clone()
    }
}

fn d<T>(r: lamina_engine::Result<T>) -> lamina_engine::Result<()> {
    r.map(drop)
}

/// With the pool's latch set (by the failure `first`), every request that
/// reads or changes the pool must fail with the latch's error, naming that
/// first failure, and change nothing: the in-memory listing stays as it
/// was, and `io_count` (the backend's count of mutating I/O, when known)
/// does not move.
pub fn assert_refused(
    pool: &Pool,
    first: &lamina_engine::IoFailure,
    io_count: Option<&dyn Fn() -> u64>,
) {
    let before = pool.list_volumes();
    let ops = io_count.map(|f| f());
    let expect = |what: &str, r: lamina_engine::Result<()>| match r {
        Err(lamina_engine::Error::Unavailable(f)) => {
            assert_eq!(*f, *first, "{what}: names another failure");
            let msg = lamina_engine::Error::Unavailable(f).to_string();
            assert!(msg.contains(first.op), "{what}: {msg}");
        }
        Err(e) => panic!("{what}: expected the latch's error, got {e}"),
        Ok(()) => panic!("{what}: succeeded after the latch was set"),
    };
    expect(
        "create volume",
        d(pool.create_volume("latch-probe", 1 << 20)),
    );
    expect("commit", pool.commit());
    expect("checkpoint", pool.checkpoint());
    expect("reclaim", d(pool.reclaim_all()));
    expect("stats", d(pool.stats()));
    expect("check", d(pool.check()));
    if let Some(v) = before.first() {
        let name = v.name.as_str();
        let h = pool.open_volume(name).unwrap();
        expect("write", h.write(0, &[9; BLOCK]));
        expect("unaligned write", h.write(100, &[9; 10]));
        expect("trim", h.trim(0, BS));
        expect("read", h.read(0, &mut [0; BLOCK]));
        expect("flush", h.flush());
        expect(
            "create snapshot",
            d(pool.create_snapshot(name, "latch-probe", &[])),
        );
        expect("clone volume", d(pool.clone_volume(name, "latch-probe")));
        expect(
            "create group",
            d(pool.create_snapshot_group(&[name], "latch-probe", &[])),
        );
        expect("expand", d(pool.expand_volume(name, v.size + BS)));
        if let Some(s) = &v.parent_snapshot {
            expect("revert", d(pool.revert_volume(name, s)));
            expect("clone", d(pool.clone_snapshot(name, s, "latch-probe")));
            let sh = pool.open_snapshot(name, s).unwrap();
            expect("read snapshot", sh.read(0, &mut [0; BLOCK]));
            expect("delete snapshot", pool.delete_snapshot(name, s));
        }
        expect("delete volume", pool.delete_volume(name, true));
    }
    assert_eq!(
        pool.list_volumes(),
        before,
        "a refused request changed the pool"
    );
    if let (Some(f), Some(n)) = (io_count, ops) {
        assert_eq!(f(), n, "a refused request did I/O on the pool's files");
    }
}

/// Every snapshot's exclusive size as listed (from the engine's cache while
/// its sharing generation holds) equals a fresh walk of its tree.
pub fn cached_exclusive_sizes_are_exact(p: &Pool) {
    for v in p.list_volumes() {
        for s in p.list_snapshots(&v.name).unwrap() {
            let walked = p.usage(&v.name, Some(&s.name)).unwrap().exclusive_bytes;
            assert_eq!(
                s.exclusive_bytes, walked,
                "listed exclusive size of {}/{}",
                v.name, s.name
            );
        }
    }
}
