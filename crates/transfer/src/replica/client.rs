//! The front end's side of a replica session: [`RemoteVolume`], a
//! [`BlockIo`] whose operations run on a volume of another node. Each
//! operation is a Call with a tag of its own, written by the session's
//! writer task in the order submitted; the reader task matches each Reply
//! to its call by tag and completes it, in whatever order the replica
//! answers. The session's tasks run on a runtime of their own (two
//! threads, shared by every session of the process), and completions are
//! called from its reader task: a completion that blocks holds that
//! session's later replies back, not the other sessions'.
//!
//! A session never reconnects: once it fails (its connection lost, a reply
//! it cannot read, or its replica silent for [`SessionOptions::silence`]
//! while calls wait), every call waiting and every later one fails with
//! [`IoErrorKind::Io`]; a front end takes that replica out of its healthy
//! set and brings it back through a rebuild, on a new session.

use crate::conn::{io_error, Remote};
use crate::error::TransferError;
use crate::frames::{gather, read_async, ReadError};
use crate::tls::Identity;
use crate::wire::{
    self, Answered, Code, Frame, OpCode, Outcome, Reply, FLAG_FUA, FLAG_MAY_TRIM, GROUP_VERSION,
    INSTANCE_VERSION, ORIGIN_VERSION, REPLICA_VERSION, RETIRE_VERSION,
};
use lamina_blockio::{BlockIo, Caps, Completion, IoDone, IoError, IoErrorKind, IoOp};
use rustls::pki_types::ServerName;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tracing::{info, warn};

/// How a front end's session watches its replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    /// A replica that answers nothing for this long while calls wait for
    /// it is taken for gone: the session is cut and its calls fail.
    pub silence: Duration,
    /// An idle session sends a Ping this often: its replica keeps a session
    /// that pings, and a dead link shows before the next call needs it.
    pub ping_every: Duration,
    /// How long connecting, the TLS handshake, and each of Hello and
    /// Attach may take.
    pub connect_timeout: Duration,
}

impl SessionOptions {
    /// Default of [`SessionOptions::silence`].
    pub const SILENCE: Duration = Duration::from_secs(5);
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            silence: SessionOptions::SILENCE,
            ping_every: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// The runtime every front end's session runs on: one thread, so that a
/// session's writer and reader tasks, and the wake-ups between them, stay
/// on it rather than bouncing between workers (measured in the bench's
/// replicated case: docs/bench-history.md).
fn runtime() -> Result<&'static tokio::runtime::Runtime, TransferError> {
    static RT: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("lamina-replica")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| TransferError::Invalid(format!("cannot start the replica sessions' runtime: {e}")))
}

/// What a waiting call is completed with.
type Answer = Box<dyn FnOnce(Result<Answered, IoError>) + Send>;

/// A call sent, waiting for its reply.
struct Waiting {
    op: OpCode,
    /// A read's length (its reply must carry exactly this much).
    len: u64,
    sent: Instant,
    done: Answer,
    /// The operation and range, for its error.
    at: (&'static str, u64, u64),
}

#[derive(Default)]
struct Calls {
    next: u64,
    waiting: HashMap<u64, Waiting>,
    /// Why the session failed, once it has.
    dead: Option<String>,
    /// When a reply last came, and a call was last sent.
    heard: Option<Instant>,
    sent: Option<Instant>,
}

struct Session {
    /// "volume V on node N (address)", for errors.
    peer: String,
    calls: Mutex<Calls>,
    out: mpsc::UnboundedSender<Vec<u8>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// A volume of another node, reached over a replica session (see the
/// module). Dropping it closes the session.
pub struct RemoteVolume {
    session: Arc<Session>,
    size: u64,
    caps: Caps,
    read_only: bool,
    /// The session's protocol version: 5, or 3 or 2 with a replica's node
    /// of that version (at 2 its snapshots get no origin).
    version: u16,
    /// The replica's node's instance, as its Attached said (version 5).
    instance: Option<u64>,
}

impl RemoteVolume {
    /// Connect to `remote` as `identity`, authenticate both ways, and
    /// attach to its volume `volume`: a new handle, never activated.
    /// Blocks; call it from a thread that may (not an async reactor).
    pub fn connect(
        identity: &Identity,
        remote: &Remote,
        volume: &str,
        options: SessionOptions,
    ) -> Result<RemoteVolume, TransferError> {
        RemoteVolume::open(identity, remote, volume, 0, options)
    }

