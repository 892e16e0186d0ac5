//! The replica reconciler: keeps replicated volumes whole when nodes come
//! and go. Every [`EVERY`], from the mirror's last listing of each front
//! end's node (its volumes' `replication`) and what the mirror knows of
//! each node (answering, or silent since when), it decides, purely
//! ([`plan`]), at most one step per volume:
//!
//! * a faulted replica whose node answers, of a volume no client has
//!   attached: its front end is opened for a rebuild (a volume in use
//!   rebuilds its replicas on its own; a detached one waited for its next
//!   attach), by asking the front end's daemon to add the replica it has
//!   (`POST /v1/volumes/{name}/replicas`, which opens the front end of a
//!   detached volume whose replicas are not all healthy);
//! * a replica whose front end reaches it at another address than its
//!   node Secret's transfer address (a volume taken over by a node whose
//!   node list lacked it, or a node pod back with a new IP): the front
//!   end's node list is given the Secret's (`PUT /v1/nodes/{name}`), which
//!   its front end uses from its next connection;
//! * a replica faulted for longer than the replacement delay, on a node
//!   silent for as long (its daemon does not answer, or its node Secret is
//!   gone), or a detached volume's replica still healthy on a node silent
//!   for as long (its front end sent it nothing since): it is replaced, removed from the volume and a new one added on
//!   another node that answers, holds no replica of the volume, has a
//!   transfer address and has the most free space (a full sparse copy).
//!
//! This module owns those decisions and their calls to the front ends'
//! daemons; it must not change the resources (the mirror shows what the
//! daemons then record) nor decide how a replica is rebuilt (the daemon
//! does).

use crate::ctx::Ctx;
use crate::engine::Engine;
use lamina_api as api;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// How often the reconciler looks.
pub const EVERY: Duration = Duration::from_secs(5);

/// A node as the controller knows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeState {
    /// Its daemon answered the mirror's last call.
    pub answers: bool,
    /// How long it has not answered (None while it answers).
    pub silent_for: Option<Duration>,
    /// The transfer address its node Secret names.
    pub transfer: Option<String>,
}

/// One step on a replicated volume, asked of its front end's daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Open the front end of detached volume `volume` so that its replica
    /// on `node` is rebuilt.
    Rebuild {
        front: String,
        volume: String,
        node: String,
    },
    /// Replace the replica on `gone` with one on the roomiest of
    /// `candidates` that answers.
    Replace {
        front: String,
        volume: String,
        gone: String,
        candidates: Vec<String>,
    },
    /// Put node `node` in front end `front`'s node list at `address`
    /// (its Secret's), where a replica of `volume` is.
    Introduce {
        front: String,
        volume: String,
        node: String,
        address: String,
    },
    /// Add a replica on the roomiest of `candidates` that answers: the
    /// volume has fewer than its StorageClass asked for.
    Add {
        front: String,
        volume: String,
        candidates: Vec<String>,
    },
}

/// Seconds since the Unix epoch of an RFC 3339 time, if it parses.
fn unix(t: &str) -> Option<i64> {
    t.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_second())
}

