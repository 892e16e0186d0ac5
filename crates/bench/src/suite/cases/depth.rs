//! Snapshot depth: 4 KiB random reads and writes on a Lamina volume with
//! 0, 10, 100 and 1,000 snapshots, and through qemu-nbd on a qcow2 chain of
//! external overlays of the same depths (as deep as the disk allows). Both
//! start from the same data with every block written; each snapshot (or
//! overlay) comes after rewriting 1% of the blocks at random through NBD.
//! One Lamina volume and one qcow2 chain grow from depth to depth.
//!
//! Writes change what they measure: the first write to a block after a
//! snapshot copies on write, later ones do not. So every write run at a
//! depth above 0 starts right after a fresh snapshot (or overlay), and
//! "depth d" means d to d + rounds; at depth 0 writes go in place on both.

use crate::suite::anchors::{data_file, nbdcopy, Chain};
use crate::suite::fio::{self, Job, Target};
use crate::suite::record::Better;
use crate::suite::{path_str, Ctx};
use anyhow::Result;

const CASE: &str = "depth";
const READ: &str = "4k randread QD32";
const WRITE: &str = "4k randwrite QD32";

/// Rewrite 1% of the blocks at random through NBD.
fn rewrite(uri: &str, blocks: u64, seed: u64) -> Result<()> {
    let mut j = Job::new("randwrite", "4k", 32, 0.0);
    j.number_ios = Some((blocks / 100).max(1));
    j.seed = seed;
    fio::run(&j, &Target::Nbd(uri.to_string()))?;
    Ok(())
}

pub fn run(ctx: &mut Ctx) -> Result<()> {
    let dir = ctx.scratch("depth")?;
    let size = ctx.p.size;
    let blocks = size / 4096;
    let data = dir.join("data.raw");
    data_file(&data, size, 2)?;

    let lamina = ctx.lamina("depth-lamina")?;
    lamina.create_volume("d", size)?;
    let uri = lamina.attach("d")?;
    nbdcopy(&path_str(&data), &uri)?;
    let mut chain = Chain::from_raw(&dir, &data, size)?;
    std::fs::remove_file(&data)?;

    let mut depths: Vec<usize> = ctx
        .p
        .depths
        .iter()
        .chain(&ctx.p.qcow2_depths)
        .cloned()
        .collect();
    depths.sort();
    depths.dedup();
    let mut lamina_depth = 0usize;
    let mut seed = 100u64;
    let job = |rw| Job::new(rw, "4k", 32, ctx.p.seconds);
    let (read_job, write_job) = (job("randread"), job("randwrite"));
    for &d in &depths {
        let on_lamina = ctx.p.depths.contains(&d);
        let on_qcow2 = ctx.p.qcow2_depths.contains(&d);
        // Grow both to depth d, measuring the space each layer costs.
        if on_lamina && lamina_depth < d {
            // A rewrite costs space only when a snapshot holds the blocks it
            // replaces: the very first one (depth 0) writes in place, so it
            // is not a snapshot's cost and is not counted.
            let layers = (lamina_depth..d).filter(|&k| k > 0).count().max(1);
            let before = lamina.used()?;
            while lamina_depth < d {
                seed += 1;
                rewrite(&uri, blocks, seed)?;
                lamina.snapshot("d", &format!("s{lamina_depth}"))?;
                lamina_depth += 1;
            }
            let per_layer = (lamina.used()? - before) as f64 / layers as f64;
            let rewritten = ((blocks / 100).max(1) * 4096) as f64;
            ctx.rec.add(
                CASE,
                &format!("lamina@{d}"),
                "space per snapshot ÷ bytes rewritten",
                "×",
                Better::Lower,
                per_layer / rewritten,
            );
            eprintln!(
                "  lamina at depth {lamina_depth}: {:.2}× the rewritten bytes per snapshot",
                per_layer / rewritten
            );
        }
        if on_qcow2 && chain.depth() < d {
            let (from, layers) = (chain.layers.len(), d - chain.depth());
            while chain.depth() < d {
                chain.push()?;
                let (_s, quri) = chain.serve()?;
                seed += 1;
                rewrite(&quri, blocks, seed)?;
            }
            let per_layer = chain.allocated_from(from)? as f64 / layers as f64;
            let rewritten = ((blocks / 100).max(1) * 4096) as f64;
            ctx.rec.add(
                CASE,
                &format!("qcow2@{d}"),
                "space per snapshot ÷ bytes rewritten",
                "×",
                Better::Lower,
                per_layer / rewritten,
            );
            eprintln!(
                "  qcow2 at depth {}: {:.2}× the rewritten bytes per overlay",
                chain.depth(),
                per_layer / rewritten
            );
        }
        // Each depth's reads start with the volume's data in the page
        // cache, for both: one sequential read of the whole volume. Without
        // it the ratio would measure what the growing pool and qcow2 chain
        // pushed out of the cache, not what snapshots cost
        // (docs/bench-history.md, "Reads 1,000 snapshots deep").
        if on_lamina {
            nbdcopy(&uri, "null:")?;
        }
        if on_qcow2 {
            let (_s, quri) = chain.serve()?;
            nbdcopy(&quri, "null:")?;
        }
        for round in 0..ctx.p.rounds {
            if on_lamina {
                let o = fio::run(&read_job, &Target::Nbd(uri.clone()))?;
                ctx.rec.add(
                    CASE,
                    &format!("lamina@{d}"),
                    READ,
                    "IOPS",
                    Better::Higher,
                    o.iops,
                );
                eprintln!(
                    "  round {round} depth {d:4} lamina read  {:>8.0} IOPS",
                    o.iops
                );
            }
            if on_qcow2 {
                let (_s, quri) = chain.serve()?;
                let o = fio::run(&read_job, &Target::Nbd(quri))?;
                ctx.rec.add(
                    CASE,
                    &format!("qcow2@{d}"),
                    READ,
                    "IOPS",
                    Better::Higher,
                    o.iops,
                );
                eprintln!(
                    "  round {round} depth {d:4} qcow2  read  {:>8.0} IOPS",
                    o.iops
                );
            }
            if on_lamina {
                if d > 0 {
                    lamina.snapshot("d", &format!("w{d}-{round}"))?;
                    lamina_depth += 1;
                }
                let o = fio::run(&write_job, &Target::Nbd(uri.clone()))?;
                ctx.rec.add(
                    CASE,
                    &format!("lamina@{d}"),
                    WRITE,
                    "IOPS",
                    Better::Higher,
                    o.iops,
                );
                eprintln!(
                    "  round {round} depth {d:4} lamina write {:>8.0} IOPS",
                    o.iops
                );
            }
            if on_qcow2 {
                if d > 0 {
                    chain.push()?;
                }
                let (_s, quri) = chain.serve()?;
                let o = fio::run(&write_job, &Target::Nbd(quri))?;
                ctx.rec.add(
                    CASE,
                    &format!("qcow2@{d}"),
                    WRITE,
                    "IOPS",
                    Better::Higher,
                    o.iops,
                );
                eprintln!(
                    "  round {round} depth {d:4} qcow2  write {:>8.0} IOPS",
                    o.iops
                );
            }
        }
    }
    relative_to_depth_0(ctx, &depths);
    let deepest_qcow2 = ctx.p.qcow2_depths.iter().max().cloned().unwrap_or(0);
    let deepest = ctx.p.depths.iter().max().cloned().unwrap_or(0);
    ctx.rec.note(
        CASE,
        format!(
            "{} MiB volume; every snapshot (Lamina) or overlay (qcow2, 64 KiB clusters, served by qemu-nbd) follows a rewrite of 1% \
             of the blocks at random through fio's nbd engine. Each write run at a depth above 0 starts right after a fresh snapshot \
             or overlay, so it pays the first-write copy; at depth 0 both write in place. Before each depth's reads, one \
             sequential read of the whole volume (nbdcopy to null:) puts its data in the page cache, for both.",
            size >> 20
        ),
    );
    if deepest > deepest_qcow2 {
        ctx.rec.note(
            CASE,
            format!(
                "qcow2 stops at depth {deepest_qcow2} in this profile: each overlay costs the space shown above (a whole 64 KiB \
                 cluster for each 4 KiB rewritten), so {deepest} overlays of this volume would take about {:.0} GiB of disk and \
                 as long to write.",
                deepest as f64 * (blocks / 100) as f64 * 65536.0 / (1u64 << 30) as f64
            ),
        );
    }
    Ok(())
}

