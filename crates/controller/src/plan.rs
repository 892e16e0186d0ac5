//! The mirror's pure part: from one node's engine lists and the resources
//! that exist, the set of writes that makes the resources tell what the
//! engine holds, and nothing more (a status equal to what is there is not
//! written).

use crate::crd::{
    CloneStatus, ReplicaStatus, ReplicationStatus, Snapshot, SnapshotSpec, SnapshotStatus, Volume,
    VolumeSpec, VolumeStatus, VOLUME_LABEL,
};
use crate::names;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use lamina_api as api;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// What one node's daemon holds, as listed.
#[derive(Clone, Debug, Default)]
pub struct EngineView {
    pub node: String,
    pub volumes: Vec<api::Volume>,
    pub snapshots: Vec<api::Snapshot>,
    /// The latest operation of each volume that needs one read: those with
    /// an operation running, and vanished ones whose clone was initiated.
    pub operations: HashMap<String, api::Operation>,
}

/// One write to the API server.
// A status is most of what is written, and a tick plans a handful of
// writes: boxing it would only add an allocation to each.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// A resource for an engine volume that has none.
    CreateVolume {
        name: String,
        spec: VolumeSpec,
    },
    VolumeStatus {
        name: String,
        status: VolumeStatus,
    },
    /// A resource for an engine snapshot that has none.
    CreateSnapshot {
        name: String,
        spec: SnapshotSpec,
        labels: BTreeMap<String, String>,
    },
    SnapshotStatus {
        name: String,
        status: SnapshotStatus,
    },
    /// A system-made snapshot's resource whose snapshot vanished.
    DeleteSnapshot {
        name: String,
    },
    /// An event on a Volume: a replicated volume's or replica's state
    /// changed (Degraded, Unavailable, Rebuilding, Rebuilt).
    VolumeEvent {
        name: String,
        warning: bool,
        reason: String,
        note: String,
    },
}

impl Write {
    /// The kind and verb, for the metrics.
    pub fn what(&self) -> (&'static str, &'static str) {
        match self {
            Write::CreateVolume { .. } => ("Volume", "create"),
            Write::VolumeStatus { .. } => ("Volume", "status"),
            Write::CreateSnapshot { .. } => ("Snapshot", "create"),
            Write::SnapshotStatus { .. } => ("Snapshot", "status"),
            Write::DeleteSnapshot { .. } => ("Snapshot", "delete"),
            Write::VolumeEvent { .. } => ("Event", "create"),
        }
    }
}

/// The volumes whose latest operation the plan needs (see [`EngineView`]).
pub fn operations_needed(
    node: &str,
    volumes: &[api::Volume],
    existing: &[Arc<Volume>],
) -> Vec<String> {
    let mut out: Vec<String> = volumes
        .iter()
        .filter(|v| v.operation.is_some())
        .map(|v| v.name.clone())
        .collect();
    for r in existing.iter().filter(|r| r.spec.node == node) {
        let initiated = r
            .status
            .as_ref()
            .and_then(|s| s.clone.as_ref())
            .is_some_and(|c| c.state == "initiated");
        let name = r.engine_name();
        if initiated && !volumes.iter().any(|v| v.name == name) {
            out.push(name.to_string());
        }
    }
    out
}

fn name_of<K: kube::Resource>(r: &K) -> String {
    r.meta().name.clone().unwrap_or_default()
}

fn deleting<K: kube::Resource>(r: &K) -> bool {
    r.meta().deletion_timestamp.is_some()
}

/// The writes for one node. `now` stamps condition transitions.
pub fn plan(
    view: &EngineView,
    volumes: &[Arc<Volume>],
    snapshots: &[Arc<Snapshot>],
    now: &Time,
) -> Vec<Write> {
    let mut out = Vec::new();
    let view = own(view);
    plan_volumes(&view, volumes, now, &mut out);
    plan_snapshots(&view, snapshots, &mut out);
    out
}

