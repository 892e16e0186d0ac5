//! Schedules in the daemon: records in the store (`records`), the loop that
//! takes their snapshots and applies their retention (`runner`), and their
//! API (`api`). When a slot is due and what retention removes are the
//! `lamina-schedule` crate's rules; this module schedules, records and
//! reports, and takes and deletes snapshots through the one operation path
//! (`operations::run`), like any client.

pub mod api;
mod records;
pub mod runner;

pub use records::ScheduleRec;

use lamina_schedule::{Clock, FileClock, SystemClock};
use std::sync::Arc;

/// Label a scheduled snapshot carries with its slot (Unix seconds): how a
/// run resumed after a crash finds the snapshot it may have taken, and the
/// time retention counts from.
pub const SLOT_LABEL: &str = "lamina.io/slot";

/// The labels a schedule puts on its snapshots are the schedule's: a
/// user's snapshot carrying them would fall under its retention.
pub(crate) fn refuse_schedule_labels(
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<(), crate::error::Failure> {
    for k in [lamina_api::SCHEDULE_LABEL, SLOT_LABEL] {
        if labels.contains_key(k) {
            return Err(crate::error::Failure::invalid(format!(
                "the label {k:?} is reserved for scheduled snapshots (lamina schedule create)"
            )));
        }
    }
    Ok(())
}

/// What the daemon's schedules share: the clock, the loop's wake-up, the
/// lock that serialises schedule changes, and the test-only crash points.
pub struct Runtime {
    pub clock: Arc<dyn Clock>,
    /// A test clock: the loop polls it instead of sleeping until the next
    /// slot.
    pub polling: bool,
    pub wake: tokio::sync::Notify,
    pub changes: tokio::sync::Mutex<()>,
    crash_at: Option<String>,
}

impl Runtime {
    pub fn new(testing: &crate::config::Testing) -> Runtime {
        let clock: Arc<dyn Clock> = match &testing.clock_file {
            Some(p) => Arc::new(FileClock::new(p.clone())),
            None => Arc::new(SystemClock),
        };
        Runtime {
            clock,
            polling: testing.clock_file.is_some(),
            wake: tokio::sync::Notify::new(),
            changes: tokio::sync::Mutex::new(()),
            crash_at: testing.crash_at.clone(),
        }
    }

    /// The point a test asked the daemon to die at (`--test-crash-at`).
    pub fn crash_at(&self) -> Option<&str> {
        self.crash_at.as_deref()
    }

    /// At a named point, die as kill -9 would (tests of crash recovery).
    pub fn crash_point(&self, name: &str) {
        if self.crash_at.as_deref() == Some(name) {
            eprintln!("lamina: crashing at {name}, as asked (--test-crash-at)");
            std::process::abort();
        }
    }
}

/// A slot as RFC 3339 (UTC).
pub fn rfc3339(secs: i64) -> String {
    match jiff::Timestamp::from_second(secs) {
        Ok(t) => t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        Err(_) => secs.to_string(),
    }
}

/// The snapshot a schedule takes for `slot`: `NAME-YYYYMMDD-HHMM` (UTC).
pub fn snapshot_name(schedule: &str, slot: i64) -> String {
    let stamp = match jiff::Timestamp::from_second(slot) {
        Ok(t) => t.strftime("%Y%m%d-%H%M").to_string(),
        Err(_) => slot.to_string(),
    };
    format!("{schedule}-{stamp}")
}
