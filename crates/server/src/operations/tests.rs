//! The operations' tests: recovery, the record beside a snapshot's commit,
//! a copy's hold on its volumes.

use super::*;
use crate::state::now;
use crate::store::CopyRec;
use lamina_api as api;

async fn state() -> (tempfile::TempDir, Arc<State>) {
    let d = tempfile::tempdir().unwrap();
    let layout = crate::Layout::new(d.path());
    layout.prepare().unwrap();
    let config = crate::Config::new(d.path());
    let st = Arc::new(State::open(&layout, &config).await.unwrap());
    (d, st)
}

/// A full clone is running (recorded as such) from src/s into x.
async fn copying(st: &Arc<State>) {
    run(
        st,
        Op::CreateVolume {
            name: "src".into(),
            size: 1 << 20,
            labels: Default::default(),
            replicas: Vec::new(),
        },
    )
    .await
    .unwrap();
    run(
        st,
        Op::CreateSnapshot {
            volume: "src".into(),
            name: "s".into(),
            labels: Default::default(),
        },
    )
    .await
    .unwrap();
    st.pool.create_volume("x", 1 << 20).unwrap();
    let mut rec = OpRec {
        id: new_record(Op::Flatten { name: "x".into() }).id,
        op: Op::Clone {
            name: "x".into(),
            source: CloneSource::Snapshot {
                volume: "src".into(),
                snapshot: "s".into(),
            },
            full: true,
        },
        state: api::OperationState::Running,
        started: now(),
        error: None,
        done_bytes: 0,
        total_bytes: 0,
        copy: Some(CopyRec::new("src".into(), "s".into(), false)),
        reason: None,
    };
    st.transition(&mut rec, Step::Start).unwrap();
}

/// A daemon killed while it took or deleted a group finishes the job at
/// restart: the group is all there, or all gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_operations_interrupted_by_a_restart_are_finished() {
    let (_d, st) = state().await;
    for v in ["a", "b"] {
        st.pool.create_volume(v, 1 << 20).unwrap();
    }
    let vols = vec!["a".to_string(), "b".to_string()];
    let mut create = new_record(Op::CreateSnapshotGroup {
        name: "g".into(),
        volumes: vols.clone(),
        labels: [("k".to_string(), "v".to_string())].into(),
    });
    st.transition(&mut create, Step::Start).unwrap();
    assert_eq!(
        st.operations(&api::OperationFilter {
            volume: Some("b".into()),
            ..Default::default()
        })
        .unwrap()
        .len(),
        1,
        "a group's record is found under each volume"
    );
    recover(&st).await.unwrap();
    let m = groups::members(&st.pool, "g").unwrap();
    assert_eq!(m.len(), 2);
    let rec = st.store.op(&create.id).unwrap().unwrap();
    assert_eq!(rec.state, api::OperationState::Succeeded, "{:?}", rec.error);
    // Killed half-way through a delete: one member gone already.
    st.pool.delete_snapshot("a", "g").unwrap();
    let mut delete = new_record(Op::DeleteSnapshotGroup {
        name: "g".into(),
        volumes: vols,
    });
    st.transition(&mut delete, Step::Start).unwrap();
    recover(&st).await.unwrap();
    assert!(groups::members(&st.pool, "g").unwrap().is_empty());
    let rec = st.store.op(&delete.id).unwrap().unwrap();
    assert_eq!(rec.state, api::OperationState::Succeeded, "{:?}", rec.error);
    st.close().await.unwrap();
}

