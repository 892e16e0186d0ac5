//! The transmission phase. One loop reads requests in order; each device
//! call runs on a blocking task; one writer task sends the replies, so they
//! never interleave but may go out of order (the cookie matches them up).
//!
//! Backpressure: every request holds a slot (and READ/WRITE hold a share of
//! the byte budget) from the moment its header is read until its reply has
//! been handed to the socket buffer, so a client that pipelines without
//! reading replies stalls instead of growing the server's memory.
//!
//! Flush ordering: writes, trims and zeroings hold the current *epoch*; a
//! FLUSH closes the epoch and waits until every request of it (and, through
//! a chain, of every earlier epoch) has completed before calling
//! `device.flush()`. Requests read after the FLUSH are not waited for.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;

use crate::device::{BlockDevice, DeviceError};
use crate::handshake::Session;
use crate::proto::*;
use crate::server::Shutdown;
use crate::{NbdError, ServerOptions};

/// Most descriptors in one BLOCK_STATUS reply (the protocol lets a server
/// describe less than the whole request).
const MAX_DESCRIPTORS: usize = 64 * 1024;
/// Byte-budget unit, so budgets of gigabytes fit the semaphore's u32 counts.
const BUDGET_UNIT: u64 = 1024;
/// Largest buffer used when emulating WRITE_ZEROES with plain writes.
const ZERO_CHUNK: u64 = 1 << 20;

/// A reply on its way to the writer, with the permits it releases once sent.
struct Outgoing {
    reply: Reply,
    _slot: OwnedSemaphorePermit,
    _bytes: Option<OwnedSemaphorePermit>,
}

/// What the blocking tasks of one connection share.
struct Shared {
    device: Arc<dyn BlockDevice>,
    structured: bool,
    tx: mpsc::UnboundedSender<Outgoing>,
    span: tracing::Span,
}

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

/// Sends replies in arrival order, flushing the socket buffer once the queue
/// is momentarily empty so that pipelined replies share system calls.
async fn write_replies<W: AsyncWrite + Unpin>(
    mut w: BufWriter<W>,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
) -> std::io::Result<()> {
    let mut batch = Vec::with_capacity(64);
    while rx.recv_many(&mut batch, 64).await > 0 {
        for out in batch.drain(..) {
            w.write_all(out.reply.head()).await?;
            if !out.reply.body().is_empty() {
                w.write_all(out.reply.body()).await?;
            }
        }
        if rx.is_empty() {
            w.flush().await?;
        }
    }
    w.flush().await?;
    w.shutdown().await
}

