//! The alternatives Lamina is measured against, started the way a user
//! would start them: qemu-nbd serving a raw or qcow2 file, nbdkit's file
//! plugin on a raw file, and the files themselves.

use super::proc::{self, Server};
use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;
use std::process::Command;

/// qemu-nbd serving `file` (format `raw` or `qcow2`) on a unix socket,
/// with its defaults (writeback cache), for several clients in turn.
pub fn qemu_nbd(name: &str, file: &Path, format: &str, dir: &Path) -> Result<(Server, String)> {
    let sock = dir.join(format!("{name}.sock"));
    let mut c = Command::new("qemu-nbd");
    c.args([
        "--persistent",
        "--shared=8",
        "--export-name=disk",
        "-f",
        format,
        "-k",
    ])
    .arg(&sock)
    .arg(file);
    let s = Server::start(name, c, dir, &sock)?;
    Ok((s, format!("nbd+unix:///disk?socket={}", sock.display())))
}

/// nbdkit's file plugin on a raw file: the NBD protocol's ceiling here.
pub fn nbdkit_file(name: &str, file: &Path, dir: &Path) -> Result<(Server, String)> {
    let sock = dir.join(format!("{name}.sock"));
    let mut c = Command::new("nbdkit");
    c.args(["--foreground", "--exit-with-parent", "-U"])
        .arg(&sock)
        .arg("file")
        .arg(format!("file={}", file.display()));
    let s = Server::start(name, c, dir, &sock)?;
    Ok((s, format!("nbd+unix:///?socket={}", sock.display())))
}

/// A raw file of `size` bytes of incompressible data, every block written.
pub fn data_file(path: &Path, size: u64, seed: u64) -> Result<()> {
    let mut f =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        for w in buf.chunks_exact_mut(8) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            w.copy_from_slice(&s.to_le_bytes());
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    Ok(())
}

pub fn qemu_img(args: &[&str]) -> Result<String> {
    proc::run(Command::new("qemu-img").args(args))
}

/// Copy between two NBD URIs (or files) with nbdcopy, which skips holes.
pub fn nbdcopy(from: &str, to: &str) -> Result<()> {
    proc::run(Command::new("nbdcopy").args(["--", from, to]))?;
    Ok(())
}