    /// [`RemoteVolume::connect`], making the volume first (`size` bytes)
    /// if the replica's node has none of that name.
    pub fn create(
        identity: &Identity,
        remote: &Remote,
        volume: &str,
        size: u64,
        options: SessionOptions,
    ) -> Result<RemoteVolume, TransferError> {
        if size == 0 {
            return Err(TransferError::Invalid(format!(
                "volume {volume}: a replica of 0 bytes"
            )));
        }
        RemoteVolume::open(identity, remote, volume, size, options)
    }

    fn open(
        identity: &Identity,
        remote: &Remote,
        volume: &str,
        create: u64,
        options: SessionOptions,
    ) -> Result<RemoteVolume, TransferError> {
        let rt = runtime()?;
        let config = identity.client_config();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let (remote, volume) = (remote.clone(), volume.to_string());
        rt.spawn(async move {
            // A replica's node of an older version refuses a newer Hello
            // (code 1): a session of version 5 does all but mark a group
            // snapshot's members, one of 3 also says no node's instance,
            // one of 2 also gives snapshots no origin.
            let mut r = Err(TransferError::Invalid("no version tried".into()));
            for version in [
                GROUP_VERSION,
                INSTANCE_VERSION,
                ORIGIN_VERSION,
                REPLICA_VERSION,
            ] {
                r = attach(config.clone(), &remote, &volume, create, options, version).await;
                if !matches!(
                    &r,
                    Err(TransferError::Remote {
                        code: Code::Version,
                        ..
                    })
                ) {
                    break;
                }
            }
            let _ = tx.send(r);
        });
        let (tls, peer, size, caps, read_only, instance, version) = rx.recv().map_err(|_| {
            TransferError::Invalid("the replica sessions' runtime stopped".into())
        })??;
        let (out, rx) = mpsc::unbounded_channel();
        let session = Arc::new(Session {
            peer,
            calls: Mutex::default(),
            out,
            tasks: Mutex::default(),
        });
        let (rd, wr) = tokio::io::split(tls);
        let tasks = vec![
            rt.spawn(write_calls(session.clone(), wr, rx)),
            rt.spawn(read_replies(session.clone(), rd)),
            rt.spawn(watch(session.clone(), options)),
        ];
        session.lock_tasks().extend(tasks);
        info!(peer = %session.peer, version, "replica session attached");
        Ok(RemoteVolume {
            session,
            size,
            caps,
            read_only,
            version,
            instance,
        })
    }

    /// The replica's node's instance, if it said one (`Volumes::instance`):
    /// two sessions that got the same one reached a node that lost nothing
    /// it acknowledged in between.
    pub fn instance(&self) -> Option<u64> {
        self.instance
    }

    /// Snapshot the replica's volume as `name`, a copy of the snapshot
    /// whose identity is `origin` (`crate::identity`; an existing snapshot
    /// of that name and origin is as good), and wait for it; with `group`,
    /// a member of the group snapshot `name`, labelled so there. In a
    /// session of version 2 the origin is not sent, and below version 6
    /// the group is not. Blocks.
    pub fn snapshot(&self, name: &str, origin: u64, group: bool) -> Result<(), IoError> {
        let origin = if self.version >= ORIGIN_VERSION {
            origin
        } else {
            0
        };
        let flags = if group && self.version >= GROUP_VERSION {
            wire::FLAG_GROUP
        } else {
            0
        };
        self.named_call(OpCode::Snapshot, name, origin, flags)
    }

    /// Delete the replica's snapshot `name` (one not there is as good),
    /// and wait for it. Blocks.
    pub fn delete_snapshot(&self, name: &str) -> Result<(), IoError> {
        self.named_call(OpCode::DeleteSnapshot, name, 0, 0)
    }