/// A snapshot's creation is recorded beside the engine's commit, not
/// before it. Answered, it is recorded and done; a daemon that died
/// with the snapshot made and no record of it restarts with nothing to
/// run again, and the client's retry by name is answered with the
/// snapshot as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_is_recorded_beside_its_commit_and_a_missing_record_changes_nothing() {
    let (_d, st) = state().await;
    st.pool.create_volume("v", 1 << 20).unwrap();
    let snap = |name: &str| Op::CreateSnapshot {
        volume: "v".into(),
        name: name.into(),
        labels: Default::default(),
    };
    let Outcome::Snapshot { info, created } = run(&st, snap("s")).await.unwrap() else {
        panic!("a snapshot's creation answers with the snapshot");
    };
    assert!(created);
    let ops = st.store.ops().unwrap();
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].state, api::OperationState::Succeeded);
    // The engine has a snapshot the store never recorded (the daemon
    // died before the record's sync ended).
    let lost = st.pool.create_snapshot("v", "t", &[]).unwrap();
    recover(&st).await.unwrap();
    assert_eq!(st.store.ops().unwrap().len(), 1, "nothing to run again");
    assert_eq!(st.pool.list_snapshots("v").unwrap().len(), 2);
    let Outcome::Snapshot {
        info: again,
        created,
    } = run(&st, snap("t")).await.unwrap()
    else {
        panic!("a snapshot's creation answers with the snapshot");
    };
    assert!(!created, "the retry found the snapshot");
    assert_eq!((again.id, again.created), (lost.id, lost.created));
    assert_ne!(again.id, info.id);
    st.close().await.unwrap();
}

/// The received count a pull keeps beside the store goes with its
/// operation: one that failed at recovery, or one left by an
/// operation that is gone, is removed; a running pull's stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn received_counts_of_pulls_not_running_are_removed_at_recovery() {
    let (_d, st) = state().await;
    let dir = st.layout.root.join("transfers");
    std::fs::create_dir_all(&dir).unwrap();
    let count = |id: &str| dir.join(format!("{id}.received"));
    // This node has no transfer identity: the pull fails at recovery.
    let mut pull = new_record(Op::Clone {
        name: "x".into(),
        source: CloneSource::Remote {
            node: "n2".into(),
            address: "127.0.0.1:1".into(),
            volume: "src".into(),
            snapshot: "s".into(),
        },
        full: true,
    });
    st.transition(&mut pull, Step::Start).unwrap();
    std::fs::write(count(&pull.id), 7u64.to_le_bytes()).unwrap();
    std::fs::write(count("op-gone"), 7u64.to_le_bytes()).unwrap();
    std::fs::write(dir.join("unrelated"), b"x").unwrap();
    recover(&st).await.unwrap();
    let rec = st.store.op(&pull.id).unwrap().unwrap();
    assert_eq!(rec.state, api::OperationState::Failed);
    assert!(!count(&pull.id).exists());
    assert!(!count("op-gone").exists());
    assert!(dir.join("unrelated").exists(), "only received counts go");
    // A running operation keeps its count.
    std::fs::write(count("op-running"), 7u64.to_le_bytes()).unwrap();
    crate::jobs::pull::sweep_received(&st, &["op-running"]);
    assert!(count("op-running").exists());
    st.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_in_progress_holds_its_volume_and_its_source() {
    let (_d, st) = state().await;
    copying(&st).await;
    let code = |r: Result<Outcome, Failure>| r.err().map(|f| (f.0.as_u16(), f.1.message));
    let (status, msg) = code(
        run(
            &st,
            Op::DeleteVolume {
                name: "x".into(),
                with_snapshots: true,
            },
        )
        .await,
    )
    .unwrap();
    assert_eq!(status, 409);
    assert!(msg.contains("still copying into volume \"x\""), "{msg}");
    let (status, msg) = code(
        run(
            &st,
            Op::DeleteSnapshot {
                volume: "src".into(),
                name: "s".into(),
            },
        )
        .await,
    )
    .unwrap();
    assert_eq!(status, 409);
    assert!(msg.contains("copying from snapshot src/s"), "{msg}");
    let (status, _) = code(
        run(
            &st,
            Op::DeleteVolume {
                name: "src".into(),
                with_snapshots: true,
            },
        )
        .await,
    )
    .unwrap();
    assert_eq!(status, 409);
    assert_eq!(
        st.volume(st.pool.volume_info_by_name("x").unwrap())
            .clone_state,
        api::CloneState::Copying
    );
    // Nor can it be snapshotted, expanded or cloned until it is whole.
    for op in [
        Op::CreateSnapshot {
            volume: "x".into(),
            name: "half".into(),
            labels: Default::default(),
        },
        Op::ExpandVolume {
            name: "x".into(),
            size: 2 << 20,
        },
        Op::Clone {
            name: "y".into(),
            source: CloneSource::Volume { volume: "x".into() },
            full: false,
        },
    ] {
        let (status, msg) = code(run(&st, op).await).unwrap();
        assert_eq!(status, 409, "{msg}");
    }
    // Asking again for the same full clone is answered with it.
    let again = run(
        &st,
        Op::Clone {
            name: "x".into(),
            source: CloneSource::Snapshot {
                volume: "src".into(),
                snapshot: "s".into(),
            },
            full: true,
        },
    )
    .await;
    assert!(
        matches!(
            again,
            Ok(Outcome::Started {
                created: false,
                running: Some(_),
                ..
            })
        ),
        "{:?}",
        again.err().map(|f| f.1.message)
    );
    // Nothing was deleted or made.
    assert!(st.pool.snapshot_info_by_name("src", "s").is_ok());
    assert!(st.pool.volume_info_by_name("x").is_ok());
    assert!(st.pool.volume_info_by_name("y").is_err());
    assert!(st.pool.list_snapshots("x").unwrap().is_empty());
    st.close().await.unwrap();
}

