//! The target side: describe a remote snapshot, or pull it into a local
//! volume. One thread receives and verifies frames, the caller's thread
//! applies them, joined by a bounded channel.

use crate::conn::{Conn, Remote};
use crate::error::TransferError;
use crate::tls::Identity;
use crate::wire::{Answer, Code, Frame, Holder, Mode, Request};
use lamina_engine::{Applier, Chunk, CopyControl, CopyEnd, CopyProgress, Pool, Volume};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use tracing::{info, info_span};

/// Frames verified and waiting to be applied (each at most 1 MiB).
const QUEUE: usize = 32;

/// A snapshot on a source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteSnapshot {
    /// Its identity (`crate::identity`): the same on every replica.
    pub id: u64,
    /// Its size (the size of a volume restored from it).
    pub size: u64,
    /// Bytes of data it holds (what a pull moves).
    pub data_bytes: u64,
    /// Other nodes that may hold it, as the source named them (none from
    /// a source of version 1 or 2).
    pub holders: Vec<Holder>,
}

/// What to pull, from where, into what.
#[derive(Clone, Copy, Debug)]
pub struct Pull<'a> {
    /// The local volume written (it exists, and is at least as large).
    pub into: &'a str,
    pub remote: &'a Remote,
    /// The snapshot on the source.
    pub volume: &'a str,
    pub snapshot: &'a str,
    /// The snapshot id the copy started from (0: any): if the source's
    /// snapshot of that name is another one, the pull fails.
    pub expect_id: u64,
    /// Where this attempt starts (the last durable offset).
    pub resume_offset: u64,
    /// Data applied between two flushes and `ctl.durable` calls.
    pub checkpoint_bytes: u64,
    /// A source silent this long is taken for gone (a cut link shows up
    /// only this way): the same limit a source puts on its targets,
    /// normally [`crate::Limits::STALL_TIMEOUT`].
    pub stall_timeout: std::time::Duration,
}

/// How a pull ended, and what it cost on the wire.
#[derive(Debug)]
pub struct Pulled {
    /// As [`lamina_engine::Pool::copy_into`] reports it, or why it failed.
    pub end: Result<CopyEnd, TransferError>,
    /// Bytes received on the socket (TLS records and frames included),
    /// also when the attempt failed partway.
    pub wire_bytes: u64,
    /// Other nodes that may hold the snapshot, as this attempt's source
    /// named them in its Answer (empty if it sent none, or none came).
    pub holders: Vec<Holder>,
}

/// Ask a source about one of its snapshots.
pub fn describe(
    identity: &Identity,
    remote: &Remote,
    volume: &str,
    snapshot: &str,
) -> Result<RemoteSnapshot, TransferError> {
    let mut c = Conn::open(identity, remote)?;
    let a = c.request(&Request {
        mode: Mode::Describe,
        expect_id: 0,
        from_offset: 0,
        volume: volume.to_string(),
        snapshot: snapshot.to_string(),
    })?;
    Ok(RemoteSnapshot {
        id: a.id,
        size: a.size,
        data_bytes: a.data_bytes,
        holders: a.holders,
    })
}

/// Pull the remote snapshot into the local volume `pull.into`, from
/// `pull.resume_offset` on, applying chunks, flushing every
/// `pull.checkpoint_bytes` of data and calling `ctl.durable` (exactly as
/// [`Pool::copy_into`] does locally); `ctl.stop()` is polled between
/// chunks.
pub fn pull_into(
    pool: &Pool,
    identity: &Identity,
    pull: &Pull<'_>,
    ctl: &mut dyn CopyControl,
) -> Pulled {
    pull_into_counting(pool, identity, pull, ctl, &Arc::new(AtomicU64::new(0)))
}

