//! Cross-node clone: a volume of `crossnode_size` holding
//! `crossnode_allocated` bytes (half at its start, half in 1 MiB extents
//! spread over the rest) copied from host A to host B, two network
//! namespaces each with one veth link to a bridge in a third (the harness's
//! `lamina_test_support::netns`, as the cross-node tests use). Lamina (`lamina clone create
//! --from-node`, the target pulling over its transfer protocol) against
//! nbdcopy run in B from a qemu-nbd raw export on A over TCP, into a
//! qemu-nbd raw export in B (the anchor and the goal's) and onto a
//! sparse raw file (a stronger anchor, shown without a goal). Per side:
//! time, rate, bytes on the link (A's tx), and what the copies cost writes
//! on the source (one fio 4k randwrite run with copies in turns, its IOPS
//! log split into the slices during a copy and those clear of every copy,
//! `alternate.rs`; the anchor's copies under load are the ones onto a
//! file).
//!
//! `LAMINA_BENCH_CROSSNODE=anchor` runs the nbdcopy half alone (for a
//! build without the transfer protocol); the report says so.
//! `LAMINA_BENCH_BUSY_RATE=RATE` starts the source node with
//! `--transfer-busy-rate RATE` (`off`, `64M`...) instead of its default,
//! to measure what the pace trades; the report says so.

use crate::suite::alternate::{alternate, Alternated};
use crate::suite::fio::{Job, Target};
use crate::suite::lamina::Lamina;
use crate::suite::proc;
use crate::suite::record::Better;
use crate::suite::{path_str, Ctx, MIB};
use anyhow::{bail, ensure, Context, Result};
use lamina_test_support::netns::{Host, Net};
use serde_json::Value;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CASE: &str = "crossnode";
const LAMINA: &str = "lamina remote clone";
const NBDCOPY: &str = "nbdcopy qemu-nbd raw → raw";
/// The anchor the issue names, and the goal's: nbdcopy between two qemu-nbd
/// raw exports, one per host (the destination's served in B on a unix
/// socket).
const NBDCOPY_EXPORTS: &str = "nbdcopy qemu-nbd raw → qemu-nbd raw";
/// Set to `anchor` to run only the nbdcopy half.
pub const ONLY_ENV: &str = "LAMINA_BENCH_CROSSNODE";
/// Set to a `--transfer-busy-rate` for the source node.
pub const BUSY_RATE_ENV: &str = "LAMINA_BENCH_BUSY_RATE";

const TIME: &str = "cross-node copy: time";
const RATE: &str = "cross-node copy: rate (allocated bytes / time)";
const LINK: &str = "cross-node copy: bytes on the link (A's tx)";
const LINK_AMP: &str = "cross-node copy: bytes on the link ÷ allocated";
const WRITE_ALONE: &str = "4k randwrite QD32 on the source, alone";
const WRITE_DURING: &str = "4k randwrite QD32 on the source, during copies";
const WRITE_KEPT: &str = "source write IOPS during copies ÷ alone";
const LINK_DURING: &str = "link rate during the source's writes (A's tx)";

const NBD_PORT: u16 = 10809;
const API_PORT: u16 = 7400;
const TRANSFER_PORT: u16 = 7401;
/// nbdcopy onto a new sparse file, as durable at its end as Lamina's clone.
const NBDCOPY_OPTS: &[&str] = &["--destination-is-zero", "--flush"];

/// The source: `allocated` bytes of incompressible data in a sparse file of
/// `size`, the first half of them at its start (where fio writes), the
/// rest in 1 MiB extents spread evenly over the remainder.
fn source_file(path: &Path, size: u64, allocated: u64) -> Result<()> {
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.set_len(size)?;
    let head = allocated / 2;
    let extents = (allocated - head) / MIB;
    let stride = (size - head) / extents.max(1);
    ensure!(stride >= MIB, "{allocated} allocated do not fit in {size}");
    let mut s: u64 = 0x5EED_0C0F_FEE1_2345;
    let mut buf = vec![0u8; MIB as usize];
    let mut fill = |buf: &mut [u8]| {
        for w in buf.chunks_exact_mut(8) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            w.copy_from_slice(&s.to_le_bytes());
        }
    };
    for off in (0..head).step_by(MIB as usize) {
        fill(&mut buf);
        f.write_all_at(&buf, off)?;
    }
    for i in 0..extents {
        fill(&mut buf);
        f.write_all_at(&buf, head + i * stride)?;
    }
    f.sync_all()?;
    Ok(())
}

