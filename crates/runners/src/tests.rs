//! The policy with a scripted device: jobs that answer at once, block until
//! the test opens a gate, take a slow call's time, or panic. No test
//! orders events by sleeping; the waits are bounded safety nets.

use super::*;
use std::sync::Condvar;
use std::thread::ThreadId;

/// What a test job does when run.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Act {
    /// Answers at once.
    Fast,
    /// Answers once the gate is open.
    Gate,
    /// Waits (up to a bound) until `n` jobs are running at once.
    Together(usize),
    /// Panics.
    Panic,
    /// Answered without the device.
    Answered,
    /// Answered later, from another thread.
    Late,
    /// Takes longer than a slow call.
    Slow,
}

#[derive(Clone)]
struct Job {
    id: u64,
    act: Act,
}

/// One answer: the job, the thread that ran it, and for `Together` whether
/// it met the others.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Done {
    id: u64,
    thread: ThreadId,
    met: bool,
}

#[derive(Default)]
struct State {
    batches: Vec<Vec<Done>>,
    gate_open: bool,
    in_gate: usize,
    running: usize,
}

#[derive(Default)]
struct Script {
    state: Mutex<State>,
    changed: Condvar,
}

impl Script {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until `f` holds (60 s at most: a safety net, not a timing).
    fn wait(&self, what: &str, f: impl Fn(&State) -> bool) {
        let g = self.lock();
        let (g, t) = self
            .changed
            .wait_timeout_while(g, Duration::from_secs(60), |s| !f(s))
            .unwrap();
        assert!(
            !t.timed_out(),
            "never happened: {what}; answered {:?}",
            answered(&g)
        );
    }

    fn set(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.lock());
        self.changed.notify_all();
    }
}

fn answered(s: &State) -> Vec<u64> {
    s.batches.iter().flatten().map(|d| d.id).collect()
}

struct Test(Arc<Script>);

impl Work for Test {
    type Job = Job;
    type Done = Done;

    fn timed(&self, job: &Job) -> bool {
        job.act != Act::Answered
    }

    fn run(&self, job: Job) -> Option<Done> {
        let thread = std::thread::current().id();
        let mut met = false;
        match job.act {
            Act::Fast | Act::Answered => {}
            Act::Gate => {
                self.0.set(|s| s.in_gate += 1);
                self.0.wait("the gate opens", |s| s.gate_open);
            }
            Act::Together(n) => {
                self.0.set(|s| s.running += 1);
                let g = self.0.lock();
                let (g, _) = self
                    .0
                    .changed
                    .wait_timeout_while(g, Duration::from_secs(20), |s| s.running < n)
                    .unwrap();
                met = g.running >= n;
            }
            Act::Panic => panic!("a job that panics"),
            Act::Slow => std::thread::sleep(SLOW_CALL * 4),
            Act::Late => {
                let s = self.0.clone();
                return answer_inline(
                    |answer| {
                        std::thread::spawn(move || answer(job.id));
                    },
                    move |id| {
                        s.set(|st| {
                            st.batches.push(vec![Done {
                                id,
                                thread: std::thread::current().id(),
                                met: false,
                            }])
                        })
                    },
                )
                .map(|id| Done { id, thread, met });
            }
        }
        Some(Done {
            id: job.id,
            thread,
            met,
        })
    }

