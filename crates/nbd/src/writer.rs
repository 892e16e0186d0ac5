//! The one reply writer of a connection: a mutex around the buffered write
//! half. The blocking task that completed a request writes its own reply
//! (no hand-off to another task or thread); whichever writer finds no other
//! reply ready flushes the buffer, so a burst of pipelined replies shares
//! system calls while a lone reply goes out at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{watch, Mutex, Notify, OwnedSemaphorePermit};

use crate::proto::Reply;

/// The write half as the transmission phase sees it.
pub(crate) type BoxedWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// What a request holds from its header until its reply is written (see
/// `transmission`): a slot, a share of the byte budget, and for writes the
/// flush epoch.
pub(crate) struct Permits {
    pub _slot: OwnedSemaphorePermit,
    pub _bytes: Option<OwnedSemaphorePermit>,
    pub hold: Option<std::sync::Arc<dyn Send + Sync>>,
}

struct State {
    /// `None` once closed: the stream is released with the connection, not
    /// with the last blocking task that still holds the writer.
    w: Option<BufWriter<BoxedWrite>>,
    error: Option<std::io::Error>,
}

pub(crate) struct ReplyWriter {
    state: Mutex<State>,
    /// Replies completed and waiting for (or holding) the lock.
    ready: AtomicUsize,
    failed: Notify,
    /// Set by [`ReplyWriter::abort`]: every send, waiting or writing, gives
    /// up at once.
    aborted: watch::Sender<bool>,
    pub(crate) runtime: tokio::runtime::Handle,
    /// Replies a volume completed from its own thread or task, after their
    /// runner moved on, waiting for the one task that writes them
    /// ([`ReplyWriter::send_later`]).
    late: std::sync::Mutex<Vec<(Reply, Permits)>>,
    /// That task is running (or about to).
    late_task: std::sync::atomic::AtomicBool,
}

impl ReplyWriter {
    /// Must be called within the runtime that serves the connection.
    pub(crate) fn new(w: BufWriter<BoxedWrite>) -> Self {
        ReplyWriter {
            state: Mutex::new(State {
                w: Some(w),
                error: None,
            }),
            ready: AtomicUsize::new(0),
            failed: Notify::new(),
            aborted: watch::channel(false).0,
            runtime: tokio::runtime::Handle::current(),
            late: std::sync::Mutex::new(Vec::new()),
            late_task: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Resolves once the writer is aborted.
    async fn until_aborted(&self) {
        let mut rx = self.aborted.subscribe();
        let _ = rx.wait_for(|a| *a).await;
    }

    /// Gives up on the client: sends waiting for the lock or blocked on a
    /// full socket return at once, dropping their replies; the stream is
    /// released. For a client that stopped reading while the connection
    /// ends (see `ServerOptions::drain_timeout`).
    pub(crate) fn abort(&self) {
        self.aborted.send_replace(true);
    }

    /// Writes replies in order, then releases their permits. After a write
    /// error replies are dropped and [`ReplyWriter::failed`] fires.
    pub(crate) async fn send(&self, replies: Vec<(Reply, Permits)>) {
        let n = replies.len();
        self.ready.fetch_add(n, Ordering::SeqCst);
        // Biased: the abort branch (which subscribes to the signal) is only
        // polled when the lock or the write is not ready at once.
        let mut guard = tokio::select! {
            biased;
            g = self.state.lock() => g,
            _ = self.until_aborted() => {
                self.ready.fetch_sub(n, Ordering::SeqCst);
                return release(replies);
            }
        };
        // Every increment is followed by a decrement under the lock, so the
        // last one to decrement reaches 0 and flushes for everyone before.
        let last = self.ready.fetch_sub(n, Ordering::SeqCst) == n;
        let st = &mut *guard;
        if let (Some(w), None) = (st.w.as_mut(), st.error.as_ref()) {
            let written = tokio::select! {
                biased;
                r = write(w, &replies, last) => r,
                _ = self.until_aborted() => Err(aborted()),
            };
            if let Err(e) = written {
                if e.kind() == std::io::ErrorKind::ConnectionAborted {
                    st.w = None; // a half-written reply: the stream is useless now
                }
                st.error = Some(e);
                self.failed.notify_one();
            }
        }
        drop(guard);
        release(replies);
    }
}

/// While armed, the late replies' task is running: dropped armed (the
/// task dropped mid-write, its runtime shutting down), it lets the next
/// late reply start another instead of queueing behind a task that is gone.
struct LateTask(Option<Arc<ReplyWriter>>);

impl Drop for LateTask {
    fn drop(&mut self) {
        if let Some(w) = self.0.take() {
            w.late_task.store(false, Ordering::SeqCst);
        }
    }
}

/// The error of a send given up by [`ReplyWriter::abort`].
fn aborted() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "the client stopped reading replies; connection closed",
    )
}

