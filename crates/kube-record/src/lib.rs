//! The replica sets' shared record under Kubernetes (docs/replicas.md, "The
//! shared record"): a replicated volume's front end, generation and healthy
//! replicas kept in its Volume resource's `status.replicaSet`, where the
//! whole cluster agrees on them through the API server (Lamina builds no
//! consensus of its own). This crate owns how a daemon changes that field:
//! a read, a check that this node still holds the volume, and a merge patch
//! with the read's resourceVersion as precondition, tried again on a
//! conflict. It implements the daemon's [`SharedRecord`] seam and must not
//! touch anything else of the resource (the controllers' mirror writes the
//! rest) nor make a Volume resource (the mirror does).

use lamina_controller::crd::{SharedReplica, SharedReplicaSet, Volume};
use lamina_server::{SharedRecord, SharedRecordError, SharedSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as sync_mpsc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::Instrument;

/// How long a change is tried (the API server out of reach, the Volume
/// resource not made yet, conflicts) before it fails as unavailable.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(20);
/// Between tries.
const RETRY: Duration = Duration::from_millis(500);
/// How long a change is tried once one failed as unavailable, until one
/// succeeds: the first rides out a blip of the API server; once it is out
/// of reach, every change fails fast instead of stalling its volume again.
pub const OUT_OF_REACH_DEADLINE: Duration = Duration::from_secs(2);

/// What to do with the record found.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// It already says so.
    Unchanged,
    /// Write this (None: remove it).
    Write(Option<SharedReplicaSet>),
}

/// The record node `node` writes for a replica set `after` (None: removed)
/// where `current` is recorded: refused when another node's front end holds
/// the volume there. A generation never goes down: one this node recorded
/// whose store then failed to keep it is kept.
pub fn decide(
    node: &str,
    current: Option<&SharedReplicaSet>,
    after: Option<&SharedSet>,
) -> Result<Decision, SharedRecordError> {
    if let Some(c) = current {
        if c.front_end != node {
            return Err(SharedRecordError::Fenced(format!(
                "the API server records node {}'s front end at generation {} (this is node {node})",
                c.front_end, c.generation
            )));
        }
    }
    let want = after.map(|a| {
        let mut w = to_crd(a);
        w.front_end = node.to_string();
        w.generation = a.generation.max(current.map(|c| c.generation).unwrap_or(0));
        w
    });
    Ok(if want.as_ref() == current {
        Decision::Unchanged
    } else {
        Decision::Write(want)
    })
}

/// What is asked of the record.
enum Op {
    /// [`SharedRecord::record`].
    Record {
        node: String,
        after: Option<SharedSet>,
    },
    /// [`SharedRecord::read`].
    Read,
    /// [`SharedRecord::take`].
    Take {
        node: String,
        from: SharedSet,
        to: SharedSet,
    },
}

struct Ask {
    volume: String,
    op: Op,
    answer: sync_mpsc::Sender<Result<Option<SharedSet>, SharedRecordError>>,
}

/// The shared record in the Volume resources of one namespace. Its calls
/// run on a thread of their own (the store calls it from any thread,
/// async runtime or not), each waiting for its answer.
pub struct KubeRecord {
    asks: mpsc::UnboundedSender<Ask>,
}

impl KubeRecord {
    /// Start it: Volume resources in `namespace`, the API server found as
    /// kubectl finds it (KUBECONFIG, ~/.kube/config, or in a pod its
    /// ServiceAccount), looked up at each try until found; a change tried
    /// for `deadline`, or [`OUT_OF_REACH_DEADLINE`] while the last one
    /// failed as unavailable.
    pub fn start(namespace: String, deadline: Duration) -> std::io::Result<KubeRecord> {
        let (asks, mut rx) = mpsc::unbounded_channel::<Ask>();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("kube-record".into())
            .spawn(move || {
                rt.block_on(async move {
                    // Each ask its own task: one volume's record waiting for
                    // an API server out of reach does not hold another's
                    // (a volume's asks come one at a time: the store's lock).
                    let client = std::sync::Arc::new(tokio::sync::Mutex::new(None));
                    let namespace = std::sync::Arc::new(namespace);
                    let out_of_reach = std::sync::Arc::new(AtomicBool::new(false));
                    while let Some(ask) = rx.recv().await {
                        let (client, namespace, out_of_reach) =
                            (client.clone(), namespace.clone(), out_of_reach.clone());
                        tokio::spawn(async move {
                            let d = if out_of_reach.load(Ordering::SeqCst) {
                                OUT_OF_REACH_DEADLINE.min(deadline)
                            } else {
                                deadline
                            };
                            let r = change(&client, &namespace, &ask, d).await;
                            let lost = matches!(r, Err(SharedRecordError::Unavailable(_)));
                            out_of_reach.store(lost, Ordering::SeqCst);
                            let _ = ask.answer.send(r);
                        });
                    }
                })
            })?;
        Ok(KubeRecord { asks })
    }
}