    fn deliver(&self, batch: Vec<Done>) {
        assert!(!batch.is_empty(), "an empty batch delivered");
        self.0.set(|s| s.batches.push(batch));
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap()
}

fn runners(rt: &tokio::runtime::Runtime) -> (Arc<Runners<Test>>, Arc<Script>) {
    let script = Arc::new(Script::default());
    let r = Runners::new(Test(script.clone()), rt.handle().clone(), 64);
    (Arc::new(r), script)
}

/// Submits `acts` at once, ids from `first`.
fn submit(r: &Arc<Runners<Test>>, first: u64, acts: &[Act]) {
    let mut jobs: VecDeque<Job> = acts
        .iter()
        .enumerate()
        .map(|(i, &act)| Job {
            id: first + i as u64,
            act,
        })
        .collect();
    r.submit(&mut jobs);
    assert!(jobs.is_empty(), "submit takes every job");
}

/// Fast calls, one at a time, until the policy has judged the device fast.
fn warm_up(r: &Arc<Runners<Test>>, s: &Script) {
    // Until the device looks fast and the last call was fast too: on a
    // busy machine one of them may be preempted past SLOW_CALL, and a lone
    // call after a slow one is handed back.
    let fast = || !r.slow() && !r.last_slow.load(Ordering::Relaxed);
    for i in 0..200 {
        submit(r, 1_000_000 + i, &[Act::Fast]);
        s.wait("the warm-up call is answered", |st| {
            answered(st).contains(&(1_000_000 + i))
        });
        if fast() {
            break;
        }
    }
    assert!(fast(), "fast calls never made the device look fast");
    s.set(|st| st.batches.clear());
}

#[test]
fn the_device_is_judged_slow_until_calls_prove_fast() {
    let rt = runtime();
    let (r, s) = runners(&rt);
    assert!(r.slow());
    warm_up(&r, &s);
    // Answers without the device do not count either way.
    let before = r.slow_share.load(Ordering::Relaxed);
    submit(&r, 0, &[Act::Answered; 8]);
    s.wait("the answered jobs", |st| answered(st).len() == 8);
    assert_eq!(r.slow_share.load(Ordering::Relaxed), before);
}

#[test]
fn a_fast_device_has_one_runner_serve_a_burst_in_order() {
    let rt = runtime();
    let (r, s) = runners(&rt);
    warm_up(&r, &s);
    // On a busy machine a runner preempted mid-burst shares its work out,
    // as it should: one burst in some tries is served whole.
    let mut whole = 0;
    for t in 0..20u64 {
        s.set(|st| st.batches.clear());
        let first = t * 100;
        submit(&r, first, &[Act::Fast; 32]);
        s.wait("the burst is answered", |st| answered(st).len() == 32);
        let st = s.lock();
        let mut ids = answered(&st);
        ids.sort();
        assert_eq!(ids, (first..first + 32).collect::<Vec<_>>(), "each once");
        if st.batches.len() == 1 {
            let b = &st.batches[0];
            assert!(b.iter().all(|d| d.thread == b[0].thread));
            let ids: Vec<u64> = b.iter().map(|d| d.id).collect();
            assert_eq!(ids, (first..first + 32).collect::<Vec<_>>(), "in order");
            whole += 1;
        }
    }
    assert!(whole > 0, "no burst was served by one runner in one batch");
}

#[test]
fn a_slow_device_runs_calls_concurrently() {
    let rt = runtime();
    let (r, s) = runners(&rt);
    // The start state: calls are presumed slow, one runner each.
    submit(&r, 0, &[Act::Together(4); 4]);
    s.wait("the four calls", |st| answered(st).len() == 4);
    let st = s.lock();
    assert!(
        st.batches.iter().flatten().all(|d| d.met),
        "the calls did not run at once: {:?}",
        st.batches
    );
}

#[test]
fn a_stuck_call_does_not_hold_up_later_calls() {
    let rt = runtime();
    let (r, s) = runners(&rt);
    warm_up(&r, &s);
    submit(&r, 1, &[Act::Gate]);
    s.wait("the call is stuck", |st| st.in_gate == 1);
    for i in 0..10 {
        submit(&r, 10 + i, &[Act::Fast]);
    }
    // All ten are answered while the first is still stuck: the watchdog
    // started another runner.
    s.wait("the ten later calls", |st| answered(st).len() == 10);
    assert!(!answered(&s.lock()).contains(&1));
    s.set(|st| st.gate_open = true);
    s.wait("the stuck call", |st| answered(st).contains(&1));
}

#[test]
fn the_watchdog_notices_a_stall_that_submit_did_not() {
    let rt = runtime();
    let (r, s) = runners(&rt);
    warm_up(&r, &s);
    submit(&r, 1, &[Act::Gate]);
    s.wait("the call is stuck", |st| st.in_gate == 1);
    // The runners of the warm-up linger a moment before they end.
    let until = Instant::now() + Duration::from_secs(60);
    while r.lock().runners > 1 {
        assert!(Instant::now() < until, "idle runners never ended");
        std::thread::yield_now();
    }
    // Calls that come while the runner still looks busy (it made progress
    // just now) are queued for it, and no further submit comes: only the
    // watchdog can see that the runner stalled.
    r.progress_ns.store(r.now_ns(), Ordering::Relaxed);
    submit(&r, 10, &[Act::Fast; 10]);
    s.wait("the ten later calls", |st| answered(st).len() == 10);
    assert!(!answered(&s.lock()).contains(&1));
    s.set(|st| st.gate_open = true);
    s.wait("the stuck call", |st| answered(st).contains(&1));
}

#[test]
fn a_panicking_call_does_not_stop_its_runner() {
    let rt = runtime();
    let (r, s) = runners(&rt);
    warm_up(&r, &s);
    submit(&r, 0, &[Act::Fast, Act::Panic, Act::Fast, Act::Fast]);
    s.wait("the calls that did not panic", |st| answered(st).len() == 3);
    let mut ids = answered(&s.lock());
    ids.sort();
    assert_eq!(ids, [0, 2, 3]);
    // The runners are counted right: later calls still run.
    for i in 0..100 {
        submit(&r, 10 + i, &[Act::Fast]);
    }
    s.wait("the later calls", |st| answered(st).len() == 103);
    // A panic in a call run alone is caught too.
    r.run_alone(Job {
        id: 500,
        act: Act::Panic,
    });
    r.run_alone(Job {
        id: 501,
        act: Act::Fast,
    });
    s.wait("the call run alone", |st| answered(st).contains(&501));
}

#[test]
fn a_call_run_alone_does_not_wait_for_the_runners() {
    let rt = runtime();
    let (r, s) = runners(&rt);
    warm_up(&r, &s);
    submit(&r, 1, &[Act::Gate]);
    s.wait("the call is stuck", |st| st.in_gate == 1);
    r.run_alone(Job {
        id: 2,
        act: Act::Fast,
    });
    s.wait("the call run alone", |st| answered(st) == [2]);
    s.set(|st| st.gate_open = true);
    s.wait("the stuck call", |st| answered(st).contains(&1));
}

#[test]
fn late_answers_go_their_own_way_and_inline_ones_join_the_batch() {
    let rt = runtime();
    let (r, s) = runners(&rt);
    warm_up(&r, &s);
    submit(&r, 0, &[Act::Late, Act::Fast, Act::Late, Act::Fast]);
    s.wait("every call", |st| answered(st).len() == 4);
    let mut ids = answered(&s.lock());
    ids.sort();
    assert_eq!(ids, [0, 1, 2, 3]);
}

#[test]
fn an_answer_given_before_start_returns_is_returned() {
    let later = Arc::new(Mutex::new(Vec::new()));
    let l2 = later.clone();
    let got = answer_inline(|a| a(7u32), move |d| l2.lock().unwrap().push(d));
    assert_eq!(got, Some(7));
    let (tx, rx) = std::sync::mpsc::channel();
    let got = answer_inline(
        |a| {
            std::thread::spawn(move || {
                a(8u32);
            });
        },
        move |d| tx.send(d).unwrap(),
    );
    // Either it came before `start` returned, or later.
    match got {
        Some(d) => assert_eq!(d, 8),
        None => assert_eq!(rx.recv_timeout(Duration::from_secs(60)).unwrap(), 8),
    }
    assert!(later.lock().unwrap().is_empty());
    // Dropped unanswered: neither.
    let (tx, rx) = std::sync::mpsc::channel::<u32>();
    assert_eq!(answer_inline(drop, move |d| tx.send(d).unwrap()), None);
    assert!(rx.recv().is_err(), "`later` dropped without being called");
}

/// Warms up until, with every runner ended, the device looks fast and the
/// last call was fast: a runner records its last call's time after it
/// delivers the answer [`warm_up`] waits for, so only once it has ended is
/// that verdict final.
fn idle_and_fast(r: &Arc<Runners<Test>>, s: &Script) {
    for _ in 0..50 {
        warm_up(r, s);
        runners_ended(r);
        if !r.slow() && !r.last_slow.load(Ordering::Relaxed) {
            return;
        }
    }
    panic!("the device never looked fast with every runner ended");
}

/// Waits until every runner has ended (idle ones linger a moment first).
fn runners_ended(r: &Arc<Runners<Test>>) {
    let until = Instant::now() + Duration::from_secs(60);
    while r.lock().runners > 0 {
        assert!(Instant::now() < until, "idle runners never ended");
        std::thread::yield_now();
    }
}

fn job(id: u64, act: Act) -> Job {
    Job { id, act }
}

#[test]
fn a_lone_call_on_an_idle_fast_device_runs_on_the_caller() {
    let rt = runtime();
    let (r, s) = runners(&rt);
    // Presumed slow at the start: handed back.
    assert!(r.run_here_if_idle(job(1, Act::Fast)).is_err());
    // Idle and fast when looked at, then asked: on a busy machine the
    // caller may be preempted in between long enough for the device to be
    // presumed slow again, and the call is handed back, having run
    // nowhere; asked again until it runs.
    let here_when_idle = |j: Job| {
        for _ in 0..50 {
            idle_and_fast(&r, &s);
            if let Ok(done) = r.run_here_if_idle(j.clone()) {
                return done.map(|d| (d.id, d.thread));
            }
        }
        panic!("call {} was handed back every time", j.id)
    };
    let here = std::thread::current().id();
    assert_eq!(here_when_idle(job(2, Act::Fast)), Some((2, here)));
    // Its answer is the caller's to deliver, not the work's.
    assert!(answered(&s.lock()).is_empty());
    // One answered later goes its own way (after fast calls again: the one
    // above may have been preempted past SLOW_CALL on a busy machine).
    assert_eq!(here_when_idle(job(3, Act::Late)), None);
    s.wait("the late answer", |st| answered(st) == [3]);
    assert_eq!(r.lock().runners, 0, "counted out once it ran");
}

#[test]
fn a_call_is_handed_back_while_runners_work_and_after_a_slow_call() {
    let rt = runtime();
    let (r, s) = runners(&rt);
    warm_up(&r, &s);
    // Well clear of the slow policy: one slow call below must not reach it.
    for i in 0..200 {
        if r.slow_share.load(Ordering::Relaxed) < ONE / 8 {
            break;
        }
        submit(&r, 1_000 + i, &[Act::Fast]);
        s.wait("the fast call", |st| answered(st).contains(&(1_000 + i)));
    }
    assert!(r.slow_share.load(Ordering::Relaxed) < ONE / 8);
    s.set(|st| st.batches.clear());
    submit(&r, 1, &[Act::Gate]);
    s.wait("the call is stuck", |st| st.in_gate == 1);
    assert!(
        r.run_here_if_idle(job(2, Act::Fast)).is_err(),
        "a runner works"
    );
    s.set(|st| st.gate_open = true);
    s.wait("the stuck call", |st| answered(st) == [1]);
    // The stuck call counts as slow if it was held past SLOW_CALL (how
    // long depends on the machine's load): fast calls after it, as the
    // runners run them, make the last call fast for what follows.
    idle_and_fast(&r, &s);
    // A slow call runs here once; the next is handed back, until a call
    // the runners run proves fast again.
    assert!(r.run_here_if_idle(job(3, Act::Slow)).is_ok());
    assert!(r.run_here_if_idle(job(4, Act::Fast)).is_err());
    idle_and_fast(&r, &s);
    assert!(r.run_here_if_idle(job(6, Act::Fast)).is_ok());
}

#[test]
fn calls_submitted_while_one_runs_on_the_caller_are_all_answered() {
    let rt = runtime();
    let (r, s) = runners(&rt);
    idle_and_fast(&r, &s);
    let r2 = r.clone();
    let inline = std::thread::spawn(move || r2.run_here_if_idle(job(1, Act::Gate)).is_ok());
    s.wait("the call runs on its caller", |st| st.in_gate == 1);
    submit(&r, 10, &[Act::Fast; 8]);
    s.set(|st| st.gate_open = true);
    assert!(inline.join().unwrap());
    s.wait("the eight calls", |st| answered(st).len() == 8);
}

#[test]
fn a_runtime_of_one_thread_never_runs_a_call_on_its_caller() {
    let rt = runtime();
    let (r, s) = runners(&rt);
    idle_and_fast(&r, &s);
    let one = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let r2 = r.clone();
    assert!(one.block_on(async move { r2.run_here_if_idle(job(1, Act::Fast)).is_err() }));
    assert!(r.run_here_if_idle(job(2, Act::Fast)).is_ok());
}
