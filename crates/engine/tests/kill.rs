//! kill -9 in the middle of a workload: a child process (this test binary,
//! re-run on the same test with an environment variable naming the pool)
//! writes, flushes and snapshots a volume in generations and reports each
//! flush on stdout; the parent kills it after a random number of flushes,
//! reopens the pool, and checks every block against what was flushed, and
//! every reported snapshot against its generation. With each snapshot the
//! child also restores it as a linked clone, snapshots the clone and
//! deletes the clone (which is retired, its snapshot kept under `NAME@ID`),
//! and deletes the retired clone's snapshot twenty generations on (the
//! retired record goes with it): those are checked too. The one test is
//! both halves, so neither can pass without doing its work.

use lamina_engine::{Pool, PoolOptions, BLOCK};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

const TEST: &str = "kill_9_mid_workload_loses_no_flushed_write";

const BLOCKS: u64 = 4096;
const PER_GEN: u64 = 64;
const ENV_DIR: &str = "LAMINA_KILL_CHILD_DIR";

fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// The blocks written in generation `g`, in order.
fn gen_blocks(g: u64) -> Vec<u64> {
    let mut r = rng(g * 7919 + 1);
    (0..PER_GEN).map(|_| r() % BLOCKS).collect()
}

fn content(b: u64, g: u64) -> Vec<u8> {
    let mut v = vec![0u8; BLOCK];
    v[..8].copy_from_slice(&b.to_le_bytes());
    v[8..16].copy_from_slice(&g.to_le_bytes());
    for (i, x) in v[16..].iter_mut().enumerate() {
        *x = (b as usize * 131 + g as usize * 17 + i) as u8;
    }
    v
}

/// Block -> generation of its last write, for generations 1..=g.
fn state_at(g: u64) -> HashMap<u64, u64> {
    let mut s = HashMap::new();
    for gen in 1..=g {
        for b in gen_blocks(gen) {
            s.insert(b, gen);
        }
    }
    s
}

/// A small log, so that checkpoints run all through the window a kill
/// lands in; few dirty pages allowed, so that the writeback thread's
/// page-log commits run beside the workload's journal commits (flushes
/// and snapshots) and kills land in both.
fn opts() -> PoolOptions {
    PoolOptions {
        wal_bytes: 1 << 20,
        max_dirty_pages: 64,
        ..PoolOptions::default()
    }
}

/// The child's half: runs until it is killed.
fn child_workload(dir: &str) -> ! {
    let pool = Pool::open_dir(dir, opts()).unwrap();
    let vol = pool.open_volume("v").unwrap();
    let mut out = std::io::stdout().lock();
    let mut retired = HashMap::new();
    for g in 1.. {
        for b in gen_blocks(g) {
            vol.write(b * BLOCK as u64, &content(b, g)).unwrap();
        }
        if g % 5 == 0 {
            pool.create_snapshot("v", &format!("g{g}"), &[]).unwrap();
            if g > 20 {
                pool.delete_snapshot("v", &format!("g{}", g - 20)).unwrap();
                writeln!(out, "deleted {}", g - 20).unwrap();
                let old: u64 = retired.remove(&(g - 20)).unwrap();
                pool.delete_snapshot(&format!("x{}@{old}", g - 20), "keep")
                    .unwrap();
                writeln!(out, "gone {}", g - 20).unwrap();
            }
            writeln!(out, "snap {g}").unwrap();
            let x = format!("x{g}");
            pool.clone_snapshot("v", &format!("g{g}"), &x).unwrap();
            pool.create_snapshot(&x, "keep", &[]).unwrap();
            let id = pool.volume_info_by_name(&x).unwrap().id;
            pool.delete_volume(&x, false).unwrap();
            retired.insert(g, id);
            writeln!(out, "retired {g} {id}").unwrap();
        } else {
            vol.flush().unwrap();
        }
        writeln!(out, "flushed {g}").unwrap();
        out.flush().unwrap();
    }
    unreachable!("the generations never end")
}

