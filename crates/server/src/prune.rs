//! Bulk pruning of a volume's snapshots (`POST
//! /v1/volumes/{name}/prune-snapshots`): which snapshots a prune matches,
//! which it keeps and why, and what deleting them frees. What it may delete
//! follows a schedule's retention rules (never a system snapshot, never one
//! that is pinned: `schedules::runner::pinned`), and each delete goes
//! through the one operation path. It calls operations and the schedules'
//! rules; the HTTP handler (`space.rs`) only reads the request and answers,
//! so any other caller prunes the same way.

use crate::error::Failure;
use crate::operations;
use crate::schedules::runner::{pinned, slot_of};
use crate::state::{blocking, rfc3339, State};
use crate::store::Op;
use lamina_api as api;
use std::sync::Arc;

/// A snapshot a prune matched.
struct Matched {
    info: lamina_engine::SnapshotInfo,
    pinned: Option<String>,
}

/// Prune `volume`'s snapshots as `req` says (or, in a dry run, say what
/// that would delete and free).
pub async fn prune(
    st: &Arc<State>,
    volume: String,
    req: api::PruneSnapshots,
) -> Result<api::PruneResult, Failure> {
    if req.selector.is_none() && req.older_than_seconds.is_none() && req.schedule.is_none() {
        return Err(Failure::invalid(
            "a prune needs at least one filter (a selector, an age or a schedule): without one it would match every snapshot",
        ));
    }
    let selector = match &req.selector {
        Some(s) => Some(
            api::LabelSelector::parse(s)
                .map_err(|e| Failure::invalid(format!("selector {s:?}: {e}")))?,
        ),
        None => None,
    };
    // Schedules take and delete snapshots under this lock too: a prune and a
    // run of retention never interleave.
    let _changes = st.schedules.changes.lock().await;
    let now = st.schedules.clock.now();
    let (s, vol) = (st.clone(), volume.clone());
    let schedule = req.schedule.clone();
    let matched = blocking(move || {
        let schedule = match &schedule {
            Some(name) => Some(s.store.schedule_id(name)?),
            None => None,
        };
        let mut out: Vec<Matched> = s
            .pool
            .list_snapshots(&vol)?
            .into_iter()
            .filter(|x| !x.system)
            .filter(|x| {
                let labels = x.labels.iter().cloned().collect();
                selector.as_ref().is_none_or(|sel| sel.matches(&labels))
                    && schedule
                        .as_ref()
                        .is_none_or(|id| labels.get(api::SCHEDULE_LABEL) == Some(id))
                    && req.older_than_seconds.is_none_or(|age| {
                        // An age past i64 is older than anything.
                        now.saturating_sub(slot_of(x)) > i64::try_from(age).unwrap_or(i64::MAX)
                    })
            })
            .map(|info| Matched {
                pinned: pinned(&s, &vol, &info),
                info,
            })
            .collect();
        out.sort_by_key(|m| (slot_of(&m.info), m.info.created, m.info.id));
        Ok(out)
    })
    .await?;
    let mut kept = Vec::new();
    let mut go = Vec::new();
    for m in matched {
        match m.pinned {
            Some(reason) => kept.push(api::KeptSnapshot {
                snapshot: m.info.name,
                reason,
            }),
            None => go.push(m.info),
        }
    }
    let mut result = api::PruneResult {
        volume: volume.clone(),
        dry_run: req.dry_run,
        deleted: Vec::new(),
        kept,
        freed_bytes: 0,
    };
    let pruned = |x: &lamina_engine::SnapshotInfo| api::PrunedSnapshot {
        name: x.name.clone(),
        created: rfc3339(x.created),
        exclusive_bytes: x.exclusive_bytes,
    };
    if req.dry_run {
        let (s, vol) = (st.clone(), volume.clone());
        let names: Vec<String> = go.iter().map(|x| x.name.clone()).collect();
        let freed = blocking(move || Ok(s.pool.freed_by_deleting(&vol, &names)?)).await?;
        result.freed_bytes = freed.data_bytes + freed.metadata_bytes;
        result.deleted = go.iter().map(pruned).collect();
        return Ok(result);
    }
    // One at a time, each after measuring what it frees then: the sum is
    // what deleting the set frees (the last of the blocks they share only
    // among themselves is counted by the delete that frees it).
    for x in go {
        let (s, vol, name) = (st.clone(), volume.clone(), x.name.clone());
        let frees = blocking(move || {
            let u = s.pool.usage(&vol, Some(&name))?;
            Ok(u.exclusive_bytes + u.exclusive_metadata_bytes)
        })
        .await;
        let op = Op::DeleteSnapshot {
            volume: volume.clone(),
            name: x.name.clone(),
        };
        let outcome = match frees {
            Ok(frees) => operations::run(st, op).await.map(|_| frees),
            Err(f) => Err(f),
        };
        match outcome {
            Ok(frees) => {
                result.freed_bytes += frees;
                result.deleted.push(pruned(&x));
            }
            Err(f) => result.kept.push(api::KeptSnapshot {
                snapshot: x.name.clone(),
                reason: format!("its delete failed: {}", f.1.message),
            }),
        }
    }
    Ok(result)
}
