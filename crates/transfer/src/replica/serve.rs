//! The replica's side of a replica session: after Attach, read Calls, run
//! them on the volume handle on the daemon's blocking threads, at the
//! priority of its volume I/O ([`Volumes::runtime`]), and write each Reply
//! as its operation completes, in whatever order they complete.
//!
//! Calls run as the NBD server's requests do, through the shared runners
//! (crate `lamina-runners`): each call is submitted as it is read; on a fast
//! volume one runner takes every call queued, runs them in order and sends
//! their replies to the writer together (one channel send, one socket write
//! for many), instead of a blocking task and two thread wake-ups per call; on
//! a slow one a runner per call. A flush runs on a blocking task of its own
//! (see [`Calls`] for why that keeps its meaning); a snapshot or a snapshot's
//! deletion is the daemon's to make ([`Volumes::run`]).
//!
//! What one session holds is bounded: at most [`SESSION_CALLS`] calls and
//! [`SESSION_CALL_BYTES`] bytes of their data (a write's payload, a read's
//! buffer) between the Call read and its Reply written, and all the node's
//! sessions together at most [`CALL_BYTES`]; at a bound the session reads
//! nothing more from its peer, so a front end that sends faster than the
//! volume answers is held back by TCP.

use crate::frames::{read_async, ReadError, BATCH};
use crate::source::{refuse, Ended, Refusal, Source};
use crate::wire::{self, Answered, Call, CallOp, Code, Frame, OpCode, Outcome, Reply};
use lamina_blockio::{BlockIo, IoDone, IoError, IoErrorKind, IoOp};
use lamina_runners::{answer_inline, Runners, Work};
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::server::TlsStream;
use tracing::{info, warn};

/// Calls a session holds at most (read, running, or answered and not yet
/// written).
pub const SESSION_CALLS: usize = 64;
/// Bytes of call data a session holds at most: writes' payloads and reads'
/// buffers, the same calls as [`SESSION_CALLS`] counts.
pub const SESSION_CALL_BYTES: usize = 8 << 20;
/// Bytes of call data all the replica sessions of a node hold at most
/// together, whatever their number.
pub const CALL_BYTES: usize = 256 << 20;

/// The places a call holds from its Call read until its Reply is written.
struct Held {
    _call: OwnedSemaphorePermit,
    _bytes: OwnedSemaphorePermit,
    _node_bytes: OwnedSemaphorePermit,
}

/// A reply on its way to the socket, with the places its call held.
struct Queued {
    frame: Vec<u8>,
    _held: Held,
}

/// A call on its way to a runner.
struct Job {
    call: Call,
    held: Held,
}

/// What the runners of a session run: its calls on its volume handle; the
/// replies go to the session's writer, a runner's batch in one send.
///
/// A flush is not queued with the other calls but run alone, on a blocking
/// task of its own, so it may complete before calls read ahead of it that
/// a runner holds. That is all the contract asks of a flush
/// (`docs/volume-io.md`, item 4): it covers the writes that had completed
/// before it was submitted, not those in flight. And the front end asks no
/// more: its replicated volume counts a flush as covering only the changes
/// that had completed on every replica before it sent the flush
/// (`lamina_replica`, `Shared::covers`), whose Replies this session had
/// therefore written already, after their calls completed on the volume
/// handle here.
struct Calls {
    io: Arc<dyn BlockIo>,
    tx: mpsc::UnboundedSender<Vec<Queued>>,
}

impl Work for Calls {
    type Job = Job;
    type Done = Queued;

    fn run(&self, job: Job) -> Option<Queued> {
        let (held, tx) = (job.held, self.tx.clone());
        answer_inline(
            |answer| {
                execute(&*self.io, job.call, move |frame| {
                    answer(Queued { frame, _held: held })
                })
            },
            // Completed after the runner moved on: to the writer alone.
            move |q| {
                let _ = tx.send(vec![q]);
            },
        )
    }

    fn deliver(&self, batch: Vec<Queued>) {
        let _ = self.tx.send(batch);
    }
}

