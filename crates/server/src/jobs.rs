//! Clones and flattens as the daemon runs them: linked clones are one engine
//! call; a full clone is a background job that drives the engine's
//! resumable copy (`Pool::copy_into`) and records each durable offset in the
//! operation record, so that a restart resumes where it stopped instead of
//! starting over. The copying itself, and the rules of system snapshots,
//! are the engine's; this module schedules, records and reports.

use crate::apply::Outcome;
use crate::error::Failure;
use crate::state::{blocking, Live, State};
use crate::store::{CloneSource, CopyRec, Op, OpRec};
use lamina_api::OperationState;
use lamina_engine::{CopyControl, CopyEnd, CopyProgress, Target};
use std::sync::Arc;

/// A full clone's progress is made durable and recorded every this many
/// bytes of data.
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
        let mut live: Option<Live> = None;
        while !progress.finished.load(Ordering::SeqCst) {
            if st2.is_stopping() {
                return;
            }
            let (done, total) = (
                progress.done.load(Ordering::SeqCst),
                progress.total.load(Ordering::SeqCst),
            );
            let l = live.get_or_insert_with(|| Live::start(done, total));
            (l.done, l.total) = (done, total);
            st2.progress.lock().unwrap().insert(rec.id.clone(), *l);
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        rec.done_bytes = progress.done.load(Ordering::SeqCst);
        rec.total_bytes = progress.total.load(Ordering::SeqCst);
        let error = progress.error.lock().unwrap().clone();
        let _ = st2.end(rec, error);
    })
    .map_err(|e| Failure::internal(format!("cannot follow the flatten: {e}")))
}

/// Whether an existing volume is a linked clone of `source`.
fn is_linked_clone_of(v: &lamina_engine::VolumeInfo, source: &CloneSource) -> bool {
    let Some(o) = &v.origin else { return false };
    match source {
        CloneSource::Snapshot { volume, snapshot } => {
            o.volume.as_deref() == Some(volume) && o.snapshot.as_deref() == Some(snapshot)
        }
        CloneSource::Volume { volume } => {
            o.volume.as_deref() == Some(volume)
                && o.snapshot
                    .as_deref()
                    .is_some_and(lamina_engine::is_system_name)
        }
        CloneSource::Remote { .. } => false,
    }
}

pub async fn clone(st: &Arc<State>, rec: &OpRec, recovering: bool) -> Result<Outcome, Failure> {
    let Op::Clone { name, source, full } = rec.op.clone() else {
        return Err(Failure::internal("not a clone operation"));
    };
    if let CloneSource::Remote { .. } = source {
        return crate::remote::remote_clone(st, rec, recovering).await;
    }
    if full {
        return full_clone(st, rec, recovering).await;
    }
    let p = st.pool.clone();
    blocking(move || {
        if let Some(existing) = existing_linked(&p, &name, &source)? {
            return Ok(Outcome::Started {
                info: existing,
                created: false,
                running: None,
            });
        }
        let info = match &source {
            CloneSource::Snapshot { volume, snapshot } => {
                p.clone_snapshot(volume, snapshot, &name)?
            }
            CloneSource::Volume { volume } => p.clone_volume(volume, &name)?,
            CloneSource::Remote { .. } => {
                return Err(Failure::internal("a remote clone is never linked"))
            }
        };
        Ok(Outcome::Started {
            info,
            created: true,
            running: None,
        })
    })
    .await
}

/// Volume `name` if it is a linked clone of `source` (none: there is no
/// such volume); a volume of that name made otherwise is `already_exists`.
pub(crate) fn existing_linked(
    p: &lamina_engine::Pool,
    name: &str,
    source: &CloneSource,
) -> Result<Option<lamina_engine::VolumeInfo>, Failure> {
    match p.volume_info_by_name(name) {
        Ok(existing) if is_linked_clone_of(&existing, source) => Ok(Some(existing)),
        Ok(_) => Err(Failure::exists(
            format!("volume {name:?} already exists and is not a linked clone of {source}"),
            "pick another name for the clone",
        )),
        Err(_) => Ok(None),
    }
}

