//! Snapshot latency: how long taking a snapshot takes, idle and under a
//! 4 KiB random-write load, on a 1 GiB and a 1 TiB (sparse) volume holding
//! the same data, at the first snapshots and at the Nth; and what a
//! snapshot every 0.5 s costs the write load. Lamina through its API;
//! qemu-storage-daemon serving qcow2 over NBD, with internal and external
//! snapshots over QMP, the user's alternative for live snapshots.

use crate::suite::fio::{self, Job, Target};
use crate::suite::lamina::Lamina;
use crate::suite::qmp::Qsd;
use crate::suite::record::{percentile, Better};
use crate::suite::{path_str, Ctx, GIB, MIB};
use anyhow::{ensure, Context, Result};
use std::time::{Duration, Instant};

const CASE: &str = "snapshot";
const TIB: u64 = 1 << 40;
/// qemu-storage-daemon's external chains stop here. Its walk down the
/// backing chain recurses, and on this suite's machines it overflowed its
/// stack (a segfault, in dmesg) at 1,350 to 1,410 overlays.
const QSD_EXTERNAL_MAX: usize = 1_200;

/// One system under test: something that takes snapshots of a volume that
/// fio can write to.
enum Sys {
    Lamina { l: Lamina, vol: String, n: usize },
    Internal(Qsd, usize),
    External(Qsd),
}

