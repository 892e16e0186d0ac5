//! Every state-changing operation, recorded in the store before it runs and
//! marked done after. The same code runs a request and, at restart, finishes
//! a request the previous daemon was killed in the middle of: each operation
//! is idempotent by name, so running it again is safe.

use crate::error::Failure;
use crate::state::{blocking, now, snapshot_export, State};
use crate::store::OpRec;
use lamina_api as api;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What an operation produced.
pub enum Outcome {
    Volume(lamina_engine::VolumeInfo),
    Snapshot(lamina_engine::SnapshotInfo),
    Done,
    Clone(lamina_engine::VolumeInfo, Option<String>),
}

static SEQ: AtomicU64 = AtomicU64::new(0);

fn new_id() -> String {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("op-{ns:x}-{}", SEQ.fetch_add(1, Ordering::SeqCst))
}

fn arg<'a>(args: &'a Value, k: &str) -> Result<&'a str, Failure> {
    args[k]
        .as_str()
        .ok_or_else(|| Failure::invalid(format!("missing {k}")))
}

/// Record, run, and mark done: the one path for every change. The volume's
/// lock serialises operations on it.
pub async fn run(
    st: &Arc<State>,
    kind: &str,
    volume: &str,
    args: Value,
) -> Result<Outcome, Failure> {
    // Refuse malformed names before anything is recorded.
    if matches!(kind, "create-volume" | "clone") {
        lamina_engine::check_name(volume)?;
    }
    if kind == "create-snapshot" {
        lamina_engine::check_name(args["name"].as_str().unwrap_or_default())?;
    }
    let lock = st.lock(volume);
    let _guard = lock.lock().await;
    let rec = OpRec {
        id: new_id(),
        kind: kind.into(),
        volume: volume.into(),
        args,
        state: "running".into(),
        done_bytes: 0,
        total_bytes: 0,
        started: now(),
        error: None,
    };
    let st2 = st.clone();
    let r2 = rec.clone();
    blocking(move || st2.record(&r2).map_err(Failure::from)).await?;
    let result = apply(st, &rec).await;
    // A full clone or a flatten stays running: its job marks it done.
    if !matches!(result, Ok(Outcome::Clone(_, Some(_)))) {
        let mut done = rec;
        match &result {
            Ok(_) => done.state = "succeeded".into(),
            Err(f) => {
                done.state = "failed".into();
                done.error = Some(f.1.message.clone());
            }
        }
        let st2 = st.clone();
        blocking(move || st2.record(&done).map_err(Failure::from)).await?;
    }
    result
}

