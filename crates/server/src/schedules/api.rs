//! The schedules' API: `/v1/schedules` (list, create), `/v1/schedules/{name}`
//! (get, replace or rename, delete keeping or deleting its snapshots).
//! Changes are serialised by one lock and wake the runner.

use super::runner::{self, covers, pinned, timing};
use super::{rfc3339, ScheduleRec, SLOT_LABEL};
use crate::error::Failure;
use crate::extract::{body, created, St};
use crate::operations;
use crate::state::{blocking, State};
use crate::store::Op;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::Json;
use lamina_api as api;
use std::sync::Arc;

type R<T> = Result<T, Failure>;

/// Longest schedule name: its snapshots' names add 14 characters.
pub const MAX_NAME: usize = 63;

/// Everything a spec must get right before it is stored.
fn check(spec: &api::ScheduleSpec) -> R<()> {
    lamina_engine::check_name(&spec.name)?;
    if spec.name.len() > MAX_NAME {
        return Err(Failure::invalid(format!(
            "schedule name {:?} is {} characters; at most {MAX_NAME} (its snapshots are named NAME-YYYYMMDD-HHMM)",
            spec.name,
            spec.name.len()
        )));
    }
    timing(spec)?;
    runner::retention(spec)
        .validate()
        .map_err(|e| Failure::invalid(e.to_string()))?;
    for k in spec.labels.keys() {
        if k.starts_with("lamina.io/") {
            return Err(Failure::invalid(format!(
                "label {k:?}: the lamina.io/ prefix is the system's (a scheduled snapshot gets {} and {SLOT_LABEL} itself)",
                api::SCHEDULE_LABEL
            )));
        }
    }
    let pairs: Vec<(String, String)> = spec
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .chain([
            (
                api::SCHEDULE_LABEL.to_string(),
                "sch-18446744073709551615".to_string(),
            ),
            (SLOT_LABEL.to_string(), i64::MIN.to_string()),
        ])
        .collect();
    lamina_engine::check_labels(&pairs)?;
    for v in &spec.volumes {
        lamina_engine::check_name(v)?;
    }
    if spec.volumes.is_empty() && spec.selector.as_ref().is_none_or(|s| s.is_empty()) {
        return Err(Failure::invalid(
            "a schedule covers volumes by name (volumes) or by label (selector): give one",
        ));
    }
    Ok(())
}

/// A schedule as the API shows it, at `now`.
pub fn view(st: &State, rec: &ScheduleRec, now: i64) -> R<api::Schedule> {
    let next_runs = match timing(&rec.spec) {
        Ok(t) => t.upcoming(now, 3).into_iter().map(|s| t.local(s)).collect(),
        Err(_) => Vec::new(),
    };
    let runs = st.store.runs(&rec.id)?;
    let mut volumes = Vec::new();
    for v in st.pool.list_volumes() {
        if !covers(&rec.spec, &v) {
            continue;
        }
        let track = st.store.track(&rec.id, v.id)?;
        let snapshots = st
            .pool
            .list_snapshots(&v.name)?
            .iter()
            .filter(|s| {
                s.labels
                    .iter()
                    .any(|(k, val)| k == api::SCHEDULE_LABEL && *val == rec.id)
            })
            .count() as u64;
        volumes.push(api::ScheduleVolume {
            state: track.as_ref().map_or("idle".into(), |t| {
                serde_json::to_value(t.state)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default()
            }),
            last_slot: track.as_ref().and_then(|t| t.slot).map(rfc3339),
            snapshots,
            last_run: runs.iter().find(|r| r.volume == v.name).cloned(),
            volume: v.name,
        });
    }
    Ok(api::Schedule {
        id: rec.id.clone(),
        spec: rec.spec.clone(),
        created: rfc3339(rec.created),
        next_runs,
        volumes,
        runs: runs.into_iter().take(50).collect(),
    })
}

