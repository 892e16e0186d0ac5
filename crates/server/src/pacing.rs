//! Holding a transfer back while this node's volumes have I/O.
//!
//! The same pace holds back the rebuilds this node's front ends send to
//! returning replicas (`front/rebuild.rs`): one rate for all of them.
//!
//! A peer pulling a snapshot reads this node's pool as fast as the link and
//! the disk allow. Its threads already run at the lowest CPU priority
//! (`background.rs`), but CPU priority does not share the disk: on a
//! machine where the pool's disk is the bound, a full-speed stream takes
//! disk time from the volumes a user is waiting on (in the bench, a
//! cross-node copy left the source volume's 4 KiB writes at 0.68x).
//!
//! So the daemon counts its volumes' I/O ([`Activity`], bumped by every
//! read, write, trim, zeroing and flush an attached volume or snapshot
//! serves) and paces the transfer source by it ([`BusyPace`]): while any
//! I/O came in over the last [`WINDOW`], the source's streams together
//! send at most `rate` bytes a second; when the volumes are idle they go
//! at full speed again within one window. A transfer is never stopped, only
//! slowed: a clone still finishes under a constant load. The time streams
//! were held back is counted (`lamina_transfer_paced_seconds_total`).
//!
//! Only I/O during a transfer counts: a stream starting after a quiet spell
//! (no stream sent for two windows) starts at full speed, and is paced from
//! the first window in which I/O comes in.

use lamina_transfer::Pace;
use prometheus_client::metrics::counter::Counter;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the pace looks at the volumes' I/O, and so how long a stream
/// takes to slow down when I/O starts and to speed up when it stops.
pub const WINDOW: Duration = Duration::from_millis(100);

/// Client I/O served by this node's attached volumes and snapshots: a
/// count of operations, compared between two looks.
#[derive(Debug, Default)]
pub struct Activity {
    ops: AtomicU64,
}

impl Activity {
    /// One operation served (called on the data path: one relaxed add).
    pub fn bump(&self) {
        self.ops.fetch_add(1, Ordering::Relaxed);
    }

    pub fn ops(&self) -> u64 {
        self.ops.load(Ordering::Relaxed)
    }
}

/// A transfer's pace: unlimited while the volumes are idle, `rate` bytes a
/// second (shared by every stream) while they have I/O.
pub struct BusyPace {
    activity: Arc<Activity>,
    rate: u64,
    state: Mutex<PaceState>,
    /// Seconds of waits handed out.
    held: Counter<f64, AtomicU64>,
}

struct PaceState {
    /// The operation count at the last look, and when that was.
    seen: u64,
    looked: Instant,
    busy: bool,
    /// When the streams may send their next bytes (while idle: when they
    /// last asked).
    next: Instant,
}

impl BusyPace {
    /// `rate` in bytes a second, more than 0; the waits are added to `held`.
    pub fn new(activity: Arc<Activity>, rate: u64, held: Counter<f64, AtomicU64>) -> BusyPace {
        BusyPace::new_at(activity, rate, held, Instant::now())
    }

    fn new_at(
        activity: Arc<Activity>,
        rate: u64,
        held: Counter<f64, AtomicU64>,
        now: Instant,
    ) -> BusyPace {
        BusyPace {
            state: Mutex::new(PaceState {
                seen: activity.ops(),
                looked: now,
                busy: false,
                next: now,
            }),
            activity,
            rate: rate.max(1),
            held,
        }
    }

    /// [`Pace::wait`] at `now` (the tests' clock).
    fn wait_at(&self, bytes: u64, now: Instant) -> Duration {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if now.saturating_duration_since(s.next) >= 2 * WINDOW {
            // No stream sent for a while: I/O counted since the last look
            // came before this transfer. Start afresh, unpaced.
            s.seen = self.activity.ops();
            s.looked = now;
            s.busy = false;
        } else if now.saturating_duration_since(s.looked) >= WINDOW {
            let ops = self.activity.ops();
            s.busy = ops != s.seen;
            s.seen = ops;
            s.looked = now;
        }
        if !s.busy {
            s.next = now;
            return Duration::ZERO;
        }
        // No burst: each piece's bytes take their share of a second after
        // the one before, whichever stream sends them.
        let start = s.next.max(now);
        let nanos = u128::from(bytes) * 1_000_000_000 / u128::from(self.rate);
        s.next = start + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        let wait = start - now;
        self.held.inc_by(wait.as_secs_f64());
        wait
    }
}