    /// A call whose payload is a snapshot's name (and whose offset its
    /// origin), waited for.
    fn named_call(&self, op: OpCode, name: &str, offset: u64, flags: u8) -> Result<(), IoError> {
        if name.is_empty() || name.len() > wire::MAX_NAME {
            return Err(IoError::new(
                IoErrorKind::Invalid,
                format!("snapshot name of {} bytes", name.len()),
            )
            .at((op_name(op), 0, 0)));
        }
        self.call_and_wait(op, flags, offset, name.as_bytes())
            .map(|_| ())
    }

    /// Why the session failed, if it has, naming the replica as its
    /// calls' errors do.
    pub fn failed(&self) -> Option<String> {
        let why = self.session.lock().dead.clone()?;
        Some(format!("replica {}: {why}", self.session.peer))
    }

    /// Run one call that is not I/O (size, activate, a snapshot's) and
    /// wait for its answer.
    fn call_and_wait(
        &self,
        op: OpCode,
        flags: u8,
        offset: u64,
        payload: &[u8],
    ) -> Result<Answered, IoError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let at = (op_name(op), 0, 0);
        self.session.call(
            op,
            flags,
            offset,
            payload.len() as u64,
            payload,
            at,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.recv().unwrap_or_else(|_| {
            Err(IoError::new(IoErrorKind::Io, "the replica session dropped a call").at(at))
        })
    }
}

/// A call's name in errors, as the trait names its operations.
fn op_name(op: OpCode) -> &'static str {
    match op {
        OpCode::Read => "read",
        OpCode::Write => "write",
        OpCode::Flush => "flush",
        OpCode::Trim => "trim",
        OpCode::WriteZeroes => "write-zeroes",
        OpCode::BlockStatus => "block-status",
        OpCode::Activate => "activate",
        OpCode::Size => "size",
        OpCode::Ping => "ping",
        OpCode::Snapshot => "snapshot",
        OpCode::DeleteSnapshot => "delete-snapshot",
    }
}

impl Drop for RemoteVolume {
    fn drop(&mut self) {
        self.session.kill("the front end closed the session".into());
    }
}

/// TCP, TLS, Hellos and Attach; the stream, the peer's description, and
/// what Attached said.
async fn attach(
    config: Arc<rustls::ClientConfig>,
    remote: &Remote,
    volume: &str,
    create: u64,
    o: SessionOptions,
    version: u16,
) -> Result<
    (
        TlsStream<TcpStream>,
        String,
        u64,
        Caps,
        bool,
        Option<u64>,
        u16,
    ),
    TransferError,
> {
    let first = Frame::Attach {
        create,
        volume: volume.to_string(),
    };
    let (tls, peer, answer) = opening(config, remote, volume, first, o, version).await?;
    match answer {
        Frame::Attached {
            size,
            caps,
            read_only,
            instance,
        } => Ok((tls, peer, size, caps, read_only, instance, version)),
        f => Err(TransferError::Protocol {
            peer,
            detail: format!("expected Attached, got {}", f.summary()),
        }),
    }
}

/// Delete the replica's volume `volume` on `remote`'s node, made for this
/// node's front end (with `check`, only find out whether it is there to
/// delete): whether it was there. A session of its own, of version 4: a
/// node of an older version refuses it (code 1), and so does one whose
/// volume of that name is not a replica of this node's (code 10,
/// [`Code::NotReplica`]). Blocks; call it from a thread that may.
pub fn retire(
    identity: &Identity,
    remote: &Remote,
    volume: &str,
    check: bool,
    connect_timeout: Duration,
) -> Result<bool, TransferError> {
    let rt = runtime()?;
    let config = identity.client_config();
    let o = SessionOptions {
        connect_timeout,
        ..SessionOptions::default()
    };
    let (remote, volume) = (remote.clone(), volume.to_string());
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    rt.spawn(async move {
        let first = Frame::Retire {
            check,
            volume: volume.clone(),
        };
        let r = match opening(config, &remote, &volume, first, o, RETIRE_VERSION).await {
            Ok((mut tls, _, Frame::Retired { existed })) => {
                let _ = tls.shutdown().await;
                Ok(existed)
            }
            Ok((_, peer, f)) => Err(TransferError::Protocol {
                peer,
                detail: format!("expected Retired, got {}", f.summary()),
            }),
            Err(e) => Err(e),
        };
        let _ = tx.send(r);
    });
    rx.recv()
        .map_err(|_| TransferError::Invalid("the replica sessions' runtime stopped".into()))?
}

/// TCP, TLS, Hellos in `version`, then `first` (an Attach, a Retire); the
/// stream, the peer's description, and the frame that answered `first`
/// (an Error is returned as the error it says).
async fn opening(
    config: Arc<rustls::ClientConfig>,
    remote: &Remote,
    volume: &str,
    first: Frame,
    o: SessionOptions,
    version: u16,
) -> Result<(TlsStream<TcpStream>, String, Frame), TransferError> {
    let unreachable = |source| TransferError::Unreachable {
        address: remote.address.clone(),
        source,
    };
    let timed_out = || std::io::Error::from(std::io::ErrorKind::TimedOut);
    let addrs = tokio::net::lookup_host(&remote.address)
        .await
        .map_err(unreachable)?;
    let mut last = None;
    let mut tcp = None;
    for a in addrs {
        match tokio::time::timeout(o.connect_timeout, TcpStream::connect(a)).await {
            Ok(Ok(s)) => {
                tcp = Some(s);
                break;
            }
            Ok(Err(e)) => last = Some(e),
            Err(_) => last = Some(timed_out()),
        }
    }
    let tcp = tcp
        .ok_or_else(|| unreachable(last.unwrap_or_else(|| std::io::ErrorKind::NotFound.into())))?;
    let peer = format!("volume {volume} on {} ({})", remote.node, remote.address);
    let _ = tcp.set_nodelay(true);
    let name = ServerName::try_from(remote.node.clone()).map_err(|_| {
        TransferError::Invalid(format!("node name {:?} is not a DNS name", remote.node))
    })?;
    let connector = TlsConnector::from(config);
    let mut tls = match tokio::time::timeout(o.connect_timeout, connector.connect(name, tcp)).await
    {
        Ok(r) => r.map_err(|e| io_error(&peer, e))?,
        Err(_) => return Err(io_error(&peer, timed_out())),
    };
    let protocol = |detail: String| TransferError::Protocol {
        peer: peer.clone(),
        detail,
    };
    let refused = |code: Code, message: String| TransferError::Remote {
        peer: peer.clone(),
        volume: volume.to_string(),
        snapshot: String::new(),
        code,
        message,
    };
    let send = |f: Frame| {
        let mut buf = Vec::new();
        wire::encode(&f, &mut buf);
        buf
    };
    let mut exchange = async |f: Frame| -> Result<Frame, TransferError> {
        tls.write_all(&send(f))
            .await
            .map_err(|e| io_error(&peer, e))?;
        tls.flush().await.map_err(|e| io_error(&peer, e))?;
        match tokio::time::timeout(o.connect_timeout, read_async(&mut tls)).await {
            Ok(Ok((f, _))) => Ok(f),
            Ok(Err(ReadError::Io(e))) => Err(io_error(&peer, e)),
            Ok(Err(ReadError::Wire(e))) => Err(protocol(e.to_string())),
            Err(_) => Err(io_error(&peer, timed_out())),
        }
    };
    match exchange(Frame::Hello { version }).await? {
        Frame::Hello { version: v } if v == version => {}
        Frame::Hello { version: v } => {
            return Err(protocol(format!(
                "the replica's node speaks transfer protocol version {v}, this front end asked for {version}"
            )))
        }
        Frame::Error { code, message } => return Err(refused(code, message)),
        f => return Err(protocol(format!("expected Hello, got {}", f.summary()))),
    }
    match exchange(first).await? {
        Frame::Error { code, message } => Err(refused(code, message)),
        f => Ok((tls, peer, f)),
    }
}

impl Session {
    fn lock(&self) -> MutexGuard<'_, Calls> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_tasks(&self) -> MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn error(&self, kind: IoErrorKind, message: &str) -> IoError {
        IoError::new(kind, format!("replica {}: {message}", self.peer))
    }