/// `view` without the volumes this node holds as replicas of another
/// node's (label [`api::REPLICA_OF_LABEL`]) and their snapshots: each is
/// part of its front end's volume of the same name, which has the
/// resources; mirrored as a volume of this node, it would be a second
/// Volume of that name.
pub fn own(view: &EngineView) -> EngineView {
    let replicas: std::collections::HashSet<u64> = view
        .volumes
        .iter()
        .filter(|v| v.labels.contains_key(api::REPLICA_OF_LABEL))
        .map(|v| v.id)
        .collect();
    EngineView {
        node: view.node.clone(),
        volumes: view
            .volumes
            .iter()
            .filter(|v| !replicas.contains(&v.id))
            .cloned()
            .collect(),
        snapshots: view
            .snapshots
            .iter()
            .filter(|s| !replicas.contains(&s.volume_id))
            .cloned()
            .collect(),
        operations: view.operations.clone(),
    }
}

fn plan_volumes(view: &EngineView, existing: &[Arc<Volume>], now: &Time, out: &mut Vec<Write>) {
    let node = view.node.as_str();
    let mine: HashMap<&str, &Arc<Volume>> = existing
        .iter()
        .filter(|r| r.spec.node == node)
        .map(|r| (r.engine_name(), r))
        .collect();
    for v in &view.volumes {
        let op = view.operations.get(&v.name);
        match mine.get(v.name.as_str()) {
            // Another node's front end took the volume over (its shared
            // record says so): this node's copy is a stale front end's,
            // about to become that one's replica, and the resource is not
            // this node's to take back.
            None if existing.iter().any(|r| {
                r.engine_name() == v.name
                    && r.spec.node != node
                    && r.status
                        .as_ref()
                        .and_then(|s| s.replica_set.as_ref())
                        .is_some_and(|rs| rs.front_end != node)
            }) => {}
            None => {
                let name = names::volume_resource(&v.name);
                // This node's front end took the volume over from the
                // node the resource names: the apply below moves it here.
                let from = existing
                    .iter()
                    .find(|r| r.engine_name() == v.name && r.spec.node != node)
                    .map(|r| r.spec.node.clone());
                if let (Some(from), Some(r)) = (from, &v.replication) {
                    out.push(Write::VolumeEvent {
                        name: name.clone(),
                        warning: true,
                        reason: "Fenced".into(),
                        note: format!(
                            "volume {} was taken over by node {node} at generation {}: node {from}'s front end is refused by its replicas and by the shared record from now on, and its replica is copied again",
                            v.name, r.generation
                        ),
                    });
                }
                out.push(Write::CreateVolume {
                    spec: VolumeSpec {
                        volume_name: (name != v.name).then(|| v.name.clone()),
                        size: v.size.to_string(),
                        node: node.to_string(),
                        data_source: None,
                    },
                    name: name.clone(),
                });
                let status = volume_status(node, v, op, None, now);
                out.push(Write::VolumeStatus { name, status });
            }
            Some(r) => {
                let status = volume_status(node, v, op, r.status.as_ref(), now);
                if r.status.as_ref() != Some(&status) && !deleting(r.as_ref()) {
                    let name = name_of(r.as_ref());
                    let old = r.status.as_ref().and_then(|s| s.replication.as_ref());
                    if let Some(new) = &status.replication {
                        replication_events(&name, &v.name, old, new, out);
                    }
                    out.push(Write::VolumeStatus { name, status });
                }
            }
        }
    }
    for (engine, r) in mine {
        let Some(old) = r.status.as_ref() else {
            continue;
        };
        if old.id.is_none() || deleting(r.as_ref()) || view.volumes.iter().any(|v| v.name == engine)
        {
            continue; // not made yet (the reconciler's), going, or there
        }
        let mut status = old.clone();
        let failed = view
            .operations
            .get(engine)
            .filter(|o| o.state == api::OperationState::Failed);
        match (status.clone.as_mut(), failed) {
            (Some(c), Some(op)) if c.state == "initiated" => {
                c.state = "failed".into();
                c.reason = op.error.clone();
                c.rate = None;
                c.eta_seconds = None;
                status.state = Some("Failed".into());
                let msg = format!(
                    "the clone failed: {}",
                    op.error.as_deref().unwrap_or("no reason given")
                );
                set_ready(&mut status, false, "CloneFailed", &msg, now);
            }
            _ => {
                status.state = Some("Missing".into());
                let msg = format!("node {node}'s daemon no longer has volume {engine}");
                set_ready(&mut status, false, "VolumeMissing", &msg, now);
            }
        }
        status.attached = false;
        if Some(&status) != r.status.as_ref() {
            out.push(Write::VolumeStatus {
                name: name_of(r.as_ref()),
                status,
            });
        }
    }
}