/// Throughput at each depth divided by depth 0's, round by round, and
/// Lamina's ratio against qcow2's.
fn relative_to_depth_0(ctx: &mut Ctx, depths: &[usize]) {
    for sys in ["lamina", "qcow2"] {
        for metric in [READ, WRITE] {
            let Some(base) = ctx
                .rec
                .get(CASE, &format!("{sys}@0"), metric)
                .map(|r| r.values.clone())
            else {
                continue;
            };
            for &d in depths.iter().filter(|d| **d > 0) {
                let Some(at) = ctx
                    .rec
                    .get(CASE, &format!("{sys}@{d}"), metric)
                    .map(|r| r.values.clone())
                else {
                    continue;
                };
                let name = format!("{metric} at depth {d} ÷ depth 0");
                for (a, b) in at.iter().zip(&base) {
                    ctx.rec.add(CASE, sys, &name, "×", Better::Higher, a / b);
                }
            }
        }
    }
    for metric in [READ, WRITE] {
        for &d in depths {
            ctx.rec.compare(
                CASE,
                &format!("{metric} at depth {d}, vs qcow2"),
                metric,
                &format!("lamina@{d}"),
                &format!("qcow2@{d}"),
                None,
            );
            if d > 0 {
                let name = format!("{metric} at depth {d} ÷ depth 0");
                ctx.rec.compare(
                    CASE,
                    &format!("{name}, vs qcow2's"),
                    &name,
                    "lamina",
                    "qcow2",
                    None,
                );
            }
        }
        if let Some(&deepest) = ctx.p.depths.iter().max() {
            if deepest > 0 {
                ctx.rec.goal(
                    CASE,
                    &format!("{metric} at depth {deepest} ÷ depth 0"),
                    "lamina",
                    &format!("{metric} at depth {deepest} ÷ depth 0"),
                    0.95,
                );
            }
        }
    }
    for &d in depths.iter().filter(|d| **d > 0) {
        let m = "space per snapshot ÷ bytes rewritten";
        ctx.rec.compare(
            CASE,
            &format!("space per snapshot at depth {d}, vs qcow2"),
            m,
            &format!("lamina@{d}"),
            &format!("qcow2@{d}"),
            None,
        );
    }
    if let Some(&d) = ctx.p.depths.iter().filter(|d| **d > 0).max() {
        ctx.rec.goal(
            CASE,
            &format!("space per snapshot ÷ bytes rewritten (depth {d})"),
            &format!("lamina@{d}"),
            "space per snapshot ÷ bytes rewritten",
            1.05,
        );
    }
}
