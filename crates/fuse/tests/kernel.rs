//! The FUSE server against the real kernel: files mounted with `/dev/fuse`,
//! read and written with plain system calls from this process and through
//! a loop device. Needs root and FUSE (CI has both).
//!
//! No test may hang the run: each one arms a watchdog that aborts its FUSE
//! connection after a minute (every request waiting on it fails at once)
//! and, if the test is still not done, ends the process. Teardown goes in
//! the order that cannot deadlock: loop devices first, then the server.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use lamina_blockio::testing::{Gated, MemDevice};
use lamina_blockio::{BlockIo, Caps, Completion, IoError, IoErrorKind, IoOp};
use lamina_fuse::{FileServer, MountError, Options};

const MIB: u64 = 1 << 20;

/// Aborts the connection if the test runs past a minute, and ends the
/// process if that did not unstick it.
struct Watchdog(Option<mpsc::Sender<()>>);

impl Watchdog {
    fn arm(conn: u32, what: &'static str) -> Watchdog {
        let (tx, rx) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            if rx.recv_timeout(Duration::from_secs(60)) != Err(mpsc::RecvTimeoutError::Timeout) {
                return;
            }
            eprintln!("{what}: still running after 60 s; aborting FUSE connection {conn}");
            let _ = lamina_fuse::abort(conn);
            if rx.recv_timeout(Duration::from_secs(20)) == Err(mpsc::RecvTimeoutError::Timeout) {
                eprintln!("{what}: still stuck after the abort; ending the test process");
                std::process::abort();
            }
        });
        Watchdog(Some(tx))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// A served file in a directory of its own; unmounted at the end however
/// the test ends.
struct Served {
    server: Option<FileServer>,
    path: PathBuf,
    _dog: Watchdog,
    _dir: tempfile::TempDir,
}

impl Served {
    fn new(vol: Arc<dyn BlockIo>, what: &'static str) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("volume");
        let server = FileServer::start(&path, vol, Options::default())
            .unwrap_or_else(|e| panic!("serving {}: {e}", path.display()));
        let dog = Watchdog::arm(server.connection(), what);
        Served {
            server: Some(server),
            path,
            _dog: dog,
            _dir: dir,
        }
    }

    fn open(&self) -> File {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.path)
            .unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            if let Err((s, e)) = s.close(true) {
                eprintln!("closing {}: {e}", self.path.display());
                drop(s);
            }
        }
        // A test that failed half-way may have left the mount behind.
        if lamina_fuse::is_mounted(&self.path) {
            let _ = lamina_fuse::unmount(&self.path, true);
        }
    }
}

/// `close(false)` until the file is free: a child another test forks holds
/// a copy of this process's descriptors until it execs, so a file just
/// closed here can still be in use for a moment.
fn close_once_free(mut server: FileServer) {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match server.close(false) {
            Ok(()) => return,
            Err((s, MountError::Busy { .. })) if std::time::Instant::now() < until => {
                server = s;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err((_, e)) => panic!("closing: {e}"),
        }
    }
}

fn errno_of(e: io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed)
        .collect()
}

fn lseek(f: &File, offset: u64, whence: i32) -> Result<u64, i32> {
    // SAFETY: lseek on a descriptor owned by `f`, no pointers.
    let r = unsafe { libc::lseek(f.as_raw_fd(), offset as i64, whence) };
    if r < 0 {
        Err(errno_of(io::Error::last_os_error()))
    } else {
        Ok(r as u64)
    }
}

fn fallocate(f: &File, mode: i32, offset: u64, len: u64) -> Result<(), i32> {
    // SAFETY: fallocate on a descriptor owned by `f`, no pointers.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) };
    if r < 0 {
        Err(errno_of(io::Error::last_os_error()))
    } else {
        Ok(())
    }
}