/// The write load on the source: 4 KiB random writes over the contiguous
/// half of its data (allocated already: no write allocates).
fn write_job(seconds: f64, allocated: u64) -> Job {
    let mut j = Job::new("randwrite", "4k", 32, seconds);
    j.size = Some(allocated / 2);
    j.seed = 11;
    j
}

/// One copy's figures.
struct Copy {
    took: Duration,
    link: u64,
}

fn record_copy(ctx: &mut Ctx, target: &str, c: &Copy) {
    let alloc = ctx.p.crossnode_allocated as f64;
    let s = c.took.as_secs_f64();
    let r = &mut ctx.rec;
    r.add(CASE, target, TIME, "s", Better::Lower, s);
    r.add(CASE, target, RATE, "MB/s", Better::Higher, alloc / s / 1e6);
    let link = c.link as f64;
    r.add(CASE, target, LINK, "MiB", Better::Lower, link / MIB as f64);
    r.add(CASE, target, LINK_AMP, "×", Better::Lower, link / alloc);
}

fn record_writes(ctx: &mut Ctx, target: &str, w: &Alternated) {
    let r = &mut ctx.rec;
    r.add(
        CASE,
        target,
        WRITE_ALONE,
        "IOPS",
        Better::Higher,
        w.quiet_iops,
    );
    r.add(
        CASE,
        target,
        WRITE_DURING,
        "IOPS",
        Better::Higher,
        w.busy_iops,
    );
    let rate = w.moved as f64 / w.busy_time.as_secs_f64() / 1e6;
    r.add(CASE, target, LINK_DURING, "MB/s", Better::Higher, rate);
    r.add(CASE, target, WRITE_KEPT, "×", Better::Higher, w.kept());
}

/// The quiet between copies under the source's writes: the profile's fio
/// seconds, but at least 2 s, so that slices clear of both copies' margins
/// fit between them (the quick profile's 1 s left none).
fn quiet_gap(ctx: &Ctx) -> f64 {
    ctx.p.seconds.max(2.0)
}

/// The source's writes, one fio run of six gaps with copies in turns
/// (`alternate.rs`): a gap of quiet, a copy, and again. Its log goes to
/// `log`.
fn writes_with_copies(
    ctx: &Ctx,
    target: &Target,
    log: &Path,
    tx: impl Fn() -> u64,
    copy: impl FnMut(usize) -> Result<()>,
) -> Result<Alternated> {
    let gap = quiet_gap(ctx);
    let job = write_job(6.0 * gap, ctx.p.crossnode_allocated);
    let gap = Duration::from_secs_f64(gap);
    // Nothing from the copy just measured is left to write back.
    proc::sync_disks();
    alternate(&job, target, log, gap, tx, copy)
}

fn log_line(side: &str, round: usize, w: &Alternated) -> String {
    format!(
        "  round {round} {side}: writes {:.0} IOPS quiet ({} slices), {:.0} during {} copies in {} turns ({} slices; {} MiB on the link in {:.2} s)",
        w.quiet_iops,
        w.quiet_slices,
        w.busy_iops,
        w.calls,
        w.turns,
        w.busy_slices,
        w.moved >> 20,
        w.busy_time.as_secs_f64()
    )
}

/// A child process killed and reaped when dropped.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The anchors: qemu-nbd in A serving the raw source on A's address, and
/// qemu-nbd in B serving the destination export's raw file on a unix socket.
struct Anchor<'a> {
    _server: Reaped,
    _dst_server: Reaped,
    uri: String,
    dst_uri: String,
    dst_export: PathBuf,
    b: &'a Host,
    a: &'a Host,
    dst: PathBuf,
    size: u64,
}