    /// Send a call; `done` gets its answer once (an error if the session
    /// has failed or fails before the reply).
    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        op: OpCode,
        flags: u8,
        offset: u64,
        len: u64,
        payload: &[u8],
        at: (&'static str, u64, u64),
        done: Answer,
    ) {
        let tag = self.tag();
        let mut frame = Vec::new();
        wire::encode_call(tag, op, flags, offset, len, payload, &mut frame);
        self.send(tag, frame, op, len, at, done)
    }

    /// A tag for a call not yet sent.
    fn tag(&self) -> u64 {
        let mut c = self.lock();
        c.next += 1;
        c.next
    }

    /// Send call `tag`'s frame, and wait for its reply.
    fn send(
        &self,
        tag: u64,
        frame: Vec<u8>,
        op: OpCode,
        len: u64,
        at: (&'static str, u64, u64),
        done: Answer,
    ) {
        let now = Instant::now();
        {
            let mut c = self.lock();
            if let Some(why) = &c.dead {
                let e = self.error(IoErrorKind::Io, why).at(at);
                drop(c);
                return done(Err(e));
            }
            c.sent = Some(now);
            c.waiting.insert(
                tag,
                Waiting {
                    op,
                    len,
                    sent: now,
                    done,
                    at,
                },
            );
        }
        if self.out.send(frame).is_err() {
            self.kill("the session's writer stopped".into());
        }
    }

    /// The session failed (or was closed): every call waiting fails, and
    /// every later one at once; its tasks stop and its socket closes.
    fn kill(&self, why: String) {
        let waiting = {
            let mut c = self.lock();
            if c.dead.is_none() {
                if !why.starts_with("the front end closed") {
                    warn!(peer = %self.peer, reason = %why, "replica session failed");
                }
                c.dead = Some(why.clone());
            }
            std::mem::take(&mut c.waiting)
        };
        for t in self.lock_tasks().drain(..) {
            t.abort();
        }
        for (_, w) in waiting {
            (w.done)(Err(self.error(IoErrorKind::Io, &why).at(w.at)));
        }
    }

    /// A reply arrived: complete its call.
    fn answer(&self, r: Reply) {
        let w = {
            let mut c = self.lock();
            c.heard = Some(Instant::now());
            c.waiting.remove(&r.tag)
        };
        let Some(w) = w else {
            return self.kill(format!(
                "a reply for tag {}, which no call waits for",
                r.tag
            ));
        };
        let result = match r.outcome {
            Outcome::Done(a) if a.code() != w.op => Err(format!(
                "a {:?} reply to a {:?} call (tag {})",
                a.code(),
                w.op,
                r.tag
            )),
            Outcome::Done(Answered::Read(d)) if d.len() as u64 != w.len => Err(format!(
                "{} bytes in reply to a read of {} (tag {})",
                d.len(),
                w.len,
                r.tag
            )),
            Outcome::Done(a) => Ok(Ok(a)),
            Outcome::Failed { op, .. } if op != w.op => Err(format!(
                "a {op:?} failure in reply to a {:?} call (tag {})",
                w.op, r.tag
            )),
            Outcome::Failed { kind, message, .. } => Ok(Err(self.error(kind, &message).at(w.at))),
        };
        match result {
            Ok(r) => (w.done)(r),
            Err(why) => {
                let e = self.error(IoErrorKind::Io, &why).at(w.at);
                (w.done)(Err(e));
                self.kill(why);
            }
        }
    }
}

/// The writer task: calls to the socket in the order sent.
async fn write_calls(
    s: Arc<Session>,
    mut wr: tokio::io::WriteHalf<TlsStream<TcpStream>>,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
) {
    // The calls queued meanwhile go out together: one TLS record and one
    // system call for many small calls.
    let (mut taken, mut batch) = (Vec::new(), Vec::new());
    while let Some(frame) = rx.recv().await {
        taken.clear();
        taken.push(frame);
        let mut r = wr.write_all(gather(&mut rx, &mut taken, &mut batch)).await;
        if r.is_ok() && rx.is_empty() {
            r = wr.flush().await;
        }
        if let Err(e) = r {
            return s.kill(format!("writing to the replica failed: {e}"));
        }
    }
}

/// The reader task: replies to their calls.
async fn read_replies(s: Arc<Session>, mut rd: tokio::io::ReadHalf<TlsStream<TcpStream>>) {
    loop {
        match read_async(&mut rd).await {
            Ok((Frame::Reply(r), _)) => s.answer(r),
            Ok((Frame::Error { code, message }, _)) => {
                return s.kill(format!(
                    "the replica ended the session: {message} ({code:?})"
                ))
            }
            Ok((f, _)) => return s.kill(format!("expected Reply, got {}", f.summary())),
            Err(ReadError::Wire(e)) => return s.kill(e.to_string()),
            Err(ReadError::Io(e)) => return s.kill(format!("connection lost: {e}")),
        }
    }
}

/// The watchdog: cuts a session whose replica went silent, and pings an
/// idle one.
async fn watch(s: Arc<Session>, o: SessionOptions) {
    let tick = o
        .ping_every
        .min(o.silence / 4)
        .max(Duration::from_millis(10));
    let mut every = tokio::time::interval(tick);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let (quiet, idle) = {
            let c = s.lock();
            if c.dead.is_some() {
                return;
            }
            // Silent since the later of its last reply and the oldest
            // call still waiting.
            let quiet = c
                .waiting
                .values()
                .map(|w| w.sent)
                .min()
                .map(|oldest| c.heard.map_or(oldest, |h| h.max(oldest)).elapsed());
            let idle = c.waiting.is_empty() && c.sent.is_none_or(|t| t.elapsed() >= o.ping_every);
            (quiet, idle)
        };
        if quiet.is_some_and(|q| q >= o.silence) {
            return s.kill(format!("no answer for {} s", o.silence.as_secs_f64()));
        }
        if idle {
            s.call(OpCode::Ping, 0, 0, 0, &[], ("ping", 0, 0), Box::new(|_| {}));
        }
    }
}

