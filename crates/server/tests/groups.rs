//! Group snapshots through the daemon's API: one instant of several
//! volumes (read back through NBD), the same-name rules, deletion, the
//! operation records, concurrent identical requests, and the routes'
//! declaration in /openapi.json.

mod support;

use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use support::{qemu_io, qemu_io_ro, Daemon};

const MIB: u64 = 1 << 20;

fn create_volume(d: &Daemon, name: &str) {
    let b = json!({"name": name, "size": 4 * MIB}).to_string();
    d.ok(Method::POST, "/v1/volumes", Some(&b));
}

fn group(d: &Daemon, body: Value) -> (StatusCode, Value) {
    d.call(Method::POST, "/v1/snapshot-groups", Some(&body.to_string()))
}

fn refused(d: &Daemon, body: Value, status: StatusCode, code: &str, says: &str) {
    let (s, e) = group(d, body.clone());
    assert_eq!((s, e["code"].as_str()), (status, Some(code)), "{body}: {e}");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains(says), "{body}: {msg:?} should say {says:?}");
}

#[test]
fn a_group_holds_one_instant_of_every_volume_and_follows_the_same_name_rules() {
    let d = Daemon::start();
    let mut uris = Vec::new();
    for (i, v) in ["c", "a", "b"].iter().enumerate() {
        create_volume(&d, v);
        let uri = d.attach(&format!("/v1/volumes/{v}"));
        qemu_io(&uri, &[&format!("write -P {} 0 64k", 0x10 + i)]);
        uris.push(uri);
    }
    let (s, g) = group(
        &d,
        json!({"name": "g1", "volumes": ["c", "a", "b"], "labels": {"app": "db"}}),
    );
    assert_eq!(s, StatusCode::CREATED, "{g}");
    // Written after the group: the members do not see it.
    for uri in &uris {
        qemu_io(uri, &["write -P 0x77 0 64k"]);
    }
    assert_eq!(g["name"], "g1");
    let members = g["snapshots"].as_array().unwrap();
    let vols: Vec<&str> = members
        .iter()
        .map(|m| m["volume"].as_str().unwrap())
        .collect();
    assert_eq!(vols, ["a", "b", "c"], "ordered by volume name");
    for m in members {
        assert_eq!(m["name"], "g1");
        assert_eq!(m["created"], g["created"]);
        assert_eq!(m["labels"], json!({"app": "db", "lamina.io/group": "g1"}));
    }
    for (i, v) in ["c", "a", "b"].iter().enumerate() {
        let uri = d.attach(&format!("/v1/volumes/{v}/snapshots/g1"));
        qemu_io_ro(&uri, &[&format!("read -P {} 0 64k", 0x10 + i)]);
    }
    let got = d.ok(Method::GET, "/v1/snapshot-groups/g1", None);
    let ids = |g: &Value| -> Vec<(Value, Value, Value)> {
        g["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["id"].clone(), m["volume"].clone(), m["created"].clone()))
            .collect()
    };
    assert_eq!((&got["name"], &got["created"]), (&g["name"], &g["created"]));
    assert_eq!(ids(&got), ids(&g));
    // The members are attached now: their exports show.
    assert!(got["snapshots"][0]["export"]["read_only"] == true, "{got}");

    // The same group again, volumes in any order: 200, the group as it is.
    let (s, again) = group(
        &d,
        json!({"name": "g1", "volumes": ["b", "c", "a"], "labels": {"app": "db"}}),
    );
    assert_eq!(s, StatusCode::OK, "{again}");
    assert_eq!(again["created"], g["created"]);
    // The same name with other volumes, other labels, or on a volume with a
    // plain snapshot of that name: 409, naming the clash.
    let exists = StatusCode::CONFLICT;
    refused(
        &d,
        json!({"name": "g1", "volumes": ["a", "b"], "labels": {"app": "db"}}),
        exists,
        "already_exists",
        "of volumes [\"a\", \"b\", \"c\"]",
    );
    refused(
        &d,
        json!({"name": "g1", "volumes": ["a", "b", "c"]}),
        exists,
        "already_exists",
        "other labels",
    );
    d.ok(
        Method::POST,
        "/v1/volumes/b/snapshots",
        Some(&json!({"name": "plain"}).to_string()),
    );
    refused(
        &d,
        json!({"name": "plain", "volumes": ["a", "b"]}),
        exists,
        "already_exists",
        "volume \"b\" already has a snapshot \"plain\"",
    );
    // A missing volume: 404, and nothing made on the others.
    refused(
        &d,
        json!({"name": "g2", "volumes": ["a", "nope"]}),
        StatusCode::NOT_FOUND,
        "not_found",
        "nope",
    );
    assert!(d
        .ok(Method::GET, "/v1/snapshots?name=g2", None)
        .as_array()
        .unwrap()
        .is_empty());
    // Bad input: 400.
    let bad = StatusCode::BAD_REQUEST;
    for (body, says) in [
        (json!({"name": "g2", "volumes": []}), "at least one volume"),
        (json!({"name": "g2", "volumes": ["a", "a"]}), "named twice"),
        (json!({"name": "G 2", "volumes": ["a"]}), "name"),
        (
            json!({"name": "g2", "volumes": ["a"], "labels": {"lamina.io/group": "x"}}),
            "reserved",
        ),
        (json!({"name": "g2"}), "malformed"),
    ] {
        refused(&d, body, bad, "invalid", says);
    }
    // A plain snapshot may not pass for a member.
    let (s, e) = d.call(
        Method::POST,
        "/v1/volumes/a/snapshots",
        Some(&json!({"name": "s", "labels": {"lamina.io/group": "g1"}}).to_string()),
    );
    assert_eq!(s, bad, "{e}");
    let (s, e) = d.call(Method::GET, "/v1/snapshot-groups/plain", None);
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );

    // The group was recorded, under each of its volumes.
    let ops = d.ok(Method::GET, "/v1/operations?volume=c", None);
    let kinds: Vec<&str> = ops
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"create-snapshot-group"), "{ops}");

    // Delete: refused while a member is attached, then every member goes.
    let (s, e) = d.call(Method::DELETE, "/v1/snapshot-groups/g1", None);
    assert_eq!(s, StatusCode::CONFLICT, "{e}");
    assert!(e["message"].as_str().unwrap().contains("attached"), "{e}");
    assert_eq!(
        d.ok(Method::GET, "/v1/snapshot-groups/g1", None)["snapshots"]
            .as_array()
            .unwrap()
            .len(),
        3,
        "a refused delete deletes nothing"
    );
    for v in ["a", "b", "c"] {
        d.ok(
            Method::POST,
            &format!("/v1/volumes/{v}/snapshots/g1/detach"),
            None,
        );
    }
    let r = d.ok(Method::DELETE, "/v1/snapshot-groups/g1", None);
    assert_eq!(r, json!({"what": "snapshot group g1", "existed": true}));
    let r = d.ok(Method::DELETE, "/v1/snapshot-groups/g1", None);
    assert_eq!(r, json!({"what": "snapshot group g1", "existed": false}));
    let (s, _) = d.call(Method::GET, "/v1/snapshot-groups/g1", None);
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(d
        .ok(Method::GET, "/v1/snapshots?name=g1", None)
        .as_array()
        .unwrap()
        .is_empty());
    // The volumes kept their data.
    for uri in &uris {
        qemu_io(uri, &["read -P 0x77 0 64k"]);
    }
}

