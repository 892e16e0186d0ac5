//! The engine in process: snapshot, clone and delete cost, I/O at snapshot
//! depth and memory, measured on the engine's API with no daemon or NBD in
//! the way, with an in-process anchor (the same reads and writes on a plain
//! file) so figures are read as ratios. The side-by-side suite (`suite`)
//! measures the same claims through NBD against other tools.

use anyhow::{Context, Result};
use lamina_engine::{Pool, PoolOptions, BLOCK};
use serde_json::{json, Value};
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod space;

const BS: u64 = BLOCK as u64;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

#[derive(clap::Args)]
pub struct EngineArgs {
    /// Directory for the pools (default: a temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Smaller sizes and depths, for CI (under a minute).
    #[arg(long)]
    quick: bool,
    /// Also write every figure as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Seconds per I/O measurement.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Run only these sections (by name, repeatable; default: all).
    #[arg(long)]
    only: Vec<String>,
}

fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        return 0.0;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn proc_field(file: &str, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(file).ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

fn peak_rss_mib() -> f64 {
    proc_field("/proc/self/status", "VmHWM:").unwrap_or(0) as f64 / 1024.0
}

fn written_bytes() -> Option<u64> {
    proc_field("/proc/self/io", "write_bytes:")
}

fn opts() -> PoolOptions {
    PoolOptions::default()
}

fn fresh_pool(base: &Path, name: &str) -> Result<Pool> {
    let dir = base.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    Pool::create_dir(&dir, opts()).with_context(|| format!("creating pool in {}", dir.display()))
}

/// Write `blocks` random 4 KiB blocks within the first `span` bytes.
fn scatter(v: &lamina_engine::Volume, span: u64, blocks: u64, seed: u64) -> Result<()> {
    let mut r = rng(seed);
    let buf = vec![0xA5u8; BLOCK];
    for _ in 0..blocks {
        v.write((r() % (span / BS)) * BS, &buf)?;
    }
    Ok(())
}

fn snapshot_latency(base: &Path, quick: bool) -> Result<Value> {
    let n = if quick { 50 } else { 200 };
    let mut out = serde_json::Map::new();
    for (label, size) in [("1GiB", GIB), ("1TiB", TIB)] {
        let pool = fresh_pool(base, &format!("snap-{label}"))?;
        pool.create_volume("v", size)?;
        let v = pool.open_volume("v")?;
        // The same 64 MiB of scattered data in both, spread over the volume.
        scatter(&v, size, 16_384, 1)?;
        v.flush()?;
        let mut lat = Vec::new();
        for i in 0..n {
            v.write((i as u64 * 7919 % (size / BS)) * BS, &[1u8; BLOCK])?;
            let t = Instant::now();
            pool.create_snapshot("v", &format!("s{i}"), &[])?;
            lat.push(ms(t.elapsed()));
        }
        out.insert(
            label.into(),
            json!({"p50_ms": percentile(&mut lat.clone(), 0.5), "p99_ms": percentile(&mut lat, 0.99), "count": n}),
        );
        pool.close()?;
    }
    Ok(Value::Object(out))
}

fn snapshot_count(base: &Path, quick: bool) -> Result<Value> {
    let total = if quick { 1_000 } else { 10_000 };
    let pool = fresh_pool(base, "snap-count")?;
    pool.create_volume("v", GIB)?;
    let v = pool.open_volume("v")?;
    scatter(&v, GIB, 4096, 2)?;
    let mut first = Vec::new();
    let mut last = Vec::new();
    let t0 = Instant::now();
    for i in 0..total {
        v.write((i as u64 % (GIB / BS)) * BS, &[2u8; BLOCK])?;
        let t = Instant::now();
        pool.create_snapshot("v", &format!("s{i}"), &[])?;
        let d = ms(t.elapsed());
        if i < 100 {
            first.push(d);
        } else if i >= total - 100 {
            last.push(d);
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let t = Instant::now();
    let listed = pool.list_snapshots("v")?.len();
    let list_ms = ms(t.elapsed());
    let t = Instant::now();
    pool.clone_snapshot("v", &format!("s{}", total - 1), "c")?;
    let clone_ms = ms(t.elapsed());
    pool.close()?;
    Ok(json!({
        "snapshots": total,
        "first_100_p50_ms": percentile(&mut first.clone(), 0.5),
        "first_100_p99_ms": percentile(&mut first, 0.99),
        "last_100_p50_ms": percentile(&mut last.clone(), 0.5),
        "last_100_p99_ms": percentile(&mut last, 0.99),
        "total_seconds": elapsed,
        "list_ms": list_ms,
        "listed": listed,
        "clone_of_last_ms": clone_ms,
    }))
}

/// Random 4 KiB I/O for `secs` on `threads` threads; returns IOPS.
fn random_io(
    read: &(dyn Fn(u64, &mut [u8]) + Sync),
    blocks: u64,
    write: bool,
    threads: usize,
    secs: f64,
) -> f64 {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let ops: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut r = rng(t as u64 + 11 + write as u64 * 100);
                    let mut buf = vec![0x3Cu8; BLOCK];
                    let mut n = 0u64;
                    while !n.is_multiple_of(256) || Instant::now() < deadline {
                        let b = r() % blocks;
                        if write {
                            buf[0] = n as u8;
                        }
                        read((b * BS) | (write as u64), &mut buf);
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    ops as f64 / secs
}

fn median(mut v: Vec<f64>) -> f64 {
    percentile(&mut v, 0.5)
}

/// 4 KiB random reads and writes on volumes at snapshot depth 0, 100 and
/// 1,000 (each layer rewrote 1% of the blocks at random), and on a plain
/// file, measured in alternating rounds so that the machine's noise falls on
/// all of them alike; medians are reported.
fn io_at_depth(base: &Path, quick: bool, secs: f64) -> Result<Value> {
    let size: u64 = if quick { 64 << 20 } else { 256 << 20 };
    let blocks = size / BS;
    let depths: &[u64] = if quick { &[0, 100] } else { &[0, 100, 1000] };
    let rounds = 3;
    let threads = 2;
    let chunk = vec![0xA5u8; 1 << 20];

    let path = base.join("raw.img");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    for off in (0..size).step_by(chunk.len()) {
        f.write_all_at(&chunk, off)?;
    }
    f.sync_all()?;
    let raw = |at: u64, buf: &mut [u8]| {
        if at & 1 == 1 {
            f.write_all_at(buf, at & !1).unwrap();
        } else {
            f.read_exact_at(buf, at).unwrap();
        }
    };

    // Every block of a volume written once, 1 MiB at a time.
    let write_all = |v: &lamina_engine::Volume| -> Result<()> {
        for off in (0..size).step_by(chunk.len()) {
            v.write(off, &chunk)?;
        }
        Ok(())
    };
    let pool = fresh_pool(base, "depth")?;
    let mut vols = Vec::new();
    let mut r = rng(5);
    for &d in depths {
        let name = format!("d{d}");
        pool.create_volume(&name, size)?;
        let v = pool.open_volume(&name)?;
        write_all(&v)?;
        for layer in 0..d {
            for _ in 0..blocks / 100 {
                v.write((r() % blocks) * BS, &[layer as u8; BLOCK])?;
            }
            pool.create_snapshot(&name, &format!("l{layer}"), &[])?;
        }
        // Rewrite everything once: what is measured next is the steady state.
        write_all(&v)?;
        v.flush()?;
        vols.push(v);
    }

    let n = depths.len() + 1;
    let (mut reads, mut writes) = (vec![Vec::new(); n], vec![Vec::new(); n]);
    // First writes right after a snapshot, in the same alternating rounds:
    // measured once per depth, right after building it, they gave 63k to
    // 258k IOPS at depth 1,000 from run to run on these VMs. A perf
    // profile of a slow one spent 43 % in copying into page-cache folios
    // (fresh guest memory: the host backs a page on its first touch, and
    // free page reporting hands freed memory back to it) and 18 % waiting
    // for the file's inode lock behind that copy, not in the engine.
    let mut first = vec![Vec::new(); n];
    for round in 0..rounds {
        reads[0].push(random_io(&raw, blocks, false, threads, secs));
        writes[0].push(random_io(&raw, blocks, true, threads, secs));
        f.sync_all()?;
        for (i, v) in vols.iter().enumerate() {
            let io = |at: u64, buf: &mut [u8]| {
                if at & 1 == 1 {
                    v.write(at & !1, buf).unwrap();
                } else {
                    v.read(at, buf).unwrap();
                }
            };
            reads[i + 1].push(random_io(&io, blocks, false, threads, secs));
            writes[i + 1].push(random_io(&io, blocks, true, threads, secs));
            v.flush()?;
            if depths[i] > 0 {
                // Every first write to a block copies on write, then the
                // volume is rewritten once to return to the steady state.
                pool.create_snapshot(&format!("d{}", depths[i]), &format!("r{round}"), &[])?;
                first[i + 1].push(random_io(&io, blocks, true, threads, secs.min(1.0)));
                write_all(v)?;
                v.flush()?;
            }
        }
    }
    drop(f);
    let _ = std::fs::remove_file(&path);
    let (raw_r, raw_w) = (median(reads[0].clone()), median(writes[0].clone()));
    let (base_r, base_w) = (median(reads[1].clone()), median(writes[1].clone()));
    let mut rows = vec![
        json!({"target": "plain file", "read_iops": raw_r, "write_iops": raw_w,
        "read_runs": reads[0], "write_runs": writes[0]}),
    ];
    for (i, &d) in depths.iter().enumerate() {
        let (rd, wr) = (median(reads[i + 1].clone()), median(writes[i + 1].clone()));
        rows.push(json!({
            "target": "lamina", "depth": d,
            "read_iops": rd, "write_iops": wr,
            "first_writes_after_snapshot_iops": (d > 0).then(|| median(first[i + 1].clone())),
            "first_writes_runs": first[i + 1],
            "read_vs_depth0": rd / base_r, "write_vs_depth0": wr / base_w,
            "read_vs_plain_file": rd / raw_r, "write_vs_plain_file": wr / raw_w,
            "read_runs": reads[i + 1], "write_runs": writes[i + 1],
        }));
    }
    pool.close()?;
    Ok(
        json!({"volume_bytes": size, "threads": threads, "seconds_per_run": secs, "rounds": rounds, "rows": rows}),
    )
}

fn delete_cost(base: &Path, quick: bool) -> Result<Value> {
    let depth = 100;
    let own: u64 = if quick { 64 << 20 } else { GIB };
    let pool = fresh_pool(base, "delete")?;
    pool.create_volume("v", 4 * GIB)?;
    let v = pool.open_volume("v")?;
    let per_layer = 256u64; // blocks rewritten per ordinary layer
    let mut r = rng(9);
    let mid = depth / 2;
    for i in 0..depth {
        if i == mid {
            // This layer holds `own` bytes of its own: written here, then
            // overwritten right after the snapshot, so only it holds them.
            let chunk = vec![7u8; 1 << 20];
            for off in (0..own).step_by(chunk.len()) {
                v.write(2 * GIB + off, &chunk)?;
            }
        } else {
            for _ in 0..per_layer {
                v.write((r() % (GIB / BS)) * BS, &[i as u8; BLOCK])?;
            }
        }
        pool.create_snapshot("v", &format!("s{i}"), &[])?;
        if i == mid {
            v.trim(2 * GIB, own)?;
        }
    }
    v.flush()?;
    let before = pool.stats()?;
    let excl = pool.usage("v", Some(&format!("s{mid}")))?.exclusive_bytes;
    let w0 = written_bytes();
    let t = Instant::now();
    pool.delete_snapshot("v", &format!("s{mid}"))?;
    let delete_ms = ms(t.elapsed());
    let t = Instant::now();
    pool.reclaim_all()?;
    let reclaim_ms = ms(t.elapsed());
    let w1 = written_bytes();
    let after = pool.stats()?;
    pool.close()?;
    Ok(json!({
        "chain_depth": depth,
        "snapshot_exclusive_bytes": excl,
        "delete_ms": delete_ms,
        "reclaim_ms": reclaim_ms,
        "bytes_freed": before.used_bytes.saturating_sub(after.used_bytes),
        "bytes_written_by_delete": w1.zip(w0).map(|(a, b)| a - b),
    }))
}

fn clone_cost(base: &Path) -> Result<Value> {
    let mut out = serde_json::Map::new();
    for (label, size) in [("1GiB", GIB), ("1TiB", TIB)] {
        let pool = fresh_pool(base, &format!("clone-{label}"))?;
        pool.create_volume("v", size)?;
        let v = pool.open_volume("v")?;
        scatter(&v, size, 16_384, 3)?;
        pool.create_snapshot("v", "s", &[])?;
        let mut lat = Vec::new();
        for i in 0..20 {
            let t = Instant::now();
            pool.clone_snapshot("v", "s", &format!("c{i}"))?;
            lat.push(ms(t.elapsed()));
        }
        let t = Instant::now();
        let mut n = 0u64;
        let info = pool.full_clone("v", "s", "full", &mut |d, _| n = d)?;
        let full_ms = ms(t.elapsed());
        out.insert(
            label.into(),
            json!({
                "linked_clone_p50_ms": percentile(&mut lat.clone(), 0.5),
                "linked_clone_p99_ms": percentile(&mut lat, 0.99),
                "full_clone_ms": full_ms, "full_clone_bytes": n,
                "full_clone_allocated": info.allocated_bytes,
            }),
        );
        pool.close()?;
    }
    Ok(Value::Object(out))
}

/// A volume that does nothing: what is left of a submit is the caller's and
/// the wrapper's own cost.
struct Null;

impl lamina_blockio::InlineIo for Null {
    fn size(&self) -> Result<u64, lamina_blockio::IoError> {
        Ok(GIB)
    }
    fn read_only(&self) -> bool {
        false
    }
    fn caps(&self) -> lamina_blockio::Caps {
        lamina_blockio::Caps::ALL
    }
    fn activate(&self, _: u64) -> Result<(), lamina_blockio::IoError> {
        Ok(())
    }
    fn read(&self, _o: u64, _b: &mut [u8]) -> Result<(), lamina_blockio::IoError> {
        Ok(())
    }
    fn write(&self, _o: u64, _d: &[u8], _f: bool) -> Result<(), lamina_blockio::IoError> {
        Ok(())
    }
    fn flush(&self) -> Result<(), lamina_blockio::IoError> {
        Ok(())
    }
    fn trim(&self, _o: u64, _l: u64) -> Result<(), lamina_blockio::IoError> {
        Ok(())
    }
    fn write_zeroes(&self, _o: u64, _l: u64, _t: bool) -> Result<(), lamina_blockio::IoError> {
        Ok(())
    }
    fn block_status(
        &self,
        _o: u64,
        _l: u64,
    ) -> Result<Vec<lamina_blockio::Extent>, lamina_blockio::IoError> {
        Ok(vec![])
    }
}

/// Submit `n` 4 KiB writes from each of `threads` threads; ns per write.
fn submit_ns(vol: &dyn lamina_blockio::BlockIo, n: u64, threads: usize) -> f64 {
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut data = vec![0u8; BLOCK];
                for i in 0..n {
                    let (tx, rx) = std::sync::mpsc::sync_channel(1);
                    vol.submit(
                        lamina_blockio::IoOp::Write {
                            offset: (i % 1024) * BS,
                            data,
                            fua: false,
                        },
                        Box::new(move |r| {
                            let _ = tx.send(r);
                        }),
                    );
                    data = match rx.recv() {
                        Ok(Ok(lamina_blockio::IoDone::Write(d))) => d,
                        _ => vec![0u8; BLOCK],
                    };
                }
            });
        }
    });
    t.elapsed().as_nanos() as f64 / (n * threads as u64) as f64
}

