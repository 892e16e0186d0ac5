//! Clones. A linked clone: how soon a clone of a large volume holding data
//! is usable (created, attached, its first 4 KiB read over NBD), against a
//! snapshot of the same volume and against what a qcow2 user does (a new
//! overlay on the image, served by qemu-nbd). A full clone: its time, the
//! bytes it writes, and what it costs reads on the source meanwhile,
//! against nbdcopy between two raw qemu-nbd exports holding the same data.

use crate::suite::anchors::{
    data_file, nbdcopy_with, qcow2_from_raw, qemu_img, qemu_nbd, qemu_nbd_command,
};
use crate::suite::cases::io;
use crate::suite::fio::{self, Job, Target};
use crate::suite::lamina::Lamina;
use crate::suite::nbd_client::Nbd;
use crate::suite::proc::{self, Server};
use crate::suite::record::Better;
use crate::suite::{path_str, Ctx, MIB};
use anyhow::{bail, ensure, Context, Result};
use lamina_api::Operation;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

const CASE: &str = "clone";
const LAMINA: &str = "lamina";
const SNAPSHOT: &str = "lamina snapshot";
const FROM_VOLUME: &str = "lamina, clone of the live volume";
const QCOW2: &str = "qcow2 overlay + qemu-nbd";
const NBDCOPY: &str = "nbdcopy raw→raw";

const CREATE: &str = "linked clone: create call";
const ATTACH: &str = "linked clone: attach (serve)";
const FIRST_READ: &str = "linked clone: first 4 KiB read";
const USABLE: &str = "linked clone: usable after";

const FULL_TIME: &str = "full clone: time";
const FULL_RATE: &str = "full clone: rate (allocated bytes / time)";
const FULL_BYTES: &str = "full clone: bytes written";
const FULL_AMP: &str = "full clone: bytes written ÷ allocated";
const READ_ALONE: &str = "4k randread QD32 on the source, alone";
const READ_DURING: &str = "4k randread QD32 on the source, during a full clone";
const READ_KEPT: &str = "source read IOPS during a full clone ÷ alone";
const FULL_LOADED: &str = "full clone: rate while fio reads the source (bytes written / time)";

/// nbdcopy as a user copying onto a new, empty file would run it, and as
/// durable at the end as Lamina's full clone (which flushes the copy).
const NBDCOPY_OPTS: &[&str] = &["--destination-is-zero", "--flush"];

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The four times of one linked clone, in ms: create, attach, first read,
/// and all three end to end.
struct Linked {
    create: f64,
    attach: f64,
    read: f64,
    usable: f64,
}

impl Linked {
    fn record(&self, ctx: &mut Ctx, target: &str) {
        for (metric, v) in [
            (CREATE, self.create),
            (ATTACH, self.attach),
            (FIRST_READ, self.read),
            (USABLE, self.usable),
        ] {
            ctx.rec.add(CASE, target, metric, "ms", Better::Lower, v);
        }
    }
}

fn check_first(got: &[u8], want: &[u8], what: &str) -> Result<()> {
    ensure!(
        got == want,
        "the first 4 KiB read through {what} differ from the source's"
    );
    Ok(())
}

/// Lamina: clone the snapshot `src/base`, attach the clone, read its first
/// 4 KiB; then detach and delete it (not timed).
fn linked_lamina(l: &Lamina, i: usize, size: u64, first: &[u8]) -> Result<Linked> {
    let name = format!("linked{i}");
    let t = Instant::now();
    l.clone_snapshot(&name, "src", "base", false)
        .context("linked clone of src/base")?;
    let created = t.elapsed();
    let uri = l.attach(&name)?;
    let attached = t.elapsed();
    let mut buf = vec![0u8; 4096];
    let mut c = Nbd::connect(&uri)?;
    c.read(0, &mut buf)?;
    let usable = t.elapsed();
    check_first(&buf, first, "a Lamina linked clone")?;
    ensure!(
        c.size == size,
        "the clone's export is {} bytes, not {size}",
        c.size
    );
    drop(c);
    l.detach(&name)?;
    l.delete_volume(&name, false)?;
    Ok(Linked {
        create: ms(created),
        attach: ms(attached - created),
        read: ms(usable - attached),
        usable: ms(usable),
    })
}

