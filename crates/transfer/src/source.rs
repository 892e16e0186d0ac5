//! The source side: accepts authenticated peers and streams a snapshot's
//! allocated extents to them. The engine's reads are blocking: a dedicated
//! blocking task reads and encodes frames into a bounded channel while the
//! session's task writes them to the socket.
//!
//! Anyone who reaches the port can open connections, so what a peer can
//! hold is bounded ([`Limits`]): connections still in their TLS handshake,
//! in all and per address, turned away at accept beyond that; sessions, in
//! all and per authenticated peer, refused with an Error frame (`Busy`)
//! beyond that; and each session's frame buffers ([`SESSION_FRAMES`]).
//! Every wait on a peer has a deadline, after which its connection is
//! closed.

use crate::error::TransferError;
use crate::frames::{read_async, write_async, ReadError};
use crate::replica::Volumes;
use crate::tls::{cert_node, Identity};
use crate::wire::{
    self, Answer, Code, Frame, Holder, Mode, Request, PULL_VERSION, RETIRE_VERSION, VERSION,
};
use lamina_engine::{Piece, Pool, Target};
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tracing::{info, info_span, warn, Instrument};

/// Frame buffers a pull session holds at most, each at most 1 MiB of data
/// and 20 bytes of framing: the ones queued for the socket, the one being
/// written and the one being read into. They circulate between the
/// session's reader and writer; none is allocated beyond these.
pub const SESSION_FRAMES: usize = 4;

/// Connections turned away at accept are logged at most this often (a
/// flood must not flood the log).
const WARN_EVERY: Duration = Duration::from_secs(10);

/// What a source lets its peers hold. Every connection costs a descriptor
/// and a task; a session also up to [`SESSION_FRAMES`] frame buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections not yet authenticated (accepted, TLS handshake not
    /// finished), in all. Beyond it a connection is closed at accept.
    pub handshakes: usize,
    /// The same, from one IP address.
    pub handshakes_per_address: usize,
    /// Authenticated sessions, in all. Beyond it a peer's Hello is answered
    /// with an Error frame, code `Busy`.
    pub sessions: usize,
    /// Authenticated sessions of one peer (its certificate's node name).
    pub sessions_per_peer: usize,
    /// Replica sessions (attached to a volume), in all: a session leaves
    /// the two counts above for this one when it attaches, since a front
    /// end holds one for each volume it serves. Beyond it an Attach is
    /// answered with an Error frame, code `Busy`.
    pub replica_sessions: usize,
    /// How long a peer has for its TLS handshake, and for each of its
    /// Hello and Request.
    pub opening_timeout: Duration,
    /// A peer that takes nothing for this long (a write, the answer, a
    /// frame of the stream, the close) is cut off and its connection
    /// closed. A daemon's pulls take a source silent this long for lost
    /// ([`crate::Pull::stall_timeout`]).
    pub stall_timeout: Duration,
}

impl Limits {
    /// Default of [`Limits::handshakes`].
    pub const HANDSHAKES: usize = 64;
    /// Default of [`Limits::handshakes_per_address`].
    pub const HANDSHAKES_PER_ADDRESS: usize = 8;
    /// Default of [`Limits::sessions`].
    pub const SESSIONS: usize = 32;
    /// Default of [`Limits::sessions_per_peer`].
    pub const SESSIONS_PER_PEER: usize = 8;
    /// Default of [`Limits::replica_sessions`].
    pub const REPLICA_SESSIONS: usize = 1024;
    /// Default of [`Limits::opening_timeout`].
    pub const OPENING_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default of [`Limits::stall_timeout`]: the target takes a source
    /// silent this long for gone, too.
    pub const STALL_TIMEOUT: Duration = Duration::from_secs(30);
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            handshakes: Limits::HANDSHAKES,
            handshakes_per_address: Limits::HANDSHAKES_PER_ADDRESS,
            sessions: Limits::SESSIONS,
            sessions_per_peer: Limits::SESSIONS_PER_PEER,
            replica_sessions: Limits::REPLICA_SESSIONS,
            opening_timeout: Limits::OPENING_TIMEOUT,
            stall_timeout: Limits::STALL_TIMEOUT,
        }
    }
}

