//! Recovery at start: what a killed daemon left running is run again
//! (each operation is idempotent by name) and ended, and what nothing
//! needs any more goes.

use super::apply;
use crate::error::ServerError;
use crate::state::{blocking, State, Step};
use lamina_api as api;
use std::sync::Arc;
use tracing::Instrument;

/// Finish what a killed daemon left running. First the system
/// snapshots nothing needs any more go (a crash can leave one between a
/// clone's end and its snapshot's deletion).
pub async fn recover(st: &Arc<State>) -> Result<(), ServerError> {
    let s = st.clone();
    let ops = blocking(move || {
        let ops = s.store.ops()?;
        let in_use: Vec<(String, String)> = ops
            .iter()
            .filter(|o| o.state == api::OperationState::Running)
            .filter_map(|o| o.copy.as_ref().map(|c| (c.volume.clone(), c.snapshot.clone())))
            .collect();
        // And the bases and round targets of replicas' rebuilds.
        let mut in_use = in_use;
        for (vol, set) in s.store.replica_sets()? {
            for rb in set.replicas.iter().filter_map(|r| r.rebuild.as_ref()) {
                in_use.push((vol.clone(), rb.base.clone()));
                if let Some(t) = &rb.round {
                    in_use.push((vol.clone(), t.target.clone()));
                }
            }
        }
        for (vol, snap) in s.pool.unneeded_system_snapshots() {
            if !in_use.contains(&(vol.clone(), snap.clone())) {
                tracing::info!(volume = %vol, snapshot = %snap, "deleting a system snapshot nothing needs");
                s.pool.delete_system_snapshot(&vol, &snap)?;
            }
        }
        Ok(ops)
    })
    .await
    .map_err(ServerError::from)?;
    for rec in ops
        .into_iter()
        .filter(|o| o.state == api::OperationState::Running)
    {
        let span = tracing::info_span!("recover", id = %rec.id, kind = %rec.op.kind(), volume = %rec.volume());
        async {
            tracing::info!("finishing an operation interrupted by a restart");
            let r = apply(st, &rec, true).await;
            let end = match r {
                Ok(o) if o.runs_on(&rec.id) => return Ok(()), // its job marks it done
                Ok(_) => Step::End(None),
                Err(f) => Step::End(Some(format!("after a restart: {}", f.1.message))),
            };
            st.transition_async(rec.clone(), end)
                .await
                .map(|_| ())
                .map_err(ServerError::from)
        }
        .instrument(span)
        .await?;
    }
    // The received counts of pulls that are not running any more (one
    // that failed just now, or before the last stop) go.
    let s = st.clone();
    blocking(move || {
        let ops = s.store.ops()?;
        let running: Vec<&str> = ops
            .iter()
            .filter(|o| o.state == api::OperationState::Running)
            .map(|o| o.id.as_str())
            .collect();
        crate::jobs::pull::sweep_received(&s, &running);
        Ok(())
    })
    .await
    .map_err(ServerError::from)
}