/// Set the Ready condition, keeping its transition time when its status
/// does not change.
pub fn set_ready(status: &mut VolumeStatus, ready: bool, reason: &str, message: &str, now: &Time) {
    let s = if ready { "True" } else { "False" };
    let since = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == s)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    status.conditions.retain(|c| c.type_ != "Ready");
    status.conditions.push(Condition {
        type_: "Ready".into(),
        status: s.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: since,
        observed_generation: None,
    });
}

fn volume_status(
    node: &str,
    v: &api::Volume,
    op: Option<&api::Operation>,
    old: Option<&VolumeStatus>,
    now: &Time,
) -> VolumeStatus {
    let copying = v.clone_state == api::CloneState::Copying;
    let mut status = VolumeStatus {
        state: Some(if copying { "Cloning" } else { "Ready" }.into()),
        node: Some(node.into()),
        id: Some(v.id),
        size_bytes: Some(v.size),
        attached: v.export.is_some(),
        clone: clone_status(v, op, old.and_then(|o| o.clone.as_ref()), now),
        replication: v.replication.as_ref().map(|r| replication_status(node, r)),
        // The daemon's to write (ctx.rs never sends it): kept as read, so
        // that it alone never makes a status differ.
        replica_set: old.and_then(|o| o.replica_set.clone()),
        conditions: old.map(|o| o.conditions.clone()).unwrap_or_default(),
    };
    if copying {
        set_ready(
            &mut status,
            false,
            "Cloning",
            "a full clone (from this node or another) is copying the data",
            now,
        );
    } else {
        set_ready(&mut status, true, "Ready", "the daemon has the volume", now);
    }
    status
}

/// A replicated volume's replicas as the daemon of `node` (its front end)
/// shows them.
fn replication_status(node: &str, r: &api::Replication) -> ReplicationStatus {
    let word = |s: &str| {
        let mut c = s.chars();
        c.next()
            .map(|f| f.to_uppercase().chain(c).collect())
            .unwrap_or_default()
    };
    let state = match r.state {
        api::ReplicationState::Healthy => "healthy",
        api::ReplicationState::Degraded => "degraded",
        api::ReplicationState::Unavailable => "unavailable",
    };
    ReplicationStatus {
        state: word(state),
        front_end: node.to_string(),
        generation: r.generation,
        replicas: r
            .replicas
            .iter()
            .map(|x| {
                let state = match x.state {
                    api::ReplicaState::Healthy => "healthy",
                    api::ReplicaState::Faulted => "faulted",
                    api::ReplicaState::Rebuilding => "rebuilding",
                };
                let b = x.rebuild.as_ref();
                ReplicaStatus {
                    node: x.node.clone(),
                    state: word(state),
                    reason: x.reason.clone(),
                    since: Some(x.since.clone()).filter(|s| !s.is_empty()),
                    progress: b.and_then(|b| {
                        (b.round_sent_bytes.saturating_mul(100))
                            .checked_div(b.round_bytes)
                            .map(|p| p.min(100) as u8)
                    }),
                    sent_bytes: b.map(|b| b.sent_bytes),
                    rate: b.map(|b| b.rate_bytes_per_second),
                    eta_seconds: b.and_then(|b| b.eta_seconds),
                }
            })
            .collect(),
    }
}

