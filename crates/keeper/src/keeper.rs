//! The keeper's side: a Unix socket (`SOCK_SEQPACKET`, mode 0600) that
//! only processes of its own user may use, a thread per connection, and
//! the entries held. An entry held longer than the hold limit is let go:
//! its descriptors close, and if they were a connection's last the kernel
//! ends it (I/O on the file fails instead of waiting for a daemon that is
//! not coming back).

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::net::{SocketAddrUnix, SocketFlags};

use crate::proto::Message;
use crate::sock::{self, RecvError};
use crate::KeeperError;

/// How long an entry is held when nobody takes it back: five minutes.
pub const DEFAULT_HOLD: Duration = Duration::from_secs(300);

/// How long one send or receive on a connection may take.
const IO_LIMIT: Duration = Duration::from_secs(10);

struct Entry {
    token: Vec<u8>,
    fds: Vec<OwnedFd>,
    since: Instant,
}

struct Shared {
    entries: Mutex<BTreeMap<String, Entry>>,
    conns: Mutex<Vec<Arc<OwnedFd>>>,
    stop: AtomicBool,
    hold: Duration,
}

/// A keeper bound to its socket.
pub struct Keeper {
    path: PathBuf,
    listener: Arc<OwnedFd>,
    shared: Arc<Shared>,
}