/// The steps for the volumes each front end's node lists (`(node,
/// volumes)`), at `now` (Unix seconds), with replicas replaced after
/// `after`. A node not in `nodes` is unknown to the controller (its
/// Secret gone): silent for as long as anyone can tell.
pub fn plan(
    fronts: &[(String, Vec<api::Volume>)],
    nodes: &BTreeMap<String, NodeState>,
    now: i64,
    after: Duration,
) -> Vec<Step> {
    let mut out = Vec::new();
    for (front, volumes) in fronts {
        for v in volumes {
            let Some(r) = &v.replication else { continue };
            let holders: Vec<&str> = r.replicas.iter().map(|x| x.node.as_str()).collect();
            let candidates = || -> Vec<String> {
                nodes
                    .iter()
                    .filter(|(n, s)| {
                        s.answers
                            && s.transfer.is_some()
                            && n != &front
                            && !holders.contains(&n.as_str())
                    })
                    .map(|(n, _)| n.clone())
                    .collect()
            };
            // Reached where its Secret says: checked first, as a rebuild
            // or a replacement needs the front end to reach its replicas.
            let misaddressed = r.replicas.iter().find_map(|x| {
                let secret = nodes.get(&x.node)?.transfer.as_ref()?;
                (&x.node != front && x.address.as_ref() != Some(secret))
                    .then(|| (x.node.clone(), secret.clone()))
            });
            if let Some((node, address)) = misaddressed {
                out.push(Step::Introduce {
                    front: front.clone(),
                    volume: v.name.clone(),
                    node,
                    address,
                });
                continue;
            }
            let wanted = v
                .labels
                .get(api::REPLICAS_WANTED_LABEL)
                .and_then(|w| w.parse::<usize>().ok())
                .unwrap_or(0);
            if r.replicas.len() < wanted {
                let candidates = candidates();
                if !candidates.is_empty() {
                    out.push(Step::Add {
                        front: front.clone(),
                        volume: v.name.clone(),
                        candidates,
                    });
                }
                continue;
            }
            for x in r.replicas.iter().filter(|x| &x.node != front) {
                let node = nodes.get(&x.node);
                let silent = node.map_or(Some(Duration::MAX), |n| n.silent_for);
                let gone_long = silent.is_some_and(|s| s >= after);
                let replace = match x.state {
                    api::ReplicaState::Faulted if node.is_some_and(|n| n.answers) => {
                        if v.export.is_none() {
                            out.push(Step::Rebuild {
                                front: front.clone(),
                                volume: v.name.clone(),
                                node: x.node.clone(),
                            });
                            break;
                        }
                        continue;
                    }
                    api::ReplicaState::Faulted => {
                        let faulted_for = unix(&x.since)
                            .map(|s| now.saturating_sub(s).max(0) as u64)
                            .unwrap_or(0);
                        Duration::from_secs(faulted_for) >= after && gone_long
                    }
                    // Healthy as far as its front end knows, which has sent
                    // it nothing since its node went (a detached volume:
                    // one in use faults it at its next write).
                    api::ReplicaState::Healthy => v.export.is_none() && gone_long,
                    api::ReplicaState::Rebuilding => false,
                };
                if !replace {
                    continue;
                }
                let candidates = candidates();
                if candidates.is_empty() {
                    continue;
                }
                out.push(Step::Replace {
                    front: front.clone(),
                    volume: v.name.clone(),
                    gone: x.node.clone(),
                    candidates,
                });
                break;
            }
        }
    }
    out
}

/// Run the reconciler until the process ends, replacing replicas after
/// `after`.
pub async fn run(ctx: Arc<Ctx>, after: Duration) {
    loop {
        tokio::time::sleep(EVERY).await;
        let fronts: Vec<(String, Vec<api::Volume>)> = {
            let views = ctx.views.read().unwrap();
            views
                .iter()
                .map(|(n, v)| (n.clone(), v.volumes.clone()))
                .collect()
        };
        let nodes = ctx.node_states();
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        for step in plan(&fronts, &nodes, now, after) {
            if let Err(e) = take(&ctx, &step).await {
                tracing::warn!(?step, error = %e, "replica step failed; trying again later");
            }
        }
    }
}

async fn take(ctx: &Ctx, step: &Step) -> Result<(), crate::Error> {
    let engine = |n: &str| ctx.engine(n);
    match step {
        Step::Rebuild {
            front,
            volume,
            node,
        } => {
            let Some(f) = engine(front) else {
                return Ok(());
            };
            tracing::info!(volume, replica = %node, "rebuilding a detached volume's returned replica");
            f.add_replica(volume, node).await.map(drop)
        }
        Step::Replace {
            front,
            volume,
            gone,
            candidates,
        } => {
            let Some(f) = engine(front) else {
                return Ok(());
            };
            f.remove_replica(volume, gone).await?;
            let Some(to) = add_somewhere(ctx, &f, volume, candidates).await? else {
                return Ok(());
            };
            let note = format!(
                "volume {volume}'s replica on node {gone}, silent too long, was replaced by one on node {to}"
            );
            tracing::info!("{note}");
            ctx.volume_event(volume, false, "Replaced", note).await;
            Ok(())
        }
        Step::Introduce {
            front,
            volume,
            node,
            address,
        } => {
            let Some(f) = engine(front) else {
                return Ok(());
            };
            tracing::info!(volume, front = %front, node = %node, address = %address, "giving a front end its replica's node address");
            f.put_node(node, address).await
        }
        Step::Add {
            front,
            volume,
            candidates,
        } => {
            let Some(f) = engine(front) else {
                return Ok(());
            };
            let Some(to) = add_somewhere(ctx, &f, volume, candidates).await? else {
                return Ok(());
            };
            let note = format!(
                "volume {volume} had fewer replicas than its StorageClass asks for: one was added on node {to}"
            );
            tracing::info!("{note}");
            ctx.volume_event(volume, false, "ReplicaAdded", note).await;
            Ok(())
        }
    }
}