/// What per-volume I/O metrics cost a submit: the same writes on a volume
/// that does nothing, bare and wrapped in the daemon's observer
/// (`lamina_blockio::Observed` reporting to `lamina_server::metrics`), on
/// one thread and on two sharing the volume's series; set against a 4 KiB
/// write to an engine volume in process.
fn io_metrics_cost(base: &Path, quick: bool) -> Result<Value> {
    let n: u64 = if quick { 200_000 } else { 2_000_000 };
    let metrics = lamina_server::metrics::Metrics::new();
    let observed = lamina_blockio::Observed::new(Null, metrics.volume_io("v"));
    let mut out = serde_json::Map::new();
    for threads in [1usize, 2] {
        let mut bare = Vec::new();
        let mut wrapped = Vec::new();
        for _ in 0..5 {
            bare.push(submit_ns(&Null, n / 5, threads));
            wrapped.push(submit_ns(&observed, n / 5, threads));
        }
        let (b, w) = (median(bare), median(wrapped));
        out.insert(
            format!("threads_{threads}"),
            json!({"bare_ns": b, "observed_ns": w, "overhead_ns": w - b}),
        );
    }
    let pool = fresh_pool(base, "io-metrics")?;
    pool.create_volume("v", GIB)?;
    let v = pool.open_volume("v")?;
    let mut r = rng(9);
    let buf = vec![7u8; BLOCK];
    let writes = n / 10;
    let t = Instant::now();
    for _ in 0..writes {
        v.write((r() % (GIB / BS)) * BS, &buf)?;
    }
    let write_ns = t.elapsed().as_nanos() as f64 / writes as f64;
    pool.close()?;
    let overhead = out["threads_1"]["overhead_ns"].as_f64().unwrap_or(0.0);
    out.insert("engine_4k_write_ns".into(), json!(write_ns));
    out.insert(
        "overhead_share_of_engine_write".into(),
        json!(overhead / write_ns),
    );
    Ok(Value::Object(out))
}

