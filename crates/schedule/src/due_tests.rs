use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

const H: i64 = 3600;
const T0: i64 = 1_795_000_000 - 1_795_000_000 % H; // a whole hour

fn hourly() -> Timing {
    Timing::parse("0 * * * *", "UTC").unwrap()
}

#[test]
fn waits_for_the_first_slot_after_it_started_covering_the_volume() {
    let t = hourly();
    let track = Track::new(T0 + 600);
    let r = RetryPolicy::default();
    assert_eq!(
        step(&t, &r, &track, T0 + 700),
        Step::Wait {
            until: Some(T0 + H)
        }
    );
    assert_eq!(
        step(&t, &r, &track, T0 + H + 5),
        Step::Take {
            slot: T0 + H,
            late: 5,
            skipped: false
        }
    );
}

#[test]
fn a_slot_at_the_start_instant_counts() {
    let t = hourly();
    let track = Track::new(T0);
    let s = step(&t, &RetryPolicy::default(), &track, T0);
    assert_eq!(
        s,
        Step::Take {
            slot: T0,
            late: 0,
            skipped: false
        }
    );
}

#[test]
fn downtime_over_many_slots_takes_one_catch_up() {
    let t = hourly();
    let r = RetryPolicy::default();
    let track = Track::new(T0).claim(T0).done(T0 + 1);
    // Down from T0+1 to T0+5h30: slots T0+1h..T0+5h were missed.
    let now = T0 + 5 * H + 1800;
    let s = step(&t, &r, &track, now);
    assert_eq!(
        s,
        Step::Take {
            slot: T0 + 5 * H,
            late: 1800,
            skipped: true
        }
    );
    let track = track.claim(T0 + 5 * H).done(now);
    assert_eq!(
        step(&t, &r, &track, now),
        Step::Wait {
            until: Some(T0 + 6 * H)
        }
    );
}

#[test]
fn a_claimed_slot_is_resumed_never_claimed_again() {
    let t = hourly();
    let r = RetryPolicy::default();
    let track = Track::new(T0).claim(T0 + H);
    // Killed after the claim; restarted hours later: the same slot first.
    assert_eq!(
        step(&t, &r, &track, T0 + 4 * H),
        Step::Resume { slot: T0 + H }
    );
    let track = track.done(T0 + 4 * H);
    assert_eq!(
        step(&t, &r, &track, T0 + 4 * H),
        Step::Take {
            slot: T0 + 4 * H,
            late: 0,
            skipped: true
        }
    );
}

#[test]
fn failures_back_off_then_give_up_at_the_window_or_the_next_slot() {
    let t = hourly();
    let r = RetryPolicy {
        window: 600,
        first_backoff: 15,
        max_backoff: 120,
    };
    let track = Track::new(T0).claim(T0 + H).failed(T0 + H);
    assert_eq!(
        step(&t, &r, &track, T0 + H + 10),
        Step::Wait {
            until: Some(T0 + H + 15)
        }
    );
    assert_eq!(
        step(&t, &r, &track, T0 + H + 15),
        Step::Retry {
            slot: T0 + H,
            attempt: 2
        }
    );
    let track = track.claim(T0 + H).failed(T0 + H + 15);
    assert_eq!(track.attempts, 2);
    assert_eq!(
        step(&t, &r, &track, T0 + H + 30),
        Step::Wait {
            until: Some(T0 + H + 45)
        }
    );
    assert_eq!(
        step(&t, &r, &track, T0 + H + 600),
        Step::GiveUp {
            slot: T0 + H,
            why: GiveUpWhy::WindowPassed
        }
    );
    // A long window still yields to the next slot.
    let r = RetryPolicy { window: 3 * H, ..r };
    assert_eq!(
        step(&t, &r, &track, T0 + 2 * H),
        Step::GiveUp {
            slot: T0 + H,
            why: GiveUpWhy::Superseded
        }
    );
    let track = track.gave_up(T0 + 2 * H);
    assert_eq!(
        step(&t, &r, &track, T0 + 2 * H),
        Step::Take {
            slot: T0 + 2 * H,
            late: 0,
            skipped: false
        }
    );
}