/// Runs the transmission phase until the client disconnects, the server
/// shuts down or the protocol breaks; then waits for requests in flight.
pub(crate) async fn run<R, W>(
    mut reader: BufReader<R>,
    writer: BufWriter<W>,
    session: Session,
    opts: &ServerOptions,
    shutdown: &mut Shutdown,
) -> Result<(), NbdError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let mut writer_task = tokio::spawn(write_replies(writer, rx).in_current_span());
    let checker = Checker {
        size: session.size,
        read_only: session.flags & FLAG_READ_ONLY != 0,
        structured: session.structured,
        block_status: session.meta_context.is_some(),
        max_payload: opts.max_payload,
    };
    let meta_id = session.meta_context.unwrap_or(0);
    let shared = Arc::new(Shared {
        device: session.device,
        structured: session.structured,
        tx,
        span: tracing::Span::current(),
    });
    let slots = Arc::new(Semaphore::new(
        opts.max_in_flight.clamp(1, Semaphore::MAX_PERMITS),
    ));
    let budget_units =
        (opts.max_buffer_bytes / BUDGET_UNIT).clamp(1, u64::from(u32::MAX >> 3)) as u32;
    let budget = Arc::new(Semaphore::new(budget_units as usize));
    let mut epochs = Epochs::new();
    let mut header = [0u8; REQUEST_LEN];

    let mut writer_done = false;
    let mut result: Result<(), NbdError> = Ok(());
    let sh = &shared;
    loop {
        let read = tokio::select! {
            biased;
            w = &mut writer_task => {
                writer_done = true;
                result = match w {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(e.into()),
                    Err(e) => Err(NbdError::Io(std::io::Error::other(format!("reply writer failed: {e}")))),
                };
                break;
            }
            _ = shutdown.wait() => {
                tracing::debug!("server shutting down: no more requests");
                break;
            }
            r = read_header(&mut reader, &mut header) => r,
        };
        match read {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!("client closed the connection without NBD_CMD_DISC");
                break;
            }
            Err(e) => {
                result = Err(e.into());
                break;
            }
        }
        let req = match Request::decode(&header) {
            Ok(r) => r,
            Err(magic) => {
                result = Err(NbdError::RequestMagic(magic));
                break;
            }
        };
        if req.kind == CMD_DISC {
            tracing::debug!("NBD_CMD_DISC");
            break;
        }
        if req.kind == CMD_WRITE && req.length > opts.max_payload {
            result = Err(NbdError::PayloadTooLarge {
                length: req.length,
                max: opts.max_payload,
            });
            break;
        }
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let bytes = if matches!(req.kind, CMD_READ | CMD_WRITE) && req.length > 0 {
            let units =
                (u64::from(req.length).div_ceil(BUDGET_UNIT)).min(u64::from(budget_units)) as u32;
            let Ok(p) = budget.clone().acquire_many_owned(units).await else {
                break;
            };
            Some(p)
        } else {
            None
        };
        let mut payload = Vec::new();
        if req.kind == CMD_WRITE {
            payload = vec![0u8; req.length as usize];
            if let Err(e) = reader.read_exact(&mut payload).await {
                result = Err(e.into());
                break;
            }
        }
        if let Err((errno, message)) = checker.check(&req) {
            tracing::debug!(
                kind = req.kind,
                offset = req.offset,
                length = req.length,
                errno,
                message,
                "request refused"
            );
            sh.send(sh.error(req.cookie, errno, message), slot, bytes);
            continue;
        }
        match req.kind {
            CMD_CACHE => sh.send(Reply::simple(req.cookie, 0, Vec::new()), slot, bytes),
            CMD_FLUSH => {
                let (previous, hold) = epochs.rotate();
                let sh = sh.clone();
                tokio::spawn(async move {
                    // Err means the epoch ended: every request in it is done.
                    let _ = previous.await;
                    drop(hold);
                    tokio::task::spawn_blocking(move || {
                        sh.complete(&req, payload, meta_id, slot, bytes)
                    });
                });
            }
            CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES => {
                let (sh, epoch) = (sh.clone(), epochs.current.clone());
                tokio::task::spawn_blocking(move || {
                    let _epoch = epoch;
                    sh.complete(&req, payload, meta_id, slot, bytes)
                });
            }
            _ => {
                let sh = sh.clone();
                tokio::task::spawn_blocking(move || {
                    sh.complete(&req, payload, meta_id, slot, bytes)
                });
            }
        }
    }
    // Let requests in flight finish: the writer ends once every sender (this
    // loop's and each request's) is gone.
    drop(shared);
    drop(epochs);
    if !writer_done {
        match writer_task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) if result.is_ok() => result = Err(e.into()),
            Ok(Err(_)) => {}
            Err(e) if result.is_ok() => {
                result = Err(NbdError::Io(std::io::Error::other(format!(
                    "reply writer failed: {e}"
                ))))
            }
            Err(_) => {}
        }
    }
    result
}

impl Shared {
    fn send(&self, reply: Reply, slot: OwnedSemaphorePermit, bytes: Option<OwnedSemaphorePermit>) {
        // If the writer is gone the connection is ending; drop the reply.
        let _ = self.tx.send(Outgoing {
            reply,
            _slot: slot,
            _bytes: bytes,
        });
    }

    fn error(&self, cookie: u64, errno: u32, message: &str) -> Reply {
        if self.structured {
            Reply::error_chunk(cookie, errno, message)
        } else {
            Reply::simple(cookie, errno, Vec::new())
        }
    }

