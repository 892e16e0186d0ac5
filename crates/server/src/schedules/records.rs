//! Schedules as the store keeps them (redb, beside the operation records):
//!
//! - `schedules`: id → [`ScheduleRec`] (JSON). Names are unique among
//!   schedules; the id never changes and is never reused (a counter in
//!   `meta`).
//! - `schedule_tracks`: `ID/VOLUME_ID` → [`lamina_schedule::Track`] (JSON):
//!   where the schedule stands on that volume. Keyed by the volume's pool
//!   id, which is never reused, so a volume deleted and made again under
//!   the same name starts a track of its own.
//! - `schedule_runs`: `ID/TIME/SEQ` → [`lamina_api::ScheduleRun`] (JSON),
//!   the last [`RUNS_KEPT`] per schedule.
//!
//! A claim is written (its own transaction, durable when it returns)
//! before the slot's snapshot is taken: that is what makes a crash mid-run
//! resume the slot rather than take it twice. docs/schedules.md has the
//! whole story.

use crate::error::{Failure, ServerError};
use crate::store::{OnFailure, Store};
use lamina_api as api;
use lamina_schedule::Track;
use redb::{ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

const SCHEDULES: TableDefinition<&str, &str> = TableDefinition::new("schedules");
const TRACKS: TableDefinition<&str, &str> = TableDefinition::new("schedule_tracks");
const RUNS: TableDefinition<&str, &str> = TableDefinition::new("schedule_runs");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const NEXT_ID: &str = "next_schedule_id";

/// Runs kept per schedule.
pub const RUNS_KEPT: usize = 200;

/// A schedule as stored.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ScheduleRec {
    pub id: String,
    pub spec: api::ScheduleSpec,
    /// Unix seconds.
    pub created: i64,
    /// Set while a delete with `snapshots=delete` removes its snapshots:
    /// it no longer runs, and a restart finishes the delete.
    #[serde(default)]
    pub deleting: bool,
}

/// The answer to a schedule name that names none.
pub fn no_such_schedule(name: &str) -> Failure {
    Failure::new(
        api::ErrorCode::NotFound,
        format!("no schedule {name:?}"),
        Some("list schedules with `lamina schedule list`"),
    )
}

fn track_key(id: &str, volume_id: u64) -> String {
    format!("{id}/{volume_id:020}")
}

impl Store {
    pub fn schedules(&self) -> Result<Vec<ScheduleRec>, ServerError> {
        let r = self.db.begin_read()?;
        let t = match r.open_table(SCHEDULES) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut out = Vec::new();
        for e in t.iter()? {
            let (k, v) = e?;
            let rec: ScheduleRec = serde_json::from_str(v.value()).map_err(ServerError::record(
                format!("schedule record {}", k.value()),
            ))?;
            out.push(rec);
        }
        out.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        Ok(out)
    }

    pub fn schedule_by_name(&self, name: &str) -> Result<Option<ScheduleRec>, ServerError> {
        Ok(self.schedules()?.into_iter().find(|s| s.spec.name == name))
    }

    /// The id of the schedule named `name`, unless it is being deleted;
    /// a not-found answer naming it otherwise.
    pub fn schedule_id(&self, name: &str) -> Result<String, Failure> {
        self.schedule_by_name(name)?
            .filter(|r| !r.deleting)
            .map(|r| r.id)
            .ok_or_else(|| no_such_schedule(name))
    }

    /// A new schedule's id.
    pub fn new_schedule_id(&self) -> Result<String, ServerError> {
        let w = self.db.begin_write()?;
        let n = {
            let mut m = w.open_table(META)?;
            let n = m.get(NEXT_ID)?.map(|v| v.value()).unwrap_or(1);
            m.insert(NEXT_ID, n + 1)?;
            n
        };
        w.commit()?;
        Ok(format!("sch-{n}"))
    }

    /// Write a schedule (its create or update): durable when it returns,
    /// and if the store fails on it, not there (or as it was) when the
    /// store reopens, since its caller answers an error.
    pub fn put_schedule(&self, rec: &ScheduleRec) -> Result<(), ServerError> {
        self.put_schedule_with_tracks(rec, &[])
    }

