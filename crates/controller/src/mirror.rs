//! The mirror of one node: long-poll the daemon's change feed; when the
//! sequence moved (or the daemon restarted: a new epoch), list its volumes
//! and snapshots (the only engine calls, plus the latest operation of a
//! volume being cloned) and write to the resources only the differences.
//! An idle daemon costs one pending long poll and nothing else.

use crate::ctx::Ctx;
use crate::engine::Engine;
use crate::error::backoff;
use crate::plan::{self, EngineView};
use crate::Error;
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How long one poll of the change feed waits for a change.
pub const POLL: Duration = Duration::from_secs(60);

pub async fn run(ctx: Arc<Ctx>, engine: Engine) {
    let mut seen: Option<(String, u64)> = None;
    let mut failures = 0u32;
    let mut reported = false;
    loop {
        let after = seen.as_ref().map(|(e, s)| (e.as_str(), *s));
        let step = match engine.changes(after, POLL).await {
            Ok(c) if seen.as_ref() == Some(&(c.epoch.clone(), c.seq)) => Ok(()),
            Ok(c) => sync(&ctx, &engine).await.map(|()| {
                seen = Some((c.epoch, c.seq));
            }),
            Err(e) => Err(e),
        };
        match step {
            Ok(()) => {
                ctx.silent.write().unwrap().remove(&engine.node);
                if reported {
                    tracing::info!(node = %engine.node, "node's daemon answers again");
                }
                failures = 0;
                reported = false;
            }
            Err(e) => {
                ctx.silent
                    .write()
                    .unwrap()
                    .entry(engine.node.clone())
                    .or_insert_with(std::time::Instant::now);
                failures = failures.saturating_add(1);
                tracing::warn!(node = %engine.node, error = %e, "mirroring failed; retrying");
                if !reported {
                    // Once per outage, on every Volume of the node.
                    reported = true;
                    report(&ctx, &engine.node, &e).await;
                }
                tokio::time::sleep(backoff(failures).min(Duration::from_secs(30))).await;
            }
        }
    }
}

/// A failure to reach a node, as an event on each of its Volumes.
async fn report(ctx: &Ctx, node: &str, e: &Error) {
    let vols: Vec<_> = ctx
        .volumes
        .state()
        .into_iter()
        .filter(|v| v.spec.node == node)
        .collect();
    for v in vols {
        ctx.warn(v.as_ref(), "Mirror", e).await;
    }
}

/// List the node and write the differences.
async fn sync(ctx: &Ctx, engine: &Engine) -> Result<(), Error> {
    let started = std::time::Instant::now();
    let volumes = engine.list_volumes().await?;
    let snapshots = engine.list_snapshots().await?;
    let vol_resources = ctx.volumes.state();
    let mut operations = HashMap::new();
    for v in plan::operations_needed(&engine.node, &volumes, &vol_resources) {
        if let Some(op) = engine.latest_operation(&v).await? {
            operations.insert(v, op);
        }
    }
    // Replicas of other nodes' volumes are theirs: not in the view the
    // reconcilers look volumes and snapshots up in either.
    let view = Arc::new(plan::own(&EngineView {
        node: engine.node.clone(),
        volumes,
        snapshots,
        operations,
    }));
    ctx.views
        .write()
        .unwrap()
        .insert(engine.node.clone(), view.clone());
    if vol_resources
        .iter()
        .any(|v| v.spec.node == engine.node && v.metadata.deletion_timestamp.is_some())
    {
        let _ = ctx.kick_volumes.send(());
    }
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let writes = plan::plan(&view, &vol_resources, &ctx.snapshots.state(), &now);
    let count = writes.len();
    if count > 0 {
        tracing::info!(node = %engine.node, writes = count, "mirroring changes");
    }
    // Creates first (a status needs its object), then the rest; each phase
    // a few at a time.
    let (creates, rest): (Vec<_>, Vec<_>) = writes.into_iter().partition(|w| {
        matches!(
            w,
            plan::Write::CreateVolume { .. } | plan::Write::CreateSnapshot { .. }
        )
    });
    let mut first_err = None;
    for phase in [creates, rest] {
        let results: Vec<_> = futures::stream::iter(phase)
            .map(|w| async move { ctx.write(&w).await })
            .buffer_unordered(WRITERS)
            .collect()
            .await;
        for r in results {
            if let Err(e) = r {
                tracing::warn!(error = %e, "mirror write failed");
                first_err.get_or_insert(e);
            }
        }
    }
    tracing::info!(
        node = %engine.node,
        writes = count,
        took_ms = started.elapsed().as_millis() as u64,
        failed = first_err.is_some(),
        "mirrored"
    );
    match first_err {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

/// Writes in flight at once while mirroring.
const WRITERS: usize = 16;
