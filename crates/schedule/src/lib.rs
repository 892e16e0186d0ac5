//! When scheduled snapshots are due, and which of a schedule's snapshots its
//! retention removes. Pure rules, shared by the daemon (`lamina serve`) and
//! the Kubernetes controller, so that both keep the same promises: one
//! snapshot per slot, one catch-up after downtime however many slots were
//! missed, bounded retries, and retention that deletes only what the
//! schedule made and nothing anything depends on.
//!
//! It owns the cron and time-zone rules, the per-volume run state machine
//! and the retention plan. It must not do I/O, read the real clock except
//! through [`Clock`], or know how snapshots are stored: callers record the
//! [`Track`] it returns before acting on it, and tell it which snapshots are
//! pinned.

mod clock;
mod due;
mod retention;
mod timing;

pub use clock::{Clock, FileClock, ManualClock, SystemClock};
pub use due::{step, GiveUpWhy, RetryPolicy, Step, Track, TrackState};
pub use retention::{plan, Candidate, Kept, Plan, Retention};
pub use timing::Timing;

/// A schedule that cannot be used as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("cron expression {expr:?}: {reason} (five fields: minute hour day-of-month month day-of-week, e.g. \"0 * * * *\" for every hour)")]
    Cron { expr: String, reason: String },
    #[error("time zone {zone:?} is not an IANA time zone name (e.g. \"UTC\", \"Europe/Paris\")")]
    TimeZone { zone: String },
    #[error("cron expression {expr:?} never fires")]
    NeverFires { expr: String },
    #[error("retention keeps everything: give keep-last, keep-for, or both")]
    NoRetention,
    #[error("retention: {0}")]
    Retention(String),
}