#[test]
fn the_file_is_the_volume_byte_for_byte() {
    let vol = Arc::new(MemDevice::new(8 * MIB as usize));
    let s = Served::new(vol.clone(), "the_file_is_the_volume_byte_for_byte");
    let f = s.open();
    assert_eq!(
        f.metadata().unwrap().len(),
        8 * MIB,
        "the file's size is the volume's"
    );
    let a = pattern(1, 1 << 20);
    f.write_all_at(&a, 3 * MIB + 512).unwrap();
    let b = pattern(2, 4096);
    f.write_all_at(&b, 0).unwrap();
    let c = vol.contents();
    assert_eq!(&c[3 * MIB as usize + 512..][..a.len()], &a[..]);
    assert_eq!(&c[..4096], &b[..]);
    let mut back = vec![0u8; a.len()];
    f.read_exact_at(&mut back, 3 * MIB + 512).unwrap();
    assert_eq!(back, a);

    // The end is the end: a read there gives nothing, a write past it is
    // refused and changes nothing, the size cannot be changed.
    let mut x = [0u8; 16];
    assert_eq!(f.read_at(&mut x, 8 * MIB).unwrap(), 0);
    let e = f.write_at(&[1u8; 8192], 8 * MIB - 4096).unwrap_err();
    assert_eq!(errno_of(e), libc::EFBIG);
    assert!(vol.contents()[8 * MIB as usize - 4096..]
        .iter()
        .all(|b| *b == 0));
    assert_eq!(errno_of(f.set_len(MIB).unwrap_err()), libc::EPERM);
    assert_eq!(errno_of(f.set_len(16 * MIB).unwrap_err()), libc::EPERM);
    assert_eq!(f.metadata().unwrap().len(), 8 * MIB);

    // fsync is the volume's flush.
    let before = vol.flush_count();
    f.sync_all().unwrap();
    assert!(
        vol.flush_count() > before,
        "fsync reached the volume as a flush"
    );

    // Holes: punched ranges are trimmed, SEEK_DATA and SEEK_HOLE follow the
    // volume's allocation map.
    assert_eq!(lseek(&f, 0, libc::SEEK_DATA), Ok(0));
    assert_eq!(lseek(&f, 0, libc::SEEK_HOLE), Ok(4096));
    assert_eq!(lseek(&f, 4096, libc::SEEK_DATA), Ok(3 * MIB));
    assert_eq!(lseek(&f, 5 * MIB, libc::SEEK_DATA), Err(libc::ENXIO));
    assert_eq!(lseek(&f, 5 * MIB, libc::SEEK_HOLE), Ok(5 * MIB));
    assert_eq!(lseek(&f, 8 * MIB, libc::SEEK_DATA), Err(libc::ENXIO));
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    fallocate(&f, punch, 3 * MIB + 4096, 64 * 1024).unwrap();
    assert!(
        !vol.is_allocated(3 * MIB + 8192),
        "a punched block is a hole"
    );
    assert!(vol.contents()[3 * MIB as usize + 4096..][..65536]
        .iter()
        .all(|b| *b == 0));
    fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, 0, 1024).unwrap();
    assert!(vol.contents()[..1024].iter().all(|b| *b == 0));
    assert_eq!(fallocate(&f, 0, 7 * MIB, 2 * MIB), Err(libc::EFBIG));
    assert_eq!(
        fallocate(&f, libc::FALLOC_FL_COLLAPSE_RANGE, 0, MIB),
        Err(libc::EOPNOTSUPP)
    );
}

#[test]
fn replies_go_out_as_the_volume_completes_them_not_in_request_order() {
    let mem = Arc::new(MemDevice::new(4 * MIB as usize));
    mem.load(0, &pattern(7, 4096));
    mem.load(MIB, &pattern(8, 4096));
    let gated = Arc::new(Gated::new(mem));
    let s = Served::new(gated.clone(), "replies_go_out_as_the_volume_completes_them");
    gated.hold(|op| matches!(op, IoOp::Read { offset: 0, .. }));
    let first = s.open();
    let held = std::thread::spawn(move || {
        let mut b = vec![0u8; 4096];
        first.read_exact_at(&mut b, 0).map(|()| b)
    });
    gated.wait_held(1, Duration::from_secs(20));
    // The read at 0 is held in the volume; a later read is answered first.
    let second = s.open();
    let mut b = vec![0u8; 4096];
    second.read_exact_at(&mut b, MIB).unwrap();
    assert_eq!(b, pattern(8, 4096));
    assert!(!held.is_finished(), "the held read is still waiting");
    gated.clear();
    gated.release_all();
    assert_eq!(held.join().unwrap().unwrap(), pattern(7, 4096));
}

#[test]
fn the_volumes_errors_reach_the_caller_as_errnos() {
    let mem = Arc::new(MemDevice::new(4 * MIB as usize).failing(MIB, MIB + 4096));
    let gated = Arc::new(Gated::new(mem));
    let s = Served::new(
        gated.clone(),
        "the_volumes_errors_reach_the_caller_as_errnos",
    );
    let f = s.open();
    let mut b = vec![0u8; 4096];
    assert_eq!(
        errno_of(f.read_exact_at(&mut b, MIB).unwrap_err()),
        libc::EIO
    );
    gated.fail(IoErrorKind::NoSpace, |op| matches!(op, IoOp::Write { .. }));
    assert_eq!(errno_of(f.write_all_at(&b, 0).unwrap_err()), libc::ENOSPC);
    gated.clear();
    gated.fail(IoErrorKind::Fenced, |op| matches!(op, IoOp::Flush));
    assert_eq!(errno_of(f.sync_all().unwrap_err()), libc::EPERM);
    gated.clear();
    f.write_all_at(&b, 0).unwrap();
    f.sync_all().unwrap();

    // A read-only volume: opened for reading only.
    let ro = Arc::new(MemDevice::new(MIB as usize).read_only());
    let r = Served::new(
        ro,
        "the_volumes_errors_reach_the_caller_as_errnos (read-only)",
    );
    let e = OpenOptions::new().write(true).open(&r.path).unwrap_err();
    assert_eq!(errno_of(e), libc::EROFS);
    let f = File::open(&r.path).unwrap();
    f.read_exact_at(&mut b, 0).unwrap();
}