/// [`pull_into`], adding the bytes received on the socket to `wire` as they
/// arrive, so that a caller can show them while the pull runs (the daemon's
/// live `wire_bytes`); [`Pulled::wire_bytes`] is still this attempt's.
pub fn pull_into_counting(
    pool: &Pool,
    identity: &Identity,
    pull: &Pull<'_>,
    ctl: &mut dyn CopyControl,
    wire: &Arc<AtomicU64>,
) -> Pulled {
    let span = info_span!(
        "transfer_pull",
        source = %pull.remote.node,
        volume = pull.volume,
        snapshot = pull.snapshot,
        into = pull.into
    );
    let _e = span.enter();
    let before = wire.load(Ordering::Relaxed);
    let mut holders = Vec::new();
    let end = pull_counted(pool, identity, pull, ctl, wire, &mut holders);
    let wire_bytes = wire.load(Ordering::Relaxed).saturating_sub(before);
    info!(?end, wire_bytes, "pull ended");
    Pulled {
        end,
        wire_bytes,
        holders,
    }
}

fn pull_counted(
    pool: &Pool,
    identity: &Identity,
    pull: &Pull<'_>,
    ctl: &mut dyn CopyControl,
    received: &Arc<AtomicU64>,
    holders: &mut Vec<Holder>,
) -> Result<CopyEnd, TransferError> {
    let into = pull.into;
    let ctx = |what: &str| format!("{what} volume {into:?}");
    let dst = pool
        .open_volume(into)
        .map_err(|e| TransferError::engine(ctx("open"), e))?;
    let room = dst
        .size()
        .map_err(|e| TransferError::engine(ctx("size of"), e))?;
    let mut c = Conn::open_counted(identity, pull.remote, pull.stall_timeout, received.clone())?;
    let req = Request {
        mode: Mode::Pull,
        expect_id: pull.expect_id,
        from_offset: pull.resume_offset,
        volume: pull.volume.to_string(),
        snapshot: pull.snapshot.to_string(),
    };
    let mut a = c.request(&req)?;
    *holders = std::mem::take(&mut a.holders);
    if pull.expect_id != 0 && a.id != pull.expect_id {
        return Err(TransferError::Remote {
            peer: c.peer.clone(),
            volume: pull.volume.into(),
            snapshot: pull.snapshot.into(),
            code: Code::SnapshotReplaced,
            message: format!(
                "the source's snapshot is {:016x}, not {:016x}: another snapshot of that name",
                a.id, pull.expect_id
            ),
        });
    }
    if room < a.size {
        return Err(TransferError::Invalid(format!(
            "volume {into:?} ({room} bytes) is smaller than the {} bytes of {}/{} on {}",
            a.size, pull.volume, pull.snapshot, c.peer
        )));
    }
    info!(
        id = a.id,
        size = a.size,
        data = a.data_bytes,
        from = pull.resume_offset,
        "pulling"
    );
    let cutter = c.cutter();
    let peer = c.peer.clone();
    let (tx, rx) = sync_channel(QUEUE);
    // Applied payloads come back to the receiver, which reads the next
    // ones into them: a few warm buffers for the whole stream.
    let (give_back, spare) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::scope(|s| {
        s.spawn(move || loop {
            let mut buf = spare.try_recv().unwrap_or_default();
            let r = c.read_reusing(&mut buf);
            let more = matches!(r, Ok(Frame::Data { .. } | Frame::Zero { .. }));
            if tx.send(r).is_err() || !more {
                break;
            }
        });
        let mut apply = Apply {
            dst: &dst,
            peer: &peer,
            answer: a,
            req: &req,
            next: pull.resume_offset,
            frames: 0,
            data: 0,
            starved: std::time::Duration::ZERO,
        };
        let end = apply.run(rx, &give_back, pull.checkpoint_bytes, ctl);
        // Unblock the receiver if it still waits on the socket.
        if let Some(t) = &cutter {
            let _ = t.shutdown(std::net::Shutdown::Both);
        }
        end
    })
}

struct Apply<'a> {
    dst: &'a Volume,
    peer: &'a str,
    answer: Answer,
    req: &'a Request,
    /// Frames must come in order: none may start below this.
    next: u64,
    frames: u64,
    data: u64,
    /// Time spent waiting for the next frame.
    starved: std::time::Duration,
}