#[test]
fn concurrent_identical_groups_answer_201_exactly_once_and_overlapping_ones_all_succeed() {
    let d = Daemon::start();
    for v in ["a", "b", "c"] {
        create_volume(&d, v);
    }
    let socket = d.socket();
    let body = json!({"name": "g", "volumes": ["a", "b", "c"], "labels": {"k": "v"}}).to_string();
    let statuses: Vec<StatusCode> = d.rt.block_on(async {
        let calls: Vec<_> = (0..20)
            .map(|i| {
                // Volumes in another order every other time.
                let b = if i % 2 == 0 {
                    body.clone()
                } else {
                    json!({"name": "g", "volumes": ["c", "b", "a"], "labels": {"k": "v"}})
                        .to_string()
                };
                tokio::spawn(support::send(
                    socket.clone(),
                    Method::POST,
                    "/v1/snapshot-groups",
                    Some(b),
                ))
            })
            .collect();
        let mut out = Vec::new();
        for c in calls {
            out.push(c.await.unwrap().unwrap().0);
        }
        out
    });
    let count = |want: StatusCode| statuses.iter().filter(|s| **s == want).count();
    assert_eq!(
        (count(StatusCode::CREATED), count(StatusCode::OK)),
        (1, 19),
        "{statuses:?}"
    );
    // Different groups over overlapping volumes, in opposite orders, at
    // once: each is taken whole (no deadlock, no mix).
    let statuses: Vec<StatusCode> = d.rt.block_on(async {
        let calls: Vec<_> = (0..12)
            .map(|i| {
                let vols = if i % 2 == 0 {
                    json!(["a", "b", "c"])
                } else {
                    json!(["c", "b"])
                };
                let b = json!({"name": format!("o{i}"), "volumes": vols}).to_string();
                tokio::spawn(support::send(
                    socket.clone(),
                    Method::POST,
                    "/v1/snapshot-groups",
                    Some(b),
                ))
            })
            .collect();
        let mut out = Vec::new();
        for c in calls {
            out.push(c.await.unwrap().unwrap().0);
        }
        out
    });
    assert!(
        statuses.iter().all(|s| *s == StatusCode::CREATED),
        "{statuses:?}"
    );
    for i in 0..12 {
        let g = d.ok(Method::GET, &format!("/v1/snapshot-groups/o{i}"), None);
        let n = g["snapshots"].as_array().unwrap().len();
        assert_eq!(n, if i % 2 == 0 { 3 } else { 2 }, "{g}");
    }
}

