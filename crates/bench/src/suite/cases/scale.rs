//! Scale (control plane): many volumes with many snapshots each, made
//! through the API; how long making them takes, listing every snapshot,
//! the daemon's memory with them all, and deleting them all.

use crate::suite::lamina::Lamina;
use crate::suite::nbd_client::Nbd;
use crate::suite::record::{percentile, Better};
use crate::suite::{Ctx, GIB, MIB};
use anyhow::{ensure, Context, Result};
use std::time::{Duration, Instant};

const CASE: &str = "scale";
/// Samples of the list of every snapshot.
const LISTS: usize = 10;
const LAMINA: &str = "lamina";
const LIST: &str = "list all snapshots (GET /v1/snapshots)";
const PEAK: &str = "daemon peak RSS (VmHWM), after creating and listing all";

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Peak resident memory of a process so far, MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .map(|kib| kib / 1024.0)
        .unwrap_or(f64::NAN)
}

/// A 4 KiB block that differs per volume and step.
fn block(v: usize, s: usize) -> Vec<u8> {
    let mut x = ((v as u64) << 32 | s as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut b = vec![0u8; 4096];
    for w in b.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes());
    }
    b
}

/// One volume with its snapshots: before each snapshot, one 4 KiB block is
/// rewritten (so each snapshot holds a block of its own) and one new block
/// is written further on (so the volume's map grows). The API times of the
/// volume's creation and of each snapshot, ms.
fn make_volume(l: &Lamina, v: usize, snapshots: usize) -> Result<(f64, Vec<f64>)> {
    let name = format!("vol{v:04}");
    let t = Instant::now();
    l.create_volume(&name, GIB)?;
    let created = ms(t.elapsed());
    let uri = l.attach(&name)?;
    let mut c = Nbd::connect(&uri)?;
    let mut lat = Vec::with_capacity(snapshots);
    for s in 0..snapshots {
        c.write(0, &block(v, s))?;
        c.write((s as u64 % 63 + 1) * 16 * MIB, &block(v, s + 1000))?;
        lat.push(ms(l.snapshot(&name, &format!("snap{s:02}"))?));
    }
    drop(c);
    l.detach(&name)?;
    Ok((created, lat))
}

pub fn run(ctx: &mut Ctx) -> Result<()> {
    let volumes = ctx.p.scale_volumes;
    let snapshots = ctx.p.scale_snapshots;
    let l = ctx.lamina("scale")?;
    let rss_idle = l.rss_mib();

    let t = Instant::now();
    let mut vol_lat = Vec::with_capacity(volumes);
    let mut snap_lat = Vec::with_capacity(volumes * snapshots);
    for v in 0..volumes {
        let (c, s) = make_volume(&l, v, snapshots).with_context(|| format!("volume {v}"))?;
        vol_lat.push(c);
        snap_lat.extend(s);
        if (v + 1) % 100 == 0 {
            eprintln!(
                "  {} volumes, {:.0} s; daemon RSS {:.0} MiB",
                v + 1,
                t.elapsed().as_secs_f64(),
                l.rss_mib()
            );
        }
    }
    let made = t.elapsed();
    let rss_made = l.rss_mib();

    let mut list = Vec::new();
    let mut rss_first = 0.0;
    let mut answer_mib = 0.0;
    for i in 0..LISTS {
        let t = Instant::now();
        let all = l.list_all_snapshots()?;
        list.push(ms(t.elapsed()));
        ensure!(
            all.len() == volumes * snapshots,
            "GET /v1/snapshots listed {} snapshots, not {}",
            all.len(),
            volumes * snapshots
        );
        if i == 0 {
            rss_first = l.rss_mib();
            answer_mib = serde_json::to_vec(&all)?.len() as f64 / MIB as f64;
        }
    }
    let rss_listed = l.rss_mib();
    let peak = peak_rss_mib(l.pid());

    let t = Instant::now();
    for v in 0..volumes {
        l.delete_volume(&format!("vol{v:04}"), true)?;
    }
    let deleted = t.elapsed();
    let left = l.list_all_snapshots()?.len();
    ensure!(
        left == 0,
        "{left} snapshots left after deleting every volume"
    );
    drop(l);

    eprintln!(
        "  made in {:.1} s (snapshot p50 {:.2} ms, p99 {:.2} ms); list {:.0} ms (first {:.0} ms, \
         {answer_mib:.2} MiB); RSS {rss_made:.0} MiB before listing, {rss_first:.0} after a list, \
         {rss_listed:.0} after {LISTS}, peak {peak:.0}; deleted in {:.1} s",
        made.as_secs_f64(),
        percentile(&snap_lat, 0.5),
        percentile(&snap_lat, 0.99),
        percentile(&list, 0.5),
        list[0],
        deleted.as_secs_f64()
    );
    let r = &mut ctx.rec;
    let mut add =
        |metric: &str, unit: &str, v: f64| r.add(CASE, LAMINA, metric, unit, Better::Lower, v);
    add(
        "create all (volumes, writes, snapshots)",
        "s",
        made.as_secs_f64(),
    );
    add("create volume, p50", "ms", percentile(&vol_lat, 0.5));
    add("create volume, p99", "ms", percentile(&vol_lat, 0.99));
    add("create snapshot, p50", "ms", percentile(&snap_lat, 0.5));
    add("create snapshot, p99", "ms", percentile(&snap_lat, 0.99));
    for v in &list {
        add(LIST, "ms", *v);
    }
    add("list all snapshots, the first call", "ms", list[0]);
    add("list all snapshots: answer size", "MiB", answer_mib);
    add("daemon RSS, idle before", "MiB", rss_idle);
    add("daemon RSS with them all, before listing", "MiB", rss_made);
    add("daemon RSS after the first list", "MiB", rss_first);
    add(
        &format!("daemon RSS after {LISTS} lists"),
        "MiB",
        rss_listed,
    );
    add(PEAK, "MiB", peak);
    add(
        "delete all (volumes with their snapshots)",
        "s",
        deleted.as_secs_f64(),
    );
    r.goal(
        CASE,
        &format!(
            "list all {} snapshots < 1 s (median of {LISTS})",
            volumes * snapshots
        ),
        LAMINA,
        LIST,
        1000.0,
    );
    r.goal(
        CASE,
        &format!("daemon RSS < 512 MiB with {volumes} × {snapshots} (its peak)"),
        LAMINA,
        PEAK,
        512.0,
    );
    r.note(
        CASE,
        format!(
            "{volumes} volumes of 1 GiB × {snapshots} snapshots, made one after another by one client: POST \
             /v1/volumes, attach, then before each POST .../snapshots two 4 KiB writes over NBD (one block \
             rewritten, so each snapshot holds a block of its own, and one new block; the snapshot takes what \
             was acknowledged, no flush); then detach. \"create all\" is that whole loop. The list is GET \
             /v1/snapshots, {LISTS} samples (the goal is on their median; the first, right after creating, is also \
             given alone), each answer parsed and counted. RSS is the daemon's VmRSS; its peak is VmHWM, read \
             after the lists. Delete all is DELETE /v1/volumes/NAME?with_snapshots=true for each volume. No \
             anchor: qemu has no daemon-wide control plane to compare with."
        ),
    );
    Ok(())
}
