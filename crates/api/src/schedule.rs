//! Schedules: snapshots of a group of volumes on a cron expression, with
//! retention. The rules (when a slot is due, what retention removes) are in
//! crates/schedule; these are the shapes on the wire.

use crate::LabelSelector;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

fn utc() -> String {
    "UTC".into()
}

/// What a user asks of a schedule (`POST /v1/schedules`, and the body of
/// `PUT /v1/schedules/{name}`, where another `name` renames it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ScheduleSpec {
    /// 1 to 63 characters of the volume naming rule; snapshots are named
    /// `NAME-YYYYMMDD-HHMM` (the slot, UTC).
    pub name: String,
    /// Five fields: minute hour day-of-month month day-of-week.
    pub cron: String,
    /// IANA time zone the expression is read in.
    #[serde(default = "utc")]
    pub time_zone: String,
    /// Keep the newest N of the schedule's snapshots of each volume.
    #[serde(default)]
    pub keep_last: Option<u32>,
    /// Keep those younger than this many seconds. A snapshot stays when
    /// either rule keeps it; at least one rule is required.
    #[serde(default)]
    pub keep_for_seconds: Option<u64>,
    /// Labels every snapshot it makes carries (besides the schedule's id).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Volumes covered by name.
    #[serde(default)]
    pub volumes: Vec<String>,
    /// Volumes covered by their labels (in addition to `volumes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// How long after its slot a failed run is retried (default 600 s;
    /// never past the next slot).
    #[serde(default)]
    pub retry_window_seconds: Option<u64>,
}

/// A schedule as the daemon shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Schedule {
    /// Never reused, and kept across renames: its snapshots carry it in
    /// the label `lamina.io/schedule`.
    pub id: String,
    pub spec: ScheduleSpec,
    /// RFC 3339.
    pub created: String,
    /// The next slots, RFC 3339 in the schedule's time zone.
    pub next_runs: Vec<String>,
    /// Each volume it covers now, and where it stands there.
    pub volumes: Vec<ScheduleVolume>,
    /// The latest runs, newest first (at most 50 shown; 200 kept).
    pub runs: Vec<ScheduleRun>,
}

/// Where a schedule stands on one volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ScheduleVolume {
    pub volume: String,
    /// idle, taking, done, failed (will retry), gave-up.
    pub state: String,
    /// The slot last claimed, RFC 3339.
    pub last_slot: Option<String>,
    /// How many of the schedule's snapshots the volume has.
    pub snapshots: u64,
    pub last_run: Option<ScheduleRun>,
}

/// What one run did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RunOutcome {
    /// The snapshot was taken.
    Taken,
    /// The slot's snapshot existed already (a run resumed after a crash).
    Existed,
    /// The attempt failed; it is retried within the window.
    Failed,
    /// Not taken: the pool is past its high-water mark (retried within
    /// the window).
    Paused,
    /// The slot was abandoned: its retry window passed, or a newer slot
    /// came.
    GaveUp,
}

/// A snapshot retention would have deleted but kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KeptSnapshot {
    pub snapshot: String,
    pub reason: String,
}

/// One run of a schedule on one volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ScheduleRun {
    /// When it ran, RFC 3339.
    pub time: String,
    /// The slot it was for, RFC 3339.
    pub slot: String,
    pub volume: String,
    pub outcome: RunOutcome,
    /// The snapshot's name (for taken, existed, and failed attempts).
    pub snapshot: Option<String>,
    /// Why it failed, paused or gave up.
    pub error: Option<String>,
    /// Earlier slots since the last run were missed (the daemon was down):
    /// this run is their one catch-up.
    #[serde(default)]
    pub catch_up: bool,
    /// What retention deleted after it.
    #[serde(default)]
    pub deleted: Vec<String>,
    /// What retention would have deleted but kept, with why.
    #[serde(default)]
    pub kept: Vec<KeptSnapshot>,
}

/// What to do with a deleted schedule's snapshots
/// (`DELETE /v1/schedules/{name}?snapshots=keep|delete`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotsAction {
    /// They stay, as manual snapshots (no retention applies to them).
    Keep,
    /// They are deleted (those pinned stay and are listed).
    Delete,
}

#[derive(
    Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema, utoipa::IntoParams,
)]
#[into_params(parameter_in = Query)]
pub struct DeleteScheduleQuery {
    /// Required: `keep` or `delete` its snapshots.
    pub snapshots: Option<SnapshotsAction>,
}

/// The answer to deleting a schedule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ScheduleDeleted {
    pub existed: bool,
    /// Its snapshots deleted (`VOLUME/SNAPSHOT`).
    pub deleted: Vec<String>,
    /// Its snapshots left in place: all of them with `keep`; with
    /// `delete`, those that could not go, with why.
    pub kept: Vec<KeptSnapshot>,
}