/// Serve a replica session on `volume` for `node`, once its Attach is read
/// (with `create` above 0: made first, of that size, if missing), in
/// protocol `version`.
pub(crate) async fn session(
    source: &Source,
    tls: &mut TlsStream<TcpStream>,
    node: &str,
    volume: String,
    create: u64,
    version: u16,
) -> Result<Ended, Refusal> {
    let volumes = super::served(source, &volume)?;
    let (v, peer, name) = (volumes.clone(), node.to_string(), volume.clone());
    let opened = tokio::task::spawn_blocking(move || {
        let io = v.open(&name, &peer, (create > 0).then_some(create))?;
        let size = io.size()?;
        Ok::<_, IoError>((io, size))
    })
    .await
    .map_err(|e| refuse(Code::SourceIo, format!("opening the volume failed: {e}")))?;
    let (io, size) = opened.map_err(|e| match e.kind {
        IoErrorKind::Gone => refuse(Code::VolumeMissing, e.message),
        IoErrorKind::Invalid => refuse(Code::BadRequest, e.message),
        _ => refuse(Code::SourceIo, e.to_string()),
    })?;
    let attached = Frame::Attached {
        size,
        caps: io.caps(),
        read_only: io.read_only(),
        instance: if version >= wire::INSTANCE_VERSION {
            volumes.instance(&volume)
        } else {
            None
        },
    };
    if source.send(tls, &attached).await == Ended::Gone {
        return Ok(Ended::Gone);
    }
    info!(volume = %volume, "replica: attached");

    let calls = Arc::new(Semaphore::new(SESSION_CALLS));
    let bytes = Arc::new(Semaphore::new(SESSION_CALL_BYTES));
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<Queued>>();
    let runners = Arc::new(Runners::new(
        Calls {
            io: io.clone(),
            tx: tx.clone(),
        },
        volumes.runtime(),
        SESSION_CALLS,
    ));
    let (rd, mut wr) = tokio::io::split(&mut *tls);
    // Buffered, so that the reader knows whether another call is here
    // already (a call is lone only if not).
    let mut rd = tokio::io::BufReader::with_capacity(64 << 10, rd);
    let stall = source.limits().stall_timeout;
    let writer = async {
        // The replies ready meanwhile go out together (small ones copied
        // into one buffer of up to BATCH bytes: one TLS record and one
        // system call for many); their places are given back once written.
        let (mut held, mut buf) = (Vec::new(), Vec::new());
        while let Some(first) = rx.recv().await {
            held.push(first);
            while let Ok(more) = rx.try_recv() {
                held.push(more);
            }
            for q in held.iter().flatten() {
                if !buf.is_empty() && buf.len() + q.frame.len() > BATCH {
                    source.timed(wr.write_all(&buf)).await?;
                    buf.clear();
                }
                if q.frame.len() >= BATCH {
                    source.timed(wr.write_all(&q.frame)).await?;
                } else {
                    buf.extend_from_slice(&q.frame);
                }
            }
            if !buf.is_empty() {
                source.timed(wr.write_all(&buf)).await?;
                buf.clear();
            }
            held.clear();
            if rx.is_empty() {
                source.timed(wr.flush()).await?;
            }
        }
        Ok::<(), std::io::Error>(())
    };
    let reader = async {
        loop {
            // The front end pings an idle session well within this.
            let read = tokio::time::timeout(stall, read_async(&mut rd)).await;
            let call = match read {
                Ok(Ok((Frame::Call(c), _))) => c,
                Ok(Ok((f, _))) => {
                    return Err(refuse(
                        Code::BadRequest,
                        format!("expected Call, got {}", f.summary()),
                    ))
                }
                Ok(Err(ReadError::Wire(e))) => return Err(refuse(Code::BadRequest, e.to_string())),
                Ok(Err(ReadError::Io(e))) => {
                    if e.kind() == std::io::ErrorKind::UnexpectedEof {
                        info!("replica: the front end closed the session");
                    } else {
                        warn!(error = %e, "replica: front end gone");
                    }
                    return Ok(Ended::Gone);
                }
                Err(_) => {
                    warn!(
                        "replica: the front end sent nothing for {} s",
                        stall.as_secs_f64()
                    );
                    return Ok(Ended::Gone);
                }
            };
            let cost = match &call.op {
                CallOp::Write { data, .. } => data.len(),
                CallOp::Read { len, .. } => *len as usize,
                _ => 0,
            }
            .max(1) as u32;
            // The session's own places first, then the node's: a session
            // waiting for the node's holds back only itself.
            let (Ok(call_permit), Ok(bytes_permit), Ok(node_permit)) = (
                calls.clone().acquire_owned().await,
                bytes.clone().acquire_many_owned(cost).await,
                source.call_bytes().acquire_many_owned(cost).await,
            ) else {
                return Ok(Ended::Gone);
            };
            let held = Held {
                _call: call_permit,
                _bytes: bytes_permit,
                _node_bytes: node_permit,
            };
            if let CallOp::Snapshot { name, .. } | CallOp::DeleteSnapshot { name } = &call.op {
                // The daemon's, not the volume handle's, to make.
                let (origin, group) = match &call.op {
                    CallOp::Snapshot { origin, group, .. } => (*origin, *group),
                    _ => (0, false),
                };
                let (v, name, volume, peer) = (
                    volumes.clone(),
                    name.clone(),
                    volume.clone(),
                    node.to_string(),
                );
                let (tag, code, tx) = (call.tag, call.op.code(), tx.clone());
                volumes.run(Box::new(move || {
                    let (done, answered) = match code {
                        OpCode::Snapshot => (
                            v.snapshot(&volume, &name, origin, group, &peer),
                            Answered::Snapshot,
                        ),
                        _ => (
                            v.delete_snapshot(&volume, &name, &peer),
                            Answered::DeleteSnapshot,
                        ),
                    };
                    let outcome = match done {
                        Ok(()) => Outcome::Done(answered),
                        Err(e) => Outcome::Failed {
                            op: code,
                            kind: e.kind,
                            message: e.message,
                        },
                    };
                    let mut frame = Vec::new();
                    wire::encode(&Frame::Reply(Reply { tag, outcome }), &mut frame);
                    let _ = tx.send(vec![Queued { frame, _held: held }]);
                }));
                continue;
            }
            let job = Job { call, held };
            if matches!(job.call.op, CallOp::Flush) {
                // Not behind the calls queued: see `Calls`.
                runners.run_alone(job);
            } else if rd.buffer().is_empty() {
                // A lone call (no other read behind it) on a fast volume
                // runs here, on the reader (the daemon's runtime has other
                // workers); its reply goes to the writer of this same task,
                // with no thread woken.
                match runners.run_here_if_idle(job) {
                    Ok(Some(done)) => {
                        let _ = tx.send(vec![done]);
                    }
                    Ok(None) => {}
                    Err(job) => runners.submit(&mut VecDeque::from([job])),
                }
            } else {
                runners.submit(&mut VecDeque::from([job]));
            }
        }
    };
    let ended = tokio::select! {
        r = reader => r,
        w = writer => match w {
            Ok(()) => Ok(Ended::Gone),
            Err(e) => {
                warn!(error = %e, "replica: front end gone");
                Ok(Ended::Gone)
            }
        },
    };
    info!(volume = %volume, "replica: session ended");
    ended
}