fn rss_mib() -> f64 {
    proc_field("/proc/self/status", "VmRSS:").unwrap_or(0) as f64 / 1024.0
}

/// Memory with a sparse 1 TiB volume whose index is far larger than the
/// page cache: resident memory must stay near the cache size.
fn memory(base: &Path, quick: bool) -> Result<Value> {
    let writes: u64 = if quick { 32_768 } else { 262_144 };
    let pool = fresh_pool(base, "memory")?;
    pool.create_volume("v", TIB)?;
    let v = pool.open_volume("v")?;
    let rss0 = rss_mib();
    let t = Instant::now();
    scatter(&v, TIB, writes, 4)?;
    v.flush()?;
    let write_s = t.elapsed().as_secs_f64();
    let mut r = rng(4);
    let mut buf = vec![0u8; BLOCK];
    let t = Instant::now();
    for _ in 0..writes {
        v.read((r() % (TIB / BS)) * BS, &mut buf)?;
    }
    let read_s = t.elapsed().as_secs_f64();
    let stats = pool.stats()?;
    let usage = pool.usage("v", None)?;
    pool.close()?;
    Ok(json!({
        "volume_bytes": TIB, "random_4k_writes": writes,
        "data_bytes": usage.allocated_bytes,
        "index_bytes": usage.exclusive_metadata_bytes,
        "pool_used_bytes": stats.used_bytes,
        "cache_limit_mib": opts().cache_bytes >> 20,
        "rss_before_mib": rss0, "rss_after_mib": rss_mib(),
        "write_seconds": write_s, "read_seconds": read_s,
    }))
}

