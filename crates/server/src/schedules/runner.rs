//! The loop that runs schedules: at each pass, for every schedule and every
//! volume it covers, ask the schedule crate what to do ([`step`]), record
//! it, do it through the operation path, and record the outcome. After a
//! snapshot is taken, the schedule's retention runs on that volume.
//!
//! The pass sleeps until the earliest next slot or retry (at most 60 s, so
//! volumes that start matching a selector are picked up), or until a
//! schedule changes. With a test clock it polls every 50 ms instead.

use super::{rfc3339, snapshot_name, ScheduleRec, SLOT_LABEL};
use crate::error::Failure;
use crate::operations::{self, Outcome};
use crate::state::{blocking, snapshot_export, State};
use crate::store::Op;
use lamina_api as api;
use lamina_engine::{SnapshotInfo, VolumeInfo};
use lamina_schedule::{
    plan, step, Candidate, GiveUpWhy, Retention, RetryPolicy, Step, Timing, Track,
};
use std::sync::Arc;
use std::time::Duration;

/// Run schedules until `stop` resolves.
pub async fn run(st: Arc<State>, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    loop {
        let rt = &st.schedules;
        let next = match pass(&st).await {
            Ok(n) => n,
            Err(f) => {
                tracing::warn!(error = %f.1, "a schedule pass failed; trying again shortly");
                None
            }
        };
        let wait = if rt.polling {
            Duration::from_millis(50)
        } else {
            let now = rt.clock.now();
            let secs = next.map_or(60, |t| (t - now).clamp(1, 60));
            Duration::from_secs(secs as u64)
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = rt.wake.notified() => {}
            _ = &mut stop => break,
        }
        if st.is_stopping() {
            break;
        }
    }
}

/// Whether `spec` covers volume `v`.
pub fn covers(spec: &api::ScheduleSpec, v: &VolumeInfo) -> bool {
    spec.volumes.contains(&v.name)
        || spec
            .selector
            .as_ref()
            .is_some_and(|s| !s.is_empty() && s.matches(&volume_labels(v)))
}

fn volume_labels(v: &VolumeInfo) -> std::collections::BTreeMap<String, String> {
    v.labels.iter().cloned().collect()
}

pub fn timing(spec: &api::ScheduleSpec) -> Result<Timing, Failure> {
    Timing::parse(&spec.cron, &spec.time_zone).map_err(|e| Failure::invalid(e.to_string()))
}

pub fn retention(spec: &api::ScheduleSpec) -> Retention {
    Retention {
        keep_last: spec.keep_last,
        keep_for: spec.keep_for_seconds,
    }
}

fn retry(spec: &api::ScheduleSpec) -> RetryPolicy {
    RetryPolicy {
        window: spec
            .retry_window_seconds
            .map_or(RetryPolicy::default().window, |s| {
                s.min(i64::MAX as u64) as i64
            }),
        ..RetryPolicy::default()
    }
}