impl<'a> Anchor<'a> {
    fn start(link: &'a Net, src: &Path, dir: &Path, logs: &Path, size: u64) -> Result<Anchor<'a>> {
        let log = std::fs::File::create(logs.join("crossnode-qemu-nbd.log"))?;
        let addr = link.host(0).addr().to_string();
        let child = link
            .host(0)
            .cmd("qemu-nbd")
            .args(["--persistent", "--shared=8", "--export-name=disk"])
            .args(["-f", "raw", "-b", &addr, "-p", &NBD_PORT.to_string()])
            .arg(src)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting qemu-nbd in host A")?;
        let server = Reaped(child);
        let uri = format!("nbd://{addr}:{NBD_PORT}/disk");
        answers(link, &uri, "in host A")?;
        let dst_export = dir.join("anchor-export.raw");
        std::fs::File::create(&dst_export)?.set_len(size)?;
        let sock = dir.join("anchor-export.sock");
        let log = std::fs::File::create(logs.join("crossnode-qemu-nbd-b.log"))?;
        let child = link
            .host(1)
            .cmd("qemu-nbd")
            .args([
                "--persistent",
                "--shared=8",
                "--export-name=disk",
                "-f",
                "raw",
            ])
            // Its fastest options as a destination here: copying the same
            // source locally into it took 5.2 s with these, 7.9 s with the
            // defaults (writeback cache, thread pool), 6.5 s with
            // io_uring, against 3.9 s for nbdcopy onto a file.
            .args(["--cache=none", "--aio=native", "-k"])
            .arg(&sock)
            .arg(&dst_export)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting qemu-nbd in host B")?;
        let dst_server = Reaped(child);
        let dst_uri = format!("nbd+unix:///disk?socket={}", path_str(&sock));
        answers(link, &dst_uri, "in host B")?;
        Ok(Anchor {
            _server: server,
            _dst_server: dst_server,
            uri,
            dst_uri,
            dst_export,
            a: link.host(0),
            b: link.host(1),
            dst: dir.join("anchor-dst.raw"),
            size,
        })
    }

    /// nbdcopy in B from A's export onto a new sparse file.
    fn copy(&self) -> Result<Copy> {
        let _ = std::fs::remove_file(&self.dst);
        std::fs::File::create(&self.dst)?.set_len(self.size)?;
        self.nbdcopy_to(self.dst.as_os_str())
    }

    /// nbdcopy in B from A's export into B's export, its file made sparse
    /// and empty again first (qemu-nbd keeps it open).
    fn copy_to_export(&self) -> Result<Copy> {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.dst_export)?;
        f.set_len(0)?;
        f.set_len(self.size)?;
        f.sync_all()?;
        self.nbdcopy_to(std::ffi::OsStr::new(&self.dst_uri))
    }

    /// One timed nbdcopy in B from A's export to `dst` (a file or a URI),
    /// with the bytes A sent on the link meanwhile.
    fn nbdcopy_to(&self, dst: &std::ffi::OsStr) -> Result<Copy> {
        let tx = self.a.try_tx_bytes()?;
        let t = Instant::now();
        proc::run(
            self.b
                .cmd("nbdcopy")
                .args(NBDCOPY_OPTS)
                .arg("--")
                .arg(&self.uri)
                .arg(dst),
        )?;
        let took = t.elapsed();
        Ok(Copy {
            took,
            link: self.a.try_tx_bytes()? - tx,
        })
    }

    fn fio_target(&self) -> Target {
        Target::NbdIn {
            prefix: self.a.prefix(),
            uri: self.uri.clone(),
        }
    }
}

