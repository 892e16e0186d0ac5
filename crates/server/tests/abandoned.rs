//! Regression tests for requests whose clients give up (issue 38): a
//! client that goes away (a timeout, Ctrl-C, a CSI call cancelled at its
//! deadline) once its operation is recorded must not leave that operation
//! `running` with nothing done until the next restart. Every recorded
//! operation runs to its end at once, and the pool is as its records say.

mod support;

use hyper::Method;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;
use support::Daemon;

const MIB: u64 = 1 << 20;

/// Generous: a limit to give up at, not a measurement.
const LIMIT: Duration = Duration::from_secs(60);

fn create_volume(d: &Daemon, name: &str) {
    let b = json!({"name": name, "size": 4 * MIB}).to_string();
    d.ok(Method::POST, "/v1/volumes", Some(&b));
}

fn create_snapshot(d: &Daemon, volume: &str, name: &str) {
    let b = json!({"name": name}).to_string();
    d.ok(
        Method::POST,
        &format!("/v1/volumes/{volume}/snapshots"),
        Some(&b),
    );
}

/// A request as it goes on the wire.
fn request(method: &Method, path: &str, body: &str) -> Vec<u8> {
    format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn running(d: &Daemon, volume: Option<&str>) -> Vec<Value> {
    let path = match volume {
        Some(v) => format!("/v1/operations?state=running&volume={v}"),
        None => "/v1/operations?state=running".to_string(),
    };
    d.ok(Method::GET, &path, None).as_array().unwrap().to_vec()
}

/// Send a request on a connection of its own, wait until its operation is
/// recorded (and held there, running), then give up on it as a client that
/// times out does: close the connection and read until the daemon has
/// closed its end, which it does once it notices the client left (dropping
/// the request's handler).
fn abandon(d: &Daemon, method: Method, path: &str, body: &str, volume: &str) {
    let mut c = UnixStream::connect(d.socket()).unwrap();
    c.write_all(&request(&method, path, body)).unwrap();
    d.wait_until(LIMIT, || running(d, Some(volume)).len() == 1);
    c.shutdown(std::net::Shutdown::Write).unwrap();
    c.set_read_timeout(Some(LIMIT)).unwrap();
    let mut answer = Vec::new();
    c.read_to_end(&mut answer)
        .unwrap_or_else(|e| panic!("{method} {path}: the daemon kept the connection: {e}"));
    assert!(
        answer.is_empty(),
        "{method} {path} was answered while its operation was held: {}",
        String::from_utf8_lossy(&answer)
    );
}

fn status(d: &Daemon, path: &str) -> u16 {
    d.call(Method::GET, path, None).0.as_u16()
}

/// Every kind of recorded operation, its request given up on while it was
/// recorded and not yet run (held there by the test knob), runs to its end
/// once let go, without a restart: none stays `running`, each succeeded,
/// and the pool is as the records say.
#[test]
fn an_operation_whose_client_gave_up_runs_to_its_end_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let hold = dir.path().join("hold");
    let d = Daemon::start_with(
        dir,
        lamina_server::Testing {
            hold_operations: Some(hold.clone()),
            ..Default::default()
        },
    );
    for v in [
        "del0", "del1", "del2", "snap0", "snap1", "snap2", "grow", "lab", "rev", "dsn", "ga", "gb",
        "gd", "src",
    ] {
        create_volume(&d, v);
    }
    // A clone's source with data, so that the clone shares some to flatten.
    let src = d.attach("/v1/volumes/src");
    support::qemu_io(&src, &["write -P 0x11 0 1M"]);
    d.ok(Method::POST, "/v1/volumes/src/detach", None);
    for (v, s) in [("rev", "s"), ("dsn", "s"), ("src", "s")] {
        create_snapshot(&d, v, s);
    }
    let b = json!({"name": "h", "volumes": ["gd"]}).to_string();
    d.ok(Method::POST, "/v1/snapshot-groups", Some(&b));
    let b = json!({"name": "flat", "from_snapshot": "src/s"}).to_string();
    d.ok(Method::POST, "/v1/clones", Some(&b));
    assert!(running(&d, None).is_empty());

    std::fs::write(&hold, b"").unwrap();
    let post = Method::POST;
    let mut asked = 0;
    for i in 0..3 {
        abandon(
            &d,
            Method::DELETE,
            &format!("/v1/volumes/del{i}"),
            "",
            &format!("del{i}"),
        );
        abandon(
            &d,
            post.clone(),
            &format!("/v1/volumes/snap{i}/snapshots"),
            &json!({"name": "s"}).to_string(),
            &format!("snap{i}"),
        );
        asked += 2;
    }
    for (method, path, body, volume) in [
        (
            post.clone(),
            "/v1/volumes",
            json!({"name": "new", "size": MIB}),
            "new",
        ),
        (
            post.clone(),
            "/v1/volumes/grow/expand",
            json!({"size": 8 * MIB}),
            "grow",
        ),
        (
            Method::PUT,
            "/v1/volumes/lab/labels",
            json!({"labels": {"k": "v"}}),
            "lab",
        ),
        (
            post.clone(),
            "/v1/volumes/rev/snapshots/s/revert",
            Value::Null,
            "rev",
        ),
        (
            Method::DELETE,
            "/v1/volumes/dsn/snapshots/s",
            Value::Null,
            "dsn",
        ),
        (
            post.clone(),
            "/v1/snapshot-groups",
            json!({"name": "g", "volumes": ["ga", "gb"]}),
            "ga",
        ),
        (Method::DELETE, "/v1/snapshot-groups/h", Value::Null, "gd"),
        (
            post.clone(),
            "/v1/clones",
            json!({"name": "linked", "from_snapshot": "src/s"}),
            "linked",
        ),
        (
            post.clone(),
            "/v1/clones",
            json!({"name": "full", "from_snapshot": "src/s", "full": true}),
            "full",
        ),
        (
            post.clone(),
            "/v1/volumes/flat/flatten",
            Value::Null,
            "flat",
        ),
    ] {
        let body = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        abandon(&d, method, path, &body, volume);
        asked += 1;
    }
    assert_eq!(running(&d, None).len(), asked);

    // Let them go; nobody waits for their answers, and nothing restarts.
    std::fs::remove_file(&hold).unwrap();
    let mut left = Vec::new();
    d.wait_until(LIMIT, || {
        left = running(&d, None);
        left.is_empty()
    });
    let ops = d.ok(Method::GET, &format!("/v1/operations?limit={asked}"), None);
    for op in ops.as_array().unwrap() {
        assert_eq!(op["state"], "succeeded", "{op}");
    }

    // The pool is as the records say, now.
    for i in 0..3 {
        assert_eq!(status(&d, &format!("/v1/volumes/del{i}")), 404);
        assert_eq!(status(&d, &format!("/v1/volumes/snap{i}/snapshots/s")), 200);
    }
    assert_eq!(status(&d, "/v1/volumes/new"), 200);
    let grow = d.ok(Method::GET, "/v1/volumes/grow", None);
    assert_eq!(grow["size"], 8 * MIB, "{grow}");
    let lab = d.ok(Method::GET, "/v1/volumes/lab", None);
    assert_eq!(lab["labels"], json!({"k": "v"}), "{lab}");
    assert_eq!(status(&d, "/v1/volumes/dsn/snapshots/s"), 404);
    assert_eq!(status(&d, "/v1/snapshot-groups/g"), 200);
    assert_eq!(status(&d, "/v1/snapshot-groups/h"), 404);
    assert_eq!(status(&d, "/v1/volumes/linked"), 200);
    let full = d.ok(Method::GET, "/v1/volumes/full", None);
    assert_eq!(
        (
            full["clone_state"].as_str(),
            full["allocated_bytes"].as_u64()
        ),
        (Some("none"), Some(MIB)),
        "copied whole: {full}"
    );
    let flat = d.ok(Method::GET, "/v1/volumes/flat", None);
    assert_eq!(flat["clone_state"], "independent", "{flat}");
}

