//! The files a pool lives in, behind a small trait so that tests can swap the
//! real filesystem for [`crate::sim`], which simulates power cuts and failing
//! disks. The engine only ever needs positional reads and writes, a durability
//! barrier, hole punching and preallocation.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// One file of a pool.
#[allow(clippy::len_without_is_empty)]
pub trait BlockFile: Send + Sync {
    /// Where the file lives, for error messages.
    fn path(&self) -> &Path;
    /// Fill `buf` from `offset`; bytes past the end of the file read as zero.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Write all of `buf` at `offset`, growing the file if needed.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Write all of `buf` at `offset` like [`BlockFile::write_at`], but
    /// around the page cache where the file system allows it (`O_DIRECT`):
    /// for bulk data nobody is about to read (a clone's or a restore's
    /// copy), which would otherwise push the volumes' hot pages out and
    /// leave the next `sync` gigabytes to write. The same contract as
    /// `write_at`: readable at once, durable only after `sync`.
    fn write_direct(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(buf, offset)
    }
    /// Write volume data through the page cache like
    /// [`BlockFile::write_at`], in pieces sized so that later small writes
    /// into the same pages stay cheap (see `CACHED_PIECE`). The same
    /// contract as `write_at`. The log's appends use plain `write_at`: they
    /// are written once, whole, and a split only adds system calls to a
    /// commit.
    fn write_cached(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(buf, offset)
    }
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
        Ok(Arc::new(OsFile {
            file,
            path,
            direct: OnceLock::new(),
        }))
    }
}

/// A file of the real filesystem.
pub struct OsFile {
    file: File,
    path: PathBuf,
    /// A second descriptor opened with `O_DIRECT` on first use; `None` when
    /// the file system refuses it (tmpfs) or `/proc` is missing, and
    /// `write_direct` then writes through the page cache.
    direct: OnceLock<Option<File>>,
}

/// `O_DIRECT` needs the buffer, the offset and the length aligned to the
/// device's logical block; 4 KiB covers every device Lamina runs on (and is
/// the engine's block). Anything else goes through the page cache.
const DIRECT_ALIGN: usize = 4096;

/// Largest write handed to `O_DIRECT` at once (the bounce buffer's size).
const DIRECT_MAX: usize = 1 << 20;

/// Largest write handed to the page cache at once, in pieces aligned to
/// their own size in the file. Why: ext4 (Linux 6.16 and later) caches a
/// buffered write in a folio as large as the write (up to 2 MiB), and every
/// later 4 KiB write into that folio walks all of its buffer heads
/// (`ext4_block_write_begin`), as writeback does (`mpage_process_page_bufs`).
/// On a volume filled with 1 MiB writes that walk was 27 % of the daemon's
/// CPU under 4 KiB random writes. Pieces of 64 KiB keep it at 16 buffer
/// heads: random 4 KiB writes gained about a third, 1 MiB writes lost about
/// a fifth in side-by-side runs and 6 % in the bench's I/O case
/// (docs/design.md, "Client writes", has the figures).
const CACHED_PIECE: u64 = 64 << 10;