/// The events for a replicated volume's change from `old` to `new`: the
/// volume Degraded or Unavailable (a warning), a replica Rebuilding, a
/// replica Rebuilt (healthy again). (Fenced, the volume taken over by
/// another node, is [`plan_volumes`]'s, as the resource moves.)
fn replication_events(
    name: &str,
    volume: &str,
    old: Option<&ReplicationStatus>,
    new: &ReplicationStatus,
    out: &mut Vec<Write>,
) {
    let mut event = |warning: bool, reason: &str, note: String| {
        out.push(Write::VolumeEvent {
            name: name.to_string(),
            warning,
            reason: reason.to_string(),
            note,
        })
    };
    let faulted: Vec<String> = new
        .replicas
        .iter()
        .filter(|x| x.state != "Healthy")
        .map(|x| match &x.reason {
            Some(why) => format!("{} ({}: {why})", x.node, x.state.to_lowercase()),
            None => format!("{} ({})", x.node, x.state.to_lowercase()),
        })
        .collect();
    if old.map(|o| o.state.as_str()) != Some(new.state.as_str()) {
        match new.state.as_str() {
            "Degraded" => event(
                true,
                "Degraded",
                format!(
                    "volume {volume} is degraded: I/O goes on from its healthy replicas; out of the healthy set: {}",
                    faulted.join(", ")
                ),
            ),
            "Unavailable" => event(
                true,
                "Unavailable",
                format!(
                    "volume {volume} has no healthy replica: its I/O fails; out of the healthy set: {}",
                    faulted.join(", ")
                ),
            ),
            _ => {}
        }
    }
    let before = |node: &str| {
        old.and_then(|o| o.replicas.iter().find(|x| x.node == node))
            .map(|x| x.state.as_str())
    };
    for x in &new.replicas {
        match (before(&x.node), x.state.as_str()) {
            (Some("Faulted") | None, "Rebuilding") if old.is_some() => event(
                false,
                "Rebuilding",
                format!(
                    "volume {volume}'s replica on node {} is being sent what it lacks",
                    x.node
                ),
            ),
            (Some("Faulted" | "Rebuilding"), "Healthy") => event(
                false,
                "Rebuilt",
                format!(
                    "volume {volume}'s replica on node {} is healthy again",
                    x.node
                ),
            ),
            _ => {}
        }
    }
}

fn clone_status(
    v: &api::Volume,
    op: Option<&api::Operation>,
    old: Option<&CloneStatus>,
    now: &Time,
) -> Option<CloneStatus> {
    let origin = v
        .origin
        .as_ref()
        .map(|o| match (&o.volume, &o.snapshot) {
            (Some(v), Some(s)) => format!("{v}/{s}"),
            (Some(v), None) => v.clone(),
            _ => String::new(),
        })
        .filter(|s| !s.is_empty())
        .or_else(|| op.and_then(|o| o.source.clone()))
        .or_else(|| old.and_then(|o| o.origin.clone()));
    if let Some(op) = op.filter(|o| {
        matches!(
            o.kind,
            api::OperationKind::FullClone | api::OperationKind::RemoteClone
        ) && o.state == api::OperationState::Running
    }) {
        let progress = (op.done_bytes.saturating_mul(100))
            .checked_div(op.total_bytes)
            .map(|p| p.min(100) as u8);
        // The daemon's own rate (since the copy last resumed) when it gives
        // one; otherwise the average since the operation started.
        let elapsed = elapsed_secs(&op.started, now).filter(|s| *s > 0);
        let rate = op
            .rate_bytes_per_sec
            .or_else(|| elapsed.map(|s| op.done_bytes / s));
        let eta = op.eta_seconds.or_else(|| {
            rate.filter(|r| *r > 0)
                .map(|r| op.total_bytes.saturating_sub(op.done_bytes) / r)
        });
        return Some(CloneStatus {
            origin,
            state: "initiated".into(),
            reason: None,
            progress,
            rate,
            eta_seconds: eta,
        });
    }
    if v.clone_state == api::CloneState::None && old.is_none() {
        return None;
    }
    origin.as_ref()?;
    Some(CloneStatus {
        origin,
        state: "completed".into(),
        reason: None,
        progress: Some(100),
        rate: None,
        eta_seconds: None,
    })
}

fn elapsed_secs(started: &str, now: &Time) -> Option<u64> {
    let t: k8s_openapi::jiff::Timestamp = started.parse().ok()?;
    let d = now.0.as_second() - t.as_second();
    u64::try_from(d).ok()
}

