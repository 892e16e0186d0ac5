//! Clones onto another node from a snapshot of a replicated volume (seeds
//! 000 and 004): four `lamina serve`s, each in a network namespace of its
//! own. n0 is the front end of volume `r`, with replicas on n1 and n2; n3
//! clones `r`'s snapshot `gold`, named on n0. n0's answer names the other
//! replicas, and the pull goes on from one of them when its source dies,
//! from its last durable offset, checked to be the same snapshot by its
//! identity. Data is compared byte for byte (qemu-img compare) with a
//! replica's snapshot through both nodes' NBD exports.

use crate::crossnode::{error_starts_with_reason, generator, Certs, Node, MIB, SLOW};
use lamina_test_support::netns::Net;
use lamina_test_support::*;
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

/// Volume `r` of `size` bytes on n0 with replicas on n1 and n2, filled with
/// the generator's data through its front end, detached, and snapshot
/// `gold` taken on every replica; the four nodes (n3 holds nothing).
fn replicated_gold<'a>(net: &'a Net, certs: &Certs, size: u64) -> Vec<Node<'a>> {
    need("nbdcopy", "libnbd-bin");
    need("nbdkit", "nbdkit");
    need("qemu-img", "qemu-utils");
    // n3 is in n0's node list too, but holds no replica: `--replicas 3`
    // takes the list's first two.
    let nodes = crate::replicated::nodes(net, certs);
    let a = &nodes[0];
    a.d.ok(&[
        "volume",
        "create",
        "r",
        "--size",
        &size.to_string(),
        "--replicas",
        "3",
    ]);
    let uri = a.d.attach(&["volume", "attach", "r"]);
    run(Command::new("nbdcopy")
        .args(["--destination-is-zero", "--", "["])
        .args(generator(size))
        .args(["]", uri.as_str()]))
    .ok();
    wait_until("r detached", Duration::from_secs(30), || {
        a.d.lamina(&["volume", "detach", "r"])
            .status
            .success()
            .then_some(())
    });
    a.d.ok(&["snapshot", "create", "r", "gold"]);
    let r = a.d.json(&["volume", "get", "r"]);
    assert_eq!(r["replication"]["state"], "healthy", "{r}");
    nodes
}

/// Start cloning `r/gold` of `from` into a new volume `name` on `to`; the
/// operation's id.
fn start_clone(to: &Node, name: &str, from: &Node) -> String {
    let addr = from.transfer();
    let j = to.d.json(&[
        "clone",
        "create",
        name,
        "--from-snapshot",
        "r/gold",
        "--from-node",
        &from.name,
        "--from-address",
        &addr,
        "--no-wait",
    ]);
    j["operation"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("clone create printed no operation id: {j}"))
        .to_string()
}

/// Clone `name` on `to` holds the data of `r/gold` as `replica` holds it.
fn same_as_replica(replica: &Node, to: &Node, name: &str) {
    let a = replica.d.attach(&["snapshot", "attach", "r", "gold"]);
    let b = to.d.attach(&["volume", "attach", name]);
    let cmp = qemu_img_compare(&a, &b);
    assert!(
        cmp.status.success(),
        "{name} differs from r/gold on {}: {cmp:?}",
        replica.name
    );
}

fn bytes(op: &Value, field: &str) -> u64 {
    op[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field}: {op}"))
}