impl Apply<'_> {
    fn protocol(&self, detail: String) -> TransferError {
        TransferError::Protocol {
            peer: self.peer.to_string(),
            detail,
        }
    }

    /// Check a range against the order and the snapshot's size.
    fn range(&mut self, offset: u64, len: u64) -> Result<(), TransferError> {
        let end = offset.saturating_add(len);
        if offset < self.next || end > self.answer.size {
            return Err(self.protocol(format!(
                "frame {offset}+{len} is out of order or outside the snapshot (next {}, size {})",
                self.next, self.answer.size
            )));
        }
        self.next = end;
        self.frames += 1;
        Ok(())
    }

    fn run(
        &mut self,
        rx: Receiver<Result<Frame, TransferError>>,
        give_back: &std::sync::mpsc::Sender<Vec<u8>>,
        checkpoint_bytes: u64,
        ctl: &mut dyn CopyControl,
    ) -> Result<CopyEnd, TransferError> {
        let start = CopyProgress {
            done_bytes: self.answer.skipped_bytes,
            total_bytes: self.answer.data_bytes,
            resume_offset: self.req.from_offset,
        };
        let dst = self.dst;
        let mut a = Applier::new(dst, start, checkpoint_bytes);
        let began = std::time::Instant::now();
        let engine = |e, what: &str, at: u64| {
            TransferError::engine(format!("{what} volume {:?} at {at}", dst.name()), e)
        };
        loop {
            if let Some(end) = a
                .stop_asked(ctl)
                .map_err(|e| engine(e, "flush", self.next))?
            {
                return Ok(end);
            }
            let t = std::time::Instant::now();
            let frame = rx
                .recv()
                .map_err(|_| self.protocol("the stream ended without End".into()))??;
            self.starved += t.elapsed();
            let chunk = match frame {
                Frame::Data { offset, payload } => {
                    self.range(offset, payload.len() as u64)?;
                    self.data += payload.len() as u64;
                    Chunk::Data {
                        offset,
                        bytes: payload,
                    }
                }
                Frame::Zero { offset, len } => {
                    self.range(offset, len)?;
                    Chunk::Zero { offset, len }
                }
                Frame::End { frames, data_bytes } => {
                    if (frames, data_bytes) != (self.frames, self.data)
                        || self.answer.skipped_bytes + self.data != self.answer.data_bytes
                    {
                        return Err(self.protocol(format!(
                            "End says {frames} frames and {data_bytes} bytes; received {} and {} (+{} skipped) of {}",
                            self.frames, self.data, self.answer.skipped_bytes, self.answer.data_bytes
                        )));
                    }
                    let t = std::time::Instant::now();
                    let end = a
                        .finish(self.answer.size, ctl)
                        .map_err(|e| engine(e, "flush", self.answer.size));
                    // Which side the copy waited on: frames not yet
                    // received, or the writes.
                    tracing::debug!(
                        frames,
                        data_bytes,
                        took_ms = began.elapsed().as_millis() as u64,
                        waited_for_frames_ms = self.starved.as_millis() as u64,
                        final_flush_ms = t.elapsed().as_millis() as u64,
                        "stream applied"
                    );
                    return end;
                }
                Frame::Error { code, message } => {
                    return Err(TransferError::Remote {
                        peer: self.peer.to_string(),
                        volume: self.req.volume.clone(),
                        snapshot: self.req.snapshot.clone(),
                        code,
                        message,
                    })
                }
                f => {
                    return Err(
                        self.protocol(format!("unexpected frame in the stream: {}", f.summary()))
                    )
                }
            };
            let at = match &chunk {
                Chunk::Data { offset, .. } | Chunk::Zero { offset, .. } => *offset,
            };
            let applied = a.apply(&chunk, ctl).map_err(|e| engine(e, "write", at))?;
            if let Chunk::Data { bytes, .. } = chunk {
                let _ = give_back.send(bytes);
            }
            if let Some(end) = applied {
                return Ok(end);
            }
        }
    }
}
