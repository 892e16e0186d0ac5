//! The source side: accepts authenticated peers and streams a snapshot's
//! allocated extents to them. The engine's reads are blocking: a dedicated
//! blocking task reads and encodes frames into a bounded channel while the
//! session's task writes them to the socket.

use crate::error::TransferError;
use crate::frames::{read_async, write_async, ReadError};
use crate::tls::{cert_node, Identity};
use crate::wire::{self, Answer, Code, Frame, Mode, Request, VERSION};
use lamina_engine::{Piece, Pool, Target};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tracing::{info, info_span, warn, Instrument};

/// How long a peer has for the TLS handshake, its Hello and its Request.
const OPENING_TIMEOUT: Duration = Duration::from_secs(30);
/// A peer that takes no bytes for this long is taken for gone.
const STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Encoded frames waiting for the socket (each at most 1 MiB of data).
const QUEUE: usize = 8;

/// Asked by a source before it reads each piece it streams (at most 1 MiB):
/// how long to hold back first. How the daemon keeps a transfer from
/// crowding out its own volumes' I/O; this crate only obeys it.
pub trait Pace: Send + Sync + 'static {
    /// The wait before reading and sending `bytes` more (data, or a few
    /// bytes for a zero range). Called from a blocking thread, by every
    /// session of a source: one pace is shared by all its peers.
    fn wait(&self, bytes: u64) -> Duration;
}

/// Serves snapshots of a pool to authenticated peers.
pub struct Source {
    pool: Arc<Pool>,
    identity: Arc<Identity>,
    pace: Option<Arc<dyn Pace>>,
    readers: Mutex<HashMap<(String, String), Vec<String>>>,
    sent: Mutex<HashMap<String, u64>>,
    sent_total: AtomicU64,
    refused: AtomicU64,
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
struct Refusal {
    code: Code,
    message: String,
}

fn refuse(code: Code, message: impl Into<String>) -> Refusal {
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
        Arc::new(Source {
            pool,
            identity,
            pace,
            readers: Mutex::default(),
            sent: Mutex::default(),
            sent_total: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        })
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
        self.refused.load(Ordering::Relaxed)
    }

    /// Accept peers on `listener` until `shutdown` completes; then the
    /// sessions still running are cut off.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), TransferError> {
        let acceptor = TlsAcceptor::from(self.identity.server_config()?);
        let mut sessions = tokio::task::JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
                r = listener.accept() => match r {
                    Ok((tcp, addr)) => {
                        sessions.spawn(self.clone().session(acceptor.clone(), tcp, addr));
                    }
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

    async fn session(self: Arc<Self>, acceptor: TlsAcceptor, tcp: TcpStream, addr: SocketAddr) {
        let _ = tcp.set_nodelay(true);
        let tls = match tokio::time::timeout(OPENING_TIMEOUT, acceptor.accept(tcp)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                warn!(peer = %addr, error = %e, "transfer: refused a peer (TLS handshake failed)");
                return;
            }
            Err(_) => {
                warn!(peer = %addr, "transfer: dropped a peer that did not finish its TLS handshake");
                return;
            }
        };
        let node = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .and_then(cert_node)
            .unwrap_or_default();
        let span = info_span!("transfer_session", peer = %addr, node = %node);
        async move {
            info!("transfer: accepted a session");
            let mut tls = tls;
            match self.run(&mut tls, &node).await {
                Ok(()) => {}
                Err(r) => {
                    warn!(code = ?r.code, "transfer: session failed: {}", r.message);
                    let f = Frame::Error {
                        code: r.code,
                        message: r.message,
                    };
                    let _ = write_async(&mut tls, &f).await;
                }
            }
            let _ = tls.shutdown().await;
        }
        .instrument(span)
        .await
    }

    async fn opening(&self, tls: &mut TlsStream<TcpStream>) -> Result<Frame, Refusal> {
        match tokio::time::timeout(OPENING_TIMEOUT, read_async(tls)).await {
            Ok(Ok((f, _))) => Ok(f),
            Ok(Err(ReadError::Wire(e))) => Err(refuse(Code::BadRequest, e.to_string())),
            Ok(Err(ReadError::Io(e))) => Err(refuse(Code::BadRequest, format!("read: {e}"))),
            Err(_) => Err(refuse(Code::BadRequest, "no request in time")),
        }
    }

