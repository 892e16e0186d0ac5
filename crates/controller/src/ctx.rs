//! What the controllers share: the Kubernetes client, the node daemons and
//! the last thing each listed, the resource stores, the event recorder and
//! the metrics; and the one place resources are written.

use crate::crd::VolumeStatus;
use crate::crd::{Snapshot, Volume};
use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::plan::{EngineView, Write};
use crate::{Error, FINALIZER, MANAGER};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

pub struct Ctx {
    pub client: kube::Client,
    pub namespace: String,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub snapshots: Store<Snapshot>,
    pub volumes: Store<Volume>,
    /// The daemons, by node name.
    pub engines: RwLock<BTreeMap<String, Engine>>,
    /// What each node's daemon held at its last listing.
    pub views: RwLock<HashMap<String, Arc<EngineView>>>,
    /// Failures in a row per object, for the retry backoff.
    pub failures: Mutex<HashMap<String, u32>>,
    /// Reconcile every Volume again now: sent after a node's listing changed
    /// while some of its Volumes are being deleted (a clone or snapshot that
    /// held them may be gone). Reconciling a settled Volume costs no call.
    pub kick_volumes: tokio::sync::mpsc::UnboundedSender<()>,
    /// Set once the node Secrets have been read: until then no node is
    /// known, which must not read as "the volume is on no node".
    pub nodes_known: std::sync::atomic::AtomicBool,
    /// The nodes whose daemon the mirror cannot reach, since when.
    pub silent: RwLock<HashMap<String, std::time::Instant>>,
}

/// Where a volume is, as far as the daemons' last listings tell.
#[derive(Debug, PartialEq)]
pub enum Located {
    On(Engine),
    /// Every known node was listed and none holds it.
    Gone,
    /// Some node has not been listed (unreachable, or just starting).
    Unknown,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Engine({})", self.node)
    }
}

impl PartialEq for Engine {
    fn eq(&self, o: &Engine) -> bool {
        self.node == o.node
    }
}

impl Ctx {
    /// Each known node: whether its daemon answers (listed, and not silent
    /// since), how long it has not, and whether it has a transfer address.
    pub fn node_states(&self) -> BTreeMap<String, crate::replicas::NodeState> {
        let engines = self.engines.read().unwrap();
        let views = self.views.read().unwrap();
        let silent = self.silent.read().unwrap();
        engines
            .iter()
            .map(|(n, e)| {
                let since = silent.get(n);
                let state = crate::replicas::NodeState {
                    answers: since.is_none() && views.contains_key(n),
                    silent_for: since.map(|t| t.elapsed()),
                    transfer: e.transfer_address.clone(),
                };
                (n.clone(), state)
            })
            .collect()
    }

    /// An event on the Volume resource of engine volume `volume`.
    pub async fn volume_event(&self, volume: &str, warning: bool, reason: &str, note: String) {
        let obj = ObjectReference {
            api_version: Some("lamina.io/v1alpha1".into()),
            kind: Some("Volume".into()),
            name: Some(crate::names::volume_resource(volume)),
            namespace: Some(self.namespace.clone()),
            ..Default::default()
        };
        self.event(&obj, warning, reason, "Replicas", note.clone())
            .await;
        self.claim_event(volume, warning, reason, "Replicas", note)
            .await;
    }

    /// The claim bound to engine volume `volume` (the CSI driver names a
    /// volume after its PersistentVolume), if a PersistentVolume of that
    /// name has one.
    async fn claim_of(&self, volume: &str) -> Option<ObjectReference> {
        let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(self.client.clone());
        match pvs.get_opt(volume).await {
            Ok(pv) => pv.and_then(|pv| pv.spec?.claim_ref),
            Err(e) => {
                tracing::warn!(volume, error = %e, "could not read the volume's PersistentVolume for its claim");
                None
            }
        }
    }

    /// The same event on the claim of engine volume `volume`, if it has
    /// one: a user watching their PVC sees its replicas' state change.
    pub async fn claim_event(
        &self,
        volume: &str,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) {
        if let Some(claim) = self.claim_of(volume).await {
            self.event(&claim, warning, reason, action, note).await;
        }
    }

    pub fn engine(&self, node: &str) -> Option<Engine> {
        self.engines.read().unwrap().get(node).cloned()
    }

    pub fn view(&self, node: &str) -> Option<Arc<EngineView>> {
        self.views.read().unwrap().get(node).cloned()
    }

