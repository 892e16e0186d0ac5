//! Every state-changing operation, recorded in the store before it runs and
//! marked done after (`State::transition`, the only writer of its record).
//! The same code runs a request and, at restart, finishes a request the
//! previous daemon was killed in the middle of (`recover`): each operation
//! is idempotent by name, so running it again is safe. Whoever asks (the
//! HTTP handlers, the schedules' runner) calls [`run`] with an [`Op`].
//!
//! One file per family of operations, each one function per operation,
//! chosen by [`apply`]'s match: `volumes`, `snapshots`, `clones` (linked
//! and full clones, flattens), `remote` (clones of another node's
//! snapshot), `groups` (group snapshots), and `exports` (attach and
//! detach, which take the same locks but leave no record). The copies
//! themselves run as jobs (`crate::jobs`), which end their operation
//! through the same transition.
//!
//! The rule for "same name" (docs/daemon.md): asking again for what exists
//! with the same spec answers it as it is (200, `created: false`); the same
//! name with another spec is `already_exists` (409); removing what is
//! already gone succeeds with `existed: false`.

mod clones;
pub mod exports;
pub mod groups;
mod recover;
mod remote;
mod replicas;
mod snapshots;
#[cfg(test)]
mod tests;
mod volumes;

pub use recover::recover;
pub use remote::request as clone_op;
pub use replicas::forget_taken_diskless;

use crate::error::Failure;
use crate::state::{blocking, new_record, State, Step};
use crate::store::{CloneSource, Op, OpRec};
use lamina_engine::{SnapshotInfo, VolumeInfo};
use std::collections::BTreeMap;
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
    /// Removed, leaving something behind: what, and why (a removed
    /// replica's volume its node could not delete).
    RemovedLeaving(String),
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

