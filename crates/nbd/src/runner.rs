//! The blocking side of a connection: *runners* (blocking tasks) take the
//! requests the reader queued, call the device and write the replies.
//!
//! Handing each request to its own blocking task costs two thread wake-ups
//! per request, which dominates with a fast device (page-cache hits take a
//! few microseconds). So the policy adapts to how long device calls take,
//! judged by the share of recent calls that were slow:
//!
//! * fast device: one runner takes everything queued, runs it in order and
//!   writes the replies together; it keeps taking work until the queue is
//!   empty (and lingers briefly, yielding its CPU, before it ends), so a
//!   busy connection needs few wake-ups. If a call turns
//!   out slow, the runner hands half of its remaining work back and starts
//!   another runner ([`SPLIT_AFTER`]); if the reader finds the runners
//!   making no progress for [`SPLIT_AFTER`], it starts another one too.
//! * slow device (most recent calls took over [`SLOW_CALL`]; also the start
//!   state, until calls prove fast): a runner takes one request at a time
//!   and the reader starts a runner per queued request, so a disk sees the
//!   client's whole queue depth.
//!
//! The cost of the fast policy is head-of-line blocking when a call is
//! unexpectedly slow (a cache miss): requests the runner already took wait
//! for that one call before being shared out.
//!
//! A runner *submits* each request to the volume ([`BlockIo::submit`]). An
//! inline volume (the local engine) completes before `submit` returns: the
//! reply joins the runner's batch, exactly as a plain call would. A volume
//! that completes later, from its own thread or task, has its reply sent to
//! the writer from there; the request's permits travel with the reply, so
//! flush ordering holds either way.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::device::{BlockIo, IoError, IoErrorKind};
use crate::exec::{execute, Done, ReplyMode};
use crate::proto::{errno, Reply, Request};
use crate::writer::{Permits, ReplyWriter};

/// How long a runner works before it shares out its remaining work, and how
/// long the runners may make no progress before the reader starts another.
const SPLIT_AFTER: Duration = Duration::from_micros(100);
/// A device call longer than this counts as slow.
const SLOW_CALL: Duration = Duration::from_micros(50);
/// Fixed-point 1.0 for the share of slow calls.
const ONE: u32 = 1 << 16;
/// How long an idle runner waits for more work before it ends.
const LINGER: Duration = Duration::from_micros(30);
/// How often queued requests check for stalled runners (the timer's
/// resolution).
const WATCH_EVERY: Duration = Duration::from_millis(1);

/// One request on its way to a runner.
pub(crate) struct Job {
    pub req: Request,
    pub payload: Vec<u8>,
    pub permits: Permits,
    /// Already answered without the device (refusals, CACHE).
    pub reply: Option<Reply>,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Runners started and not yet finished.
    runners: usize,
}

/// What the reader and the runners of one connection share.
pub(crate) struct Executor {
    queue: Mutex<Queue>,
    device: Arc<dyn BlockIo>,
    pub mode: ReplyMode,
    pub writer: ReplyWriter,
    span: tracing::Span,
    max_runners: usize,
    /// Moving average of the share of slow calls (fixed point, [`ONE`] is
    /// all of them). A share rather than a mean time, so that a thread
    /// preempted mid-call on a busy machine does not flip the policy.
    slow_share: AtomicU32,
    /// Length of `queue.jobs`, readable without the lock.
    queued: AtomicUsize,
    /// When a runner last took work or finished a call (ns since `clock`).
    progress_ns: AtomicU64,
    clock: Instant,
    /// A watchdog task runs (see [`Executor::watch`]).
    watching: std::sync::atomic::AtomicBool,
}

