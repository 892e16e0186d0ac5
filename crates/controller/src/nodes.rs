//! The node daemons: Secrets in Lamina's namespace labelled
//! `lamina.io/node=NODE`, read and watched by `lamina-node-secrets`. One
//! client and one mirror task per node; a Secret that changes restarts its
//! node's mirror, one that goes stops it.

use crate::ctx::Ctx;
use crate::engine::Engine;
use crate::mirror;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Resource};
use lamina_node_secrets::{node_of, NodeSpec};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Watch the node Secrets until the process ends, keeping one mirror task
/// per node.
pub async fn run(ctx: Arc<Ctx>) {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let mut running: BTreeMap<String, (NodeSpec, tokio::task::JoinHandle<()>)> = BTreeMap::new();
    let mut sets = lamina_node_secrets::watch(api).boxed();
    while let Some(secrets) = sets.next().await {
        let mut want: BTreeMap<String, NodeSpec> = BTreeMap::new();
        for s in secrets.values() {
            match node_of(s) {
                Ok((n, spec)) => {
                    want.insert(n, spec);
                }
                Err(why) => {
                    ctx.event(&s.object_ref(&()), true, "BadNodeSecret", "ReadNode", why)
                        .await
                }
            }
        }
        running.retain(|n, (spec, task)| {
            let keep = want.get(n) == Some(spec);
            if !keep {
                tracing::info!(node = %n, "node gone or changed: stopping its mirror");
                task.abort();
                ctx.engines.write().unwrap().remove(n);
                ctx.views.write().unwrap().remove(n);
                ctx.silent.write().unwrap().remove(n);
            }
            keep
        });
        for (n, spec) in want {
            if running.contains_key(&n) {
                continue;
            }
            let client = match lamina_client::Client::tcp(&spec.endpoint, Some(&spec.token)) {
                Ok(c) => c,
                Err(e) => {
                    let note = format!("node {n}: endpoint {:?}: {e}", spec.endpoint);
                    tracing::warn!("{note}");
                    if let Some(s) = secrets
                        .values()
                        .find(|s| node_of(s).is_ok_and(|x| x.0 == n))
                    {
                        ctx.event(&s.object_ref(&()), true, "BadNodeSecret", "ReadNode", note)
                            .await;
                    }
                    continue;
                }
            };
            let engine = Engine::new(
                &n,
                spec.transfer_address.clone(),
                client,
                ctx.metrics.clone(),
            );
            ctx.engines
                .write()
                .unwrap()
                .insert(n.clone(), engine.clone());
            tracing::info!(node = %n, endpoint = %spec.endpoint, "mirroring node");
            let task = tokio::spawn(mirror::run(ctx.clone(), engine));
            running.insert(n, (spec, task));
        }
        ctx.nodes_known
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
