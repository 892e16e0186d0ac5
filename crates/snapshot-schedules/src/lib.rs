//! SnapshotSchedule: recurring VolumeSnapshots of the PVCs a label
//! selector picks in the schedule's namespace, with retention, so that users
//! restore them with `dataSource` as usual. The rules (which slot is due,
//! one catch-up, bounded retries, what retention removes) are the
//! `lamina-schedule` crate's, the same the daemon's schedules follow.
//!
//! It owns the SnapshotSchedule resource and the loop that runs it. It
//! touches only SnapshotSchedules (their status and its finalizer), reads
//! PVCs, and creates, lists and deletes the VolumeSnapshots it made (found
//! by the label carrying the schedule's uid, never by name). It must not
//! touch the daemons or any VolumeSnapshot it did not make: taking the
//! snapshot is the snapshot-controller's and the CSI driver's business.

pub mod crd;
mod error;
mod run;
mod track;

pub use crd::{DeletionPolicy, SnapshotSchedule, SnapshotScheduleSpec, SnapshotScheduleStatus};
pub use error::Error;
pub use run::{run, Options};

/// Label on every VolumeSnapshot a schedule made: the schedule's uid.
pub const SCHEDULE_UID_LABEL: &str = "lamina.io/schedule-uid";
/// Label on every VolumeSnapshot a schedule made: its slot (Unix seconds).
pub const SLOT_LABEL: &str = "lamina.io/slot";
/// Label on every VolumeSnapshot a schedule made: its PVC's uid.
pub const PVC_UID_LABEL: &str = "lamina.io/pvc-uid";
/// The finalizer by which a deleted schedule's deletion policy is applied.
pub const FINALIZER: &str = "lamina.io/snapshot-schedule";
