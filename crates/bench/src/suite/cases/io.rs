//! The I/O path: fio through the nbd engine against a Lamina volume,
//! qemu-nbd serving a raw file and a qcow2 file, and nbdkit's file plugin;
//! and fio straight on a file with O_DIRECT, the disk's own limit; and a
//! second Lamina daemon with per-volume I/O metrics off, which prices them
//! (`--volume-io-metrics off`; the first has them on, the default). All hold
//! the same data, every block written; each round runs every job against
//! every target before the next round starts.

use crate::suite::anchors::{data_file, nbdcopy, nbdkit_file, qcow2_from_raw, qemu_nbd};
use crate::suite::fio::{self, Job, Target};
use crate::suite::record::Better;
use crate::suite::{path_str, Ctx};
use anyhow::Result;

const CASE: &str = "io";
const BARE: &str = "lamina, no I/O metrics";
/// `--baseline`: the same volume served by another build's binary.
const BASELINE: &str = "lamina, baseline build";

pub fn jobs(seconds: f64) -> Vec<(&'static str, Job)> {
    vec![
        ("4k randread QD1", Job::new("randread", "4k", 1, seconds)),
        ("4k randread QD32", Job::new("randread", "4k", 32, seconds)),
        ("4k randwrite QD1", Job::new("randwrite", "4k", 1, seconds)),
        (
            "4k randwrite QD32",
            Job::new("randwrite", "4k", 32, seconds),
        ),
        ("1M read QD8", Job::new("read", "1m", 8, seconds)),
        ("1M write QD8", Job::new("write", "1m", 8, seconds)),
    ]
}

/// Record one fio outcome: throughput (IOPS for 4 KiB, MB/s for 1 MiB) and
/// p99 completion latency.
pub fn record(ctx: &mut Ctx, case: &str, target: &str, label: &str, bs: &str, o: &fio::Outcome) {
    if bs == "4k" {
        ctx.rec
            .add(case, target, label, "IOPS", Better::Higher, o.iops);
    } else {
        ctx.rec
            .add(case, target, label, "MB/s", Better::Higher, o.mb_per_s);
    }
    ctx.rec.add(
        case,
        target,
        &format!("{label} p99"),
        "µs",
        Better::Lower,
        o.p99_us,
    );
}