    /// [`Store::put_schedule`] and the tracks of volumes (by id) in the
    /// same transaction: a new schedule with the volumes it covers.
    pub fn put_schedule_with_tracks(
        &self,
        rec: &ScheduleRec,
        tracks: &[(u64, Track)],
    ) -> Result<(), ServerError> {
        let json = serde_json::to_string(rec)?;
        let mut rows = Vec::with_capacity(tracks.len());
        for (volume_id, t) in tracks {
            rows.push((track_key(&rec.id, *volume_id), serde_json::to_string(t)?));
        }
        let mut writes = vec![(SCHEDULES, rec.id.as_str(), Some(json.as_str()))];
        writes.extend(
            rows.iter()
                .map(|(k, v)| (TRACKS, k.as_str(), Some(v.as_str()))),
        );
        self.db
            .write(&writes, redb::Durability::Immediate, OnFailure::Undo)
    }

    /// Remove a schedule with its tracks and runs, in one transaction
    /// undone as a whole if the store fails on it. The caller holds the
    /// schedules' lock, so no run of it adds a key meanwhile.
    pub fn remove_schedule(&self, id: &str) -> Result<(), ServerError> {
        let prefix = format!("{id}/");
        let mut keys: Vec<(crate::store::StrTable, String)> = Vec::new();
        {
            let r = self.db.begin_read()?;
            for table in [TRACKS, RUNS] {
                let t = match r.open_table(table) {
                    Ok(t) => t,
                    Err(redb::TableError::TableDoesNotExist(_)) => continue,
                    Err(e) => return Err(e.into()),
                };
                for e in t.range(prefix.as_str()..)? {
                    let k = e?.0.value().to_string();
                    if !k.starts_with(&prefix) {
                        break;
                    }
                    keys.push((table, k));
                }
            }
        }
        let mut changes = vec![(SCHEDULES, id, None)];
        changes.extend(keys.iter().map(|(t, k)| (*t, k.as_str(), None)));
        self.db
            .write(&changes, redb::Durability::Immediate, OnFailure::Undo)
    }

