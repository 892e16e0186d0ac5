//! Snapshot delete: a chain of snapshots where two in the middle each hold
//! a whole volume of data of their own. One is deleted with nothing else
//! running (time to answer, time until its space is back, bytes written);
//! the other under a 4 KiB random-write load, whose p99 is compared with
//! the same load just before without a delete. The qcow2 equivalent is the
//! same chain of overlays in qemu-storage-daemon and `block-commit` of the
//! middle layer into the one below it.

use crate::suite::anchors::{data_file, nbdcopy, Chain};
use crate::suite::fio::{self, Job, Target};
use crate::suite::proc;
use crate::suite::qmp::Qsd;
use crate::suite::record::Better;
use crate::suite::{path_str, Ctx, MIB};
use anyhow::{bail, Context, Result};
use std::time::{Duration, Instant};

const CASE: &str = "delete";

/// What to write before snapshot `i`: the whole volume for the heavy
/// layers and the one after each (so the heavy one keeps all of its data
/// to itself), 1 MiB of random 4 KiB writes for the others.
fn rewrite(uri: &str, size: u64, heavy: bool, seed: u64) -> Result<()> {
    let mut j = if heavy {
        Job::new("write", "1m", 8, 0.0)
    } else {
        Job::new("randwrite", "4k", 32, 0.0)
    };
    j.number_ios = Some(if heavy { size / MIB } else { 256 });
    j.seed = seed;
    fio::run(&j, &Target::Nbd(uri.to_string()))?;
    Ok(())
}

fn load(seconds: f64) -> Job {
    let mut j = Job::new("randwrite", "4k", 32, seconds);
    j.seed = 21;
    j
}