/// Asked by a source before it reads each piece it streams (at most 1 MiB):
/// how long to hold back first. How the daemon keeps a transfer from
/// crowding out its own volumes' I/O; this crate only obeys it.
pub trait Pace: Send + Sync + 'static {
    /// The wait before reading and sending `bytes` more (data, or a few
    /// bytes for a zero range). Called from a blocking thread, by every
    /// session of a source: one pace is shared by all its peers.
    fn wait(&self, bytes: u64) -> Duration;
}

/// Which other nodes may hold a snapshot of this node's (the other
/// replicas of a replicated volume, by the daemon's records): named in the
/// Answer of a session of version 3, so that a pull can go on from one of
/// them if this node goes away.
pub trait Holders: Send + Sync + 'static {
    /// Other nodes that may hold snapshot `snapshot` of this node's
    /// `volume`, in the order a pull should try them (at most
    /// [`wire::MAX_HOLDERS`] are named; this node never). Whether each
    /// holds it, and the same one, each of them says when asked (by the
    /// snapshot's identity). Called for each request; it must not block
    /// long.
    fn holders(&self, volume: &str, snapshot: &str) -> Vec<Holder>;
}

/// Serves snapshots of a pool to authenticated peers.
pub struct Source {
    pool: Arc<Pool>,
    identity: Arc<Identity>,
    pace: Option<Arc<dyn Pace>>,
    limits: Limits,
    readers: Mutex<HashMap<(String, String), Vec<String>>>,
    sent: Mutex<HashMap<String, u64>>,
    sent_total: AtomicU64,
    refused: AtomicU64,
    held: Mutex<Held>,
    turned_away: AtomicU64,
    busy: AtomicU64,
    frame_buffers: Arc<AtomicUsize>,
    volumes: OnceLock<Arc<dyn Volumes>>,
    holders: OnceLock<Arc<dyn Holders>>,
    /// The replica sessions' call data, all together
    /// ([`crate::replica::CALL_BYTES`]).
    call_bytes: Arc<tokio::sync::Semaphore>,
}

/// The connections a source holds, by kind, and whose they are.
#[derive(Default)]
struct Held {
    handshakes: usize,
    by_address: HashMap<IpAddr, usize>,
    sessions: usize,
    by_peer: HashMap<String, usize>,
    replicas: usize,
}

/// A connection's place among the handshakes or the sessions of a source,
/// given back when dropped.
struct Slot {
    source: Arc<Source>,
    kind: SlotKind,
}

enum SlotKind {
    Handshake(IpAddr),
    Session(String),
    Replica,
}

impl Drop for Slot {
    fn drop(&mut self) {
        fn release<K: std::hash::Hash + Eq>(m: &mut HashMap<K, usize>, k: &K) {
            if let Some(n) = m.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    m.remove(k);
                }
            }
        }
        let mut h = self.source.held();
        match &self.kind {
            SlotKind::Handshake(ip) => {
                h.handshakes -= 1;
                release(&mut h.by_address, ip);
            }
            SlotKind::Session(node) => {
                h.sessions -= 1;
                release(&mut h.by_peer, node);
            }
            SlotKind::Replica => h.replicas -= 1,
        }
    }
}

/// A session's frame buffer, counted while it lives
/// ([`Source::frame_buffers`]).
struct FrameBuf {
    bytes: Vec<u8>,
    count: Arc<AtomicUsize>,
}

impl FrameBuf {
    fn new(count: &Arc<AtomicUsize>) -> FrameBuf {
        count.fetch_add(1, Ordering::Relaxed);
        FrameBuf {
            bytes: Vec::new(),
            count: count.clone(),
        }
    }
}

impl Drop for FrameBuf {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How a session's exchange ended: whether its peer still takes data (and
/// is worth an Error frame or a close_notify), or stalled or went away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    Open,
    Gone,
}

/// Removes a peer from a snapshot's readers when its session ends.
struct Reading<'a> {
    source: &'a Source,
    key: (String, String),
    node: String,
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        let mut r = self
            .source
            .readers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(v) = r.get_mut(&self.key) {
            if let Some(i) = v.iter().position(|n| *n == self.node) {
                v.remove(i);
            }
            if v.is_empty() {
                r.remove(&self.key);
            }
        }
    }
}

/// A session's failure: what to log, and the Error frame to send if any.
pub(crate) struct Refusal {
    code: Code,
    message: String,
}

