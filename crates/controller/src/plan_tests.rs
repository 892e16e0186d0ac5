//! The mirror's plan: engine lists + resources → writes.

use super::*;
use crate::crd::{Snapshot, SnapshotSpec, Volume, VolumeSpec};
use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;

fn now() -> Time {
    Time(Timestamp::from_second(1_800_000_000).unwrap())
}

fn vol(name: &str) -> api::Volume {
    api::Volume {
        id: 1,
        name: name.into(),
        size: 1 << 20,
        created: "2026-11-23T10:00:00Z".into(),
        allocated_bytes: 0,
        exclusive_bytes: 0,
        shared_bytes: 0,
        parent_snapshot: None,
        origin: None,
        clone_state: api::CloneState::None,
        export: None,
        operation: None,
        labels: Default::default(),
        replication: None,
    }
}

fn snap(v: &str, name: &str, system: bool) -> api::Snapshot {
    api::Snapshot {
        id: 7,
        volume: v.into(),
        volume_id: 1,
        volume_deleted: false,
        name: name.into(),
        created: "2026-11-23T10:00:00Z".into(),
        parent: None,
        children: vec![],
        system,
        labels: Default::default(),
        restore_size: 1 << 20,
        allocated_bytes: 4096,
        exclusive_bytes: 4096,
        shared_bytes: 0,
        clones: vec![],
        export: None,
    }
}

fn view(volumes: Vec<api::Volume>, snapshots: Vec<api::Snapshot>) -> EngineView {
    EngineView {
        node: "n1".into(),
        volumes,
        snapshots,
        operations: HashMap::new(),
    }
}

/// The resources a first plan creates, as the API would then hold them.
fn realise(writes: &[Write]) -> (Vec<Arc<Volume>>, Vec<Arc<Snapshot>>) {
    let mut vols: BTreeMap<String, Volume> = BTreeMap::new();
    let mut snaps: BTreeMap<String, Snapshot> = BTreeMap::new();
    for w in writes {
        match w {
            Write::CreateVolume { name, spec } => {
                vols.insert(name.clone(), Volume::new(name, spec.clone()));
            }
            Write::VolumeStatus { name, status } => {
                vols.get_mut(name).unwrap().status = Some(status.clone())
            }
            Write::CreateSnapshot { name, spec, .. } => {
                snaps.insert(name.clone(), Snapshot::new(name, spec.clone()));
            }
            Write::SnapshotStatus { name, status } => {
                snaps.get_mut(name).unwrap().status = Some(status.clone())
            }
            Write::DeleteSnapshot { name } => {
                snaps.remove(name);
            }
            Write::VolumeEvent { .. } => {}
        }
    }
    (
        vols.into_values().map(Arc::new).collect(),
        snaps.into_values().map(Arc::new).collect(),
    )
}

#[test]
fn every_engine_object_gets_a_resource_and_then_nothing_is_written() {
    let v = view(
        vec![vol("a")],
        vec![snap("a", "s1", false), snap("a", ".clone-3-b", true)],
    );
    let first = plan(&v, &[], &[], &now());
    let creates = first
        .iter()
        .filter(|w| matches!(w, Write::CreateSnapshot { .. } | Write::CreateVolume { .. }))
        .count();
    assert_eq!(creates, 3);
    let sys = first.iter().find_map(|w| match w {
        Write::CreateSnapshot { spec, name, .. }
            if spec.snapshot_name.as_deref() == Some(".clone-3-b") =>
        {
            Some(name.clone())
        }
        _ => None,
    });
    assert!(sys.is_some_and(|n| crate::names::is_valid_name(&n)));
    let (vols, snaps) = realise(&first);
    assert!(snaps
        .iter()
        .any(|s| s.status.as_ref().is_some_and(|st| !st.user_created)));
    assert_eq!(
        plan(&v, &vols, &snaps, &now()),
        vec![],
        "steady state writes nothing"
    );
}

#[test]
fn a_changed_status_is_written_once() {
    let mut v = view(vec![vol("a")], vec![snap("a", "s1", false)]);
    let (vols, snaps) = realise(&plan(&v, &[], &[], &now()));
    v.snapshots[0].exclusive_bytes = 8192;
    v.volumes[0].export = Some(api::Export {
        uri: "nbd://x/a".into(),
        name: "a".into(),
        read_only: false,
        connections: 0,
        file: None,
    });
    let w = plan(&v, &vols, &snaps, &now());
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w
        .iter()
        .any(|w| matches!(w, Write::SnapshotStatus { status, .. } if status.size == 8192)));
    assert!(w
        .iter()
        .any(|w| matches!(w, Write::VolumeStatus { status, .. } if status.attached)));
}

