//! The run state machine of one schedule on one volume.
//!
//! ```text
//!            slot due                snapshot taken and recorded
//!  (idle) ───────────▶ taking ───────────────────────────────▶ done ──▶ (idle)
//!                        │  ▲ daemon killed: at start, taken again (idempotent)
//!                        │  └──────────────┐
//!                        ▼ error           │ backoff passed
//!                      failed ─────────────┘
//!                        │ retry window passed, or a newer slot is due
//!                        ▼
//!                      gave-up ──▶ (idle)
//! ```
//!
//! The caller records the [`Track`] (durably) *before* it acts on a step:
//! a slot is claimed (`taking`) before its snapshot is taken, so a crash
//! mid-run resumes that same slot and can never take a second snapshot for
//! it. A daemon that was down over several slots takes one snapshot, for
//! the latest of them.
//!
//! A clock set back (it ran ahead and was corrected) leaves a track whose
//! last slot, or start, is in the future. Compared with it, no slot would
//! be due until the clock caught up again, while the schedule announces
//! its next slot as usual. Such a track starts afresh from now instead
//! ([`Step::ClockSetBack`]): the next slot is taken, none before it, and a
//! slot taken while the clock ran ahead is found again by its label when
//! the clock reaches it, never taken twice.

use crate::Timing;
use serde::{Deserialize, Serialize};

/// Where one schedule stands on one volume. Persisted by the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Track {
    /// When the schedule started covering the volume: no slot before it
    /// is ever taken.
    pub since: i64,
    /// The slot last claimed, if any.
    pub slot: Option<i64>,
    pub state: TrackState,
    /// Attempts at `slot` so far.
    pub attempts: u32,
    /// When the last attempt at `slot` ended.
    pub last_attempt: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrackState {
    /// Nothing claimed yet.
    Idle,
    /// `slot` is claimed; its snapshot may or may not exist yet.
    Taking,
    /// `slot`'s snapshot exists.
    Done,
    /// The last attempt at `slot` failed; it will be retried.
    Failed,
    /// `slot` was abandoned (retry window passed, or a newer slot came).
    GaveUp,
}

impl Track {
    /// A volume the schedule covers from `now` on.
    pub fn new(now: i64) -> Track {
        Track {
            since: now,
            slot: None,
            state: TrackState::Idle,
            attempts: 0,
            last_attempt: None,
        }
    }

    /// Claim `slot`: what to record before taking its snapshot.
    pub fn claim(&self, slot: i64) -> Track {
        Track {
            slot: Some(slot),
            state: TrackState::Taking,
            attempts: if self.slot == Some(slot) {
                self.attempts + 1
            } else {
                1
            },
            ..self.clone()
        }
    }

    /// The claimed slot's snapshot exists.
    pub fn done(&self, now: i64) -> Track {
        Track {
            state: TrackState::Done,
            last_attempt: Some(now),
            ..self.clone()
        }
    }

    /// The claimed slot's attempt failed.
    pub fn failed(&self, now: i64) -> Track {
        Track {
            state: TrackState::Failed,
            last_attempt: Some(now),
            ..self.clone()
        }
    }

    /// The slot is abandoned.
    pub fn gave_up(&self, now: i64) -> Track {
        Track {
            state: TrackState::GaveUp,
            last_attempt: Some(now),
            ..self.clone()
        }
    }
}

/// How a failed run is retried: after `first_backoff` seconds, doubling up
/// to `max_backoff`, until `window` seconds after its slot (and never past
/// the next slot: a newer slot supersedes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    pub window: i64,
    pub first_backoff: i64,
    pub max_backoff: i64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            window: 600,
            first_backoff: 15,
            max_backoff: 120,
        }
    }
}

/// Why a slot was abandoned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUpWhy {
    /// Its retry window passed.
    WindowPassed,
    /// A newer slot is due.
    Superseded,
    /// The slot is in the future: the clock was set back since it was
    /// claimed.
    ClockSetBack,
}

/// What to do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing until `until` (None: the expression fires no more).
    Wait { until: Option<i64> },
    /// Claim `slot` ([`Track::claim`], recorded), then take its snapshot.
    /// `late` is how long after the slot this is; `skipped` says that
    /// earlier slots since the last claim were missed (this one catches up
    /// for all of them).
    Take { slot: i64, late: i64, skipped: bool },
    /// `slot` was claimed and its outcome never recorded (a crash): take
    /// it again, which finds the snapshot if it was made.
    Resume { slot: i64 },
    /// Retry the failed `slot` (claim it again first).
    Retry { slot: i64, attempt: u32 },
    /// Record `slot` as abandoned ([`Track::gave_up`]), then step again.
    GiveUp { slot: i64, why: GiveUpWhy },
    /// The track's last slot (`slot`) or its start is after `now`: the
    /// clock was set back. Record `Track::new(now)` (the schedule covers
    /// the volume afresh from now, so its next slot is taken), then step
    /// again.
    ClockSetBack { slot: Option<i64>, now: i64 },
}

/// The next step for `track` at `now`.
pub fn step(timing: &Timing, retry: &RetryPolicy, track: &Track, now: i64) -> Step {
    if track.slot.is_some_and(|s| s > now) || track.since > now {
        match (track.state, track.slot) {
            // A claimed slot is finished first, as after a crash: its
            // snapshot may exist.
            (TrackState::Taking, Some(slot)) => return Step::Resume { slot },
            // Its retry would wait for the clock to catch up.
            (TrackState::Failed, Some(slot)) => {
                return Step::GiveUp {
                    slot,
                    why: GiveUpWhy::ClockSetBack,
                }
            }
            _ => {
                return Step::ClockSetBack {
                    slot: track.slot,
                    now,
                }
            }
        }
    }
    let latest = timing
        .last_at_or_before(now)
        .filter(|&s| s >= track.since && Some(s) > track.slot);
    match (track.state, track.slot) {
        (TrackState::Taking, Some(slot)) => Step::Resume { slot },
        (TrackState::Failed, Some(slot)) => {
            if latest.is_some() {
                return Step::GiveUp {
                    slot,
                    why: GiveUpWhy::Superseded,
                };
            }
            if now >= slot.saturating_add(retry.window) {
                return Step::GiveUp {
                    slot,
                    why: GiveUpWhy::WindowPassed,
                };
            }
            let shift = track.attempts.saturating_sub(1).min(30);
            let backoff = retry
                .first_backoff
                .saturating_mul(1i64 << shift)
                .min(retry.max_backoff);
            let at = track.last_attempt.unwrap_or(slot).saturating_add(backoff);
            if now >= at {
                Step::Retry {
                    slot,
                    attempt: track.attempts + 1,
                }
            } else {
                Step::Wait {
                    until: Some(at.min(slot.saturating_add(retry.window))),
                }
            }
        }
        _ => match latest {
            Some(slot) => {
                let expected = match track.slot {
                    Some(last) => timing.next_after(last),
                    None => timing.next_after(track.since - 1),
                };
                Step::Take {
                    slot,
                    late: now - slot,
                    skipped: expected.is_some_and(|e| e < slot),
                }
            }
            None => Step::Wait {
                until: timing.next_after(now.max(track.since - 1)),
            },
        },
    }
}

#[cfg(test)]
#[path = "due_tests.rs"]
mod tests;
