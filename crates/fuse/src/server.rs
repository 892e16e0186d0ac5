//! Serving one volume as one regular file: reader threads take requests off
//! the connection's descriptors, submit each I/O to the volume through
//! [`BlockIo`], and answer from the volume's completion, on whichever
//! thread it comes, on the descriptor the request came from. Requests that
//! need no I/O (attributes, open, release) are answered by the reader.
//!
//! The file cannot change size through the mount (the volume's size is the
//! daemon's to change; the file follows it, its attributes are never
//! cached), so writes past the end, truncation and size-changing
//! `fallocate` are refused.

use std::fs::File;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use lamina_blockio::{BlockIo, IoDone, IoError, IoErrorKind, IoOp};

use crate::mount::{self, Mount, MountError};
use crate::proto::{self, falloc, fopen, init, op, Request};

/// How the file is served.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Reader threads, each on its own descriptor of the connection.
    pub threads: usize,
    /// The file's owner.
    pub uid: u32,
    pub gid: u32,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            threads: 4,
            uid: 0,
            gid: 0,
        }
    }
}

/// How long [`FileServer::start`] waits for the kernel's INIT.
const INIT_WAIT: Duration = Duration::from_secs(10);

/// Why a file could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error("cannot set up the FUSE connection on {path}: {source}")]
    Setup {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the kernel sent no INIT on {path} within {INIT_WAIT:?}")]
    NoInit { path: PathBuf },
    #[error("the volume's size is unknown: {0}")]
    Volume(#[from] IoError),
    /// A handed-over connection that is no longer the one mounted on its
    /// path (or a token this server did not write).
    #[error("{path}: {reason}; it cannot be taken over")]
    Stale { path: PathBuf, reason: String },
}

/// How long [`FileServer::release`] waits for requests the volume still
/// holds before it gives up handing the connection over.
pub const DRAIN_WAIT: Duration = Duration::from_secs(10);

/// What a released connection needs to be served again: written by
/// [`Handover::encode`] beside its descriptors, read back by
/// [`FileServer::resume`]. Byte by byte (docs/fuse.md, "Handing a
/// connection over"): `b'L' b'F'`, version 1, a reserved zero byte, then
/// the connection's number (u32, little-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handover {
    /// The connection's number under fusectl: the minor of the mount's
    /// device, which must still be the one mounted on the path.
    pub conn: u32,
}

impl Handover {
    pub const LEN: usize = 8;