impl Executor {
    pub(crate) fn new(
        device: Arc<dyn BlockIo>,
        mode: ReplyMode,
        writer: ReplyWriter,
        max_runners: usize,
    ) -> Self {
        Executor {
            queue: Mutex::new(Queue::default()),
            device,
            mode,
            writer,
            span: tracing::Span::current(),
            max_runners: max_runners.max(1),
            slow_share: AtomicU32::new(ONE),
            queued: AtomicUsize::new(0),
            progress_ns: AtomicU64::new(0),
            clock: Instant::now(),
            watching: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now_ns(&self) -> u64 {
        self.clock.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64
    }

    /// Whether most recent device calls were slow.
    fn slow(&self) -> bool {
        self.slow_share.load(Ordering::Relaxed) > ONE / 2
    }

    /// Queues `jobs` (leaving it empty) and starts runners as the policy
    /// says.
    pub(crate) fn submit(self: &Arc<Self>, jobs: &mut VecDeque<Job>) {
        if jobs.is_empty() {
            return;
        }
        let now = self.now_ns();
        let slow = self.slow();
        let mut q = self.lock();
        q.jobs.append(jobs);
        self.queued.store(q.jobs.len(), Ordering::Relaxed);
        let stalled = now.saturating_sub(self.progress_ns.load(Ordering::Relaxed))
            > SPLIT_AFTER.as_nanos() as u64;
        let wanted = if slow {
            q.jobs.len()
        } else {
            usize::from(q.runners == 0 || stalled)
        };
        let start = wanted.min(self.max_runners.saturating_sub(q.runners));
        q.runners += start;
        let left_queued = start < q.jobs.len() && q.runners > 0;
        drop(q);
        if start > 0 && stalled {
            // One new runner per stall, not one per request.
            self.progress_ns.store(now, Ordering::Relaxed);
        }
        for _ in 0..start {
            let ex = self.clone();
            tokio::task::spawn_blocking(move || ex.runner());
        }
        if left_queued {
            self.watch();
        }
    }

    /// While requests wait in the queue for busy runners, checks every
    /// millisecond whether the runners stall, and starts another if so.
    /// Without it a stall is noticed only when the client sends its next
    /// request: requests sent just after one that then blocks (a slow
    /// disk) would wait for it, however many runners could serve them.
    fn watch(self: &Arc<Self>) {
        if self.watching.swap(true, Ordering::SeqCst) {
            return;
        }
        let ex = self.clone();
        self.writer.runtime.spawn(async move {
            loop {
                tokio::time::sleep(WATCH_EVERY).await;
                ex.start_if_stalled();
                if ex.queued.load(Ordering::Relaxed) == 0 {
                    ex.watching.store(false, Ordering::SeqCst);
                    // A submit that saw `watching` set before the store
                    // relies on this loop: look once more.
                    if ex.queued.load(Ordering::Relaxed) == 0
                        || ex.watching.swap(true, Ordering::SeqCst)
                    {
                        return;
                    }
                }
            }
        });
    }

    /// Starts a runner if jobs are queued and the runners made no progress
    /// for [`SPLIT_AFTER`].
    fn start_if_stalled(self: &Arc<Self>) {
        let now = self.now_ns();
        let mut q = self.lock();
        let stalled = now.saturating_sub(self.progress_ns.load(Ordering::Relaxed))
            > SPLIT_AFTER.as_nanos() as u64;
        if q.jobs.is_empty() || !stalled || q.runners >= self.max_runners {
            return;
        }
        q.runners += 1;
        drop(q);
        self.progress_ns.store(now, Ordering::Relaxed);
        let ex = self.clone();
        tokio::task::spawn_blocking(move || ex.runner());
    }

    /// Runs one job on its own blocking task (FLUSH, once it may run).
    pub(crate) fn run_alone(self: &Arc<Self>, job: Job) {
        let ex = self.clone();
        tokio::task::spawn_blocking(move || {
            let reply = match job.reply {
                Some(r) => Some((r, job.permits)),
                None => ex.complete(&job.req, job.payload, job.permits),
            };
            if let Some(r) = reply {
                ex.writer.send_blocking(vec![r]);
            }
        });
    }

    fn runner(self: Arc<Self>) {
        loop {
            let Some(mut jobs) = self.take() else { return };
            let mut replies = Vec::with_capacity(jobs.len());
            let mut started = Instant::now();
            while let Some(job) = jobs.pop_front() {
                let (reply, end) = match job.reply {
                    Some(r) => (Some((r, job.permits)), None),
                    None => {
                        let t = Instant::now();
                        let r = self.complete(&job.req, job.payload, job.permits);
                        (r, Some(self.record(t)))
                    }
                };
                replies.extend(reply);
                if end.is_some_and(|end| end - started > SPLIT_AFTER) {
                    self.writer.send_blocking(std::mem::take(&mut replies));
                    self.share(&mut jobs);
                    started = Instant::now();
                }
            }
            if !replies.is_empty() {
                self.writer.send_blocking(replies);
            }
        }
    }

    /// The next jobs for a runner, or `None` when it should end (it has
    /// then been counted out). An idle runner lingers for [`LINGER`] first:
    /// more work usually follows at once, and picking it up here is much
    /// cheaper than waking a new runner.
    fn take(&self) -> Option<VecDeque<Job>> {
        let mut q = self.lock();
        if q.jobs.is_empty() {
            drop(q);
            let until = Instant::now() + LINGER;
            while self.queued.load(Ordering::Relaxed) == 0 && Instant::now() < until {
                std::thread::yield_now();
            }
            q = self.lock();
            if q.jobs.is_empty() {
                q.runners -= 1;
                return None;
            }
        }
        self.progress_ns.store(self.now_ns(), Ordering::Relaxed);
        if self.slow() {
            let job = q.jobs.pop_front();
            self.queued.store(q.jobs.len(), Ordering::Relaxed);
            Some(job.into_iter().collect())
        } else {
            self.queued.store(0, Ordering::Relaxed);
            Some(std::mem::take(&mut q.jobs))
        }
    }

    /// Gives half of `jobs` back to the queue and starts another runner if
    /// anything is queued.
    fn share(self: &Arc<Self>, jobs: &mut VecDeque<Job>) {
        let rest = if jobs.len() >= 2 {
            jobs.split_off(jobs.len() / 2)
        } else {
            VecDeque::new()
        };
        let mut q = self.lock();
        for j in rest.into_iter().rev() {
            q.jobs.push_front(j);
        }
        self.queued.store(q.jobs.len(), Ordering::Relaxed);
        if !q.jobs.is_empty() && q.runners < self.max_runners {
            q.runners += 1;
            drop(q);
            let ex = self.clone();
            tokio::task::spawn_blocking(move || ex.runner());
        }
    }

    /// Accounts for a device call that started at `start`; returns now.
    fn record(&self, start: Instant) -> Instant {
        let end = Instant::now();
        let sample = if end - start > SLOW_CALL { ONE / 16 } else { 0 };
        let old = self.slow_share.load(Ordering::Relaxed);
        self.slow_share
            .store(old - old / 16 + sample, Ordering::Relaxed);
        let progress = (end - self.clock).as_nanos().min(u128::from(u64::MAX)) as u64;
        self.progress_ns.store(progress, Ordering::Relaxed);
        end
    }

    /// Submits a validated request to the volume. Its reply and permits
    /// come back here if the volume completed it before `submit` returned;
    /// otherwise the completion sends them to the writer itself.
    fn complete(
        self: &Arc<Self>,
        req: &Request,
        payload: Vec<u8>,
        permits: Permits,
    ) -> Option<(Reply, Permits)> {
        tracing::debug!(parent: &self.span, kind = req.kind, cookie = req.cookie, offset = req.offset, length = req.length, "request");
        let slot = Arc::new(Mutex::new(Slot {
            reply: None,
            permits: Some(permits),
            returned: false,
        }));
        let (s2, ex, req2) = (slot.clone(), self.clone(), *req);
        let guard = AnswerOnce(Some(Box::new(move |r: Result<Reply, IoError>| {
            let reply = r.unwrap_or_else(|e| ex.error_reply(&req2, &e));
            let mut st = s2.lock().unwrap_or_else(|e| e.into_inner());
            if !st.returned {
                st.reply = Some(reply);
                return;
            }
            let permits = st.permits.take();
            drop(st);
            if let Some(p) = permits {
                ex.send_later(reply, p);
            }
        })));
        let done: Done = Box::new(move |r| guard.answer(r));
        let submitted = catch_unwind(AssertUnwindSafe(|| {
            execute(&self.device, self.mode, req, payload, done)
        }));
        if submitted.is_err() {
            // The completion was dropped while unwinding: it has answered
            // with an error already (see `AnswerOnce`).
            tracing::error!(parent: &self.span, kind = req.kind, offset = req.offset, "the volume panicked");
        }
        let mut st = slot.lock().unwrap_or_else(|e| e.into_inner());
        st.returned = true;
        match st.reply.take() {
            Some(reply) => st.permits.take().map(|p| (reply, p)),
            None => None,
        }
    }

    /// The error reply for a failed request, logged.
    fn error_reply(&self, req: &Request, e: &IoError) -> Reply {
        tracing::warn!(parent: &self.span, kind = req.kind, offset = req.offset, length = req.length, error = %e, "volume error");
        self.mode.error(req.cookie, errno(e), &e.to_string())
    }

    /// Sends a reply that completed after its runner moved on.
    fn send_later(self: &Arc<Self>, reply: Reply, permits: Permits) {
        let ex = self.clone();
        self.writer.runtime.spawn(async move {
            ex.writer.send(vec![(reply, permits)]).await;
        });
    }
}

/// A request's reply, and whether its runner has stopped waiting for it.
struct Slot {
    reply: Option<Reply>,
    permits: Option<Permits>,
    returned: bool,
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