#[test]
fn the_document_declares_the_group_routes() {
    let d = Daemon::start();
    let doc = d.ok(Method::GET, "/openapi.json", None);
    let p = &doc["paths"];
    for (path, method, statuses) in [
        (
            "/v1/snapshot-groups",
            "post",
            &["200", "201", "400", "404", "409", "500", "503", "507"][..],
        ),
        (
            "/v1/snapshot-groups/{name}",
            "get",
            &["200", "404", "500", "503"][..],
        ),
        (
            "/v1/snapshot-groups/{name}",
            "delete",
            &["200", "409", "500", "503"][..],
        ),
    ] {
        let op = &p[path][method];
        let declared: Vec<&String> = op["responses"].as_object().unwrap().keys().collect();
        for s in statuses {
            assert!(declared.iter().any(|d| d == s), "{method} {path}: no {s}");
        }
    }
    assert!(doc["components"]["schemas"]["SnapshotGroup"].is_object());
    assert!(doc["components"]["schemas"]["CreateSnapshotGroup"].is_object());
}

#[test]
fn a_frozen_snapshot_of_an_attached_volume_needs_the_node_plugin_and_is_refused_without_it() {
    // No CSI node plugin serves DATA/freeze.sock here. A volume nobody
    // attached has no mount to freeze: its frozen snapshot is taken. An
    // attached one is refused, and nothing is taken; then the socket
    // exists but nobody answers: 503, nothing taken either.
    let d = Daemon::start();
    create_volume(&d, "idle");
    create_volume(&d, "used");
    let snap = |v: &str, name: &str| {
        let b = json!({"name": name, "freeze": true}).to_string();
        d.call(
            Method::POST,
            &format!("/v1/volumes/{v}/snapshots"),
            Some(&b),
        )
    };
    let (s, v) = snap("idle", "f");
    assert_eq!(s, StatusCode::CREATED, "{v}");
    d.ok(Method::POST, "/v1/volumes/used/attach", None);
    let (s, e) = snap("used", "f");
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::CONFLICT, Some("conflict")),
        "{e}"
    );
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("used") && msg.contains("freeze.sock"), "{msg}");
    refused(
        &d,
        json!({"name": "g", "volumes": ["idle", "used"], "freeze": true}),
        StatusCode::CONFLICT,
        "conflict",
        "no CSI node plugin serves freezes",
    );
    // A socket file nobody listens on (a plugin that died).
    let sock = d.dir.path().join("freeze.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let (s, e) = snap("used", "f");
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable")),
        "{e}"
    );
    for path in [
        "/v1/volumes/used/snapshots/f",
        "/v1/volumes/idle/snapshots/g",
        "/v1/volumes/used/snapshots/g",
    ] {
        let (s, v) = d.call(Method::GET, path, None);
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}: {v}");
    }
    // Without freeze, the attached volume's snapshot is taken as always.
    let b = json!({"name": "plain"}).to_string();
    let (s, v) = d.call(Method::POST, "/v1/volumes/used/snapshots", Some(&b));
    assert_eq!(s, StatusCode::CREATED, "{v}");
}