impl KubeRecord {
    fn ask(&self, volume: &str, op: Op) -> Result<Option<SharedSet>, SharedRecordError> {
        let (answer, rx) = sync_mpsc::channel();
        let ask = Ask {
            volume: volume.to_string(),
            op,
            answer,
        };
        self.asks
            .send(ask)
            .map_err(|_| SharedRecordError::Unavailable("its thread ended".into()))?;
        rx.recv()
            .map_err(|_| SharedRecordError::Unavailable("its thread ended".into()))?
    }
}

impl SharedRecord for KubeRecord {
    fn record(
        &self,
        node: &str,
        volume: &str,
        after: Option<&SharedSet>,
    ) -> Result<(), SharedRecordError> {
        let op = Op::Record {
            node: node.to_string(),
            after: after.cloned(),
        };
        self.ask(volume, op).map(drop)
    }

    fn read(&self, volume: &str) -> Result<Option<SharedSet>, SharedRecordError> {
        self.ask(volume, Op::Read)
    }

    fn take(
        &self,
        node: &str,
        volume: &str,
        from: &SharedSet,
        to: &SharedSet,
    ) -> Result<(), SharedRecordError> {
        let op = Op::Take {
            node: node.to_string(),
            from: from.clone(),
            to: to.clone(),
        };
        self.ask(volume, op).map(drop)
    }
}

/// The record's form of a replica set.
fn to_crd(s: &SharedSet) -> SharedReplicaSet {
    SharedReplicaSet {
        front_end: s.front_end.clone(),
        generation: s.generation,
        diskless: s.diskless,
        replicas: s
            .replicas
            .iter()
            .map(|(node, faulted)| SharedReplica {
                node: node.clone(),
                faulted: faulted.clone(),
            })
            .collect(),
    }
}

fn from_crd(s: &SharedReplicaSet) -> SharedSet {
    SharedSet {
        front_end: s.front_end.clone(),
        generation: s.generation,
        diskless: s.diskless,
        replicas: s
            .replicas
            .iter()
            .map(|r| (r.node.clone(), r.faulted.clone()))
            .collect(),
    }
}

/// One ask, tried until `deadline`, in a span naming it.
async fn change(
    client: &tokio::sync::Mutex<Option<kube::Client>>,
    namespace: &str,
    ask: &Ask,
    deadline: Duration,
) -> Result<Option<SharedSet>, SharedRecordError> {
    let name = lamina_controller::names::volume_resource(&ask.volume);
    let span = tracing::info_span!("shared_record", volume = %ask.volume, resource = %name);
    tries(client, namespace, &name, ask, deadline)
        .instrument(span)
        .await
}

async fn tries(
    client: &tokio::sync::Mutex<Option<kube::Client>>,
    namespace: &str,
    name: &str,
    ask: &Ask,
    deadline: Duration,
) -> Result<Option<SharedSet>, SharedRecordError> {
    let until = Instant::now() + deadline;
    loop {
        // A cut link answers nothing: each try ends by the deadline.
        let left = until.saturating_duration_since(Instant::now());
        let last = match tokio::time::timeout(left, try_change(client, namespace, name, ask)).await
        {
            Ok(Ok(found)) => return Ok(found),
            Ok(Err(Try::Fenced(e))) => return Err(e),
            Ok(Err(Try::Again(why))) => why,
            Err(_) => "no answer".into(),
        };
        if Instant::now() + RETRY > until {
            tracing::warn!(reason = %last, "the replica set's record in the API server could not be changed");
            return Err(SharedRecordError::Unavailable(format!(
                "Volume {namespace}/{name} in the Kubernetes API server, tried for {:.0} s: {last}",
                deadline.as_secs_f64()
            )));
        }
        tokio::time::sleep(RETRY).await;
    }
}

enum Try {
    Fenced(SharedRecordError),
    Again(String),
}