#[test]
fn a_clone_whose_source_replica_dies_goes_on_from_another_and_ends_equal() {
    let net = Net::new(4);
    let certs = Certs::new();
    let size = 384 * MIB;
    let mut nodes = replicated_gold(&net, &certs, size);
    let (dst, rest) = nodes.split_last_mut().unwrap();
    let (first, others) = rest.split_at_mut(1);
    let (a, b) = (&mut first[0], &others[0]);
    // The front end's node is the source; its Answer names n1 and n2.
    a.host.shape(SLOW);
    let t = Instant::now();
    let id = start_clone(dst, "c", a);
    // Past the first checkpoint (64 MiB), then the source dies.
    let before = dst.done_at_least(&id, 72 * MIB);
    let total = bytes(&before, "total_bytes");
    assert!(total > 150 * MIB, "{before}");
    a.d.kill9();
    let op = dst.succeeded(&id);
    let took = t.elapsed();
    let resent = bytes(&op, "resent_bytes");
    let wire = bytes(&op, "wire_bytes");
    eprintln!("failover: {total} bytes, {resent} resent, {wire} on the wire, in {took:?}");
    // It went on from the durable offset, not from zero.
    assert!(resent < total / 4, "resent {resent} of {total}: {op}");
    assert!(
        (wire as f64) < 1.05 * (total + resent) as f64 + (4 * MIB) as f64,
        "{wire} wire bytes for {total}: {op}"
    );
    let log = dst.d.log();
    assert!(
        log.contains("going on from another holder"),
        "the target's log says nothing of its failover"
    );
    same_as_replica(b, dst, "c");
    a.host.unshape();
}

#[test]
fn a_clone_killed_and_restarted_during_its_sync_resumes_and_ends_equal() {
    let net = Net::new(4);
    let certs = Certs::new();
    let size = 384 * MIB;
    let mut nodes = replicated_gold(&net, &certs, size);
    let (dst, rest) = nodes.split_last_mut().unwrap();
    let (a, c) = (&rest[0], &rest[2]);
    a.host.shape(SLOW);
    let id = start_clone(dst, "c", a);
    dst.done_at_least(&id, 72 * MIB);
    // Frozen, then the clone's own daemon is killed and started again.
    a.host.cut();
    let total = bytes(&dst.op(&id), "total_bytes");
    dst.d.kill9();
    a.host.restore();
    dst.d.start_again();
    let resumed = dst.op(&id);
    assert!(
        bytes(&resumed, "done_bytes") > 0,
        "resumed from zero: {resumed}"
    );
    let op = dst.succeeded(&id);
    let resent = bytes(&op, "resent_bytes");
    eprintln!("restart: {total} bytes, {resent} resent");
    assert!(resent < total / 2, "resent {resent} of {total}: {op}");
    same_as_replica(c, dst, "c");
    a.host.unshape();
}

#[test]
fn a_clone_of_a_snapshot_missing_on_its_sources_fails_clearly_and_leaves_no_volume() {
    let net = Net::new(4);
    let certs = Certs::new();
    let mut nodes = replicated_gold(&net, &certs, 128 * MIB);
    let (dst, rest) = nodes.split_last_mut().unwrap();
    let a = &rest[0];
    let addr = a.transfer();
    // Missing when asked: the request fails, nothing is made or recorded.
    let e = dst.d.err(&[
        "clone",
        "create",
        "c",
        "--from-snapshot",
        "r/nope",
        "--from-node",
        &a.name,
        "--from-address",
        &addr,
    ]);
    assert!(
        e.starts_with("snapshot-missing") || e.contains("snapshot-missing"),
        "{e}"
    );
    dst.has_no_volume("c");
    let ops = dst.d.json(&["operation", "list", "--state", "running"]);
    assert_eq!(ops.as_array().map(Vec::len), Some(0), "{ops}");

    // Missing on every replica once the copy has begun (deleted while the
    // clone's daemon was down): each holder named says so, and the clone
    // fails with that reason, naming them, leaving no volume.
    a.host.shape(SLOW);
    let id = start_clone(dst, "c", a);
    dst.done_at_least(&id, 1);
    a.host.cut();
    dst.d.kill9();
    a.host.restore();
    a.host.unshape();
    // Refused while the source still counts the killed target a reader.
    wait_until("gold deleted", Duration::from_secs(60), || {
        a.d.lamina(&["snapshot", "delete", "r", "gold"])
            .status
            .success()
            .then_some(())
    });
    dst.d.start_again();
    let op = dst.ended(&id);
    assert_eq!(op["state"], "failed", "{op}");
    error_starts_with_reason(&op, "snapshot-missing");
    let e = op["error"].as_str().unwrap_or_default();
    for n in ["n0", "n1", "n2"] {
        assert!(e.contains(&format!("node {n}")), "{n} not named: {op}");
    }
    dst.has_no_volume("c");
}