    /// Runs a validated request on the device and queues its reply.
    fn complete(
        &self,
        req: &Request,
        payload: Vec<u8>,
        meta_id: u32,
        slot: OwnedSemaphorePermit,
        bytes: Option<OwnedSemaphorePermit>,
    ) {
        let outcome = catch_unwind(AssertUnwindSafe(|| self.execute(req, payload, meta_id)))
            .unwrap_or_else(|_| Err(DeviceError::Io("the device panicked".into())));
        let reply = match outcome {
            Ok(reply) => reply,
            Err(e) => {
                let _g = self.span.enter();
                tracing::warn!(kind = req.kind, offset = req.offset, length = req.length, error = %e, "device error");
                self.error(req.cookie, errno(&e), &e.to_string())
            }
        };
        self.send(reply, slot, bytes);
    }

    fn execute(&self, req: &Request, payload: Vec<u8>, meta_id: u32) -> Result<Reply, DeviceError> {
        let dev = &*self.device;
        let (cookie, offset, len) = (req.cookie, req.offset, u64::from(req.length));
        let fua = req.flags & CMD_FLAG_FUA != 0;
        let ok = || Reply::simple(cookie, 0, Vec::new());
        match req.kind {
            CMD_READ => {
                let mut buf = vec![0u8; req.length as usize];
                if !buf.is_empty() {
                    dev.read(offset, &mut buf)?;
                }
                Ok(match (self.structured, buf.is_empty()) {
                    (false, _) => Reply::simple(cookie, 0, buf),
                    (true, true) => Reply::done(cookie),
                    (true, false) => Reply::offset_data(cookie, offset, buf),
                })
            }
            CMD_WRITE => {
                if !payload.is_empty() {
                    dev.write(offset, &payload, fua)?;
                }
                Ok(ok())
            }
            CMD_FLUSH => dev.flush().map(|()| ok()),
            CMD_TRIM => {
                if len > 0 {
                    dev.trim(offset, len)?;
                    if fua {
                        dev.flush()?;
                    }
                }
                Ok(ok())
            }
            CMD_WRITE_ZEROES => {
                if len > 0 {
                    self.write_zeroes(req)?;
                    if fua {
                        dev.flush()?;
                    }
                }
                Ok(ok())
            }
            CMD_BLOCK_STATUS => {
                let extents = dev.block_status(offset, len)?;
                let req_one = req.flags & CMD_FLAG_REQ_ONE != 0;
                let d = descriptors(&extents, req.length, req_one, MAX_DESCRIPTORS);
                Ok(Reply::block_status(cookie, meta_id, &d))
            }
            _ => Err(DeviceError::Invalid("unknown command".into())),
        }
    }