    pub fn nodes_known(&self) -> bool {
        self.nodes_known.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The node holding engine volume `volume`.
    pub fn locate(&self, volume: &str) -> Located {
        if !self.nodes_known() {
            return Located::Unknown;
        }
        let engines = self.engines.read().unwrap();
        let views = self.views.read().unwrap();
        let mut all_listed = true;
        for (node, e) in engines.iter() {
            match views.get(node) {
                Some(v) if v.volumes.iter().any(|x| x.name == volume) => {
                    return Located::On(e.clone())
                }
                Some(_) => {}
                None => all_listed = false,
            }
        }
        if all_listed {
            Located::Gone
        } else {
            Located::Unknown
        }
    }

    /// The node holding engine snapshot `name` of `volume` (the snapshot
    /// with id `id` when its resource knows it: ids are never reused), and
    /// how to name its volume there: `NAME@ID` once the volume was deleted
    /// (its snapshots outlive it), so that a new volume of the same name
    /// is never the one reached.
    pub fn locate_snapshot(&self, volume: &str, name: &str, id: Option<u64>) -> (Located, String) {
        if !self.nodes_known() {
            return (Located::Unknown, volume.to_string());
        }
        let engines = self.engines.read().unwrap();
        let views = self.views.read().unwrap();
        let mut deleted = None;
        let mut another = false;
        let mut all_listed = true;
        for (node, e) in engines.iter() {
            let Some(v) = views.get(node) else {
                all_listed = false;
                continue;
            };
            for x in v
                .snapshots
                .iter()
                .filter(|x| x.volume == volume && x.name == name)
            {
                match id {
                    Some(id) if x.id == id => {
                        return (Located::On(e.clone()), x.volume_reference())
                    }
                    Some(_) => another = true,
                    None if !x.volume_deleted => return (Located::On(e.clone()), x.volume.clone()),
                    None => {
                        deleted.get_or_insert((e.clone(), x.volume_reference()));
                    }
                }
            }
        }
        if let Some((e, reference)) = deleted {
            return (Located::On(e), reference);
        }
        if another {
            // Its name was taken again by another snapshot: this one is
            // gone, and the other is not its to delete.
            let l = if all_listed {
                Located::Gone
            } else {
                Located::Unknown
            };
            return (l, volume.to_string());
        }
        drop((engines, views));
        // Not listed (yet): a live volume of that name is where it would be
        // (a snapshot taken since the last listing), and its delete is
        // idempotent.
        (self.locate(volume), volume.to_string())
    }

    pub fn snapshot_api(&self) -> Api<Snapshot> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn volume_api(&self) -> Api<Volume> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Publish an event on `obj` (failures are logged: an event that cannot
    /// be written must not stop the work).
    pub async fn event(
        &self,
        obj: &ObjectReference,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.metrics.api_write("Event", "create");
        let ev = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, obj).await {
            tracing::warn!(error = %e, reason, "could not publish an event");
        }
    }

    /// A failure as a warning event on `obj`.
    pub async fn warn<K: Resource<DynamicType = ()>>(&self, obj: &K, action: &str, e: &Error) {
        tracing::warn!(object = %obj.name_any(), action, error = %e, "failed");
        self.event(
            &obj.object_ref(&()),
            true,
            e.reason(),
            action,
            e.to_string(),
        )
        .await;
    }

    pub fn failed(&self, key: &str) -> u32 {
        let mut f = self.failures.lock().unwrap();
        let n = f.entry(key.to_string()).or_default();
        *n = n.saturating_add(1);
        *n
    }

    pub fn succeeded(&self, key: &str) {
        self.failures.lock().unwrap().remove(key);
    }

    /// Make one write of the mirror or a reconciler.
    pub async fn write(&self, w: &Write) -> Result<(), Error> {
        let (kind, verb) = w.what();
        // An event counts itself (`Ctx::event`).
        if !matches!(w, Write::VolumeEvent { .. }) {
            self.metrics.api_write(kind, verb);
        }
        let pp = PatchParams::apply(MANAGER).force();
        match w {
            Write::CreateVolume { name, spec } => {
                let body = json!({
                    "apiVersion": "lamina.io/v1alpha1", "kind": "Volume",
                    "metadata": {"name": name, "finalizers": [FINALIZER]},
                    "spec": spec,
                });
                self.volume_api()
                    .patch(name, &pp, &Patch::Apply(body))
                    .await
                    .map_err(Error::kube(format!("create Volume {name}")))?;
            }
            Write::VolumeStatus { name, status } => {
                // The replica set's record is the front end's daemon's, each
                // change under a precondition: an apply of the one read
                // could undo a newer one.
                let status = VolumeStatus {
                    replica_set: None,
                    ..status.clone()
                };
                let body =
                    json!({"apiVersion": "lamina.io/v1alpha1", "kind": "Volume", "status": status});
                self.volume_api()
                    .patch_status(name, &pp, &Patch::Apply(body))
                    .await
                    .map_err(Error::kube(format!("status of Volume {name}")))?;
            }
            Write::CreateSnapshot { name, spec, labels } => {
                let body = json!({
                    "apiVersion": "lamina.io/v1alpha1", "kind": "Snapshot",
                    "metadata": {"name": name, "labels": labels, "finalizers": [FINALIZER]},
                    "spec": spec,
                });
                self.snapshot_api()
                    .patch(name, &pp, &Patch::Apply(body))
                    .await
                    .map_err(Error::kube(format!("create Snapshot {name}")))?;
            }
            Write::SnapshotStatus { name, status } => {
                let body = json!({"apiVersion": "lamina.io/v1alpha1", "kind": "Snapshot", "status": status});
                self.snapshot_api()
                    .patch_status(name, &pp, &Patch::Apply(body))
                    .await
                    .map_err(Error::kube(format!("status of Snapshot {name}")))?;
            }
            Write::VolumeEvent {
                name,
                warning,
                reason,
                note,
            } => {
                let obj = k8s_openapi::api::core::v1::ObjectReference {
                    api_version: Some("lamina.io/v1alpha1".into()),
                    kind: Some("Volume".into()),
                    name: Some(name.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..Default::default()
                };
                self.event(&obj, *warning, reason, "Mirror", note.clone())
                    .await;
                self.claim_event(name, *warning, reason, "Mirror", note.clone())
                    .await;
            }
            Write::DeleteSnapshot { name } => {
                match self
                    .snapshot_api()
                    .delete(name, &DeleteParams::default())
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(Error::kube(format!("delete Snapshot {name}"))(e)),
                }
            }
        }
        Ok(())
    }
}