#[tokio::test]
async fn setting_labels_keeps_the_systems_and_refuses_them_asked() {
    let (_d, st) = state().await;
    st.pool.create_volume("r", 1 << 20).unwrap();
    let system = [(crate::replicas::REPLICA_OF.to_string(), "n1".to_string())];
    st.pool.set_volume_labels("r", &system).unwrap();
    let mut asked = BTreeMap::from([("tier".to_string(), "gold".to_string())]);
    let out = run(
        &st,
        Op::SetVolumeLabels {
            name: "r".into(),
            labels: asked.clone(),
        },
    )
    .await
    .unwrap();
    let Outcome::Volume { info, .. } = out else {
        panic!("setting labels answered no volume")
    };
    // A replica stays a replica: its front end's label is the system's.
    let want = vec![
        (crate::replicas::REPLICA_OF.to_string(), "n1".to_string()),
        ("tier".to_string(), "gold".to_string()),
    ];
    assert_eq!(info.labels, want);
    asked.insert(crate::replicas::REPLICA_OF.to_string(), "n2".to_string());
    let refused = run(
        &st,
        Op::SetVolumeLabels {
            name: "r".into(),
            labels: asked,
        },
    )
    .await;
    assert!(refused.is_err(), "a system label was set");
    assert_eq!(st.pool.volume_info_by_name("r").unwrap().labels, want);
}

/// Another node's replica: no snapshot made, deleted or reverted to, no
/// group taken or deleted and no size changed here (conflict, naming its
/// front end, nothing changed); its labels change, and it is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_changes_only_through_its_front_end() {
    let (_d, st) = state().await;
    st.pool.create_volume("r", 1 << 20).unwrap();
    st.pool.create_snapshot("r", "s", &[]).unwrap();
    crate::replicas::relabel(&st.pool, "r", Some("front")).unwrap();
    let vols = vec!["r".to_string()];
    for op in [
        Op::CreateSnapshot {
            volume: "r".into(),
            name: "t".into(),
            labels: Default::default(),
        },
        Op::DeleteSnapshot {
            volume: "r".into(),
            name: "s".into(),
        },
        Op::Revert {
            volume: "r".into(),
            snapshot: "s".into(),
        },
        Op::ExpandVolume {
            name: "r".into(),
            size: 2 << 20,
        },
        Op::CreateSnapshotGroup {
            name: "g".into(),
            volumes: vols.clone(),
            labels: Default::default(),
        },
    ] {
        let kind = op.kind();
        let Err(e) = run(&st, op).await else {
            panic!("{kind}: done on a replica")
        };
        assert_eq!(
            e.1.code,
            api::ErrorCode::Conflict,
            "{kind}: {}",
            e.1.message
        );
        assert!(
            e.1.message.contains("replica of node front's volume"),
            "{kind}: {}",
            e.1.message
        );
        assert!(e.1.hint.as_deref().unwrap().contains("node front"));
    }
    // A group the replica's front end took (its label on the member).
    st.pool
        .create_snapshot("r", "g", &[(lamina_engine::GROUP_LABEL.into(), "g".into())])
        .unwrap();
    let Err(e) = run(
        &st,
        Op::DeleteSnapshotGroup {
            name: "g".into(),
            volumes: vols,
        },
    )
    .await
    else {
        panic!("a group deleted on a replica")
    };
    assert_eq!(e.1.code, api::ErrorCode::Conflict, "{}", e.1.message);
    let names: Vec<String> = st
        .pool
        .list_snapshots("r")
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["s", "g"], "nothing changed");
    assert_eq!(st.pool.volume_info_by_name("r").unwrap().size, 1 << 20);
    // Nothing was recorded for them.
    assert!(st
        .operations(&api::OperationFilter::default())
        .unwrap()
        .is_empty());

    run(
        &st,
        Op::SetVolumeLabels {
            name: "r".into(),
            labels: [("k".to_string(), "v".to_string())].into(),
        },
    )
    .await
    .map_err(|e| e.1.message)
    .unwrap();
    run(
        &st,
        Op::DeleteVolume {
            name: "r".into(),
            with_snapshots: true,
        },
    )
    .await
    .map_err(|e| e.1.message)
    .unwrap();
    assert!(st.pool.volume_info_by_name("r").is_err());
}

