//! The Snapshot reconciler. A resource with createSnapshot=true whose
//! snapshot was not taken yet takes it (the daemon's create is idempotent
//! by name, so a retry or a second controller never makes two). Deleting a
//! resource deletes the engine snapshot first (also one whose volume was
//! deleted: it outlives its volume), then releases the finalizer.
//! Everything else in a Snapshot's status is the mirror's.

use crate::crd::Snapshot;
use crate::ctx::{Ctx, Located};
use crate::error::backoff;
use crate::plan::{snapshot_status, Write};
use crate::{Error, FINALIZER};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{finalizer, Event};
use kube::ResourceExt;
use lamina_api as api;
use std::sync::Arc;

fn key(s: &Snapshot) -> String {
    format!("Snapshot/{}", s.name_any())
}

pub async fn reconcile(s: Arc<Snapshot>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let k = key(&s);
    if !s.finalizers().iter().any(|f| f == FINALIZER) && s.metadata.deletion_timestamp.is_none() {
        ctx.metrics.api_write("Snapshot", "finalizer");
    }
    let api = ctx.snapshot_api();
    let c = ctx.clone();
    let r = finalizer(&api, FINALIZER, s, |ev| async move {
        match ev {
            Event::Apply(s) => take(&s, &c).await,
            Event::Cleanup(s) => {
                let r = remove(&s, &c).await;
                if r.is_ok() {
                    c.metrics.api_write("Snapshot", "release");
                }
                r
            }
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    if r.is_ok() {
        ctx.succeeded(&k);
    }
    r
}

pub fn error_policy(s: Arc<Snapshot>, e: &Error, ctx: Arc<Ctx>) -> Action {
    let n = ctx.failed(&key(&s));
    tracing::debug!(snapshot = %s.name_any(), error = %e, failures = n, "retrying");
    Action::requeue(backoff(n))
}

/// Take the snapshot if asked and not taken yet.
async fn take(s: &Snapshot, ctx: &Ctx) -> Result<Action, Error> {
    let status = s.status.clone().unwrap_or_default();
    if !s.spec.create_snapshot || status.creation_time.is_some() {
        return Ok(Action::await_change());
    }
    let engine = match ctx.locate(&s.spec.volume) {
        Located::On(e) => e,
        Located::Gone => {
            let e = Error::Refused(format!(
                "volume {} does not exist on any node: the snapshot cannot be taken",
                s.spec.volume
            ));
            fail(s, ctx, &e, "VolumeMissing").await;
            return Err(e);
        }
        Located::Unknown => {
            return Err(Error::NotYet(format!(
                "not every node has been listed yet to find volume {}",
                s.spec.volume
            )))
        }
    };
    let req = api::CreateSnapshot {
        name: s.engine_name().to_string(),
        labels: s.spec.labels.clone(),
        freeze: false,
    };
    match engine.create_snapshot(&s.spec.volume, &req).await {
        Ok(taken) => {
            let status = snapshot_status(&engine.node, &taken);
            ctx.write(&Write::SnapshotStatus {
                name: s.name_any(),
                status,
            })
            .await?;
            ctx.event(
                &kube::Resource::object_ref(s, &()),
                false,
                "Taken",
                "TakeSnapshot",
                format!(
                    "snapshot {} of volume {} on node {}",
                    req.name, s.spec.volume, engine.node
                ),
            )
            .await;
            Ok(Action::await_change())
        }
        Err(e) => {
            let reason = e.reason();
            fail(s, ctx, &e, reason).await;
            Err(e)
        }
    }
}

/// An event and the error in the status (written only if it changed).
async fn fail(s: &Snapshot, ctx: &Ctx, e: &Error, reason: &str) {
    ctx.event(
        &kube::Resource::object_ref(s, &()),
        true,
        reason,
        "TakeSnapshot",
        e.to_string(),
    )
    .await;
    let old = s.status.clone().unwrap_or_default();
    let status = crate::crd::SnapshotStatus {
        ready_to_use: false,
        error: Some(e.to_string()),
        ..old
    };
    record_error(s, ctx, status).await;
}

/// Write a status carrying an error, only if it differs from the one the
/// resource has; a failed write is logged (the error is still returned to
/// the reconciler, which retries).
async fn record_error(s: &Snapshot, ctx: &Ctx, status: crate::crd::SnapshotStatus) {
    if s.status.as_ref() == Some(&status) {
        return;
    }
    let w = Write::SnapshotStatus {
        name: s.name_any(),
        status,
    };
    if let Err(e) = ctx.write(&w).await {
        tracing::warn!(error = %e, "could not record a snapshot's error");
    }
}

/// Delete the engine snapshot; the finalizer goes once it is gone.
async fn remove(s: &Snapshot, ctx: &Ctx) -> Result<Action, Error> {
    let id = s.status.as_ref().and_then(|st| st.id);
    let (engine, volume) = match ctx.locate_snapshot(&s.spec.volume, s.engine_name(), id) {
        (Located::On(e), volume) => (e, volume),
        // Not on any node: deleted already, or never taken.
        (Located::Gone, _) => return Ok(Action::await_change()),
        (Located::Unknown, _) => {
            return Err(Error::NotYet(format!(
                "not every node has been listed yet to find snapshot {} of volume {}",
                s.engine_name(),
                s.spec.volume
            )))
        }
    };
    match engine.delete_snapshot(&volume, s.engine_name()).await {
        Ok(_) => Ok(Action::await_change()),
        Err(e) => {
            ctx.warn(s, "DeleteSnapshot", &e).await;
            let status = crate::crd::SnapshotStatus {
                mark_removed: true,
                error: Some(e.to_string()),
                ..s.status.clone().unwrap_or_default()
            };
            record_error(s, ctx, status).await;
            Err(e)
        }
    }
}
