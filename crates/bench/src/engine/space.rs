//! The space walks at scale: listing a volume's snapshots with each one's
//! exclusive size (the first call after writes walks, the next is cached),
//! and the pool's snapshot-only space, over thousands of snapshots with
//! rewrites between them; and what each costs the I/O running beside it
//! (the slowest 4 KiB read issued while it ran).

use super::{fresh_pool, ms, rng, scatter, BS, GIB};
use anyhow::Result;
use lamina_engine::{Pool, BLOCK};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A thread reading random 4 KiB blocks until stopped; the slowest read
/// since the last `take` (µs).
struct Prober {
    stop: Arc<AtomicBool>,
    worst_us: Arc<AtomicU64>,
    handle: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Prober {
    fn start(pool: &Pool) -> Result<Prober> {
        let v = pool.open_volume("v")?;
        let stop = Arc::new(AtomicBool::new(false));
        let worst_us = Arc::new(AtomicU64::new(0));
        let (s, w) = (stop.clone(), worst_us.clone());
        let handle = std::thread::spawn(move || {
            let mut r = rng(77);
            let mut buf = vec![0u8; BLOCK];
            while !s.load(Ordering::Relaxed) {
                let t = Instant::now();
                v.read((r() % (GIB / BS)) * BS, &mut buf)?;
                w.fetch_max(t.elapsed().as_micros() as u64, Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            Ok(())
        });
        Ok(Prober {
            stop,
            worst_us,
            handle: Some(handle),
        })
    }

    fn take(&self) -> f64 {
        self.worst_us.swap(0, Ordering::Relaxed) as f64 / 1e3
    }

    fn finish(mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        match self.handle.take().map(|h| h.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => anyhow::bail!("the reading thread panicked"),
            None => Ok(()),
        }
    }
}

/// Time `f`, and the slowest read the prober saw meanwhile (both in ms).
fn timed<T>(p: &Prober, f: impl FnOnce() -> Result<T>) -> Result<(T, f64, f64)> {
    p.take();
    let t = Instant::now();
    let v = f()?;
    let took = ms(t.elapsed());
    // The read that was waiting when `f` finished reports just after.
    std::thread::sleep(std::time::Duration::from_millis(5));
    Ok((v, took, p.take()))
}

/// Two histories: many snapshots with a few blocks rewritten before each,
/// and fewer snapshots each taken after a burst that touches every leaf of
/// the volume (the suite's snapshots under a write load look like this).
pub fn space_walks(base: &Path, quick: bool) -> Result<Value> {
    let (many, heavy) = if quick { (1_000, 25) } else { (10_000, 250) };
    Ok(json!({
        "many_light": walks(base, many, 16)?,
        "few_heavy": walks(base, heavy, 3_000)?,
    }))
}

fn walks(base: &Path, snapshots: usize, per_snapshot: u64) -> Result<Value> {
    let pool = fresh_pool(base, "space")?;
    pool.create_volume("v", GIB)?;
    let v = pool.open_volume("v")?;
    scatter(&v, GIB, 65_536, 3)?;
    let mut r = rng(5);
    let t = Instant::now();
    for i in 0..snapshots {
        for _ in 0..per_snapshot {
            v.write((r() % (GIB / BS)) * BS, &[i as u8; BLOCK])?;
        }
        pool.create_snapshot("v", &format!("s{i}"), &[])?;
    }
    v.flush()?;
    // Settle: the log folded home, so no checkpoint runs beside the walks.
    pool.checkpoint()?;
    let build_s = t.elapsed().as_secs_f64();
    let p = Prober::start(&pool)?;
    std::thread::sleep(std::time::Duration::from_millis(50));
    let idle_worst = p.take();
    let (first, first_ms, first_stall) = timed(&p, || Ok(pool.list_snapshots("v")?))?;
    let (_, again_ms, again_stall) = timed(&p, || Ok(pool.list_snapshots("v")?))?;
    let (only, only_ms, only_stall) = timed(&p, || Ok(pool.snapshot_only()?))?;
    // The same figure by simulating the deletion of every snapshot (what
    // the pool's space cost before it was computed by difference).
    let (sim, sim_ms, sim_stall) = timed(&p, || Ok(pool.snapshot_only_simulated()?))?;
    p.finish()?;
    anyhow::ensure!(
        sim == only,
        "snapshot-only space by difference {only:?} differs from the simulated deletion's {sim:?}"
    );
    let exclusive: u64 = first.iter().map(|s| s.exclusive_bytes).sum();
    pool.close()?;
    Ok(json!({
        "snapshots": snapshots,
        "blocks_rewritten_per_snapshot": per_snapshot,
        "build_seconds": build_s,
        "list_first_ms": first_ms,
        "list_first_slowest_read_ms": first_stall,
        "list_again_ms": again_ms,
        "list_again_slowest_read_ms": again_stall,
        "snapshot_only_ms": only_ms,
        "snapshot_only_slowest_read_ms": only_stall,
        "snapshot_only_simulated_ms": sim_ms,
        "snapshot_only_simulated_slowest_read_ms": sim_stall,
        "slowest_read_idle_ms": idle_worst,
        "sum_of_exclusive_bytes": exclusive,
        "snapshot_only_bytes": only.data_bytes + only.metadata_bytes,
    }))
}
