//! Filesystems on a volume's device: what blkid finds there, making one
//! only where there is nothing, mounting it, and growing it to the device.

use super::exec::{self, QUICK, SLOW};
use super::{sys, Error};
use std::path::Path;
use tonic::Status;

/// The filesystem made when the CO asks for none.
pub const DEFAULT_FS: &str = "ext4";

/// What the start of a device holds.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    Nothing,
    Filesystem(String),
    /// A partition table, RAID member, LUKS header, ...: never formatted over.
    Other(String),
}

/// Read blkid's low-level probe (`-p`, no cache) of a device.
pub async fn probe(dev: &Path) -> Result<Found, Status> {
    let d = dev.to_string_lossy();
    let args = ["-p", "-o", "export", &d];
    let o = exec::output("blkid", &args, QUICK).await?;
    match o.code {
        Some(0) => Ok(parse_probe(&o.stdout)),
        // blkid's "nothing was found".
        Some(2) => Ok(Found::Nothing),
        _ => Err(Status::failed_precondition(format!(
            "cannot tell what {d} holds, so it is not formatted: {}",
            exec::failed("blkid", &args, &o)
        ))),
    }
}

/// blkid's `KEY=value` lines as what was found.
pub fn parse_probe(text: &str) -> Found {
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
            .map(str::to_string)
    };
    if let Some(pt) = get("PTTYPE") {
        return Found::Other(format!("a {pt} partition table"));
    }
    match (get("TYPE"), get("USAGE").as_deref()) {
        (Some(t), Some("filesystem") | None) => Found::Filesystem(t),
        (Some(t), Some(u)) => Found::Other(format!("{t} ({u})")),
        (None, _) => Found::Nothing,
    }
}

/// Make a filesystem on a device blkid found empty.
pub async fn make(fs: &str, dev: &Path) -> Result<(), Status> {
    let d = dev.to_string_lossy();
    // No discard: the volume is thin and new, and discarding all of it
    // through the NBD export only costs time.
    let (prog, args): (&str, Vec<&str>) = match fs {
        "ext4" => ("mkfs.ext4", vec!["-F", "-q", "-E", "nodiscard", &d]),
        "xfs" => ("mkfs.xfs", vec!["-q", "-K", &d]),
        other => {
            return Err(Status::invalid_argument(format!(
                "filesystem {other:?} is not supported (ext4 or xfs)"
            )))
        }
    };
    if !exec::on_path(prog) {
        return Err(Status::failed_precondition(format!(
            "{prog} is not installed on this node (package {})",
            if fs == "xfs" { "xfsprogs" } else { "e2fsprogs" }
        )));
    }
    tracing::info!(dev = %d, fs, "making a filesystem");
    exec::run(prog, &args, SLOW).await?;
    Ok(())
}

/// The options a filesystem is mounted with: the CO's flags, `ro` for a
/// read-only access mode, and `nouuid` for xfs (a clone or a restored
/// snapshot has its source's filesystem UUID, and xfs refuses a second
/// mount of one UUID otherwise).
pub fn mount_options(fs: &str, flags: &[String], read_only: bool) -> Vec<String> {
    let mut o: Vec<String> = flags.to_vec();
    if read_only && !o.iter().any(|f| f == "ro") {
        o.push("ro".into());
    }
    if fs == "xfs" && !o.iter().any(|f| f == "nouuid") {
        o.push("nouuid".into());
    }
    o
}

pub async fn mount(fs: &str, dev: &Path, at: &Path, options: &[String]) -> Result<(), Error> {
    let d = dev.to_string_lossy();
    let a = at.to_string_lossy();
    let opts = options.join(",");
    let mut args = vec!["-t", fs];
    if !opts.is_empty() {
        args.extend(["-o", &opts]);
    }
    args.extend([&*d, &*a]);
    exec::run("mount", &args, QUICK).await?;
    Ok(())
}

/// Unmount everything stacked at `path`.
pub async fn unmount_all(path: &Path) -> Result<(), Error> {
    let p = path.to_string_lossy();
    // Bounded: each round removes one mount or fails.
    for _ in 0..16 {
        if sys::mount_at(path)?.is_none() {
            return Ok(());
        }
        exec::run("umount", &[&p], QUICK).await?;
    }
    Err(Error::Busy(format!(
        "{p} is still mounted after 16 unmounts"
    )))
}

