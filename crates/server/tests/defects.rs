//! Regression tests for the wrong answers independent tests found in the
//! daemon (issue 9): clones of a volume that reused a stale or user
//! snapshot, leaked system snapshots, two 201s for one create, an API
//! document missing parameters and statuses, non-JSON error bodies, and the
//! rules for "same name" and for removing what is gone.

mod support;

use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use std::time::Duration;
use support::{qemu_io, Daemon};

const MIB: u64 = 1 << 20;

fn create_volume(d: &Daemon, name: &str, size: u64) {
    let b = json!({"name": name, "size": size}).to_string();
    d.ok(Method::POST, "/v1/volumes", Some(&b));
}

fn snapshots(d: &Daemon, vol: &str) -> Vec<(String, bool)> {
    d.ok(Method::GET, &format!("/v1/volumes/{vol}/snapshots"), None)
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["system"].as_bool().unwrap(),
            )
        })
        .collect()
}

fn wait_op(d: &Daemon, id: &str) -> Value {
    let mut last = Value::Null;
    d.wait_until(Duration::from_secs(120), || {
        last = d.ok(Method::GET, &format!("/v1/operations/{id}"), None);
        last["state"] != "running"
    });
    assert_eq!(last["state"], "succeeded", "{last}");
    last
}

/// The count of operations of `kind` that ended with `outcome` in
/// `/metrics` (0 while the series does not exist).
fn ended(d: &Daemon, kind: &str, outcome: &str) -> u64 {
    let (s, _, text) = d.raw(Method::GET, "/metrics", "");
    assert_eq!(s, StatusCode::OK, "{text}");
    let series = format!("lamina_operations_total{{kind=\"{kind}\",outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0, |n| n.trim().parse().unwrap())
}

#[test]
fn a_clone_of_a_volume_copies_it_as_it_is_and_never_touches_a_user_snapshot() {
    let d = Daemon::start();
    create_volume(&d, "src", 4 * MIB);
    let src = d.attach("/v1/volumes/src");
    qemu_io(&src, &["write -P 0x4f 0 4k"]); // "OLD"
                                            // A user snapshot with the name the daemon once gave its own.
    let b = json!({"name": "clone-x"}).to_string();
    d.ok(Method::POST, "/v1/volumes/src/snapshots", Some(&b));
    qemu_io(&src, &["write -P 0x4e 0 4k"]); // "NEW"

    // Linked.
    let (s, v) = d.call(
        Method::POST,
        "/v1/clones",
        Some(&json!({"name": "x", "from_volume": "src"}).to_string()),
    );
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let x = d.attach("/v1/volumes/x");
    qemu_io(&x, &["read -P 0x4e 0 4k"]);
    let snaps = snapshots(&d, "src");
    assert!(snaps.contains(&("clone-x".into(), false)), "{snaps:?}");
    assert_eq!(
        snaps
            .iter()
            .filter(|(n, s)| *s && n.starts_with('.'))
            .count(),
        1,
        "{snaps:?}"
    );
    // Asking again is answered with the same clone.
    let (s, _) = d.call(
        Method::POST,
        "/v1/clones",
        Some(&json!({"name": "x", "from_volume": "src"}).to_string()),
    );
    assert_eq!(s, StatusCode::OK);
    // Its system snapshot goes with it; the user's stays.
    d.ok(Method::POST, "/v1/volumes/x/detach", None);
    let r = d.ok(Method::DELETE, "/v1/volumes/x", None);
    assert_eq!(r, json!({"what": "volume x", "existed": true}));
    assert_eq!(snapshots(&d, "src"), vec![("clone-x".to_string(), false)]);

    // Full.
    let (s, v) = d.call(
        Method::POST,
        "/v1/clones",
        Some(&json!({"name": "y", "from_volume": "src", "full": true}).to_string()),
    );
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    assert_eq!(v["operation"]["kind"], "full-clone", "{v}");
    wait_op(&d, v["operation"]["id"].as_str().unwrap());
    // Its end, in the background, is counted as every operation's is.
    assert_eq!(ended(&d, "full-clone", "succeeded"), 1);
    let y = d.attach("/v1/volumes/y");
    qemu_io(&y, &["read -P 0x4e 0 4k"]);
    assert_eq!(
        snapshots(&d, "src"),
        vec![("clone-x".to_string(), false)],
        "the full clone deleted its own snapshot and only that"
    );
    let y = d.ok(Method::GET, "/v1/volumes/y", None);
    assert_eq!(y["origin"], Value::Null, "{y}");
    assert_eq!(y["clone_state"], "none", "{y}");

    // A full clone onto a name a plain volume has is refused, and nothing
    // is left running.
    create_volume(&d, "z", MIB);
    let (s, e) = d.call(
        Method::POST,
        "/v1/clones",
        Some(&json!({"name": "z", "from_volume": "src", "full": true}).to_string()),
    );
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::CONFLICT, Some("already_exists")),
        "{e}"
    );
    let running = d.ok(Method::GET, "/v1/operations?state=running", None);
    assert_eq!(running, json!([]));
    assert_eq!(snapshots(&d, "src"), vec![("clone-x".to_string(), false)]);
}

