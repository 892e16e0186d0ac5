//! What the kernel says is there: mounts (/proc/self/mountinfo), loop
//! devices and their backing files (/sys/block/loop*), kernel NBD devices,
//! processes (/proc/PID), device sizes and filesystem usage. The node
//! service reconciles its records with these on every call.

use super::Error;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// One line of /proc/self/mountinfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// The device (major, minor) of the mounted filesystem.
    pub dev: (u32, u32),
    /// The directory of that filesystem mounted here (`/` unless a bind).
    pub root: String,
    pub mount_point: PathBuf,
    /// The per-mount options (`rw` or `ro`, ...).
    pub options: Vec<String>,
    pub fs_type: String,
    pub source: String,
}

impl Mount {
    pub fn read_only(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }
}

/// Undo mountinfo's octal escapes (`\040` for a space, ...).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let v = oct.iter().fold(0u32, |a, c| a * 8 + u32::from(c - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parse mountinfo text; lines that do not parse are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            if f.len() < 6 || r.len() < 2 {
                return None;
            }
            let (maj, min) = f[2].split_once(':')?;
            Some(Mount {
                dev: (maj.parse().ok()?, min.parse().ok()?),
                root: unescape(f[3]),
                mount_point: PathBuf::from(unescape(f[4])),
                options: f[5].split(',').map(str::to_string).collect(),
                fs_type: r[0].to_string(),
                source: unescape(r[1]),
            })
        })
        .collect()
}

/// The mounts of this process's mount namespace.
pub fn mounts() -> Result<Vec<Mount>, Error> {
    let p = "/proc/self/mountinfo";
    let text = std::fs::read_to_string(p).map_err(|e| Error::io("read", p, e))?;
    Ok(parse_mountinfo(&text))
}

/// A path as mountinfo would show it: absolute, symlinks resolved when it
/// exists.
pub fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The topmost mount at `path`, if any.
pub fn mount_at(path: &Path) -> Result<Option<Mount>, Error> {
    let want = canonical(path);
    Ok(mounts()?.into_iter().rev().find(|m| m.mount_point == want))
}

/// The device number of a block device node.
pub fn rdev(dev: &Path) -> Result<(u32, u32), Error> {
    let m = std::fs::metadata(dev).map_err(|e| Error::io("stat", dev, e))?;
    if !m.file_type().is_block_device() {
        return Err(Error::io(
            "use",
            dev,
            std::io::Error::other("not a block device"),
        ));
    }
    let r = m.rdev();
    Ok((libc::major(r), libc::minor(r)))
}

/// The size in bytes of the block device with this number.
pub fn device_size(dev: (u32, u32)) -> Result<u64, Error> {
    let p = format!("/sys/dev/block/{}:{}/size", dev.0, dev.1);
    let text = std::fs::read_to_string(&p).map_err(|e| Error::io("read", &p, e))?;
    let sectors: u64 = text
        .trim()
        .parse()
        .map_err(|_| Error::io("parse", &p, std::io::Error::other(text.trim().to_string())))?;
    Ok(sectors * 512)
}

/// Every loop device set up over `file`: named by its path, or, whatever
/// name the kernel gives it, reading the very file now at `file` (same
/// device and inode). A loop device set up through a copy of the file's
/// mount in another mount namespace (the node plugin's container) is named
/// "/" once that namespace is gone, so the path alone would miss it; the
/// device and inode of a mounted file belong to it alone while it is
/// mounted.
pub fn loops_over(file: &Path) -> Vec<PathBuf> {
    let want = file.as_os_str().as_encoded_bytes();
    let id = file_id(file);
    let Ok(dir) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in dir.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(b) = std::fs::read(e.path().join("loop/backing_file")) else {
            continue;
        };
        let b = b.strip_suffix(b"\n").unwrap_or(&b);
        let dev = PathBuf::from(format!("/dev/{name}"));
        if b == want || (id.is_some() && loop_backing(&dev) == id) {
            found.push(dev);
        }
    }
    found.sort();
    found
}

/// A loop device's sequence number (`diskseq`), while it is set up: the
/// kernel gives a new one at every setup, so a device number another
/// volume's loop device took since is told apart. `None` on a kernel
/// without it (before 5.15).
pub fn loop_seq(dev: &Path) -> Option<u64> {
    let name = dev.file_name()?;
    if !loop_in_use(dev) {
        return None;
    }
    let p = Path::new("/sys/block").join(name).join("diskseq");
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// `struct loop_info64` (`linux/loop.h`), as `LOOP_GET_STATUS64` fills it.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `LOOP_GET_STATUS64`.
const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;

/// The device and inode of the file a loop device reads, as the kernel
/// holds it: a file served again at the same path (a new mount) is another
/// file, which the path alone would not tell.
pub fn loop_backing(dev: &Path) -> Option<(u64, u64)> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(dev).ok()?;
    // SAFETY: all-zero bytes are a valid LoopInfo64 (integers and arrays).
    let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
    // SAFETY: the ioctl writes one loop_info64 into `info`, which is that
    // struct's size and layout and lives for the call.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), LOOP_GET_STATUS64, &mut info) };
    (r == 0).then_some((info.lo_device, info.lo_inode))
}