/// Waits until an NBD server answers on `uri` from host B.
fn answers(link: &Net, uri: &str, what: &str) -> Result<()> {
    let t = Instant::now();
    while !link
        .host(1)
        .cmd("nbdinfo")
        .args(["--size", uri])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        if t.elapsed() > Duration::from_secs(30) {
            bail!("qemu-nbd {what} did not answer on {uri} from host B in 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Lamina: a node in each host, the source volume `src` with snapshot
/// `src/gold` on A.
struct Nodes<'a> {
    bin: PathBuf,
    /// The source node: kept running while the struct lives.
    _a: Lamina,
    b: Lamina,
    link: &'a Net,
    src_uri: String,
    mapped: u64,
}

impl<'a> Nodes<'a> {
    fn start(ctx: &Ctx, link: &'a Net, src: &Path, size: u64) -> Result<Nodes<'a>> {
        let bin = ctx.lamina_bin.clone();
        let certs = ctx.scratch("crossnode-certs")?;
        let ca = certs.join("ca");
        proc::run(Command::new(&bin).args(["certs", "create-ca"]).arg(&ca))?;
        let node = |name: &str, h: &Host| -> Result<Lamina> {
            let tls = certs.join(name);
            proc::run(
                Command::new(&bin)
                    .args(["certs", "issue", "--ca"])
                    .arg(&ca)
                    .args(["--node", name])
                    .arg(&tls),
            )?;
            let mut extra = vec![
                "--listen".to_string(),
                format!("{}:{API_PORT}", h.addr()),
                "--transfer-listen".to_string(),
                format!("{}:{TRANSFER_PORT}", h.addr()),
                "--transfer-tls".to_string(),
                path_str(&tls),
            ];
            if let Ok(rate) = std::env::var(BUSY_RATE_ENV) {
                extra.extend(["--transfer-busy-rate".to_string(), rate]);
            }
            let data = ctx.scratch(&format!("crossnode-{name}"))?;
            Lamina::start_in(&bin, &data, &ctx.logs, &h.prefix(), &extra)
        };
        let a = node("a", link.host(0))?;
        let b = node("b", link.host(1))?;
        a.create_volume("src", size)?;
        let src_uri = a.attach("src")?;
        proc::run(
            Command::new("nbdcopy")
                .args(["--destination-is-zero", "--"])
                .arg(src)
                .arg(&src_uri),
        )
        .context("filling the Lamina source volume")?;
        a.snapshot("src", "gold")?;
        let mapped = a.snapshot_info("src", "gold")?.allocated_bytes;
        Ok(Nodes {
            bin,
            _a: a,
            b,
            link,
            src_uri,
            mapped,
        })
    }

    /// `lamina -o json ARGS` against node B.
    fn cli_b(&self, args: &[&str]) -> Result<Value> {
        let out = proc::run(
            Command::new(&self.bin)
                .arg("--data-dir")
                .arg(&self.b.data)
                .args(args)
                .args(["-o", "json"]),
        )?;
        serde_json::from_str(&out).with_context(|| format!("lamina {args:?} printed {out}"))
    }

    /// Clone `src/gold` from A into a new volume `name` on B, to its end.
    fn copy(&self, name: &str) -> Result<(Copy, Value)> {
        let from = format!("{}:{TRANSFER_PORT}", self.link.host(0).addr());
        let tx = self.link.host(0).try_tx_bytes()?;
        let t = Instant::now();
        let j = self.cli_b(&[
            "clone",
            "create",
            name,
            "--from-snapshot",
            "src/gold",
            "--from-node",
            "a",
            "--from-address",
            &from,
            "--no-wait",
        ])?;
        let id = j["operation"]["id"]
            .as_str()
            .with_context(|| format!("clone create printed no operation: {j}"))?
            .to_string();
        let op = self.cli_b(&["operation", "wait", &id])?;
        let took = t.elapsed();
        ensure!(op["state"] == "succeeded", "the remote clone failed: {op}");
        let link = self.link.host(0).try_tx_bytes()? - tx;
        Ok((Copy { took, link }, op))
    }
}

pub fn run(ctx: &mut Ctx) -> Result<()> {
    let size = ctx.p.crossnode_size;
    let allocated = ctx.p.crossnode_allocated;
    let rounds = ctx.p.rounds;
    let anchor_only = std::env::var(ONLY_ENV).is_ok_and(|v| v == "anchor");
    let dir = ctx.scratch("crossnode")?;
    let src = dir.join("src.raw");
    source_file(&src, size, allocated)?;
    let link = Net::try_new(2)?;

    let nodes = if anchor_only {
        None
    } else {
        Some(Nodes::start(ctx, &link, &src, size)?)
    };
    if let Some(n) = &nodes {
        if n.mapped.abs_diff(allocated) > allocated / 20 {
            ctx.rec.note(
                CASE,
                format!(
                    "the Lamina source snapshot maps {} MiB, not the {} MiB written into it.",
                    n.mapped >> 20,
                    allocated >> 20
                ),
            );
        }
    }
    let anchor = Anchor::start(&link, &src, &dir, &ctx.logs, size)?;

    for round in 0..rounds {
        for k in 0..2 {
            if (round + k) % 2 == 0 {
                let Some(n) = &nodes else { continue };
                // Each measured copy starts with nothing left to write back
                // from the rounds before (fio's writes above all).
                proc::sync_disks();
                let (c, op) = n.copy(&format!("c{round}"))?;
                record_copy(ctx, LAMINA, &c);
                let num = |key: &str| op[key].as_f64().unwrap_or(f64::NAN);
                let r = &mut ctx.rec;
                // (A finished operation has no rate: it shows one only
                // while it runs; the case's rate is measured above.)
                let wire = num("wire_bytes");
                r.add(
                    CASE,
                    LAMINA,
                    "operation's wire_bytes",
                    "MiB",
                    Better::Lower,
                    wire / MIB as f64,
                );
                let target = Target::Nbd(n.src_uri.clone());
                let mut names = Vec::new();
                let w = writes_with_copies(
                    ctx,
                    &target,
                    &ctx.logs.join(format!("crossnode-fio-lamina-{round}")),
                    || link.host(0).try_tx_bytes().unwrap_or(0),
                    |i| {
                        let name = format!("load{round}-{i}");
                        n.copy(&name)?;
                        names.push(name);
                        Ok(())
                    },
                )?;
                let t = Instant::now();
                for name in names.iter().chain([&format!("c{round}")]) {
                    n.b.delete_volume(name, false)?;
                }
                // B reclaims the deleted clones' space in the background
                // (punching it out of the pool file); the next round's
                // copy starts once that is done, not while it runs.
                let reclaim = n.b.reclaimed(t)?;
                ctx.rec.add(
                    CASE,
                    LAMINA,
                    "target's reclaim of the round's deleted clones",
                    "s",
                    Better::Lower,
                    reclaim.as_secs_f64(),
                );
                record_writes(ctx, LAMINA, &w);
                eprintln!(
                    "  round {round} lamina: {:.2} s, {} MiB on the link (op: {} MiB)",
                    c.took.as_secs_f64(),
                    c.link >> 20,
                    wire as u64 >> 20,
                );
                eprintln!("{}", log_line("lamina", round, &w));
            } else {
                proc::sync_disks();
                let e = anchor.copy_to_export()?;
                record_copy(ctx, NBDCOPY_EXPORTS, &e);
                proc::sync_disks();
                let c = anchor.copy()?;
                record_copy(ctx, NBDCOPY, &c);
                let w = writes_with_copies(
                    ctx,
                    &anchor.fio_target(),
                    &ctx.logs.join(format!("crossnode-fio-nbdcopy-{round}")),
                    || link.host(0).try_tx_bytes().unwrap_or(0),
                    |_| anchor.copy().map(drop),
                )?;
                record_writes(ctx, NBDCOPY, &w);
                eprintln!(
                    "  round {round} nbdcopy into B's qemu-nbd: {:.2} s, {} MiB on the link",
                    e.took.as_secs_f64(),
                    e.link >> 20
                );
                eprintln!(
                    "  round {round} nbdcopy: {:.2} s, {} MiB on the link",
                    c.took.as_secs_f64(),
                    c.link >> 20,
                );
                eprintln!("{}", log_line("nbdcopy", round, &w));
            }
        }
    }
    drop(anchor);
    drop(nodes);
    drop(link);
    std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;

    let gap = quiet_gap(ctx);
    let r = &mut ctx.rec;
    // The goal is the issue's: against nbdcopy between two raw exports,
    // one per node. nbdcopy writing straight onto a file in B (no server
    // there) is a stronger anchor than the issue asks for, shown beside it
    // without a goal: qemu-nbd as a destination, even with its fastest
    // options here, took 1.4-1.7 times as long as nbdcopy onto a file.
    r.compare(
        CASE,
        "cross-node clone rate vs nbdcopy between two raw exports",
        RATE,
        LAMINA,
        NBDCOPY_EXPORTS,
        Some(0.8),
    );
    r.compare(
        CASE,
        "cross-node clone rate vs nbdcopy onto a file",
        RATE,
        LAMINA,
        NBDCOPY,
        None,
    );
    r.compare(
        CASE,
        "bytes on the link vs nbdcopy",
        LINK,
        LAMINA,
        NBDCOPY,
        None,
    );
    r.compare(
        CASE,
        "source write IOPS kept during copies vs during nbdcopy",
        WRITE_KEPT,
        LAMINA,
        NBDCOPY,
        None,
    );
    r.goal(
        CASE,
        "bytes on the link ≤ 1.05× allocated",
        LAMINA,
        LINK_AMP,
        1.05,
    );
    r.goal(
        CASE,
        "source write IOPS during a cross-node clone ≥ 0.8× alone",
        LAMINA,
        WRITE_KEPT,
        0.8,
    );
    let (sz, al) = (size >> 20, allocated >> 20);
    r.note(
        CASE,
        format!(
            "Two network namespaces A and B, each with one veth link to a bridge in a third namespace (no shaping). Source: a {sz} MiB volume \
             holding {al} MiB of random data, half at its start and half in 1 MiB extents spread evenly over \
             the rest. Lamina: nodes `a` and `b` (`lamina serve` in each namespace, certificates from one \
             `lamina certs create-ca`), the source volume filled over NBD and snapshot `src/gold`; a copy is \
             `lamina clone create --from-snapshot src/gold --from-node a --from-address A:{TRANSFER_PORT} \
             --no-wait` on B then `lamina operation wait` (wall time of both). Anchor: qemu-nbd in A serving \
             the raw file on A's address over TCP; `nbdcopy {}` run in B into qemu-nbd in B serving a raw file \
             made sparse and empty before each copy (`--cache=none --aio=native`, its fastest here; unix socket: \
             the issue's anchor, two raw exports, and the goal's), and then onto a new sparse raw file (no \
             server in B: a stronger anchor than the issue's, shown without a goal). Bytes on \
             the link: A's veth tx counter around the copy (TCP/IP, TLS and protocol included). Rate = {al} \
             MiB allocated / time, for both; each measured copy starts after a sync(2), with nothing left to write back.",
            NBDCOPY_OPTS.join(" ")
        ),
    );
    r.note(
        CASE,
        format!(
            "Source writes: one fio 4k randwrite QD32 run of {} s over the source's first {} MiB (all allocated), \
             started after a sync(2), with copies in turns: {} s of quiet, a copy (copies back to back for at least 1 s), {} s of quiet, a copy, while {} s of the run \
             are left. fio's IOPS log (one figure per 250 ms) is split into the slices wholly inside a copy (\"during\") and \
             those at least 0.5 s clear of every copy (\"alone\"); the ratio is their means'. Both halves come from one run, \
             interleaved: separate runs alone before and after let the machine's drift decide it (ten 5 s runs in a row \
             of the same kind of job on an idle daemon moved between 39k and 61k IOPS). Lamina: clones into new volumes on B, \
             deleted after, and the round waits until B has reclaimed their space (its own figure); anchor: nbdcopy again onto the new file. Lamina's fio writes the live volume \
             through its NBD export (unix socket); the anchor's runs in A against the qemu-nbd that nbdcopy \
             reads (TCP on A's address, over A's loopback): each side's ratio is against its own path alone.",
            6.0 * gap,
            al / 2,
            gap,
            gap,
            gap,
        ),
    );
    let rate = std::env::var(BUSY_RATE_ENV).unwrap_or_else(|_| "its default".into());
    r.note(
        CASE,
        format!(
            "The source node runs with `--transfer-busy-rate` at {rate}: while its volumes have I/O its \
             transfers send at most that many bytes a second (`{BUSY_RATE_ENV}` sets it for a run). \
             \"Link rate during the source's writes\" is A's veth tx over the copies' turns within fio's run, for both sides."
        ),
    );
    if anchor_only {
        r.note(
            CASE,
            format!("{ONLY_ENV}=anchor: only the nbdcopy half ran; there is no Lamina figure."),
        );
    }
    Ok(())
}