#[test]
fn a_flattened_clone_leaves_no_system_snapshot_behind() {
    let d = Daemon::start();
    create_volume(&d, "src", 4 * MIB);
    let src = d.attach("/v1/volumes/src");
    qemu_io(&src, &["write -P 0x11 0 1M"]);
    d.ok(
        Method::POST,
        "/v1/clones",
        Some(&json!({"name": "c", "from_volume": "src"}).to_string()),
    );
    d.ok(Method::POST, "/v1/volumes/src/detach", None);
    let v = d.ok(Method::POST, "/v1/volumes/c/flatten", None);
    wait_op(&d, v["operation"].as_str().unwrap());
    assert_eq!(ended(&d, "flatten", "succeeded"), 1);
    assert_eq!(snapshots(&d, "src"), vec![]);
    let c = d.ok(Method::GET, "/v1/volumes/c", None);
    assert_eq!(
        (c["clone_state"].as_str(), &c["origin"]),
        (Some("independent"), &Value::Null),
        "{c}"
    );
    // Nothing blocks deleting the source now, without --with-snapshots.
    d.ok(Method::DELETE, "/v1/volumes/src", None);
    let c = d.attach("/v1/volumes/c");
    qemu_io(&c, &["read -P 0x11 0 1M"]);
}

#[test]
fn concurrent_identical_creates_answer_201_exactly_once() {
    let d = Daemon::start();
    let socket = d.socket();
    let vol = json!({"name": "v", "size": 4 * MIB}).to_string();
    let snap = json!({"name": "s", "labels": {"a": "b"}}).to_string();
    let group = json!({"name": "g", "volumes": ["v"]}).to_string();
    let clone = json!({"name": "c", "from_snapshot": "v/s"}).to_string();
    let full = json!({"name": "f", "from_snapshot": "v/s", "full": true}).to_string();
    for (path, body) in [
        ("/v1/volumes", vol),
        ("/v1/volumes/v/snapshots", snap),
        ("/v1/snapshot-groups", group),
        ("/v1/clones", clone),
    ] {
        if path == "/v1/volumes/v/snapshots" {
            // Data for the clones to share (a clone that shares nothing
            // shows no origin).
            let v = d.attach("/v1/volumes/v");
            qemu_io(&v, &["write -P 0x11 0 64k"]);
            d.ok(Method::POST, "/v1/volumes/v/detach", None);
        }
        let statuses: Vec<StatusCode> = d.rt.block_on(async {
            let calls = (0..20)
                .map(|_| support::send(socket.clone(), Method::POST, path, Some(body.clone())));
            futures_join_all(calls).await
        });
        let created = statuses
            .iter()
            .filter(|s| **s == StatusCode::CREATED)
            .count();
        let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
        assert_eq!((created, ok), (1, 19), "{path}: {statuses:?}");
    }
    // A full clone asked twenty times: one 202, then the running (or
    // finished) clone.
    let statuses: Vec<StatusCode> = d.rt.block_on(async {
        let calls = (0..20).map(|_| {
            support::send(
                socket.clone(),
                Method::POST,
                "/v1/clones",
                Some(full.clone()),
            )
        });
        futures_join_all(calls).await
    });
    let started = statuses
        .iter()
        .filter(|s| **s == StatusCode::ACCEPTED)
        .count();
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!((started, ok), (1, 19), "{statuses:?}");
    // One operation, one record: the nineteen that found it made none.
    let ops = d.ok(Method::GET, "/v1/operations", None);
    let mut kinds: Vec<&str> = ops
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "clone",
            "create-snapshot",
            "create-snapshot-group",
            "create-volume",
            "full-clone"
        ],
        "{ops}"
    );
    // The same name with another spec is a conflict, for both.
    let (s, e) = d.call(
        Method::POST,
        "/v1/volumes",
        Some(&json!({"name": "v", "size": 8 * MIB}).to_string()),
    );
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::CONFLICT, Some("already_exists")),
        "{e}"
    );
    let (s, e) = d.call(
        Method::POST,
        "/v1/volumes/v/snapshots",
        Some(&json!({"name": "s", "labels": {"a": "c"}}).to_string()),
    );
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::CONFLICT, Some("already_exists")),
        "{e}"
    );
}

