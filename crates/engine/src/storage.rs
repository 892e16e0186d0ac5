//! The files a pool lives in, behind a small trait so that tests can swap the
//! real filesystem for [`crate::sim`], which simulates power cuts and failing
//! disks. The engine only ever needs positional reads and writes, a durability
//! barrier, hole punching and preallocation.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One file of a pool.
#[allow(clippy::len_without_is_empty)]
pub trait BlockFile: Send + Sync {
    /// Where the file lives, for error messages.
    fn path(&self) -> &Path;
    /// Fill `buf` from `offset`; bytes past the end of the file read as zero.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Write all of `buf` at `offset`, growing the file if needed.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Durability barrier for everything written before the call.
    fn sync(&self) -> io::Result<()>;
    /// Start writing dirty data back without waiting for it, so that the
    /// next `sync` has less to do. A hint: it promises nothing.
    fn start_writeback(&self) -> io::Result<()> {
        Ok(())
    }
    /// Deallocate a range; it reads as zeros afterwards.
    fn punch(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Reserve disk space for a range so later writes to it cannot hit ENOSPC.
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Truncate or extend.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Take an exclusive lock for as long as this file stays open, failing
    /// at once (`WouldBlock`) if another open file holds it.
    fn try_lock(&self) -> io::Result<()> {
        Ok(())
    }
}

/// Opens the files of one pool by name.
pub trait Backend: Send + Sync {
    /// A description of where the pool lives (its directory).
    fn location(&self) -> &Path;
    /// Whether a file of that name exists.
    fn exists(&self, name: &str) -> bool;
    /// Open (and with `create`, create) a file.
    fn open(&self, name: &str, create: bool) -> io::Result<Arc<dyn BlockFile>>;
}

/// A pool in a directory of the real filesystem.
pub struct DirBackend {
    dir: PathBuf,
}

impl DirBackend {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        DirBackend { dir: dir.into() }
    }
}

impl Backend for DirBackend {
    fn location(&self) -> &Path {
        &self.dir
    }

    fn exists(&self, name: &str) -> bool {
        self.dir.join(name).exists()
    }

    fn open(&self, name: &str, create: bool) -> io::Result<Arc<dyn BlockFile>> {
        let path = self.dir.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(&path)?;
        if create {
            // Make the new directory entry itself durable.
            File::open(&self.dir)?.sync_all()?;
        }
        Ok(Arc::new(OsFile { file, path }))
    }
}

/// A file of the real filesystem.
pub struct OsFile {
    file: File,
    path: PathBuf,
}

fn fallocate(file: &File, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: fallocate only reads its integer arguments; the descriptor is
    // owned by `file`, which outlives the call.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            mode,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl BlockFile for OsFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => {
                    buf[done..].fill(0);
                    return Ok(());
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn start_writeback(&self) -> io::Result<()> {
        // SAFETY: sync_file_range only reads its integer arguments; the
        // descriptor is owned by `self.file`, which outlives the call.
        let rc = unsafe {
            libc::sync_file_range(self.file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE)
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        match fallocate(
            &self.file,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        ) {
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                // A filesystem without hole punching: write zeros instead so
                // freed data never leaks into a later allocation.
                let zeros = vec![0u8; len.min(1 << 20) as usize];
                let mut at = offset;
                while at < offset + len {
                    let n = (offset + len - at).min(zeros.len() as u64) as usize;
                    self.file.write_all_at(&zeros[..n], at)?;
                    at += n as u64;
                }
                Ok(())
            }
            r => r,
        }
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        match fallocate(&self.file, 0, offset, len) {
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
            r => r,
        }
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn try_lock(&self) -> io::Result<()> {
        // SAFETY: flock only reads its integer arguments; the descriptor is
        // owned by `self.file`, which outlives the call.
        let rc = unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}