/// Every job against every target, `ctx.p.rounds` times, each outcome
/// printed and recorded under `case`.
pub fn rounds(
    ctx: &mut Ctx,
    case: &str,
    targets: &[(&str, Target)],
    jobs: &[(&'static str, Job)],
) -> Result<()> {
    for round in 0..ctx.p.rounds {
        for (label, job) in jobs {
            // Rotate who goes first, so no target always runs on a warm or
            // a cold machine.
            for i in 0..targets.len() {
                let (name, t) = &targets[(i + round) % targets.len()];
                let o = fio::run(job, t)?;
                eprintln!(
                    "  round {round} {label:18} {name:34} {:>9.0} IOPS {:>7.0} MB/s p99 {:>7.0} µs",
                    o.iops, o.mb_per_s, o.p99_us
                );
                record(ctx, case, name, label, job.bs, &o);
            }
        }
    }
    Ok(())
}

pub fn run(ctx: &mut Ctx) -> Result<()> {
    let dir = ctx.scratch("io")?;
    let size = ctx.p.size;
    let data = dir.join("data.raw");
    data_file(&data, size, 1)?;
    let raw = dir.join("qemu.raw");
    let kit = dir.join("nbdkit.raw");
    let direct = dir.join("direct.raw");
    let qcow2 = dir.join("qemu.qcow2");
    for f in [&raw, &kit, &direct] {
        std::fs::copy(&data, f)?;
    }
    qcow2_from_raw(&path_str(&data), &path_str(&qcow2))?;

    let lamina = ctx.lamina("io-lamina")?;
    lamina.create_volume("io", size)?;
    let lamina_uri = lamina.attach("io")?;
    nbdcopy(&path_str(&data), &lamina_uri)?;
    let bare = ctx.lamina_with("io-lamina-bare", &["--volume-io-metrics", "off"])?;
    bare.create_volume("io", size)?;
    let bare_uri = bare.attach("io")?;
    nbdcopy(&path_str(&data), &bare_uri)?;
    let baseline = match ctx.baseline_bin.clone() {
        Some(bin) => {
            let b = ctx.lamina_of(&bin, "io-lamina-baseline")?;
            b.create_volume("io", size)?;
            let uri = b.attach("io")?;
            nbdcopy(&path_str(&data), &uri)?;
            Some((b, uri))
        }
        None => None,
    };
    std::fs::remove_file(&data)?;

    let (_q1, raw_uri) = qemu_nbd("qemu-nbd-raw", &raw, "raw", &dir)?;
    let (_q2, qcow2_uri) = qemu_nbd("qemu-nbd-qcow2", &qcow2, "qcow2", &dir)?;
    let (_k, kit_uri) = nbdkit_file("nbdkit-file", &kit, &dir)?;
    let mut targets = vec![
        ("lamina", Target::Nbd(lamina_uri)),
        (BARE, Target::Nbd(bare_uri)),
        ("nbdkit file", Target::Nbd(kit_uri)),
        ("qemu-nbd raw", Target::Nbd(raw_uri)),
        ("qemu-nbd qcow2", Target::Nbd(qcow2_uri)),
        ("file O_DIRECT", Target::File(direct.clone(), size)),
    ];
    if let Some((_, uri)) = &baseline {
        targets.push((BASELINE, Target::Nbd(uri.clone())));
    }
    let jobs = jobs(ctx.p.seconds);
    rounds(ctx, CASE, &targets, &jobs)?;
    for (label, _) in &jobs {
        // targets.md and issue 14: 4 KiB random reads and writes at least
        // match nbdkit's file plugin, and random writes reach 0.8× of fio
        // with O_DIRECT on the same disk.
        let goal = label.starts_with("4k rand").then_some(1.0);
        let direct_goal = label.starts_with("4k randwrite").then_some(0.8);
        ctx.rec.compare(
            CASE,
            &format!("{label} vs nbdkit file"),
            label,
            "lamina",
            "nbdkit file",
            goal,
        );
        ctx.rec.compare(
            CASE,
            &format!("{label} vs qemu-nbd raw"),
            label,
            "lamina",
            "qemu-nbd raw",
            None,
        );
        ctx.rec.compare(
            CASE,
            &format!("{label} vs qemu-nbd qcow2"),
            label,
            "lamina",
            "qemu-nbd qcow2",
            None,
        );
        ctx.rec.compare(
            CASE,
            &format!("{label} vs the file, O_DIRECT"),
            label,
            "lamina",
            "file O_DIRECT",
            direct_goal,
        );
        ctx.rec.compare(
            CASE,
            &format!("{label}: I/O metrics on vs off (their cost)"),
            label,
            "lamina",
            BARE,
            None,
        );
        if let Some(bin) = &ctx.baseline_bin {
            ctx.rec.compare(
                CASE,
                &format!("{label}: this build vs the baseline ({})", bin.display()),
                label,
                "lamina",
                BASELINE,
                None,
            );
        }
        let p99 = format!("{label} p99");
        ctx.rec.compare(
            CASE,
            &format!("{p99} latency vs nbdkit file"),
            &p99,
            "lamina",
            "nbdkit file",
            None,
        );
    }
    ctx.rec.note(
        CASE,
        format!(
            "{} MiB of random data in each target, every block written; fio's nbd engine over a unix socket, one connection; \
             the file O_DIRECT row is fio with io_uring on a copy of the same file, the disk's own limit.",
            size >> 20
        ),
    );
    Ok(())
}