/// Await every future, in order (no extra dependency for `join_all`).
async fn futures_join_all<F>(calls: impl Iterator<Item = F>) -> Vec<StatusCode>
where
    F: std::future::Future<Output = std::io::Result<(StatusCode, hyper::body::Bytes)>>
        + Send
        + 'static,
{
    let handles: Vec<_> = calls.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap().unwrap().0);
    }
    out
}

#[test]
fn sizes_are_whole_sectors_and_removing_what_is_gone_succeeds() {
    let d = Daemon::start();
    let (s, e) = d.call(
        Method::POST,
        "/v1/volumes",
        Some(&json!({"name": "v", "size": 1000}).to_string()),
    );
    assert_eq!(s, StatusCode::BAD_REQUEST, "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("1024 would be"),
        "{e}"
    );
    create_volume(&d, "v", 1024);
    for (m, path, what) in [
        (Method::DELETE, "/v1/volumes/nope", "volume nope"),
        (
            Method::DELETE,
            "/v1/volumes/v/snapshots/nope",
            "snapshot v/nope",
        ),
        (Method::POST, "/v1/volumes/v/detach", "export v"),
        (
            Method::POST,
            "/v1/volumes/v/snapshots/nope/detach",
            "export v@nope",
        ),
    ] {
        let r = d.ok(m, path, None);
        assert_eq!(r, json!({"what": what, "existed": false}), "{path}");
    }
    // Nothing was recorded for a delete of what was not there.
    let ops = d.ok(Method::GET, "/v1/operations", None);
    let kinds: Vec<&str> = ops
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["create-volume", "create-volume"], "{ops}");
    let failed = d.ok(Method::GET, "/v1/operations?state=failed&limit=5", None);
    assert_eq!(failed.as_array().unwrap().len(), 1, "{failed}");
    let none = d.ok(Method::GET, "/v1/operations?volume=other", None);
    assert_eq!(none, json!([]));
}

