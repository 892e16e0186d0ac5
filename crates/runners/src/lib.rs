//! The blocking side of serving a volume's calls: *runners* (blocking tasks)
//! take the jobs a connection's reader queued, run them on the volume and
//! deliver their answers in batches, adapting to how fast the device is.
//! The NBD server's connections (`lamina-nbd`) and the replica side of a
//! replica session (`lamina-transfer`) both run their calls here. This crate
//! owns the policy only: when to start, share out and end runners. It must
//! not know protocols (what a job or an answer is, how it is written) or
//! devices (what running a job does): the [`Work`] a caller gives it does.
//!
//! Handing each call to its own blocking task costs two thread wake-ups per
//! call, which dominates with a fast device (page-cache hits take a few
//! microseconds). So the policy adapts to how long calls take, judged by
//! the share of recent calls that were slow:
//!
//! * fast device: one runner takes everything queued, runs it in order and
//!   delivers the answers together; it keeps taking work until the queue is
//!   empty (and lingers briefly, yielding its CPU, before it ends), so a
//!   busy connection needs few wake-ups. If a call turns out slow, the
//!   runner hands half of its remaining work back and starts another runner
//!   ([`SPLIT_AFTER`]); if a watchdog finds the runners making no progress
//!   for [`SPLIT_AFTER`] while work waits, it starts another one too.
//! * slow device (most recent calls took over [`SLOW_CALL`]; also the start
//!   state, until calls prove fast): a runner takes one job at a time and
//!   [`Runners::submit`] starts a runner per queued job, so a disk sees the
//!   client's whole queue depth.
//!
//! * a lone call on an idle fast device: [`Runners::run_here_if_idle`] runs
//!   it on the caller's thread (a connection's reader), saving the runner's
//!   two wake-ups, which at queue depth 1 are most of a call's time.
//!
//! The cost of the fast policy is head-of-line blocking when a call is
//! unexpectedly slow (a cache miss): jobs the runner already took wait for
//! that one call before being shared out.
//!
//! A job may be answered after [`Work::run`] returns (a volume that
//! completes from its own thread or task): the [`Work`] then delivers that
//! answer itself, and [`answer_inline`] is the helper for telling the two
//! cases apart.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;

/// How long a runner works before it shares out its remaining work, and how
/// long the runners may make no progress before another is started.
pub const SPLIT_AFTER: Duration = Duration::from_micros(100);
/// A call longer than this counts as slow.
pub const SLOW_CALL: Duration = Duration::from_micros(50);
/// Fixed-point 1.0 for the share of slow calls.
const ONE: u32 = 1 << 16;
/// How long an idle runner waits for more work before it ends.
pub const LINGER: Duration = Duration::from_micros(30);
/// How often queued jobs check for stalled runners (the timer's
/// resolution).
const WATCH_EVERY: Duration = Duration::from_millis(1);

/// What the runners of one connection run: its jobs, on its volume, and
/// where their answers go.
pub trait Work: Send + Sync + 'static {
    /// One call, read and waiting to run.
    type Job: Send + 'static;
    /// One call's answer, ready to be written.
    type Done: Send + 'static;

    /// Whether running `job` calls the device, and so counts in how fast
    /// the device is judged to be. A job answered already without the
    /// device (NBD's refusals) is not: its instant answer would make a slow
    /// device look fast.
    fn timed(&self, _job: &Self::Job) -> bool {
        true
    }

    /// Runs `job` on a thread that may block. `Some` when it was answered
    /// before this returned: the answer joins the runner's batch. `None`
    /// when it will be answered later: the work delivers that answer itself
    /// (see [`answer_inline`]). A panic is caught and taken as `None`: the
    /// work must answer a job whose run panicked itself, if it is to be
    /// answered at all.
    fn run(&self, job: Self::Job) -> Option<Self::Done>;

    /// A runner's answers, in the order their jobs completed. Called from a
    /// blocking thread, never with an empty batch.
    fn deliver(&self, batch: Vec<Self::Done>);
}

struct Queue<J> {
    jobs: VecDeque<J>,
    /// Runners started and not yet finished.
    runners: usize,
}

/// The runners of one connection: what its reader and its runners share.
pub struct Runners<W: Work> {
    queue: Mutex<Queue<W::Job>>,
    work: W,
    runtime: Handle,
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
    /// A watchdog task runs (see [`Runners::watch`]).
    watching: AtomicBool,
    /// The last call timed was slow (see [`Runners::run_here_if_idle`]).
    last_slow: AtomicBool,
}

