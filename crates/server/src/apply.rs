//! Every state-changing operation, recorded in the store before it runs and
//! marked done after. The same code runs a request and, at restart, finishes
//! a request the previous daemon was killed in the middle of: each operation
//! is idempotent by name, so running it again is safe.
//!
//! The rule for "same name" (docs/daemon.md): asking again for what exists
//! with the same spec answers it as it is (200, `created: false`); the same
//! name with another spec is `already_exists` (409); removing what is
//! already gone succeeds with `existed: false`.

use crate::error::Failure;
use crate::state::{blocking, now, snapshot_export, State};
use crate::store::{Op, OpRec};
use lamina_api as api;
use lamina_engine::{SnapshotInfo, VolumeInfo};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tracing::Instrument;

/// What an operation produced.
pub enum Outcome {
    /// `created` is false when it existed already with the same spec.
    Volume {
        info: VolumeInfo,
        created: bool,
    },
    Snapshot {
        info: SnapshotInfo,
        created: bool,
    },
    /// Whether there was something to remove.
    Removed(bool),
    /// A clone, or a flatten: `running` names the operation still working
    /// in the background (a full clone's copy, a flatten), which marks its
    /// record done itself.
    Started {
        info: VolumeInfo,
        created: bool,
        running: Option<String>,
    },
    /// A group snapshot's members, ordered by volume name.
    Group {
        members: Vec<SnapshotInfo>,
        created: bool,
    },
}

impl Outcome {
    /// Whether operation `id` goes on in the background, which marks its
    /// record done. One answered with another operation that runs (a full
    /// clone asked again) is done now.
    fn runs_on(&self, id: &str) -> bool {
        matches!(
            self,
            Outcome::Started {
                running: Some(r),
                ..
            } if r == id
        )
    }
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// Operation ids sort in start order: nanoseconds, then a sequence number.
fn new_id() -> String {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "op-{ns:016x}-{:04}",
        SEQ.fetch_add(1, Ordering::SeqCst) % 10_000
    )
}

/// A new operation's record, running from now.
fn new_running(op: Op) -> OpRec {
    OpRec {
        id: new_id(),
        op,
        state: api::OperationState::Running,
        started: now(),
        error: None,
        done_bytes: 0,
        total_bytes: 0,
        copy: None,
        reason: None,
    }
}

/// What a request must get right before anything is recorded: names that
/// follow the naming rule, a group's list of volumes, labels that leave
/// the group label to groups.
fn check_request(op: &Op) -> Result<(), Failure> {
    match op {
        Op::CreateVolume { name, labels, .. } => {
            lamina_engine::check_name(name)?;
            check_volume_labels(labels)?;
        }
        Op::SetVolumeLabels { labels, .. } => check_volume_labels(labels)?,
        Op::Clone { name, .. } => lamina_engine::check_name(name)?,
        Op::CreateSnapshot { name, labels, .. } => {
            lamina_engine::check_name(name)?;
            crate::groups::refuse_group_label(labels)?;
        }
        Op::CreateSnapshotGroup {
            name,
            volumes,
            labels,
        } => crate::groups::check_create(name, volumes, labels)?,
        _ => {}
    }
    Ok(())
}

/// The locks an operation takes, in the order it takes them: a group's
/// name first, then its volumes by name. Every operation takes at most one
/// group lock and its volume locks in name order, so none waits in a cycle.
fn lock_keys(op: &Op) -> Vec<String> {
    match op {
        Op::CreateSnapshotGroup { name, .. } | Op::DeleteSnapshotGroup { name, .. } => {
            // '/' is in no volume name: the keys never meet.
            let mut vols: Vec<String> = op.volumes().into_iter().map(String::from).collect();
            vols.sort();
            vols.dedup();
            std::iter::once(format!("group/{name}"))
                .chain(vols)
                .collect()
        }
        other => vec![other.volume().to_string()],
    }
}