pub fn run(ctx: &mut Ctx) -> Result<()> {
    let size = ctx.p.delete_bytes;
    let chain_len = ctx.p.delete_chain;
    let (a, b) = (chain_len / 3, 2 * chain_len / 3);
    let heavy = |i: usize| i == a || i == a + 1 || i == b || i == b + 1;
    let secs = ctx.p.seconds.max(3.0);
    let dir = ctx.scratch("delete")?;
    let data = dir.join("data.raw");
    data_file(&data, size, 3)?;

    // Lamina: the chain through the API and NBD.
    let l = ctx.lamina("delete-lamina")?;
    l.create_volume("v", size)?;
    let uri = l.attach("v")?;
    nbdcopy(&path_str(&data), &uri)?;
    for i in 0..chain_len {
        rewrite(&uri, size, heavy(i), 1000 + i as u64)?;
        l.snapshot("v", &format!("s{i}"))?;
    }
    proc::sync_disks();
    let (w0, u0) = (l.written(), l.used()?);
    let t = Instant::now();
    let answer = l.delete_snapshot("v", &format!("s{a}"))?;
    let back = l.reclaimed(t)?;
    let (w1, u1) = (l.written(), l.used()?);
    let freed = u0.saturating_sub(u1);
    let written = w1 - w0;
    eprintln!(
        "  lamina: answer {:.2} ms, reclaimed in {:.0} ms, freed {} MiB, wrote {:.2} MiB",
        answer.as_secs_f64() * 1e3,
        back.as_secs_f64() * 1e3,
        freed >> 20,
        written as f64 / MIB as f64
    );
    ctx.rec.add(
        CASE,
        "lamina",
        "delete: time to answer",
        "ms",
        Better::Lower,
        answer.as_secs_f64() * 1e3,
    );
    ctx.rec.add(
        CASE,
        "lamina",
        "delete: time until the space is free",
        "ms",
        Better::Lower,
        back.as_secs_f64() * 1e3,
    );
    ctx.rec.add(
        CASE,
        "lamina",
        "delete: bytes written",
        "MiB",
        Better::Lower,
        written as f64 / MIB as f64,
    );
    ctx.rec.add(
        CASE,
        "lamina",
        "delete: bytes freed",
        "MiB",
        Better::Higher,
        freed as f64 / MIB as f64,
    );
    ctx.rec.add(
        CASE,
        "lamina",
        "delete: bytes written ÷ the snapshot's own data",
        "×",
        Better::Lower,
        written as f64 / size as f64,
    );
    if freed < size * 9 / 10 {
        bail!(
            "deleting a snapshot holding {} MiB of its own freed only {} MiB",
            size >> 20,
            freed >> 20
        );
    }
    let base = fio::run(&load(secs), &Target::Nbd(uri.clone()))?;
    let run = fio::spawn(&load(secs), &Target::Nbd(uri.clone()))?;
    std::thread::sleep(Duration::from_secs(1));
    let t = Instant::now();
    let loaded_answer = l.delete_snapshot("v", &format!("s{b}"))?;
    let with = run.wait()?;
    let loaded_back = l.reclaimed(t)?;
    record_load(ctx, "lamina", &base, &with);
    ctx.rec.add(
        CASE,
        "lamina",
        "delete under load: time to answer",
        "ms",
        Better::Lower,
        loaded_answer.as_secs_f64() * 1e3,
    );
    ctx.rec.add(
        CASE,
        "lamina",
        "delete under load: time until the space is free",
        "ms",
        Better::Lower,
        loaded_back.as_secs_f64() * 1e3,
    );
    drop(l);

    // qcow2: the same chain of overlays, then block-commit in QSD.
    let qdir = ctx.scratch("delete-qcow2")?;
    let mut chain = Chain::from_raw(&qdir, &data, size)?;
    std::fs::remove_file(&data)?;
    for i in 0..chain_len {
        // Overlay i+1 takes the writes that follow snapshot i, as Lamina's
        // volume does: layer i+1 (1-based) is the qcow2 form of snapshot i.
        chain.push()?;
        let (_s, quri) = chain.serve()?;
        rewrite(&quri, size, heavy(i), 1000 + i as u64)?;
    }
    chain.push()?;
    let mut q = Qsd::start("qsd-delete", chain.top(), &qdir)?;
    let node_of = |q: &mut Qsd, layer: usize, chain: &Chain| -> Result<String> {
        let file = path_str(&chain.layers[layer]);
        q.qcow2_nodes()?
            .into_iter()
            .find(|(_, f)| *f == file)
            .map(|(n, _)| n)
            .with_context(|| format!("no node for {file}"))
    };
    // Snapshot s_i's own writes are in layer i+1; committing it into
    // layer i removes it from the chain.
    let (top_a, base_a) = (node_of(&mut q, a + 1, &chain)?, node_of(&mut q, a, &chain)?);
    proc::sync_disks();
    let w0 = proc::written(q.server.pid());
    let took = q.commit(&top_a, &base_a)?;
    let written = proc::written(q.server.pid()) - w0;
    eprintln!(
        "  qcow2 block-commit: {:.0} ms, wrote {:.2} MiB",
        took.as_secs_f64() * 1e3,
        written as f64 / MIB as f64
    );
    let t = "qsd block-commit";
    let ms = took.as_secs_f64() * 1e3;
    ctx.rec
        .add(CASE, t, "delete: time to answer", "ms", Better::Lower, ms);
    ctx.rec.add(
        CASE,
        t,
        "delete: time until the space is free",
        "ms",
        Better::Lower,
        ms,
    );
    ctx.rec.add(
        CASE,
        t,
        "delete: bytes written",
        "MiB",
        Better::Lower,
        written as f64 / MIB as f64,
    );
    ctx.rec.add(
        CASE,
        t,
        "delete: bytes written ÷ the snapshot's own data",
        "×",
        Better::Lower,
        written as f64 / size as f64,
    );
    let (top_b, base_b) = (node_of(&mut q, b + 1, &chain)?, node_of(&mut q, b, &chain)?);
    let base = fio::run(&load(secs), &Target::Nbd(q.uri.clone()))?;
    let run = fio::spawn(&load(secs), &Target::Nbd(q.uri.clone()))?;
    std::thread::sleep(Duration::from_secs(1));
    let took = q.commit(&top_b, &base_b)?;
    let with = run.wait()?;
    record_load(ctx, t, &base, &with);
    ctx.rec.add(
        CASE,
        t,
        "delete under load: time to answer",
        "ms",
        Better::Lower,
        took.as_secs_f64() * 1e3,
    );
    ctx.rec.add(
        CASE,
        t,
        "delete under load: time until the space is free",
        "ms",
        Better::Lower,
        took.as_secs_f64() * 1e3,
    );

    for m in [
        "delete: time to answer",
        "delete: time until the space is free",
        "delete: bytes written",
        "delete under load: time to answer",
        "write p99 during the delete ÷ without",
        "write IOPS during the delete ÷ without",
    ] {
        ctx.rec
            .compare(CASE, &format!("{m}, vs block-commit"), m, "lamina", t, None);
    }
    ctx.rec.goal(
        CASE,
        "write p99 during a delete ÷ without",
        "lamina",
        "write p99 during the delete ÷ without",
        2.0,
    );
    ctx.rec.goal(
        CASE,
        "bytes written by a delete ÷ the snapshot's own data (no data copied)",
        "lamina",
        "delete: bytes written ÷ the snapshot's own data",
        0.05,
    );
    ctx.rec.note(
        CASE,
        format!(
            "A {} MiB volume and {chain_len} snapshots; snapshots {a} and {b} each hold the whole volume's data alone (it was \
             rewritten before and after each), the others 1 MiB of 4 KiB writes. Snapshot {a} is deleted idle: \"bytes written\" is \
             what the daemon (or qemu-storage-daemon) made the disk write, from /proc/PID/io write_bytes, until the pool's used \
             bytes and its files' blocks on disk stopped falling (\"time until the space is free\" is that moment); for qcow2 it is block-commit of that layer into the one below. Snapshot {b} is deleted 1 s into \
             a {secs} s fio randwrite QD32 load, compared with the same load run just before. One round: each delete consumes its \
             snapshot.",
            size >> 20
        ),
    );
    Ok(())
}

fn record_load(ctx: &mut Ctx, target: &str, base: &fio::Outcome, with: &fio::Outcome) {
    eprintln!(
        "  {target} under load: p99 {:.0} µs without, {:.0} µs with the delete; IOPS {:.0} / {:.0}",
        base.p99_us, with.p99_us, base.iops, with.iops
    );
    ctx.rec.add(
        CASE,
        target,
        "write p99 without a delete",
        "µs",
        Better::Lower,
        base.p99_us,
    );
    ctx.rec.add(
        CASE,
        target,
        "write p99 during the delete",
        "µs",
        Better::Lower,
        with.p99_us,
    );
    ctx.rec.add(
        CASE,
        target,
        "write p99 during the delete ÷ without",
        "×",
        Better::Lower,
        with.p99_us / base.p99_us,
    );
    ctx.rec.add(
        CASE,
        target,
        "write IOPS during the delete ÷ without",
        "×",
        Better::Higher,
        with.iops / base.iops,
    );
}