#[test]
fn a_clock_set_back_resumes_at_the_next_slot() {
    let t = Timing::parse("* * * * *", "UTC").unwrap();
    let r = RetryPolicy::default();
    let m = 60;
    // The clock ran an hour ahead: the slot of T0+1h was taken.
    let track = Track::new(T0).claim(T0 + H).done(T0 + H + 1);
    // Corrected to T0+5m30s: what to do is to start afresh from now, so
    // the wait is for the next minute, as `schedule get` announces.
    let now = T0 + 5 * m + 30;
    assert_eq!(
        step(&t, &r, &track, now),
        Step::ClockSetBack {
            slot: Some(T0 + H),
            now
        }
    );
    let track = Track::new(now);
    assert_eq!(
        step(&t, &r, &track, now),
        Step::Wait {
            until: Some(T0 + 6 * m)
        }
    );
    assert_eq!(t.next_after(now), Some(T0 + 6 * m));
    // The next slot is taken on time, alone (no catch-up for the minutes
    // before the correction).
    assert_eq!(
        step(&t, &r, &track, T0 + 6 * m + 2),
        Step::Take {
            slot: T0 + 6 * m,
            late: 2,
            skipped: false
        }
    );
    // A failed slot in the future is given up, not retried in an hour.
    let failed = Track::new(T0).claim(T0 + H).failed(T0 + H + 1);
    assert_eq!(
        step(&t, &r, &failed, now),
        Step::GiveUp {
            slot: T0 + H,
            why: GiveUpWhy::ClockSetBack
        }
    );
    // A claim in the future is finished first (its snapshot may exist).
    let taking = Track::new(T0).claim(T0 + H);
    assert_eq!(step(&t, &r, &taking, now), Step::Resume { slot: T0 + H });
    // A volume first covered while the clock ran ahead starts from now.
    let early = Track::new(T0 + H);
    assert_eq!(
        step(&t, &r, &early, now),
        Step::ClockSetBack { slot: None, now }
    );
}

/// One moment of a simulated daemon's life.
#[derive(Debug, Clone)]
struct Event {
    advance: i64,
    down: bool,
    fail: bool,
    /// 0: no crash; 1: killed after the claim; 2: after the snapshot,
    /// before its outcome is recorded.
    crash: u8,
}

fn events() -> impl Strategy<Value = Vec<Event>> {
    prop::collection::vec(
        (
            0i64..3 * H,
            prop::bool::weighted(0.2),
            prop::bool::weighted(0.2),
            0u8..6,
        )
            .prop_map(|(advance, down, fail, crash)| Event {
                advance,
                down,
                fail,
                crash: crash.min(3) % 3,
            }),
        1..60,
    )
}