pub fn run(args: EngineArgs) -> Result<()> {
    let tmp;
    let base = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => {
            tmp = tempfile::Builder::new()
                .prefix("lamina-bench")
                .tempdir_in(std::env::current_dir()?)?;
            tmp.path().to_path_buf()
        }
    };
    let secs = if args.quick {
        args.seconds.min(1.0)
    } else {
        args.seconds
    };
    eprintln!(
        "lamina-bench: pools under {} ({})",
        base.display(),
        if args.quick { "quick" } else { "full" }
    );
    let mut report = serde_json::Map::new();
    type Section<'a> = (&'a str, Box<dyn Fn() -> Result<Value> + 'a>);
    let sections: Vec<Section> = vec![
        (
            "snapshot_latency_by_size",
            Box::new(|| snapshot_latency(&base, args.quick)),
        ),
        (
            "snapshot_latency_by_count",
            Box::new(|| snapshot_count(&base, args.quick)),
        ),
        (
            "random_4k_io_by_depth",
            Box::new(|| io_at_depth(&base, args.quick, secs)),
        ),
        (
            "delete_middle_snapshot",
            Box::new(|| delete_cost(&base, args.quick)),
        ),
        ("clone", Box::new(|| clone_cost(&base))),
        ("memory_sparse_1tib", Box::new(|| memory(&base, args.quick))),
        (
            "space_walks",
            Box::new(|| space::space_walks(&base, args.quick)),
        ),
        (
            "io_metrics_cost",
            Box::new(|| io_metrics_cost(&base, args.quick)),
        ),
    ];
    if let Some(bad) = args
        .only
        .iter()
        .find(|o| !sections.iter().any(|(name, _)| name == o))
    {
        let names: Vec<&str> = sections.iter().map(|(name, _)| *name).collect();
        anyhow::bail!("no section {bad:?}: the sections are {}", names.join(", "));
    }
    for (name, f) in sections {
        if !args.only.is_empty() && !args.only.iter().any(|o| o == name) {
            continue;
        }
        let t = Instant::now();
        let v = f().with_context(|| format!("bench {name}"))?;
        println!(
            "== {name} ({:.1} s)\n{}",
            t.elapsed().as_secs_f64(),
            serde_json::to_string_pretty(&v)?
        );
        report.insert(name.into(), v);
    }
    report.insert("peak_rss_mib".into(), json!(peak_rss_mib()));
    report.insert(
        "machine".into(),
        json!({
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        }),
    );
    println!("== peak RSS: {:.1} MiB", peak_rss_mib());
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&Value::Object(report))?)?;
    }
    Ok(())
}
