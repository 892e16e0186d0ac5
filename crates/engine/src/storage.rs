//! The files a pool lives in, behind a small trait so that tests can swap the
//! real filesystem for [`crate::sim`], which simulates power cuts and failing
//! disks. The engine only ever needs positional reads and writes, a durability
//! barrier, hole punching and preallocation.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// One file of a pool.
#[allow(clippy::len_without_is_empty)]
pub trait BlockFile: Send + Sync {
    /// Where the file lives, for error messages.
    fn path(&self) -> &Path;
    /// Fill `buf` from `offset`; bytes past the end of the file read as zero.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Write all of `buf` at `offset`, growing the file if needed.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// A hint that `len` bytes at `offset` are about to be read: on the
    /// real file system the kernel starts reading them into the page cache
    /// (`POSIX_FADV_WILLNEED`) and this returns at once. Nothing else may
    /// depend on it.
    fn will_need(&self, _offset: u64, _len: u64) {}
    /// Write all of `buf` at `offset` like [`BlockFile::write_at`], for
    /// bulk data nobody is about to read (a clone's or a restore's copy):
    /// on the real file system its writeback starts at once, and once more
    /// than a window of such data is behind it, the oldest is waited for
    /// and dropped from the page cache (see `BULK_WINDOW`). The same
    /// contract as `write_at`: readable at once, durable only after `sync`.
    fn write_bulk(&self, buf: &[u8], offset: u64) -> io::Result<()> {
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
    /// Write these ranges (offset, length) to the device and wait for
    /// them, without a barrier: it bounds what the next `sync` has to
    /// write, and promises no durability. An error is an I/O failure.
    fn write_out(&self, _ranges: &[(u64, u64)]) -> io::Result<()> {
        Ok(())
    }
    /// Durability barrier for everything written before the call.
    fn sync(&self) -> io::Result<()>;
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
    /// Open an existing file for reading only ([`ReadOnly`]).
    fn open_read(&self, name: &str) -> io::Result<Arc<dyn BlockFile>> {
        Ok(Arc::new(ReadOnly(self.open(name, false)?)))
    }
}

/// A file opened to be read and never written (`lamina pool check`): every
/// write, sync, punch and resize fails, naming the file, so that a bug can
/// never change the pool; reserving space ([`BlockFile::allocate`])
/// succeeds and does nothing, since no page will be written to it.
pub struct ReadOnly(pub Arc<dyn BlockFile>);

impl ReadOnly {
    fn refuse(&self, what: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{what} refused: {} is open read-only",
                self.0.path().display()
            ),
        )
    }
}

impl BlockFile for ReadOnly {
    fn path(&self) -> &Path {
        self.0.path()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_at(buf, offset)
    }

    fn write_at(&self, _buf: &[u8], _offset: u64) -> io::Result<()> {
        Err(self.refuse("write"))
    }

    fn will_need(&self, offset: u64, len: u64) {
        self.0.will_need(offset, len)
    }

    fn write_bulk(&self, _buf: &[u8], _offset: u64) -> io::Result<()> {
        Err(self.refuse("write"))
    }

    fn write_cached(&self, _buf: &[u8], _offset: u64) -> io::Result<()> {
        Err(self.refuse("write"))
    }

    fn write_out(&self, _ranges: &[(u64, u64)]) -> io::Result<()> {
        Err(self.refuse("writeback"))
    }

    fn sync(&self) -> io::Result<()> {
        Err(self.refuse("sync"))
    }

    fn punch(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Err(self.refuse("punch"))
    }

    fn allocate(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }

    fn set_len(&self, _len: u64) -> io::Result<()> {
        Err(self.refuse("resize"))
    }

    fn try_lock(&self) -> io::Result<()> {
        self.0.try_lock()
    }
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
        Ok(Arc::new(OsFile::new(file, path, BULK_WINDOW)))
    }

    fn open_read(&self, name: &str) -> io::Result<Arc<dyn BlockFile>> {
        let path = self.dir.join(name);
        let file = OpenOptions::new().read(true).open(&path)?;
        Ok(Arc::new(ReadOnly(Arc::new(OsFile::new(
            file,
            path,
            BULK_WINDOW,
        )))))
    }
}

