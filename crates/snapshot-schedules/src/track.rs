//! A PVC's entry in the schedule's status, to and from the schedule
//! crate's track.

use crate::crd::PvcTrack;
use lamina_schedule::{Track, TrackState};

pub fn state_name(s: TrackState) -> &'static str {
    match s {
        TrackState::Idle => "idle",
        TrackState::Taking => "taking",
        TrackState::Done => "done",
        TrackState::Failed => "failed",
        TrackState::GaveUp => "gave-up",
    }
}

fn state_of(s: &str) -> TrackState {
    match s {
        "taking" => TrackState::Taking,
        "done" => TrackState::Done,
        "failed" => TrackState::Failed,
        "gave-up" => TrackState::GaveUp,
        _ => TrackState::Idle,
    }
}

pub fn to_track(p: &PvcTrack) -> Track {
    Track {
        since: p.since,
        slot: p.slot,
        state: state_of(&p.state),
        attempts: p.attempts,
        last_attempt: p.last_attempt,
    }
}

/// `t` written into `p`, keeping its last run.
pub fn store(p: &mut PvcTrack, t: &Track) {
    p.since = t.since;
    p.slot = t.slot;
    p.state = state_name(t.state).into();
    p.attempts = t.attempts;
    p.last_attempt = t.last_attempt;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_goes_there_and_back() {
        for s in [
            TrackState::Idle,
            TrackState::Taking,
            TrackState::Done,
            TrackState::Failed,
            TrackState::GaveUp,
        ] {
            let t = Track {
                since: 5,
                slot: Some(60),
                state: s,
                attempts: 2,
                last_attempt: Some(70),
            };
            let mut p = PvcTrack::default();
            store(&mut p, &t);
            assert_eq!(to_track(&p), t);
        }
    }
}
