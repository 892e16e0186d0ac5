//! The change feed: every change visible in the lists moves the sequence,
//! a waiting call is answered by the next change, reads move nothing, and a
//! restarted daemon has a new epoch.

mod support;

use hyper::Method;
use serde_json::Value;
use support::Daemon;

fn changes(d: &Daemon, query: &str) -> (String, u64) {
    let v: Value = d.ok(Method::GET, &format!("/v1/changes{query}"), None);
    (
        v["epoch"].as_str().unwrap().to_string(),
        v["seq"].as_u64().unwrap(),
    )
}

#[test]
fn every_visible_change_moves_the_sequence_and_reads_do_not() {
    let d = Daemon::start();
    let (epoch, start) = changes(&d, "");
    let steps: [(Method, &str, Option<&str>); 6] = [
        (
            Method::POST,
            "/v1/volumes",
            Some(r#"{"name":"a","size":1048576}"#),
        ),
        (
            Method::POST,
            "/v1/volumes/a/snapshots",
            Some(r#"{"name":"s1"}"#),
        ),
        (Method::POST, "/v1/volumes/a/attach", None),
        (Method::POST, "/v1/volumes/a/detach", None),
        (Method::DELETE, "/v1/volumes/a/snapshots/s1", None),
        (Method::DELETE, "/v1/volumes/a", None),
    ];
    let mut last = start;
    for (m, p, b) in steps {
        d.ok(m.clone(), p, b);
        let (e, seq) = changes(&d, "");
        assert_eq!(e, epoch);
        assert!(
            seq > last,
            "{m} {p} did not move the sequence ({seq} after {last})"
        );
        last = seq;
        // Reads change nothing.
        d.ok(Method::GET, "/v1/volumes", None);
        d.ok(Method::GET, "/v1/snapshots", None);
        assert_eq!(changes(&d, "").1, seq);
    }
}

#[test]
fn a_waiting_call_is_answered_by_the_next_change_and_a_restart_is_a_new_epoch() {
    let d = Daemon::start();
    let (epoch, seq) = changes(&d, "");
    // Past `after`, or another epoch: at once.
    assert_eq!(
        changes(&d, &format!("?after={}&wait_ms=300000", seq - 1)).1,
        seq
    );
    assert_eq!(
        changes(&d, &format!("?after={seq}&epoch=other&wait_ms=300000")).1,
        seq
    );
    // Nothing changes: the same sequence once the wait is over.
    assert_eq!(
        changes(&d, &format!("?after={seq}&epoch={epoch}&wait_ms=10")).1,
        seq
    );

    // A waiter (up to 300 s) returns with a later sequence once a volume is
    // made, whether it started waiting before or after the change.
    let socket = d.socket();
    let q = format!("/v1/changes?after={seq}&epoch={epoch}&wait_ms=300000");
    let waiter = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (status, body) = rt
            .block_on(support::send(socket, Method::GET, &q, None))
            .unwrap();
        assert!(status.is_success());
        serde_json::from_slice::<Value>(&body).unwrap()["seq"]
            .as_u64()
            .unwrap()
    });
    d.ok(
        Method::POST,
        "/v1/volumes",
        Some(r#"{"name":"w","size":1048576}"#),
    );
    assert!(waiter.join().unwrap() > seq);

    let dir = d.stop();
    let d = Daemon::start_in(dir);
    let (epoch2, seq2) = changes(&d, &format!("?after=1000&epoch={epoch}&wait_ms=300000"));
    assert_ne!(epoch2, epoch, "a restarted daemon has a new epoch");
    assert!(seq2 < 1000);
}

#[test]
fn the_document_declares_the_route() {
    let d = Daemon::start();
    let doc = d.ok(Method::GET, "/openapi.json", None);
    let params: Vec<&str> = doc["paths"]["/v1/changes"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(params, ["after", "epoch", "wait_ms"]);
    assert!(doc["components"]["schemas"]["Changes"].is_object());
}