/// Recycles reply buffers and releases the requests' permits.
fn release(replies: Vec<(Reply, Permits)>) {
    for (reply, permits) in replies {
        crate::bufs::give(reply.into_body());
        drop(permits);
    }
}

impl ReplyWriter {
    /// Sends a reply completed off the runners (a replicated volume's,
    /// whose last replica answered on its session's task). A burst of them
    /// shares one task and one write: the first starts the task, the others
    /// join its queue while it writes. The task runs on the runtime of the
    /// thread that completed the request, when that is a multi-threaded
    /// one (a replica session's): it then runs there as soon as that
    /// thread's task yields, with no other thread woken; otherwise on this
    /// connection's runtime.
    pub(crate) fn send_later(self: &Arc<Self>, reply: (Reply, Permits)) {
        self.late_queue().push(reply);
        if self.late_task.swap(true, Ordering::SeqCst) {
            return;
        }
        let w = self.clone();
        let runtime = tokio::runtime::Handle::try_current()
            .ok()
            .filter(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
            .unwrap_or_else(|| self.runtime.clone());
        runtime.spawn(async move {
            let mut running = LateTask(Some(w.clone()));
            loop {
                let batch = std::mem::take(&mut *w.late_queue());
                if !batch.is_empty() {
                    w.send(batch).await;
                    continue;
                }
                w.late_task.store(false, Ordering::SeqCst);
                // A reply queued after the take and before the store saw
                // the task running: look once more.
                if w.late_queue().is_empty() || w.late_task.swap(true, Ordering::SeqCst) {
                    running.0 = None;
                    return;
                }
            }
        });
    }

    fn late_queue(&self) -> std::sync::MutexGuard<'_, Vec<(Reply, Permits)>> {
        self.late.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`ReplyWriter::send`] from a blocking task.
    pub(crate) fn send_blocking(&self, replies: Vec<(Reply, Permits)>) {
        self.runtime.block_on(self.send(replies))
    }

    /// Resolves once a write has failed.
    pub(crate) async fn failed(&self) {
        self.failed.notified().await
    }

    /// Flushes, shuts the write half down and drops it; returns the first
    /// error. Replies sent afterwards are dropped.
    pub(crate) async fn close(&self) -> std::io::Result<()> {
        let mut st = self.state.lock().await;
        let w = st.w.take();
        if let Some(e) = st.error.take() {
            return Err(e);
        }
        if let Some(mut w) = w {
            tokio::select! {
                biased;
                r = async { w.flush().await?; w.shutdown().await } => r?,
                _ = self.until_aborted() => return Err(aborted()),
            }
        }
        Ok(())
    }
}

async fn write(
    w: &mut BufWriter<BoxedWrite>,
    replies: &[(Reply, Permits)],
    flush: bool,
) -> std::io::Result<()> {
    for (reply, _) in replies {
        w.write_all(reply.head()).await?;
        if !reply.body().is_empty() {
            w.write_all(reply.body()).await?;
        }
    }
    if flush {
        w.flush().await?;
    }
    Ok(())
}
