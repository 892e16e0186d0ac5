//! Every client method against a stand-in daemon on a unix socket that
//! records each request and answers what the test tells it: the method,
//! the path (encoded), the query and the body each route sends, and how
//! each kind of answer is decoded.

use lamina_api as api;
use lamina_client::{Client, Error, StatusCode};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

/// A request as the stand-in received it.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    method: String,
    target: String,
    body: Option<serde_json::Value>,
}

/// The stand-in daemon: answers each connection's request with the next
/// canned answer (status, body) and records the request.
struct Fake {
    _dir: tempfile::TempDir,
    client: Client,
    seen: Arc<Mutex<Vec<Seen>>>,
    answers: Arc<Mutex<Vec<(u16, String)>>>,
}

impl Fake {
    fn start() -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("api.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let answers: Arc<Mutex<Vec<(u16, String)>>> = Arc::new(Mutex::new(Vec::new()));
        let (s, a) = (seen.clone(), answers.clone());
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let head_end = loop {
                    let n = conn.read(&mut chunk).await.unwrap();
                    assert!(n > 0, "the client closed before a whole request");
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8(buf[..head_end].to_vec()).unwrap();
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                while buf.len() < head_end + len {
                    let n = conn.read(&mut chunk).await.unwrap();
                    assert!(n > 0, "the client closed inside the body");
                    buf.extend_from_slice(&chunk[..n]);
                }
                let body = &buf[head_end..head_end + len];
                let mut first = head.lines().next().unwrap().split(' ');
                s.lock().unwrap().push(Seen {
                    method: first.next().unwrap().into(),
                    target: first.next().unwrap().into(),
                    body: (!body.is_empty()).then(|| serde_json::from_slice(body).unwrap()),
                });
                let (status, text) = a.lock().unwrap().remove(0);
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                    text.len()
                );
                conn.write_all(reply.as_bytes()).await.unwrap();
                conn.shutdown().await.unwrap();
            }
        });
        Fake {
            client: Client::unix(&sock),
            _dir: dir,
            seen,
            answers,
        }
    }

    /// The next answer: a status and a JSON value.
    fn answer(&self, status: u16, body: serde_json::Value) {
        let text = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        self.answers.lock().unwrap().push((status, text));
    }

    /// The last request: method, target, body.
    fn last(&self) -> Seen {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("a request")
    }
}