/// A volume fronted here with no replica of it (a `diskless` record, no
/// volume in the pool) is neither changed here nor hidden by a volume made
/// under its name; it is listed from its record; deleting it asks its
/// replicas' nodes first, and one that does not answer leaves everything
/// as it was.
#[tokio::test]
async fn a_volume_fronted_with_no_replica_is_served_and_deleted_here_only() {
    let (_d, st) = state().await;
    let rec = crate::store::ReplicaSetRec {
        volume_id: 0,
        generation: 3,
        replicas: ["n1", "n2"]
            .iter()
            .map(|n| crate::store::ReplicaRec {
                node: n.to_string(),
                // Nothing listens there.
                address: "127.0.0.1:9".into(),
                since: 1,
                ..Default::default()
            })
            .collect(),
        dirty: Vec::new(),
        diskless: true,
        size: 1 << 20,
    };
    st.store.put_replica_set("d", &rec).unwrap();
    let label = [("k".to_string(), "v".to_string())].into();
    for op in [
        Op::CreateSnapshot {
            volume: "d".into(),
            name: "t".into(),
            labels: Default::default(),
        },
        Op::ExpandVolume {
            name: "d".into(),
            size: 2 << 20,
        },
        Op::SetVolumeLabels {
            name: "d".into(),
            labels: label,
        },
        Op::CreateVolume {
            name: "d".into(),
            size: 1 << 20,
            labels: Default::default(),
            replicas: Vec::new(),
        },
        Op::AddReplica {
            volume: "d".into(),
            node: "n3".into(),
        },
    ] {
        let kind = op.kind();
        let Err(e) = run(&st, op).await else {
            panic!("{kind}: done on a volume fronted with no replica")
        };
        assert_eq!(
            e.1.code,
            api::ErrorCode::Conflict,
            "{kind}: {}",
            e.1.message
        );
        assert!(
            e.1.message.contains("holds no replica") && e.1.message.contains("n1, n2"),
            "{kind}: {}",
            e.1.message
        );
    }
    assert!(st.pool.volume_info_by_name("d").is_err(), "nothing made");
    let listed = crate::front::diskless_sets(&st.store, &st.pool).unwrap();
    assert_eq!(listed.len(), 1);
    let shown = st.diskless_volume(listed[0].0.clone(), listed[0].1.clone());
    assert_eq!(shown.size, 1 << 20);
    assert!(shown.replication.unwrap().diskless);

    // No transfer identity here: its replicas cannot be asked, and
    // nothing changes.
    let Err(e) = run(
        &st,
        Op::DeleteVolume {
            name: "d".into(),
            with_snapshots: false,
        },
    )
    .await
    else {
        panic!("deleted without asking its replicas' nodes")
    };
    assert_eq!(e.1.code, api::ErrorCode::Invalid, "{}", e.1.message);
    assert_eq!(st.store.replica_set("d").unwrap(), Some(rec));
}
