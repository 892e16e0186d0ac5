//! The side-by-side suite: Lamina and its alternatives on the same machine,
//! in the same run, each case several rounds in alternation, reported as
//! ratios. Each case lives in `cases/`; they share the profile (sizes,
//! rounds, depths), the record book and the processes in `proc`.

mod alternate;
mod anchors;
mod cases;
mod fio;
mod lamina;
mod machine;
mod nbd_client;
mod plot;
mod proc;
mod qmp;
mod record;
mod report;

use anyhow::{bail, Context, Result};
use record::Records;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub const GIB: u64 = 1 << 30;
pub const MIB: u64 = 1 << 20;

#[derive(clap::Args)]
pub struct SuiteArgs {
    /// Small sizes, depths and rounds: under five minutes, for CI.
    #[arg(long)]
    quick: bool,
    /// Where the report goes: `benchmarks.md`, `bench-suite.json` and
    /// `bench-depth.png` (default: `docs/` for a full run,
    /// `target/bench-quick/` for a quick one).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Scratch directory for volumes and images, on the disk to measure
    /// (default: a temporary directory in the current one, removed after).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Run only these cases (comma separated): io, node, depth, snapshot,
    /// delete, clone, crossnode, replicated, index, scale.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Rounds of each comparison (default 3, quick 1).
    #[arg(long)]
    rounds: Option<usize>,
    /// Seconds per fio run (default 5, quick 1).
    #[arg(long)]
    seconds: Option<f64>,
    /// Another build's `lamina` binary (an earlier commit's, say): the io
    /// case serves one more volume from it, and the node case stages one
    /// more claim over it, beside this build's, in the same rounds, and
    /// each compares the two (before and after a change to the data path,
    /// in one run).
    #[arg(long)]
    baseline: Option<PathBuf>,
}

/// Sizes and counts of one run; printed in the report.
#[derive(Serialize, Clone, Debug)]
pub struct Profile {
    pub name: &'static str,
    pub rounds: usize,
    pub seconds: f64,
    /// Volume and file size for the I/O and depth cases.
    pub size: u64,
    /// Snapshot depths measured on Lamina, and on a qcow2 chain (shallower:
    /// each qcow2 layer costs 16× the bytes rewritten, see the depth case).
    pub depths: Vec<usize>,
    pub qcow2_depths: Vec<usize>,
    /// Snapshot latency: the Nth snapshot measured besides the first ones.
    pub snapshot_count: usize,
    /// Snapshot latency: samples per percentile.
    pub snapshot_samples: usize,
    /// Delete: chain depth, and bytes the middle snapshot holds alone.
    pub delete_chain: usize,
    pub delete_bytes: u64,
    /// Clone: volume size and bytes allocated in it.
    pub clone_size: u64,
    pub clone_allocated: u64,
    /// Cross-node clone: volume size and bytes allocated in it.
    pub crossnode_size: u64,
    pub crossnode_allocated: u64,
    /// Scale: volumes, and snapshots per volume.
    pub scale_volumes: usize,
    pub scale_snapshots: usize,
    /// Replicated: the volumes' size.
    pub replicated_size: u64,
    /// Replicated: seconds a replica's link is cut (the front end waits
    /// 5 s of silence before it faults it), and the steady write load
    /// meanwhile (4 KiB writes a second).
    pub replicated_outage: f64,
    pub replicated_load_iops: u32,
}

impl Profile {
    fn full() -> Profile {
        Profile {
            name: "full",
            rounds: 3,
            seconds: 5.0,
            size: GIB,
            depths: vec![0, 10, 100, 1000],
            qcow2_depths: vec![0, 10, 100],
            snapshot_count: 10_000,
            snapshot_samples: 100,
            delete_chain: 100,
            delete_bytes: GIB,
            clone_size: 10 * GIB,
            clone_allocated: 2 * GIB,
            crossnode_size: 10 * GIB,
            crossnode_allocated: 2 * GIB,
            scale_volumes: 1000,
            scale_snapshots: 30,
            replicated_size: GIB,
            replicated_outage: 10.0,
            replicated_load_iops: 2000,
        }
    }

    fn quick() -> Profile {
        Profile {
            name: "quick",
            rounds: 1,
            seconds: 1.0,
            size: 256 * MIB,
            depths: vec![0, 10, 100],
            qcow2_depths: vec![0, 10],
            snapshot_count: 300,
            snapshot_samples: 10,
            delete_chain: 10,
            delete_bytes: 64 * MIB,
            clone_size: GIB,
            clone_allocated: 128 * MIB,
            crossnode_size: 512 * MIB,
            crossnode_allocated: 128 * MIB,
            scale_volumes: 40,
            scale_snapshots: 5,
            replicated_size: 128 * MIB,
            replicated_outage: 6.0,
            replicated_load_iops: 500,
        }
    }
}