fn plan_snapshots(view: &EngineView, existing: &[Arc<Snapshot>], out: &mut Vec<Write>) {
    let node = view.node.as_str();
    let vols: std::collections::HashSet<&str> =
        view.volumes.iter().map(|v| v.name.as_str()).collect();
    let in_scope = |r: &Snapshot| match r.status.as_ref().and_then(|s| s.node.as_deref()) {
        Some(n) => n == node,
        None => vols.contains(r.spec.volume.as_str()),
    };
    let mine: HashMap<(&str, &str), &Arc<Snapshot>> = existing
        .iter()
        .filter(|r| in_scope(r))
        .map(|r| ((r.spec.volume.as_str(), r.engine_name()), r))
        .collect();
    for s in &view.snapshots {
        let status = snapshot_status(node, s);
        match mine.get(&(s.volume.as_str(), s.name.as_str())) {
            None => {
                let name = names::snapshot_resource(&s.volume, &s.name);
                out.push(Write::CreateSnapshot {
                    spec: SnapshotSpec {
                        volume: s.volume.clone(),
                        snapshot_name: (name != s.name).then(|| s.name.clone()),
                        create_snapshot: false,
                        labels: s.labels.clone(),
                    },
                    labels: BTreeMap::from([(VOLUME_LABEL.to_string(), label_value(&s.volume))]),
                    name: name.clone(),
                });
                out.push(Write::SnapshotStatus { name, status });
            }
            Some(r) => {
                if r.status.as_ref() != Some(&status) && !deleting(r.as_ref()) {
                    out.push(Write::SnapshotStatus {
                        name: name_of(r.as_ref()),
                        status,
                    });
                }
            }
        }
    }
    let held: std::collections::HashSet<(&str, &str)> = view
        .snapshots
        .iter()
        .map(|s| (s.volume.as_str(), s.name.as_str()))
        .collect();
    for ((volume, snap), r) in mine {
        if held.contains(&(volume, snap)) || deleting(r.as_ref()) {
            continue;
        }
        let old = r.status.clone().unwrap_or_default();
        if r.spec.create_snapshot && old.creation_time.is_none() {
            continue; // not taken yet: the snapshot reconciler's
        }
        if !r.spec.create_snapshot && !old.user_created {
            out.push(Write::DeleteSnapshot {
                name: name_of(r.as_ref()),
            });
            continue;
        }
        let why = if vols.contains(volume) {
            format!("snapshot {snap} of volume {volume} no longer exists on node {node}")
        } else {
            format!("volume {volume} no longer exists on node {node}")
        };
        let status = SnapshotStatus {
            ready_to_use: false,
            error: Some(why),
            node: Some(node.into()),
            ..old
        };
        if Some(&status) != r.status.as_ref() {
            out.push(Write::SnapshotStatus {
                name: name_of(r.as_ref()),
                status,
            });
        }
    }
}

/// A label value for an engine name: the name itself when it fits a label
/// value (63 characters, no leading '.' or '_'), else its resource form cut.
pub fn label_value(engine: &str) -> String {
    let ok = engine.len() <= 63
        && engine
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(&c))
        && engine
            .as_bytes()
            .first()
            .is_some_and(u8::is_ascii_alphanumeric)
        && engine
            .as_bytes()
            .last()
            .is_some_and(u8::is_ascii_alphanumeric);
    if ok {
        engine.to_string()
    } else {
        let n = names::volume_resource(engine);
        let h = &n[n.len().saturating_sub(8)..];
        let head: String = n
            .chars()
            .take(54)
            .collect::<String>()
            .trim_end_matches(['-', '.'])
            .to_string();
        format!("{head}-{h}")
    }
}

/// A snapshot's status as the daemon describes it.
pub fn snapshot_status(node: &str, s: &api::Snapshot) -> SnapshotStatus {
    SnapshotStatus {
        parent: s.parent.clone(),
        children: s.children.iter().map(|c| (c.clone(), true)).collect(),
        mark_removed: false,
        user_created: !s.system,
        creation_time: Some(s.created.clone()),
        size: s.exclusive_bytes,
        restore_size: s.restore_size,
        ready_to_use: true,
        error: None,
        node: Some(node.into()),
        id: Some(s.id),
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