proptest! {
    /// A daemon that runs, fails, crashes and stays down at random: each
    /// slot gets at most one snapshot (snapshots are made idempotently by
    /// slot, as the daemon names them), claims only move forward, no slot
    /// before the start or in the future is taken, and after every period
    /// up the latest slot is taken unless its attempts failed.
    #[test]
    fn one_snapshot_per_slot_and_one_catch_up(evs in events()) {
        let t = hourly();
        let r = RetryPolicy::default();
        let start = T0 + 17;
        let mut now = start;
        let mut track = Track::new(start); // the durable record
        let mut snaps: BTreeMap<i64, u32> = BTreeMap::new(); // slot -> snapshots made
        let mut claims: Vec<i64> = Vec::new();
        for ev in evs {
            now += ev.advance;
            if ev.down {
                continue;
            }
            // Up: step until there is nothing to do now (bounded).
            let mut crashed = false;
            for _ in 0..10 {
                match step(&t, &r, &track, now) {
                    Step::Wait { .. } => break,
                    Step::ClockSetBack { .. } => {
                        prop_assert!(false, "the clock only moves forward here: {:?}", track);
                    }
                    Step::GiveUp { slot, .. } => {
                        prop_assert_eq!(track.slot, Some(slot));
                        track = track.gave_up(now);
                    }
                    Step::Take { slot, .. } | Step::Retry { slot, .. } | Step::Resume { slot } => {
                        prop_assert!(slot >= start && slot <= now);
                        // A slot that is done or abandoned is never taken
                        // again (retention may have deleted its snapshot).
                        prop_assert!(
                            !(track.slot == Some(slot)
                                && matches!(track.state, TrackState::Done | TrackState::GaveUp)),
                            "slot {} taken again: {:?}", slot, track
                        );
                        if track.slot != Some(slot) {
                            if let Some(&last) = claims.last() {
                                prop_assert!(slot > last, "claims go forward");
                            }
                            claims.push(slot);
                        }
                        track = track.claim(slot);
                        if ev.crash == 1 { crashed = true; break; }
                        if ev.fail {
                            track = track.failed(now);
                            break;
                        }
                        // Idempotent by slot: an existing snapshot is found, not made twice.
                        snaps.entry(slot).or_insert(1);
                        if ev.crash == 2 { crashed = true; break; }
                        track = track.done(now);
                    }
                }
            }
            if crashed {
                continue;
            }
            // Nothing failed in this period: the latest slot is taken.
            if !ev.fail {
                if let Some(latest) = t.last_at_or_before(now).filter(|&s| s >= start) {
                    prop_assert!(track.slot >= Some(latest) || track.state == TrackState::Failed,
                        "latest slot {} not taken: {:?}", latest, track);
                }
            }
        }
        prop_assert!(snaps.values().all(|&n| n == 1));
        // Catch-up: between two consecutive claims, however many slots
        // passed, nothing else was claimed (claims are strictly increasing
        // and each is a real slot).
        for c in &claims {
            prop_assert_eq!(t.last_at_or_before(*c), Some(*c));
        }
    }
}

proptest! {
    /// The clock jumps forward and back at random while the daemon runs:
    /// whenever nothing has failed, the schedule waits for exactly the
    /// next slot (what `schedule get` announces), never takes a slot in
    /// the future, and takes at most one new slot per moment (no burst of
    /// catch-ups after a correction).
    #[test]
    fn a_clock_moved_back_never_stalls_the_schedule(
        moves in prop::collection::vec((-3 * H..3 * H, prop::bool::weighted(0.15)), 1..80)
    ) {
        let t = Timing::parse("*/5 * * * *", "UTC").unwrap();
        let r = RetryPolicy::default();
        let mut now = T0 + 17;
        let mut track = Track::new(now);
        let mut snaps: BTreeMap<i64, u32> = BTreeMap::new();
        for (delta, fail) in moves {
            now += delta;
            let mut new_slots = Vec::new();
            let mut waited = None;
            for _ in 0..10 {
                match step(&t, &r, &track, now) {
                    Step::Wait { until } => { waited = Some(until); break; }
                    Step::GiveUp { .. } => track = track.gave_up(now),
                    Step::ClockSetBack { now: at, .. } => {
                        prop_assert_eq!(at, now);
                        track = Track::new(now);
                    }
                    Step::Take { slot, .. } | Step::Retry { slot, .. } | Step::Resume { slot } => {
                        if track.slot != Some(slot) {
                            prop_assert!(slot <= now, "slot {} taken at {}", slot, now);
                            new_slots.push(slot);
                        }
                        track = track.claim(slot);
                        if fail {
                            track = track.failed(now);
                            continue;
                        }
                        snaps.entry(slot).or_insert(1);
                        track = track.done(now);
                    }
                }
            }
            prop_assert!(new_slots.len() <= 1, "a burst at {}: {:?}", now, new_slots);
            if track.state != TrackState::Failed {
                prop_assert_eq!(waited, Some(t.next_after(now)),
                    "at {} after {:?}", now, track);
            }
        }
        prop_assert!(snaps.values().all(|&n| n == 1));
    }
}