/// Asked again for a full clone (local or from another node) that exists,
/// from the same source: answer it as it is; a volume of that name made
/// otherwise is a conflict. None: there is no such volume yet. `me` is the
/// asking operation's id (empty before it is recorded): its own record is
/// no earlier clone.
pub(crate) async fn asked_again(
    st: &Arc<State>,
    me: &str,
    name: &str,
    source: &CloneSource,
) -> Result<Option<Outcome>, Failure> {
    let (st2, n2, s2, me) = (st.clone(), name.to_string(), source.clone(), me.to_string());
    blocking(move || {
        let Ok(info) = st2.pool.volume_info_by_name(&n2) else {
            return Ok(None);
        };
        let ops = st2.operations(&lamina_api::OperationFilter {
            volume: Some(n2.clone()),
            ..Default::default()
        })?;
        let earlier = ops.into_iter().find(|o| {
            o.id != me
                && o.state != OperationState::Failed
                && matches!(&o.op, Op::Clone { name, source, full: true } if *name == n2 && *source == s2)
        });
        match earlier {
            Some(op) => Ok(Some(Outcome::Started {
                info,
                created: false,
                running: (op.state == OperationState::Running).then_some(op.id),
            })),
            None => Err(Failure::exists(
                format!("volume {n2:?} already exists and is not a full clone of {s2}"),
                "pick another name for the clone",
            )),
        }
    })
    .await
}

/// A full clone: decide what to copy from (taking a system snapshot for a
/// clone of a volume), record it, make the new volume, and start the copy.
/// The order makes every crash recoverable: a system snapshot taken but not
/// recorded is deleted at start (nothing needs it); one recorded is resumed
/// from, or deleted when the copy ends.
async fn full_clone(st: &Arc<State>, rec: &OpRec, recovering: bool) -> Result<Outcome, Failure> {
    let Op::Clone { name, source, .. } = rec.op.clone() else {
        return Err(Failure::internal("not a clone operation"));
    };
    let mut rec = rec.clone();
    if !recovering {
        if let Some(answer) = asked_again(st, &rec.id, &name, &source).await? {
            return Ok(answer);
        }
    }
    let p = st.pool.clone();
    if rec.copy.is_none() {
        let (p2, n2, s2) = (p.clone(), name.clone(), source.clone());
        let copy = blocking(move || {
            lamina_engine::check_name(&n2)?;
            Ok(match s2 {
                CloneSource::Snapshot { volume, snapshot } => {
                    p2.snapshot_info_by_name(&volume, &snapshot)?;
                    CopyRec {
                        volume,
                        snapshot,
                        system: false,
                        resume_offset: 0,
                        snapshot_id: 0,
                        received_bytes: 0,
                        resent_bytes: None,
                        wire_bytes: 0,
                    }
                }
                CloneSource::Remote { .. } => {
                    return Err(Failure::internal("a remote clone is not a local copy"))
                }
                CloneSource::Volume { volume } => {
                    let s = p2.create_system_snapshot(&volume, &n2)?;
                    CopyRec {
                        volume,
                        snapshot: s.name,
                        system: true,
                        resume_offset: 0,
                        snapshot_id: 0,
                        received_bytes: 0,
                        resent_bytes: None,
                        wire_bytes: 0,
                    }
                }
            })
        })
        .await?;
        rec.copy = Some(copy.clone());
        if let Err(f) = st.record_async(rec.clone()).await {
            // Not recorded, so nothing may be left: not the system
            // snapshot taken for it either.
            release(st, &copy, &rec.id);
            return Err(f);
        }
    }
    let copy = rec.copy.clone().expect("set above");
    let (p2, n2, c2) = (p.clone(), name.clone(), copy.clone());
    let made = blocking(move || {
        if let Ok(v) = p2.volume_info_by_name(&n2) {
            return Ok(v); // made before a restart
        }
        let size = p2.open_snapshot(&c2.volume, &c2.snapshot)?.size()?;
        Ok(p2.create_volume(&n2, size)?)
    })
    .await;
    let info = match made {
        Ok(info) => info,
        Err(f) => {
            release(st, &copy, &rec.id);
            return Err(f);
        }
    };
    let (st2, rec2) = (st.clone(), rec.clone());
    st.spawn_job("lamina-full-clone", move || run_copy(&st2, rec2, &name))
        .map_err(|e| Failure::internal(format!("cannot start the copy: {e}")))?;
    Ok(Outcome::Started {
        info,
        created: !recovering,
        running: Some(rec.id.clone()),
    })
}