/// A node plugin's freeze service faked on `DATA/freeze.sock` (a real
/// socket, HTTP/1 read and written here): it answers every freeze with
/// `frozen` (freezing nothing) and every thaw with `thawed`, and counts
/// the calls by path.
struct FakePlugin {
    calls: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl FakePlugin {
    fn serve(d: &Daemon, frozen: Value, thawed: Value) -> FakePlugin {
        use std::io::{BufRead, BufReader, Read, Write};
        let l = std::os::unix::net::UnixListener::bind(d.dir.path().join("freeze.sock")).unwrap();
        let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let c = calls.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                let path = line.split(' ').nth(1).unwrap_or("").to_string();
                let mut len = 0;
                loop {
                    let mut h = String::new();
                    r.read_line(&mut h).unwrap();
                    if h.trim().is_empty() {
                        break;
                    }
                    if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap();
                    }
                }
                let mut body = vec![0; len];
                r.read_exact(&mut body).unwrap();
                let answer = if path == "/v1/freeze" {
                    &frozen
                } else {
                    &thawed
                };
                let answer = answer.to_string();
                c.lock().unwrap().push(path);
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                    answer.len()
                );
            }
        });
        FakePlugin { calls }
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

#[test]
fn a_frozen_snapshot_is_kept_only_when_the_freeze_held_until_the_thaw() {
    let d = Daemon::start();
    create_volume(&d, "used");
    d.ok(Method::POST, "/v1/volumes/used/attach", None);
    let frozen = json!({"id": "1-0", "frozen": [["used", "/staging/used"]]});
    // The plugin thawed the path at the daemon's thaw: the freeze held
    // while the snapshot was taken. Kept (201), freeze then thaw.
    let p = FakePlugin::serve(&d, frozen.clone(), json!({"thawed": ["/staging/used"]}));
    let b = json!({"name": "held", "freeze": true}).to_string();
    let (s, v) = d.call(Method::POST, "/v1/volumes/used/snapshots", Some(&b));
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(p.calls(), ["/v1/freeze", "/v1/thaw"]);
    std::fs::remove_file(d.dir.path().join("freeze.sock")).unwrap();

    // The freeze had ended (its hold passed) when the thaw came: the
    // snapshot may hold a thawed filesystem, so it is not kept; 503.
    let p = FakePlugin::serve(&d, frozen, json!({"thawed": []}));
    let b = json!({"name": "late", "freeze": true}).to_string();
    let (s, e) = d.call(Method::POST, "/v1/volumes/used/snapshots", Some(&b));
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable")),
        "{e}"
    );
    assert!(
        e["message"].as_str().unwrap().contains("freeze ended"),
        "{e}"
    );
    assert_eq!(p.calls(), ["/v1/freeze", "/v1/thaw"]);
    let (s, v) = d.call(Method::GET, "/v1/volumes/used/snapshots/late", None);
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    // A group likewise: none of its members is kept.
    create_volume(&d, "other");
    let (s, e) = group(
        &d,
        json!({"name": "g", "volumes": ["used", "other"], "freeze": true}),
    );
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{e}");
    for v in ["used", "other"] {
        let (s, x) = d.call(Method::GET, &format!("/v1/volumes/{v}/snapshots/g"), None);
        assert_eq!(s, StatusCode::NOT_FOUND, "{v}: {x}");
    }
    // The snapshot kept before is untouched.
    let (s, v) = d.call(Method::GET, "/v1/volumes/used/snapshots/held", None);
    assert_eq!(s, StatusCode::OK, "{v}");
}