/// One pass over every schedule; the earliest time something is due next.
async fn pass(st: &Arc<State>) -> Result<Option<i64>, Failure> {
    let s = st.clone();
    let (schedules, volumes) =
        blocking(move || Ok((s.store.schedules()?, s.pool.list_volumes()))).await?;
    let volume_ids: std::collections::HashSet<u64> = volumes.iter().map(|v| v.id).collect();
    let mut next: Option<i64> = None;
    // Whether the pool is past its high-water mark: read once a pass, when
    // a snapshot is first due.
    let mut space: Option<Option<String>> = None;
    for rec in schedules.iter().filter(|r| !r.deleting) {
        // Schedule changes wait for this schedule's turn to end, and the
        // turn runs on the record as it is now: a schedule deleted or
        // changed since the list above is seen as it is.
        let _turn = st.schedules.changes.lock().await;
        let (s, name, ids) = (st.clone(), rec.spec.name.clone(), volume_ids.clone());
        let current = blocking(move || {
            let rec = s.store.schedule_by_name(&name)?;
            if let Some(r) = &rec {
                s.store.forget_tracks_except(&r.id, &ids)?;
            }
            Ok(rec)
        })
        .await?;
        let Some(rec) = current.filter(|r| r.id == rec.id && !r.deleting) else {
            continue;
        };
        let rec = &rec;
        let timing = match timing(&rec.spec) {
            Ok(t) => t,
            Err(f) => {
                tracing::warn!(schedule = %rec.spec.name, error = %f.1, "schedule cannot run");
                continue;
            }
        };
        for v in volumes.iter().filter(|v| covers(&rec.spec, v)) {
            if st.is_stopping() {
                return Ok(None);
            }
            let span = tracing::info_span!("schedule", schedule = %rec.spec.name, id = %rec.id, volume = %v.name);
            let until =
                tracing::Instrument::instrument(run_volume(st, rec, &timing, v, &mut space), span)
                    .await?;
            next = match (next, until) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
    }
    Ok(next)
}

/// Step one schedule on one volume until it has to wait.
async fn run_volume(
    st: &Arc<State>,
    rec: &ScheduleRec,
    timing: &Timing,
    v: &VolumeInfo,
    space: &mut Option<Option<String>>,
) -> Result<Option<i64>, Failure> {
    let rt = &st.schedules;
    let policy = retry(&rec.spec);
    let (s, id, vid, now) = (st.clone(), rec.id.clone(), v.id, rt.clock.now());
    let mut track = blocking(move || match s.store.track(&id, vid)? {
        Some(t) => Ok(t),
        None => {
            let t = Track::new(now);
            s.store.put_track(&id, vid, &t)?;
            Ok(t)
        }
    })
    .await?;
    // Bounded: a give-up is followed by at most one take, a take by a wait.
    for _ in 0..8 {
        let now = rt.clock.now();
        match step(timing, &policy, &track, now) {
            Step::Wait { until } => return Ok(until),
            Step::ClockSetBack { slot, now } => {
                tracing::warn!(
                    last_slot = ?slot.map(rfc3339),
                    now = %rfc3339(now),
                    "the clock was set back to before this schedule's last run: it resumes at its next slot"
                );
                track = Track::new(now);
                put_track(st, rec, v, &track).await?;
            }
            Step::GiveUp { slot, why } => {
                let why = match why {
                    GiveUpWhy::WindowPassed => "its retry window passed",
                    GiveUpWhy::Superseded => "a newer slot is due",
                    GiveUpWhy::ClockSetBack => {
                        "the clock was set back to before it: the schedule resumes at its next slot"
                    }
                };
                tracing::warn!(slot = %rfc3339(slot), "gave up on a slot: {why}");
                record(
                    st,
                    rec,
                    run_rec(
                        now,
                        slot,
                        v,
                        api::RunOutcome::GaveUp,
                        None,
                        Some(why.into()),
                    ),
                )
                .await?;
                track = track.gave_up(now);
                put_track(st, rec, v, &track).await?;
            }
            Step::Take { slot, .. } | Step::Retry { slot, .. }
                if paused(st, space).await?.is_some() =>
            {
                // Not taken: a full disk would fail every write of every
                // volume. Retried within the window, like a failure.
                let why = paused(st, space).await?.unwrap_or_default();
                tracing::warn!(slot = %rfc3339(slot), "scheduled snapshot paused: {why}");
                let claimed = track.claim(slot);
                record(
                    st,
                    rec,
                    run_rec(now, slot, v, api::RunOutcome::Paused, None, Some(why)),
                )
                .await?;
                track = claimed.failed(now);
                put_track(st, rec, v, &track).await?;
            }
            Step::Take { slot, skipped, .. } => {
                track = take(st, rec, v, track, slot, skipped).await?;
            }
            Step::Retry { slot, .. } | Step::Resume { slot } => {
                track = take(st, rec, v, track, slot, false).await?;
            }
        }
    }
    Ok(Some(rt.clock.now() + 1))
}

/// Why scheduled snapshots pause now, if they do (read once a pass).
async fn paused(
    st: &Arc<State>,
    space: &mut Option<Option<String>>,
) -> Result<Option<String>, Failure> {
    if space.is_none() {
        let s = st.clone();
        *space = Some(blocking(move || s.space_warning()).await?);
    }
    Ok(space.clone().flatten())
}

fn run_rec(
    now: i64,
    slot: i64,
    v: &VolumeInfo,
    outcome: api::RunOutcome,
    snapshot: Option<String>,
    error: Option<String>,
) -> api::ScheduleRun {
    api::ScheduleRun {
        time: rfc3339(now),
        slot: rfc3339(slot),
        volume: v.name.clone(),
        outcome,
        snapshot,
        error,
        catch_up: false,
        deleted: Vec::new(),
        kept: Vec::new(),
    }
}

/// Where a schedule stands on a volume, durable when it returns (a redb
/// commit: run off the async threads).
async fn put_track(
    st: &Arc<State>,
    rec: &ScheduleRec,
    v: &VolumeInfo,
    track: &Track,
) -> Result<(), Failure> {
    let (s, id, vid, t) = (st.clone(), rec.id.clone(), v.id, track.clone());
    blocking(move || Ok(s.store.put_track(&id, vid, &t)?)).await
}

async fn record(st: &Arc<State>, rec: &ScheduleRec, run: api::ScheduleRun) -> Result<(), Failure> {
    let (s, id, r) = (st.clone(), rec.id.clone(), run.clone());
    blocking(move || Ok(s.store.add_run(&id, &r)?)).await?;
    let outcome = serde_json::to_value(run.outcome)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default();
    st.metrics.schedule_run(&rec.spec.name, &outcome);
    Ok(())
}

/// The schedule's snapshots of a volume, and the one for `slot` if any.
fn own_snapshots(
    st: &State,
    rec: &ScheduleRec,
    volume: &str,
) -> Result<Vec<SnapshotInfo>, Failure> {
    Ok(st
        .pool
        .list_snapshots(volume)?
        .into_iter()
        .filter(|s| has_label(s, api::SCHEDULE_LABEL, &rec.id))
        .collect())
}

fn has_label(s: &SnapshotInfo, key: &str, value: &str) -> bool {
    s.labels.iter().any(|(k, v)| k == key && v == value)
}

/// Claim `slot` (durably), take its snapshot unless it exists, record the
/// outcome, and on success apply retention.
async fn take(
    st: &Arc<State>,
    rec: &ScheduleRec,
    v: &VolumeInfo,
    track: Track,
    slot: i64,
    catch_up: bool,
) -> Result<Track, Failure> {
    let rt = &st.schedules;
    let track = track.claim(slot);
    put_track(st, rec, v, &track).await?;
    rt.crash_point("schedule-after-claim");
    let slot_s = slot.to_string();
    let name = snapshot_name(&rec.spec.name, slot);
    let s = st.clone();
    let (vol, id) = (v.name.clone(), rec.id.clone());
    let existing = blocking(move || {
        Ok(s.pool
            .list_snapshots(&vol)?
            .into_iter()
            .find(|x| has_label(x, api::SCHEDULE_LABEL, &id) && has_label(x, SLOT_LABEL, &slot_s)))
    })
    .await?;
    let result = match existing {
        Some(x) => Ok((api::RunOutcome::Existed, x.name)),
        None => {
            let mut labels = rec.spec.labels.clone();
            labels.insert(api::SCHEDULE_LABEL.into(), rec.id.clone());
            labels.insert(SLOT_LABEL.into(), slot.to_string());
            let op = Op::CreateSnapshot {
                volume: v.name.clone(),
                name: name.clone(),
                labels,
            };
            match operations::run(st, op).await {
                Ok(Outcome::Snapshot { created, info }) => Ok((
                    if created {
                        api::RunOutcome::Taken
                    } else {
                        api::RunOutcome::Existed
                    },
                    info.name,
                )),
                Ok(_) => Err("create-snapshot yielded no snapshot".to_string()),
                Err(f) => Err(f.1.to_string()),
            }
        }
    };
    rt.crash_point("schedule-after-snapshot");
    let now = rt.clock.now();
    match result {
        // The slot is marked done last: a crash before that resumes it
        // (finding its snapshot), runs retention again (it converges) and
        // records the run; so a slot shown done has its run recorded.
        Ok((outcome, snapshot)) => {
            let mut r = run_rec(now, slot, v, outcome, Some(snapshot), None);
            r.catch_up = catch_up;
            let (deleted, kept) = apply_retention(st, rec, &v.name, now).await?;
            r.deleted = deleted;
            r.kept = kept;
            tracing::info!(slot = %rfc3339(slot), outcome = ?r.outcome, deleted = r.deleted.len(), kept = r.kept.len(), "schedule ran");
            record(st, rec, r).await?;
            let track = track.done(now);
            put_track(st, rec, v, &track).await?;
            Ok(track)
        }
        Err(error) => {
            tracing::warn!(slot = %rfc3339(slot), %error, "scheduled snapshot failed; will retry");
            record(
                st,
                rec,
                run_rec(
                    now,
                    slot,
                    v,
                    api::RunOutcome::Failed,
                    Some(name),
                    Some(error),
                ),
            )
            .await?;
            let track = track.failed(now);
            put_track(st, rec, v, &track).await?;
            Ok(track)
        }
    }
}

/// Why a snapshot must stay whatever retention says, if it must.
pub fn pinned(st: &State, volume: &str, s: &SnapshotInfo) -> Option<String> {
    if !s.clones.is_empty() {
        return Some(format!(
            "linked clones depend on it: {}",
            s.clones.join(", ")
        ));
    }
    if st.is_attached(&snapshot_export(volume, &s.name)) {
        return Some(format!(
            "it is attached over NBD (lamina snapshot detach {volume} {})",
            s.name
        ));
    }
    if let Err(f) = st.refuse_if_copying_from(volume, &s.name) {
        return Some(f.1.message);
    }
    None
}

/// Delete what the schedule's retention removes from `volume`; what was
/// deleted, and what stayed though past retention.
pub async fn apply_retention(
    st: &Arc<State>,
    rec: &ScheduleRec,
    volume: &str,
    now: i64,
) -> Result<(Vec<String>, Vec<api::KeptSnapshot>), Failure> {
    let s = st.clone();
    let (r, vol) = (rec.clone(), volume.to_string());
    let candidates = blocking(move || {
        Ok(own_snapshots(&s, &r, &vol)?
            .into_iter()
            .map(|x| Candidate {
                created: slot_of(&x),
                pinned: pinned(&s, &vol, &x),
                name: x.name,
            })
            .collect::<Vec<_>>())
    })
    .await?;
    let p = plan(&retention(&rec.spec), &candidates, now);
    let mut deleted = Vec::new();
    let mut kept: Vec<api::KeptSnapshot> = p
        .kept
        .into_iter()
        .map(|k| api::KeptSnapshot {
            snapshot: k.name,
            reason: k.reason,
        })
        .collect();
    for name in p.delete {
        let op = Op::DeleteSnapshot {
            volume: volume.to_string(),
            name: name.clone(),
        };
        match operations::run(st, op).await {
            Ok(_) => deleted.push(name),
            Err(f) => kept.push(api::KeptSnapshot {
                snapshot: name,
                reason: f.1.to_string(),
            }),
        }
    }
    Ok((deleted, kept))
}

/// The slot a scheduled snapshot was taken for (its label), else its
/// creation time: retention counts age from it, on the scheduler's clock.
pub(crate) fn slot_of(s: &SnapshotInfo) -> i64 {
    s.labels
        .iter()
        .find(|(k, _)| k == SLOT_LABEL)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or((s.created / 1_000_000_000) as i64)
}
