//! Clones: linked (O(1), in the engine) and full (a background copy of the
//! snapshot's allocated data into a new volume, with progress recorded in
//! the operation record so that a restart resumes where it stopped instead
//! of starting over).

use crate::apply::Outcome;
use crate::error::Failure;
use crate::state::{blocking, State};
use crate::store::OpRec;
use lamina_engine::{Chunk, Pool, Target};
use serde_json::json;
use std::sync::Arc;

/// Progress is recorded (after a flush of the target) every this many bytes.
const CHECKPOINT_BYTES: u64 = 64 << 20;

/// Follow an engine flatten (which runs on its own thread) and record its
/// end in the operation; at shutdown the record stays running, the engine
/// resumes the flatten when it reopens the pool, and recovery follows it again.
pub fn watch_flatten(
    st: &Arc<State>,
    rec: &OpRec,
    progress: Arc<lamina_engine::FlattenProgress>,
) -> Result<(), Failure> {
    use std::sync::atomic::Ordering;
    let (st2, mut rec) = (st.clone(), rec.clone());
    st.spawn_job("lamina-flatten-watch", move || {
        while !progress.finished.load(Ordering::SeqCst) {
            if st2.is_stopping() {
                return;
            }
            let p = (
                progress.done.load(Ordering::SeqCst),
                progress.total.load(Ordering::SeqCst),
            );
            st2.progress.lock().unwrap().insert(rec.id.clone(), p);
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        st2.progress.lock().unwrap().remove(&rec.id);
        rec.done_bytes = progress.done.load(Ordering::SeqCst);
        rec.total_bytes = progress.total.load(Ordering::SeqCst);
        match progress.error.lock().unwrap().clone() {
            None => rec.state = "succeeded".into(),
            Some(e) => {
                rec.state = "failed".into();
                rec.error = Some(e);
            }
        }
        if let Err(e) = st2.record(&rec) {
            tracing::error!(op = %rec.id, error = %e, "could not record the end of a flatten");
        }
    })
    .map_err(|e| Failure::invalid(format!("cannot follow the flatten: {e}")))
}

pub async fn clone(st: &Arc<State>, rec: &OpRec) -> Result<Outcome, Failure> {
    let a = &rec.args;
    let name = a["name"].as_str().unwrap_or_default().to_string();
    let full = a["full"].as_bool().unwrap_or(false);
    let (src_vol, src_snap, system) = match (a["from_snapshot"].as_str(), a["from_volume"].as_str())
    {
        (Some(s), None) => {
            let (v, s) = s.split_once('/').ok_or_else(|| {
                Failure::invalid(format!("--from-snapshot takes VOLUME/SNAPSHOT, not {s:?}"))
            })?;
            (v.to_string(), s.to_string(), false)
        }
        (None, Some(v)) => (
            v.to_string(),
            format!("clone-{name}").chars().take(255).collect(),
            true,
        ),
        _ => {
            return Err(Failure::invalid(
                "give exactly one of from_snapshot (VOLUME/SNAPSHOT) or from_volume",
            ))
        }
    };
    let p = st.pool.clone();
    let recovering = rec.state == "recovering";
    let (s2, v2, n2) = (src_snap.clone(), src_vol.clone(), name.clone());
    let info = blocking(move || {
        lamina_engine::check_name(&n2)?;
        if let Ok(existing) = p.volume_info_by_name(&n2) {
            let same = existing.origin.as_ref().is_some_and(|o| {
                o.volume.as_deref() == Some(&v2) && o.snapshot.as_deref() == Some(&s2)
            });
            if (same && !full) || recovering {
                return Ok(existing);
            }
            return Err(Failure::exists(
                format!("volume {n2:?} already exists"),
                "pick another name for the clone",
            ));
        }
        if system && p.snapshot_info_by_name(&v2, &s2).is_err() {
            p.create_system_snapshot(&v2, &s2)?;
        }
        if full {
            let size = p.open_snapshot(&v2, &s2)?.size()?;
            Ok(p.create_volume(&n2, size)?)
        } else {
            Ok(p.clone_snapshot(&v2, &s2, &n2)?)
        }
    })
    .await?;
    if !full {
        return Ok(Outcome::Clone(info, None));
    }
    let (st2, rec2) = (st.clone(), rec.clone());
    st.spawn_job("lamina-full-clone", move || {
        let mut rec = rec2;
        rec.state = "running".into();
        match copy(&st2.pool, &st2, &mut rec, &src_vol, &src_snap, &name) {
            Ok(false) => {
                tracing::info!(op = %rec.id, "daemon stopping: the copy resumes at the next start");
                return;
            }
            Ok(true) => {
                if system {
                    let _ = st2.pool.delete_snapshot(&src_vol, &src_snap);
                }
                rec.state = "succeeded".into();
            }
            Err(e) => {
                tracing::error!(op = %rec.id, error = %e, "full clone failed");
                rec.state = "failed".into();
                rec.error = Some(e.to_string());
            }
        }
        if let Err(e) = st2.record(&rec) {
            tracing::error!(op = %rec.id, error = %e, "could not record the end of a full clone");
        }
    })
    .map_err(|e| Failure::invalid(format!("cannot start the copy: {e}")))?;
    Ok(Outcome::Clone(info, Some(rec.id.clone())))
}

/// Copy the snapshot's data into the new volume; `Ok(false)` if the daemon
/// is stopping (progress so far is recorded, the operation stays running).
fn copy(
    pool: &Pool,
    st: &State,
    rec: &mut OpRec,
    vol: &str,
    snap: &str,
    name: &str,
) -> Result<bool, Box<dyn std::error::Error>> {
    let export = pool.export(None, &Target::snapshot(vol, snap))?;
    rec.total_bytes = export.data_bytes();
    st.record(rec)?;
    let resume = rec.args["resume_offset"].as_u64().unwrap_or(0);
    let dst = pool.open_volume(name)?;
    let mut done = 0;
    let mut since = 0;
    for chunk in export {
        if st.is_stopping() {
            dst.flush()?;
            st.progress.lock().unwrap().remove(&rec.id);
            return Ok(false);
        }
        let chunk = chunk?;
        let (offset, end, data) = match &chunk {
            Chunk::Data { offset, bytes } => {
                (*offset, *offset + bytes.len() as u64, bytes.len() as u64)
            }
            Chunk::Zero { offset, len } => (*offset, *offset + *len, 0),
        };
        if offset < resume {
            done += data;
            continue;
        }
        dst.apply(&chunk)?;
        done += data;
        since += data;
        st.progress
            .lock()
            .unwrap()
            .insert(rec.id.clone(), (done, rec.total_bytes));
        if since >= CHECKPOINT_BYTES {
            dst.flush()?;
            since = 0;
            rec.done_bytes = done;
            rec.args["resume_offset"] = json!(end);
            st.record(rec)?;
        }
    }
    dst.flush()?;
    rec.done_bytes = done;
    st.progress.lock().unwrap().remove(&rec.id);
    Ok(true)
}