/// The device and inode of a file, to compare with [`loop_backing`].
pub fn file_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Whether a loop device is still set up (has a backing file).
pub fn loop_in_use(dev: &Path) -> bool {
    let Some(name) = dev.file_name() else {
        return false;
    };
    Path::new("/sys/block")
        .join(name)
        .join("loop/backing_file")
        .exists()
}

/// Whether the kernel NBD device is connected.
pub fn nbd_connected(dev: &Path) -> bool {
    let Some(name) = dev.file_name() else {
        return false;
    };
    Path::new("/sys/block").join(name).join("pid").exists()
}

/// The first kernel NBD device not connected, if the module is loaded.
pub fn free_nbd() -> Option<PathBuf> {
    (0..1024)
        .map(|i| format!("nbd{i}"))
        .take_while(|n| Path::new("/sys/block").join(n).exists())
        .find(|n| !Path::new("/sys/block").join(n).join("pid").exists())
        .map(|n| PathBuf::from(format!("/dev/{n}")))
}

/// Whether process `pid` is running (not a zombie) with `arg` among its
/// arguments: a pid alone could have been reused by another process.
pub fn process_alive(pid: u32, arg: &str) -> bool {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let Ok(stat) = std::fs::read_to_string(proc.join("stat")) else {
        return false;
    };
    // The state follows the command name's closing parenthesis.
    let zombie = stat
        .rsplit_once(')')
        .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']));
    if zombie {
        return false;
    }
    std::fs::read(proc.join("cmdline"))
        .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == arg.as_bytes()))
}

/// A running process whose program is `prog` with `arg` among its
/// arguments (found by scanning /proc), when no record names its pid.
pub fn find_process(prog: &str, arg: &str) -> Option<u32> {
    let dir = std::fs::read_dir("/proc").ok()?;
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(c) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let mut args = c.split(|b| *b == 0);
        let is_prog = args
            .next()
            .is_some_and(|a0| a0 == prog.as_bytes() || a0.ends_with(format!("/{prog}").as_bytes()));
        if is_prog && args.any(|a| a == arg.as_bytes()) && process_alive(pid, arg) {
            return Some(pid);
        }
    }
    None
}

/// Bytes and inodes of the filesystem holding `path`.
#[derive(Clone, Copy, Debug)]
pub struct Usage {
    pub bytes_total: u64,
    pub bytes_available: u64,
    pub bytes_used: u64,
    pub inodes_total: u64,
    pub inodes_available: u64,
    pub inodes_used: u64,
}

pub fn statvfs(path: &Path) -> Result<Usage, Error> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::io("statvfs", path, std::io::Error::other("NUL in path")))?;
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path that outlives the call, and `s`
    // is a valid, writable statvfs the call fills in.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
    if rc != 0 {
        return Err(Error::io("statvfs", path, std::io::Error::last_os_error()));
    }
    let f = s.f_frsize as u64;
    Ok(Usage {
        bytes_total: s.f_blocks as u64 * f,
        bytes_available: s.f_bavail as u64 * f,
        bytes_used: (s.f_blocks as u64).saturating_sub(s.f_bfree as u64) * f,
        inodes_total: s.f_files as u64,
        inodes_available: s.f_favail as u64,
        inodes_used: (s.f_files as u64).saturating_sub(s.f_ffree as u64),
    })
}

/// Send `sig` to `pid`.
pub fn signal(pid: u32, sig: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    // Callers check first that `pid` is the process they mean (its
    // arguments name the volume's own FUSE file).
    unsafe { libc::kill(pid, sig) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_parse_with_escapes_and_optional_fields() {
        let text = "\
42 27 0:39 / /tmp/nx/f rw,nosuid,nodev,relatime shared:5 - fuse /dev/fuse rw,user_id=0
43 27 7:0 / /var/lib/a\\040b rw,relatime - ext4 /dev/loop0 rw
44 27 0:5 /loop0 /pods/x/dev ro,relatime - devtmpfs udev rw
garbage line
";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].dev, (0, 39));
        assert_eq!(m[0].fs_type, "fuse");
        assert_eq!(m[1].mount_point, PathBuf::from("/var/lib/a b"));
        assert_eq!(m[1].source, "/dev/loop0");
        assert!(!m[1].read_only());
        assert_eq!(m[2].root, "/loop0");
        assert!(m[2].read_only());
    }

    #[test]
    fn unescape_leaves_other_backslashes() {
        assert_eq!(unescape("a\\134b"), "a\\b");
        assert_eq!(unescape("a\\x"), "a\\x");
        assert_eq!(unescape("end\\04"), "end\\04");
    }
}
