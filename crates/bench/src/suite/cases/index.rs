//! Index space: what a sparse volume's index costs next to its data. The
//! same 4 KiB random writes (262,144 in the full run: 1 GiB) scattered over
//! an empty 1 TiB volume, on Lamina and on qcow2 images served by qemu-nbd
//! with 64 KiB clusters (qemu's default) and with 4 KiB clusters (the same
//! granularity as Lamina's). Each write lands in its own 2 MiB region, the
//! worst case of a radix index with fixed-size leaves: docs/design.md.
//!
//! Lamina's index bytes are the pool's used bytes gained less the volume's
//! allocated data; qcow2's are the image's blocks on disk less its allocated
//! clusters (`qemu-img check`). Space used is the whole gain, data and index,
//! against the bytes the writes carried.

use crate::suite::anchors::{qemu_img, qemu_nbd_qcow2_opts};
use crate::suite::fio::{self, Job, Target};
use crate::suite::record::Better;
use crate::suite::{path_str, Ctx, GIB};
use anyhow::{Context, Result};
use std::os::unix::fs::MetadataExt;

const CASE: &str = "index";
const TIB: u64 = 1 << 40;
const INDEX: &str = "index bytes ÷ data bytes";
const SPACE: &str = "space used ÷ bytes written";

/// The writes: `n` random 4 KiB blocks over the whole device.
fn scatter(uri: &str, n: u64) -> Result<()> {
    let mut j = Job::new("randwrite", "4k", 32, 0.0);
    j.number_ios = Some(n);
    j.seed = 41;
    fio::run(&j, &Target::Nbd(uri.to_string()))?;
    Ok(())
}

fn record(ctx: &mut Ctx, target: &str, index: u64, data: u64, used: u64, written: u64) {
    eprintln!(
        "  {target}: data {} MiB, index {} MiB, used {} MiB for {} MiB written",
        data >> 20,
        index >> 20,
        used >> 20,
        written >> 20
    );
    let r = &mut ctx.rec;
    r.add(
        CASE,
        target,
        "data bytes",
        "MiB",
        Better::Lower,
        (data >> 20) as f64,
    );
    r.add(
        CASE,
        target,
        "index bytes",
        "MiB",
        Better::Lower,
        (index >> 20) as f64,
    );
    r.add(
        CASE,
        target,
        INDEX,
        "×",
        Better::Lower,
        index as f64 / data.max(1) as f64,
    );
    r.add(
        CASE,
        target,
        SPACE,
        "×",
        Better::Lower,
        used as f64 / written as f64,
    );
}

/// One qcow2 image with this cluster size, written through qemu-nbd: its
/// (index, data, used) bytes.
fn qcow2(ctx: &Ctx, size: u64, cluster: u64, n: u64) -> Result<(u64, u64, u64)> {
    let dir = ctx.scratch(&format!("index-qcow2-{cluster}"))?;
    let img = dir.join("sparse.qcow2");
    let img_s = path_str(&img);
    qemu_img(&[
        "create",
        "-f",
        "qcow2",
        "-o",
        &format!("cluster_size={cluster}"),
        &img_s,
        &size.to_string(),
    ])?;
    let empty = std::fs::metadata(&img)?.blocks() * 512;
    // qcow2's metadata overlap check scans its cached tables on every
    // allocation: with 4 KiB clusters over 1 TiB it took qemu-nbd's whole
    // core (77% of its samples under perf) and more than 10 minutes for the
    // full run's writes. It checks, it does not change what is stored, so
    // it is off here, as are flushes.
    let (mut server, uri) =
        qemu_nbd_qcow2_opts("qemu-nbd-index", &img, "overlap-check=none", &dir)?;
    scatter(&uri, n)?;
    server.stop();
    let used = (std::fs::metadata(&img)?.blocks() * 512).saturating_sub(empty);
    let check: serde_json::Value =
        serde_json::from_str(&qemu_img(&["check", "--output=json", &img_s])?)
            .context("parsing qemu-img check")?;
    let clusters = check["allocated-clusters"]
        .as_u64()
        .context("qemu-img check gave no allocated-clusters")?;
    let data = clusters * cluster;
    Ok((used.saturating_sub(data), data, used))
}

pub fn run(ctx: &mut Ctx) -> Result<()> {
    // The full run writes 1 GiB over 1 TiB; the quick one 64 MiB over 64 GiB
    // (the same density: one write per 4 MiB on average).
    let (size, n) = if ctx.p.name == "full" {
        (TIB, GIB / 4096)
    } else {
        (64 * GIB, 16_384)
    };
    let written = n * 4096;

    let l = ctx.lamina("index-lamina")?;
    let before = l.used()?;
    l.create_volume("sparse", size)?;
    let uri = l.attach("sparse")?;
    scatter(&uri, n)?;
    l.detach("sparse")?;
    let data = l.volume("sparse")?.allocated_bytes;
    let used = l.used()?.saturating_sub(before);
    record(
        ctx,
        "lamina",
        used.saturating_sub(data),
        data,
        used,
        written,
    );
    drop(l);

    for (target, cluster) in [
        ("qcow2, 64 KiB clusters", 65_536),
        ("qcow2, 4 KiB clusters", 4096),
    ] {
        let (index, data, used) = qcow2(ctx, size, cluster, n)?;
        record(ctx, target, index, data, used, written);
    }

    for anchor in ["qcow2, 64 KiB clusters", "qcow2, 4 KiB clusters"] {
        ctx.rec.compare(
            CASE,
            &format!("{SPACE} vs {anchor}"),
            SPACE,
            "lamina",
            anchor,
            None,
        );
        ctx.rec.compare(
            CASE,
            &format!("{INDEX} vs {anchor}"),
            INDEX,
            "lamina",
            anchor,
            None,
        );
    }
    ctx.rec.goal(
        CASE,
        &format!(
            "{INDEX}, {} random 4 KiB writes over a sparse {} GiB volume",
            n,
            size / GIB
        ),
        "lamina",
        INDEX,
        0.1,
    );
    ctx.rec.note(
        CASE,
        format!(
            "{n} random 4 KiB writes (fio randwrite, QD32, seed 41) over an empty {} GiB volume; \
             Lamina's index is the pool's used bytes gained less the volume's allocated data, \
             qcow2's the image's blocks on disk less its allocated clusters (qemu-img check).",
            size / GIB
        ),
    );
    Ok(())
}