impl Sys {
    fn snapshot(&mut self) -> Result<Duration> {
        match self {
            Sys::Lamina { l, vol, n } => {
                *n += 1;
                l.snapshot(vol, &format!("s{n}"))
            }
            Sys::Internal(q, n) => {
                *n += 1;
                q.internal_snapshot(&format!("s{n}"))
                    .with_context(|| format!("its log ends:\n{}", q.server.log_tail()))
            }
            Sys::External(q) => q
                .external_snapshot()
                .with_context(|| format!("its log ends:\n{}", q.server.log_tail())),
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The write load: 4 KiB random writes within the first GiB of the volume,
/// whatever its size, so the 1 TiB volume's figures show what its size does
/// to snapshots rather than what sparse allocation costs.
fn load_job(seconds: f64) -> Job {
    let mut j = Job::new("randwrite", "4k", 32, seconds);
    j.seed = 11;
    j.size = Some(GIB);
    j
}

/// Take `n` snapshots back to back (idle) or every `gap` under a write load,
/// stopping early after `cap` once there are 3; their latencies in ms.
fn take(sys: &mut Sys, uri: &str, n: usize, loaded: bool, cap: Duration) -> Result<Vec<f64>> {
    let gap = Duration::from_millis(50);
    if !loaded {
        // Idle means idle: nothing left to write back from an earlier load.
        crate::suite::proc::sync_disks();
    }
    let _load = if loaded {
        let run = fio::spawn(
            &load_job(n as f64 * 0.2 + 30.0),
            &Target::Nbd(uri.to_string()),
        )?;
        std::thread::sleep(Duration::from_millis(500));
        Some(run)
    } else {
        None
    };
    let mut lat = Vec::with_capacity(n);
    let t = Instant::now();
    for _ in 0..n {
        if lat.len() >= 3 && t.elapsed() > cap {
            break;
        }
        lat.push(ms(sys.snapshot()?));
        if loaded {
            std::thread::sleep(gap);
        }
    }
    Ok(lat)
}

fn record_latencies(ctx: &mut Ctx, target: &str, what: &str, lat: &[f64]) {
    ctx.rec.add(
        CASE,
        target,
        &format!("{what}, p50"),
        "ms",
        Better::Lower,
        percentile(lat, 0.5),
    );
    ctx.rec.add(
        CASE,
        target,
        &format!("{what}, p99"),
        "ms",
        Better::Lower,
        percentile(lat, 0.99),
    );
}

/// The write load for `seconds`, with a snapshot every 0.5 s or none; the
/// snapshots' latencies in ms.
fn cadence(
    sys: &mut Sys,
    uri: &str,
    seconds: f64,
    snapshots: bool,
) -> Result<(fio::Outcome, Vec<f64>)> {
    let run = fio::spawn(&load_job(seconds), &Target::Nbd(uri.to_string()))?;
    let start = Instant::now();
    let mut taken = Vec::new();
    if snapshots {
        let end = Duration::from_secs_f64(seconds);
        let mut next = Duration::from_millis(500);
        while next < end {
            if let Some(w) = next.checked_sub(start.elapsed()) {
                std::thread::sleep(w);
            }
            taken.push(ms(sys.snapshot()?));
            next += Duration::from_millis(500);
        }
    }
    Ok((run.wait()?, taken))
}

/// The snapshots of the cadence rows: 0.5 s apart, each after that long
/// of the write load, where the 50 ms apart of "under write load" leave a
/// commit only 50 ms of writes to make durable.
const PACED: &str = "create under write load, every 0.5 s";

const LIST: &str = "list the volume's snapshots, at the Nth (GET .../snapshots)";
const POOL: &str = "pool space, at the Nth (GET /v1/pool)";

/// The volume's snapshots listed five times, each with its exclusive and
/// shared bytes (the first call walks what the cache lacks, the rest answer
/// from it: docs/space.md), and the pool's space with what only snapshots
/// hold; the list's goal is every call under a second.
fn list_at_the_nth(ctx: &mut Ctx, target: &str, l: &Lamina, vol: &str, n: usize) -> Result<()> {
    let mut lat = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let all = l.list_snapshots(vol)?;
        lat.push(ms(t.elapsed()));
        ensure!(
            all.len() == n,
            "listed {} snapshots of {vol}, not {n}",
            all.len()
        );
    }
    let t = Instant::now();
    l.pool_space()?;
    let pool = ms(t.elapsed());
    let calls: Vec<String> = lat.iter().map(|v| format!("{v:.0}")).collect();
    eprintln!(
        "    list of {n}: median {:.0} ms (calls in order: {} ms); pool space {pool:.0} ms",
        percentile(&lat, 0.5),
        calls.join(", ")
    );
    for v in &lat {
        ctx.rec.add(CASE, target, LIST, "ms", Better::Lower, *v);
    }
    ctx.rec.add(CASE, target, POOL, "ms", Better::Lower, pool);
    ctx.rec.goal(
        CASE,
        &format!("{target}: list its {n} snapshots < 1 s (each of 5 calls)"),
        target,
        LIST,
        1000.0,
    );
    Ok(())
}

pub fn run(ctx: &mut Ctx) -> Result<()> {
    let data = if ctx.p.name == "quick" {
        32 * MIB
    } else {
        256 * MIB
    };
    let samples = ctx.p.snapshot_samples;
    let nth = ctx.p.snapshot_count;
    // qemu's snapshots get slower as they pile up; they get this long to
    // reach the Nth before it is measured wherever they got to.
    let quick = ctx.p.name == "quick";
    let qemu_budget = Duration::from_secs(if quick { 5 } else { 30 });
    let cap = Duration::from_secs(if quick { 3 } else { 10 });
    let dir = ctx.scratch("snapshot")?;
    let sizes: &[(&str, u64)] = if quick {
        &[("1GiB", GIB)]
    } else {
        &[("1GiB", GIB), ("1TiB", TIB)]
    };
    if quick {
        ctx.rec.note(CASE, "quick profile: the 1 GiB volume only.");
    }
    let mut short = Vec::new();
    for &(label, size) in sizes {
        for kind in ["lamina", "qsd internal", "qsd external"] {
            let target = format!("{kind} {label}");
            eprintln!("  {target}");
            // An anchor that dies (qemu-storage-daemon has, deep into a
            // run of external snapshots) ends its own figures, not the case.
            let outcome = (|| -> Result<()> {
                let (mut sys, uri) = match kind {
                    "lamina" => {
                        let l = ctx.lamina(&format!("snap-{label}"))?;
                        l.create_volume("v", size)?;
                        let uri = l.attach("v")?;
                        (
                            Sys::Lamina {
                                l,
                                vol: "v".into(),
                                n: 0,
                            },
                            uri,
                        )
                    }
                    _ => {
                        let img = dir.join(format!("{}-{label}.qcow2", kind.replace(' ', "-")));
                        crate::suite::anchors::qemu_img(&[
                            "create",
                            "-q",
                            "-f",
                            "qcow2",
                            &path_str(&img),
                            &size.to_string(),
                        ])?;
                        let q = Qsd::start(
                            &format!("qsd-{}-{label}", kind.replace(' ', "-")),
                            &img,
                            &dir,
                        )?;
                        let uri = q.uri.clone();
                        if kind == "qsd internal" {
                            (Sys::Internal(q, 0), uri)
                        } else {
                            (Sys::External(q), uri)
                        }
                    }
                };
                // The same data in each: `data` bytes of 4 KiB writes at random
                // over the whole volume, same offsets everywhere.
                let mut fill = Job::new("randwrite", "4k", 32, 0.0);
                fill.number_ios = Some(data / 4096);
                fill.seed = 5;
                fio::run(&fill, &Target::Nbd(uri.clone()))
                    .with_context(|| format!("filling {target}"))?;

                let idle = take(&mut sys, &uri, samples, false, cap)?;
                record_latencies(ctx, &target, "create, idle, first snapshots", &idle);
                if idle.len() < samples {
                    short.push(format!("{target} idle: {}", idle.len()));
                }
                let loaded = take(&mut sys, &uri, samples, true, cap)?;
                record_latencies(
                    ctx,
                    &target,
                    "create under write load, first snapshots",
                    &loaded,
                );
                if loaded.len() < samples {
                    short.push(format!("{target} under load: {}", loaded.len()));
                }

                let mut paced = Vec::new();
                for round in 0..ctx.p.rounds {
                    let secs = ctx.p.seconds.max(2.0);
                    let (base, _) = cadence(&mut sys, &uri, secs, false)?;
                    let (with, taken) = cadence(&mut sys, &uri, secs, true)?;
                    eprintln!(
                    "    round {round}: write IOPS {:.0} without, {:.0} with {} snapshots (p50 {:.1} ms); p99 {:.0} / {:.0} µs",
                    base.iops, with.iops, taken.len(), percentile(&taken, 0.5), base.p99_us, with.p99_us
                );
                    paced.extend(taken);
                    ctx.rec.add(
                        CASE,
                        &target,
                        "write IOPS, no snapshots",
                        "IOPS",
                        Better::Higher,
                        base.iops,
                    );
                    ctx.rec.add(
                        CASE,
                        &target,
                        "write IOPS, a snapshot every 0.5 s",
                        "IOPS",
                        Better::Higher,
                        with.iops,
                    );
                    ctx.rec.add(
                        CASE,
                        &target,
                        "write IOPS with snapshots ÷ without",
                        "×",
                        Better::Higher,
                        with.iops / base.iops,
                    );
                    ctx.rec.add(
                        CASE,
                        &target,
                        "write p99, no snapshots",
                        "µs",
                        Better::Lower,
                        base.p99_us,
                    );
                    ctx.rec.add(
                        CASE,
                        &target,
                        "write p99, a snapshot every 0.5 s",
                        "µs",
                        Better::Lower,
                        with.p99_us,
                    );
                    ctx.rec.add(
                        CASE,
                        &target,
                        "write p99 with snapshots ÷ without",
                        "×",
                        Better::Lower,
                        with.p99_us / base.p99_us,
                    );
                }

                record_latencies(ctx, &target, PACED, &paced);

                // Up to the Nth: unmeasured, as fast as it goes (qemu within
                // its budget), then measured again.
                let have = match &sys {
                    Sys::Lamina { n, .. } | Sys::Internal(_, n) => *n,
                    Sys::External(q) => q.overlays(),
                };
                let mut goal = nth.saturating_sub(samples * 2);
                let capped = matches!(sys, Sys::External(_)) && nth > QSD_EXTERNAL_MAX;
                if capped {
                    goal = goal.min(QSD_EXTERNAL_MAX.saturating_sub(samples * 2));
                    ctx.rec.note(
                        CASE,
                        format!(
                            "{target} stops at {QSD_EXTERNAL_MAX} overlays: deeper, qemu-storage-daemon overflows its stack walking the backing chain (it crashed at 1,350 to 1,410 in earlier runs)."
                        ),
                    );
                }
                let t = Instant::now();
                let mut count = have;
                while count < goal {
                    if !matches!(sys, Sys::Lamina { .. }) && t.elapsed() > qemu_budget {
                        break;
                    }
                    sys.snapshot()?;
                    count += 1;
                }
                let idle = take(&mut sys, &uri, samples, false, cap)?;
                let loaded = take(&mut sys, &uri, samples, true, cap)?;
                let reached = count + idle.len() + loaded.len();
                record_latencies(ctx, &target, "create, idle, at the Nth", &idle);
                record_latencies(ctx, &target, "create under write load, at the Nth", &loaded);
                ctx.rec.add(
                    CASE,
                    &target,
                    "N (snapshots by the end)",
                    "snapshots",
                    Better::Higher,
                    reached as f64,
                );
                eprintln!(
                    "    at the {reached}th: idle p99 {:.2} ms, loaded p99 {:.2} ms",
                    percentile(&idle, 0.99),
                    percentile(&loaded, 0.99)
                );
                if let Sys::Lamina { l, vol, .. } = &sys {
                    list_at_the_nth(ctx, &target, l, vol, reached)?;
                }
                if reached < nth && !(capped && count >= goal) {
                    ctx.rec.note(
                    CASE,
                    format!(
                        "{target} reached only {reached} snapshots of the {nth} asked for in {} s of taking them: its \"at the Nth\" figures are at {reached}.",
                        qemu_budget.as_secs()
                    ),
                );
                }
                Ok(())
            })();
            match outcome {
                Ok(()) => {}
                Err(e) if kind != "lamina" => {
                    ctx.rec.note(
                        CASE,
                        format!("{target} failed, so its figures stop where it did: {e:#}"),
                    );
                }
                Err(e) => return Err(e),
            }
        }
    }
    if !short.is_empty() {
        ctx.rec.note(
            CASE,
            format!(
                "Snapshots slower than {} s in all stopped early, so these percentiles rest on fewer samples: {}.",
                cap.as_secs(),
                short.join("; ")
            ),
        );
    }
    for &(label, _) in sizes {
        let lamina = format!("lamina {label}");
        for what in [
            "create, idle, first snapshots",
            "create under write load, first snapshots",
            "create, idle, at the Nth",
            "create under write load, at the Nth",
            PACED,
        ] {
            for p in ["p50", "p99"] {
                let metric = format!("{what}, {p}");
                for q in ["qsd internal", "qsd external"] {
                    ctx.rec.compare(
                        CASE,
                        &format!("{label}: {metric}, vs {q}"),
                        &metric,
                        &lamina,
                        &format!("{q} {label}"),
                        None,
                    );
                }
                if p == "p99" && what.contains("load") {
                    ctx.rec
                        .goal(CASE, &format!("{label}: {metric}"), &lamina, &metric, 5.0);
                }
            }
        }
        for metric in [
            "write IOPS with snapshots ÷ without",
            "write p99 with snapshots ÷ without",
        ] {
            for q in ["qsd internal", "qsd external"] {
                ctx.rec.compare(
                    CASE,
                    &format!("{label}: {metric}, vs {q}"),
                    metric,
                    &lamina,
                    &format!("{q} {label}"),
                    None,
                );
            }
        }
        ctx.rec.goal(
            CASE,
            &format!("{label}: write IOPS with a snapshot every 0.5 s ÷ without"),
            &lamina,
            "write IOPS with snapshots ÷ without",
            0.95,
        );
    }
    ctx.rec.note(
        CASE,
        format!(
            "Each volume holds {} MiB written 4 KiB at a time at the same random offsets. Snapshot time is from request to answer: \
             Lamina's HTTP API on its unix socket (durable when it answers), qemu-storage-daemon's QMP. \"First snapshots\": {samples} \
             back to back idle, then {samples} 50 ms apart under fio randwrite QD32; \"at the Nth\" the same after taking the rest \
             unmeasured up to N = {nth}. The write load is fio randwrite QD32 over the volume's first GiB. The cadence rows run \
             it {} s with no snapshot and with one every 0.5 s, in alternation, {} rounds; \"every 0.5 s\" is the latency of \
             those snapshots, all rounds together.",
            data >> 20,
            ctx.p.seconds.max(2.0),
            ctx.p.rounds
        ),
    );
    Ok(())
}