#[utoipa::path(get, path = "/v1/schedules",
    responses((status = 200, description = "by name", body = Vec<api::Schedule>),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn list_schedules(st: St) -> R<Json<Vec<api::Schedule>>> {
    let s = st.0.clone();
    blocking(move || {
        let now = s.schedules.clock.now();
        let recs = s.store.schedules()?;
        Ok(Json(
            recs.iter()
                .filter(|r| !r.deleting)
                .map(|r| view(&s, r, now))
                .collect::<R<Vec<_>>>()?,
        ))
    })
    .await
}

#[utoipa::path(post, path = "/v1/schedules", request_body = api::ScheduleSpec,
    responses((status = 201, description = "created", body = api::Schedule),
        (status = 200, description = "exists already with the same spec", body = api::Schedule),
        (status = 400, description = "bad name, cron expression, time zone, retention, labels or volumes", body = api::ApiError),
        (status = 409, description = "a schedule of that name exists with another spec", body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn create_schedule(
    st: St,
    b: Result<Json<api::ScheduleSpec>, JsonRejection>,
) -> R<(StatusCode, Json<api::Schedule>)> {
    let spec = body(b)?;
    check(&spec)?;
    let st = st.0;
    let _g = st.schedules.changes.lock().await;
    let s = st.clone();
    let (rec, made) = blocking(move || {
        if let Some(rec) = s.store.schedule_by_name(&spec.name)? {
            if rec.spec == spec && !rec.deleting {
                return Ok((rec, false));
            }
            return Err(Failure::exists(
                format!("schedule {:?} exists with another spec", spec.name),
                &format!("change it with `lamina schedule update {}`", spec.name),
            ));
        }
        let rec = ScheduleRec {
            id: s.store.new_schedule_id()?,
            spec,
            created: s.schedules.clock.now(),
            deleting: false,
        };
        // The volumes it covers now are tracked from its creation, in the
        // same transaction: a slot that passes before the loop first looks
        // at them is still theirs (the loop tracks a volume from when it
        // first sees it covered).
        let tracks: Vec<(u64, lamina_schedule::Track)> = s
            .pool
            .list_volumes()
            .iter()
            .filter(|v| super::runner::covers(&rec.spec, v))
            .map(|v| (v.id, lamina_schedule::Track::new(rec.created)))
            .collect();
        s.store.put_schedule_with_tracks(&rec, &tracks)?;
        Ok((rec, true))
    })
    .await?;
    if made {
        tracing::info!(schedule = %rec.spec.name, id = %rec.id, cron = %rec.spec.cron, "schedule created");
    }
    st.schedules.wake.notify_one();
    let s = st.clone();
    let view = blocking(move || view(&s, &rec, s.schedules.clock.now())).await?;
    Ok((created(made), Json(view)))
}

#[utoipa::path(get, path = "/v1/schedules/{name}", params(("name" = String, Path, description = "schedule name")),
    responses((status = 200, body = api::Schedule), (status = 404, body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn get_schedule(st: St, Path(name): Path<String>) -> R<Json<api::Schedule>> {
    let s = st.0.clone();
    blocking(move || {
        let rec = s
            .store
            .schedule_by_name(&name)?
            .filter(|r| !r.deleting)
            .ok_or_else(|| super::records::no_such_schedule(&name))?;
        Ok(Json(view(&s, &rec, s.schedules.clock.now())?))
    })
    .await
}

#[utoipa::path(put, path = "/v1/schedules/{name}", params(("name" = String, Path, description = "schedule name")),
    request_body = api::ScheduleSpec,
    responses((status = 200, description = "replaced (a new name renames it; its id and snapshots stay)", body = api::Schedule),
        (status = 400, body = api::ApiError), (status = 404, body = api::ApiError),
        (status = 409, description = "the new name is another schedule's", body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn update_schedule(
    st: St,
    Path(name): Path<String>,
    b: Result<Json<api::ScheduleSpec>, JsonRejection>,
) -> R<Json<api::Schedule>> {
    let spec = body(b)?;
    check(&spec)?;
    let st = st.0;
    let _g = st.schedules.changes.lock().await;
    let s = st.clone();
    let rec = blocking(move || {
        let mut rec = s
            .store
            .schedule_by_name(&name)?
            .filter(|r| !r.deleting)
            .ok_or_else(|| super::records::no_such_schedule(&name))?;
        if spec.name != name {
            if let Some(other) = s.store.schedule_by_name(&spec.name)? {
                return Err(Failure::exists(
                    format!("schedule {:?} exists already ({})", spec.name, other.id),
                    "pick another name",
                ));
            }
        }
        rec.spec = spec;
        s.store.put_schedule(&rec)?;
        Ok(rec)
    })
    .await?;
    tracing::info!(schedule = %rec.spec.name, id = %rec.id, "schedule updated");
    st.schedules.wake.notify_one();
    let s = st.clone();
    Ok(Json(
        blocking(move || view(&s, &rec, s.schedules.clock.now())).await?,
    ))
}

#[utoipa::path(delete, path = "/v1/schedules/{name}",
    params(("name" = String, Path, description = "schedule name"), api::DeleteScheduleQuery),
    responses((status = 200, description = "deleted (or was absent: `existed: false`)", body = api::ScheduleDeleted),
        (status = 400, description = "`snapshots` missing: say whether to keep or delete them", body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn delete_schedule(
    st: St,
    Path(name): Path<String>,
    Query(q): Query<api::DeleteScheduleQuery>,
) -> R<Json<api::ScheduleDeleted>> {
    let st = st.0;
    let _g = st.schedules.changes.lock().await;
    let s = st.clone();
    let n = name.clone();
    let Some(mut rec) = blocking(move || Ok(s.store.schedule_by_name(&n)?)).await? else {
        return Ok(Json(api::ScheduleDeleted {
            existed: false,
            deleted: Vec::new(),
            kept: Vec::new(),
        }));
    };
    let Some(action) = q.snapshots else {
        let s = st.clone();
        let id = rec.id.clone();
        let count = blocking(move || Ok(own_snapshots(&s, &id)?.len())).await?;
        return Err(Failure::new(
            api::ErrorCode::Invalid,
            format!("schedule {name:?} has {count} snapshots: say whether to keep or delete them"),
            Some(&format!(
                "lamina schedule delete {name} --keep-snapshots (or --delete-snapshots)"
            )),
        ));
    };
    if action == api::SnapshotsAction::Delete && !rec.deleting {
        rec.deleting = true;
        let (s, r) = (st.clone(), rec.clone());
        blocking(move || Ok(s.store.put_schedule(&r)?)).await?;
    }
    let out = finish_delete(&st, &rec, action).await?;
    tracing::info!(schedule = %name, id = %rec.id, deleted = out.deleted.len(), kept = out.kept.len(), "schedule deleted");
    Ok(Json(out))
}

/// Every snapshot of every volume that `id` made: `(volume, snapshot)`.
fn own_snapshots(st: &State, id: &str) -> R<Vec<lamina_engine::SnapshotInfo>> {
    Ok(st
        .pool
        .find_snapshots(None, None)?
        .into_iter()
        .filter(|s| {
            s.labels
                .iter()
                .any(|(k, v)| k == api::SCHEDULE_LABEL && v == id)
        })
        .collect())
}

/// Delete (or keep) a schedule's snapshots, then the schedule. Run again
/// at start for a schedule left `deleting` by a crash.
pub async fn finish_delete(
    st: &Arc<State>,
    rec: &ScheduleRec,
    action: api::SnapshotsAction,
) -> R<api::ScheduleDeleted> {
    let s = st.clone();
    let id = rec.id.clone();
    let snaps = blocking(move || {
        Ok(own_snapshots(&s, &id)?
            .into_iter()
            .map(|x| {
                let why = pinned(&s, &x.volume, &x);
                (x, why)
            })
            .collect::<Vec<_>>())
    })
    .await?;
    let mut out = api::ScheduleDeleted {
        existed: true,
        deleted: Vec::new(),
        kept: Vec::new(),
    };
    for (x, why) in snaps {
        let full = format!("{}/{}", x.volume, x.name);
        if action == api::SnapshotsAction::Keep {
            out.kept.push(api::KeptSnapshot {
                snapshot: full,
                reason: "kept as asked".into(),
            });
            continue;
        }
        if let Some(reason) = why {
            out.kept.push(api::KeptSnapshot {
                snapshot: full,
                reason,
            });
            continue;
        }
        let op = Op::DeleteSnapshot {
            volume: x.volume.clone(),
            name: x.name.clone(),
        };
        match operations::run(st, op).await {
            Ok(_) => out.deleted.push(full),
            Err(f) => out.kept.push(api::KeptSnapshot {
                snapshot: full,
                reason: f.1.to_string(),
            }),
        }
    }
    let (s, id) = (st.clone(), rec.id.clone());
    blocking(move || Ok(s.store.remove_schedule(&id)?)).await?;
    Ok(out)
}

/// At start: finish the deletes a crash interrupted.
pub async fn recover(st: &Arc<State>) -> Result<(), crate::ServerError> {
    for rec in st.store.schedules()?.into_iter().filter(|r| r.deleting) {
        tracing::info!(schedule = %rec.spec.name, id = %rec.id, "finishing a schedule delete interrupted by a restart");
        finish_delete(st, &rec, api::SnapshotsAction::Delete)
            .await
            .map_err(crate::ServerError::from)?;
    }
    Ok(())
}