/// Run one call on `io`; `reply` gets its encoded Reply frame, once, from
/// whichever thread completes it.
fn execute(io: &dyn BlockIo, call: Call, reply: impl FnOnce(Vec<u8>) + Send + 'static) {
    let tag = call.tag;
    let code = call.op.code();
    let send = move |outcome: Outcome| {
        let mut frame = Vec::new();
        wire::encode(&Frame::Reply(Reply { tag, outcome }), &mut frame);
        reply(frame)
    };
    let failed = move |e: IoError| Outcome::Failed {
        op: code,
        kind: e.kind,
        message: e.message,
    };
    let op = match call.op {
        CallOp::Read { offset, len } => IoOp::Read {
            offset,
            buf: vec![0; len as usize],
        },
        CallOp::Write { offset, data, fua } => IoOp::Write { offset, data, fua },
        CallOp::Flush => IoOp::Flush,
        CallOp::Trim { offset, len } => IoOp::Trim { offset, len },
        CallOp::WriteZeroes {
            offset,
            len,
            may_trim,
        } => IoOp::WriteZeroes {
            offset,
            len,
            may_trim,
        },
        CallOp::BlockStatus { offset, len } => IoOp::BlockStatus { offset, len },
        CallOp::Activate { generation } => {
            return send(match io.activate(generation) {
                Ok(()) => Outcome::Done(Answered::Activate),
                Err(e) => failed(e),
            })
        }
        CallOp::Size => {
            return send(match io.size() {
                Ok(s) => Outcome::Done(Answered::Size(s)),
                Err(e) => failed(e),
            })
        }
        CallOp::Ping => return send(Outcome::Done(Answered::Ping)),
        // Taken by the session's reader to the daemon.
        CallOp::Snapshot { .. } | CallOp::DeleteSnapshot { .. } => {
            return send(failed(IoError::new(
                IoErrorKind::NotSupported,
                "a snapshot is the node's to make",
            )))
        }
    };
    io.submit(
        op,
        Box::new(move |r| {
            send(match r {
                Ok(IoDone::Read(data)) => Outcome::Done(Answered::Read(data)),
                Ok(IoDone::Write(_)) => Outcome::Done(Answered::Write),
                Ok(IoDone::Flush) => Outcome::Done(Answered::Flush),
                Ok(IoDone::Trim) => Outcome::Done(Answered::Trim),
                Ok(IoDone::WriteZeroes) => Outcome::Done(Answered::WriteZeroes),
                Ok(IoDone::BlockStatus(mut extents)) => {
                    extents.truncate(wire::MAX_EXTENTS);
                    if extents.is_empty() {
                        Outcome::Failed {
                            op: OpCode::BlockStatus,
                            kind: IoErrorKind::Io,
                            message: "the volume answered no extent".into(),
                        }
                    } else {
                        Outcome::Done(Answered::BlockStatus(extents))
                    }
                }
                Err(e) => failed(e),
            })
        }),
    );
}