/// A keeper running on threads of its own; stopped (and every entry let
/// go) when dropped.
pub struct KeeperHandle {
    path: PathBuf,
    listener: Arc<OwnedFd>,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Keeper {
    /// Listen at `path`. A socket file nobody answers at is replaced; one a
    /// keeper answers at is left alone and refused.
    pub fn bind(path: &Path, hold: Duration) -> Result<Keeper, KeeperError> {
        let failed = |reason: String| KeeperError::Bind {
            path: path.to_path_buf(),
            reason,
        };
        let addr = SocketAddrUnix::new(path).map_err(|e| failed(e.to_string()))?;
        if path.exists() {
            if crate::client::Client::new(path).list().is_ok() {
                return Err(failed("another keeper answers there".into()));
            }
            std::fs::remove_file(path).map_err(|e| failed(e.to_string()))?;
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| failed(e.to_string()))?;
        }
        let fd = sock::seqpacket().map_err(|e| failed(e.to_string()))?;
        rustix::net::bind(&fd, &addr).map_err(|e| failed(e.to_string()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| failed(e.to_string()))?;
        rustix::net::listen(&fd, 16).map_err(|e| failed(e.to_string()))?;
        Ok(Keeper {
            path: path.to_path_buf(),
            listener: Arc::new(fd),
            shared: Arc::new(Shared {
                entries: Mutex::new(BTreeMap::new()),
                conns: Mutex::new(Vec::new()),
                stop: AtomicBool::new(false),
                hold,
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serve until the listener is shut down ([`KeeperHandle`]'s drop).
    pub fn run(self) {
        let expiry = {
            let sh = self.shared.clone();
            std::thread::Builder::new()
                .name("keeper-expiry".into())
                .spawn(move || expire(&sh))
                .ok()
        };
        loop {
            let conn = match rustix::net::accept_with(&*self.listener, SocketFlags::CLOEXEC) {
                Ok(c) => Arc::new(c),
                Err(_) if self.shared.stop.load(Ordering::SeqCst) => break,
                Err(rustix::io::Errno::INTR) | Err(rustix::io::Errno::CONNABORTED) => continue,
                Err(e) => {
                    // Out of descriptors or memory: what it holds matters
                    // more than this caller; wait and go on.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            if self.shared.stop.load(Ordering::SeqCst) {
                break;
            }
            match sock::peer_uid(&*conn) {
                Ok(uid) if uid == rustix::process::geteuid().as_raw() => {}
                Ok(uid) => {
                    tracing::warn!(uid, "refused a peer of another user");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "refused a peer whose credentials are unknown");
                    continue;
                }
            }
            // A peer that stops reading or writing is cut off, so that it
            // cannot hold a connection's thread for ever.
            for dir in [
                rustix::net::sockopt::Timeout::Recv,
                rustix::net::sockopt::Timeout::Send,
            ] {
                let _ = rustix::net::sockopt::set_socket_timeout(&*conn, dir, Some(IO_LIMIT));
            }
            lock(&self.shared.conns).push(conn.clone());
            let sh = self.shared.clone();
            let spawned = std::thread::Builder::new()
                .name("keeper-conn".into())
                .spawn(move || {
                    serve(&conn, &sh);
                    lock(&sh.conns).retain(|c| !Arc::ptr_eq(c, &conn));
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start a thread for a connection");
            }
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = expiry {
            let _ = t.join();
        }
    }

    /// Run on threads of its own.
    pub fn spawn(self) -> KeeperHandle {
        let (path, listener, shared) = (
            self.path.clone(),
            self.listener.clone(),
            self.shared.clone(),
        );
        let thread = std::thread::Builder::new()
            .name("keeper".into())
            .spawn(move || self.run())
            .ok();
        KeeperHandle {
            path,
            listener,
            shared,
            thread,
        }
    }
}

impl KeeperHandle {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keys held now.
    pub fn keys(&self) -> Vec<String> {
        lock(&self.shared.entries).keys().cloned().collect()
    }
}

impl Drop for KeeperHandle {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = rustix::net::shutdown(&*self.listener, rustix::net::Shutdown::Both);
        for c in lock(&self.shared.conns).iter() {
            let _ = rustix::net::shutdown(&**c, rustix::net::Shutdown::Both);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        lock(&self.shared.entries).clear();
        let _ = std::fs::remove_file(&self.path);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Let go of entries held past the limit, once a second.
fn expire(sh: &Shared) {
    while !sh.stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(500));
        let mut entries = lock(&sh.entries);
        let old: Vec<String> = entries
            .iter()
            .filter(|(_, e)| e.since.elapsed() > sh.hold)
            .map(|(k, _)| k.clone())
            .collect();
        for k in old {
            tracing::warn!(key = %k, hold = ?sh.hold, "nobody took this entry back within the hold limit: letting it go");
            entries.remove(&k);
        }
    }
}

/// One connection: requests in, answers out, until it closes or sends
/// something malformed (answered with `Error`, then closed).
fn serve(conn: &OwnedFd, sh: &Shared) {
    loop {
        let (m, fds) = match sock::recv(conn) {
            Ok(x) => x,
            Err(RecvError::Closed) => return,
            Err(RecvError::Io(e)) => {
                if !sh.stop.load(Ordering::SeqCst) {
                    tracing::debug!(error = %e, "a keeper connection failed");
                }
                return;
            }
            Err(RecvError::Proto(e)) => {
                tracing::warn!(error = %e, "a malformed message; closing the connection");
                let _ = sock::send(
                    conn,
                    &Message::Error {
                        text: e.to_string(),
                    },
                    &[],
                );
                return;
            }
        };
        let sent = match m {
            Message::Put { key, token } => {
                tracing::info!(key = %key, descriptors = fds.len(), "holding");
                lock(&sh.entries).insert(
                    key,
                    Entry {
                        token,
                        fds,
                        since: Instant::now(),
                    },
                );
                sock::send(conn, &Message::Ok, &[])
            }
            Message::Drop { key } => {
                if lock(&sh.entries).remove(&key).is_some() {
                    tracing::info!(key = %key, "let go");
                }
                sock::send(conn, &Message::Ok, &[])
            }
            Message::List => list(conn, sh),
            other => {
                let text = format!("{other:?} is not a request");
                let _ = sock::send(conn, &Message::Error { text }, &[]);
                return;
            }
        };
        if sent.is_err() {
            return;
        }
    }
}

/// Send copies of every entry: copied under the lock, sent without it, so
/// that a slow peer holds up nobody else.
fn list(conn: &OwnedFd, sh: &Shared) -> std::io::Result<()> {
    let copies = {
        let entries = lock(&sh.entries);
        let mut copies = Vec::with_capacity(entries.len());
        for (key, e) in entries.iter() {
            let fds = e
                .fds
                .iter()
                .map(|f| f.try_clone())
                .collect::<std::io::Result<Vec<OwnedFd>>>()?;
            copies.push((key.clone(), e.token.clone(), fds));
        }
        copies
    };
    for (key, token, fds) in copies {
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
        sock::send(conn, &Message::Entry { key, token }, &borrowed)?;
    }
    sock::send(conn, &Message::End, &[])
}