/// The load: many snapshot creates and volume deletes whose
/// clients close their connections right after sending. Whatever was
/// recorded ends without a restart, and the pool is as the records say: a
/// volume whose delete is recorded is gone now, a volume whose delete was
/// never recorded is there, and each recorded snapshot exists.
#[test]
fn requests_closed_right_after_sending_leave_no_operation_running() {
    let d = Daemon::start();
    const N: usize = 24;
    for i in 0..N {
        create_volume(&d, &format!("d{i}"));
        create_volume(&d, &format!("s{i}"));
    }
    let before = d
        .ok(Method::GET, "/v1/operations", None)
        .as_array()
        .unwrap()
        .len();
    let socket = d.socket();
    let threads: Vec<_> = (0..N)
        .flat_map(|i| {
            [
                (Method::DELETE, format!("/v1/volumes/d{i}"), String::new()),
                (
                    Method::POST,
                    format!("/v1/volumes/s{i}/snapshots"),
                    json!({"name": "x"}).to_string(),
                ),
            ]
        })
        .map(|(m, path, body)| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut c = UnixStream::connect(socket).unwrap();
                c.write_all(&request(&m, &path, &body)).unwrap();
                // Gone at once: the daemon reads the request, then EOF.
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // Poll until the records and the pool agree, with nothing running:
    // read the pool first, then the records, so that a change the pool
    // shows has its record in what is read after (each is recorded before
    // it runs).
    let t = std::time::Instant::now();
    while let Err(why) = agree(&d, N) {
        assert!(t.elapsed() < LIMIT, "records and pool disagree: {why}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let ops = d.ok(Method::GET, "/v1/operations", None);
    assert!(
        ops.as_array().unwrap().len() > before,
        "no request was recorded"
    );
}

/// Whether the records of the deletes of `d0..dN` and the snapshots of
/// `s0..sN` agree with the pool, none running; what disagrees.
fn agree(d: &Daemon, n: usize) -> Result<(), String> {
    let vols = d.ok(Method::GET, "/v1/volumes", None);
    let vols: Vec<&str> = vols
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    let snaps = d.ok(Method::GET, "/v1/snapshots", None);
    let snapped: Vec<&str> = snaps
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["volume"].as_str().unwrap())
        .collect();
    let ops = d.ok(Method::GET, "/v1/operations", None);
    let ops = ops.as_array().unwrap();
    let recorded = |kind: &str, v: &str| {
        ops.iter()
            .filter(|o| o["kind"] == kind && o["volume"] == v)
            .map(|o| o["state"].as_str().unwrap())
            .collect::<Vec<_>>()
    };
    if let Some(op) = ops.iter().find(|o| o["state"] != "succeeded") {
        return Err(format!("not done, or failed: {op}"));
    }
    for i in 0..n {
        let (dv, sv) = (format!("d{i}"), format!("s{i}"));
        let deleted = !recorded("delete-volume", &dv).is_empty();
        if deleted == vols.contains(&dv.as_str()) {
            return Err(format!(
                "volume {dv}: delete recorded {deleted}, in the pool {deleted}"
            ));
        }
        let taken = snapped.iter().filter(|v| **v == sv).count();
        let asked = recorded("create-snapshot", &sv).len();
        if taken != asked.min(1) {
            return Err(format!(
                "volume {sv}: {asked} snapshot creates recorded, {taken} snapshots"
            ));
        }
    }
    Ok(())
}