/// Carry out a recorded operation (first run or after a restart).
pub async fn apply(st: &Arc<State>, rec: &OpRec) -> Result<Outcome, Failure> {
    let st = st.clone();
    let rec = rec.clone();
    let a = rec.args.clone();
    let p = st.pool.clone();
    match rec.kind.as_str() {
        "create-volume" => {
            let (name, size) = (
                arg(&a, "name")?.to_string(),
                a["size"].as_u64().unwrap_or(0),
            );
            blocking(move || match p.volume_info_by_name(&name) {
                Ok(v) if v.size == size && v.origin.is_none() => Ok(Outcome::Volume(v)),
                Ok(v) => Err(Failure::exists(
                    format!("volume {name:?} already exists with size {}", v.size),
                    "pick another name, or delete it first",
                )),
                Err(_) => Ok(Outcome::Volume(p.create_volume(&name, size)?)),
            })
            .await
        }
        "expand-volume" => {
            let (name, size) = (
                arg(&a, "name")?.to_string(),
                a["size"].as_u64().unwrap_or(0),
            );
            blocking(move || Ok(Outcome::Volume(p.expand_volume(&name, size)?))).await
        }
        "delete-volume" => {
            let name = arg(&a, "name")?.to_string();
            let with = a["with_snapshots"].as_bool().unwrap_or(false);
            if st.is_attached(&name) {
                return Err(Failure::conflict(
                    format!("volume {name:?} is attached"),
                    "detach it first: lamina volume detach NAME",
                ));
            }
            blocking(move || {
                if p.volume_info_by_name(&name).is_err() && rec.state == "recovering" {
                    return Ok(Outcome::Done);
                }
                let clones: Vec<String> = p
                    .list_volumes()
                    .into_iter()
                    .filter(|v| {
                        v.origin.as_ref().and_then(|o| o.volume.as_deref()) == Some(name.as_str())
                            && matches!(v.clone_state, lamina_engine::CloneState::Linked | lamina_engine::CloneState::Flattening)
                    })
                    .map(|v| v.name)
                    .collect();
                if !clones.is_empty() {
                    return Err(Failure::conflict(
                        format!("linked clones depend on volume {name:?}: {}", clones.join(", ")),
                        "flatten them first (lamina volume flatten CLONE) or delete them",
                    ));
                }
                let snaps: Vec<String> = p.list_snapshots(&name)?.into_iter().map(|s| s.name).collect();
                for s in &snaps {
                    if st.is_attached(&snapshot_export(&name, s)) {
                        return Err(Failure::conflict(format!("snapshot {name}/{s} is attached"), "detach it first"));
                    }
                }
                if !snaps.is_empty() && !with {
                    return Err(Failure::conflict(
                        format!("volume {name:?} has {} snapshot(s): {}", snaps.len(), snaps.join(", ")),
                        "delete them first, or pass --with-snapshots to delete them with the volume",
                    ));
                }
                p.delete_volume(&name, with)?;
                Ok(Outcome::Done)
            })
            .await
        }
        "create-snapshot" => {
            let (vol, name) = (arg(&a, "volume")?.to_string(), arg(&a, "name")?.to_string());
            let labels: Vec<(String, String)> = serde_json::from_value::<
                std::collections::BTreeMap<String, String>,
            >(a["labels"].clone())
            .unwrap_or_default()
            .into_iter()
            .collect();
            blocking(move || match p.snapshot_info_by_name(&vol, &name) {
                Ok(s) => Ok(Outcome::Snapshot(s)),
                Err(_) => Ok(Outcome::Snapshot(p.create_snapshot(&vol, &name, &labels)?)),
            })
            .await
        }
        "delete-snapshot" => {
            let (vol, name) = (arg(&a, "volume")?.to_string(), arg(&a, "name")?.to_string());
            if st.is_attached(&snapshot_export(&vol, &name)) {
                return Err(Failure::conflict(
                    format!("snapshot {vol}/{name} is attached"),
                    "detach it first: lamina snapshot detach VOLUME SNAPSHOT",
                ));
            }
            blocking(move || {
                if rec.state == "recovering" && p.snapshot_info_by_name(&vol, &name).is_err() {
                    return Ok(Outcome::Done);
                }
                p.delete_snapshot(&vol, &name)?;
                Ok(Outcome::Done)
            })
            .await
        }
        "revert" => {
            let (vol, name) = (
                arg(&a, "volume")?.to_string(),
                arg(&a, "snapshot")?.to_string(),
            );
            if st.is_attached(&vol) {
                return Err(Failure::conflict(
                    format!("volume {vol:?} is attached: reverting would change its data under its clients"),
                    "detach it first: lamina volume detach VOLUME",
                ));
            }
            blocking(move || Ok(Outcome::Volume(p.revert_volume(&vol, &name)?))).await
        }
        "flatten" => {
            let name = arg(&a, "name")?.to_string();
            let (p2, n2) = (p.clone(), name.clone());
            let progress = blocking(move || Ok(p2.flatten(&n2)?)).await?;
            let info = blocking(move || Ok(p.volume_info_by_name(&name)?)).await?;
            crate::jobs::watch_flatten(&st, &rec, progress)?;
            Ok(Outcome::Clone(info, Some(rec.id.clone())))
        }
        "clone" => crate::jobs::clone(&st, &rec).await,
        other => Err(Failure::invalid(format!(
            "unknown operation kind {other:?}"
        ))),
    }
}

impl State {
    /// Finish what a killed daemon left running.
    pub async fn recover(self: &Arc<Self>) -> Result<(), crate::ServerError> {
        let ops = self.store.ops()?;
        for mut rec in ops.into_iter().filter(|o| o.state == "running") {
            tracing::info!(op = %rec.id, kind = %rec.kind, volume = %rec.volume, "finishing an operation interrupted by a restart");
            rec.state = "recovering".into();
            let r = apply(self, &rec).await;
            if matches!(r, Ok(Outcome::Clone(_, Some(_)))) {
                continue; // the copy job resumed and will mark it done
            }
            match r {
                Ok(_) => rec.state = "succeeded".into(),
                Err(f) => {
                    rec.state = "failed".into();
                    rec.error = Some(format!("after a restart: {}", f.1.message));
                }
            }
            self.record(&rec)?;
        }
        Ok(())
    }
}

/// An operation record as the API shows it, with live progress if a job is
/// copying for it.
pub fn operation(st: &State, rec: &OpRec) -> api::Operation {
    let (done_bytes, total_bytes) = match st.progress.lock().unwrap().get(&rec.id) {
        Some(&p) if rec.state == "running" => p,
        _ => (rec.done_bytes, rec.total_bytes),
    };
    api::Operation {
        id: rec.id.clone(),
        kind: serde_json::from_value(Value::String(rec.kind.clone()))
            .unwrap_or(api::OperationKind::FullClone),
        volume: rec.volume.clone(),
        state: match rec.state.as_str() {
            "succeeded" => api::OperationState::Succeeded,
            "failed" => api::OperationState::Failed,
            _ => api::OperationState::Running,
        },
        done_bytes,
        total_bytes,
        started: rec.started.clone(),
        error: rec.error.clone(),
    }
}

/// The JSON arguments of each operation kind.
pub fn args_create_volume(name: &str, size: u64) -> Value {
    json!({"name": name, "size": size})
}