    pub fn encode(&self) -> [u8; Handover::LEN] {
        let mut b = [0u8; Handover::LEN];
        b[0..4].copy_from_slice(&[b'L', b'F', 1, 0]);
        b[4..8].copy_from_slice(&self.conn.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<Handover> {
        if b.len() != Handover::LEN || b[0..4] != [b'L', b'F', 1, 0] {
            return None;
        }
        Some(Handover {
            conn: u32::from_le_bytes(b[4..8].try_into().ok()?),
        })
    }
}

struct Shared {
    vol: Arc<dyn BlockIo>,
    opts: Options,
    /// Set once INIT is answered (or refused: `Some(false)`).
    init: Mutex<Option<bool>>,
    init_cv: Condvar,
    requests: AtomicU64,
    errors: AtomicU64,
    /// Requests submitted to the volume and not yet answered: an atomic,
    /// so the I/O path takes no lock; only while a release waits
    /// (`draining`) does the answer that brings it to zero wake it.
    held: AtomicU64,
    draining: std::sync::atomic::AtomicBool,
    drained: Mutex<()>,
    drained_cv: Condvar,
    /// The volume's size when last asked. Volumes only grow, so a read or
    /// write inside it needs no question to the volume; one past it, and
    /// every GETATTR, asks again.
    size: AtomicU64,
}

impl Shared {
    fn hold(&self) {
        self.held.fetch_add(1, Ordering::SeqCst);
    }

    fn unhold(&self) {
        if self.held.fetch_sub(1, Ordering::SeqCst) == 1 && self.draining.load(Ordering::SeqCst) {
            // Taken so that the notice cannot fall between the waiter's
            // check and its wait.
            let _g = self.drained.lock().unwrap_or_else(|e| e.into_inner());
            self.drained_cv.notify_all();
        }
    }

    /// Wait until no request is with the volume; whether none is.
    fn wait_unheld(&self, limit: Duration) -> bool {
        self.draining.store(true, Ordering::SeqCst);
        let g = self.drained.lock().unwrap_or_else(|e| e.into_inner());
        let (_g, _) = self
            .drained_cv
            .wait_timeout_while(g, limit, |_| self.held.load(Ordering::SeqCst) > 0)
            .unwrap_or_else(|e| e.into_inner());
        self.held.load(Ordering::SeqCst) == 0
    }

    /// The volume's size, asked now.
    fn fresh_size(&self) -> Result<u64, i32> {
        let s = self.vol.size().map_err(|e| errno(e.kind))?;
        self.size.store(s, Ordering::Relaxed);
        Ok(s)
    }

    /// The volume's size as far as a request ending at `end` needs it.
    fn size_for(&self, end: u64) -> Result<u64, i32> {
        let s = self.size.load(Ordering::Relaxed);
        if end <= s {
            Ok(s)
        } else {
            self.fresh_size()
        }
    }
}

/// One volume served as one file. Dropped without [`FileServer::close`],
/// its threads stop and its connection is aborted: every later access to
/// the file fails with `ENOTCONN` (none hangs), and the stale mount stays
/// until someone unmounts it.
pub struct FileServer {
    path: PathBuf,
    conn: u32,
    stop: File,
    threads: Vec<JoinHandle<()>>,
    /// The connection's descriptors, the readers' own: kept to hand over.
    devs: Vec<Arc<File>>,
    shared: Arc<Shared>,
    /// Closed or handed over: dropping it leaves the connection alone.
    done: bool,
}

impl std::fmt::Debug for FileServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileServer")
            .field("path", &self.path)
            .field("conn", &self.conn)
            .finish()
    }
}

impl FileServer {
    /// Mount a FUSE connection on `path` and serve `vol` there; returns once
    /// the kernel's INIT is answered, so the file is ready.
    pub fn start(
        path: &Path,
        vol: Arc<dyn BlockIo>,
        opts: Options,
    ) -> Result<FileServer, ServeError> {
        let size = vol.size()?;
        let m = Mount::new(path, opts.uid, opts.gid)?;
        let conn = m.connection();
        let setup = |source| ServeError::Setup {
            path: path.to_path_buf(),
            source,
        };
        let abandon = |e: ServeError| {
            let _ = mount::abort(conn);
            let _ = mount::unmount(path, true);
            e
        };
        let mut devs = Vec::new();
        for _ in 1..opts.threads.max(1) {
            devs.push(m.clone_device().map_err(|e| abandon(setup(e)))?);
        }
        let (first, _, _) = m.into_parts();
        devs.insert(0, first);
        let server = FileServer::spawn(path, conn, devs, vol, opts, size, None).map_err(abandon)?;
        let g = server.shared.init.lock().unwrap_or_else(|e| e.into_inner());
        let (g, _) = server
            .shared
            .init_cv
            .wait_timeout_while(g, INIT_WAIT, |i| i.is_none())
            .unwrap_or_else(|e| e.into_inner());
        if *g != Some(true) {
            drop(g);
            let path = server.path.clone();
            let _ = server.close(true);
            return Err(ServeError::NoInit { path });
        }
        drop(g);
        Ok(server)
    }

    /// Serve a connection an earlier server let go with
    /// [`FileServer::release`]: `token` and `fds` are what it handed over.
    /// The connection must still be the one mounted on `path`; requests
    /// the kernel queued meanwhile are answered from now on.
    pub fn resume(
        path: &Path,
        vol: Arc<dyn BlockIo>,
        opts: Options,
        token: &[u8],
        fds: Vec<OwnedFd>,
    ) -> Result<FileServer, ServeError> {
        let stale = |reason: &str| ServeError::Stale {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        };
        let h = Handover::decode(token)
            .ok_or_else(|| stale("the handover token is not one of this server's"))?;
        if fds.is_empty() {
            return Err(stale("no descriptor was handed over"));
        }
        match mount::connection_of(path) {
            Some(c) if c == h.conn => {}
            Some(_) => return Err(stale("another FUSE connection is mounted there now")),
            None => return Err(stale("nothing is mounted there now")),
        }
        let size = vol.size()?;
        let devs = fds.into_iter().map(File::from).collect();
        FileServer::spawn(path, h.conn, devs, vol, opts, size, Some(true))
    }