/// What every case gets: the profile, a scratch directory, where logs go,
/// the `lamina` binary, and the record book.
pub struct Ctx {
    pub p: Profile,
    pub work: PathBuf,
    pub logs: PathBuf,
    pub lamina_bin: PathBuf,
    /// `--baseline`: another build's `lamina`, for the io and node cases.
    pub baseline_bin: Option<PathBuf>,
    pub rec: Records,
}

impl Ctx {
    /// A fresh scratch directory for one case.
    pub fn scratch(&self, name: &str) -> Result<PathBuf> {
        let d = self.work.join(name);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d)?;
        Ok(d)
    }

    pub fn lamina(&self, name: &str) -> Result<lamina::Lamina> {
        let d = self.scratch(name)?;
        lamina::Lamina::start(&self.lamina_bin, &d, &self.logs)
    }

    /// [`Ctx::lamina`] with extra `serve` arguments.
    pub fn lamina_with(&self, name: &str, extra: &[&str]) -> Result<lamina::Lamina> {
        let d = self.scratch(name)?;
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        lamina::Lamina::start_in(&self.lamina_bin, &d, &self.logs, &[], &extra)
    }

    /// A daemon of another build's binary (`--baseline`).
    pub fn lamina_of(&self, bin: &Path, name: &str) -> Result<lamina::Lamina> {
        let d = self.scratch(name)?;
        lamina::Lamina::start(bin, &d, &self.logs)
    }
}

type CaseFn = fn(&mut Ctx) -> Result<()>;

/// Every case: its name for `--only`, its title in the report, and how it
/// runs.
pub const CASES: &[(&str, &str, CaseFn)] = &[
    ("io", "I/O path", cases::io::run),
    ("node", "Node path (a claim vs hostPath)", cases::node::run),
    ("depth", "Snapshot depth", cases::depth::run),
    ("snapshot", "Snapshot latency", cases::snapshot::run),
    ("delete", "Snapshot delete", cases::delete::run),
    ("clone", "Clones", cases::clone::run),
    ("crossnode", "Cross-node clone", cases::crossnode::run),
    ("replicated", "Replicated volumes", cases::replicated::run),
    ("index", "Index space", cases::index::run),
    ("scale", "Scale (control plane)", cases::scale::run),
];

/// Tools the suite drives, and the Debian package of each.
const TOOLS: &[(&str, &str)] = &[
    ("fio", "fio"),
    ("qemu-nbd", "qemu-utils"),
    ("qemu-img", "qemu-utils"),
    ("qemu-io", "qemu-utils"),
    ("qemu-storage-daemon", "qemu-system-common"),
    ("nbdkit", "nbdkit"),
    ("nbdcopy", "libnbd-bin"),
    ("findmnt", "util-linux"),
    ("nbdinfo", "libnbd-bin"),
    ("ip", "iproute2"),
    ("losetup", "mount"),
    ("mkfs.ext4", "e2fsprogs"),
];

fn check_tools() -> Result<()> {
    let missing: Vec<_> = TOOLS.iter().filter(|(t, _)| !proc::have(t)).collect();
    if !missing.is_empty() {
        let names: Vec<_> = missing.iter().map(|(t, _)| *t).collect();
        let mut pkgs: Vec<_> = missing.iter().map(|(_, p)| *p).collect();
        pkgs.dedup();
        bail!(
            "missing tools: {}. The suite installs nothing; on Debian or Ubuntu: apt-get install {}",
            names.join(", "),
            pkgs.join(" ")
        );
    }
    let engines = proc::run(std::process::Command::new("fio").arg("--enghelp"))?;
    if !engines.lines().any(|l| l.trim() == "nbd") {
        bail!("this fio has no nbd engine (fio 3.19 or later built with libnbd is needed)");
    }
    Ok(())
}

fn lamina_bin() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let bin = exe.with_file_name("lamina");
    if !bin.exists() {
        bail!(
            "{} not found: build it beside this binary (cargo build --release -p lamina-cli), or use bench/run",
            bin.display()
        );
    }
    Ok(bin)
}

/// Deep qcow2 chains hold a file open per layer: allow as many as the
/// hard limit does, for this process and the servers it starts.
fn raise_open_files() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}

