//! The kernel side of one FUSE connection: `/dev/fuse` opened, the
//! connection mounted on a regular file (the file is the mount's root,
//! `rootmode=100000`), more descriptors on the same connection
//! (`FUSE_DEV_IOC_CLONE`), unmounting, and aborting a connection through
//! the fusectl filesystem. No request is read or answered here.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// `FUSE_DEV_IOC_CLONE`: `_IOR(229, 0, uint32_t)`.
const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;
/// Where the fusectl filesystem lists connections.
const CONNECTIONS: &str = "/sys/fs/fuse/connections";

/// Why a file could not be mounted or let go.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// `/dev/fuse` could not be opened: the kernel has no FUSE, or this
    /// process may not use it.
    #[error("FUSE is not available here (/dev/fuse: {0})")]
    NoFuse(#[source] io::Error),
    #[error("cannot mount FUSE on {path}: {source}")]
    Mount {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Something (a loop device, an open descriptor) still uses the file.
    #[error("{path} is in use")]
    Busy { path: PathBuf },
    #[error("cannot unmount {path}: {source}")]
    Unmount {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A mounted connection: the first `/dev/fuse` descriptor and where it is
/// mounted. Dropping it unmounts nothing; the server decides.
#[derive(Debug)]
pub struct Mount {
    dev: File,
    path: PathBuf,
    conn: u32,
}

impl Mount {
    /// Mount a new connection on `path`, a regular file (created empty if
    /// it does not exist). Requests arrive on [`Mount::device`] from now
    /// on, INIT first; nothing on this thread waits for them.
    pub fn new(path: &Path, uid: u32, gid: u32) -> Result<Mount, MountError> {
        let dev = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open("/dev/fuse")
            .map_err(MountError::NoFuse)?;
        let failed = |source| MountError::Mount {
            path: path.to_path_buf(),
            source,
        };
        if !path.exists() {
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(path)
                .map_err(failed)?;
        }
        let target = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| failed(io::Error::from(io::ErrorKind::InvalidInput)))?;
        // `allow_other`: the loop device and whoever the daemon hands the
        // file to are other processes; the directory the files live in is
        // what keeps other users out (0700, the daemon's).
        let data = CString::new(format!(
            "fd={},rootmode=100000,user_id={uid},group_id={gid},allow_other",
            dev.as_raw_fd()
        ))
        .expect("no NUL in the options");
        // SAFETY: every pointer is a NUL-terminated string that outlives the
        // call; mount(2) reads them and keeps none.
        let r = unsafe {
            libc::mount(
                c"lamina".as_ptr(),
                target.as_ptr(),
                c"fuse.lamina".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                data.as_ptr().cast(),
            )
        };
        if r != 0 {
            return Err(failed(io::Error::last_os_error()));
        }
        let conn = connection_of(path).ok_or_else(|| {
            failed(io::Error::other(
                "mounted, but the mount is not in /proc/self/mountinfo",
            ))
        });
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                let _ = unmount(path, true);
                return Err(e);
            }
        };
        Ok(Mount {
            dev,
            path: path.to_path_buf(),
            conn,
        })
    }

    /// The connection's first descriptor.
    pub fn device(&self) -> &File {
        &self.dev
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The connection's number (its directory under fusectl).
    pub fn connection(&self) -> u32 {
        self.conn
    }

    /// Another descriptor on the same connection: requests are shared out
    /// among the readers of all of them, and a reply goes back on the
    /// descriptor its request was read from.
    pub fn clone_device(&self) -> io::Result<File> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open("/dev/fuse")?;
        let mut src: u32 = self.dev.as_raw_fd() as u32;
        // SAFETY: the ioctl reads one u32 (the source descriptor) from the
        // pointer, which is valid for the call.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), FUSE_DEV_IOC_CLONE, &mut src) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(f)
    }

    /// Take the descriptor and path (the server keeps them apart).
    pub fn into_parts(self) -> (File, PathBuf, u32) {
        (self.dev, self.path, self.conn)
    }
}

/// Unmount `path`; `lazy` detaches it at once even while in use (the
/// connection lives on until its last user lets go). Without `lazy`, a
/// file in use answers [`MountError::Busy`] and stays mounted.
pub fn unmount(path: &Path, lazy: bool) -> Result<(), MountError> {
    let target = CString::new(path.as_os_str().as_bytes()).map_err(|_| MountError::Unmount {
        path: path.to_path_buf(),
        source: io::Error::from(io::ErrorKind::InvalidInput),
    })?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: `target` is a NUL-terminated string alive for the call.
    let r = unsafe { libc::umount2(target.as_ptr(), flags) };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EBUSY) {
        return Err(MountError::Busy {
            path: path.to_path_buf(),
        });
    }
    Err(MountError::Unmount {
        path: path.to_path_buf(),
        source: e,
    })
}

/// The FUSE connection mounted on `path`, if a FUSE filesystem is mounted
/// there (the last such mount in this process's mount namespace).
pub fn connection_of(path: &Path) -> Option<u32> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = path.as_os_str().as_bytes();
    let mut found = None;
    for line in info.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        // id parent major:minor root mountpoint options ... - fstype source
        let Some(dash) = f.iter().position(|x| *x == "-") else {
            continue;
        };
        if f.len() < 5 || dash + 1 >= f.len() || !f[dash + 1].starts_with("fuse") {
            continue;
        }
        if unescape(f[4]) != want {
            continue;
        }
        let minor = f[2].split(':').nth(1)?.parse().ok()?;
        found = Some(minor);
    }
    found
}

/// Whether a FUSE filesystem is mounted on `path`.
pub fn is_mounted(path: &Path) -> bool {
    connection_of(path).is_some()
}

/// Abort connection `conn`: every request waiting on it fails at once
/// (`ENOTCONN`), and every later one too. For a server that is gone or
/// stuck; the mount itself stays until unmounted.
pub fn abort(conn: u32) -> io::Result<()> {
    let dir = Path::new(CONNECTIONS);
    if !dir.join(conn.to_string()).exists() {
        // fusectl is not mounted in this namespace: mount it (it is one
        // filesystem for the whole host).
        // SAFETY: NUL-terminated literals, alive for the call.
        unsafe {
            libc::mount(
                c"fusectl".as_ptr(),
                c"/sys/fs/fuse/connections".as_ptr(),
                c"fusectl".as_ptr(),
                0,
                std::ptr::null(),
            );
        }
    }
    std::fs::write(dir.join(conn.to_string()).join("abort"), b"1")
}

/// Undo mountinfo's octal escapes (`\040` for a space, and so on).
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape(r"/a\040b"), b"/a b");
        assert_eq!(unescape(r"/a\\"), br"/a\\");
        assert_eq!(unescape("/plain"), b"/plain");
    }
}