#[test]
fn vanished_snapshots_are_marked_or_removed() {
    let v = view(
        vec![vol("a")],
        vec![snap("a", "user", false), snap("a", ".sys", true)],
    );
    let (vols, snaps) = realise(&plan(&v, &[], &[], &now()));
    let gone = view(vec![vol("a")], vec![]);
    let w = plan(&gone, &vols, &snaps, &now());
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w
        .iter()
        .any(|w| matches!(w, Write::DeleteSnapshot { name } if name.starts_with("a-sys-"))));
    let marked = w.iter().find_map(|w| match w {
        Write::SnapshotStatus { status, .. } => Some(status.clone()),
        _ => None,
    });
    let marked = marked.unwrap();
    assert!(!marked.ready_to_use);
    assert!(marked
        .error
        .unwrap()
        .contains("snapshot user of volume a no longer exists"));
    // Marked once: the next plan has nothing to say.
    let (_, snaps) = realise_onto(snaps, &w);
    assert_eq!(plan(&gone, &vols, &snaps, &now()), vec![]);
}

fn realise_onto(mut snaps: Vec<Arc<Snapshot>>, writes: &[Write]) -> ((), Vec<Arc<Snapshot>>) {
    for w in writes {
        match w {
            Write::SnapshotStatus { name, status } => {
                for s in snaps.iter_mut() {
                    if s.metadata.name.as_deref() == Some(name) {
                        Arc::make_mut(s).status = Some(status.clone());
                    }
                }
            }
            Write::DeleteSnapshot { name } => {
                snaps.retain(|s| s.metadata.name.as_deref() != Some(name))
            }
            _ => {}
        }
    }
    ((), snaps)
}

#[test]
fn a_requested_snapshot_not_taken_yet_is_left_to_the_reconciler() {
    let v = view(vec![vol("a")], vec![]);
    let r = Snapshot::new(
        "mine",
        SnapshotSpec {
            volume: "a".into(),
            snapshot_name: None,
            create_snapshot: true,
            labels: Default::default(),
        },
    );
    assert_eq!(
        plan(&v, &[], &[Arc::new(r.clone())], &now()).len(),
        2,
        "only the volume's resource and status"
    );
    // Once taken, the engine snapshot is matched to it by engine name: no new resource.
    let v = view(vec![vol("a")], vec![snap("a", "mine", false)]);
    let w = plan(&v, &[], &[Arc::new(r)], &now());
    assert!(w.iter().any(|w| matches!(w, Write::SnapshotStatus { name, status } if name == "mine" && status.ready_to_use)));
    assert!(!w.iter().any(|w| matches!(w, Write::CreateSnapshot { .. })));
}

#[test]
fn a_full_clone_reports_progress_then_failure() {
    let mut copying = vol("c");
    copying.clone_state = api::CloneState::Copying;
    copying.operation = Some("op1".into());
    let op = api::Operation {
        id: "op1".into(),
        kind: api::OperationKind::FullClone,
        volume: "c".into(),
        state: api::OperationState::Running,
        done_bytes: 25 << 20,
        total_bytes: 100 << 20,
        // 100 s before now().
        started: "2027-01-15T07:58:20Z".into(),
        error: None,
        source: Some("a/s1".into()),
        reason: None,
        resent_bytes: 0,
        wire_bytes: 0,
        rate_bytes_per_sec: None,
        eta_seconds: None,
    };
    assert_eq!(
        operations_needed("n1", std::slice::from_ref(&copying), &[]),
        ["c"]
    );
    let mut v = view(vec![copying], vec![]);
    v.operations.insert("c".into(), op.clone());
    let first = plan(&v, &[], &[], &now());
    let (vols, _) = realise(&first);
    let st = vols[0].status.clone().unwrap();
    let clone = st.clone.unwrap();
    assert_eq!(
        (st.state.as_deref(), clone.state.as_str(), clone.progress),
        (Some("Cloning"), "initiated", Some(25))
    );
    assert_eq!(clone.origin.as_deref(), Some("a/s1"));
    assert_eq!(
        (clone.rate, clone.eta_seconds),
        (Some((25 << 20) / 100), Some(300))
    );

    // The copy fails: the daemon removes the volume; its last operation says why.
    assert_eq!(operations_needed("n1", &[], &vols), ["c"]);
    let mut failed = view(vec![], vec![]);
    failed.operations.insert(
        "c".into(),
        api::Operation {
            state: api::OperationState::Failed,
            error: Some("no space".into()),
            ..op
        },
    );
    let w = plan(&failed, &vols, &[], &now());
    let Some(Write::VolumeStatus { status, .. }) = w.first() else {
        panic!("{w:?}")
    };
    let c = status.clone.as_ref().unwrap();
    assert_eq!(
        (c.state.as_str(), c.reason.as_deref()),
        ("failed", Some("no space"))
    );
    assert_eq!(status.conditions[0].reason, "CloneFailed");
}

