//! The SnapshotSchedule resource (`lamina.io/v1alpha1`, namespaced): which
//! PVCs of its namespace (a label selector), when (cron in a time zone),
//! how long their VolumeSnapshots are kept, and, in its status, where it
//! stands on each PVC.

// Each printcolumn(...) repeats `type_ = ...`: clippy takes them for
// duplicated attributes of one item.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

fn utc() -> String {
    "UTC".into()
}

/// VolumeSnapshots of the PVCs it selects, on a cron expression, with
/// retention.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "lamina.io",
    version = "v1alpha1",
    kind = "SnapshotSchedule",
    namespaced,
    status = "SnapshotScheduleStatus",
    shortname = "lsched",
    category = "lamina",
    printcolumn(name = "Cron", type_ = "string", json_path = ".spec.cron"),
    printcolumn(name = "Keep", type_ = "integer", json_path = ".spec.keepLast"),
    printcolumn(name = "Next", type_ = "string", json_path = ".status.nextRun"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotScheduleSpec {
    /// Five fields: minute hour day-of-month month day-of-week.
    #[schemars(length(min = 1, max = 255))]
    pub cron: String,
    /// IANA time zone the expression is read in.
    #[serde(default = "utc")]
    pub time_zone: String,
    /// The PVCs of this namespace it snapshots (matchLabels; every term
    /// must hold).
    pub selector: LabelSelector,
    /// Keep the newest N VolumeSnapshots of each PVC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub keep_last: Option<u32>,
    /// Keep those younger than this (e.g. 7d, 12h). A VolumeSnapshot stays
    /// if either rule keeps it; at least one rule is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_for: Option<String>,
    /// The VolumeSnapshotClass of its VolumeSnapshots (the default class
    /// when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
    /// Labels its VolumeSnapshots carry.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub snapshot_labels: BTreeMap<String, String>,
    /// What happens to its VolumeSnapshots when it is deleted.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// How long after its slot a failed run is retried (seconds, default
    /// 600; never past the next slot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_window_seconds: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    /// They stay (no retention applies to them any more).
    #[default]
    Retain,
    /// They are deleted (those a PVC is being restored from stay).
    Delete,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotScheduleStatus {
    /// The next slot, RFC 3339 in the schedule's zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run: Option<String>,
    /// Where it stands on each PVC it covers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pvcs: Vec<PvcTrack>,
    /// One `Ready` condition: false with the reason when the spec cannot
    /// run (a bad cron expression, time zone or retention).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The run state of one PVC (the schedule crate's track) and its last run.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PvcTrack {
    pub name: String,
    /// The PVC's uid: a PVC deleted and made again starts afresh.
    pub uid: String,
    /// Unix seconds from which its slots count.
    pub since: i64,
    /// The slot last claimed (Unix seconds); claimed before its
    /// VolumeSnapshot is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<i64>,
    /// idle, taking, done, failed, gave-up.
    pub state: String,
    #[serde(default)]
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt: Option<i64>,
    /// The last run: taken, existed, failed, gave-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_outcome: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_snapshot: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// What retention deleted at the last run, and what it kept though
    /// past retention (with why).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deleted: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<String>,
}