pub fn run(a: SuiteArgs) -> Result<()> {
    check_tools()?;
    raise_open_files();
    let mut p = if a.quick {
        Profile::quick()
    } else {
        Profile::full()
    };
    if let Some(r) = a.rounds {
        p.rounds = r.max(1);
    }
    if let Some(s) = a.seconds {
        p.seconds = s;
    }
    for o in &a.only {
        if !CASES.iter().any(|(n, _, _)| n == o) {
            let names: Vec<&str> = CASES.iter().map(|(n, _, _)| *n).collect();
            bail!("no case {o:?}; the cases are {}", names.join(", "));
        }
    }
    let out = a.out.clone().unwrap_or_else(|| {
        if a.quick {
            PathBuf::from("target/bench-quick")
        } else {
            PathBuf::from("docs")
        }
    });
    std::fs::create_dir_all(&out)?;
    let tmp;
    let work = match &a.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.canonicalize()?
        }
        None => {
            tmp = tempfile::Builder::new()
                .prefix(".lamina-bench-")
                .tempdir_in(std::env::current_dir()?)?;
            tmp.path().to_path_buf()
        }
    };
    let logs = work.join("logs");
    std::fs::create_dir_all(&logs)?;
    let machine = machine::describe(&work);
    eprintln!(
        "lamina-bench suite ({}) in {}: {machine}",
        p.name,
        work.display()
    );
    let mut ctx = Ctx {
        p,
        work: work.clone(),
        logs,
        lamina_bin: lamina_bin()?,
        baseline_bin: match &a.baseline {
            Some(b) if !b.is_file() => bail!("--baseline {}: no such file", b.display()),
            Some(b) => Some(b.canonicalize()?),
            None => None,
        },
        rec: Records::default(),
    };
    let started = Instant::now();
    let mut timings = Vec::new();
    let mut failed = Vec::new();
    for (name, title, f) in CASES {
        if !a.only.is_empty() && !a.only.iter().any(|o| o == name) {
            continue;
        }
        eprintln!("== {title}");
        let t = Instant::now();
        if let Err(e) = f(&mut ctx) {
            let mut msg = format!("{e:#}");
            // A full disk fails a case far from its cause (qemu's ENOSPC in
            // the middle of a snapshot loop): say how much was left.
            if let Some(free) = machine::free_bytes(&ctx.work) {
                if free < 2 << 30 {
                    msg.push_str(&format!(
                        " (the work directory's disk has only {} MiB free)",
                        free >> 20
                    ));
                }
            }
            eprintln!("  case {name} failed: {msg}");
            ctx.rec.note(name, format!("the case failed: {msg}"));
            failed.push(*name);
        }
        // A case's volumes and images go with it: the next case gets the
        // disk space back (a full run's qcow2 chains alone take tens of GiB).
        for entry in std::fs::read_dir(&ctx.work)?.flatten() {
            if entry.file_name() != "logs" {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        timings.push((name.to_string(), t.elapsed().as_secs_f64()));
        eprintln!("  ({:.0} s)", t.elapsed().as_secs_f64());
        // The report is rewritten after every case, so a run that dies
        // later (one did, silently, half an hour in) keeps what it measured;
        // the page says which cases it has not reached.
        let pending: Vec<&str> = CASES
            .iter()
            .map(|(n, _, _)| *n)
            .skip_while(|n| n != name)
            .skip(1)
            .filter(|n| a.only.is_empty() || a.only.iter().any(|o| o == n))
            .collect();
        let so_far = report::RunSoFar {
            command: command_line(&a),
            timings: &timings,
            secs: started.elapsed().as_secs_f64(),
            pending,
        };
        report::write(&out, &ctx, &machine, &so_far).context("writing the report")?;
    }
    eprintln!(
        "report in {} ({:.0} s in all)",
        out.display(),
        started.elapsed().as_secs_f64()
    );
    if !failed.is_empty() {
        bail!("cases failed: {}", failed.join(", "));
    }
    Ok(())
}

fn command_line(a: &SuiteArgs) -> String {
    let mut c = String::from("bench/run");
    if a.quick {
        c.push_str(" --quick");
    }
    if let Some(r) = a.rounds {
        c.push_str(&format!(" --rounds {r}"));
    }
    if let Some(s) = a.seconds {
        c.push_str(&format!(" --seconds {s}"));
    }
    if !a.only.is_empty() {
        c.push_str(&format!(" --only {}", a.only.join(",")));
    }
    c
}

/// A path as a string for URIs and arguments.
pub fn path_str(p: &Path) -> String {
    p.display().to_string()
}