#[test]
fn a_volume_held_as_another_nodes_replica_gets_no_resource_nor_do_its_snapshots() {
    // "r" here is node n0's volume r's replica (its resources are n0's);
    // "a" is this node's own, with a snapshot of the same name.
    let mut replica = vol("r");
    replica.id = 2;
    replica
        .labels
        .insert(api::REPLICA_OF_LABEL.into(), "n0".into());
    let mut of_replica = snap("r", "s1", false);
    of_replica.id = 8;
    of_replica.volume_id = 2;
    let v = view(
        vec![vol("a"), replica],
        vec![snap("a", "s1", false), of_replica],
    );
    let w = plan(&v, &[], &[], &now());
    let made: Vec<&str> = w
        .iter()
        .filter_map(|w| match w {
            Write::CreateVolume { name, .. } => Some(name.as_str()),
            Write::CreateSnapshot { spec, .. } => Some(spec.volume.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(made, ["a", "a"], "{w:?}");
}

#[test]
fn other_nodes_resources_are_not_touched() {
    let mut other = Volume::new(
        "b",
        VolumeSpec {
            volume_name: None,
            size: "1Mi".into(),
            node: "n2".into(),
            data_source: None,
        },
    );
    other.status = Some(crate::crd::VolumeStatus {
        id: Some(3),
        ..Default::default()
    });
    let v = view(vec![], vec![]);
    assert_eq!(plan(&v, &[Arc::new(other)], &[], &now()), vec![]);
}

fn engine_name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z][a-z0-9]{0,6}",
        "[a-z][a-z0-9._-]{0,6}[a-z0-9]",
        "\\.[a-z]{1,6}"
    ]
}

proptest! {
    /// Whatever the engine holds, one plan makes the resources tell it, and
    /// a second plan on top writes nothing.
    #[test]
    fn plans_converge(names in proptest::collection::btree_set((0u8..3, engine_name(), any::<bool>()), 0..12)) {
        let vols: Vec<api::Volume> = (0..3).map(|i| vol(&format!("v{i}"))).collect();
        let snaps: Vec<api::Snapshot> = names
            .iter()
            .map(|(v, n, sys)| snap(&format!("v{v}"), n, *sys || n.starts_with('.')))
            .collect();
        let mut uniq = std::collections::HashSet::new();
        let snaps: Vec<_> = snaps.into_iter().filter(|s| uniq.insert((s.volume.clone(), s.name.clone()))).collect();
        let v = view(vols, snaps.clone());
        let first = plan(&v, &[], &[], &now());
        let (rv, rs) = realise(&first);
        prop_assert_eq!(rs.len(), snaps.len());
        prop_assert_eq!(plan(&v, &rv, &rs, &now()), vec![]);
    }
}

fn replica(node: &str, state: api::ReplicaState) -> api::ReplicaInfo {
    api::ReplicaInfo {
        node: node.into(),
        address: None,
        state,
        reason: (state != api::ReplicaState::Healthy).then(|| "connection lost".into()),
        since: "2026-12-07T10:00:00Z".into(),
        rebuild: None,
        last_rebuild: None,
    }
}

fn replicated(states: &[api::ReplicaState]) -> api::Volume {
    use api::ReplicaState::*;
    let mut v = vol("r");
    let state = if states.iter().all(|s| *s == Healthy) {
        api::ReplicationState::Healthy
    } else {
        api::ReplicationState::Degraded
    };
    v.replication = Some(api::Replication {
        generation: 3,
        state,
        replicas: ["n1", "n2"]
            .iter()
            .zip(states)
            .map(|(n, s)| replica(n, *s))
            .collect(),
        diskless: false,
    });
    v
}

/// The replication status of the one Volume resource.
fn replication_of(vols: &[Arc<Volume>]) -> crate::crd::ReplicationStatus {
    let status = vols[0].status.as_ref().expect("a status");
    status.replication.clone().expect("a replication status")
}