/// Record, run, and mark done: the one path for every change. It runs in
/// a task of its own (`State::to_end`): once recorded, an operation runs to
/// its end and is marked done whether or not its client still waits.
pub async fn run(st: &Arc<State>, op: Op) -> Result<Outcome, Failure> {
    check_request(&op)?;
    let st2 = st.clone();
    st.to_end(async move { run_locked(&st2, op).await }).await
}

/// `run`'s work. The volume's lock serialises operations on it, so whether
/// something existed is decided under it, before anything is recorded:
/// of identical requests, one runs and is recorded, the others find its
/// result and leave no record.
async fn run_locked(st: &Arc<State>, op: Op) -> Result<Outcome, Failure> {
    let mut _guards = Vec::new();
    for k in lock_keys(&op) {
        _guards.push(st.lock(&k).lock_owned().await);
    }
    if let Some(gone) = already_gone(st, &op).await? {
        return Ok(gone);
    }
    refuse_while_copying(st, &op)?;
    if let Some(there) = already_there(st, &op).await {
        return Ok(there);
    }
    let rec = new_running(op);
    let span = tracing::info_span!("operation", id = %rec.id, kind = %rec.op.kind(), volume = %rec.volume());
    async move {
        let t0 = std::time::Instant::now();
        let (record_us, apply_us, result) = if rec.op.rerun_changes_nothing() {
            // The record runs beside the change: a store known to be
            // broken refuses the change before it is made.
            if st.store.is_broken() {
                let s = st.clone();
                blocking(move || s.store.check().map_err(Failure::from)).await?;
            }
            // A snapshot's creation needs no record before it runs: a
            // restart that finds none leaves what the engine holds as it
            // is, and the client's retry by name answers it (`created:
            // false`). So the record's sync and the engine's commit run
            // side by side, and the answer waits for both: one flush less
            // in series (docs/design.md, "The record beside the commit").
            let since = |t: std::time::Instant| t.elapsed().as_micros() as u64;
            let ((recorded, record_us), (result, apply_us)) = tokio::join!(
                async {
                    let recorded = st.record_async(rec.clone()).await;
                    let record_us = since(t0);
                    hold(st).await;
                    (recorded, record_us)
                },
                async { (apply(st, &rec, false).await, since(t0)) },
            );
            if let Err(f) = recorded {
                // The record failed, and is not there when the store
                // reopens. A snapshot that failed changed nothing: its
                // error is the answer. One that was made is the answer
                // too, and its done mark is written when the store
                // reopens (a restart before then finds no record, and a
                // snapshot needs none).
                tracing::warn!(error = %f.1.message, made = result.is_ok(), "a snapshot's record failed");
                if let Ok(o) = &result {
                    if !o.runs_on(&rec.id) {
                        st.finish(rec, None).await?;
                    }
                }
                return result;
            }
            (record_us, apply_us, result)
        } else {
            st.record_async(rec.clone()).await?;
            let record_us = t0.elapsed().as_micros() as u64;
            hold(st).await;
            let result = apply(st, &rec, false).await;
            let apply_us = (t0.elapsed().as_micros() as u64).saturating_sub(record_us);
            (record_us, apply_us, result)
        };
        let t2 = std::time::Instant::now();
        match &result {
            Ok(o) if o.runs_on(&rec.id) => {}
            Ok(_) => st.finish(rec, None).await?,
            Err(f) => {
                let mut rec = rec.clone();
                rec.reason = crate::remote::reason_of(&rec, f);
                st.finish(rec, Some(f.1.message.clone())).await?
            }
        }
        // Where an operation's time goes: the record before (or beside),
        // the change, the record after.
        tracing::debug!(
            record_us,
            apply_us,
            finish_us = t2.elapsed().as_micros() as u64,
            "operation timed"
        );
        if let Err(f) = &result {
            tracing::info!(error = %f.1.message, "operation refused or failed");
        }
        result
    }
    .instrument(span)
    .await
}