/// A volume whose size the test changes, as an expand does.
struct Resizable {
    inner: MemDevice,
    size: AtomicU64,
}

impl BlockIo for Resizable {
    fn size(&self) -> Result<u64, IoError> {
        Ok(self.size.load(Ordering::SeqCst))
    }
    fn read_only(&self) -> bool {
        false
    }
    fn caps(&self) -> Caps {
        BlockIo::caps(&self.inner)
    }
    fn activate(&self, g: u64) -> Result<(), IoError> {
        BlockIo::activate(&self.inner, g)
    }
    fn submit(&self, op: IoOp, done: Completion) {
        BlockIo::submit(&self.inner, op, done)
    }
}

struct Loop(String);

impl Loop {
    fn attach(file: &Path) -> Loop {
        let out = Command::new("losetup")
            .args(["--find", "--show", "--direct-io=off"])
            .arg(file)
            .output()
            .unwrap();
        assert!(out.status.success(), "losetup: {out:?}");
        Loop(String::from_utf8(out.stdout).unwrap().trim().to_string())
    }

    fn size(&self) -> u64 {
        let out = Command::new("blockdev")
            .args(["--getsize64", &self.0])
            .output()
            .unwrap();
        String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

#[test]
fn a_loop_device_over_the_file_grows_when_the_volume_does() {
    let vol = Arc::new(Resizable {
        inner: MemDevice::new(32 * MIB as usize),
        size: AtomicU64::new(16 * MIB),
    });
    let s = Served::new(vol.clone(), "a_loop_device_over_the_file_grows");
    let dev = Loop::attach(&s.path);
    assert_eq!(dev.size(), 16 * MIB);
    // Direct I/O through the block device reaches the volume.
    let data = pattern(3, 1 << 20);
    let bdev = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&dev.0)
        .unwrap();
    let mut aligned = AlignedBuf::new(data.len());
    aligned.as_mut().copy_from_slice(&data);
    bdev.write_all_at(aligned.as_mut(), 2 * MIB).unwrap();
    bdev.sync_all().unwrap();
    assert_eq!(
        &vol.inner.contents()[2 * MIB as usize..][..data.len()],
        &data[..]
    );

    // The volume grows; the file shows it at the next stat, and the loop
    // device takes the new size when asked (what the node plugin does).
    vol.size.store(32 * MIB, Ordering::SeqCst);
    assert_eq!(std::fs::metadata(&s.path).unwrap().len(), 32 * MIB);
    let st = Command::new("losetup")
        .args(["--set-capacity", &dev.0])
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(dev.size(), 32 * MIB);
    bdev.write_all_at(aligned.as_mut(), 30 * MIB).unwrap();
    bdev.sync_all().unwrap();
    assert_eq!(
        &vol.inner.contents()[30 * MIB as usize..][..data.len()],
        &data[..]
    );
    drop(bdev);
    drop(dev);
}

#[test]
fn a_file_in_use_is_not_unmounted_unless_forced() {
    let vol = Arc::new(MemDevice::new(MIB as usize));
    let mut s = Served::new(vol, "a_file_in_use_is_not_unmounted_unless_forced");
    let f = s.open();
    let server = s.server.take().unwrap();
    let (server, e) = server.close(false).unwrap_err();
    assert!(matches!(e, MountError::Busy { .. }), "{e}");
    let mut b = [0u8; 512];
    f.read_exact_at(&mut b, 0).unwrap();
    drop(f);
    close_once_free(server);
    assert!(!lamina_fuse::is_mounted(&s.path));

    // Forced while open: detached, and the open file fails instead of
    // hanging.
    let vol = Arc::new(MemDevice::new(MIB as usize));
    let mut s = Served::new(vol, "a_file_in_use_is_not_unmounted_unless_forced (forced)");
    let f = s.open();
    s.server.take().unwrap().close(true).unwrap();
    assert!(!lamina_fuse::is_mounted(&s.path));
    let e = f.read_exact_at(&mut b, 0).unwrap_err();
    assert_eq!(errno_of(e), libc::ENOTCONN);
}

#[test]
fn a_server_gone_fails_io_with_enotconn_instead_of_hanging() {
    let mem = Arc::new(MemDevice::new(MIB as usize));
    let gated = Arc::new(Gated::new(mem));
    let mut s = Served::new(gated.clone(), "a_server_gone_fails_io_with_enotconn");
    let f = s.open();
    // One read held in the volume when the server goes away.
    gated.hold(|op| matches!(op, IoOp::Read { .. }));
    let f2 = s.open();
    let held = std::thread::spawn(move || {
        let mut b = [0u8; 512];
        f2.read_exact_at(&mut b, 0)
    });
    gated.wait_held(1, Duration::from_secs(20));
    drop(s.server.take());
    // The kernel ends requests waiting at the abort with ECONNABORTED, and
    // refuses later ones with ENOTCONN.
    let e = held.join().unwrap().unwrap_err();
    assert_eq!(errno_of(e), libc::ECONNABORTED, "the waiting read fails");
    let mut b = [0u8; 512];
    let e = f.read_exact_at(&mut b, 0).unwrap_err();
    assert_eq!(errno_of(e), libc::ENOTCONN, "a later read fails at once");
    gated.release_all();
    drop(f);
    lamina_fuse::unmount(&s.path, true).unwrap();
}

/// A buffer aligned for O_DIRECT.
struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        AlignedBuf { ptr, len }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live allocation of `len` bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, 4096).unwrap();
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