fn events(w: &[Write]) -> Vec<(bool, &str)> {
    w.iter()
        .filter_map(|w| match w {
            Write::VolumeEvent {
                warning, reason, ..
            } => Some((*warning, reason.as_str())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_replicated_volume_shows_its_replicas_and_each_change_of_state_is_an_event() {
    use api::ReplicaState::*;
    let v = view(vec![replicated(&[Healthy, Healthy])], vec![]);
    let first = plan(&v, &[], &[], &now());
    assert_eq!(events(&first), [], "a new resource has no event");
    let (mut vols, _) = realise(&first);
    let shown = replication_of(&vols);
    assert_eq!(
        (
            shown.state.as_str(),
            shown.front_end.as_str(),
            shown.generation
        ),
        ("Healthy", "n1", 3)
    );
    let nodes: Vec<(&str, &str)> = shown
        .replicas
        .iter()
        .map(|x| (x.node.as_str(), x.state.as_str()))
        .collect();
    assert_eq!(nodes, [("n1", "Healthy"), ("n2", "Healthy")]);

    // Each step: its writes, then the resources as they hold them after.
    let step = |vols: &mut Vec<Arc<Volume>>, v: &EngineView| {
        let w = plan(v, vols, &[], &now());
        for x in &w {
            if let Write::VolumeStatus { status, .. } = x {
                let mut r = (*vols[0]).clone();
                r.status = Some(status.clone());
                *vols = vec![Arc::new(r)];
            }
        }
        w
    };
    let w = step(
        &mut vols,
        &view(vec![replicated(&[Healthy, Faulted])], vec![]),
    );
    assert_eq!(events(&w), [(true, "Degraded")], "{w:?}");
    let note = w.iter().find_map(|x| match x {
        Write::VolumeEvent { note, .. } => Some(note.clone()),
        _ => None,
    });
    assert!(
        note.as_deref()
            .is_some_and(|n| n.contains("n2 (faulted: connection lost)")),
        "{note:?}"
    );

    let mut rebuilding = replicated(&[Healthy, Rebuilding]);
    rebuilding.replication.as_mut().unwrap().replicas[1].rebuild = Some(api::RebuildProgress {
        sent_bytes: 1 << 20,
        round_bytes: 4 << 20,
        round_sent_bytes: 1 << 20,
        started: "2026-12-07T10:01:00Z".into(),
        rate_bytes_per_second: 1 << 20,
        eta_seconds: Some(3),
    });
    let w = step(&mut vols, &view(vec![rebuilding], vec![]));
    assert_eq!(events(&w), [(false, "Rebuilding")], "{w:?}");
    let r = replication_of(&vols);
    assert_eq!(
        (r.replicas[1].progress, r.replicas[1].eta_seconds),
        (Some(25), Some(3))
    );

    let healthy = view(vec![replicated(&[Healthy, Healthy])], vec![]);
    let w = step(&mut vols, &healthy);
    assert_eq!(events(&w), [(false, "Rebuilt")], "{w:?}");
    assert_eq!(
        step(&mut vols, &healthy),
        vec![],
        "steady state writes nothing"
    );
}

#[test]
fn a_volume_taken_over_by_this_node_moves_its_resource_here_with_a_fenced_event() {
    use api::ReplicaState::*;
    // n1's resource; n2 took the volume over (its shared record says so)
    // and lists it as its front end's.
    let first = plan(
        &view(vec![replicated(&[Healthy, Healthy])], vec![]),
        &[],
        &[],
        &now(),
    );
    let (mut vols, _) = realise(&first);
    let mut r = (*vols[0]).clone();
    r.status.as_mut().unwrap().replica_set = Some(crate::crd::SharedReplicaSet {
        front_end: "n2".into(),
        generation: 4,
        replicas: vec![],
        diskless: false,
    });
    vols = vec![Arc::new(r)];
    let mut taken = replicated(&[Healthy, Faulted]);
    taken.replication.as_mut().unwrap().generation = 4;
    let there = EngineView {
        node: "n2".into(),
        ..view(vec![taken], vec![])
    };
    let w = plan(&there, &vols, &[], &now());
    assert_eq!(events(&w), [(true, "Fenced")], "{w:?}");
    let moved = w.iter().find_map(|x| match x {
        Write::CreateVolume { spec, .. } => Some(spec.node.as_str()),
        _ => None,
    });
    assert_eq!(moved, Some("n2"), "{w:?}");
    let note = w.iter().find_map(|x| match x {
        Write::VolumeEvent { note, .. } => Some(note.as_str()),
        _ => None,
    });
    assert!(
        note.is_some_and(|n| n.contains("taken over by node n2 at generation 4")
            && n.contains("node n1's front end is refused")),
        "{note:?}"
    );
    // Moved; n1 back, its volume not yet made n2's replica: n1's plan
    // neither takes the resource back nor tells of a move.
    let mut r = (*vols[0]).clone();
    r.spec.node = "n2".into();
    let vols = vec![Arc::new(r)];
    let back = view(vec![replicated(&[Healthy, Healthy])], vec![]);
    assert_eq!(plan(&back, &vols, &[], &now()), vec![]);
}
