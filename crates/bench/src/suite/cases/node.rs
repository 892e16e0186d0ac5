//! The node path: a volume as the CSI node plugin stages it on a node with
//! FUSE (the daemon serves it as a file, a loop device with direct I/O over
//! the file, ext4 on the loop device), against a file in a directory of the
//! host's own filesystem on the same disk: what a pod gets from a Lamina
//! claim next to what it gets from a hostPath volume (a pod's volume is a
//! bind mount of the same filesystem, so the pod adds no hop of its own).
//! Each hop is measured on its own too: fio on the daemon's file, and on
//! the loop device. And the bound of any claim staged through a loop
//! device (this kernel has no ublk and no NBD client, so a loop device is
//! the only block device a userspace store can give a filesystem): ext4 on
//! a loop device over a plain file of the host, with nothing of Lamina in
//! the path. Every target is written whole before the jobs run.

use crate::suite::fio::{self, Job, Target};
use crate::suite::lamina::Lamina;
use crate::suite::{proc, Ctx};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

const CASE: &str = "node";
const HOST: &str = "hostPath (host filesystem)";
const EXT4: &str = "claim (ext4, loop, daemon's file)";
const LOOP: &str = "loop device over the daemon's file";
const FILE: &str = "the daemon's file (FUSE)";
const BOUND: &str = "ext4, loop, a file of the host (no Lamina)";
/// `--baseline`: the same claim staged over another build's daemon.
const BASELINE: &str = "claim, baseline build";

/// A loop device, detached when dropped.
struct Loop(String);

impl Loop {
    fn over(file: &Path) -> Result<Loop> {
        let dev = proc::run(
            Command::new("losetup")
                .args(["--find", "--show", "--direct-io=on"])
                .arg(file),
        )
        .with_context(|| format!("losetup over {}", file.display()))?;
        Ok(Loop(dev.trim().to_string()))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// A mounted filesystem, unmounted when dropped.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A claim staged as the node plugin stages it: volume `fs` of `size` on
/// `lamina` served as a file, then [`stage`]d on `mnt`. Taken apart in the
/// tuple's order: the mount, then the loop device (the daemon goes after,
/// with its owner's value).
fn claim(lamina: &Lamina, size: u64, mnt: &Path) -> Result<(Mounted, Loop)> {
    lamina.create_volume("fs", size)?;
    let file = lamina.attach_file("fs")?;
    stage(&file, mnt)
}

/// A loop device with direct I/O over `file`, ext4 on it, mounted on `mnt`.
fn stage(file: &Path, mnt: &Path) -> Result<(Mounted, Loop)> {
    let lo = Loop::over(file)?;
    proc::run(Command::new("mkfs.ext4").args(["-q", "-F", &lo.0]))?;
    std::fs::create_dir_all(mnt)?;
    proc::run(Command::new("mount").arg(&lo.0).arg(mnt))?;
    Ok((Mounted(mnt.to_path_buf()), lo))
}

/// Write `target`'s first `size` bytes once, 1 MiB at a time.
fn fill(target: &Target, size: u64) -> Result<()> {
    let mut job = Job::new("write", "1m", 8, 0.0);
    job.number_ios = Some(size >> 20);
    job.size = Some(size);
    fio::run(&job, target).map(drop)
}

pub fn run(ctx: &mut Ctx) -> Result<()> {
    let dir = ctx.scratch("node")?;
    let size = ctx.p.size;
    // What fio works on in every target: the filesystem's share of a claim
    // of `size` leaves room for ext4's own blocks.
    let work = size * 3 / 4;
    let lamina = ctx.lamina("node-lamina")?;
    lamina.create_volume("raw", size)?;
    let raw_file = lamina.attach_file("raw")?;
    // Dropped in reverse: the claim (its mount, then its loop device), the
    // raw volume's loop device, then (declared first) the daemon.
    let raw_loop = Loop::over(&raw_file)?;
    let mnt = dir.join("claim");
    let _claim = claim(&lamina, size, &mnt)?;
    let host = dir.join("hostpath");
    std::fs::create_dir_all(&host)?;
    // The bound: the same staging over a file of the host's filesystem, of
    // the claim's size and as thin as the claim's volume.
    let backing = dir.join("bound.img");
    std::fs::File::create(&backing)?.set_len(size)?;
    let bound_mnt = dir.join("bound");
    let _bound = stage(&backing, &bound_mnt)?;
    // `--baseline`: the same claim over the other build's daemon; the claim
    // goes before that daemon.
    let baseline = match ctx.baseline_bin.clone() {
        Some(bin) => {
            let b = ctx.lamina_of(&bin, "node-lamina-baseline")?;
            let m = dir.join("claim-baseline");
            let c = claim(&b, size, &m)?;
            Some((c, b, m))
        }
        None => None,
    };

    let mut targets = vec![
        (HOST, Target::File(host.join("fio.dat"), work)),
        (EXT4, Target::File(mnt.join("fio.dat"), work)),
        (LOOP, Target::File(PathBuf::from(&raw_loop.0), work)),
        (FILE, Target::File(raw_file.clone(), work)),
        (BOUND, Target::File(bound_mnt.join("fio.dat"), work)),
    ];
    if let Some((_, _, m)) = &baseline {
        targets.push((BASELINE, Target::File(m.join("fio.dat"), work)));
    }
    for (_, t) in &targets {
        fill(t, work)?;
    }
    let jobs = crate::suite::cases::io::jobs(ctx.p.seconds);
    crate::suite::cases::io::rounds(ctx, CASE, &targets, &jobs)?;
    for (label, _) in &jobs {
        // Issue 40: a claim gives a pod at least 0.8x of what a hostPath
        // volume on the same disk gives it.
        ctx.rec.compare(
            CASE,
            &format!("{label}: claim vs hostPath"),
            label,
            EXT4,
            HOST,
            Some(0.8),
        );
        if let Some(bin) = &ctx.baseline_bin {
            ctx.rec.compare(
                CASE,
                &format!(
                    "{label}: claim, this build vs the baseline ({})",
                    bin.display()
                ),
                label,
                EXT4,
                BASELINE,
                None,
            );
        }
        ctx.rec.compare(
            CASE,
            &format!("{label}: claim vs the loop bound"),
            label,
            EXT4,
            BOUND,
            None,
        );
        for hop in [LOOP, FILE, BOUND] {
            ctx.rec.compare(
                CASE,
                &format!("{label}: {hop} vs hostPath"),
                label,
                hop,
                HOST,
                None,
            );
        }
    }
    ctx.rec.note(
        CASE,
        format!(
            "fio with io_uring and O_DIRECT on {} MiB of each target, written whole first: a file in ext4 on a loop device \
             (losetup --direct-io=on) over the daemon's file of a {} MiB volume, as the node plugin stages a claim; a file in \
             a directory of the host's filesystem (a hostPath volume); the hops alone: the loop device, the daemon's file; \
             and the same ext4 on a loop device over a file of the host's filesystem, nothing of Lamina in the path: the \
             bound of any claim staged through a loop device.",
            work >> 20,
            size >> 20
        ),
    );
    Ok(())
}