    /// Start the readers on `devs`; `init` is `Some(true)` for a connection
    /// whose INIT an earlier server answered.
    fn spawn(
        path: &Path,
        conn: u32,
        devs: Vec<File>,
        vol: Arc<dyn BlockIo>,
        opts: Options,
        size: u64,
        init: Option<bool>,
    ) -> Result<FileServer, ServeError> {
        let setup = |source| ServeError::Setup {
            path: path.to_path_buf(),
            source,
        };
        for d in &devs {
            nonblocking(d).map_err(setup)?;
        }
        // SAFETY: eventfd takes no pointers; a non-negative result is a new
        // descriptor owned by nobody else.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(setup(io::Error::last_os_error()));
        }
        // SAFETY: `efd` was just created and is owned here alone.
        let stop: File = unsafe { std::os::fd::FromRawFd::from_raw_fd(efd) };
        let shared = Arc::new(Shared {
            vol,
            opts,
            init: Mutex::new(init),
            init_cv: Condvar::new(),
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            held: AtomicU64::new(0),
            draining: std::sync::atomic::AtomicBool::new(false),
            drained: Mutex::new(()),
            drained_cv: Condvar::new(),
            size: AtomicU64::new(size),
        });
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let devs: Vec<Arc<File>> = devs.into_iter().map(Arc::new).collect();
        let mut server = FileServer {
            path: path.to_path_buf(),
            conn,
            stop,
            threads: Vec::new(),
            devs,
            shared,
            done: false,
        };
        for (i, dev) in server.devs.clone().into_iter().enumerate() {
            let stop = match server.stop.try_clone() {
                Ok(s) => s,
                Err(e) => {
                    server.halt();
                    return Err(setup(e));
                }
            };
            // Made here, so that a reader that could not wait is a failure
            // to start, not a silent reader short.
            let ep = match reader_epoll(&dev, &stop) {
                Ok(ep) => ep,
                Err(e) => {
                    server.halt();
                    return Err(setup(e));
                }
            };
            let sh = server.shared.clone();
            match std::thread::Builder::new()
                .name(format!("fuse-{i}-{name}"))
                .spawn(move || reader(dev, stop, ep, sh))
            {
                Ok(t) => server.threads.push(t),
                Err(e) => {
                    server.halt();
                    return Err(setup(e));
                }
            }
        }
        Ok(server)
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The connection's number under fusectl.
    pub fn connection(&self) -> u32 {
        self.conn
    }

