//! Concurrent writers, readers, snapshots, deletes, flushes and background
//! reclaim on one pool. Every write and snapshot is stamped with a global
//! clock before it starts and after it returns; each snapshot must then hold,
//! for every block, a write that started before the snapshot returned and is
//! no older than the newest write that finished before the snapshot began.
//! The run is measured in events, not time: each snapshot waits for a fixed
//! number of writes since the one before, and the writers stop when the
//! snapshots are done.

use lamina_engine::{Pool, PoolOptions, BLOCK};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

const BS: u64 = BLOCK as u64;
const WRITERS: u64 = 3;
const BLOCKS_PER_WRITER: u64 = 600; // spans leaf boundaries (504 entries)
const SNAPSHOTS: u64 = 40;
/// Writes (and trims) the writers make between two snapshots.
const WRITES_BETWEEN: u64 = 40;

/// Writes done so far, and the flag that ends the run.
#[derive(Default)]
struct Progress {
    writes: Mutex<u64>,
    moved: Condvar,
    stop: AtomicBool,
}

impl Progress {
    fn wrote(&self) {
        *self.writes.lock().unwrap() += 1;
        self.moved.notify_all();
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Wait until `n` writes are done in all; false if the run ended first.
    fn wait_for(&self, n: u64) -> bool {
        let mut w = self.writes.lock().unwrap();
        while *w < n && !self.stopped() {
            w = self.moved.wait(w).unwrap();
        }
        *w >= n
    }
}

/// Ends the run when its thread ends, by returning or by panicking, so
/// that no thread waits for one that is gone.
struct EndsRun(Arc<Progress>);

impl Drop for EndsRun {
    fn drop(&mut self) {
        let _w = self.0.writes.lock().unwrap_or_else(|p| p.into_inner());
        self.0.stop.store(true, Ordering::SeqCst);
        self.0.moved.notify_all();
    }
}

#[derive(Clone, Copy)]
struct Stamp {
    gen: u64,
    start: u64,
    end: u64,
}

fn content(block: u64, gen: u64) -> Vec<u8> {
    let mut v = vec![(block as u8) ^ (gen as u8); BLOCK];
    v[..8].copy_from_slice(&block.to_le_bytes());
    v[8..16].copy_from_slice(&gen.to_le_bytes());
    v
}

fn gen_of(buf: &[u8], block: u64) -> u64 {
    if buf.iter().all(|&b| b == 0) {
        return 0;
    }
    assert_eq!(
        u64::from_le_bytes(buf[..8].try_into().unwrap()),
        block,
        "block {block} holds another block's data"
    );
    let gen = u64::from_le_bytes(buf[8..16].try_into().unwrap());
    assert!(
        buf == content(block, gen).as_slice(),
        "block {block} is torn"
    );
    gen
}

#[test]
fn snapshots_are_points_in_time_under_concurrent_writes() {
    let dir = tempfile::tempdir().unwrap();
    let opts = PoolOptions {
        max_dirty_pages: 256,
        wal_bytes: 4 << 20,
        cache_bytes: 1 << 20,
        ..PoolOptions::default()
    };
    let pool = Pool::create_dir(dir.path(), opts).unwrap();
    pool.create_volume("v", WRITERS * BLOCKS_PER_WRITER * BS)
        .unwrap();
    pool.create_volume("other", 1 << 20).unwrap();
    let clock = Arc::new(AtomicU64::new(1));
    let progress = Arc::new(Progress::default());
    let history: Arc<Mutex<HashMap<u64, Vec<Stamp>>>> = Arc::default();
    let snaps: Arc<Mutex<Vec<(String, u64, u64)>>> = Arc::default();
    let first_reads: Arc<Mutex<HashMap<String, Vec<u64>>>> = Arc::default();

    std::thread::scope(|s| {
        for w in 0..WRITERS {
            let (pool, clock, progress, history) = (
                pool.clone(),
                clock.clone(),
                progress.clone(),
                history.clone(),
            );
            s.spawn(move || {
                let _end = EndsRun(progress.clone());
                let v = pool.open_volume("v").unwrap();
                let mut r = w * 7919 + 1;
                let mut gen = 0;
                while !progress.stopped() {
                    r ^= r << 13;
                    r ^= r >> 7;
                    r ^= r << 17;
                    let block = w * BLOCKS_PER_WRITER + r % BLOCKS_PER_WRITER;
                    gen += 1;
                    let g = gen * WRITERS + w; // unique per block across writers
                    let start = clock.fetch_add(1, Ordering::SeqCst);
                    // One write in ten is a trim: it leaves zeros (generation 0).
                    let gen = if r % 10 == 0 {
                        v.trim(block * BS, BS).unwrap();
                        0
                    } else {
                        v.write(block * BS, &content(block, g)).unwrap();
                        g
                    };
                    let end = clock.fetch_add(1, Ordering::SeqCst);
                    history
                        .lock()
                        .unwrap()
                        .entry(block)
                        .or_default()
                        .push(Stamp { gen, start, end });
                    progress.wrote();
                }
            });
        }
        // Unrelated I/O on another volume, with flushes.
        let (p2, progress2) = (pool.clone(), progress.clone());
        s.spawn(move || {
            let _end = EndsRun(progress2.clone());
            let v = p2.open_volume("other").unwrap();
            let mut buf = vec![0u8; BLOCK];
            let mut i = 0u64;
            while !progress2.stopped() {
                v.write((i % 256) * BS + 1, &[i as u8; 100]).unwrap();
                v.read((i * 7 % 256) * BS, &mut buf).unwrap();
                if i.is_multiple_of(50) {
                    v.flush().unwrap();
                }
                i += 1;
            }
        });
        // Snapshots, and deletes of older ones (background reclaim runs).
        let (p3, clock3, snaps3, reads3, progress3) = (
            pool.clone(),
            clock.clone(),
            snaps.clone(),
            first_reads.clone(),
            progress.clone(),
        );
        s.spawn(move || {
            // The run ends when the snapshots are done.
            let _end = EndsRun(progress3.clone());
            let mut buf = vec![0u8; BLOCK];
            for i in 0..SNAPSHOTS {
                if !progress3.wait_for((i + 1) * WRITES_BETWEEN) {
                    return; // another thread ended the run (it panicked)
                }
                let name = format!("s{i}");
                let start = clock3.fetch_add(1, Ordering::SeqCst);
                p3.create_snapshot("v", &name, &[]).unwrap();
                let end = clock3.fetch_add(1, Ordering::SeqCst);
                // Read it at once: it must never change afterwards.
                let h = p3.open_snapshot("v", &name).unwrap();
                let gens: Vec<u64> = (0..WRITERS * BLOCKS_PER_WRITER)
                    .map(|b| {
                        h.read(b * BS, &mut buf).unwrap();
                        gen_of(&buf, b)
                    })
                    .collect();
                reads3.lock().unwrap().insert(name.clone(), gens);
                snaps3.lock().unwrap().push((name, start, end));
                if i >= 10 && i % 3 == 0 {
                    let old = format!("s{}", i - 10);
                    p3.delete_snapshot("v", &old).unwrap();
                    snaps3.lock().unwrap().retain(|(n, _, _)| n != &old);
                }
            }
        });
    });

    let history = history.lock().unwrap();
    let mut buf = vec![0u8; BLOCK];
    let snaps = snaps.lock().unwrap();
    // Ten of the forty were deleted along the way.
    assert_eq!(snaps.len() as u64, SNAPSHOTS - 10);
    let writes = history.values().map(Vec::len).sum::<usize>() as u64;
    assert!(writes >= SNAPSHOTS * WRITES_BETWEEN, "{writes} writes");
    for (name, s_start, s_end) in snaps.iter() {
        let snap = pool.open_snapshot("v", name).unwrap();
        for block in 0..WRITERS * BLOCKS_PER_WRITER {
            snap.read(block * BS, &mut buf).unwrap();
            let gen = gen_of(&buf, block);
            let first = first_reads.lock().unwrap()[name][block as usize];
            assert_eq!(
                gen, first,
                "{name}: block {block} changed after the snapshot was taken"
            );
            let writes = history.get(&block).map(|v| v.as_slice()).unwrap_or(&[]);
            // The newest write finished before the snapshot began must be
            // there, or a later one that began before the snapshot ended.
            let floor = writes
                .iter()
                .filter(|w| w.end < *s_start)
                .max_by_key(|w| w.end);
            let seen = writes.iter().find(|w| w.gen == gen && gen != 0);
            match (floor, seen) {
                (_, Some(w)) => {
                    assert!(
                        w.start < *s_end,
                        "{name}: block {block} holds a write begun after the snapshot"
                    );
                    if let Some(f) = floor {
                        assert!(
                            w.end >= f.end || w.gen == f.gen,
                            "{name}: block {block} holds a stale write"
                        );
                    }
                }
                (Some(f), None) => {
                    // Zeros: the floor must be a trim, or a trim must overlap the snapshot.
                    let trimmed = f.gen == 0
                        || writes
                            .iter()
                            .any(|w| w.gen == 0 && w.start < *s_end && w.end > f.end);
                    assert!(
                        trimmed,
                        "{name}: block {block} lost write {} finished before the snapshot",
                        f.gen
                    );
                }
                (None, None) => {}
            }
        }
    }
    // The live volume holds each block's last write.
    let v = pool.open_volume("v").unwrap();
    for (block, writes) in history.iter() {
        v.read(block * BS, &mut buf).unwrap();
        let last = writes.iter().max_by_key(|w| w.end).unwrap();
        assert_eq!(gen_of(&buf, *block), last.gen, "block {block}");
    }
    pool.reclaim_all().unwrap();
    let report = pool.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    pool.close().unwrap();
}