    async fn run(&self, tls: &mut TlsStream<TcpStream>, node: &str) -> Result<(), Refusal> {
        match self.opening(tls).await? {
            Frame::Hello { version } if version == VERSION => {}
            Frame::Hello { version } => {
                return Err(refuse(
                    Code::Version,
                    format!("this source speaks transfer protocol version {VERSION}, the peer version {version}"),
                ))
            }
            f => return Err(refuse(Code::BadRequest, format!("expected Hello, got {f:?}"))),
        }
        let hello = Frame::Hello { version: VERSION };
        write_async(tls, &hello)
            .await
            .map_err(|e| refuse(Code::BadRequest, format!("write: {e}")))?;
        let req = match self.opening(tls).await? {
            Frame::Request(r) => r,
            f => {
                return Err(refuse(
                    Code::BadRequest,
                    format!("expected Request, got {}", short(&f)),
                ))
            }
        };
        for n in [&req.volume, &req.snapshot] {
            lamina_engine::check_name(n).map_err(|e| refuse(Code::BadRequest, e.to_string()))?;
        }
        info!(volume = %req.volume, snapshot = %req.snapshot, mode = ?req.mode,
              from = req.from_offset, "transfer: request");
        let (answer, export) = self.open(&req).map_err(engine_or)?;
        let reading = (req.mode == Mode::Pull).then(|| self.register(&req, node));
        let f = Frame::Answer(answer);
        write_async(tls, &f)
            .await
            .map_err(|e| refuse(Code::BadRequest, format!("write: {e}")))?;
        if req.mode == Mode::Describe {
            let end = Frame::End {
                frames: 0,
                data_bytes: 0,
            };
            let _ = write_async(tls, &end).await;
            return Ok(());
        }
        self.stream(tls, export, node).await;
        drop(reading);
        Ok(())
    }

    /// Look up the snapshot, check its id, and start its export at the
    /// request's offset.
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
        let expect = if req.expect_id != 0 {
            req.expect_id
        } else {
            first.id
        };
        if first.id != again.id || first.id != expect {
            return Err(Opened::Replaced(format!(
                "snapshot {v}/{s} is now id {}, the transfer started from id {expect}: it was deleted and made again",
                again.id
            )));
        }
        let data_bytes = export.data_bytes();
        let skipped_bytes = match req.mode {
            Mode::Pull => export.skip_to(req.from_offset),
            Mode::Describe => 0,
        };
        let answer = Answer {
            id: first.id,
            size: first.restore_size,
            data_bytes,
            skipped_bytes,
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
    ) {
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(QUEUE);
        let (give_back, spare) = std::sync::mpsc::channel();
        let pace = self.pace.clone();
        let reader = tokio::task::spawn_blocking(move || read_frames(export, tx, spare, pace));
        let mut failed = None;
        while let Some(buf) = rx.recv().await {
            // A target that takes nothing for this long (its link cut, its
            // host gone) is let go: the snapshot is not held for it.
            let wrote = tokio::time::timeout(STALL_TIMEOUT, tls.write_all(&buf)).await;
            let wrote = wrote.unwrap_or_else(|_| {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the peer took nothing for {} s", STALL_TIMEOUT.as_secs()),
                ))
            });
            if let Err(e) = wrote {
                failed = Some(e);
                break;
            }
            let n = buf.len() as u64;
            let _ = give_back.send(buf);
            self.sent_total.fetch_add(n, Ordering::Relaxed);
            let mut s = self.sent.lock().unwrap_or_else(|p| p.into_inner());
            *s.entry(node.to_string()).or_default() += n;
        }
        drop(rx);
        let _ = reader.await;
        match failed {
            Some(e) => warn!(error = %e, "transfer: peer gone mid-stream"),
            None => match tls.flush().await {
                Ok(()) => info!("transfer: stream sent"),
                Err(e) => warn!(error = %e, "transfer: peer gone at the end of the stream"),
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

fn short(f: &Frame) -> String {
    match f {
        Frame::Data { offset, payload } => format!("Data at {offset} ({} bytes)", payload.len()),
        f => format!("{f:?}"),
    }
}

/// The blocking half: read pieces straight into frame buffers, queue them.
/// Buffers come back on `spare` once written, so a stream reuses a few
/// warm ones rather than allocating (and copying into) a new one per MiB.
/// Stops when the channel closes (the peer is gone).
fn read_frames(
    mut export: lamina_engine::Export,
    tx: mpsc::Sender<Vec<u8>>,
    spare: std::sync::mpsc::Receiver<Vec<u8>>,
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
        let mut buf = spare.try_recv().unwrap_or_default();
        match piece {
            Piece::Data { offset, len } => {
                let payload = wire::data_frame_start(&mut buf, offset, len as usize);
                if let Err(e) = export.read_piece(offset, payload) {
                    warn!(error = %e, "transfer: reading the snapshot failed");
                    let r = engine_refusal(e);
                    let f = Frame::Error {
                        code: r.code,
                        message: r.message,
                    };
                    buf.clear();
                    wire::encode(&f, &mut buf);
                    let _ = tx.blocking_send(buf);
                    return;
                }
                wire::seal_data(&mut buf);
                data_bytes += len;
            }
            Piece::Zero { offset, len } => {
                buf.clear();
                wire::encode(&Frame::Zero { offset, len }, &mut buf);
            }
        }
        frames += 1;
        if tx.blocking_send(buf).is_err() {
            return;
        }
    }
    let mut buf = Vec::new();
    wire::encode(&Frame::End { frames, data_bytes }, &mut buf);
    let _ = tx.blocking_send(buf);
}