/// A successful answer as the trait's outcome (a write's, whose buffer
/// comes back, is made by [`write`]).
fn done_of(a: Answered) -> IoDone {
    match a {
        Answered::Read(d) => IoDone::Read(d),
        Answered::Write => IoDone::Write(Vec::new()),
        Answered::Flush => IoDone::Flush,
        Answered::Trim => IoDone::Trim,
        Answered::WriteZeroes => IoDone::WriteZeroes,
        Answered::BlockStatus(e) => IoDone::BlockStatus(e),
        // Never the answer of a submitted operation: a reply's op is
        // checked against its call's.
        Answered::Activate
        | Answered::Size(_)
        | Answered::Ping
        | Answered::Snapshot
        | Answered::DeleteSnapshot => IoDone::Flush,
    }
}

impl BlockIo for RemoteVolume {
    fn size(&self) -> Result<u64, IoError> {
        match self.call_and_wait(OpCode::Size, 0, 0, &[])? {
            Answered::Size(s) => Ok(s),
            _ => Ok(self.size),
        }
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn caps(&self) -> Caps {
        self.caps
    }

    fn activate(&self, generation: u64) -> Result<(), IoError> {
        self.call_and_wait(OpCode::Activate, 0, generation, &[])
            .map(|_| ())
    }

    fn submit(&self, op: IoOp, done: Completion) {
        let at = op.describe();
        let s = &self.session;
        let simple = |done: Completion| -> Answer { Box::new(move |r| done(r.map(done_of))) };
        match op {
            IoOp::Read { offset, buf } => read(s, offset, buf, done),
            IoOp::Write { offset, data, fua } => write(s, offset, data, fua, done),
            IoOp::Flush => s.call(OpCode::Flush, 0, 0, 0, &[], at, simple(done)),
            IoOp::Trim { offset, len } => {
                s.call(OpCode::Trim, 0, offset, len, &[], at, simple(done))
            }
            IoOp::WriteZeroes {
                offset,
                len,
                may_trim,
            } => {
                let flags = if may_trim { FLAG_MAY_TRIM } else { 0 };
                s.call(
                    OpCode::WriteZeroes,
                    flags,
                    offset,
                    len,
                    &[],
                    at,
                    simple(done),
                )
            }
            IoOp::BlockStatus { offset, len } => {
                s.call(OpCode::BlockStatus, 0, offset, len, &[], at, simple(done))
            }
        }
    }
}

/// Calls of at most a frame's payload each: a read or write larger than
/// that is split, and completes once every part has, with the first
/// error if one failed (the trait lets a failed write have taken effect
/// in part).
struct Parts {
    remaining: usize,
    /// The read's buffer filled part by part, or the write's data to give
    /// back.
    buf: Vec<u8>,
    failed: Option<IoError>,
    done: Option<Completion>,
    write: bool,
}

fn part_done(parts: &Arc<Mutex<Parts>>, offset_in: usize, r: Result<Answered, IoError>) {
    let mut p = parts.lock().unwrap_or_else(|p| p.into_inner());
    match r {
        Ok(Answered::Read(d)) => p.buf[offset_in..offset_in + d.len()].copy_from_slice(&d),
        Ok(_) => {}
        Err(e) => {
            p.failed.get_or_insert(e);
        }
    }
    p.remaining -= 1;
    if p.remaining > 0 {
        return;
    }
    let done = p.done.take();
    let buf = std::mem::take(&mut p.buf);
    let r = match p.failed.take() {
        Some(e) => Err(e),
        None if p.write => Ok(IoDone::Write(buf)),
        None => Ok(IoDone::Read(buf)),
    };
    drop(p);
    if let Some(done) = done {
        done(r)
    }
}

/// The pieces of `[0, len)` calls cover: (start, length).
fn pieces(len: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len)
        .step_by(wire::MAX_DATA)
        .map(move |a| (a, wire::MAX_DATA.min(len - a)))
}