    /// Requests answered so far, and how many of them with an error.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.shared.requests.load(Ordering::Relaxed),
            self.shared.errors.load(Ordering::Relaxed),
        )
    }

    /// Unmount the file and stop serving it. Without `force`, a file still
    /// in use (a loop device over it) is left served and mounted, and the
    /// server comes back with [`MountError::Busy`]. With `force` the mount
    /// is detached and the connection aborted: whoever still uses the file
    /// gets `ENOTCONN`.
    // The server comes back whole, for the caller to close again.
    #[allow(clippy::result_large_err)]
    pub fn close(mut self, force: bool) -> Result<(), (FileServer, MountError)> {
        if force {
            // Abort while the mount still holds the connection's number: once
            // the mount is gone the number can be another new mount's.
            self.abort_if_mounted();
        }
        if let Err(e) = mount::unmount(&self.path, force) {
            match e {
                MountError::Busy { .. } if !force => return Err((self, e)),
                // Already gone (unmounted by someone else): stop serving.
                _ if !mount::is_mounted(&self.path) => {}
                _ => return Err((self, e)),
            }
        }
        // Unmounted: the kernel ended the connection with its superblock.
        self.halt();
        self.done = true;
        Ok(())
    }

    /// Stop serving and let the connection go without ending it, for
    /// another server (a new daemon) to [`resume`](FileServer::resume):
    /// the readers stop taking requests, requests already with the volume
    /// are answered (waiting up to `wait`), and the handover token and the
    /// connection's descriptors are returned. Until someone serves them
    /// again, requests wait in the kernel: I/O on the file pauses, and
    /// nothing fails. If requests are still with the volume after `wait`
    /// the connection is not handed over (a new server could not answer
    /// them); the server comes back to be closed.
    #[allow(clippy::result_large_err)]
    pub fn release(mut self, wait: Duration) -> Result<(Handover, Vec<OwnedFd>), FileServer> {
        self.halt();
        if !self.shared.wait_unheld(wait) {
            return Err(self);
        }
        let mut fds = Vec::with_capacity(self.devs.len());
        for d in &self.devs {
            match d.as_fd().try_clone_to_owned() {
                Ok(fd) => fds.push(fd),
                Err(e) => {
                    tracing::warn!(error = %e, path = %self.path.display(), "cannot duplicate a FUSE descriptor to hand over");
                    return Err(self);
                }
            }
        }
        // Nothing to abort on drop: the readers are stopped, and the
        // connection lives on in the returned descriptors.
        self.done = true;
        Ok((Handover { conn: self.conn }, fds))
    }

    /// Abort the connection if it is still the one mounted on the path.
    fn abort_if_mounted(&self) {
        if mount::connection_of(&self.path) == Some(self.conn) {
            let _ = mount::abort(self.conn);
        }
    }

    fn halt(&mut self) {
        let _ = (&self.stop).write_all(&1u64.to_ne_bytes());
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        if !self.done {
            // Requests the volume still holds keep a descriptor open:
            // aborting fails them, and everything after them, instead of
            // leaving the connection waiting.
            self.abort_if_mounted();
            self.halt();
        }
    }
}

fn nonblocking(f: &File) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor this process owns, no pointers.
    let fl = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
    if fl < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Tokens of a reader's epoll set.
const DEV: u64 = 0;
const STOP: u64 = 1;

/// A reader's epoll set: the connection's descriptor, exclusive, and the
/// stop signal. The readers' descriptors are clones of one connection and
/// share its wait queue: with poll(2) every idle reader woke at each request
/// and all but one found nothing to read. EPOLLEXCLUSIVE wakes one.
fn reader_epoll(dev: &File, stop: &File) -> io::Result<OwnedFd> {
    // SAFETY: epoll_create1 takes no pointers; a non-negative result is a
    // new descriptor owned by nobody else.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `ep` was just created and is owned here alone.
    let ep = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(ep) };
    for (fd, events, token) in [
        (
            dev.as_raw_fd(),
            (libc::EPOLLIN | libc::EPOLLEXCLUSIVE) as u32,
            DEV,
        ),
        (stop.as_raw_fd(), libc::EPOLLIN as u32, STOP),
    ] {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: `ev` is a valid epoll_event for the call; both descriptors
        // are open for the epoll set's life (the reader holds them).
        if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(ep)
}

/// One reader: wait in `ep` (its [`reader_epoll`] set over `dev` and
/// `stop`) for a request or the stop signal, read, answer or submit. Ends
/// on the stop signal or when the connection is gone.
fn reader(dev: Arc<File>, stop: File, ep: OwnedFd, sh: Arc<Shared>) {
    // The epoll set refers to `stop`'s open file: held for the reader's life.
    let _stop = stop;
    let mut buf = vec![0u8; proto::READ_BUFFER];
    loop {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 2];
        // SAFETY: `evs` is a valid array of two epoll_event for the call.
        let n = unsafe { libc::epoll_wait(ep.as_raw_fd(), evs.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return;
        }
        let evs = &evs[..n as usize];
        if evs.iter().any(|e| e.u64 == STOP) {
            return;
        }
        let hup = (libc::EPOLLERR | libc::EPOLLHUP) as u32;
        if evs
            .iter()
            .any(|e| e.u64 == DEV && e.events & hup != 0 && e.events & libc::EPOLLIN as u32 == 0)
        {
            // The connection was aborted or unmounted.
            return;
        }
        let n = match (&*dev).read(&mut buf) {
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                // Another reader took it, or the kernel dropped an
                // interrupted request: wait again.
                Some(libc::EAGAIN) | Some(libc::EINTR) | Some(libc::ENOENT) => continue,
                // Unmounted or aborted.
                Some(libc::ENODEV) => return,
                _ => {
                    tracing::warn!(error = %e, "reading /dev/fuse failed; this reader stops");
                    return;
                }
            },
        };
        handle(&dev, &buf[..n], &sh);
    }
}