fn volume(name: &str) -> api::Volume {
    api::Volume {
        id: 1,
        name: name.into(),
        size: 1 << 20,
        created: "2025-01-01T00:00:00Z".into(),
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

fn snapshot(v: &str, name: &str) -> api::Snapshot {
    api::Snapshot {
        id: 2,
        volume_id: 1,
        volume_deleted: false,
        volume: v.into(),
        name: name.into(),
        created: "2025-01-01T00:00:00Z".into(),
        parent: None,
        children: vec![],
        system: false,
        labels: Default::default(),
        restore_size: 1 << 20,
        allocated_bytes: 0,
        exclusive_bytes: 0,
        shared_bytes: 0,
        clones: vec!["c".into()],
        export: None,
    }
}

fn export(name: &str) -> api::Export {
    api::Export {
        uri: format!("nbd+unix:///{name}?socket=/d/nbd.sock"),
        name: name.into(),
        read_only: false,
        connections: 2,
        file: None,
    }
}

fn operation() -> api::Operation {
    api::Operation {
        id: "op-1".into(),
        kind: api::OperationKind::FullClone,
        volume: "c".into(),
        state: api::OperationState::Running,
        done_bytes: 1,
        total_bytes: 2,
        started: "2025-01-01T00:00:00Z".into(),
        error: None,
        source: Some("a/s".into()),
        reason: None,
        resent_bytes: 0,
        wire_bytes: 0,
        rate_bytes_per_sec: None,
        eta_seconds: None,
    }
}

fn json<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap()
}

fn seen(method: &str, target: &str, body: Option<serde_json::Value>) -> Seen {
    Seen {
        method: method.into(),
        target: target.into(),
        body,
    }
}

#[tokio::test]
async fn volume_routes() {
    let f = Fake::start();
    let c = &f.client;

    f.answer(201, json(&volume("a b")));
    let req = api::CreateVolume {
        name: "a b".into(),
        size: 1 << 20,
        labels: [("tier".to_string(), "gold".to_string())].into(),
        replicas: vec!["b".into(), "c".into()],
    };
    let r = c.create_volume(&req).await.unwrap();
    assert!(r.created);
    assert_eq!(r.value, volume("a b"));
    assert_eq!(f.last(), seen("POST", "/v1/volumes", Some(json(&req))));
    f.answer(200, json(&volume("a b")));
    assert!(!c.create_volume(&req).await.unwrap().created);

    f.answer(200, json(&vec![volume("a")]));
    assert_eq!(c.list_volumes().await.unwrap(), vec![volume("a")]);
    assert_eq!(f.last(), seen("GET", "/v1/volumes", None));

    f.answer(200, json(&volume("a/b")));
    c.get_volume("a/b").await.unwrap();
    assert_eq!(f.last(), seen("GET", "/v1/volumes/a%2Fb", None));

    f.answer(200, json(&volume("a")));
    let ex = api::ExpandVolume { size: 2 << 20 };
    c.expand_volume("a", &ex).await.unwrap();
    assert_eq!(
        f.last(),
        seen("POST", "/v1/volumes/a/expand", Some(json(&ex)))
    );

    f.answer(200, json(&export("a")));
    assert_eq!(c.attach_volume("a").await.unwrap(), export("a"));
    assert_eq!(f.last(), seen("POST", "/v1/volumes/a/attach", None));
    f.answer(200, json(&export("a")));
    c.attach_volume_file("a").await.unwrap();
    assert_eq!(
        f.last(),
        seen("POST", "/v1/volumes/a/attach?file=true", None)
    );

    // Detach and delete: the Removed body, or an older daemon's empty 204.
    let gone = api::Removed {
        what: "export a".into(),
        existed: false,
        left: None,
    };
    f.answer(200, json(&gone));
    assert_eq!(c.detach_volume("a", false).await.unwrap(), gone);
    assert_eq!(f.last(), seen("POST", "/v1/volumes/a/detach", None));
    f.answer(204, serde_json::Value::Null);
    assert!(c.detach_volume("a", true).await.unwrap().existed);
    assert_eq!(
        f.last(),
        seen("POST", "/v1/volumes/a/detach?force=true", None)
    );

    f.answer(204, serde_json::Value::Null);
    let r = c.delete_volume("a", false).await.unwrap();
    assert_eq!(
        r,
        api::Removed {
            what: "volume a".into(),
            existed: true,
            left: None,
        }
    );
    assert_eq!(f.last(), seen("DELETE", "/v1/volumes/a", None));
    f.answer(200, json(&r));
    c.delete_volume("a", true).await.unwrap();
    assert_eq!(
        f.last(),
        seen("DELETE", "/v1/volumes/a?with_snapshots=true", None)
    );

    f.answer(202, json(&volume("a")));
    c.flatten_volume("a").await.unwrap();
    assert_eq!(f.last(), seen("POST", "/v1/volumes/a/flatten", None));
}

#[tokio::test]
async fn snapshot_clone_and_operation_routes() {
    let f = Fake::start();
    let c = &f.client;

    let req = api::CreateSnapshot {
        name: "s".into(),
        labels: [("k".to_string(), "v".to_string())].into(),
        freeze: true,
    };
    f.answer(201, json(&snapshot("a", "s")));
    assert!(c.create_snapshot("a", &req).await.unwrap().created);
    assert_eq!(
        f.last(),
        seen("POST", "/v1/volumes/a/snapshots", Some(json(&req)))
    );
    f.answer(200, json(&vec![snapshot("a", "s")]));
    c.list_snapshots("a").await.unwrap();
    assert_eq!(f.last(), seen("GET", "/v1/volumes/a/snapshots", None));
    f.answer(200, json(&vec![snapshot("a", "s")]));
    c.list_all_snapshots().await.unwrap();
    assert_eq!(f.last(), seen("GET", "/v1/snapshots", None));
    let filter = api::SnapshotFilter {
        name: Some("s".into()),
        id: Some(7),
        ..Default::default()
    };
    f.answer(200, json(&vec![snapshot("a", "s")]));
    c.find_snapshots(&filter).await.unwrap();
    assert_eq!(f.last(), seen("GET", "/v1/snapshots?name=s&id=7", None));
    f.answer(200, json(&snapshot("a", "s")));
    let s = c.get_snapshot("a", "s@1").await.unwrap();
    assert_eq!(s.clones, ["c"]);
    assert_eq!(f.last(), seen("GET", "/v1/volumes/a/snapshots/s%401", None));
    f.answer(200, json(&volume("a")));
    c.revert_snapshot("a", "s").await.unwrap();
    assert_eq!(
        f.last(),
        seen("POST", "/v1/volumes/a/snapshots/s/revert", None)
    );
    f.answer(200, json(&export("a@s")));
    c.attach_snapshot("a", "s").await.unwrap();
    assert_eq!(
        f.last(),
        seen("POST", "/v1/volumes/a/snapshots/s/attach", None)
    );
    f.answer(204, serde_json::Value::Null);
    assert_eq!(
        c.detach_snapshot("a", "s", false).await.unwrap().what,
        "export a@s"
    );
    assert_eq!(
        f.last(),
        seen("POST", "/v1/volumes/a/snapshots/s/detach", None)
    );
    f.answer(204, serde_json::Value::Null);
    assert_eq!(
        c.delete_snapshot("a", "s").await.unwrap().what,
        "snapshot a/s"
    );
    assert_eq!(f.last(), seen("DELETE", "/v1/volumes/a/snapshots/s", None));

    let req = api::CreateClone {
        name: "c".into(),
        from_snapshot: Some("a/s".into()),
        from_volume: None,
        full: true,
        from_node: None,
    };
    let answer = api::CloneCreated {
        volume: volume("c"),
        operation: Some(operation()),
    };
    f.answer(202, json(&answer));
    let r = c.create_clone(&req).await.unwrap();
    assert!(r.created);
    assert_eq!(r.value, answer);
    assert_eq!(f.last(), seen("POST", "/v1/clones", Some(json(&req))));

    f.answer(200, json(&vec![operation()]));
    c.list_operations(&Default::default()).await.unwrap();
    assert_eq!(f.last(), seen("GET", "/v1/operations", None));
    f.answer(200, json(&vec![operation()]));
    let filter = api::OperationFilter {
        volume: Some("a b".into()),
        state: Some(api::OperationState::Running),
        limit: Some(5),
    };
    c.list_operations(&filter).await.unwrap();
    assert_eq!(
        f.last(),
        seen(
            "GET",
            "/v1/operations?volume=a%20b&state=running&limit=5",
            None
        )
    );
    f.answer(200, json(&operation()));
    assert_eq!(c.get_operation("op-1").await.unwrap(), operation());
    assert_eq!(f.last(), seen("GET", "/v1/operations/op-1", None));
}

#[tokio::test]
async fn group_snapshot_routes() {
    let f = Fake::start();
    let c = &f.client;
    let group = api::SnapshotGroup {
        name: "g".into(),
        created: "2025-01-01T00:00:00Z".into(),
        snapshots: vec![snapshot("a", "g"), snapshot("b", "g")],
    };
    let req = api::CreateSnapshotGroup {
        name: "g".into(),
        volumes: vec!["b".into(), "a".into()],
        labels: [("k".to_string(), "v".to_string())].into(),
        freeze: false,
    };
    f.answer(201, json(&group));
    let r = c.create_snapshot_group(&req).await.unwrap();
    assert!(r.created);
    assert_eq!(r.value, group);
    assert_eq!(
        f.last(),
        seen("POST", "/v1/snapshot-groups", Some(json(&req)))
    );
    f.answer(200, json(&group));
    assert!(!c.create_snapshot_group(&req).await.unwrap().created);

    f.answer(200, json(&group));
    assert_eq!(c.get_snapshot_group("g 1").await.unwrap(), group);
    assert_eq!(f.last(), seen("GET", "/v1/snapshot-groups/g%201", None));
    f.answer(
        404,
        serde_json::json!({"code": "not_found", "message": "no group snapshot \"x\""}),
    );
    assert!(c.get_snapshot_group("x").await.unwrap_err().is_not_found());

    let gone = api::Removed {
        what: "snapshot group g".into(),
        existed: false,
        left: None,
    };
    f.answer(200, json(&gone));
    assert_eq!(c.delete_snapshot_group("g").await.unwrap(), gone);
    assert_eq!(f.last(), seen("DELETE", "/v1/snapshot-groups/g", None));
    f.answer(204, serde_json::Value::Null);
    let r = c.delete_snapshot_group("g").await.unwrap();
    assert_eq!((r.what.as_str(), r.existed), ("snapshot group g", true));
}

#[tokio::test]
async fn schedule_routes() {
    let f = Fake::start();
    let c = &f.client;
    let spec = api::ScheduleSpec {
        name: "hourly".into(),
        cron: "0 * * * *".into(),
        time_zone: "Europe/Paris".into(),
        keep_last: Some(24),
        keep_for_seconds: None,
        labels: [("k".to_string(), "v".to_string())].into(),
        volumes: vec!["a".into()],
        selector: Some(api::LabelSelector::parse("tier=gold").unwrap()),
        retry_window_seconds: None,
    };
    let sched = api::Schedule {
        id: "sch-1".into(),
        spec: spec.clone(),
        created: "2030-01-01T00:00:00Z".into(),
        next_runs: vec!["2030-01-01T01:00:00+01:00".into()],
        volumes: vec![],
        runs: vec![],
    };
    f.answer(201, json(&sched));
    let r = c.create_schedule(&spec).await.unwrap();
    assert!(r.created);
    assert_eq!(r.value, sched);
    assert_eq!(f.last(), seen("POST", "/v1/schedules", Some(json(&spec))));
    // The selector travels as a map of labels.
    assert_eq!(json(&spec)["selector"], serde_json::json!({"tier": "gold"}));
    f.answer(200, json(&vec![sched.clone()]));
    assert_eq!(c.list_schedules().await.unwrap(), vec![sched.clone()]);
    assert_eq!(f.last(), seen("GET", "/v1/schedules", None));
    f.answer(200, json(&sched));
    c.get_schedule("h 1").await.unwrap();
    assert_eq!(f.last(), seen("GET", "/v1/schedules/h%201", None));
    f.answer(200, json(&sched));
    c.update_schedule("old", &spec).await.unwrap();
    assert_eq!(
        f.last(),
        seen("PUT", "/v1/schedules/old", Some(json(&spec)))
    );
    let gone = api::ScheduleDeleted {
        existed: true,
        deleted: vec!["a/hourly-20300101-0100".into()],
        kept: vec![],
    };
    f.answer(200, json(&gone));
    let r = c
        .delete_schedule("hourly", api::SnapshotsAction::Delete)
        .await
        .unwrap();
    assert_eq!(r, gone);
    assert_eq!(
        f.last(),
        seen("DELETE", "/v1/schedules/hourly?snapshots=delete", None)
    );
    f.answer(200, json(&gone));
    c.delete_schedule("hourly", api::SnapshotsAction::Keep)
        .await
        .unwrap();
    assert_eq!(
        f.last(),
        seen("DELETE", "/v1/schedules/hourly?snapshots=keep", None)
    );
    let filter = api::SnapshotFilter {
        schedule: Some("hourly".into()),
        ..Default::default()
    };
    f.answer(200, json(&Vec::<api::Snapshot>::new()));
    c.find_snapshots(&filter).await.unwrap();
    assert_eq!(f.last(), seen("GET", "/v1/snapshots?schedule=hourly", None));
    f.answer(200, json(&vec![volume("a")]));
    let filter = api::VolumeFilter {
        selector: Some("tier=gold,app=db".into()),
    };
    c.find_volumes(&filter).await.unwrap();
    assert_eq!(
        f.last(),
        seen("GET", "/v1/volumes?selector=tier%3Dgold%2Capp%3Ddb", None)
    );
    let labels: std::collections::BTreeMap<String, String> =
        [("tier".to_string(), "gold".to_string())].into();
    f.answer(200, json(&volume("a")));
    c.set_volume_labels("a", &labels).await.unwrap();
    assert_eq!(
        f.last(),
        seen(
            "PUT",
            "/v1/volumes/a/labels",
            Some(serde_json::json!({"labels": {"tier": "gold"}}))
        )
    );
}

#[tokio::test]
async fn daemon_routes_and_errors() {
    let f = Fake::start();
    let c = &f.client;
    let health = api::Health {
        version: "0.1.0".into(),
        data_dir: "/d".into(),
        nbd_socket: "/d/nbd.sock".into(),
        volumes: 1,
        snapshots: 2,
        pool_used_bytes: 3,
        capacity_bytes: 4,
        warnings: vec!["the pool is 95% full".into()],
    };
    f.answer(200, json(&health));
    assert_eq!(c.health().await.unwrap(), health);
    assert_eq!(f.last(), seen("GET", "/v1/health", None));
    f.answer(200, serde_json::json!({"openapi": "3.1.0"}));
    assert_eq!(c.openapi().await.unwrap()["openapi"], "3.1.0");
    assert_eq!(f.last(), seen("GET", "/openapi.json", None));
    let changes = api::Changes {
        epoch: "e1".into(),
        seq: 7,
    };
    f.answer(200, json(&changes));
    let wait = std::time::Duration::from_secs(30);
    assert_eq!(c.changes(Some(6), Some("e1"), wait).await.unwrap(), changes);
    assert_eq!(
        f.last(),
        seen("GET", "/v1/changes?after=6&epoch=e1&wait_ms=30000", None)
    );
    f.answer(200, json(&changes));
    c.changes(None, None, std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(f.last(), seen("GET", "/v1/changes?wait_ms=0", None));

    // A refusal: status, code, message and hint.
    f.answer(
        409,
        serde_json::json!({"code": "conflict", "message": "2 NBD clients are connected", "hint": "pass force"}),
    );
    let e = c.detach_volume("a", false).await.unwrap_err();
    assert!(e.is_conflict());
    assert_eq!(e.status(), Some(StatusCode::CONFLICT));
    assert_eq!(e.to_string(), "2 NBD clients are connected");
    assert_eq!(e.hint(), Some("pass force"));

    // A success whose body is not the promised shape.
    f.answer(200, serde_json::json!({"unexpected": true}));
    let e = c.get_volume("a").await.unwrap_err();
    assert!(matches!(e, Error::Protocol { .. }), "{e:?}");
}

#[tokio::test]
async fn space_routes() {
    let f = Fake::start();
    let c = &f.client;
    let space = api::PoolSpace {
        capacity_bytes: 100,
        used_bytes: 40,
        free_bytes: 60,
        snapshot_only_bytes: 12,
        snapshot_only_metadata_bytes: 4,
        volumes: 1,
        snapshots: 2,
        high_water: "90%".into(),
        high_water_bytes: 90,
        reclaim_pending: false,
        warnings: vec![],
    };
    f.answer(200, json(&space));
    assert_eq!(c.pool_space().await.unwrap(), space);
    assert_eq!(f.last(), seen("GET", "/v1/pool", None));
    let req = api::PruneSnapshots {
        selector: Some("tier=bronze".into()),
        older_than_seconds: Some(7 * 86_400),
        schedule: None,
        dry_run: true,
    };
    let result = api::PruneResult {
        volume: "v 1".into(),
        dry_run: true,
        deleted: vec![api::PrunedSnapshot {
            name: "d1".into(),
            created: "2030-01-01T00:00:00Z".into(),
            exclusive_bytes: 4096,
        }],
        kept: vec![api::KeptSnapshot {
            snapshot: "d4".into(),
            reason: "linked clones depend on it: x".into(),
        }],
        freed_bytes: 8192,
    };
    f.answer(200, json(&result));
    assert_eq!(c.prune_snapshots("v 1", &req).await.unwrap(), result);
    assert_eq!(
        f.last(),
        seen(
            "POST",
            "/v1/volumes/v%201/prune-snapshots",
            Some(json(&req))
        )
    );
}

#[tokio::test]
async fn node_routes() {
    let f = Fake::start();
    let c = &f.client;
    let req = api::AddNode {
        name: "n2".into(),
        address: "[fd00::2]:7481".into(),
    };
    let node = api::Node {
        name: "n2".into(),
        address: "[fd00::2]:7481".into(),
        added: "2030-01-01T00:00:00Z".into(),
    };
    f.answer(201, json(&node));
    let r = c.add_node(&req).await.unwrap();
    assert!(r.created);
    assert_eq!(r.value, node);
    assert_eq!(f.last(), seen("POST", "/v1/nodes", Some(json(&req))));
    f.answer(200, json(&node));
    assert!(!c.add_node(&req).await.unwrap().created);
    f.answer(200, json(&vec![node.clone()]));
    assert_eq!(c.list_nodes().await.unwrap(), vec![node.clone()]);
    assert_eq!(f.last(), seen("GET", "/v1/nodes", None));
    f.answer(200, json(&node));
    assert_eq!(c.get_node("n2").await.unwrap(), node);
    assert_eq!(f.last(), seen("GET", "/v1/nodes/n2", None));
    let removed = api::Removed {
        what: "node n2".into(),
        existed: true,
        left: None,
    };
    f.answer(200, json(&removed));
    assert_eq!(c.remove_node("n2").await.unwrap(), removed);
    assert_eq!(f.last(), seen("DELETE", "/v1/nodes/n2", None));
    // A clone naming its source node alone sends no address.
    let clone = api::CreateClone {
        name: "c".into(),
        from_snapshot: Some("v/s".into()),
        from_volume: None,
        full: false,
        from_node: Some(api::PeerNode {
            name: "n2".into(),
            address: String::new(),
        }),
    };
    assert_eq!(
        serde_json::from_value::<api::CreateClone>(serde_json::json!({
            "name": "c", "from_snapshot": "v/s", "from_node": {"name": "n2"}
        }))
        .unwrap(),
        clone
    );
}