impl Pace for BusyPace {
    fn wait(&self, bytes: u64) -> Duration {
        self.wait_at(bytes, Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn pace(rate: u64, t0: Instant) -> (Arc<Activity>, BusyPace, Counter<f64, AtomicU64>) {
        let a = Arc::new(Activity::default());
        let held = Counter::<f64, AtomicU64>::default();
        let p = BusyPace::new_at(a.clone(), rate, held.clone(), t0);
        (a, p, held)
    }

    #[test]
    fn idle_volumes_leave_the_stream_unpaced() {
        let t0 = Instant::now();
        let (_, p, held) = pace(10 * MIB, t0);
        for i in 0..100 {
            assert_eq!(p.wait_at(MIB, t0 + WINDOW * i), Duration::ZERO);
        }
        assert_eq!(held.get(), 0.0);
    }

    #[test]
    fn io_in_a_window_paces_the_next_one_and_idleness_lifts_it() {
        let t0 = Instant::now();
        let (a, p, held) = pace(10 * MIB, t0);
        p.wait_at(MIB, t0);
        a.bump();
        // Not looked yet: the window has not passed.
        assert_eq!(p.wait_at(MIB, t0 + WINDOW / 2), Duration::ZERO);
        // The next look sees I/O: pieces are spaced at 10 MiB/s.
        let t1 = t0 + WINDOW;
        assert_eq!(p.wait_at(MIB, t1), Duration::ZERO);
        assert_eq!(p.wait_at(MIB, t1), Duration::from_millis(100));
        assert_eq!(p.wait_at(MIB, t1), Duration::from_millis(200));
        // A zero range sends almost nothing, and waits its turn.
        assert_eq!(p.wait_at(0, t1), Duration::from_millis(300));
        assert!((held.get() - 0.6).abs() < 1e-9, "{}", held.get());
        // A window with no I/O: full speed again.
        let t2 = t1 + WINDOW;
        assert_eq!(p.wait_at(MIB, t2), Duration::ZERO);
        assert_eq!(p.wait_at(MIB, t2), Duration::ZERO);
    }

    #[test]
    fn streams_share_one_rate_and_slow_streams_stay_paced() {
        let t0 = Instant::now();
        let (a, p, _) = pace(4 * MIB, t0);
        a.bump();
        let t1 = t0 + WINDOW;
        // Two streams alternating: 4 MiB between them takes a second.
        let waits: Vec<_> = (0..4).map(|_| p.wait_at(MIB, t1)).collect();
        assert_eq!(waits[3], Duration::from_millis(750));
        // A stream back from its wait, with I/O still coming in: still
        // paced, though its last look is long past.
        a.bump();
        let t2 = t1 + Duration::from_millis(750);
        assert_eq!(p.wait_at(MIB, t2), Duration::from_millis(250));
        a.bump();
        let t3 = t2 + Duration::from_millis(300);
        assert_eq!(p.wait_at(MIB, t3), Duration::from_millis(200));
    }

    #[test]
    fn io_before_a_transfer_does_not_pace_it() {
        let t0 = Instant::now();
        let (a, p, held) = pace(MIB, t0);
        // A volume filled, then a pull a second later.
        for _ in 0..1000 {
            a.bump();
        }
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(p.wait_at(MIB, t1), Duration::ZERO);
        assert_eq!(p.wait_at(MIB, t1 + WINDOW), Duration::ZERO);
        // The same after a paced transfer ended and a quiet spell.
        a.bump();
        let t2 = t1 + 2 * WINDOW;
        assert_eq!(p.wait_at(MIB, t2), Duration::ZERO);
        assert_eq!(p.wait_at(MIB, t2), Duration::from_secs(1));
        a.bump();
        let t3 = t2 + Duration::from_secs(5);
        assert_eq!(p.wait_at(MIB, t3), Duration::ZERO);
        assert_eq!(p.wait_at(MIB, t3), Duration::ZERO);
        assert_eq!(held.get(), 1.0);
    }
}
