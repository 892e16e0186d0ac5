//! Clones and flattens as operations: a linked clone is one engine call; a
//! full clone records what it copies, makes the new volume and starts its
//! copy (`jobs::copy`); a flatten starts the engine's and its watch
//! (`jobs::flatten`). Both jobs end the operation.

use super::Outcome;
use crate::error::Failure;
use crate::jobs;
use crate::state::{blocking, State, Step};
use crate::store::{CloneSource, CopyRec, Op, OpRec};
use lamina_api::OperationState;
use std::sync::Arc;

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

/// A linked clone of `source`, or the one asked for already.
pub(super) async fn linked(
    st: &Arc<State>,
    name: String,
    source: CloneSource,
) -> Result<Outcome, Failure> {
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
pub(super) fn existing_linked(
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
pub(super) async fn asked_again(
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
pub(super) async fn full(
    st: &Arc<State>,
    rec: &OpRec,
    recovering: bool,
) -> Result<Outcome, Failure> {
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
                    CopyRec::new(volume, snapshot, false)
                }
                CloneSource::Remote { .. } => {
                    return Err(Failure::internal("a remote clone is not a local copy"))
                }
                CloneSource::Volume { volume } => {
                    let s = p2.create_system_snapshot(&volume, &n2)?;
                    CopyRec::new(volume, s.name, true)
                }
            })
        })
        .await?;
        rec.copy = Some(copy.clone());
        if let Err(f) = st.transition_async(rec.clone(), Step::Progress).await {
            // Not recorded, so nothing may be left: not the system
            // snapshot taken for it either.
            jobs::copy::release(st, &copy, &rec.id);
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
            jobs::copy::release(st, &copy, &rec.id);
            return Err(f);
        }
    };
    jobs::copy::start(st, &rec, &name)?;
    Ok(Outcome::Started {
        info,
        created: !recovering,
        running: Some(rec.id.clone()),
    })
}

/// Start the engine's flatten of volume `name` and its watch, which ends
/// operation `rec`.
pub(super) async fn flatten(
    st: &Arc<State>,
    rec: &OpRec,
    name: String,
) -> Result<Outcome, Failure> {
    let p = st.pool.clone();
    let (p2, n2) = (p.clone(), name.clone());
    let progress = blocking(move || Ok(p2.flatten(&n2)?)).await?;
    let info = blocking(move || Ok(p.volume_info_by_name(&name)?)).await?;
    jobs::flatten::watch(st, rec, progress)?;
    Ok(Outcome::Started {
        info,
        created: false,
        running: Some(rec.id.clone()),
    })
}