#[test]
fn every_error_body_is_json_and_the_document_declares_every_parameter() {
    let d = Daemon::start();
    create_volume(&d, "v", MIB);
    for (m, path, body, want) in [
        (Method::POST, "/v1/volumes", "{", StatusCode::BAD_REQUEST),
        (
            Method::DELETE,
            "/v1/volumes/v?with_snapshots=maybe",
            "",
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            "/v1/operations?state=bogus",
            "",
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            "/v1/operations?limit=-1",
            "",
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::PUT,
            "/v1/volumes",
            "",
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (Method::GET, "/v1/nothing/here", "", StatusCode::NOT_FOUND),
        (Method::GET, "/v1/volumes/nope", "", StatusCode::NOT_FOUND),
    ] {
        let (s, ct, text) = d.raw(m.clone(), path, body);
        assert_eq!(s, want, "{m} {path}: {text}");
        assert!(
            ct.starts_with("application/json"),
            "{m} {path}: {ct} {text}"
        );
        let e: Value = serde_json::from_str(&text).unwrap();
        assert!(
            e["code"].is_string() && e["message"].is_string(),
            "{m} {path}: {e}"
        );
    }

    let doc = d.ok(Method::GET, "/openapi.json", None);
    let paths = doc["paths"].as_object().unwrap();
    let mut checked = 0;
    for (path, item) in paths {
        let wanted: Vec<&str> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .collect();
        for (method, op) in item.as_object().unwrap() {
            let declared: Vec<&str> = op["parameters"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .filter(|p| p["in"] == "path")
                        .map(|p| p["name"].as_str().unwrap())
                        .collect()
                })
                .unwrap_or_default();
            assert_eq!(declared, wanted, "{method} {path}: path parameters");
            let responses = op["responses"].as_object().unwrap();
            assert!(responses.contains_key("500"), "{method} {path}: no 500");
            if !wanted.is_empty()
                && path.starts_with("/v1/volumes/{name}")
                && method != "delete"
                && !path.ends_with("/detach")
            {
                assert!(responses.contains_key("404"), "{method} {path}: no 404");
            }
            if method == "post" && op.get("requestBody").is_some() {
                assert!(responses.contains_key("400"), "{method} {path}: no 400");
            }
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} operations");
    let delete = &paths["/v1/volumes/{name}"]["delete"];
    assert!(delete["responses"].as_object().unwrap().contains_key("409"));
    assert!(
        delete["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "with_snapshots" && p["in"] == "query"),
        "{delete}"
    );
}

#[test]
fn attach_detach_and_delete_of_snapshots_race_safely() {
    let d = Daemon::start();
    create_volume(&d, "v", 4 * MIB);
    let socket = d.socket();
    let rounds = 40;
    let statuses: Vec<(String, StatusCode)> = d.rt.block_on(async {
        let mut handles = Vec::new();
        for i in 0..rounds {
            let name = format!("s{}", i % 4);
            let body = json!({"name": name}).to_string();
            let steps: Vec<(Method, String, Option<String>)> = vec![
                (Method::POST, "/v1/volumes/v/snapshots".into(), Some(body)),
                (
                    Method::POST,
                    format!("/v1/volumes/v/snapshots/{name}/attach"),
                    None,
                ),
                (
                    Method::DELETE,
                    format!("/v1/volumes/v/snapshots/{name}"),
                    None,
                ),
                (
                    Method::POST,
                    format!("/v1/volumes/v/snapshots/{name}/detach"),
                    None,
                ),
                (
                    Method::DELETE,
                    format!("/v1/volumes/v/snapshots/{name}"),
                    None,
                ),
            ];
            for (m, p, b) in steps {
                let s = socket.clone();
                handles.push(tokio::spawn(async move {
                    let r = support::send(s, m.clone(), &p, b).await.unwrap();
                    (format!("{m} {p}"), r.0)
                }));
            }
        }
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.unwrap());
        }
        out
    });
    for (what, s) in &statuses {
        assert!(
            s.is_success() || *s == StatusCode::CONFLICT || *s == StatusCode::NOT_FOUND,
            "{what}: {s}"
        );
    }
    // Every export left refers to a snapshot that exists.
    let snaps = snapshots(&d, "v");
    for s in d
        .ok(Method::GET, "/v1/volumes/v/snapshots", None)
        .as_array()
        .unwrap()
    {
        if let Some(e) = s["export"].as_object() {
            assert!(e["name"].as_str().unwrap().starts_with("v@"), "{s}");
        }
    }
    let nbd = lamina_server::Layout::new(d.dir.path()).nbd_socket;
    let out = std::process::Command::new("nbdinfo")
        .args([
            "--list",
            "--json",
            &format!("nbd+unix:///?socket={}", nbd.display()),
        ])
        .output()
        .expect("nbdinfo runs (apt-get install libnbd-bin)");
    let list: Value = serde_json::from_slice(&out.stdout).unwrap_or(json!({"exports": []}));
    for e in list["exports"].as_array().unwrap() {
        let name = e["export-name"].as_str().unwrap();
        let snap = name.strip_prefix("v@").unwrap();
        assert!(
            snaps.iter().any(|(n, _)| n == snap),
            "export {name} outlived its snapshot: {snaps:?}"
        );
    }
}

