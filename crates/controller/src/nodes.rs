//! The node daemons: Secrets in Lamina's namespace labelled
//! `lamina.io/node=NODE` with keys `endpoint` (http://host:port) and
//! `token`. One client and one mirror task per node; a Secret that changes
//! restarts its node's mirror, one that goes stops it.

use crate::crd::NODE_LABEL;
use crate::ctx::Ctx;
use crate::engine::Engine;
use crate::mirror;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A node as its Secret describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    pub endpoint: String,
    pub token: String,
}

/// The node's name and daemon from a Secret, or why it cannot be used.
pub fn node_of(s: &Secret) -> Result<(String, NodeSpec), String> {
    let name = s
        .labels()
        .get(NODE_LABEL)
        .filter(|n| !n.is_empty())
        .cloned()
        .unwrap_or_else(|| s.name_any());
    let field = |k: &str| -> Result<String, String> {
        let d = s.data.as_ref().and_then(|d| d.get(k));
        let sd = s.string_data.as_ref().and_then(|d| d.get(k));
        match (d, sd) {
            (Some(b), _) => String::from_utf8(b.0.clone())
                .map(|v| v.trim().to_string())
                .map_err(|_| format!("key {k} is not UTF-8")),
            (None, Some(v)) => Ok(v.trim().to_string()),
            (None, None) => Err(format!("Secret {} has no key {k}", s.name_any())),
        }
    };
    Ok((
        name,
        NodeSpec {
            endpoint: field("endpoint")?,
            token: field("token")?,
        },
    ))
}

/// Watch the node Secrets until the process ends, keeping one mirror task
/// per node.
pub async fn run(ctx: Arc<Ctx>) {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let cfg = watcher::Config::default().labels(NODE_LABEL);
    let mut secrets: BTreeMap<String, Secret> = BTreeMap::new();
    let mut running: BTreeMap<String, (NodeSpec, tokio::task::JoinHandle<()>)> = BTreeMap::new();
    let mut stream = watcher(api, cfg).boxed();
    let mut init: Option<BTreeMap<String, Secret>> = None;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Init) => init = Some(BTreeMap::new()),
            Ok(watcher::Event::InitApply(s)) => {
                if let Some(i) = init.as_mut() {
                    i.insert(s.name_any(), s);
                }
            }
            Ok(watcher::Event::InitDone) => secrets = init.take().unwrap_or_default(),
            Ok(watcher::Event::Apply(s)) => {
                secrets.insert(s.name_any(), s);
            }
            Ok(watcher::Event::Delete(s)) => {
                secrets.remove(&s.name_any());
            }
            Err(e) => {
                tracing::warn!(error = %e, "watching node Secrets");
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                continue;
            }
        }
        if init.is_some() {
            continue;
        }
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
            let engine = Engine::new(&n, client, ctx.metrics.clone());
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