/// What a request must get right before anything is recorded: names that
/// follow the naming rule, a group's list of volumes, labels that leave
/// the group label to groups.
fn check_request(op: &Op) -> Result<(), Failure> {
    match op {
        Op::CreateVolume {
            name,
            labels,
            replicas,
            ..
        } => {
            lamina_engine::check_name(name)?;
            volumes::check_labels(labels)?;
            volumes::check_replicas(replicas)?;
        }
        Op::SetVolumeLabels { labels, .. } => volumes::check_labels(labels)?,
        Op::Clone { name, .. } => lamina_engine::check_name(name)?,
        Op::CreateSnapshot { name, labels, .. } => {
            lamina_engine::check_name(name)?;
            groups::refuse_group_label(labels)?;
        }
        Op::CreateSnapshotGroup {
            name,
            volumes,
            labels,
        } => groups::check_create(name, volumes, labels)?,
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
    refuse_on_replicas(st, &op).await?;
    if let Some(there) = already_there(st, &op).await {
        return Ok(there);
    }
    let rec = new_record(op);
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
                    let recorded = st.transition_async(rec.clone(), Step::Start).await;
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
                        st.transition_async(rec, Step::End(None)).await?;
                    }
                }
                return result;
            }
            (record_us, apply_us, result)
        } else {
            st.transition_async(rec.clone(), Step::Start).await?;
            let record_us = t0.elapsed().as_micros() as u64;
            hold(st).await;
            let result = apply(st, &rec, false).await;
            let apply_us = (t0.elapsed().as_micros() as u64).saturating_sub(record_us);
            (record_us, apply_us, result)
        };
        let t2 = std::time::Instant::now();
        match &result {
            Ok(o) if o.runs_on(&rec.id) => {}
            Ok(_) => {
                st.transition_async(rec, Step::End(None)).await?;
            }
            Err(f) => {
                let mut rec = rec.clone();
                rec.reason = remote::reason_of(&rec, f);
                let error = Some(f.1.message.clone());
                st.transition_async(rec, Step::End(error)).await?;
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
        return clones::asked_again(st, "", name, source)
            .await
            .ok()
            .flatten();
    }
    let (p, op, st2) = (st.pool.clone(), op.clone(), st.clone());
    blocking(move || {
        Ok(match &op {
            Op::CreateVolume {
                name,
                size,
                labels,
                replicas,
            } => volumes::existing(&p, name, *size, &labels_vec(labels))?
                .filter(|_| volumes::same_replicas(&st2, name, replicas))
                .map(|info| Outcome::Volume {
                    info,
                    created: false,
                }),
            Op::CreateSnapshot {
                volume,
                name,
                labels,
            } => snapshots::existing(&p, volume, name, labels)?.map(|info| Outcome::Snapshot {
                info,
                created: false,
            }),
            Op::CreateSnapshotGroup {
                name,
                volumes,
                labels,
            } => groups::existing(&p, name, volumes, labels)?.map(|members| Outcome::Group {
                members,
                created: false,
            }),
            Op::Clone { name, source, .. } => {
                clones::existing_linked(&p, name, source)?.map(|info| Outcome::Started {
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

/// A delete of what is not there succeeds at once, with nothing recorded.
async fn already_gone(st: &Arc<State>, op: &Op) -> Result<Option<Outcome>, Failure> {
    let (p, op, s) = (st.pool.clone(), op.clone(), st.clone());
    blocking(move || {
        Ok(match &op {
            Op::DeleteVolume { name, .. }
                if p.volume_info_by_name(name).is_err()
                    && crate::front::replica_set(&s.store, &p, name)?.is_none() =>
            {
                Some(Outcome::Removed(false))
            }
            Op::DeleteSnapshot { volume, name }
                if p.snapshot_info_by_name(volume, name).is_err() =>
            {
                Some(Outcome::Removed(false))
            }
            Op::DeleteSnapshotGroup { name, .. } if groups::members(&p, name)?.is_empty() => {
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
    // full clone being copied is answered with it (see clones.rs).
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

/// Another node's replica takes no change of its data or its snapshots
/// but through its front end (the replica sessions, which do not come
/// here): a snapshot made, deleted or reverted to here, or a size changed,
/// would make it differ from the other replicas without the front end
/// knowing. Its labels may change (the CSI node plugin marks a replica it
/// takes over), it may be deleted (a leftover replica, docs/replicas.md)
/// and its snapshots cloned from.
///
/// A volume this node fronts holding no replica of it (docs/replicas.md,
/// "A front end with no replica") is served and deleted here, and nothing
/// else: its snapshots, size, labels and replicas are changed through a
/// front end on one of its replicas' nodes, and a volume made here under
/// its name would hide it. Its record is looked for only where the pool
/// has no volume of the name.
async fn refuse_on_replicas(st: &Arc<State>, op: &Op) -> Result<(), Failure> {
    let replica_guarded = matches!(
        op,
        Op::CreateSnapshot { .. }
            | Op::DeleteSnapshot { .. }
            | Op::Revert { .. }
            | Op::ExpandVolume { .. }
            | Op::CreateSnapshotGroup { .. }
            | Op::DeleteSnapshotGroup { .. }
    );
    // Deleting a volume fronted with no replica deletes every replica
    // (`volumes::delete`).
    let diskless_guarded = !matches!(op, Op::DeleteVolume { .. });
    let (s, volumes): (_, Vec<String>) = (
        st.clone(),
        op.volumes().into_iter().map(str::to_string).collect(),
    );
    let kind = op.kind();
    blocking(move || {
        for v in &volumes {
            match s.pool.volume_info_by_name(v) {
                Ok(info) if replica_guarded => {
                    if let Some(front) = crate::replicas::replica_of(&info) {
                        return Err(Failure::conflict(
                            format!(
                                "volume {v:?} here is a replica of node {front}'s volume: a {kind} changes it only through its front end there"
                            ),
                            &format!("ask node {front}'s daemon (it changes every replica), or, if that node is lost, take the volume over here first: lamina volume attach --take-over"),
                        ));
                    }
                }
                Ok(_) => {}
                Err(_) if diskless_guarded => {
                    let Some(rec) = crate::front::replica_set(&s.store, &s.pool, v)?
                        .filter(|r| r.diskless)
                    else {
                        continue;
                    };
                    let nodes: Vec<&str> = rec.replicas.iter().map(|r| r.node.as_str()).collect();
                    return Err(Failure::conflict(
                        format!(
                            "volume {v:?} is served here by a front end that holds no replica of it: a {kind} is made through a front end on one of its replicas' nodes ({})",
                            nodes.join(", ")
                        ),
                        &format!("detach it here (lamina volume detach {v}), then attach it on one of those nodes with --take-over and ask there"),
                    ));
                }
                Err(_) => {}
            }
        }
        Ok(())
    })
    .await
}

pub(crate) fn labels_vec(labels: &BTreeMap<String, String>) -> Vec<(String, String)> {
    labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// Carry out a recorded operation (first run, or after a restart when
/// `recovering`): the one function of its kind.
async fn apply(st: &Arc<State>, rec: &OpRec, recovering: bool) -> Result<Outcome, Failure> {
    match rec.op.clone() {
        Op::CreateVolume {
            name,
            size,
            labels,
            replicas,
        } => volumes::create(st, name, size, labels, replicas).await,
        Op::SetVolumeLabels { name, labels } => volumes::set_labels(st, name, labels).await,
        Op::ExpandVolume { name, size } => volumes::expand(st, name, size).await,
        Op::DeleteVolume {
            name,
            with_snapshots,
        } => volumes::delete(st, name, with_snapshots, recovering).await,
        Op::CreateSnapshot {
            volume,
            name,
            labels,
        } => snapshots::create(st, volume, name, labels, recovering).await,
        Op::DeleteSnapshot { volume, name } => {
            snapshots::delete(st, volume, name, recovering).await
        }
        Op::Revert { volume, snapshot } => snapshots::revert(st, volume, snapshot).await,
        Op::Flatten { name } => clones::flatten(st, rec, name).await,
        Op::Clone {
            source: CloneSource::Remote { .. },
            ..
        } => remote::clone(st, rec, recovering).await,
        Op::Clone { full: true, .. } => clones::full(st, rec, recovering).await,
        Op::Clone {
            name,
            source,
            full: false,
        } => clones::linked(st, name, source).await,
        Op::CreateSnapshotGroup {
            name,
            volumes,
            labels,
        } => groups::create(st, name, volumes, labels, recovering).await,
        Op::DeleteSnapshotGroup { name, .. } => groups::delete(st, name, recovering).await,
        Op::AddReplica { volume, node } => replicas::add(st, volume, node).await,
        Op::RemoveReplica { volume, node } => replicas::remove(st, volume, node, recovering).await,
    }
}