/// Add a replica of `volume` through its front end's daemon `f` on one of
/// `candidates`: the roomiest that answers first, then the next when the
/// add fails there (a node holding a leftover volume of that name refuses
/// it). The node it went to; None when no candidate answers (the last
/// failure is the error when every one refused).
async fn add_somewhere(
    ctx: &Ctx,
    f: &Engine,
    volume: &str,
    candidates: &[String],
) -> Result<Option<String>, crate::Error> {
    let mut last = None;
    for (to, address) in by_room(ctx, candidates).await {
        let added = async {
            f.put_node(&to, &address).await?;
            f.add_replica(volume, &to).await
        };
        match added.await {
            Ok(_) => return Ok(Some(to)),
            Err(e) => {
                tracing::warn!(volume, node = %to, error = %e, "a replica could not be added there; trying the next node");
                last = Some(e);
            }
        }
    }
    last.map_or(Ok(None), Err)
}

/// The candidates that answer, with their transfer addresses, the most
/// free space first.
async fn by_room(ctx: &Ctx, candidates: &[String]) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for c in candidates {
        let Some(e) = ctx.engine(c) else { continue };
        let Some(address) = e.transfer_address.clone() else {
            continue;
        };
        if let Ok(free) = e.free_bytes().await {
            found.push((free, c.clone(), address));
        }
    }
    found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    found.into_iter().map(|(_, n, a)| (n, a)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(node: &str, state: api::ReplicaState, since: &str) -> api::ReplicaInfo {
        api::ReplicaInfo {
            node: node.into(),
            // The front end's ("a") has none; the others are reached where
            // their Secrets say.
            address: (node != "a").then(|| "addr".into()),
            state,
            reason: None,
            since: since.into(),
            rebuild: None,
            last_rebuild: None,
        }
    }

    fn volume(attached: bool, replicas: Vec<api::ReplicaInfo>) -> api::Volume {
        api::Volume {
            id: 1,
            name: "v".into(),
            size: 1 << 20,
            created: "2026-12-07T10:00:00Z".into(),
            allocated_bytes: 0,
            exclusive_bytes: 0,
            shared_bytes: 0,
            parent_snapshot: None,
            origin: None,
            clone_state: api::CloneState::None,
            export: attached.then(|| api::Export {
                uri: "nbd://x/v".into(),
                name: "v".into(),
                read_only: false,
                connections: 1,
                file: None,
            }),
            operation: None,
            labels: Default::default(),
            replication: Some(api::Replication {
                generation: 2,
                state: api::ReplicationState::Degraded,
                replicas,
                diskless: false,
            }),
        }
    }

    fn up() -> NodeState {
        NodeState {
            answers: true,
            silent_for: None,
            transfer: Some("addr".into()),
        }
    }

    fn down(secs: u64) -> NodeState {
        NodeState {
            answers: false,
            silent_for: Some(Duration::from_secs(secs)),
            transfer: Some("addr".into()),
        }
    }

    const T0: &str = "2026-12-07T10:00:00Z";

    #[test]
    fn a_returned_replica_of_a_detached_volume_is_rebuilt_and_of_one_in_use_left_to_its_front_end()
    {
        use api::ReplicaState::*;
        let now = unix(T0).unwrap() + 30;
        let nodes: BTreeMap<String, NodeState> =
            [("a".into(), up()), ("b".into(), up()), ("c".into(), up())].into();
        let r = vec![replica("a", Healthy, T0), replica("b", Faulted, T0)];
        let after = Duration::from_secs(600);
        assert_eq!(
            plan(
                &[("a".into(), vec![volume(false, r.clone())])],
                &nodes,
                now,
                after
            ),
            [Step::Rebuild {
                front: "a".into(),
                volume: "v".into(),
                node: "b".into()
            }]
        );
        assert_eq!(
            plan(&[("a".into(), vec![volume(true, r)])], &nodes, now, after),
            []
        );
        // Rebuilding already: nothing to do.
        let r = vec![replica("a", Healthy, T0), replica("b", Rebuilding, T0)];
        assert_eq!(
            plan(&[("a".into(), vec![volume(false, r)])], &nodes, now, after),
            []
        );
    }

    #[test]
    fn a_replica_is_replaced_only_once_both_it_and_its_node_have_been_gone_long_enough() {
        use api::ReplicaState::*;
        let after = Duration::from_secs(600);
        let t0 = unix(T0).unwrap();
        let r = vec![
            replica("a", Healthy, T0),
            replica("b", Faulted, T0),
            replica("c", Healthy, T0),
        ];
        let fronts = [("a".to_string(), vec![volume(true, r)])];
        let nodes = |b: NodeState| -> BTreeMap<String, NodeState> {
            [
                ("a".into(), up()),
                ("b".into(), b),
                ("c".into(), up()),
                ("d".into(), up()),
                (
                    "e".into(),
                    NodeState {
                        transfer: None,
                        ..up()
                    },
                ),
            ]
            .into()
        };
        // Faulted long ago, but its node silent only for a minute: wait.
        assert_eq!(plan(&fronts, &nodes(down(60)), t0 + 3600, after), []);
        // Its node silent long enough, but faulted only now: wait.
        assert_eq!(plan(&fronts, &nodes(down(3600)), t0 + 60, after), []);
        let replace = Step::Replace {
            front: "a".into(),
            volume: "v".into(),
            gone: "b".into(),
            // Not a (the front end), b or c (holding one), e (no transfer
            // address).
            candidates: vec!["d".into()],
        };
        assert_eq!(
            plan(&fronts, &nodes(down(600)), t0 + 600, after),
            std::slice::from_ref(&replace)
        );
        // A node whose Secret is gone is as silent as can be.
        let mut gone = nodes(down(0));
        gone.remove("b");
        assert_eq!(plan(&fronts, &gone, t0 + 600, after), [replace]);
        // Nowhere to go: nothing.
        let mut full = nodes(down(600));
        full.remove("d");
        assert_eq!(plan(&fronts, &full, t0 + 600, after), []);
        // Still healthy (its front end, detached, sent it nothing since
        // its node went): replaced once the node has been silent long
        // enough, whenever it became healthy.
        let r = vec![
            replica("a", Healthy, T0),
            replica("b", Healthy, T0),
            replica("c", Healthy, T0),
        ];
        let detached = [("a".to_string(), vec![volume(false, r.clone())])];
        assert_eq!(plan(&detached, &nodes(down(60)), t0 + 3600, after), []);
        // In use: left to its front end, which faults it at its next write.
        let attached = [("a".to_string(), vec![volume(true, r)])];
        assert_eq!(plan(&attached, &nodes(down(600)), t0 + 600, after), []);
        assert_eq!(
            plan(&detached, &nodes(down(600)), t0 + 600, after),
            [Step::Replace {
                front: "a".into(),
                volume: "v".into(),
                gone: "b".into(),
                candidates: vec!["d".into()],
            }]
        );
    }

    #[test]
    fn a_volume_short_of_the_replicas_its_class_asks_for_gets_one_added() {
        use api::ReplicaState::*;
        let t0 = unix(T0).unwrap();
        let nodes: BTreeMap<String, NodeState> =
            [("a".into(), up()), ("b".into(), up()), ("c".into(), up())].into();
        let mut v = volume(
            true,
            vec![replica("a", Healthy, T0), replica("b", Healthy, T0)],
        );
        let after = Duration::from_secs(600);
        // No count recorded (made without the CSI driver): as it is.
        assert_eq!(
            plan(&[("a".into(), vec![v.clone()])], &nodes, t0, after),
            []
        );
        v.labels
            .insert(api::REPLICAS_WANTED_LABEL.into(), "3".into());
        assert_eq!(
            plan(&[("a".into(), vec![v.clone()])], &nodes, t0, after),
            [Step::Add {
                front: "a".into(),
                volume: "v".into(),
                candidates: vec!["c".into()]
            }]
        );
        v.labels
            .insert(api::REPLICAS_WANTED_LABEL.into(), "2".into());
        assert_eq!(plan(&[("a".into(), vec![v])], &nodes, t0, after), []);
    }

    #[test]
    fn a_replica_reached_elsewhere_than_its_secret_says_gets_its_address_first() {
        use api::ReplicaState::*;
        let t0 = unix(T0).unwrap();
        let nodes: BTreeMap<String, NodeState> =
            [("a".into(), up()), ("b".into(), up()), ("c".into(), up())].into();
        let after = Duration::from_secs(600);
        // Taken over by a, whose node list lacked b: b's recorded address
        // stands in, and the rebuild would fail there.
        let mut b = replica("b", Faulted, T0);
        b.address = Some("unlisted:0".into());
        let v = volume(false, vec![replica("a", Healthy, T0), b.clone()]);
        let introduce = Step::Introduce {
            front: "a".into(),
            volume: "v".into(),
            node: "b".into(),
            address: "addr".into(),
        };
        assert_eq!(
            plan(&[("a".into(), vec![v])], &nodes, t0, after),
            std::slice::from_ref(&introduce)
        );
        // A node without a Secret's address is left as it is.
        let mut no_secret = nodes.clone();
        no_secret.insert(
            "b".into(),
            NodeState {
                transfer: None,
                ..up()
            },
        );
        let v = volume(false, vec![replica("a", Healthy, T0), b]);
        assert_eq!(
            plan(&[("a".into(), vec![v])], &no_secret, t0, after),
            [Step::Rebuild {
                front: "a".into(),
                volume: "v".into(),
                node: "b".into()
            }]
        );
    }
}