pub(crate) fn refuse(code: Code, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

fn engine_refusal(e: lamina_engine::Error) -> Refusal {
    match e {
        lamina_engine::Error::SnapshotNotFound { .. } | lamina_engine::Error::VolumeNotFound(_) => {
            refuse(Code::SnapshotMissing, e.to_string())
        }
        e => refuse(Code::SourceIo, e.to_string()),
    }
}

impl Source {
    pub fn new(pool: Arc<Pool>, identity: Arc<Identity>) -> Arc<Source> {
        Source::paced(pool, identity, None)
    }

    /// A source whose streams wait as `pace` says before each piece.
    pub fn paced(
        pool: Arc<Pool>,
        identity: Arc<Identity>,
        pace: Option<Arc<dyn Pace>>,
    ) -> Arc<Source> {
        Source::limited(pool, identity, pace, Limits::default())
    }

    /// A paced source holding at most what `limits` allow.
    pub fn limited(
        pool: Arc<Pool>,
        identity: Arc<Identity>,
        pace: Option<Arc<dyn Pace>>,
        limits: Limits,
    ) -> Arc<Source> {
        Arc::new(Source {
            pool,
            identity,
            pace,
            limits,
            readers: Mutex::default(),
            sent: Mutex::default(),
            sent_total: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            held: Mutex::default(),
            turned_away: AtomicU64::new(0),
            busy: AtomicU64::new(0),
            frame_buffers: Arc::default(),
            volumes: OnceLock::new(),
            holders: OnceLock::new(),
            call_bytes: Arc::new(tokio::sync::Semaphore::new(crate::replica::CALL_BYTES)),
        })
    }

    /// Serve replica sessions on `volumes` from now on (without it, an
    /// Attach is refused with `NotServed`). Set once: later calls are
    /// ignored.
    pub fn serve_volumes(&self, volumes: Arc<dyn Volumes>) {
        let _ = self.volumes.set(volumes);
    }

    /// Name, in the Answers of sessions of version 3, the other holders
    /// `holders` gives (without it, none). Set once: later calls are
    /// ignored.
    pub fn serve_holders(&self, holders: Arc<dyn Holders>) {
        let _ = self.holders.set(holders);
    }

    pub(crate) fn call_bytes(&self) -> Arc<tokio::sync::Semaphore> {
        self.call_bytes.clone()
    }

    pub(crate) fn volumes(&self) -> Option<&Arc<dyn Volumes>> {
        self.volumes.get()
    }

    /// Replica sessions attached now.
    pub fn replica_sessions(&self) -> usize {
        self.held().replicas
    }

    /// Its limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Peers (node names) reading `volume`/`snapshot` right now: the daemon
    /// refuses to delete a snapshot while a transfer reads it.
    pub fn readers(&self, volume: &str, snapshot: &str) -> Vec<String> {
        let r = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        r.get(&(volume.to_string(), snapshot.to_string()))
            .cloned()
            .unwrap_or_default()
    }

    /// Frame bytes sent so far to `node` (all its sessions).
    pub fn bytes_sent_to(&self, node: &str) -> u64 {
        let s = self.sent.lock().unwrap_or_else(|p| p.into_inner());
        s.get(node).copied().unwrap_or(0)
    }

    /// Frame bytes sent so far to every peer.
    pub fn bytes_sent(&self) -> u64 {
        self.sent_total.load(Ordering::Relaxed)
    }

    /// Connections refused so far (failed TLS handshakes: no valid
    /// certificate, or the peer refused ours).
    pub fn refused(&self) -> u64 {
        // Acquire: a reader that sees a refusal counted sees its slot gone
        // and its log line written (both come before the count).
        self.refused.load(Ordering::Acquire)
    }

    /// Connections closed at accept so far, over the handshake limits.
    pub fn turned_away(&self) -> u64 {
        self.turned_away.load(Ordering::Relaxed)
    }

    /// Authenticated peers refused so far because the sessions were at
    /// their limits (answered `Busy`).
    pub fn busy(&self) -> u64 {
        self.busy.load(Ordering::Relaxed)
    }

    /// Peer connections the source holds now: in their handshake or in a
    /// session.
    pub fn connections(&self) -> usize {
        let h = self.held();
        h.handshakes + h.sessions
    }

    /// Frame buffers the sessions hold now (at most [`SESSION_FRAMES`] a
    /// session).
    pub fn frame_buffers(&self) -> usize {
        self.frame_buffers.load(Ordering::Relaxed)
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place among the handshakes for a connection from `ip`, if the
    /// limits leave one.
    fn take_handshake(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        let mut h = self.held();
        let mine = h.by_address.get(&ip).copied().unwrap_or(0);
        if h.handshakes >= self.limits.handshakes || mine >= self.limits.handshakes_per_address {
            return None;
        }
        h.handshakes += 1;
        *h.by_address.entry(ip).or_default() += 1;
        Some(Slot {
            source: self.clone(),
            kind: SlotKind::Handshake(ip),
        })
    }

    /// A place among the sessions for `node`, or why there is none.
    fn take_session(self: &Arc<Self>, node: &str) -> Result<Slot, String> {
        let mut h = self.held();
        let mine = h.by_peer.get(node).copied().unwrap_or(0);
        if mine >= self.limits.sessions_per_peer {
            return Err(format!(
                "this source holds {mine} sessions of node {node}, its limit per peer: try again later"
            ));
        }
        if h.sessions >= self.limits.sessions {
            return Err(format!(
                "this source holds {} sessions, its limit: try again later",
                h.sessions
            ));
        }
        h.sessions += 1;
        *h.by_peer.entry(node.to_string()).or_default() += 1;
        Ok(Slot {
            source: self.clone(),
            kind: SlotKind::Session(node.to_string()),
        })
    }

    /// A session's place moved among the replica sessions, if the limit
    /// leaves one.
    fn take_replica(self: &Arc<Self>) -> Result<Slot, String> {
        let mut h = self.held();
        if h.replicas >= self.limits.replica_sessions {
            return Err(format!(
                "this node holds {} replica sessions, its limit: try again later",
                h.replicas
            ));
        }
        h.replicas += 1;
        Ok(Slot {
            source: self.clone(),
            kind: SlotKind::Replica,
        })
    }

    /// `io` within the stall limit; a timeout is an error like the others.
    pub(crate) async fn timed<T>(
        &self,
        io: impl Future<Output = std::io::Result<T>>,
    ) -> std::io::Result<T> {
        let limit = self.limits.stall_timeout;
        match tokio::time::timeout(limit, io).await {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the peer took nothing for {} s", limit.as_secs_f64()),
            )),
        }
    }

    /// Accept peers on `listener` until `shutdown` completes; then the
    /// sessions still running are cut off.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), TransferError> {
        let mut sessions = tokio::task::JoinSet::new();
        let mut warned: Option<Instant> = None;
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
                r = listener.accept() => match r {
                    Ok((tcp, addr)) => match self.take_handshake(addr.ip()) {
                        Some(slot) => {
                            // The identity as it is now: a renewed
                            // certificate (`Identity::reload`) from the next
                            // peer on.
                            let acceptor = TlsAcceptor::from(self.identity.server_config());
                            sessions.spawn(self.clone().session(acceptor, tcp, addr, slot));
                        }
                        None => {
                            // Closed at once: its descriptor is back
                            // before the next accept.
                            drop(tcp);
                            let n = self.turned_away.fetch_add(1, Ordering::Relaxed) + 1;
                            if warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                                warned = Some(Instant::now());
                                warn!(peer = %addr, turned_away = n,
                                      handshakes = self.limits.handshakes,
                                      per_address = self.limits.handshakes_per_address,
                                      "transfer: closed connections over the handshake limits");
                            }
                        }
                    },
                    Err(e) => {
                        // Out of descriptors and the like: let it pass.
                        warn!(error = %e, "transfer: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
        sessions.shutdown().await;
        Ok(())
    }

    async fn session(
        self: Arc<Self>,
        acceptor: TlsAcceptor,
        tcp: TcpStream,
        addr: SocketAddr,
        handshake: Slot,
    ) {
        let _ = tcp.set_nodelay(true);
        let opening = self.limits.opening_timeout;
        let mut tls = match tokio::time::timeout(opening, acceptor.accept(tcp)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                // The slot goes, and the refusal is logged, before it is
                // counted: whoever sees the count sees the rest of it.
                drop(handshake);
                warn!(peer = %addr, error = %e, "transfer: refused a peer (TLS handshake failed)");
                self.refused.fetch_add(1, Ordering::Release);
                return;
            }
            Err(_) => {
                warn!(peer = %addr, "transfer: dropped a peer that did not finish its TLS handshake");
                return;
            }
        };
        // The verifier refuses a certificate that names no node.
        let Some(node) = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .and_then(cert_node)
        else {
            drop(tls);
            drop(handshake);
            warn!(peer = %addr, "transfer: refused a peer (its certificate names no node)");
            self.refused.fetch_add(1, Ordering::Release);
            return;
        };
        let span = info_span!("transfer_session", peer = %addr, node = %node);
        async move {
            let mut session = match self.take_session(&node) {
                Ok(s) => s,
                Err(why) => {
                    // Still counted among the handshakes until it is gone.
                    self.busy.fetch_add(1, Ordering::Relaxed);
                    warn!("transfer: refused a session: {why}");
                    self.turn_away(&mut tls, why).await;
                    return;
                }
            };
            drop(handshake);
            info!("transfer: accepted a session");
            let ended = match self.clone().run(&mut tls, &node, &mut session).await {
                Ok(ended) => ended,
                Err(r) => {
                    warn!(code = ?r.code, "transfer: session failed: {}", r.message);
                    let f = Frame::Error {
                        code: r.code,
                        message: r.message,
                    };
                    self.send(&mut tls, &f).await
                }
            };
            if ended == Ended::Open {
                let _ = self.timed(tls.shutdown()).await;
            }
            drop(session);
        }
        .instrument(span)
        .await
    }

    /// Answer a peer the sessions have no room for: its Hello is read (an
    /// unread one would turn the close into a reset that can destroy the
    /// answer), then an Error frame `Busy` saying why.
    async fn turn_away(&self, tls: &mut TlsStream<TcpStream>, why: String) {
        if self.opening(tls).await.is_err() {
            return;
        }
        let f = Frame::Error {
            code: Code::Busy,
            message: why,
        };
        if self.send(tls, &f).await == Ended::Open {
            let _ = self.timed(tls.shutdown()).await;
        }
    }

    /// Write one frame within the stall limit.
    pub(crate) async fn send(&self, tls: &mut TlsStream<TcpStream>, f: &Frame) -> Ended {
        match self.timed(write_async(tls, f)).await {
            Ok(()) => Ended::Open,
            Err(e) => {
                warn!(error = %e, "transfer: peer gone");
                Ended::Gone
            }
        }
    }

    async fn opening(&self, tls: &mut TlsStream<TcpStream>) -> Result<Frame, Refusal> {
        match tokio::time::timeout(self.limits.opening_timeout, read_async(tls)).await {
            Ok(Ok((f, _))) => Ok(f),
            Ok(Err(ReadError::Wire(e))) => Err(refuse(Code::BadRequest, e.to_string())),
            Ok(Err(ReadError::Io(e))) => Err(refuse(Code::BadRequest, format!("read: {e}"))),
            Err(_) => Err(refuse(Code::BadRequest, "no request in time")),
        }
    }

    async fn run(
        self: Arc<Self>,
        tls: &mut TlsStream<TcpStream>,
        node: &str,
        slot: &mut Slot,
    ) -> Result<Ended, Refusal> {
        let version = match self.opening(tls).await? {
            Frame::Hello { version } if (PULL_VERSION..=VERSION).contains(&version) => version,
            Frame::Hello { version } => {
                return Err(refuse(
                    Code::Version,
                    format!("this source speaks transfer protocol version {PULL_VERSION} to {VERSION}, the peer version {version}"),
                ))
            }
            f => {
                return Err(refuse(
                    Code::BadRequest,
                    format!("expected Hello, got {}", f.summary()),
                ))
            }
        };
        if self.send(tls, &Frame::Hello { version }).await == Ended::Gone {
            return Ok(Ended::Gone);
        }
        let req = match self.opening(tls).await? {
            Frame::Request(r) => r,
            Frame::Attach { create, volume } if version >= 2 => {
                // A front end's session leaves the pull sessions' counts.
                *slot = self.take_replica().map_err(|why| {
                    self.busy.fetch_add(1, Ordering::Relaxed);
                    refuse(Code::Busy, why)
                })?;
                return crate::replica::serve::session(&self, tls, node, volume, create, version)
                    .await;
            }
            // Brief: it keeps the pull session's place.
            Frame::Retire { check, volume } if version >= RETIRE_VERSION => {
                return crate::replica::retire::serve(&self, tls, node, volume, check).await;
            }
            f => {
                return Err(refuse(
                    Code::BadRequest,
                    format!("expected Request, got {}", f.summary()),
                ))
            }
        };
        // The volume may be a deleted one's `NAME@ID` (its snapshots stay).
        lamina_engine::check_volume_reference(&req.volume)
            .and_then(|_| lamina_engine::check_name(&req.snapshot))
            .map_err(|e| refuse(Code::BadRequest, e.to_string()))?;
        info!(volume = %req.volume, snapshot = %req.snapshot, mode = ?req.mode,
              from = req.from_offset, "transfer: request");
        let (mut answer, export) = self.open(&req).map_err(engine_or)?;
        if version >= 3 {
            answer.holders = self.holders(&req, node);
        }
        let reading = (req.mode == Mode::Pull).then(|| self.register(&req, node));
        if self.send(tls, &Frame::Answer(answer)).await == Ended::Gone {
            return Ok(Ended::Gone);
        }
        if req.mode == Mode::Describe {
            let end = Frame::End {
                frames: 0,
                data_bytes: 0,
            };
            return Ok(self.send(tls, &end).await);
        }
        let ended = self.stream(tls, export, node).await;
        drop(reading);
        Ok(ended)
    }

    /// The other holders of the request's snapshot, for an Answer: at most
    /// [`wire::MAX_HOLDERS`], neither this node nor the peer, each named
    /// once and within the protocol's bounds.
    fn holders(&self, req: &Request, peer: &str) -> Vec<Holder> {
        let Some(h) = self.holders.get() else {
            return Vec::new();
        };
        let me = self.identity.node();
        let mut out: Vec<Holder> = Vec::new();
        for x in h.holders(&req.volume, &req.snapshot) {
            let fits = |s: &str| !s.is_empty() && s.len() <= wire::MAX_NAME;
            if fits(&x.node)
                && fits(&x.address)
                && x.node != me
                && x.node != peer
                && !out.iter().any(|o| o.node == x.node)
                && out.len() < wire::MAX_HOLDERS
            {
                out.push(x);
            }
        }
        out
    }

    /// Look up the snapshot, check its identity, and start its export at
    /// the request's offset.
    fn open(&self, req: &Request) -> Result<(Answer, lamina_engine::Export), Opened> {
        let (v, s) = (&req.volume, &req.snapshot);
        let first = self
            .pool
            .snapshot_info_by_name(v, s)
            .map_err(Opened::Engine)?;
        let mut export = self
            .pool
            .export(None, &Target::snapshot(v, s))
            .map_err(Opened::Engine)?;
        // Ids are never reused: the same id before and after means the
        // export reads that very snapshot.
        let again = self
            .pool
            .snapshot_info_by_name(v, s)
            .map_err(Opened::Engine)?;
        let pool_id = self.pool.pool_id();
        let identity = crate::identity::of_snapshot(pool_id, first.id, &first.labels);
        if first.id != again.id {
            return Err(Opened::Replaced(format!(
                "snapshot {v}/{s} was deleted and made again while its export opened"
            )));
        }
        if req.expect_id != 0 && identity != req.expect_id {
            return Err(Opened::Replaced(format!(
                "snapshot {v}/{s} here is {identity:016x}, the transfer started from {:016x}: another snapshot of that name (made again since, or another replica's)",
                req.expect_id
            )));
        }
        let data_bytes = export.data_bytes();
        let skipped_bytes = match req.mode {
            Mode::Pull => export.skip_to(req.from_offset),
            Mode::Describe => 0,
        };
        let answer = Answer {
            id: identity,
            size: first.restore_size,
            data_bytes,
            skipped_bytes,
            holders: Vec::new(),
        };
        Ok((answer, export))
    }

    fn register(&self, req: &Request, node: &str) -> Reading<'_> {
        let key = (req.volume.clone(), req.snapshot.clone());
        let mut r = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        r.entry(key.clone()).or_default().push(node.to_string());
        Reading {
            source: self,
            key,
            node: node.to_string(),
        }
    }

    /// Send the export's chunks, then End (or an Error frame if a read
    /// fails). Returns when everything is written or the peer is gone.
    async fn stream(
        &self,
        tls: &mut TlsStream<TcpStream>,
        export: lamina_engine::Export,
        node: &str,
    ) -> Ended {
        // The session's only frame buffers: they go to the reader on
        // `spare`, come back filled on `rx`, and return to `spare` once
        // written.
        let (tx, mut rx) = mpsc::channel::<FrameBuf>(SESSION_FRAMES);
        let (give_back, spare) = std::sync::mpsc::sync_channel(SESSION_FRAMES);
        for _ in 0..SESSION_FRAMES {
            let _ = give_back.try_send(FrameBuf::new(&self.frame_buffers));
        }
        let pace = self.pace.clone();
        let reader = tokio::task::spawn_blocking(move || read_frames(export, tx, spare, pace));
        let mut failed = None;
        while let Some(buf) = rx.recv().await {
            // A target that takes nothing for this long (its link cut, its
            // host gone, or it stopped reading) is let go: the snapshot is
            // not held for it, nor its connection.
            if let Err(e) = self.timed(tls.write_all(&buf.bytes)).await {
                failed = Some(e);
                break;
            }
            let n = buf.bytes.len() as u64;
            let _ = give_back.try_send(buf);
            self.sent_total.fetch_add(n, Ordering::Relaxed);
            let mut s = self.sent.lock().unwrap_or_else(|p| p.into_inner());
            *s.entry(node.to_string()).or_default() += n;
        }
        // The reader stops at its next send or its next wait for a buffer.
        drop(rx);
        drop(give_back);
        let _ = reader.await;
        match failed {
            Some(e) => {
                warn!(error = %e, "transfer: peer gone mid-stream");
                Ended::Gone
            }
            None => match self.timed(tls.flush()).await {
                Ok(()) => {
                    info!("transfer: stream sent");
                    Ended::Open
                }
                Err(e) => {
                    warn!(error = %e, "transfer: peer gone at the end of the stream");
                    Ended::Gone
                }
            },
        }
    }
}