fn read(s: &Arc<Session>, offset: u64, buf: Vec<u8>, done: Completion) {
    let len = buf.len();
    if len == 0 {
        return done(Ok(IoDone::Read(buf)));
    }
    if len <= wire::MAX_DATA {
        // The reply's buffer is the caller's (the one given is dropped).
        return s.call(
            OpCode::Read,
            0,
            offset,
            len as u64,
            &[],
            ("read", offset, len as u64),
            Box::new(move |r| done(r.map(done_of))),
        );
    }
    let n = pieces(len).count();
    let parts = Arc::new(Mutex::new(Parts {
        remaining: n,
        buf,
        failed: None,
        done: Some(done),
        write: false,
    }));
    for (a, l) in pieces(len) {
        let p = parts.clone();
        let o = offset + a as u64;
        s.call(
            OpCode::Read,
            0,
            o,
            l as u64,
            &[],
            ("read", o, l as u64),
            Box::new(move |r| part_done(&p, a, r)),
        );
    }
}

fn write(s: &Arc<Session>, offset: u64, data: Vec<u8>, fua: bool, done: Completion) {
    let len = data.len();
    if len == 0 {
        return done(Ok(IoDone::Write(data)));
    }
    let flags = if fua { FLAG_FUA } else { 0 };
    // The frames are built from the caller's buffer, which then travels
    // with the completion to be given back.
    let frame = |a: usize, l: usize| {
        let tag = s.tag();
        let mut frame = Vec::new();
        let o = offset + a as u64;
        wire::encode_call(
            tag,
            OpCode::Write,
            flags,
            o,
            l as u64,
            &data[a..a + l],
            &mut frame,
        );
        (tag, frame)
    };
    if len <= wire::MAX_DATA {
        let (tag, frame) = frame(0, len);
        let at = ("write", offset, len as u64);
        return s.send(
            tag,
            frame,
            OpCode::Write,
            len as u64,
            at,
            Box::new(move |r| done(r.map(|_| IoDone::Write(data)))),
        );
    }
    let frames: Vec<(u64, usize, Vec<u8>)> = pieces(len)
        .map(|(a, l)| {
            let (tag, f) = frame(a, l);
            (tag, a, f)
        })
        .collect();
    let parts = Arc::new(Mutex::new(Parts {
        remaining: frames.len(),
        buf: data,
        failed: None,
        done: Some(done),
        write: true,
    }));
    for (tag, a, frame) in frames {
        let p = parts.clone();
        let l = wire::MAX_DATA.min(len - a) as u64;
        let o = offset + a as u64;
        s.send(
            tag,
            frame,
            OpCode::Write,
            l,
            ("write", o, l),
            Box::new(move |r| part_done(&p, a, r)),
        );
    }
}