/// Tests only (`Testing::hold_operations`): wait while the file exists.
async fn hold(st: &State) {
    if let Some(file) = &st.hold_operations {
        while file.exists() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}

/// Asking again for what exists with the same spec is answered as it is,
/// with nothing recorded. Anything else (nothing there, the same name with
/// another spec, a lookup that failed) is for the operation to decide, and
/// to record.
async fn already_there(st: &Arc<State>, op: &Op) -> Option<Outcome> {
    if let Op::Clone {
        name,
        source,
        full: true,
    } = op
    {
        return crate::jobs::asked_again(st, "", name, source)
            .await
            .ok()
            .flatten();
    }
    let (p, op) = (st.pool.clone(), op.clone());
    blocking(move || {
        Ok(match &op {
            Op::CreateVolume { name, size, labels } => {
                existing_volume(&p, name, *size, &labels_vec(labels))?.map(|info| Outcome::Volume {
                    info,
                    created: false,
                })
            }
            Op::CreateSnapshot {
                volume,
                name,
                labels,
            } => existing_snapshot(&p, volume, name, labels)?.map(|info| Outcome::Snapshot {
                info,
                created: false,
            }),
            Op::CreateSnapshotGroup {
                name,
                volumes,
                labels,
            } => {
                crate::groups::existing(&p, name, volumes, labels)?.map(|members| Outcome::Group {
                    members,
                    created: false,
                })
            }
            Op::Clone { name, source, .. } => {
                crate::jobs::existing_linked(&p, name, source)?.map(|info| Outcome::Started {
                    info,
                    created: false,
                    running: None,
                })
            }
            _ => None,
        })
    })
    .await
    .ok()
    .flatten()
}

/// Volume `name` if it exists as asked (none: there is none); another
/// volume of that name is `already_exists`.
fn existing_volume(
    p: &lamina_engine::Pool,
    name: &str,
    size: u64,
    labels: &[(String, String)],
) -> Result<Option<VolumeInfo>, Failure> {
    match p.volume_info_by_name(name) {
        Ok(v) if v.size == size && v.origin.is_none() && v.labels == labels => Ok(Some(v)),
        Ok(v) if v.size == size && v.origin.is_none() => Err(Failure::exists(
            format!("volume {name:?} already exists with other labels"),
            &format!("change its labels with `lamina volume label {name}`, or pick another name"),
        )),
        Ok(v) => Err(Failure::exists(
            format!("volume {name:?} already exists with size {}", v.size),
            &format!("pick another name, or delete it first: lamina volume delete {name}"),
        )),
        Err(_) => Ok(None),
    }
}

/// Snapshot `volume/name` if it exists as asked (none: there is none);
/// one with other labels is `already_exists`.
fn existing_snapshot(
    p: &lamina_engine::Pool,
    volume: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> Result<Option<SnapshotInfo>, Failure> {
    match p.snapshot_info_by_name(volume, name) {
        Ok(s) if s.labels == labels_vec(labels) => Ok(Some(s)),
        Ok(_) => Err(Failure::exists(
            format!("snapshot {volume}/{name} already exists with other labels"),
            &format!(
                "pick another name, or delete it first: lamina snapshot delete {volume} {name}"
            ),
        )),
        Err(_) => Ok(None),
    }
}

/// A delete of what is not there succeeds at once, with nothing recorded.
async fn already_gone(st: &Arc<State>, op: &Op) -> Result<Option<Outcome>, Failure> {
    let (p, op) = (st.pool.clone(), op.clone());
    blocking(move || {
        Ok(match &op {
            Op::DeleteVolume { name, .. } if p.volume_info_by_name(name).is_err() => {
                Some(Outcome::Removed(false))
            }
            Op::DeleteSnapshot { volume, name }
                if p.snapshot_info_by_name(volume, name).is_err() =>
            {
                Some(Outcome::Removed(false))
            }
            Op::DeleteSnapshotGroup { name, .. }
                if crate::groups::members(&p, name)?.is_empty() =>
            {
                Some(Outcome::Removed(false))
            }
            _ => None,
        })
    })
    .await
}

/// A volume a full clone is still copying into takes no other change, and
/// is no clone's source, until the copy ends: its data is not whole yet.
fn refuse_while_copying(st: &State, op: &Op) -> Result<(), Failure> {
    // A clone's own target is the clone's business: asking again for the
    // full clone being copied is answered with it (see jobs.rs).
    let vols = match op {
        Op::Clone { source, .. } => source.local_volume().into_iter().collect(),
        other => other.volumes(),
    };
    for v in vols {
        if let Some(id) = st.running_copy_into(v) {
            return Err(Failure::conflict(
                format!("a full clone is still copying into volume {v:?} (operation {id})"),
                &format!("wait for it to end: lamina operation wait {id}"),
            ));
        }
    }
    Ok(())
}

/// A volume's labels: the engine's limits, and the `lamina.io/` prefix left
/// to the system.
fn check_volume_labels(labels: &BTreeMap<String, String>) -> Result<(), Failure> {
    if let Some(k) = labels.keys().find(|k| k.starts_with("lamina.io/")) {
        return Err(Failure::invalid(format!(
            "volume label {k:?}: the lamina.io/ prefix is the system's"
        )));
    }
    lamina_engine::check_labels(&labels_vec(labels))?;
    Ok(())
}

pub(crate) fn labels_vec(labels: &BTreeMap<String, String>) -> Vec<(String, String)> {
    labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// Carry out a recorded operation (first run, or after a restart when
/// `recovering`).
pub async fn apply(st: &Arc<State>, rec: &OpRec, recovering: bool) -> Result<Outcome, Failure> {
    let p = st.pool.clone();
    match rec.op.clone() {
        Op::CreateVolume { name, size, labels } => {
            let labels = labels_vec(&labels);
            blocking(move || {
                Ok(match existing_volume(&p, &name, size, &labels)? {
                    Some(info) => Outcome::Volume {
                        info,
                        created: false,
                    },
                    None => Outcome::Volume {
                        info: p.create_volume_labelled(&name, size, &labels)?,
                        created: true,
                    },
                })
            })
            .await
        }
        Op::SetVolumeLabels { name, labels } => {
            let labels = labels_vec(&labels);
            blocking(move || {
                Ok(Outcome::Volume {
                    info: p.set_volume_labels(&name, &labels)?,
                    created: false,
                })
            })
            .await
        }
        Op::ExpandVolume { name, size } => {
            blocking(move || {
                Ok(Outcome::Volume {
                    info: p.expand_volume(&name, size)?,
                    created: false,
                })
            })
            .await
        }
        Op::DeleteVolume {
            name,
            with_snapshots,
        } => {
            if st.is_attached(&name) {
                return Err(Failure::conflict(
                    format!("volume {name:?} is attached"),
                    &format!("detach it first: lamina volume detach {name}"),
                ));
            }
            let st2 = st.clone();
            blocking(move || {
                if recovering && p.volume_info_by_name(&name).is_err() {
                    return Ok(Outcome::Removed(true));
                }
                // The live volume's own snapshots (`NAME@ID`: deleted
                // volumes of the same name keep theirs apart).
                let id = p.volume_info_by_name(&name)?.id;
                for s in p.list_snapshots(&format!("{name}@{id}"))? {
                    if st2.is_attached(&snapshot_export(&name, &s.name)) {
                        return Err(Failure::conflict(
                            format!("snapshot {name}/{} is attached", s.name),
                            &format!("detach it first: lamina snapshot detach {name} {}", s.name),
                        ));
                    }
                    st2.refuse_if_copying_from(&name, &s.name)?;
                }
                p.delete_volume(&name, with_snapshots)?;
                Ok(Outcome::Removed(true))
            })
            .await
        }
        Op::CreateSnapshot {
            volume,
            name,
            labels,
        } => {
            blocking(move || {
                Ok(match existing_snapshot(&p, &volume, &name, &labels)? {
                    Some(info) => Outcome::Snapshot {
                        info,
                        created: false,
                    },
                    None => Outcome::Snapshot {
                        info: p.create_snapshot(&volume, &name, &labels_vec(&labels))?,
                        created: true,
                    },
                })
            })
            .await
        }
        Op::DeleteSnapshot { volume, name } => {
            if st.is_attached(&snapshot_export(&volume, &name)) {
                return Err(Failure::conflict(
                    format!("snapshot {volume}/{name} is attached"),
                    &format!("detach it first: lamina snapshot detach {volume} {name}"),
                ));
            }
            let st2 = st.clone();
            blocking(move || {
                if recovering && p.snapshot_info_by_name(&volume, &name).is_err() {
                    return Ok(Outcome::Removed(true));
                }
                st2.refuse_if_copying_from(&volume, &name)?;
                p.delete_snapshot(&volume, &name)?;
                Ok(Outcome::Removed(true))
            })
            .await
        }
        Op::Revert { volume, snapshot } => {
            if st.is_attached(&volume) {
                return Err(Failure::conflict(
                    format!("volume {volume:?} is attached: reverting would change its data under its clients"),
                    &format!("detach it first: lamina volume detach {volume}"),
                ));
            }
            blocking(move || {
                Ok(Outcome::Volume {
                    info: p.revert_volume(&volume, &snapshot)?,
                    created: false,
                })
            })
            .await
        }
        Op::Flatten { name } => {
            let (p2, n2) = (p.clone(), name.clone());
            let progress = blocking(move || Ok(p2.flatten(&n2)?)).await?;
            let info = blocking(move || Ok(p.volume_info_by_name(&name)?)).await?;
            crate::jobs::watch_flatten(st, rec, progress)?;
            Ok(Outcome::Started {
                info,
                created: false,
                running: Some(rec.id.clone()),
            })
        }
        Op::Clone { .. } => crate::jobs::clone(st, rec, recovering).await,
        Op::CreateSnapshotGroup {
            name,
            volumes,
            labels,
        } => blocking(move || crate::groups::create(&p, &name, &volumes, &labels)).await,
        Op::DeleteSnapshotGroup { name, .. } => {
            let st2 = st.clone();
            blocking(move || crate::groups::delete(&st2, &name, recovering)).await
        }
    }
}

impl State {
    /// Finish what a killed daemon left running. First the system
    /// snapshots nothing needs any more go (a crash can leave one between a
    /// clone's end and its snapshot's deletion).
    pub async fn recover(self: &Arc<Self>) -> Result<(), crate::ServerError> {
        let st = self.clone();
        let ops = blocking(move || {
            let ops = st.store.ops()?;
            let in_use: Vec<(String, String)> = ops
                .iter()
                .filter(|o| o.state == api::OperationState::Running)
                .filter_map(|o| o.copy.as_ref().map(|c| (c.volume.clone(), c.snapshot.clone())))
                .collect();
            for (vol, snap) in st.pool.unneeded_system_snapshots() {
                if !in_use.contains(&(vol.clone(), snap.clone())) {
                    tracing::info!(volume = %vol, snapshot = %snap, "deleting a system snapshot nothing needs");
                    st.pool.delete_system_snapshot(&vol, &snap)?;
                }
            }
            Ok(ops)
        })
        .await
        .map_err(crate::ServerError::from)?;
        for rec in ops
            .into_iter()
            .filter(|o| o.state == api::OperationState::Running)
        {
            let span = tracing::info_span!("recover", id = %rec.id, kind = %rec.op.kind(), volume = %rec.volume());
            async {
                tracing::info!("finishing an operation interrupted by a restart");
                let r = apply(self, &rec, true).await;
                let end = match r {
                    Ok(o) if o.runs_on(&rec.id) => return Ok(()), // its job marks it done
                    Ok(_) => self.finish(rec.clone(), None).await,
                    Err(f) => {
                        self.finish(
                            rec.clone(),
                            Some(format!("after a restart: {}", f.1.message)),
                        )
                        .await
                    }
                };
                end.map_err(crate::ServerError::from)
            }
            .instrument(span)
            .await?;
        }
        // The received counts of pulls that are not running any more (one
        // that failed just now, or before the last stop) go.
        let st = self.clone();
        blocking(move || {
            let ops = st.store.ops()?;
            let running: Vec<&str> = ops
                .iter()
                .filter(|o| o.state == api::OperationState::Running)
                .map(|o| o.id.as_str())
                .collect();
            crate::remote::sweep_received(&st, &running);
            Ok(())
        })
        .await
        .map_err(crate::ServerError::from)
    }
}

/// An operation record as the API shows it, with live progress if a job is
/// working for it.
pub fn operation(st: &State, rec: &OpRec) -> api::Operation {
    let live = st.progress.lock().unwrap().get(&rec.id).copied();
    // A job records its end before it drops its live progress, so a running
    // record read before this look at the progress, with none there now, may
    // be one the job has since ended: read it again, or the counts shown
    // would go back to the last running record's.
    let again;
    let rec = match (live, rec.state) {
        (None, api::OperationState::Running) => match st.store.op(&rec.id) {
            Ok(Some(r)) => {
                again = r;
                &again
            }
            _ => rec,
        },
        _ => rec,
    };
    let live = live.filter(|_| rec.state == api::OperationState::Running);
    let (done_bytes, total_bytes) =
        live.map_or((rec.done_bytes, rec.total_bytes), |l| (l.done, l.total));
    let copy = rec.copy.as_ref();
    // The pull's own count while it runs (remote.rs), else the recorded
    // one; records from before it was kept had only what was received.
    let resent = match (live, copy) {
        (Some(l), _) => l.resent,
        (None, Some(c)) => c
            .resent_bytes
            .unwrap_or_else(|| c.received_bytes.saturating_sub(done_bytes)),
        (None, None) => 0,
    };
    let remote = rec.op.kind() == api::OperationKind::RemoteClone;
    api::Operation {
        id: rec.id.clone(),
        kind: rec.op.kind(),
        volume: rec.volume().to_string(),
        state: rec.state,
        done_bytes,
        total_bytes,
        started: rec.started.clone(),
        error: rec.error.clone(),
        source: match &rec.op {
            Op::Clone { source, .. } => Some(source.api_form()),
            _ => None,
        },
        reason: rec.reason,
        resent_bytes: if remote { resent } else { 0 },
        wire_bytes: copy.map_or(0, |c| c.wire_bytes) + live.map_or(0, |l| l.wire),
        rate_bytes_per_sec: live.and_then(|l| l.rate()),
        eta_seconds: live.and_then(|l| l.eta()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{CloneSource, CopyRec};

    async fn state() -> (tempfile::TempDir, Arc<State>) {
        let d = tempfile::tempdir().unwrap();
        let layout = crate::Layout::new(d.path());
        layout.prepare().unwrap();
        let config = crate::Config::new(d.path());
        let st = Arc::new(State::open(&layout, &config).await.unwrap());
        (d, st)
    }

    /// A full clone is running (recorded as such) from src/s into x.
    async fn copying(st: &Arc<State>) {
        run(
            st,
            Op::CreateVolume {
                name: "src".into(),
                size: 1 << 20,
                labels: Default::default(),
            },
        )
        .await
        .unwrap();
        run(
            st,
            Op::CreateSnapshot {
                volume: "src".into(),
                name: "s".into(),
                labels: Default::default(),
            },
        )
        .await
        .unwrap();
        st.pool.create_volume("x", 1 << 20).unwrap();
        st.record(&OpRec {
            id: new_id(),
            op: Op::Clone {
                name: "x".into(),
                source: CloneSource::Snapshot {
                    volume: "src".into(),
                    snapshot: "s".into(),
                },
                full: true,
            },
            state: api::OperationState::Running,
            started: now(),
            error: None,
            done_bytes: 0,
            total_bytes: 0,
            copy: Some(CopyRec {
                volume: "src".into(),
                snapshot: "s".into(),
                system: false,
                resume_offset: 0,
                snapshot_id: 0,
                received_bytes: 0,
                resent_bytes: None,
                wire_bytes: 0,
            }),
            reason: None,
        })
        .unwrap();
    }

    /// A daemon killed while it took or deleted a group finishes the job at
    /// restart: the group is all there, or all gone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn group_operations_interrupted_by_a_restart_are_finished() {
        let (_d, st) = state().await;
        for v in ["a", "b"] {
            st.pool.create_volume(v, 1 << 20).unwrap();
        }
        let vols = vec!["a".to_string(), "b".to_string()];
        let create = new_running(Op::CreateSnapshotGroup {
            name: "g".into(),
            volumes: vols.clone(),
            labels: [("k".to_string(), "v".to_string())].into(),
        });
        st.record(&create).unwrap();
        assert_eq!(
            st.operations(&api::OperationFilter {
                volume: Some("b".into()),
                ..Default::default()
            })
            .unwrap()
            .len(),
            1,
            "a group's record is found under each volume"
        );
        st.recover().await.unwrap();
        let m = crate::groups::members(&st.pool, "g").unwrap();
        assert_eq!(m.len(), 2);
        let rec = st.store.op(&create.id).unwrap().unwrap();
        assert_eq!(rec.state, api::OperationState::Succeeded, "{:?}", rec.error);
        // Killed half-way through a delete: one member gone already.
        st.pool.delete_snapshot("a", "g").unwrap();
        let delete = new_running(Op::DeleteSnapshotGroup {
            name: "g".into(),
            volumes: vols,
        });
        st.record(&delete).unwrap();
        st.recover().await.unwrap();
        assert!(crate::groups::members(&st.pool, "g").unwrap().is_empty());
        let rec = st.store.op(&delete.id).unwrap().unwrap();
        assert_eq!(rec.state, api::OperationState::Succeeded, "{:?}", rec.error);
        st.close().await.unwrap();
    }

    /// A snapshot's creation is recorded beside the engine's commit, not
    /// before it. Answered, it is recorded and done; a daemon that died
    /// with the snapshot made and no record of it restarts with nothing to
    /// run again, and the client's retry by name is answered with the
    /// snapshot as it is.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_snapshot_is_recorded_beside_its_commit_and_a_missing_record_changes_nothing() {
        let (_d, st) = state().await;
        st.pool.create_volume("v", 1 << 20).unwrap();
        let snap = |name: &str| Op::CreateSnapshot {
            volume: "v".into(),
            name: name.into(),
            labels: Default::default(),
        };
        let Outcome::Snapshot { info, created } = run(&st, snap("s")).await.unwrap() else {
            panic!("a snapshot's creation answers with the snapshot");
        };
        assert!(created);
        let ops = st.store.ops().unwrap();
        assert_eq!(ops.len(), 1);
        assert_eq!(ops[0].state, api::OperationState::Succeeded);
        // The engine has a snapshot the store never recorded (the daemon
        // died before the record's sync ended).
        let lost = st.pool.create_snapshot("v", "t", &[]).unwrap();
        st.recover().await.unwrap();
        assert_eq!(st.store.ops().unwrap().len(), 1, "nothing to run again");
        assert_eq!(st.pool.list_snapshots("v").unwrap().len(), 2);
        let Outcome::Snapshot {
            info: again,
            created,
        } = run(&st, snap("t")).await.unwrap()
        else {
            panic!("a snapshot's creation answers with the snapshot");
        };
        assert!(!created, "the retry found the snapshot");
        assert_eq!((again.id, again.created), (lost.id, lost.created));
        assert_ne!(again.id, info.id);
        st.close().await.unwrap();
    }

    /// The received count a pull keeps beside the store goes with its
    /// operation: one that failed at recovery, or one left by an
    /// operation that is gone, is removed; a running pull's stays.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn received_counts_of_pulls_not_running_are_removed_at_recovery() {
        let (_d, st) = state().await;
        let dir = st.layout.root.join("transfers");
        std::fs::create_dir_all(&dir).unwrap();
        let count = |id: &str| dir.join(format!("{id}.received"));
        // This node has no transfer identity: the pull fails at recovery.
        let pull = new_running(Op::Clone {
            name: "x".into(),
            source: CloneSource::Remote {
                node: "n2".into(),
                address: "127.0.0.1:1".into(),
                volume: "src".into(),
                snapshot: "s".into(),
            },
            full: true,
        });
        st.record(&pull).unwrap();
        std::fs::write(count(&pull.id), 7u64.to_le_bytes()).unwrap();
        std::fs::write(count("op-gone"), 7u64.to_le_bytes()).unwrap();
        std::fs::write(dir.join("unrelated"), b"x").unwrap();
        st.recover().await.unwrap();
        let rec = st.store.op(&pull.id).unwrap().unwrap();
        assert_eq!(rec.state, api::OperationState::Failed);
        assert!(!count(&pull.id).exists());
        assert!(!count("op-gone").exists());
        assert!(dir.join("unrelated").exists(), "only received counts go");
        // A running operation keeps its count.
        std::fs::write(count("op-running"), 7u64.to_le_bytes()).unwrap();
        crate::remote::sweep_received(&st, &["op-running"]);
        assert!(count("op-running").exists());
        st.close().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_copy_in_progress_holds_its_volume_and_its_source() {
        let (_d, st) = state().await;
        copying(&st).await;
        let code = |r: Result<Outcome, Failure>| r.err().map(|f| (f.0.as_u16(), f.1.message));
        let (status, msg) = code(
            run(
                &st,
                Op::DeleteVolume {
                    name: "x".into(),
                    with_snapshots: true,
                },
            )
            .await,
        )
        .unwrap();
        assert_eq!(status, 409);
        assert!(msg.contains("still copying into volume \"x\""), "{msg}");
        let (status, msg) = code(
            run(
                &st,
                Op::DeleteSnapshot {
                    volume: "src".into(),
                    name: "s".into(),
                },
            )
            .await,
        )
        .unwrap();
        assert_eq!(status, 409);
        assert!(msg.contains("copying from snapshot src/s"), "{msg}");
        let (status, _) = code(
            run(
                &st,
                Op::DeleteVolume {
                    name: "src".into(),
                    with_snapshots: true,
                },
            )
            .await,
        )
        .unwrap();
        assert_eq!(status, 409);
        assert_eq!(
            st.volume(st.pool.volume_info_by_name("x").unwrap())
                .clone_state,
            api::CloneState::Copying
        );
        // Nor can it be snapshotted, expanded or cloned until it is whole.
        for op in [
            Op::CreateSnapshot {
                volume: "x".into(),
                name: "half".into(),
                labels: Default::default(),
            },
            Op::ExpandVolume {
                name: "x".into(),
                size: 2 << 20,
            },
            Op::Clone {
                name: "y".into(),
                source: CloneSource::Volume { volume: "x".into() },
                full: false,
            },
        ] {
            let (status, msg) = code(run(&st, op).await).unwrap();
            assert_eq!(status, 409, "{msg}");
        }
        // Asking again for the same full clone is answered with it.
        let again = run(
            &st,
            Op::Clone {
                name: "x".into(),
                source: CloneSource::Snapshot {
                    volume: "src".into(),
                    snapshot: "s".into(),
                },
                full: true,
            },
        )
        .await;
        assert!(
            matches!(
                again,
                Ok(Outcome::Started {
                    created: false,
                    running: Some(_),
                    ..
                })
            ),
            "{:?}",
            again.err().map(|f| f.1.message)
        );
        // Nothing was deleted or made.
        assert!(st.pool.snapshot_info_by_name("src", "s").is_ok());
        assert!(st.pool.volume_info_by_name("x").is_ok());
        assert!(st.pool.volume_info_by_name("y").is_err());
        assert!(st.pool.list_snapshots("x").unwrap().is_empty());
        st.close().await.unwrap();
    }
}