enum Opened {
    Engine(lamina_engine::Error),
    Replaced(String),
}

fn engine_or(o: Opened) -> Refusal {
    match o {
        Opened::Engine(e) => engine_refusal(e),
        Opened::Replaced(m) => refuse(Code::SnapshotReplaced, m),
    }
}

/// The blocking half: read pieces straight into the session's frame
/// buffers, queue them. Buffers come back on `spare` once written, so a
/// stream reuses its few warm ones rather than allocating (and copying
/// into) a new one per MiB. Stops when either channel closes (the peer is
/// gone).
fn read_frames(
    mut export: lamina_engine::Export,
    tx: mpsc::Sender<FrameBuf>,
    spare: std::sync::mpsc::Receiver<FrameBuf>,
    pace: Option<Arc<dyn Pace>>,
) {
    let (mut frames, mut data_bytes) = (0u64, 0u64);
    while let Some(piece) = export.next_piece() {
        if let Some(p) = &pace {
            let bytes = match piece {
                Piece::Data { len, .. } => len,
                Piece::Zero { .. } => 0,
            };
            let wait = p.wait(bytes);
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
        }
        let Ok(mut frame) = spare.recv() else {
            return;
        };
        let buf = &mut frame.bytes;
        match piece {
            Piece::Data { offset, len } => {
                let payload = wire::data_frame_start(buf, offset, len as usize);
                if let Err(e) = export.read_piece(offset, payload) {
                    warn!(error = %e, "transfer: reading the snapshot failed");
                    let r = engine_refusal(e);
                    let f = Frame::Error {
                        code: r.code,
                        message: r.message,
                    };
                    buf.clear();
                    wire::encode(&f, buf);
                    let _ = tx.blocking_send(frame);
                    return;
                }
                wire::seal_data(buf);
                data_bytes += len;
            }
            Piece::Zero { offset, len } => {
                buf.clear();
                wire::encode(&Frame::Zero { offset, len }, buf);
            }
        }
        frames += 1;
        if tx.blocking_send(frame).is_err() {
            return;
        }
    }
    let Ok(mut frame) = spare.recv() else {
        return;
    };
    frame.bytes.clear();
    wire::encode(&Frame::End { frames, data_bytes }, &mut frame.bytes);
    let _ = tx.blocking_send(frame);
}