/// A file of the real filesystem.
pub struct OsFile {
    file: File,
    path: PathBuf,
    /// Bulk writes whose writeback was started and not yet waited for.
    bulk: Mutex<Bulk>,
}

/// Most bulk data ([`BlockFile::write_bulk`]) left in the page cache:
/// written, its writeback started, not yet waited for. Why a window, not
/// `O_DIRECT`: direct writes one at a time leave the device one write deep
/// and copy slower than nbdcopy, where writeback keeps several large writes
/// in flight (docs/design.md, "Data movement"; the figures are in
/// docs/bench-history.md). Dropping written pages lets the next writes reuse them
/// instead of faulting in fresh memory, which on these virtual machines
/// costs a host page fault per page. The window bounds what a copy takes
/// of the page cache (the volumes' hot pages stay) and what the next
/// commit's sync has to write.
pub const BULK_WINDOW: u64 = 128 << 20;

/// Ranges of bulk data in the page cache, oldest first, and their total.
#[derive(Default)]
struct Bulk {
    ranges: VecDeque<(u64, u64)>,
    bytes: u64,
    /// The most `bytes` may reach.
    window: u64,
}

/// Largest write handed to the page cache at once, in pieces aligned to
/// their own size in the file. Why: ext4 (Linux 6.16 and later) caches a
/// buffered write in a folio as large as the write (up to 2 MiB), and every
/// later 4 KiB write into that folio walks all of its buffer heads
/// (`ext4_block_write_begin`), as writeback does (`mpage_process_page_bufs`).
/// On a volume filled with 1 MiB writes that walk dominates the daemon's
/// CPU under 4 KiB random writes. Pieces of 64 KiB keep it at 16 buffer
/// heads: random 4 KiB writes gain about a third, 1 MiB writes lose some
/// throughput (docs/design.md, "Client writes"; the figures are in
/// docs/bench-history.md).
const CACHED_PIECE: u64 = 64 << 10;

impl OsFile {
    fn new(file: File, path: PathBuf, window: u64) -> OsFile {
        OsFile {
            file,
            path,
            bulk: Mutex::new(Bulk {
                window,
                ..Bulk::default()
            }),
        }
    }

