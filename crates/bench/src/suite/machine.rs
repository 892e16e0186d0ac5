//! What machine a run was on: enough to tell two reports apart.

use super::proc;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

fn first_line(cmd: &mut Command) -> String {
    proc::run(cmd)
        .ok()
        .and_then(|s| s.lines().next().map(|l| l.trim().to_string()))
        .unwrap_or_else(|| "unknown".into())
}

fn meminfo_gib() -> f64 {
    let s = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .unwrap_or(0.0)
        / (1024.0 * 1024.0)
}

fn cpu_model() -> String {
    let s = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|m| m.trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// Bytes free to an unprivileged writer on the filesystem holding `path`,
/// or None if statvfs fails.
pub fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is a C struct of integers, for which all zeroes is a
    // valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statvfs
    // that the call fills in; both outlive the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

pub fn describe(work: &Path) -> Value {
    let fs = first_line(
        Command::new("findmnt")
            .args(["-no", "FSTYPE,SOURCE", "-T"])
            .arg(work),
    );
    json!({
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu": cpu_model(),
        "memory_gib": (meminfo_gib() * 10.0).round() / 10.0,
        "filesystem": fs,
        "work_dir": work.display().to_string(),
        "free_gib_at_start": free_bytes(work).map(|b| (b as f64 / (1u64 << 30) as f64 * 10.0).round() / 10.0),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "date": first_line(Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])),
        "lamina_commit": first_line(Command::new("git").args(["rev-parse", "--short", "HEAD"])),
        "tools": {
            "fio": first_line(Command::new("fio").arg("--version")),
            "qemu-nbd": first_line(Command::new("qemu-nbd").arg("--version")),
            "qemu-img": first_line(Command::new("qemu-img").arg("--version")),
            "qemu-storage-daemon": first_line(Command::new("qemu-storage-daemon").arg("--version")),
            "nbdkit": first_line(Command::new("nbdkit").arg("--version")),
            "nbdcopy": first_line(Command::new("nbdcopy").arg("--version")),
        },
    })
}