#[test]
fn a_released_connection_pauses_io_and_a_new_server_answers_it() {
    let mem = Arc::new(MemDevice::new(4 * MIB as usize));
    mem.load(0, &pattern(3, 4096));
    let gated = Arc::new(Gated::new(mem.clone()));
    let mut s = Served::new(gated.clone(), "a_released_connection_pauses_io");
    // A write the volume holds: release waits for it to be answered.
    gated.hold(|op| matches!(op, IoOp::Write { offset: 0, .. }));
    let f = s.open();
    // The writer keeps its descriptor: a close is a request (FLUSH) too.
    let writer = std::thread::spawn(move || {
        let r = f.write_all_at(&pattern(4, 4096), 0);
        (f, r)
    });
    gated.wait_held(1, Duration::from_secs(20));
    // Opened now: an open is a request too, and would wait below.
    let f = s.open();
    let server = s.server.take().unwrap();
    let releasing = std::thread::spawn(move || server.release(Duration::from_secs(20)));
    std::thread::sleep(Duration::from_millis(100));
    assert!(!releasing.is_finished(), "release waits for the held write");
    gated.clear();
    gated.release_all();
    let (token, fds) = releasing
        .join()
        .unwrap()
        .map_err(|_| "not released")
        .unwrap();
    let (written, r) = writer.join().unwrap();
    r.unwrap();
    assert_eq!(fds.len(), Options::default().threads);

    // Nobody serves the file: a read waits in the kernel, and fails nothing.
    let reader = std::thread::spawn(move || {
        let mut b = vec![0u8; 4096];
        let r = f.read_exact_at(&mut b, 0).map(|()| b);
        (f, r)
    });
    std::thread::sleep(Duration::from_millis(300));
    if reader.is_finished() {
        panic!(
            "the read did not wait for a server: {:?}",
            reader.join().unwrap().1.map(|_| ())
        );
    }

    // Someone else's token, or fewer descriptors than none, is refused and
    // changes nothing; the right ones serve the waiting read.
    let other = lamina_fuse::Handover {
        conn: token.conn.wrapping_add(1000),
    };
    let dup: Vec<_> = fds.iter().map(|f| f.try_clone().unwrap()).collect();
    let err = FileServer::resume(
        &s.path,
        mem.clone(),
        Options::default(),
        &other.encode(),
        dup,
    )
    .unwrap_err();
    assert!(
        matches!(err, lamina_fuse::ServeError::Stale { .. }),
        "{err}"
    );
    let err = FileServer::resume(
        &s.path,
        mem.clone(),
        Options::default(),
        b"junk",
        Vec::new(),
    )
    .unwrap_err();
    assert!(
        matches!(err, lamina_fuse::ServeError::Stale { .. }),
        "{err}"
    );
    assert!(!reader.is_finished());
    let server = FileServer::resume(
        &s.path,
        mem.clone(),
        Options::default(),
        &token.encode(),
        fds,
    )
    .expect("served again");
    assert_eq!(server.connection(), token.conn);
    s.server = Some(server);
    let (f, r) = reader.join().unwrap();
    assert_eq!(r.unwrap(), pattern(4, 4096));
    drop((f, written));
    let mut b = vec![0u8; 4096];
    s.open().read_exact_at(&mut b, 0).unwrap();
    assert_eq!(b, pattern(4, 4096));
}