#[test]
fn a_system_snapshot_nothing_needs_goes_at_start() {
    let d = Daemon::start();
    create_volume(&d, "v", MIB);
    let dir = d.stop();
    // A crash between a clone's end and its snapshot's deletion leaves one.
    let pool = lamina_engine::Pool::open_dir(
        lamina_server::Layout::new(dir.path()).pool,
        lamina_engine::PoolOptions::default(),
    )
    .unwrap();
    pool.create_system_snapshot("v", "gone").unwrap();
    pool.create_snapshot("v", "mine", &[]).unwrap();
    pool.close().unwrap();
    let d = Daemon::start_in(dir);
    assert_eq!(snapshots(&d, "v"), vec![("mine".to_string(), false)]);
}

#[test]
fn snapshots_are_found_by_name_across_volumes_and_by_id_and_ids_are_never_reused() {
    let d = Daemon::start();
    create_volume(&d, "a", MIB);
    create_volume(&d, "b", MIB);
    let snap = |v: &str, n: &str| {
        let b = json!({"name": n}).to_string();
        d.ok(
            Method::POST,
            &format!("/v1/volumes/{v}/snapshots"),
            Some(&b),
        )
    };
    let a1 = snap("a", "s1");
    let b1 = snap("b", "s1");
    snap("b", "s2");
    let found = d.ok(Method::GET, "/v1/snapshots?name=s1", None);
    let found: Vec<(String, u64)> = found
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["volume"].as_str().unwrap().into(),
                s["id"].as_u64().unwrap(),
            )
        })
        .collect();
    let (a1_id, b1_id) = (a1["id"].as_u64().unwrap(), b1["id"].as_u64().unwrap());
    assert_eq!(found, vec![("a".into(), a1_id), ("b".into(), b1_id)]);
    let by_id = d.ok(Method::GET, &format!("/v1/snapshots?id={b1_id}"), None);
    assert_eq!(by_id.as_array().unwrap().len(), 1);
    assert_eq!(by_id[0]["name"], "s1");
    assert_eq!(by_id[0]["volume"], "b");
    let vol_b = d.ok(Method::GET, "/v1/volumes/b", None);
    assert_eq!(by_id[0]["volume_id"], vol_b["id"]);
    // Both filters must match; an id of a volume is not a snapshot's.
    let none = d.ok(
        Method::GET,
        &format!("/v1/snapshots?id={b1_id}&name=s2"),
        None,
    );
    assert_eq!(none, json!([]));
    let none = d.ok(
        Method::GET,
        &format!("/v1/snapshots?id={}", vol_b["id"]),
        None,
    );
    assert_eq!(none, json!([]));
    // Deleted and made again under the same name: a new id.
    d.ok(Method::DELETE, "/v1/volumes/a/snapshots/s1", None);
    let again = snap("a", "s1");
    assert!(again["id"].as_u64().unwrap() > a1_id);
    let gone = d.ok(Method::GET, &format!("/v1/snapshots?id={a1_id}"), None);
    assert_eq!(gone, json!([]));
    let (s, _) = d.call(Method::GET, "/v1/snapshots?id=x", None);
    assert_eq!(s, StatusCode::BAD_REQUEST);
}

#[test]
fn clone_operations_name_their_source_and_health_reports_capacity() {
    let d = Daemon::start();
    create_volume(&d, "src", MIB);
    let b = json!({"name": "s"}).to_string();
    d.ok(Method::POST, "/v1/volumes/src/snapshots", Some(&b));
    let b = json!({"name": "c1", "from_snapshot": "src/s"}).to_string();
    d.ok(Method::POST, "/v1/clones", Some(&b));
    let b = json!({"name": "c2", "from_volume": "src"}).to_string();
    d.ok(Method::POST, "/v1/clones", Some(&b));
    let ops = d.ok(Method::GET, "/v1/operations?volume=c1", None);
    assert_eq!(ops[0]["source"], "src/s", "{ops}");
    let ops = d.ok(Method::GET, "/v1/operations?volume=c2", None);
    assert_eq!(ops[0]["source"], "src", "{ops}");
    let ops = d.ok(Method::GET, "/v1/operations?volume=src", None);
    assert!(
        ops.as_array()
            .unwrap()
            .iter()
            .all(|o| o["source"].is_null()),
        "{ops}"
    );
    let h = d.ok(Method::GET, "/v1/health", None);
    assert!(h["capacity_bytes"].as_u64().unwrap() > 0, "{h}");
}