/// The copy job: runs the engine's copy, records its durable progress, and
/// at the end marks the operation and releases the system snapshot. A copy
/// that fails removes the half-made volume: a partial copy must never pass
/// for a volume.
fn run_copy(st: &Arc<State>, mut rec: OpRec, name: &str) {
    let copy = rec
        .copy
        .clone()
        .expect("a full clone's copy is recorded before it runs");
    let span = tracing::info_span!("full-clone", op = %rec.id, volume = %name);
    let _e = span.enter();
    struct Ctl<'a> {
        st: &'a State,
        rec: &'a mut OpRec,
        failed: Option<String>,
        live: Option<Live>,
    }
    impl CopyControl for Ctl<'_> {
        fn progress(&mut self, p: &CopyProgress) {
            let l = self
                .live
                .get_or_insert_with(|| Live::start(p.done_bytes, p.total_bytes));
            (l.done, l.total) = (p.done_bytes, p.total_bytes);
            self.st
                .progress
                .lock()
                .unwrap()
                .insert(self.rec.id.clone(), *l);
        }
        fn durable(&mut self, p: &CopyProgress) -> bool {
            self.rec.done_bytes = p.done_bytes;
            self.rec.total_bytes = p.total_bytes;
            if let Some(c) = self.rec.copy.as_mut() {
                c.resume_offset = p.resume_offset;
            }
            match self.st.record(self.rec) {
                Ok(()) => true,
                Err(e) => {
                    self.failed = Some(format!("cannot record progress: {e}"));
                    false
                }
            }
        }
        fn stop(&self) -> bool {
            self.st.is_stopping()
        }
    }
    let src = Target::snapshot(&copy.volume, &copy.snapshot);
    let mut ctl = Ctl {
        st,
        rec: &mut rec,
        failed: None,
        live: None,
    };
    let end = st
        .pool
        .copy_into(&src, name, copy.resume_offset, CHECKPOINT_BYTES, &mut ctl);
    let failed = ctl.failed.take();
    let error = match (end, failed) {
        (Ok(CopyEnd::Stopped(_)), None) => {
            st.progress.lock().unwrap().remove(&rec.id);
            tracing::info!("daemon stopping: the copy resumes at the next start");
            return;
        }
        (Ok(CopyEnd::Done(p)), None) => {
            rec.done_bytes = p.done_bytes;
            rec.total_bytes = p.total_bytes;
            None
        }
        (_, Some(e)) => Some(e),
        (Err(e), None) => Some(e.to_string()),
    };
    if let Some(e) = &error {
        tracing::error!(error = %e, "full clone failed; removing the partial volume");
        if let Err(d) = st.pool.delete_volume(name, true) {
            tracing::error!(error = %d, "could not remove the partial volume");
        }
    }
    release(st, &copy, &rec.id);
    let _ = st.end(rec, error);
}

/// Delete the system snapshot a copy took (a user's snapshot is never
/// touched: the engine refuses to delete one through this path).
fn release(st: &State, copy: &CopyRec, op: &str) {
    if copy.system {
        match st.pool.delete_system_snapshot(&copy.volume, &copy.snapshot) {
            Ok(()) | Err(lamina_engine::Error::SnapshotNotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(op, error = %e, "could not delete a full clone's system snapshot; it goes at the next start")
            }
        }
    }
}
