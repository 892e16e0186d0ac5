//! The transmission phase. One loop reads requests in order and queues
//! them for blocking runners (see [`crate::runner`]), which call the device
//! and write their own replies through the connection's
//! [`crate::writer::ReplyWriter`]; replies never interleave but may go out
//! of order (the cookie matches them up).
//!
//! Requests already buffered when the loop reads them (a pipelining client
//! sends many at once) are queued together; the loop hands them over once
//! reading on would wait for the client, or after [`MAX_BATCH`].
//! A lone request (a client at queue depth 1) may instead run on the loop
//! itself, while the runners are idle and the volume fast
//! ([`Reader::run_lone`]).
//!
//! Backpressure: every request holds a slot (and READ/WRITE hold a share of
//! the byte budget) from the moment its header is read until its reply has
//! been handed to the socket buffer, so a client that pipelines without
//! reading replies stalls instead of growing the server's memory. Ending the
//! connection waits for every slot, i.e. for every request in flight.
//!
//! Flush ordering: writes, trims and zeroings hold the current *epoch* until
//! their reply is written; a FLUSH closes the epoch and waits until every
//! request of it (and, through a chain, of every earlier epoch) has been
//! answered before calling `device.flush()`. So a FLUSH is answered after
//! every write received before it, and requests read after it are not
//! waited for.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, BufReader, BufWriter};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::exec::ReplyMode;
use crate::handshake::Session;
use crate::proto::*;
use crate::runner::{executor, Executor, Job};
use crate::server::Shutdown;
use crate::writer::{BoxedWrite, Permits, ReplyWriter};
use crate::{NbdError, ServerOptions};

/// Byte-budget unit, so budgets of gigabytes fit the semaphore's u32 counts.
const BUDGET_UNIT: u64 = 1024;
/// Most requests queued in one hand-over.
const MAX_BATCH: usize = 16;

/// The flush-ordering token: dropped (and its receiver woken) once the last
/// request holding it has completed.
struct Epoch {
    _done: oneshot::Sender<()>,
}

struct Epochs {
    current: Arc<Epoch>,
    done: oneshot::Receiver<()>,
}

impl Epochs {
    fn new() -> Self {
        let (tx, done) = oneshot::channel();
        Epochs {
            current: Arc::new(Epoch { _done: tx }),
            done,
        }
    }

    /// Starts a new epoch. Returns the completion of the old one and a hold
    /// on the new one, which the flush keeps until the old one completes so
    /// that a later flush also waits for everything before this one.
    fn rotate(&mut self) -> (oneshot::Receiver<()>, Arc<Epoch>) {
        let (tx, rx) = oneshot::channel();
        let new = Arc::new(Epoch { _done: tx });
        self.current = new.clone();
        (std::mem::replace(&mut self.done, rx), new)
    }
}

/// Request validation against the negotiated session.
struct Checker {
    size: u64,
    /// The transmission flags advertised: commands and flags beyond them
    /// are refused, so the volume never gets an operation it did not
    /// declare.
    flags: u16,
    read_only: bool,
    structured: bool,
    block_status: bool,
    max_payload: u32,
}

impl Checker {
    /// `Err((errno, message))` if the request must be refused without
    /// touching the device.
    fn check(&self, req: &Request) -> Result<(), (u32, &'static str)> {
        let df = if self.structured { CMD_FLAG_DF } else { 0 };
        let (allowed, writes) = match req.kind {
            CMD_READ => (CMD_FLAG_FUA | df, false),
            CMD_WRITE | CMD_TRIM => (CMD_FLAG_FUA, true),
            CMD_FLUSH | CMD_CACHE => (CMD_FLAG_FUA, false),
            CMD_WRITE_ZEROES => (CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO, true),
            CMD_BLOCK_STATUS => (CMD_FLAG_FUA | CMD_FLAG_REQ_ONE, false),
            _ => return Err((EINVAL, "unknown command")),
        };
        if req.flags & !allowed != 0 {
            return Err((EINVAL, "command flags not valid for this command"));
        }
        if writes && self.read_only {
            return Err((EPERM, "the export is read-only"));
        }
        let needs = match req.kind {
            CMD_FLUSH => FLAG_SEND_FLUSH,
            CMD_TRIM => FLAG_SEND_TRIM,
            CMD_WRITE_ZEROES => FLAG_SEND_WRITE_ZEROES,
            _ => 0,
        };
        if self.flags & needs != needs {
            return Err((EINVAL, "command not advertised for this export"));
        }
        if req.flags & CMD_FLAG_FUA != 0 && self.flags & FLAG_SEND_FUA == 0 {
            return Err((EINVAL, "FUA not advertised for this export"));
        }
        if req.flags & CMD_FLAG_FAST_ZERO != 0 && self.flags & FLAG_SEND_FAST_ZERO == 0 {
            return Err((EINVAL, "fast zeroing not advertised for this export"));
        }
        if req.kind == CMD_FLUSH {
            return Ok(());
        }
        if req.kind == CMD_BLOCK_STATUS && !self.block_status {
            return Err((EINVAL, "no metadata context was negotiated"));
        }
        if req.kind == CMD_BLOCK_STATUS && req.length == 0 {
            return Err((EINVAL, "empty block status request"));
        }
        if req.kind == CMD_READ && req.length > self.max_payload {
            return Err((EINVAL, "read larger than the maximum payload"));
        }
        match req.offset.checked_add(u64::from(req.length)) {
            Some(end) if end <= self.size => Ok(()),
            _ if matches!(req.kind, CMD_WRITE | CMD_WRITE_ZEROES) => {
                Err((ENOSPC, "write beyond the end of the export"))
            }
            _ => Err((EINVAL, "request beyond the end of the export")),
        }
    }
}