fn verify(pool: &Pool, target: lamina_engine::Volume, g: u64, in_flight: Option<u64>, what: &str) {
    let state = state_at(g);
    let next: Vec<u64> = in_flight.map(gen_blocks).unwrap_or_default();
    let mut buf = vec![0u8; BLOCK];
    for b in 0..BLOCKS {
        target.read(b * BLOCK as u64, &mut buf).unwrap();
        let want = state
            .get(&b)
            .map(|&gen| content(b, gen))
            .unwrap_or_else(|| vec![0; BLOCK]);
        if buf == want {
            continue;
        }
        let ok = next.contains(&b) && buf == content(b, in_flight.unwrap());
        assert!(ok, "{what}: block {b} lost data flushed at generation {g}");
    }
    let _ = pool;
}

fn round(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create_dir(dir.path(), opts()).unwrap();
    pool.create_volume("v", BLOCKS * BLOCK as u64).unwrap();
    pool.close().unwrap();

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(ENV_DIR, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // Let it run to a random flush from the third to the 42nd (it is
    // ahead of what we have read by whatever the pipe holds), then kill -9.
    let mut r = rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let kill_after = 3 + r() % 40;
    let mut flushed = 0;
    let mut lines = Vec::new();
    while flushed < kill_after {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("child made no progress");
        if let Some(g) = line.strip_prefix("flushed ") {
            flushed = g.parse().unwrap();
        }
        lines.push(line);
    }
    child.kill().unwrap();
    child.wait().unwrap();
    reader.join().unwrap();
    lines.extend(rx.try_iter());

    let mut last = 0;
    let mut snaps = std::collections::BTreeSet::new();
    let mut retired = std::collections::BTreeMap::new();
    let mut gone = Vec::new();
    for l in &lines {
        if let Some(g) = l.strip_prefix("flushed ") {
            last = g.parse().unwrap();
        } else if let Some(g) = l.strip_prefix("snap ") {
            snaps.insert(g.parse::<u64>().unwrap());
        } else if let Some(g) = l.strip_prefix("deleted ") {
            snaps.remove(&g.parse::<u64>().unwrap());
        } else if let Some(r) = l.strip_prefix("retired ") {
            let (g, id) = r.split_once(' ').unwrap();
            retired.insert(g.parse::<u64>().unwrap(), id.parse::<u64>().unwrap());
        } else if let Some(g) = l.strip_prefix("gone ") {
            let g = g.parse::<u64>().unwrap();
            gone.push((g, retired.remove(&g).unwrap()));
        }
    }
    let pool = Pool::open_dir(dir.path(), opts()).unwrap();
    verify(
        &pool,
        pool.open_volume("v").unwrap(),
        last,
        Some(last + 1),
        "volume",
    );
    for g in &snaps {
        let snap = pool
            .open_snapshot("v", &format!("g{g}"))
            .unwrap_or_else(|e| panic!("snapshot g{g} lost: {e}"));
        verify(&pool, snap, *g, None, &format!("snapshot g{g}"));
    }
    for (g, id) in &retired {
        let x = format!("x{g}@{id}");
        assert!(
            pool.open_volume(&format!("x{g}")).is_err(),
            "x{g} was deleted"
        );
        let snap = pool
            .open_snapshot(&x, "keep")
            .unwrap_or_else(|e| panic!("snapshot {x}/keep of a deleted volume lost: {e}"));
        verify(&pool, snap, *g, None, &format!("snapshot {x}/keep"));
    }
    for (g, id) in &gone {
        assert!(
            pool.list_snapshots(&format!("x{g}@{id}")).is_err(),
            "the retired x{g} went with its last snapshot"
        );
    }
    let report = pool.check().unwrap();
    assert!(report.is_ok(), "check after kill -9: {:?}", report.problems);
    eprintln!(
        "seed {seed}: killed after generation {last}, {} snapshots and {} of deleted volumes verified",
        snaps.len(),
        retired.len()
    );
    pool.close().unwrap();
}

#[test]
fn kill_9_mid_workload_loses_no_flushed_write() {
    if let Ok(dir) = std::env::var(ENV_DIR) {
        child_workload(&dir);
    }
    for seed in [1, 2, 3] {
        round(seed);
    }
}