/// A child process killed and reaped when dropped.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// qcow2: `qemu-img create -b base.qcow2` a new overlay, serve it with
/// qemu-nbd (timed until its socket accepts a connection), read its first
/// 4 KiB over that connection; then stop qemu-nbd and remove the overlay.
fn linked_qcow2(dir: &Path, logs: &Path, base: &Path, size: u64, first: &[u8]) -> Result<Linked> {
    let overlay = dir.join("overlay.qcow2");
    let sock = dir.join("overlay.sock");
    let _ = std::fs::remove_file(&overlay);
    let _ = std::fs::remove_file(&sock);
    let log_path = logs.join("qemu-nbd-overlay.log");
    let log = std::fs::File::create(&log_path)?;
    let t = Instant::now();
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        &path_str(base),
        "-F",
        "qcow2",
        &path_str(&overlay),
    ])?;
    let created = t.elapsed();
    let mut child = Reaped(
        qemu_nbd_command(&overlay, "qcow2", &sock)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting qemu-nbd on the overlay")?,
    );
    // Poll for the socket every millisecond: the time it takes to serve is
    // what is measured here.
    let stream = loop {
        if let Ok(s) = UnixStream::connect(&sock) {
            break s;
        }
        if let Some(st) = child.0.try_wait()? {
            bail!(
                "qemu-nbd on the overlay exited with {st}: {}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
        }
        if t.elapsed() > Duration::from_secs(30) {
            bail!("qemu-nbd on the overlay did not listen in 30 s");
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let attached = t.elapsed();
    let mut buf = vec![0u8; 4096];
    let mut c = Nbd::handshake(stream, "disk")?;
    c.read(0, &mut buf)?;
    let usable = t.elapsed();
    check_first(&buf, first, "a qcow2 overlay")?;
    ensure!(
        c.size == size,
        "the overlay's export is {} bytes, not {size}",
        c.size
    );
    drop(c);
    drop(child);
    std::fs::remove_file(&overlay)?;
    Ok(Linked {
        create: ms(created),
        attach: ms(attached - created),
        read: ms(usable - attached),
        usable: ms(usable),
    })
}

/// A full clone of `src/base` named `name`: started, then waited for. Its
/// time, the daemon's bytes written meanwhile, and the operation's answer.
fn full_lamina(l: &Lamina, name: &str) -> Result<(Duration, u64, Operation)> {
    let w0 = l.written();
    let t = Instant::now();
    let id = start_full_lamina(l, name)?;
    let op = l.wait_operation(&id, Duration::from_millis(5))?;
    let took = t.elapsed();
    Ok((took, l.written().saturating_sub(w0), op))
}

fn start_full_lamina(l: &Lamina, name: &str) -> Result<String> {
    let a = l
        .clone_snapshot(name, "src", "base", true)
        .context("full clone of src/base")?;
    a.operation
        .map(|o| o.id)
        .with_context(|| format!("no operation in the answer to a full clone of {name}"))
}

/// An empty sparse raw file of `size` served by qemu-nbd: nbdcopy's
/// destination.
fn empty_raw(dir: &Path, name: &str, size: u64) -> Result<(Server, String, PathBuf)> {
    let f = dir.join(format!("{name}.raw"));
    let _ = std::fs::remove_file(&f);
    std::fs::File::create(&f)?.set_len(size)?;
    let (s, uri) = qemu_nbd(&format!("qemu-nbd-{name}"), &f, "raw", dir)?;
    Ok((s, uri, f))
}

/// nbdcopy from the source export to a new empty one: its time and the
/// destination qemu-nbd's bytes written.
fn full_nbdcopy(dir: &Path, size: u64, src_uri: &str) -> Result<(Duration, u64)> {
    let (dst, dst_uri, f) = empty_raw(dir, "dst", size)?;
    let w0 = proc::written(dst.pid());
    let t = Instant::now();
    nbdcopy_with(NBDCOPY_OPTS, src_uri, &dst_uri)?;
    let took = t.elapsed();
    let w = proc::written(dst.pid()).saturating_sub(w0);
    drop(dst);
    std::fs::remove_file(f)?;
    Ok((took, w))
}

fn record_full(ctx: &mut Ctx, target: &str, took: Duration, written: u64) {
    let alloc = ctx.p.clone_allocated as f64;
    let s = took.as_secs_f64();
    let r = &mut ctx.rec;
    r.add(CASE, target, FULL_TIME, "s", Better::Lower, s);
    r.add(
        CASE,
        target,
        FULL_RATE,
        "MB/s",
        Better::Higher,
        alloc / s / 1e6,
    );
    r.add(
        CASE,
        target,
        FULL_BYTES,
        "MiB",
        Better::Lower,
        written as f64 / MIB as f64,
    );
    r.add(
        CASE,
        target,
        FULL_AMP,
        "×",
        Better::Lower,
        written as f64 / alloc,
    );
}

/// The read load on the source: 4 KiB random reads over its allocated part.
fn read_job(seconds: f64, allocated: u64) -> Job {
    let mut j = Job::new("randread", "4k", 32, seconds);
    j.size = Some(allocated);
    j.seed = 7;
    j
}

/// What happened while fio read the source with copies running.
struct Loaded {
    reads: fio::Outcome,
    /// Copies started (the last one ends after fio does).
    copies: usize,
    /// Bytes the copier wrote from the first copy's start to fio's end.
    written: u64,
    window: Duration,
}

/// Run `job` on `target` while `copy` runs back to back until fio ends;
/// `written` is the copier's count of bytes written, read again the moment
/// fio ends.
fn under_reads(
    job: &Job,
    target: &Target,
    written: impl Fn() -> u64 + Sync,
    mut copy: impl FnMut(usize) -> Result<()>,
) -> Result<Loaded> {
    let w0 = written();
    let t = Instant::now();
    let mut copies = 0;
    let (reads, w, window) = std::thread::scope(|s| -> Result<_> {
        let reads = s.spawn(|| {
            let o = fio::run(job, target);
            (o, written(), t.elapsed())
        });
        while !reads.is_finished() {
            copies += 1;
            copy(copies - 1)?;
        }
        let (o, w, window) = reads
            .join()
            .map_err(|_| anyhow::anyhow!("the fio thread panicked"))?;
        Ok((o?, w, window))
    })?;
    Ok(Loaded {
        reads,
        copies,
        written: w.saturating_sub(w0),
        window,
    })
}

fn record_reads(ctx: &mut Ctx, target: &str, alone: &fio::Outcome, loaded: &Loaded) {
    io::record(ctx, CASE, target, READ_ALONE, "4k", alone);
    io::record(ctx, CASE, target, READ_DURING, "4k", &loaded.reads);
    let r = &mut ctx.rec;
    r.add(
        CASE,
        target,
        READ_KEPT,
        "×",
        Better::Higher,
        loaded.reads.iops / alone.iops,
    );
    r.add(
        CASE,
        target,
        FULL_LOADED,
        "MB/s",
        Better::Higher,
        loaded.written as f64 / loaded.window.as_secs_f64() / 1e6,
    );
}

/// fio's read job on the Lamina source while full clones of `src/base` run
/// back to back, each into a new volume (deleted after).
fn lamina_under_reads(l: &Lamina, job: &Job, uri: &str, round: usize) -> Result<Loaded> {
    let pid = l.pid();
    let mut names = Vec::new();
    let loaded = under_reads(
        job,
        &Target::Nbd(uri.to_string()),
        || proc::written(pid),
        |i| {
            let name = format!("loaded{round}-{i}");
            let id = start_full_lamina(l, &name)?;
            names.push(name);
            l.wait_operation(&id, Duration::from_millis(5))?;
            Ok(())
        },
    )?;
    for n in &names {
        l.delete_volume(n, false)?;
    }
    Ok(loaded)
}

/// The same with nbdcopy from the source qemu-nbd to a qemu-nbd on a new
/// empty file (copied over again if fio outlasts a copy).
fn nbdcopy_under_reads(dir: &Path, size: u64, job: &Job, src_uri: &str) -> Result<Loaded> {
    let (dst, dst_uri, f) = empty_raw(dir, "loaded", size)?;
    let pid = dst.pid();
    let loaded = under_reads(
        job,
        &Target::Nbd(src_uri.to_string()),
        || proc::written(pid),
        |_| nbdcopy_with(NBDCOPY_OPTS, src_uri, &dst_uri),
    )?;
    drop(dst);
    std::fs::remove_file(f)?;
    Ok(loaded)
}

pub fn run(ctx: &mut Ctx) -> Result<()> {
    let size = ctx.p.clone_size;
    let allocated = ctx.p.clone_allocated;
    let rounds = ctx.p.rounds;
    let samples = (rounds * 5).max(10);
    let dir = ctx.scratch("clone")?;
    let logs = ctx.logs.clone();

    // The same data everywhere: `allocated` bytes of random data at the
    // start of a sparse raw file of `size`.
    let src = dir.join("src.raw");
    data_file(&src, allocated, 3)?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&src)?
        .set_len(size)?;
    let mut first = vec![0u8; 4096];
    std::fs::File::open(&src)?.read_exact(&mut first)?;
    let base = dir.join("base.qcow2");
    qcow2_from_raw(&path_str(&src), &path_str(&base))?;

    let l = ctx.lamina("clone-lamina")?;
    l.create_volume("src", size)?;
    let src_lamina = l.attach("src")?;
    nbdcopy_with(&["--destination-is-zero"], &path_str(&src), &src_lamina)
        .context("filling the Lamina volume")?;
    l.snapshot("src", "base")?;
    let mapped = l.snapshot_info("src", "base")?.allocated_bytes;
    if mapped.abs_diff(allocated) > allocated / 20 {
        ctx.rec.note(
            CASE,
            format!(
                "the Lamina source snapshot maps {} MiB, not the {} MiB written into it.",
                mapped >> 20,
                allocated >> 20
            ),
        );
    }

    // (a) Linked clones, against a snapshot and against a qcow2 overlay;
    // one of each per sample, who goes first alternating.
    eprintln!("  linked clones, {samples} samples");
    for i in 0..samples {
        for k in 0..2 {
            if (i + k) % 2 == 0 {
                let snap = l.snapshot("src", &format!("sample{i}"))?;
                ctx.rec
                    .add(CASE, SNAPSHOT, CREATE, "ms", Better::Lower, ms(snap));
                l.delete_snapshot("src", &format!("sample{i}"))?;
                let lc = linked_lamina(&l, i, size, &first)?;
                lc.record(ctx, LAMINA);
                let name = format!("live{i}");
                let t = Instant::now();
                l.clone_volume(&name, "src", false)
                    .context("linked clone of the live volume")?;
                let d = t.elapsed();
                ctx.rec
                    .add(CASE, FROM_VOLUME, CREATE, "ms", Better::Lower, ms(d));
                l.delete_volume(&name, false)?;
                // The system snapshot it was cloned from stays behind.
                l.delete_snapshot("src", &format!("clone-{name}"))?;
            } else {
                let q = linked_qcow2(&dir, &logs, &base, size, &first)?;
                q.record(ctx, QCOW2);
            }
        }
    }
    let u = |t: &str, m: &str| ctx.rec.get(CASE, t, m).map(|r| r.median()).unwrap_or(0.0);
    eprintln!(
        "  usable after: lamina {:.1} ms (create {:.1}, attach {:.1}, read {:.1}; snapshot {:.1}), qcow2 {:.1} ms (create {:.1}, serve {:.1}, read {:.1})",
        u(LAMINA, USABLE),
        u(LAMINA, CREATE),
        u(LAMINA, ATTACH),
        u(LAMINA, FIRST_READ),
        u(SNAPSHOT, CREATE),
        u(QCOW2, USABLE),
        u(QCOW2, CREATE),
        u(QCOW2, ATTACH),
        u(QCOW2, FIRST_READ)
    );

    // (b) and (c): full clones, alone and under a read load on the source,
    // against nbdcopy between two raw qemu-nbd exports.
    let (src_server, src_raw) = qemu_nbd("qemu-nbd-src", &src, "raw", &dir)?;
    let job = read_job(ctx.p.seconds, allocated);
    for round in 0..rounds {
        for k in 0..2 {
            if (round + k) % 2 == 0 {
                let name = format!("full{round}");
                let (took, written, op) = full_lamina(&l, &name)?;
                record_full(ctx, LAMINA, took, written);
                let (done, total) = (op.done_bytes, op.total_bytes);
                let r = &mut ctx.rec;
                r.add(
                    CASE,
                    LAMINA,
                    "full clone: operation's done_bytes",
                    "MiB",
                    Better::Lower,
                    done as f64 / MIB as f64,
                );
                r.add(
                    CASE,
                    LAMINA,
                    "full clone: operation's total_bytes",
                    "MiB",
                    Better::Lower,
                    total as f64 / MIB as f64,
                );

                let alone = fio::run(&job, &Target::Nbd(src_lamina.clone()))?;
                let loaded = lamina_under_reads(&l, &job, &src_lamina, round)?;
                record_reads(ctx, LAMINA, &alone, &loaded);
                l.delete_volume(&name, false)?;
                eprintln!(
                    "  round {round} lamina: full clone {:.2} s, {} MiB written ({} of {} MiB done); reads {:.0} IOPS alone, {:.0} during {} clones ({} MiB written in {:.2} s)",
                    took.as_secs_f64(),
                    written >> 20,
                    done >> 20,
                    total >> 20,
                    alone.iops,
                    loaded.reads.iops,
                    loaded.copies,
                    loaded.written >> 20,
                    loaded.window.as_secs_f64()
                );
            } else {
                let (took, written) = full_nbdcopy(&dir, size, &src_raw)?;
                record_full(ctx, NBDCOPY, took, written);
                let alone = fio::run(&job, &Target::Nbd(src_raw.clone()))?;
                let loaded = nbdcopy_under_reads(&dir, size, &job, &src_raw)?;
                record_reads(ctx, NBDCOPY, &alone, &loaded);
                eprintln!(
                    "  round {round} nbdcopy: {:.2} s, {} MiB written; reads {:.0} IOPS alone, {:.0} during {} copies ({} MiB written in {:.2} s)",
                    took.as_secs_f64(),
                    written >> 20,
                    alone.iops,
                    loaded.reads.iops,
                    loaded.copies,
                    loaded.written >> 20,
                    loaded.window.as_secs_f64()
                );
            }
        }
    }
    // The big files go; the logs stay.
    drop(src_server);
    let data = l.data.clone();
    drop(l);
    for f in [&src, &base] {
        std::fs::remove_file(f).with_context(|| format!("removing {}", f.display()))?;
    }
    std::fs::remove_dir_all(&data).with_context(|| format!("removing {}", data.display()))?;

    // The comparisons.
    let r = &mut ctx.rec;
    r.compare(
        CASE,
        "linked clone create call vs a snapshot of the same volume",
        CREATE,
        LAMINA,
        SNAPSHOT,
        Some(1.1),
    );
    r.compare(
        CASE,
        "linked clone of the live volume (snapshot + clone) vs a snapshot",
        CREATE,
        FROM_VOLUME,
        SNAPSHOT,
        None,
    );
    for (label, metric) in [
        ("linked clone usable, end to end, vs qcow2 overlay", USABLE),
        ("linked clone create vs qemu-img create -b", CREATE),
        ("linked clone attach vs starting qemu-nbd", ATTACH),
        ("linked clone first read vs qemu-nbd", FIRST_READ),
    ] {
        r.compare(CASE, label, metric, LAMINA, QCOW2, None);
    }
    r.compare(
        CASE,
        "full clone rate vs nbdcopy",
        FULL_RATE,
        LAMINA,
        NBDCOPY,
        Some(0.8),
    );
    r.compare(
        CASE,
        "full clone bytes written vs nbdcopy",
        FULL_BYTES,
        LAMINA,
        NBDCOPY,
        None,
    );
    r.compare(
        CASE,
        "full clone rate with reads on the source vs nbdcopy",
        FULL_LOADED,
        LAMINA,
        NBDCOPY,
        None,
    );
    r.compare(
        CASE,
        "source read IOPS kept during a full clone vs during nbdcopy",
        READ_KEPT,
        LAMINA,
        NBDCOPY,
        None,
    );
    r.compare(
        CASE,
        "source read IOPS during a full clone vs during nbdcopy",
        READ_DURING,
        LAMINA,
        NBDCOPY,
        None,
    );
    r.goal(
        CASE,
        "full clone bytes written ≤ 1.05× allocated",
        LAMINA,
        FULL_AMP,
        1.05,
    );

    let (sz, al) = (size >> 20, allocated >> 20);
    r.note(
        CASE,
        format!(
            "Source: a {sz} MiB volume holding {al} MiB of random data at its start (the rest never written), \
             the same bytes in each target: a Lamina volume (filled over NBD, then snapshot `base`), \
             base.qcow2 (qemu-img convert of the raw file) and a sparse raw file served by qemu-nbd."
        ),
    );
    r.note(
        CASE,
        format!(
            "Linked clone, {samples} samples each, alternating: Lamina = POST /v1/clones from the snapshot `src/base` (create), \
             POST /v1/volumes/NAME/attach (attach), then connect, NBD handshake and the first 4 KiB read (first read); \
             qcow2 = `qemu-img create -f qcow2 -b base.qcow2 -F qcow2` (create), qemu-nbd started on the overlay \
             until its socket accepts (attach), then handshake and the first 4 KiB read; the bytes read are checked. \
             \"usable after\" is the three end to end. `{SNAPSHOT}` is POST /v1/volumes/src/snapshots on the same \
             (attached, idle) volume; `{FROM_VOLUME}` is POST /v1/clones with from_volume, which takes a system \
             snapshot then clones it. The goal \"as fast as a snapshot\" is read as within 10% (this machine's noise)."
        ),
    );
    r.note(
        CASE,
        format!(
            "Full clone, {rounds} rounds alternating: Lamina = POST /v1/clones (full) from `src/base` until its \
             operation succeeds (polled every 5 ms); bytes = the daemon's write_bytes in /proc meanwhile (data, \
             metadata and journal). Anchor = `nbdcopy {}` from a qemu-nbd on the raw source to a qemu-nbd on a new \
             empty sparse raw file of the same size; bytes = the destination qemu-nbd's write_bytes. Rate = {al} MiB \
             allocated / time, for both.",
            NBDCOPY_OPTS.join(" ")
        ),
    );
    r.note(
        CASE,
        format!(
            "Reads during full clones: fio 4k randread QD32 for {} s over the source's allocated {al} MiB (Lamina: \
             the attached source volume; anchor: the source qemu-nbd that nbdcopy reads from), with copies back to \
             back from just before fio starts until it ends (Lamina: full clones, each into a new volume; anchor: \
             nbdcopy to a qemu-nbd on a new empty file, copied over again if fio outlasts a copy); \"alone\" is the \
             same job with no copy. The copy's rate meanwhile is the bytes the copier wrote (the daemon's, or the \
             destination qemu-nbd's, write_bytes) from the first copy's start to fio's end, over that time; it \
             includes fio's own start-up (about 0.3 s here), when the copy ran unloaded. No random-write load was \
             run.",
            ctx.p.seconds
        ),
    );
    Ok(())
}