/// Reads one request header; `Ok(false)` on a clean end of stream between
/// requests.
async fn read_header<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut [u8; REQUEST_LEN],
) -> std::io::Result<bool> {
    let mut got = 0;
    while got < REQUEST_LEN {
        let n = r.read(&mut buf[got..]).await?;
        if n == 0 {
            if got == 0 {
                return Ok(false);
            }
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        got += n;
    }
    Ok(true)
}

/// Runs the transmission phase until the client disconnects, the server
/// shuts down or the protocol breaks; then waits for requests in flight.
pub(crate) async fn run<R: AsyncRead + Unpin>(
    reader: BufReader<R>,
    writer: BufWriter<BoxedWrite>,
    session: Session,
    opts: &ServerOptions,
    shutdown: &mut Shutdown,
) -> Result<(), NbdError> {
    let checker = Checker {
        size: session.size,
        flags: session.flags,
        read_only: session.flags & FLAG_READ_ONLY != 0,
        structured: session.structured,
        block_status: session.meta_context.is_some(),
        max_payload: opts.max_payload,
    };
    let slot_count = opts.max_in_flight.clamp(1, u32::MAX as usize >> 3) as u32;
    let mode = ReplyMode {
        structured: session.structured,
        meta_id: session.meta_context.unwrap_or(0),
    };
    let sh = Arc::new(executor(
        session.device,
        mode,
        ReplyWriter::new(writer),
        slot_count as usize,
    ));
    let budget_units =
        (opts.max_buffer_bytes / BUDGET_UNIT).clamp(1, u64::from(u32::MAX >> 3)) as u32;
    let mut conn = Reader {
        reader,
        sh: sh.clone(),
        checker,
        max_payload: opts.max_payload,
        slots: Arc::new(Semaphore::new(slot_count as usize)),
        budget: Arc::new(Semaphore::new(budget_units as usize)),
        budget_units,
        epochs: Epochs::new(),
        batch: VecDeque::new(),
    };
    let result = conn.run(shutdown).await;
    conn.dispatch();
    let Reader { slots, epochs, .. } = conn;
    drop(epochs);
    // Every request in flight holds a slot until its reply is written. A
    // client that stopped reading gets `drain_timeout` to take them; then
    // the writer gives up, which frees the slots at once.
    let drained = tokio::time::timeout(opts.drain_timeout, slots.acquire_many(slot_count)).await;
    if drained.is_err() {
        tracing::warn!(
            timeout = ?opts.drain_timeout,
            "the client did not read its replies: closing the connection (its requests have run)"
        );
        sh.work().writer.abort();
        let _all = slots.acquire_many(slot_count).await;
    }
    match sh.work().writer.close().await {
        Err(e) if result.is_ok() && drained.is_ok() => Err(e.into()),
        _ => result,
    }
}

/// The request-reading side of a connection.
struct Reader<R> {
    reader: BufReader<R>,
    sh: Arc<Executor>,
    checker: Checker,
    max_payload: u32,
    slots: Arc<Semaphore>,
    budget: Arc<Semaphore>,
    budget_units: u32,
    epochs: Epochs,
    batch: VecDeque<Job>,
}

impl<R: AsyncRead + Unpin> Reader<R> {
    /// Reads and dispatches requests until the connection should end.
    async fn run(&mut self, shutdown: &mut Shutdown) -> Result<(), NbdError> {
        let sh = self.sh.clone();
        loop {
            // Dispatch once reading on would wait for the client.
            if self.batch.len() >= MAX_BATCH || self.reader.buffer().len() < REQUEST_LEN {
                if self.batch.len() == 1 {
                    self.run_lone();
                }
                self.dispatch();
            }
            let next = tokio::select! {
                biased;
                _ = sh.work().writer.failed() => return Ok(()),
                _ = shutdown.wait() => {
                    tracing::debug!("server shutting down: no more requests");
                    return Ok(());
                }
                next = self.next_request() => next?,
            };
            let Some((req, payload, mut permits)) = next else {
                return Ok(());
            };
            let reply = match self.checker.check(&req) {
                Err((errno, message)) => {
                    tracing::debug!(
                        kind = req.kind,
                        offset = req.offset,
                        length = req.length,
                        errno,
                        message,
                        "request refused"
                    );
                    Some(sh.work().mode.error(req.cookie, errno, message))
                }
                Ok(()) if req.kind == CMD_CACHE => Some(Reply::simple(req.cookie, 0, Vec::new())),
                Ok(()) => None,
            };
            if reply.is_none() && req.kind == CMD_FLUSH {
                self.flush(req, permits);
                continue;
            }
            if reply.is_none() && matches!(req.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES) {
                permits.hold = Some(self.epochs.current.clone());
            }
            self.batch.push_back(Job {
                req,
                payload,
                permits,
                reply,
            });
        }
    }

    /// The next request with its payload and permits; `None` when the
    /// client has ended the connection (DISC or end of stream).
    async fn next_request(&mut self) -> Result<Option<(Request, Vec<u8>, Permits)>, NbdError> {
        let mut header = [0u8; REQUEST_LEN];
        if !read_header(&mut self.reader, &mut header).await? {
            tracing::debug!("client closed the connection without NBD_CMD_DISC");
            return Ok(None);
        }
        let req = Request::decode(&header).map_err(NbdError::RequestMagic)?;
        match req.kind {
            CMD_DISC => {
                tracing::debug!("NBD_CMD_DISC");
                return Ok(None);
            }
            CMD_WRITE if req.length > self.max_payload => {
                return Err(NbdError::PayloadTooLarge {
                    length: req.length,
                    max: self.max_payload,
                });
            }
            _ => {}
        }
        let Some(permits) = self.permits(&req).await else {
            return Ok(None);
        };
        let mut payload = Vec::new();
        if req.kind == CMD_WRITE {
            if self.reader.buffer().len() < req.length as usize {
                self.dispatch();
            }
            payload = crate::bufs::take_to_overwrite(req.length as usize);
            self.reader.read_exact(&mut payload).await?;
        }
        Ok(Some((req, payload, permits)))
    }

    /// A slot, and for READ/WRITE a share of the byte budget. Dispatches the
    /// batch before waiting, since its requests hold permits too.
    async fn permits(&mut self, req: &Request) -> Option<Permits> {
        let slot = match self.slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                self.dispatch();
                acquire(&self.slots, 1).await?
            }
        };
        let mut bytes = None;
        if matches!(req.kind, CMD_READ | CMD_WRITE) && req.length > 0 {
            let units = u64::from(req.length)
                .div_ceil(BUDGET_UNIT)
                .min(u64::from(self.budget_units)) as u32;
            bytes = Some(match self.budget.clone().try_acquire_many_owned(units) {
                Ok(p) => p,
                Err(_) => {
                    self.dispatch();
                    acquire(&self.budget, units).await?
                }
            });
        }
        Some(Permits {
            _slot: slot,
            _bytes: bytes,
            hold: None,
        })
    }

    /// A lone request (a client at queue depth 1) runs here, on the reader,
    /// when the runners are idle and the volume fast
    /// ([`lamina_runners::Runners::run_here_if_idle`]): no runner to wake,
    /// and its reply goes to a task of this runtime, which runs on this
    /// thread once the reader waits for the client. Otherwise it stays in
    /// the batch.
    fn run_lone(&mut self) {
        let Some(job) = self.batch.pop_front() else {
            return;
        };
        match self.sh.run_here_if_idle(job) {
            Ok(Some(done)) => self.sh.work().writer.send_later(done),
            Ok(None) => {}
            Err(job) => self.batch.push_back(job),
        }
    }

    /// Hands the batch to the runners.
    fn dispatch(&mut self) {
        self.sh.submit(&mut self.batch);
    }

    /// Closes the epoch and answers the FLUSH once it has completed.
    fn flush(&mut self, req: Request, permits: Permits) {
        self.dispatch();
        let (previous, hold) = self.epochs.rotate();
        let sh = self.sh.clone();
        tokio::spawn(async move {
            // Err means the epoch ended: every request in it is done.
            let _ = previous.await;
            drop(hold);
            sh.run_alone(Job {
                req,
                payload: Vec::new(),
                permits,
                reply: None,
            });
        });
    }
}

/// Waits for `n` permits (`None` only if the semaphore were closed).
async fn acquire(sem: &Arc<Semaphore>, n: u32) -> Option<OwnedSemaphorePermit> {
    sem.clone().acquire_many_owned(n).await.ok()
}

#[cfg(test)]
#[path = "transmission_tests.rs"]
mod tests;
