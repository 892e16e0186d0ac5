//! The blocking side of a connection: NBD's [`Work`] for the shared runners
//! (crate `lamina-runners`, which owns the policy: one runner takes a burst
//! and runs it in order on a fast device, a runner per request on a slow
//! one, a watchdog for stalled runners). What is NBD's here: a request, how
//! it is submitted to the volume, its reply, and the writer the replies go
//! to.
//!
//! A runner *submits* each request to the volume ([`BlockIo::submit`]). An
//! inline volume (the local engine) completes before `submit` returns: the
//! reply joins the runner's batch, exactly as a plain call would. A volume
//! that completes later, from its own thread or task, has its reply sent to
//! the writer from there; the request's permits travel with the reply, so
//! flush ordering holds either way.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use lamina_runners::{answer_inline, Runners, Work};

use crate::device::{BlockIo, IoError, IoErrorKind};
use crate::exec::{execute, Done, ReplyMode};
use crate::proto::{errno, Reply, Request};
use crate::writer::{Permits, ReplyWriter};

/// One request on its way to a runner.
pub(crate) struct Job {
    pub req: Request,
    pub payload: Vec<u8>,
    pub permits: Permits,
    /// Already answered without the device (refusals, CACHE).
    pub reply: Option<Reply>,
}

/// The runners of one connection.
pub(crate) type Executor = Runners<Conn>;

/// Starts the runners of a connection, at most `max_runners` at once, on
/// the runtime of its writer.
pub(crate) fn executor(
    device: Arc<dyn BlockIo>,
    mode: ReplyMode,
    writer: ReplyWriter,
    max_runners: usize,
) -> Executor {
    let runtime = writer.runtime.clone();
    let conn = Conn {
        device,
        mode,
        writer: Arc::new(writer),
        span: tracing::Span::current(),
    };
    Runners::new(conn, runtime, max_runners)
}

/// What runs a connection's requests and where their replies go.
pub(crate) struct Conn {
    device: Arc<dyn BlockIo>,
    pub mode: ReplyMode,
    pub writer: Arc<ReplyWriter>,
    span: tracing::Span,
}

impl Work for Conn {
    type Job = Job;
    type Done = (Reply, Permits);

    fn timed(&self, job: &Job) -> bool {
        job.reply.is_none()
    }

    fn run(&self, job: Job) -> Option<(Reply, Permits)> {
        match job.reply {
            Some(r) => Some((r, job.permits)),
            None => self.complete(&job.req, job.payload, job.permits),
        }
    }

    fn deliver(&self, batch: Vec<(Reply, Permits)>) {
        self.writer.send_blocking(batch);
    }
}

impl Conn {
    /// Submits a validated request to the volume. Its reply and permits
    /// come back here if the volume completed it before `submit` returned;
    /// otherwise the completion sends them to the writer itself.
    fn complete(
        &self,
        req: &Request,
        payload: Vec<u8>,
        permits: Permits,
    ) -> Option<(Reply, Permits)> {
        tracing::debug!(parent: &self.span, kind = req.kind, cookie = req.cookie, offset = req.offset, length = req.length, "request");
        let writer = self.writer.clone();
        let later = move |reply: (Reply, Permits)| send_later(writer, reply);
        answer_inline(
            |answer| {
                let (mode, span, req2) = (self.mode, self.span.clone(), *req);
                let guard = AnswerOnce(Some(Box::new(move |r: Result<Reply, IoError>| {
                    let reply = r.unwrap_or_else(|e| error_reply(mode, &span, &req2, &e));
                    answer((reply, permits))
                })));
                let done: Done = Box::new(move |r| guard.answer(r));
                let submitted = catch_unwind(AssertUnwindSafe(|| {
                    execute(&self.device, self.mode, req, payload, done)
                }));
                if submitted.is_err() {
                    // The completion was dropped while unwinding: it has
                    // answered with an error already (see `AnswerOnce`).
                    tracing::error!(parent: &self.span, kind = req.kind, offset = req.offset, "the volume panicked");
                }
            },
            later,
        )
    }
}

/// The error reply for a failed request, logged.
fn error_reply(mode: ReplyMode, span: &tracing::Span, req: &Request, e: &IoError) -> Reply {
    tracing::warn!(parent: span, kind = req.kind, offset = req.offset, length = req.length, error = %e, "volume error");
    mode.error(req.cookie, errno(e), &e.to_string())
}

/// Sends a reply that completed after its runner moved on.
fn send_later(writer: Arc<ReplyWriter>, reply: (Reply, Permits)) {
    writer.send_later(reply);
}

type Answer = Box<dyn FnOnce(Result<Reply, IoError>) + Send>;

/// Answers exactly once: a completion dropped without being called (a
/// volume's bug, or a panic) answers with an I/O error instead of leaving
/// the client waiting forever.
struct AnswerOnce(Option<Answer>);

impl AnswerOnce {
    fn answer(mut self, r: Result<Reply, IoError>) {
        if let Some(f) = self.0.take() {
            f(r)
        }
    }
}

impl Drop for AnswerOnce {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f(Err(IoError::new(
                IoErrorKind::Io,
                "the volume dropped the request without completing it",
            )));
        }
    }
}