    /// WRITE_ZEROES; without FAST_ZERO, a device that cannot zero natively
    /// gets plain writes of zeroes instead.
    fn write_zeroes(&self, req: &Request) -> Result<(), DeviceError> {
        let dev = &*self.device;
        let may_trim = req.flags & CMD_FLAG_NO_HOLE == 0;
        let len = u64::from(req.length);
        match dev.write_zeroes(req.offset, len, may_trim) {
            Err(DeviceError::NotSupported(_)) if req.flags & CMD_FLAG_FAST_ZERO == 0 => {
                let zeroes = vec![0u8; len.min(ZERO_CHUNK) as usize];
                let mut done = 0;
                while done < len {
                    let n = (len - done).min(ZERO_CHUNK);
                    dev.write(req.offset + done, &zeroes[..n as usize], false)?;
                    done += n;
                }
                Ok(())
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Extent;
    use crate::mem::{MemDevice, MemExports};
    use crate::testkit::*;
    use crate::Exports;
    use std::sync::Mutex;
    use std::time::Duration;

    fn pattern(off: usize, len: usize) -> Vec<u8> {
        (off..off + len)
            .map(|i| if i < 65536 { i as u8 } else { 0 })
            .collect()
    }

    async fn disc(mut c: Client) {
        c.request(CMD_DISC, 0, 0, 0, 0).await;
        c.closed().await.unwrap();
    }

    #[tokio::test]
    async fn structured_read_write_and_zero_length() {
        let mut c = Client::structured("disk").await;
        c.request(CMD_READ, 0, 1, 100, 1000).await;
        let ch = c.chunk().await;
        assert_eq!(
            (ch.flags, ch.kind, ch.cookie),
            (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, 1)
        );
        assert_eq!(&ch.payload[..8], &100u64.to_be_bytes());
        assert_eq!(&ch.payload[8..], &pattern(100, 1000)[..]);

        c.request(CMD_WRITE, CMD_FLAG_FUA, 2, 4096, 3).await;
        c.send(&[9, 8, 7]).await;
        let ch = c.chunk().await;
        assert_eq!(
            (ch.kind, ch.cookie, ch.errno()),
            (0xffff, 2, 0),
            "simple success reply"
        );
        c.request(CMD_READ, CMD_FLAG_DF, 3, 4095, 5).await;
        assert_eq!(
            &c.chunk().await.payload[8..],
            &[4095u16 as u8, 9, 8, 7, 4099u16 as u8]
        );

        c.request(CMD_READ, 0, 4, 0, 0).await;
        let ch = c.chunk().await;
        assert_eq!(
            (ch.flags, ch.kind, ch.payload.len()),
            (REPLY_FLAG_DONE, REPLY_TYPE_NONE, 0)
        );
        c.request(CMD_WRITE, 0, 5, 0, 0).await;
        assert_eq!(c.chunk().await.errno(), 0);
        disc(c).await;
    }

    #[tokio::test]
    async fn simple_replies_for_the_kernel_client() {
        let (exports, disk, _, _) = exports();
        let mut c = Client::start(exports, ServerOptions::default()).await;
        c.send(&crate::mem::client_handshake("disk", false)).await;
        let mut h = [0u8; 10];
        c.r.read_exact(&mut h).await.unwrap();
        c.request(CMD_READ, 0, 7, 10, 20).await;
        assert_eq!(c.simple_reply(20).await, (0, 7, pattern(10, 20)));
        c.request(CMD_WRITE, 0, 8, 0, 4).await;
        c.send(b"abcd").await;
        assert_eq!(c.simple_reply(0).await, (0, 8, vec![]));
        assert_eq!(&disk.contents()[..4], b"abcd");
        // DF is only valid with structured replies.
        c.request(CMD_READ, CMD_FLAG_DF, 9, 0, 4).await;
        assert_eq!(c.simple_reply(4).await.0, EINVAL);
        c.request(CMD_READ, 0, 10, SIZE as u64, 1).await;
        assert_eq!(c.simple_reply(1).await.0, EINVAL);
        c.request(CMD_BLOCK_STATUS, 0, 11, 0, 512).await;
        assert_eq!(c.simple_reply(0).await.0, EINVAL);
        disc(c).await;
    }

    #[tokio::test]
    async fn range_and_limit_errors() {
        let mut c = Client::structured("disk").await;
        let end = SIZE as u64;
        for (kind, off, len, errno) in [
            (CMD_READ, end - 1, 2, EINVAL),
            (CMD_READ, u64::MAX, 2, EINVAL),
            (CMD_READ, 0, (32 << 20) + 1, EINVAL),
            (CMD_TRIM, end, 1, EINVAL),
            (CMD_CACHE, u64::MAX - 1, 4, EINVAL),
            (CMD_WRITE_ZEROES, end - 1, 2, ENOSPC),
            (CMD_BLOCK_STATUS, end, 1, EINVAL),
            (CMD_BLOCK_STATUS, 0, 0, EINVAL),
            (42, 0, 0, EINVAL),
        ] {
            c.request(kind, 0, 100 + u64::from(kind), off, len).await;
            let ch = c.chunk().await;
            assert_eq!(
                (ch.kind, ch.flags, ch.errno()),
                (REPLY_TYPE_ERROR, REPLY_FLAG_DONE, errno),
                "{kind} {off} {len}"
            );
        }
        // A write past the end still has its payload consumed.
        c.request(CMD_WRITE, 0, 1, end - 2, 4).await;
        c.send(&[1, 2, 3, 4]).await;
        assert_eq!(c.chunk().await.errno(), ENOSPC);
        // Flags not valid for the command.
        c.request(CMD_WRITE, CMD_FLAG_NO_HOLE, 2, 0, 1).await;
        c.send(&[1]).await;
        assert_eq!(c.chunk().await.errno(), EINVAL);
        c.request(CMD_READ, 1 << 9, 3, 0, 1).await;
        assert_eq!(c.chunk().await.errno(), EINVAL);
        c.request(CMD_CACHE, CMD_FLAG_FUA, 4, 0, 4096).await;
        assert_eq!(c.chunk().await.errno(), 0);
        // A device error maps to EIO.
        c.request(CMD_READ, 0, 5, end - 8192, 8192).await;
        let ch = c.chunk().await;
        assert_eq!((ch.cookie, ch.errno()), (5, EIO));
        disc(c).await;
    }

    #[tokio::test]
    async fn oversized_write_closes() {
        let mut c = Client::structured("disk").await;
        c.request(CMD_WRITE, 0, 1, 0, (32 << 20) + 1).await;
        assert!(matches!(
            c.closed().await,
            Err(NbdError::PayloadTooLarge { .. })
        ));
    }

    #[tokio::test]
    async fn bad_request_magic_closes() {
        let mut c = Client::structured("disk").await;
        let mut r = Request {
            flags: 0,
            kind: CMD_READ,
            cookie: 1,
            offset: 0,
            length: 1,
        }
        .encode();
        r[3] ^= 1;
        c.send(&r).await;
        assert!(matches!(
            c.closed().await,
            Err(NbdError::RequestMagic(0x2560_9512))
        ));
    }

    #[tokio::test]
    async fn client_vanishing_mid_request() {
        let mut c = Client::structured("disk").await;
        c.send(
            &Request {
                flags: 0,
                kind: CMD_WRITE,
                cookie: 1,
                offset: 0,
                length: 100,
            }
            .encode(),
        )
        .await;
        c.send(&[0; 50]).await;
        c.w.shutdown().await.unwrap();
        assert!(matches!(c.closed().await, Err(NbdError::Io(_))));
        let mut c = Client::structured("disk").await;
        c.send(&[0x25, 0x60]).await;
        c.w.shutdown().await.unwrap();
        assert!(matches!(c.closed().await, Err(NbdError::Io(_))));
        // Between requests it is a clean end.
        let mut c = Client::structured("disk").await;
        c.w.shutdown().await.unwrap();
        assert!(c.closed().await.is_ok());
    }

    #[tokio::test]
    async fn read_only_export_refuses_writes() {
        for structured in [true, false] {
            let mut c = if structured {
                Client::structured("ro").await
            } else {
                Client::simple("ro").await
            };
            c.request(CMD_WRITE, 0, 1, 0, 2).await;
            c.send(&[1, 2]).await;
            c.request(CMD_TRIM, 0, 2, 0, 4096).await;
            c.request(CMD_WRITE_ZEROES, 0, 3, 0, 4096).await;
            c.request(CMD_READ, 0, 4, 0, 2).await;
            for cookie in 1..=3 {
                let ch = c.chunk().await;
                assert_eq!((ch.cookie, ch.errno()), (cookie, EPERM));
            }
            let ch = c.chunk().await;
            assert_eq!(ch.cookie, 4);
            if structured {
                assert_eq!(ch.kind, REPLY_TYPE_OFFSET_DATA);
            } else {
                let mut d = [0u8; 2];
                c.r.read_exact(&mut d).await.unwrap();
            }
            disc(c).await;
        }
    }

    fn status(ch: &Chunk) -> Vec<(u32, u32)> {
        assert_eq!(ch.kind, REPLY_TYPE_BLOCK_STATUS);
        assert_eq!(&ch.payload[..4], &BASE_ALLOCATION_ID.to_be_bytes());
        ch.payload[4..]
            .chunks(8)
            .map(|d| {
                (
                    u32::from_be_bytes(d[..4].try_into().unwrap()),
                    u32::from_be_bytes(d[4..].try_into().unwrap()),
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn block_status_trim_and_zeroes() {
        let mut c = Client::structured("disk").await;
        c.request(CMD_BLOCK_STATUS, 0, 1, 0, 128 * 1024).await;
        assert_eq!(status(&c.chunk().await), vec![(65536, 0), (65536, 3)]);
        c.request(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 2, 100, 128 * 1024)
            .await;
        assert_eq!(status(&c.chunk().await), vec![(65436, 0)]);
        c.request(CMD_TRIM, 0, 3, 4096, 8192).await;
        c.request(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 4, 16384, 8192)
            .await;
        c.request(CMD_WRITE_ZEROES, CMD_FLAG_FUA, 5, 32768, 4096)
            .await;
        let mut cookies: Vec<u64> = Vec::new();
        for _ in 0..3 {
            let ch = c.chunk().await;
            assert_eq!(ch.errno(), 0);
            cookies.push(ch.cookie);
        }
        cookies.sort();
        assert_eq!(cookies, vec![3, 4, 5]);
        c.request(CMD_BLOCK_STATUS, 0, 6, 0, 40960).await;
        assert_eq!(
            status(&c.chunk().await),
            vec![(4096, 0), (8192, 3), (20480, 0), (4096, 3), (4096, 0)]
        );
        c.request(CMD_READ, 0, 7, 4096, 8192).await;
        assert!(c.chunk().await.payload[8..].iter().all(|b| *b == 0));
        disc(c).await;
    }

    #[tokio::test]
    async fn fast_zero_and_emulated_zeroes() {
        let (exports, _, _, nz) = exports();
        nz.load(0, &[0xff; 8192]);
        let mut c = Client::scripted(exports, ServerOptions::default(), "slow-zero").await;
        c.request(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 1, 0, 4096)
            .await;
        let ch = c.chunk().await;
        assert_eq!((ch.kind, ch.errno()), (REPLY_TYPE_ERROR, ENOTSUP));
        assert!(
            nz.contents()[..4096].iter().all(|b| *b == 0xff),
            "fast zero must not write"
        );
        c.request(CMD_WRITE_ZEROES, 0, 2, 0, 4096).await;
        assert_eq!(c.chunk().await.errno(), 0);
        assert!(nz.contents()[..4096].iter().all(|b| *b == 0));
        assert!(nz.contents()[4096..8192].iter().all(|b| *b == 0xff));
        disc(c).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pipelined_requests_all_answered_before_disc_closes() {
        let (exports, disk, _, _) = exports();
        let opts = ServerOptions {
            max_in_flight: 4,
            ..ServerOptions::default()
        };
        let mut c = Client::scripted(exports, opts, "disk").await;
        // 100 writes and reads, then a flush and DISC, all without waiting.
        let mut batch = Vec::new();
        for i in 0..100u64 {
            let w = Request {
                flags: 0,
                kind: CMD_WRITE,
                cookie: i,
                offset: 65536 + i * 512,
                length: 512,
            };
            batch.extend_from_slice(&w.encode());
            batch.extend_from_slice(&[i as u8; 512]);
            let r = Request {
                flags: 0,
                kind: CMD_READ,
                cookie: 1000 + i,
                offset: i * 512,
                length: 512,
            };
            batch.extend_from_slice(&r.encode());
        }
        batch.extend_from_slice(
            &Request {
                flags: 0,
                kind: CMD_FLUSH,
                cookie: 5000,
                offset: 0,
                length: 0,
            }
            .encode(),
        );
        batch.extend_from_slice(
            &Request {
                flags: 0,
                kind: CMD_DISC,
                cookie: 0,
                offset: 0,
                length: 0,
            }
            .encode(),
        );
        // The pipe holds all of it; the server reads while it answers.
        c.w.write_all(&batch).await.unwrap();
        let mut seen = std::collections::BTreeSet::new();
        {
            while seen.len() < 201 {
                let ch = c.chunk().await;
                assert_eq!(ch.errno(), 0);
                if ch.cookie >= 1000 && ch.cookie < 5000 {
                    let i = (ch.cookie - 1000) as usize;
                    assert_eq!(&ch.payload[8..], &pattern(i * 512, 512)[..]);
                }
                assert!(seen.insert(ch.cookie), "duplicate reply");
            }
        }
        c.closed().await.unwrap();
        let data = disk.contents();
        for i in 0..100usize {
            assert!(data[65536 + i * 512..65536 + (i + 1) * 512]
                .iter()
                .all(|b| *b == i as u8));
        }
        assert_eq!(disk.flush_count(), 1);
    }

    /// Records the order of completed writes and flushes; writes are slow.
    struct Recorder {
        inner: MemDevice,
        log: Mutex<Vec<&'static str>>,
    }

    impl BlockDevice for Recorder {
        fn size(&self) -> Result<u64, DeviceError> {
            self.inner.size()
        }
        fn read_only(&self) -> bool {
            false
        }
        fn read(&self, o: u64, b: &mut [u8]) -> Result<(), DeviceError> {
            self.inner.read(o, b)
        }
        fn write(&self, o: u64, d: &[u8], f: bool) -> Result<(), DeviceError> {
            std::thread::sleep(Duration::from_millis(if o == 0 { 200 } else { 1 }));
            self.inner.write(o, d, f)?;
            self.log
                .lock()
                .unwrap()
                .push(if o == 0 { "slow write" } else { "write" });
            Ok(())
        }
        fn flush(&self) -> Result<(), DeviceError> {
            self.log.lock().unwrap().push("flush");
            Ok(())
        }
        fn trim(&self, o: u64, l: u64) -> Result<(), DeviceError> {
            self.inner.trim(o, l)
        }
        fn write_zeroes(&self, o: u64, l: u64, t: bool) -> Result<(), DeviceError> {
            self.inner.write_zeroes(o, l, t)
        }
        fn block_status(&self, o: u64, l: u64) -> Result<Vec<Extent>, DeviceError> {
            self.inner.block_status(o, l)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn flush_waits_for_earlier_writes_only() {
        let dev = Arc::new(Recorder {
            inner: MemDevice::new(SIZE),
            log: Mutex::new(Vec::new()),
        });
        let exports: Arc<dyn Exports> = Arc::new(MemExports::new().with("d", "", dev.clone()));
        let mut c = Client::scripted(exports, ServerOptions::default(), "d").await;
        // slow write, flush A, write, flush B: A must follow the slow write;
        // B must follow both writes; A need not wait for the second write.
        c.request(CMD_WRITE, 0, 1, 0, 1).await;
        c.send(&[1]).await;
        c.request(CMD_FLUSH, 0, 2, 0, 0).await;
        c.request(CMD_WRITE, 0, 3, 4096, 1).await;
        c.send(&[1]).await;
        c.request(CMD_FLUSH, 0, 4, 0, 0).await;
        let mut order = Vec::new();
        for _ in 0..4 {
            order.push(c.chunk().await.cookie);
        }
        let log = dev.log.lock().unwrap().clone();
        assert_eq!(log.iter().filter(|e| **e == "flush").count(), 2);
        let slow = log.iter().position(|e| *e == "slow write").unwrap();
        let fast = log.iter().position(|e| *e == "write").unwrap();
        let first_flush = log.iter().position(|e| *e == "flush").unwrap();
        let last_flush = log.iter().rposition(|e| *e == "flush").unwrap();
        assert!(first_flush > slow && last_flush > fast, "{log:?}");
        assert_eq!(order[0], 3, "the fast write is answered first: {order:?}");
        let pos = |c| order.iter().position(|x| *x == c).unwrap();
        assert!(pos(2) > pos(1) && pos(4) > pos(1), "{order:?}");
        disc(c).await;
    }
}