    pub fn track(&self, id: &str, volume_id: u64) -> Result<Option<Track>, ServerError> {
        let r = self.db.begin_read()?;
        let t = match r.open_table(TRACKS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let key = track_key(id, volume_id);
        match t.get(key.as_str())? {
            None => Ok(None),
            Some(v) => Ok(Some(
                serde_json::from_str(v.value())
                    .map_err(ServerError::record(format!("schedule track {key}")))?,
            )),
        }
    }

    /// Drop a schedule's tracks of volumes that no longer exist (volume ids
    /// are never reused, so such a track could never be read again); how
    /// many went.
    pub fn forget_tracks_except(
        &self,
        id: &str,
        volumes: &std::collections::HashSet<u64>,
    ) -> Result<usize, ServerError> {
        let prefix = format!("{id}/");
        let w = self.db.begin_write()?;
        let gone = {
            let mut t = w.open_table(TRACKS)?;
            let keys: Vec<String> = t
                .range(prefix.as_str()..)?
                .map_while(|e| {
                    let k = e.ok()?.0.value().to_string();
                    k.starts_with(&prefix).then_some(k)
                })
                .filter(|k| {
                    k[prefix.len()..]
                        .parse::<u64>()
                        .is_ok_and(|v| !volumes.contains(&v))
                })
                .collect();
            for k in &keys {
                t.remove(k.as_str())?;
            }
            keys.len()
        };
        if gone == 0 {
            w.abort()?;
        } else {
            w.commit()?;
        }
        Ok(gone)
    }

    /// Record where a schedule stands on a volume: durable when it returns.
    pub fn put_track(&self, id: &str, volume_id: u64, track: &Track) -> Result<(), ServerError> {
        let json = serde_json::to_string(track)?;
        let key = track_key(id, volume_id);
        let w = self.db.begin_write()?;
        w.open_table(TRACKS)?.insert(key.as_str(), json.as_str())?;
        w.commit()?;
        Ok(())
    }

    /// Record a run, dropping the oldest beyond [`RUNS_KEPT`].
    pub fn add_run(&self, id: &str, run: &api::ScheduleRun) -> Result<(), ServerError> {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = format!("{id}/{}/{seq:020}", run.time);
        let json = serde_json::to_string(run)?;
        let prefix = format!("{id}/");
        let w = self.db.begin_write()?;
        {
            let mut t = w.open_table(RUNS)?;
            t.insert(key.as_str(), json.as_str())?;
            let keys: Vec<String> = t
                .range(prefix.as_str()..)?
                .map_while(|e| {
                    let k = e.ok()?.0.value().to_string();
                    k.starts_with(&prefix).then_some(k)
                })
                .collect();
            if keys.len() > RUNS_KEPT {
                for k in &keys[..keys.len() - RUNS_KEPT] {
                    t.remove(k.as_str())?;
                }
            }
        }
        w.commit()?;
        Ok(())
    }

    /// A schedule's runs, newest first.
    pub fn runs(&self, id: &str) -> Result<Vec<api::ScheduleRun>, ServerError> {
        let r = self.db.begin_read()?;
        let t = match r.open_table(RUNS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let prefix = format!("{id}/");
        let mut out = Vec::new();
        for e in t.range(prefix.as_str()..)? {
            let (k, v) = e?;
            if !k.value().starts_with(&prefix) {
                break;
            }
            out.push(
                serde_json::from_str(v.value())
                    .map_err(ServerError::record(format!("schedule run {}", k.value())))?,
            );
        }
        out.reverse();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use crate::store::Store;
    use lamina_schedule::Track;

    #[test]
    fn tracks_of_volumes_gone_are_forgotten_and_no_other() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(&d.path().join("store.redb")).unwrap();
        for (id, vid) in [("sch-1", 1), ("sch-1", 2), ("sch-1", 30), ("sch-10", 2)] {
            s.put_track(id, vid, &Track::new(100)).unwrap();
        }
        let live = [1u64, 30].into_iter().collect();
        assert_eq!(s.forget_tracks_except("sch-1", &live).unwrap(), 1);
        assert!(s.track("sch-1", 2).unwrap().is_none());
        assert!(s.track("sch-1", 1).unwrap().is_some());
        assert!(s.track("sch-1", 30).unwrap().is_some());
        // "sch-10/..." shares the prefix text "sch-1" but not "sch-1/".
        assert!(s.track("sch-10", 2).unwrap().is_some());
        assert_eq!(s.forget_tracks_except("sch-1", &live).unwrap(), 0);
    }

    #[test]
    fn a_new_schedule_and_its_volumes_tracks_are_written_together() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(&d.path().join("store.redb")).unwrap();
        let rec = super::ScheduleRec {
            id: "sch-1".into(),
            spec: serde_json::from_value(
                serde_json::json!({"name": "hourly", "cron": "0 * * * *", "volumes": ["a", "b"]}),
            )
            .unwrap(),
            created: 1_000,
            deleting: false,
        };
        s.put_schedule_with_tracks(&rec, &[(1, Track::new(1_000)), (2, Track::new(1_000))])
            .unwrap();
        assert_eq!(s.schedule_by_name("hourly").unwrap(), Some(rec));
        for v in [1, 2] {
            assert_eq!(s.track("sch-1", v).unwrap().map(|t| t.since), Some(1_000));
        }
        assert!(s.track("sch-1", 3).unwrap().is_none());
    }

    #[test]
    fn removing_a_schedule_removes_its_tracks_and_runs_and_no_other() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(&d.path().join("store.redb")).unwrap();
        let run = |slot: &str| lamina_api::ScheduleRun {
            time: slot.into(),
            slot: slot.into(),
            volume: "v".into(),
            outcome: lamina_api::RunOutcome::Taken,
            snapshot: Some("v-s".into()),
            error: None,
            catch_up: false,
            deleted: vec![],
            kept: vec![],
        };
        for id in ["sch-1", "sch-10"] {
            s.put_track(id, 1, &Track::new(100)).unwrap();
            s.put_track(id, 2, &Track::new(100)).unwrap();
            for t in ["2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"] {
                s.add_run(id, &run(t)).unwrap();
            }
        }
        s.remove_schedule("sch-1").unwrap();
        assert!(s.track("sch-1", 1).unwrap().is_none());
        assert!(s.track("sch-1", 2).unwrap().is_none());
        assert!(s.runs("sch-1").unwrap().is_empty());
        // "sch-10/..." shares the text "sch-1" but is another schedule's.
        assert!(s.track("sch-10", 1).unwrap().is_some());
        assert!(s.track("sch-10", 2).unwrap().is_some());
        assert_eq!(s.runs("sch-10").unwrap().len(), 2);
        // A schedule with nothing recorded yet goes too.
        s.remove_schedule("sch-2").unwrap();
    }
}