/// The errno a volume's error is answered with (docs/fuse.md lists them).
pub fn errno(kind: IoErrorKind) -> i32 {
    match kind {
        IoErrorKind::Io => libc::EIO,
        IoErrorKind::NoSpace => libc::ENOSPC,
        IoErrorKind::Invalid => libc::EINVAL,
        IoErrorKind::ReadOnly => libc::EROFS,
        IoErrorKind::NotSupported => libc::EOPNOTSUPP,
        IoErrorKind::Gone => libc::ENXIO,
        IoErrorKind::Fenced => libc::EPERM,
    }
}

fn reply(dev: &File, sh: &Shared, unique: u64, error: i32, parts: &[&[u8]]) {
    sh.requests.fetch_add(1, Ordering::Relaxed);
    if error != 0 {
        sh.errors.fetch_add(1, Ordering::Relaxed);
    }
    let payload: usize = if error == 0 {
        parts.iter().map(|p| p.len()).sum()
    } else {
        0
    };
    let h = proto::out_header(unique, -error, payload);
    let mut iov = vec![IoSlice::new(&h)];
    if error == 0 {
        iov.extend(parts.iter().map(|p| IoSlice::new(p)));
    }
    // One writev: the kernel takes a reply whole or not at all.
    if let Err(e) = (&*dev).write_vectored(&iov) {
        // ENOENT: the request was interrupted or aborted meanwhile.
        if e.raw_os_error() != Some(libc::ENOENT) {
            tracing::debug!(error = %e, unique, "a FUSE reply was not taken");
        }
    }
}