thread_local! {
    /// The aligned bounce buffer of this thread's direct writes: callers'
    /// buffers (a network frame, an NBD request) are not aligned, and a
    /// copy into memory already mapped costs far less than the page cache
    /// copy it replaces.
    static BOUNCE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl OsFile {
    /// The `O_DIRECT` descriptor, opened through `/proc/self/fd` so that it
    /// is the same file as `self.file` even if its path changed since.
    fn direct_fd(&self) -> Option<&File> {
        self.direct
            .get_or_init(|| {
                OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
                    .ok()
            })
            .as_ref()
    }

    /// One aligned piece (`buf.len()` a multiple of `DIRECT_ALIGN`, at most
    /// `DIRECT_MAX`) through `fd`: how many of its bytes went. Fewer than
    /// all when the kernel refused the alignment (`EINVAL`) or a short
    /// write left the rest unaligned; the caller writes the rest through
    /// the page cache.
    fn direct_piece(fd: &File, buf: &[u8], offset: u64) -> io::Result<usize> {
        BOUNCE.with(|b| {
            let mut b = b.borrow_mut();
            if b.len() < DIRECT_MAX + DIRECT_ALIGN {
                b.resize(DIRECT_MAX + DIRECT_ALIGN, 0);
            }
            let at = b.as_ptr().align_offset(DIRECT_ALIGN);
            let aligned = &mut b[at..at + buf.len()];
            // In 4 KiB pieces, below glibc's `rep movsb` threshold: with
            // that threshold raised (GLIBC_TUNABLES), the cross-node copy
            // on this project's AMD machines took 2.0-2.15 s instead of
            // 2.35-2.9 s, and most of its user-space copying is this one.
            for (d, s) in aligned.chunks_mut(4096).zip(buf.chunks(4096)) {
                d.copy_from_slice(s);
            }
            let mut done = 0;
            while done < aligned.len() {
                match fd.write_at(&aligned[done..], offset + done as u64) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => {
                        done += n;
                        if !n.is_multiple_of(DIRECT_ALIGN) {
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => break,
                    Err(e) => return Err(e),
                }
            }
            Ok(done)
        })
    }
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

    fn write_cached(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let (mut at, mut rest) = (offset, buf);
        while !rest.is_empty() {
            let n = rest.len().min((CACHED_PIECE - at % CACHED_PIECE) as usize);
            self.file.write_all_at(&rest[..n], at)?;
            at += n as u64;
            rest = &rest[n..];
        }
        Ok(())
    }

    fn write_direct(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let fd = match self.direct_fd() {
            Some(fd)
                if offset.is_multiple_of(DIRECT_ALIGN as u64)
                    && buf.len().is_multiple_of(DIRECT_ALIGN) =>
            {
                fd
            }
            _ => return self.write_at(buf, offset),
        };
        let mut at = offset;
        for piece in buf.chunks(DIRECT_MAX) {
            let n = OsFile::direct_piece(fd, piece, at)?;
            if n < piece.len() {
                self.file.write_all_at(&piece[n..], at + n as u64)?;
            }
            at += piece.len() as u64;
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// Direct writes read back through the page cache at once, whether
    /// aligned (around the cache), unaligned (through it) or over pages the
    /// cache holds dirty; what lies beside them is untouched. Cached
    /// writes split into pieces read back whole.
    #[test]
    fn direct_writes_read_back_like_buffered_ones() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("data");
        let os = OsFile {
            file: OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .unwrap(),
            path: path.clone(),
            direct: OnceLock::new(),
        };
        // Where this file system takes O_DIRECT, the direct path must be
        // the one taken (not a silent fall back to the page cache).
        let takes_direct = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .is_ok();
        assert_eq!(os.direct_fd().is_some(), takes_direct);
        let f: Arc<dyn BlockFile> = Arc::new(os);
        let mut model = vec![0u8; 6 << 20];
        let mut write = |f: &Arc<dyn BlockFile>, direct: bool, at: usize, data: Vec<u8>| {
            if direct {
                f.write_direct(&data, at as u64).unwrap();
            } else {
                f.write_cached(&data, at as u64).unwrap();
            }
            model[at..at + data.len()].copy_from_slice(&data);
            let mut back = vec![0u8; model.len()];
            f.read_at(&mut back, 0).unwrap();
            assert!(back == model, "after a write of {} at {at}", data.len());
        };
        // Buffered pages first, left dirty, then direct writes over them.
        write(&f, false, 0, pattern(3 << 20, 1));
        write(&f, true, 4096, pattern(2 << 20, 2));
        // More than one bounce buffer's worth, past the end of the file.
        write(&f, true, 3 << 20, pattern((2 << 20) + 8192, 3));
        // Unaligned offset and length: through the page cache.
        write(&f, true, 1000, pattern(5000, 4));
        write(&f, true, 8192, pattern(4095, 5));
        // A buffered write over direct data, then direct again.
        write(&f, false, 4096 + 17, pattern(100, 6));
        write(&f, true, 4096, pattern(4096, 7));
        // Cached writes that reach the page cache in pieces: from an
        // unaligned offset across several piece boundaries, ending inside
        // one; exactly one piece; a piece and a byte.
        let piece = CACHED_PIECE as usize;
        write(&f, false, piece - 10, pattern(3 * piece + 123, 8));
        write(&f, false, 2 * piece, pattern(piece, 9));
        write(&f, false, 5 * piece - 1, pattern(piece + 1, 10));
        f.sync().unwrap();
    }
}