async fn try_change(
    client: &tokio::sync::Mutex<Option<kube::Client>>,
    namespace: &str,
    name: &str,
    ask: &Ask,
) -> Result<Option<SharedSet>, Try> {
    let c = {
        let mut held = client.lock().await;
        match &*held {
            Some(c) => c.clone(),
            None => {
                let c = kube::Client::try_default()
                    .await
                    .map_err(|e| Try::Again(format!("no API server configured: {e}")))?;
                *held = Some(c.clone());
                c
            }
        }
    };
    let api: kube::Api<Volume> = kube::Api::namespaced(c, namespace);
    let found = api
        .get_opt(name)
        .await
        .map_err(|e| Try::Again(format!("reading it: {e}")))?;
    let current = found
        .as_ref()
        .and_then(|v| v.status.as_ref())
        .and_then(|s| s.replica_set.as_ref());
    let want = match &ask.op {
        Op::Read => return Ok(current.map(from_crd)),
        Op::Record { node, after } => {
            if found.is_none() && after.is_none() {
                return Ok(None);
            }
            match decide(node, current, after.as_ref()).map_err(Try::Fenced)? {
                Decision::Unchanged => return Ok(None),
                Decision::Write(w) => w,
            }
        }
        Op::Take { node, from, to } => {
            let now = current.map(from_crd);
            if now.as_ref() == Some(to) {
                return Ok(None);
            }
            if now.as_ref() != Some(from) {
                return Err(Try::Fenced(SharedRecordError::Fenced(format!(
                    "node {node} cannot take the volume over: its record changed since it was read ({})",
                    match &now {
                        Some(n) => format!("node {}'s front end at generation {}", n.front_end, n.generation),
                        None => "none now".into(),
                    }
                ))));
            }
            Some(to_crd(to))
        }
    };
    let Some(v) = found else {
        return Err(Try::Again(
            "it does not exist yet (lamina controller makes it for the volume)".into(),
        ));
    };
    let Some(version) = v.metadata.resource_version.clone() else {
        return Err(Try::Again("it has no resourceVersion".into()));
    };
    // A merge patch with the resourceVersion read: the API server refuses
    // it (409) if anything changed the resource since.
    let body = serde_json::json!({
        "metadata": {"resourceVersion": version},
        "status": {"replicaSet": want},
    });
    match api
        .patch_status(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(body),
        )
        .await
    {
        Ok(_) => {
            tracing::debug!(generation = want.as_ref().map(|w| w.generation), "recorded");
            Ok(None)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Err(Try::Again(
            "it changed while this change was made (resourceVersion conflict)".into(),
        )),
        Err(e) => Err(Try::Again(format!("writing it: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(generation: u64, faulted: Option<&str>) -> SharedSet {
        SharedSet {
            front_end: "a".into(),
            generation,
            replicas: vec![
                ("a".into(), None),
                ("b".into(), faulted.map(str::to_string)),
            ],
            diskless: false,
        }
    }

    fn shared(front_end: &str, generation: u64, faulted: Option<&str>) -> SharedReplicaSet {
        SharedReplicaSet {
            front_end: front_end.into(),
            generation,
            diskless: false,
            replicas: vec![
                SharedReplica {
                    node: "a".into(),
                    faulted: None,
                },
                SharedReplica {
                    node: "b".into(),
                    faulted: faulted.map(str::to_string),
                },
            ],
        }
    }

    #[test]
    fn a_record_is_written_by_its_front_end_only_and_its_generation_never_goes_down() {
        assert_eq!(
            decide("a", None, Some(&rec(0, None))).unwrap(),
            Decision::Write(Some(shared("a", 0, None)))
        );
        let cur = shared("a", 3, None);
        assert_eq!(
            decide("a", Some(&cur), Some(&rec(3, None))).unwrap(),
            Decision::Unchanged
        );
        assert_eq!(
            decide("a", Some(&cur), Some(&rec(3, Some("lost")))).unwrap(),
            Decision::Write(Some(shared("a", 3, Some("lost"))))
        );
        // This node took 4 there and its store failed to keep it: asked
        // again for 4 it is the same; a record of 3 keeps 4.
        let cur = shared("a", 4, None);
        assert_eq!(
            decide("a", Some(&cur), Some(&rec(4, None))).unwrap(),
            Decision::Unchanged
        );
        assert_eq!(
            decide("a", Some(&cur), Some(&rec(3, Some("x")))).unwrap(),
            Decision::Write(Some(shared("a", 4, Some("x"))))
        );
        assert_eq!(
            decide("a", Some(&cur), None).unwrap(),
            Decision::Write(None)
        );
        assert_eq!(decide("a", None, None).unwrap(), Decision::Unchanged);
        // Another node's front end holds it: nothing is written, whatever
        // this node asks.
        let other = shared("c", 5, None);
        for after in [None, Some(rec(9, None)), Some(rec(5, Some("lost")))] {
            let e = decide("a", Some(&other), after.as_ref()).unwrap_err();
            assert!(
                matches!(&e, SharedRecordError::Fenced(m) if m.contains("node c") && m.contains("generation 5")),
                "{e}"
            );
        }
    }
}