fn handle(dev: &Arc<File>, buf: &[u8], sh: &Arc<Shared>) {
    let (h, req) = match proto::decode(buf) {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!(error = %e, "a malformed FUSE request");
            if buf.len() >= proto::IN_HEADER {
                let unique = u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes"));
                reply(dev, sh, unique, libc::EINVAL, &[]);
            }
            return;
        }
    };
    let u = h.unique;
    let vol = &sh.vol;
    let size = || sh.fresh_size();
    match req {
        Request::Init {
            major,
            minor,
            max_readahead,
            flags,
        } => {
            let ok = major == proto::MAJOR && minor >= 12;
            if ok {
                let out = proto::InitOut {
                    minor: minor.min(proto::MINOR),
                    max_readahead,
                    flags: flags & init::WANTED,
                    max_background: 64,
                    congestion_threshold: 48,
                };
                reply(dev, sh, u, 0, &[&out.encode()]);
            } else {
                tracing::warn!(
                    major,
                    minor,
                    "the kernel's FUSE protocol is not 7.12 or later"
                );
                reply(dev, sh, u, libc::EPROTO, &[]);
            }
            *sh.init.lock().unwrap_or_else(|e| e.into_inner()) = Some(ok);
            sh.init_cv.notify_all();
        }
        Request::GetAttr => match size() {
            Ok(s) => reply(dev, sh, u, 0, &[&attr(sh, s)]),
            Err(e) => reply(dev, sh, u, e, &[]),
        },
        Request::SetAttr { valid, size: want } => match size() {
            Ok(s) if valid & proto::FATTR_SIZE != 0 && want != s => {
                reply(dev, sh, u, libc::EPERM, &[])
            }
            // Owner, mode and times are not kept: the file is the volume.
            Ok(s) => reply(dev, sh, u, 0, &[&attr(sh, s)]),
            Err(e) => reply(dev, sh, u, e, &[]),
        },
        Request::Open { flags } => {
            if vol.read_only() && flags & libc::O_ACCMODE as u32 != libc::O_RDONLY as u32 {
                reply(dev, sh, u, libc::EROFS, &[]);
            } else {
                let f = fopen::DIRECT_IO | fopen::PARALLEL_DIRECT_WRITES;
                reply(dev, sh, u, 0, &[&proto::open_out(f)]);
            }
        }
        Request::Read { offset, size: len } => {
            let s = match sh.size_for(offset.saturating_add(len as u64)) {
                Ok(s) => s,
                Err(e) => return reply(dev, sh, u, e, &[]),
            };
            if offset >= s || len == 0 {
                return reply(dev, sh, u, 0, &[]);
            }
            let len = (len as u64).min(s - offset) as usize;
            let (d, shc) = (dev.clone(), sh.clone());
            submit(
                sh,
                IoOp::Read {
                    offset,
                    buf: vec![0; len],
                },
                Box::new(move |r| match r {
                    Ok(IoDone::Read(b)) => reply(&d, &shc, u, 0, &[&b]),
                    Ok(_) => reply(&d, &shc, u, libc::EIO, &[]),
                    Err(e) => reply(&d, &shc, u, errno(e.kind), &[]),
                }),
            );
        }
        Request::Write { offset, data } => {
            if vol.read_only() {
                return reply(dev, sh, u, libc::EROFS, &[]);
            }
            let s = match sh.size_for(offset.saturating_add(data.len() as u64)) {
                Ok(s) => s,
                Err(e) => return reply(dev, sh, u, e, &[]),
            };
            let len = data.len() as u32;
            match offset.checked_add(data.len() as u64) {
                Some(end) if end <= s => {}
                _ => return reply(dev, sh, u, libc::EFBIG, &[]),
            }
            if len == 0 {
                return reply(dev, sh, u, 0, &[&proto::write_out(0)]);
            }
            let (d, shc) = (dev.clone(), sh.clone());
            submit(
                sh,
                IoOp::Write {
                    offset,
                    data: data.to_vec(),
                    fua: false,
                },
                Box::new(move |r| match r {
                    Ok(_) => reply(&d, &shc, u, 0, &[&proto::write_out(len)]),
                    Err(e) => reply(&d, &shc, u, errno(e.kind), &[]),
                }),
            );
        }
        Request::Fsync => {
            if !vol.caps().flush {
                return reply(dev, sh, u, 0, &[]);
            }
            let (d, shc) = (dev.clone(), sh.clone());
            submit(
                sh,
                IoOp::Flush,
                Box::new(move |r| match r {
                    Ok(_) => reply(&d, &shc, u, 0, &[]),
                    Err(e) => reply(&d, &shc, u, errno(e.kind), &[]),
                }),
            );
        }
        Request::Flush | Request::Release | Request::Destroy => reply(dev, sh, u, 0, &[]),
        Request::StatFs => match size() {
            Ok(s) => reply(dev, sh, u, 0, &[&proto::statfs_out(s)]),
            Err(e) => reply(dev, sh, u, e, &[]),
        },
        Request::Fallocate {
            offset,
            length,
            mode,
        } => match size() {
            Ok(s) => fallocate(dev, sh, u, s, offset, length, mode),
            Err(e) => reply(dev, sh, u, e, &[]),
        },
        Request::Lseek { offset, whence } => match size() {
            Ok(s) => match seek(vol.as_ref(), s, offset, whence) {
                Ok(at) => reply(dev, sh, u, 0, &[&proto::lseek_out(at)]),
                Err(e) => reply(dev, sh, u, e, &[]),
            },
            Err(e) => reply(dev, sh, u, e, &[]),
        },
        Request::NoReply => {}
        Request::Other(opcode) => {
            if opcode == op::LOOKUP {
                // The root is a file: there is nothing to look up in it.
                reply(dev, sh, u, libc::ENOTDIR, &[]);
            } else {
                reply(dev, sh, u, libc::ENOSYS, &[]);
            }
        }
    }
}

/// Submit `op` to the volume, counted as held until `done` has answered
/// (what [`FileServer::release`] waits for).
fn submit(sh: &Arc<Shared>, op: IoOp, done: lamina_blockio::Completion) {
    sh.hold();
    let shc = sh.clone();
    sh.vol.submit(
        op,
        Box::new(move |r| {
            done(r);
            shc.unhold();
        }),
    );
}

fn attr(sh: &Shared, size: u64) -> [u8; 104] {
    let perm = if sh.vol.read_only() { 0o400 } else { 0o600 };
    proto::attr_out(size, libc::S_IFREG | perm, sh.opts.uid, sh.opts.gid)
}

