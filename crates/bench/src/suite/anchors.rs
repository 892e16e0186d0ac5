//! The alternatives Lamina is measured against, started the way a user
//! would start them: qemu-nbd serving a raw or qcow2 file, nbdkit's file
//! plugin on a raw file, and the files themselves.

use super::proc::{self, Server};
use anyhow::{Context, Result};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// qemu-nbd serving `file` (format `raw` or `qcow2`) on a unix socket,
/// with its defaults (writeback cache), for several clients in turn.
pub fn qemu_nbd(name: &str, file: &Path, format: &str, dir: &Path) -> Result<(Server, String)> {
    let sock = dir.join(format!("{name}.sock"));
    let s = Server::start(name, qemu_nbd_command(file, format, &sock), dir, &sock)?;
    Ok((s, qemu_nbd_uri(&sock)))
}

/// qemu-nbd serving a qcow2 `file` with extra driver options (`--image-opts`)
/// and flushes ignored (`--cache=unsafe`): for a case that measures what the
/// format stores, not how fast or how safely it stores it.
pub fn qemu_nbd_qcow2_opts(
    name: &str,
    file: &Path,
    opts: &str,
    dir: &Path,
) -> Result<(Server, String)> {
    let sock = dir.join(format!("{name}.sock"));
    let mut c = Command::new("qemu-nbd");
    c.args([
        "--persistent",
        "--shared=8",
        "--export-name=disk",
        "--cache=unsafe",
        "--image-opts",
        "-k",
    ])
    .arg(&sock)
    .arg(format!(
        "driver=qcow2,file.filename={},{opts}",
        file.display()
    ));
    let s = Server::start(name, c, dir, &sock)?;
    Ok((s, qemu_nbd_uri(&sock)))
}

/// The command `qemu_nbd` runs, for a case that starts it itself (to time
/// how soon it serves).
pub fn qemu_nbd_command(file: &Path, format: &str, sock: &Path) -> Command {
    let mut c = Command::new("qemu-nbd");
    c.args([
        "--persistent",
        "--shared=8",
        "--export-name=disk",
        "-f",
        format,
        "-k",
    ])
    .arg(sock)
    .arg(file);
    c
}

/// The URI of the export `qemu_nbd_command` serves on `sock`.
pub fn qemu_nbd_uri(sock: &Path) -> String {
    format!("nbd+unix:///disk?socket={}", sock.display())
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

/// A qcow2 copy of a raw file (every written cluster allocated), by
/// `qemu-img convert`; both paths as strings.
pub fn qcow2_from_raw(raw: &str, qcow2: &str) -> Result<()> {
    qemu_img(&["convert", "-f", "raw", "-O", "qcow2", raw, qcow2])?;
    Ok(())
}

/// Copy between two NBD URIs (or files) with nbdcopy, which skips holes.
pub fn nbdcopy(from: &str, to: &str) -> Result<()> {
    nbdcopy_with(&[], from, to)
}

/// The same with options (`--flush`, `--destination-is-zero`, ...).
pub fn nbdcopy_with(options: &[&str], from: &str, to: &str) -> Result<()> {
    proc::run(Command::new("nbdcopy").args(options).args(["--", from, to]))?;
    Ok(())
}

/// A qcow2 chain of external overlays, grown one layer at a time.
pub struct Chain {
    dir: PathBuf,
    pub layers: Vec<PathBuf>,
    size: u64,
}

impl Chain {
    /// A chain of one layer: a qcow2 copy of a raw file.
    pub fn from_raw(dir: &Path, raw: &Path, size: u64) -> Result<Chain> {
        let c = Chain {
            dir: dir.to_path_buf(),
            layers: vec![dir.join("layer-0000.qcow2")],
            size,
        };
        qcow2_from_raw(&raw.display().to_string(), &c.top().display().to_string())?;
        Ok(c)
    }

    pub fn depth(&self) -> usize {
        self.layers.len() - 1
    }

    pub fn top(&self) -> &Path {
        self.layers.last().unwrap()
    }

    /// A new empty overlay on top (what `blockdev-snapshot-sync` or
    /// `qemu-img snapshot`-less workflows make).
    pub fn push(&mut self) -> Result<()> {
        let next = self
            .dir
            .join(format!("layer-{:04}.qcow2", self.layers.len()));
        // -u: no need to open the whole chain to learn the size.
        qemu_img(&[
            "create",
            "-q",
            "-u",
            "-f",
            "qcow2",
            "-F",
            "qcow2",
            "-b",
            &super::path_str(self.top()),
            &super::path_str(&next),
            &self.size.to_string(),
        ])?;
        self.layers.push(next);
        Ok(())
    }

    pub fn serve(&self) -> Result<(Server, String)> {
        qemu_nbd("qemu-nbd-chain", self.top(), "qcow2", &self.dir)
    }

    /// Bytes the files of layers `from..` take on disk.
    pub fn allocated_from(&self, from: usize) -> Result<u64> {
        let mut n = 0;
        for l in &self.layers[from..] {
            n += std::fs::metadata(l)?.blocks() * 512;
        }
        Ok(n)
    }
}