/// The size in bytes an ext4 filesystem covers (its superblock).
async fn ext4_size(dev: &Path) -> Result<u64, Error> {
    let d = dev.to_string_lossy();
    let out = exec::run("dumpe2fs", &["-h", &d], QUICK).await?;
    let field = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    match (field("Block count:"), field("Block size:")) {
        (Some(n), Some(b)) => Ok(n * b),
        _ => Err(Error::Command {
            cmd: format!("dumpe2fs -h {d}"),
            code: Some(0),
            stderr: "no block count or block size in its output".into(),
        }),
    }
}

fn is_ext(fs: &str) -> bool {
    matches!(fs, "ext4" | "ext3" | "ext2")
}

/// Whether an ext filesystem is smaller than its device (by at least one
/// 4 KiB block).
async fn ext_smaller(dev: &Path) -> Result<bool, Error> {
    let size = sys::device_size(sys::rdev(dev)?)?;
    Ok(ext4_size(dev).await? + 4096 <= size)
}

/// Grow an unmounted ext filesystem to its device, checking it first (as
/// offline resize2fs requires). Offline growth needs no CAP_SYS_RESOURCE,
/// which online ext4 growth does; staging, where a volume expanded while
/// unstaged first shows its new size, grows this way. Other filesystems
/// are grown once mounted ([`grow`]).
pub async fn grow_unmounted(fs: &str, dev: &Path) -> Result<(), Error> {
    if !is_ext(fs) || !ext_smaller(dev).await? {
        return Ok(());
    }
    let d = dev.to_string_lossy();
    tracing::info!(dev = %d, "checking the filesystem before growing it");
    let args = ["-f", "-p", &*d];
    let o = exec::output("e2fsck", &args, SLOW).await?;
    // 0: clean; 1: errors corrected. Anything else is left to a person.
    if !matches!(o.code, Some(0 | 1)) {
        return Err(exec::failed("e2fsck", &args, &o));
    }
    tracing::info!(dev = %d, "growing the ext4 filesystem to its device");
    exec::run("resize2fs", &[&d], SLOW).await?;
    Ok(())
}

/// Grow the filesystem mounted at `mount_point` from `dev` to the device's
/// size, when the device is larger (by at least one 4 KiB block).
pub async fn grow(fs: &str, dev: &Path, mount_point: &Path) -> Result<(), Error> {
    match fs {
        "ext4" | "ext3" | "ext2" => {
            if !ext_smaller(dev).await? {
                return Ok(());
            }
            let size = sys::device_size(sys::rdev(dev)?)?;
            tracing::info!(dev = %dev.display(), size, "growing the ext4 filesystem");
            exec::run("resize2fs", &[&dev.to_string_lossy()], SLOW).await?;
        }
        "xfs" => {
            // Growing an xfs that fills its device already does nothing.
            exec::run("xfs_growfs", &[&mount_point.to_string_lossy()], SLOW).await?;
        }
        other => tracing::warn!(fs = other, "cannot grow this filesystem; left as it is"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blkid_output_says_what_is_there() {
        let ext4 = "DEVNAME=/dev/loop0\nUUID=13\nBLOCK_SIZE=4096\nTYPE=ext4\nUSAGE=filesystem\n";
        assert_eq!(parse_probe(ext4), Found::Filesystem("ext4".into()));
        let gpt = "DEVNAME=/dev/loop0\nPTUUID=ab\nPTTYPE=gpt\n";
        assert!(matches!(parse_probe(gpt), Found::Other(_)));
        let luks = "DEVNAME=/dev/loop0\nTYPE=crypto_LUKS\nUSAGE=crypto\n";
        assert!(matches!(parse_probe(luks), Found::Other(_)));
        assert_eq!(parse_probe("DEVNAME=/dev/loop0\n"), Found::Nothing);
        // PTTYPE must not be read as TYPE.
        assert!(matches!(parse_probe("PTTYPE=dos\n"), Found::Other(_)));
    }

    #[test]
    fn mount_options_add_ro_and_nouuid_once() {
        let f = vec!["noatime".to_string()];
        assert_eq!(mount_options("ext4", &f, false), vec!["noatime"]);
        assert_eq!(mount_options("ext4", &f, true), vec!["noatime", "ro"]);
        assert_eq!(mount_options("xfs", &[], false), vec!["nouuid"]);
        assert_eq!(
            mount_options("xfs", &["nouuid".into(), "ro".into()], true),
            vec!["nouuid", "ro"]
        );
    }
}