/// `fallocate(2)`: punching a hole trims, zeroing a range writes zeroes,
/// allocating inside the file is already done (the volume allocates on
/// write); nothing may change the size.
fn fallocate(
    dev: &Arc<File>,
    sh: &Arc<Shared>,
    u: u64,
    size: u64,
    offset: u64,
    length: u64,
    mode: u32,
) {
    let known = falloc::KEEP_SIZE | falloc::PUNCH_HOLE | falloc::ZERO_RANGE;
    if mode & !known != 0 {
        return reply(dev, sh, u, libc::EOPNOTSUPP, &[]);
    }
    let Some(end) = offset.checked_add(length).filter(|_| length > 0) else {
        return reply(dev, sh, u, libc::EINVAL, &[]);
    };
    let keep = mode & falloc::KEEP_SIZE != 0;
    if end > size && !keep {
        return reply(dev, sh, u, libc::EFBIG, &[]);
    }
    if sh.vol.read_only() {
        return reply(dev, sh, u, libc::EROFS, &[]);
    }
    let end = end.min(size);
    let caps = sh.vol.caps();
    let op = if mode & falloc::PUNCH_HOLE != 0 {
        if caps.trim {
            IoOp::Trim {
                offset,
                len: end.saturating_sub(offset),
            }
        } else if caps.write_zeroes {
            IoOp::WriteZeroes {
                offset,
                len: end.saturating_sub(offset),
                may_trim: true,
            }
        } else {
            return reply(dev, sh, u, libc::EOPNOTSUPP, &[]);
        }
    } else if mode & falloc::ZERO_RANGE != 0 {
        if !caps.write_zeroes {
            return reply(dev, sh, u, libc::EOPNOTSUPP, &[]);
        }
        IoOp::WriteZeroes {
            offset,
            len: end.saturating_sub(offset),
            may_trim: false,
        }
    } else {
        return reply(dev, sh, u, 0, &[]);
    };
    if offset >= end {
        return reply(dev, sh, u, 0, &[]);
    }
    let (d, shc) = (dev.clone(), sh.clone());
    submit(
        sh,
        op,
        Box::new(move |r| match r {
            Ok(_) => reply(&d, &shc, u, 0, &[]),
            Err(e) => reply(&d, &shc, u, errno(e.kind), &[]),
        }),
    );
}

/// `SEEK_DATA` and `SEEK_HOLE` from the volume's allocation map (a volume
/// without one is all data). Runs on the reader: seeks are rare.
fn seek(vol: &dyn BlockIo, size: u64, offset: u64, whence: u32) -> Result<u64, i32> {
    let data = match whence {
        proto::SEEK_DATA => true,
        proto::SEEK_HOLE => false,
        _ => return Err(libc::EINVAL),
    };
    if offset >= size {
        return Err(libc::ENXIO);
    }
    if !vol.caps().block_status {
        return Ok(if data { offset } else { size });
    }
    let mut at = offset;
    while at < size {
        let len = (size - at).min(1 << 30);
        let extents = match lamina_blockio::wait(vol, IoOp::BlockStatus { offset: at, len }) {
            Ok(IoDone::BlockStatus(x)) => x,
            Ok(_) => return Err(libc::EIO),
            Err(e) => return Err(errno(e.kind)),
        };
        if extents.is_empty() {
            return Err(libc::EIO);
        }
        for x in extents {
            if x.length == 0 {
                return Err(libc::EIO);
            }
            if x.hole != data {
                return Ok(at);
            }
            at = at.saturating_add(x.length);
            if at >= size {
                break;
            }
        }
    }
    if data {
        Err(libc::ENXIO)
    } else {
        Ok(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handover_token_is_read_back_exactly() {
        let h = Handover { conn: 0x0102_0304 };
        assert_eq!(h.encode(), [b'L', b'F', 1, 0, 4, 3, 2, 1]);
        assert_eq!(Handover::decode(&h.encode()), Some(h));
        assert_eq!(Handover::decode(&[b'L', b'F', 2, 0, 4, 3, 2, 1]), None);
        assert_eq!(Handover::decode(&h.encode()[..7]), None);
    }
}
