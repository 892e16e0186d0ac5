//! The target side: describe a remote snapshot, or pull it into a local
//! volume. One thread receives and verifies frames, the caller's thread
//! applies them, joined by a bounded channel.

use crate::conn::{Conn, Remote};
use crate::error::TransferError;
use crate::tls::Identity;
use crate::wire::{Answer, Code, Frame, Mode, Request};
use lamina_engine::{CopyControl, CopyEnd, CopyProgress, Pool, Volume};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, Receiver};
use tracing::{info, info_span};

/// Frames verified and waiting to be applied (each at most 1 MiB).
const QUEUE: usize = 32;

/// A snapshot on a source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteSnapshot {
    pub id: u64,
    /// Its size (the size of a volume restored from it).
    pub size: u64,
    /// Bytes of data it holds (what a pull moves).
    pub data_bytes: u64,
}

/// How a pull ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PullEnd {
    /// As [`lamina_engine::Pool::copy_into`] reports it.
    pub end: CopyEnd,
    /// Bytes received on the socket (TLS records and frames included).
    pub wire_bytes: u64,
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
    })
}

/// Pull remote `volume`/`snapshot` into the local existing volume `into`
/// (at least as large), from `resume_offset` on, applying chunks, flushing
/// every `checkpoint_bytes` of data and calling `ctl.durable` (exactly as
/// [`Pool::copy_into`] does locally); `ctl.stop()` is polled between
/// chunks. `expect_id` is the snapshot id the copy started from (0: any):
/// if the source's snapshot of that name is another one, the pull fails.
#[allow(clippy::too_many_arguments)]
pub fn pull_into(
    pool: &Pool,
    into: &str,
    identity: &Identity,
    remote: &Remote,
    volume: &str,
    snapshot: &str,
    expect_id: u64,
    resume_offset: u64,
    checkpoint_bytes: u64,
    ctl: &mut dyn CopyControl,
) -> Result<PullEnd, TransferError> {
    let span = info_span!("transfer_pull", source = %remote.node, volume, snapshot, into);
    let _e = span.enter();
    let ctx = |what: &str| format!("{what} volume {into:?}");
    let dst = pool
        .open_volume(into)
        .map_err(|e| TransferError::engine(ctx("open"), e))?;
    let room = dst
        .size()
        .map_err(|e| TransferError::engine(ctx("size of"), e))?;
    let mut c = Conn::open(identity, remote)?;
    let req = Request {
        mode: Mode::Pull,
        expect_id,
        from_offset: resume_offset,
        volume: volume.to_string(),
        snapshot: snapshot.to_string(),
    };
    let a = c.request(&req)?;
    if expect_id != 0 && a.id != expect_id {
        return Err(TransferError::Remote {
            peer: c.peer.clone(),
            volume: volume.into(),
            snapshot: snapshot.into(),
            code: Code::SnapshotReplaced,
            message: format!("the source's snapshot is id {}, not {expect_id}", a.id),
        });
    }
    if room < a.size {
        return Err(TransferError::Invalid(format!(
            "volume {into:?} ({room} bytes) is smaller than the {} bytes of {}/{} on {}",
            a.size, volume, snapshot, c.peer
        )));
    }
    info!(
        id = a.id,
        size = a.size,
        data = a.data_bytes,
        from = resume_offset,
        "pulling"
    );
    let received = c.received();
    let cutter = c.cutter();
    let peer = c.peer.clone();
    let (tx, rx) = sync_channel(QUEUE);
    let end = std::thread::scope(|s| {
        s.spawn(move || loop {
            let r = c.read();
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
            next: resume_offset,
            frames: 0,
            data: 0,
        };
        let end = apply.run(rx, checkpoint_bytes, ctl);
        // Unblock the receiver if it still waits on the socket.
        if let Some(t) = &cutter {
            let _ = t.shutdown(std::net::Shutdown::Both);
        }
        end
    })?;
    let wire_bytes = received.load(Ordering::Relaxed);
    info!(?end, wire_bytes, "pull ended");
    Ok(PullEnd { end, wire_bytes })
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
}

impl Apply<'_> {
    fn protocol(&self, detail: String) -> TransferError {
        TransferError::Protocol {
            peer: self.peer.to_string(),
            detail,
        }
    }

    fn flush(&self) -> Result<(), TransferError> {
        self.dst
            .flush()
            .map_err(|e| TransferError::engine(format!("flush volume {:?}", self.dst.name()), e))
    }

    /// Check a range against the order and the snapshot's size.
    fn range(&mut self, offset: u64, len: u64) -> Result<u64, TransferError> {
        let end = offset.saturating_add(len);
        if offset < self.next || end > self.answer.size {
            return Err(self.protocol(format!(
                "frame {offset}+{len} is out of order or outside the snapshot (next {}, size {})",
                self.next, self.answer.size
            )));
        }
        self.next = end;
        self.frames += 1;
        Ok(end)
    }

    fn run(
        &mut self,
        rx: Receiver<Result<Frame, TransferError>>,
        checkpoint_bytes: u64,
        ctl: &mut dyn CopyControl,
    ) -> Result<CopyEnd, TransferError> {
        let mut p = CopyProgress {
            done_bytes: self.answer.skipped_bytes,
            total_bytes: self.answer.data_bytes,
            resume_offset: self.req.from_offset,
        };
        let mut since = 0;
        let write = |e, offset| {
            TransferError::engine(format!("write volume {:?} at {offset}", self.dst.name()), e)
        };
        loop {
            if ctl.stop() {
                self.flush()?;
                return Ok(CopyEnd::Stopped(p));
            }
            let frame = rx
                .recv()
                .map_err(|_| self.protocol("the stream ended without End".into()))??;
            let (end, n) = match frame {
                Frame::Data { offset, payload } => {
                    let end = self.range(offset, payload.len() as u64)?;
                    self.dst
                        .write(offset, &payload)
                        .map_err(|e| write(e, offset))?;
                    (end, payload.len() as u64)
                }
                Frame::Zero { offset, len } => {
                    let end = self.range(offset, len)?;
                    self.dst
                        .write_zeroes(offset, len)
                        .map_err(|e| write(e, offset))?;
                    (end, 0)
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
                    self.flush()?;
                    p.resume_offset = self.answer.size.max(self.req.from_offset);
                    ctl.progress(&p);
                    return Ok(CopyEnd::Done(p));
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
                f => return Err(self.protocol(format!("unexpected frame in the stream: {f:?}"))),
            };
            self.data += n;
            p.done_bytes += n;
            since += n;
            ctl.progress(&p);
            if since >= checkpoint_bytes {
                self.flush()?;
                since = 0;
                p.resume_offset = end;
                if !ctl.durable(&p) {
                    return Ok(CopyEnd::Stopped(p));
                }
            }
        }
    }
}