    /// `sync_file_range` over a range (`len` 0: to the end of the file),
    /// with `flags`. Its error never reads
    /// as a full disk, whatever the kernel said: waiting on writeback
    /// consumes the file's writeback error (the next `fdatasync` would not
    /// see it again), and it may be another write's data that failed, so
    /// the caller must take it for an I/O failure (the latch), not for a
    /// refusal that changed nothing.
    fn sync_range(&self, offset: u64, len: u64, flags: libc::c_uint) -> io::Result<()> {
        // SAFETY: sync_file_range only reads its integer arguments; the
        // descriptor is owned by `self.file`, which outlives the call.
        let rc = unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                offset as libc::off64_t,
                len as libc::off64_t,
                flags,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            let e = io::Error::last_os_error();
            Err(io::Error::other(match len {
                0 => format!("writeback from {offset} to the end: {e}"),
                _ => format!("writeback of {len} bytes at {offset}: {e}"),
            }))
        }
    }

    /// Wait for the writeback of a range of bulk data, then drop its pages
    /// from the cache (a hint: pages some reader mapped or dirtied again
    /// stay, and are still correct).
    fn retire(&self, offset: u64, len: u64) -> io::Result<()> {
        self.sync_range(
            offset,
            len,
            libc::SYNC_FILE_RANGE_WAIT_BEFORE
                | libc::SYNC_FILE_RANGE_WRITE
                | libc::SYNC_FILE_RANGE_WAIT_AFTER,
        )?;
        self.advise(offset, len, libc::POSIX_FADV_DONTNEED);
        Ok(())
    }

    /// `posix_fadvise` over a range. Advice only: its result is ignored.
    fn advise(&self, offset: u64, len: u64, advice: libc::c_int) {
        // SAFETY: posix_fadvise only reads its integer arguments; the
        // descriptor is owned by `self.file`, which outlives the call.
        unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                offset as libc::off_t,
                len as libc::off_t,
                advice,
            )
        };
    }

    /// Bulk data still held in the page cache by the window.
    #[cfg(test)]
    fn bulk_bytes(&self) -> u64 {
        self.bulk.lock().unwrap_or_else(|p| p.into_inner()).bytes
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

    fn will_need(&self, offset: u64, len: u64) {
        self.advise(offset, len, libc::POSIX_FADV_WILLNEED);
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

    fn write_bulk(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)?;
        let len = buf.len() as u64;
        self.sync_range(offset, len, libc::SYNC_FILE_RANGE_WRITE)?;
        // The oldest ranges past the window are taken out under the lock
        // and waited for outside it.
        let mut out = Vec::new();
        {
            let mut b = self.bulk.lock().unwrap_or_else(|p| p.into_inner());
            b.ranges.push_back((offset, len));
            b.bytes += len;
            while b.bytes > b.window {
                let Some((o, l)) = b.ranges.pop_front() else {
                    break;
                };
                b.bytes -= l;
                out.push((o, l));
            }
        }
        for (o, l) in out {
            self.retire(o, l)?;
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn write_out(&self, ranges: &[(u64, u64)]) -> io::Result<()> {
        // All of them in flight at once, then wait for each.
        for &(at, len) in ranges {
            self.sync_range(at, len, libc::SYNC_FILE_RANGE_WRITE)?;
        }
        for &(at, len) in ranges {
            self.sync_range(at, len, libc::SYNC_FILE_RANGE_WAIT_AFTER)?;
        }
        Ok(())
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

    /// A failed writeback wait comes back as an error that carries no OS
    /// code, so the latch can never take it for a full disk.
    #[test]
    fn a_writeback_error_never_reads_as_a_full_disk() {
        // sync_file_range refuses a character device (ESPIPE).
        let null = OpenOptions::new().write(true).open("/dev/null").unwrap();
        let os = OsFile::new(null, "/dev/null".into(), 1 << 20);
        let e = os.write_bulk(&[1; 4096], 0).unwrap_err();
        assert_eq!(e.raw_os_error(), None, "{e}");
        assert!(
            e.to_string().starts_with("writeback of 4096 bytes at 0"),
            "{e}"
        );
    }

    /// Bulk writes read back at once, over pages the cache holds dirty or
    /// not, aligned or not; what lies beside them is untouched; the window
    /// never holds more than its size. Cached writes split into pieces
    /// read back whole.
    #[test]
    fn bulk_writes_read_back_like_buffered_ones() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("data");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .unwrap();
        let window = 1 << 20;
        let os = Arc::new(OsFile::new(file, path, window));
        let f: Arc<dyn BlockFile> = os.clone();
        let mut model = vec![0u8; 6 << 20];
        let mut write = |f: &Arc<dyn BlockFile>, bulk: bool, at: usize, data: Vec<u8>| {
            if bulk {
                f.write_bulk(&data, at as u64).unwrap();
                // The newest write stays held if it fits the window.
                let (held, len) = (os.bulk_bytes(), data.len() as u64);
                assert!(held <= window, "{held} bytes held");
                assert!(len > window || held >= len, "{held} bytes held");
            } else {
                f.write_cached(&data, at as u64).unwrap();
            }
            model[at..at + data.len()].copy_from_slice(&data);
            let mut back = vec![0u8; model.len()];
            f.read_at(&mut back, 0).unwrap();
            assert!(back == model, "after a write of {} at {at}", data.len());
        };
        // Buffered pages first, left dirty, then bulk writes over them.
        write(&f, false, 0, pattern(3 << 20, 1));
        write(&f, true, 4096, pattern(2 << 20, 2));
        // More than the window, past the end of the file.
        write(&f, true, 3 << 20, pattern((2 << 20) + 8192, 3));
        // Unaligned offset and length.
        write(&f, true, 1000, pattern(5000, 4));
        write(&f, true, 8192, pattern(4095, 5));
        // A buffered write over bulk data, then bulk again.
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