impl<W: Work> Runners<W> {
    /// Runners for `work`, at most `max_runners` at once (at least one),
    /// as blocking tasks of `runtime`; the watchdog is a task there too.
    pub fn new(work: W, runtime: Handle, max_runners: usize) -> Self {
        Runners {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                runners: 0,
            }),
            work,
            runtime,
            max_runners: max_runners.max(1),
            slow_share: AtomicU32::new(ONE),
            queued: AtomicUsize::new(0),
            progress_ns: AtomicU64::new(0),
            clock: Instant::now(),
            watching: AtomicBool::new(false),
            last_slow: AtomicBool::new(true),
        }
    }

    /// The work these runners run.
    pub fn work(&self) -> &W {
        &self.work
    }

    fn lock(&self) -> MutexGuard<'_, Queue<W::Job>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now_ns(&self) -> u64 {
        self.clock.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64
    }

    /// Whether most recent calls were slow.
    fn slow(&self) -> bool {
        self.slow_share.load(Ordering::Relaxed) > ONE / 2
    }

    fn spawn_runner(self: &Arc<Self>) {
        let r = self.clone();
        self.runtime.spawn_blocking(move || r.runner());
    }

    /// Queues `jobs` (leaving it empty) and starts runners as the policy
    /// says.
    pub fn submit(self: &Arc<Self>, jobs: &mut VecDeque<W::Job>) {
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
            // One new runner per stall, not one per job.
            self.progress_ns.store(now, Ordering::Relaxed);
        }
        for _ in 0..start {
            self.spawn_runner();
        }
        if left_queued {
            self.watch();
        }
    }

    /// Runs `job` on the calling thread, as a runner would, when no runner
    /// is running, nothing is queued, most recent calls were fast and the
    /// last one was too; otherwise hands it back (for [`Runners::submit`]).
    /// `Ok(Some)` is its answer, for the caller to deliver (it is not given
    /// to [`Work::deliver`]); `Ok(None)` when it will be answered later (see
    /// [`Work::run`]).
    ///
    /// For a lone call on a fast device (a client at queue depth 1) this
    /// saves the two thread wake-ups a runner costs: starting it, and
    /// handing its answer to the writer. It blocks the caller for one call,
    /// which the policy has just judged to take a few microseconds; a call
    /// that turns out slow sends the next ones to runners until one is fast
    /// again. A caller on an async runtime's worker (a connection's reader)
    /// blocks that worker meanwhile, while the runtime's other workers take
    /// its other tasks; on a runtime of one thread, where nothing would,
    /// the job is handed back.
    pub fn run_here_if_idle(self: &Arc<Self>, job: W::Job) -> Result<Option<W::Done>, W::Job> {
        let one_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread);
        if one_thread || self.slow() || self.last_slow.load(Ordering::Relaxed) {
            return Err(job);
        }
        {
            let mut q = self.lock();
            if q.runners > 0 || !q.jobs.is_empty() {
                return Err(job);
            }
            // Counted as a runner while it runs: a submit meanwhile starts
            // none, and its jobs are handed on below.
            q.runners += 1;
        }
        let done = if self.work.timed(&job) {
            let t = Instant::now();
            let done = self.run(job);
            self.record(t);
            done
        } else {
            self.run(job)
        };
        let mut q = self.lock();
        q.runners -= 1;
        if !q.jobs.is_empty() && q.runners < self.max_runners {
            q.runners += 1;
            drop(q);
            self.spawn_runner();
        }
        Ok(done)
    }

    /// While jobs wait in the queue for busy runners, checks every
    /// millisecond whether the runners stall, and starts another if so.
    /// Without it a stall is noticed only when the reader submits its next
    /// jobs: jobs sent just after one that then blocks (a slow disk) would
    /// wait for it, however many runners could serve them.
    fn watch(self: &Arc<Self>) {
        if self.watching.swap(true, Ordering::SeqCst) {
            return;
        }
        let r = self.clone();
        self.runtime.spawn(async move {
            loop {
                tokio::time::sleep(WATCH_EVERY).await;
                r.start_if_stalled();
                if r.queued.load(Ordering::Relaxed) == 0 {
                    r.watching.store(false, Ordering::SeqCst);
                    // A submit that saw `watching` set before the store
                    // relies on this loop: look once more.
                    if r.queued.load(Ordering::Relaxed) == 0
                        || r.watching.swap(true, Ordering::SeqCst)
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
        self.spawn_runner();
    }

    /// Runs one job on its own blocking task, outside the queue and the
    /// timing (NBD's FLUSH, once it may run; a replica session's flush),
    /// and delivers its answer alone.
    pub fn run_alone(self: &Arc<Self>, job: W::Job) {
        let r = self.clone();
        self.runtime.spawn_blocking(move || {
            if let Some(done) = r.run(job) {
                r.work.deliver(vec![done]);
            }
        });
    }

    /// [`Work::run`], a panic taken as `None`.
    fn run(&self, job: W::Job) -> Option<W::Done> {
        catch_unwind(AssertUnwindSafe(|| self.work.run(job))).unwrap_or(None)
    }

    fn runner(self: Arc<Self>) {
        loop {
            let Some(mut jobs) = self.take() else { return };
            let mut batch = Vec::with_capacity(jobs.len());
            let mut started = Instant::now();
            while let Some(job) = jobs.pop_front() {
                let end = if self.work.timed(&job) {
                    let t = Instant::now();
                    batch.extend(self.run(job));
                    Some(self.record(t))
                } else {
                    batch.extend(self.run(job));
                    None
                };
                if end.is_some_and(|end| end - started > SPLIT_AFTER) {
                    if !batch.is_empty() {
                        self.work.deliver(std::mem::take(&mut batch));
                    }
                    self.share(&mut jobs);
                    started = Instant::now();
                }
            }
            if !batch.is_empty() {
                self.work.deliver(batch);
            }
        }
    }

    /// The next jobs for a runner, or `None` when it should end (it has
    /// then been counted out). An idle runner lingers for [`LINGER`] first:
    /// more work usually follows at once, and picking it up here is much
    /// cheaper than waking a new runner.
    fn take(&self) -> Option<VecDeque<W::Job>> {
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
    fn share(self: &Arc<Self>, jobs: &mut VecDeque<W::Job>) {
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
            self.spawn_runner();
        }
    }

    /// Accounts for a call that started at `start`; returns now.
    fn record(&self, start: Instant) -> Instant {
        let end = Instant::now();
        let slow = end - start > SLOW_CALL;
        self.last_slow.store(slow, Ordering::Relaxed);
        let sample = if slow { ONE / 16 } else { 0 };
        let old = self.slow_share.load(Ordering::Relaxed);
        self.slow_share
            .store(old - old / 16 + sample, Ordering::Relaxed);
        let progress = (end - self.clock).as_nanos().min(u128::from(u64::MAX)) as u64;
        self.progress_ns.store(progress, Ordering::Relaxed);
        end
    }
}

/// Gets a job's answer, once, from whichever thread completes it.
pub type Answer<D> = Box<dyn FnOnce(D) + Send>;

/// Runs `start`, which hands a job to a volume with an [`Answer`] for its
/// completion. An answer given before `start` returns (an inline volume) is
/// returned, to join the runner's batch as a plain call's would; one given
/// later (a volume that completes from its own thread or task) goes to
/// `later`, on the thread that gives it. An answer dropped unanswered is
/// neither: a caller that must always answer wraps it in a guard.
pub fn answer_inline<D, L>(start: impl FnOnce(Answer<D>), later: L) -> Option<D>
where
    D: Send + 'static,
    L: FnOnce(D) + Send + 'static,
{
    let slot = Arc::new(Mutex::new(Slot {
        answer: None,
        later: Some(later),
        returned: false,
    }));
    let s2 = slot.clone();
    start(Box::new(move |d| {
        let mut s = s2.lock().unwrap_or_else(|e| e.into_inner());
        if !s.returned {
            s.answer = Some(d);
            return;
        }
        let later = s.later.take();
        drop(s);
        if let Some(later) = later {
            later(d);
        }
    }));
    let mut s = slot.lock().unwrap_or_else(|e| e.into_inner());
    s.returned = true;
    s.answer.take()
}

/// A job's answer, and whether its runner has stopped waiting for it.
struct Slot<D, L> {
    answer: Option<D>,
    later: Option<L>,
    returned: bool,
}

#[cfg(test)]
mod tests;
