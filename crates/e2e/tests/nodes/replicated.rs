//! Replicated volumes across nodes: three `lamina serve`s, each in a
//! network namespace of its own, and a volume with a replica on each. fio
//! writes and verifies (crc32c) through the front end's NBD export while a
//! replica's daemon is killed (SIGKILL): the volume goes on degraded, the
//! fault is recorded, and the replicas still called healthy hold every
//! acknowledged write (compared byte for byte through snapshots of each).

use crate::crossnode::{Certs, Node};
use crate::nbd_client::NbdClient;
use lamina_test_support::netns::Net;
use lamina_test_support::*;
use serde_json::Value;
use std::process::Command;

/// fio on `uri` (4 KiB random writes over 32 MiB at QD 16, crc32c
/// verified) with `extra`; its JSON report, its errors checked.
fn fio(uri: &str, extra: &[&str]) -> Value {
    let mut c = Command::new("fio");
    c.args([
        "--name=replicated",
        "--ioengine=nbd",
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=16",
        "--size=32m",
        "--verify=crc32c",
        "--verify_state_save=0",
        "--output-format=json",
    ])
    .arg(format!("--uri={uri}"))
    .args(extra);
    fio_report(&mut c)
}

/// A `lamina serve` named `n0`, `n1`... on each of `net`'s hosts, with the
/// others in `n0`'s node list.
pub(crate) fn nodes<'a>(net: &'a Net, certs: &Certs) -> Vec<Node<'a>> {
    let nodes: Vec<Node> = net
        .hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| Node::start(h, &format!("n{i}"), certs, 60))
        .collect();
    for n in &nodes[1..] {
        nodes[0].d.ok(&["node", "add", &n.name, &n.transfer()]);
    }
    nodes
}

/// The replica states of volume `name` on `n`, in order: (node, state).
fn replicas(n: &Node, name: &str) -> (Value, Vec<(String, String)>) {
    let v = n.d.json(&["volume", "get", name]);
    let r = &v["replication"];
    let list = r["replicas"]
        .as_array()
        .unwrap_or_else(|| panic!("no replicas: {v}"))
        .iter()
        .map(|x| {
            (
                x["node"].as_str().unwrap_or_default().to_string(),
                x["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    (r.clone(), list)
}

/// Volume `r` of `size` on `a`, with a second replica on node n1.
fn create_on_two(a: &Node, size: &str) {
    a.d.ok(&[
        "volume",
        "create",
        "r",
        "--size",
        size,
        "--replicas",
        "2",
        "--replica-node",
        "n1",
    ]);
}

/// Volume `r` detached from `a` (once its NBD clients are gone), a
/// snapshot `end` of it on every replica, and each other replica's
/// compared with `a`'s byte for byte; the snapshot's exports, in order.
fn alike(a: &Node, others: &[&Node]) -> Vec<String> {
    wait_until("detached", std::time::Duration::from_secs(30), || {
        a.d.lamina(&["volume", "detach", "r"])
            .status
            .success()
            .then_some(())
    });
    a.d.ok(&["snapshot", "create", "r", "end"]);
    let here = a.d.attach(&["snapshot", "attach", "r", "end"]);
    let mut all = vec![here.clone()];
    for n in others {
        let there = n.d.attach(&["snapshot", "attach", "r", "end"]);
        let cmp = qemu_img_compare(&here, &there);
        assert!(cmp.status.success(), "{} differs: {cmp:?}", n.name);
        all.push(there);
    }
    all
}

fn states(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn a_replicated_volume_keeps_every_acknowledged_write_when_a_replica_node_dies() {
    need("fio", "fio");
    need("qemu-img", "qemu-utils");
    let net = Net::new(3);
    let certs = Certs::new();
    let mut n = nodes(&net, &certs).into_iter();
    let (a, b, mut c) = (n.next().unwrap(), n.next().unwrap(), n.next().unwrap());

    // A create that cannot be carried out answers an error and leaves no
    // volume behind: a node not in the list, a node that does not answer.
    let e = a.d.err(&[
        "volume",
        "create",
        "x",
        "--size",
        "64MiB",
        "--replicas",
        "2",
        "--replica-node",
        "nope",
    ]);
    assert!(e.contains("no node \"nope\""), "{e}");
    a.d.ok(&["node", "add", "silent", "127.0.0.1:9"]);
    let e = a.d.err(&[
        "volume",
        "create",
        "x",
        "--size",
        "64MiB",
        "--replicas",
        "2",
        "--replica-node",
        "silent",
    ]);
    assert!(e.contains("node silent could not make its replica"), "{e}");
    let left = a.d.lamina(&["volume", "get", "x"]);
    assert!(
        !left.status.success(),
        "a failed create left its volume: {left:?}"
    );
    a.d.ok(&["node", "remove", "silent"]);

    // Three replicas: this node's and the node list's first two.
    let create = [
        "volume",
        "create",
        "r",
        "--size",
        "64MiB",
        "--replicas",
        "3",
    ];
    a.d.ok(&create);
    let (r, list) = replicas(&a, "r");
    assert_eq!(
        list,
        states(&[("n0", "healthy"), ("n1", "healthy"), ("n2", "healthy")]),
        "{r}"
    );
    assert_eq!(
        (&r["state"], &r["generation"]),
        (&"healthy".into(), &0.into())
    );
    for n in [&b, &c] {
        let v = n.d.json(&["volume", "get", "r"]);
        assert_eq!(v["labels"]["lamina.io/replica-of"], "n0", "{v}");
        assert_eq!(v["size"], 64 << 20, "{v}");
    }
    // Asked again, the same: answered as it is.
    assert!(a.d.ok(&create).contains("exists already"));
    // Asked with other replicas: refused.
    let e = a.d.err(&[
        "volume",
        "create",
        "r",
        "--size",
        "64MiB",
        "--replicas",
        "2",
    ]);
    assert!(e.contains("other replicas"), "{e}");

    let uri = a.d.attach(&["volume", "attach", "r"]);
    assert_eq!(replicas(&a, "r").0["generation"], 1);
    fio(&uri, &["--randseed=1", "--do_verify=1"]);
    // A snapshot is taken on every replica, and holds the same data on
    // each (the first pass's).
    a.d.ok(&["snapshot", "create", "r", "s1"]);
    let on_c = c.d.attach(&["snapshot", "attach", "r", "s1"]);
    for n in [&a, &b] {
        let there = n.d.attach(&["snapshot", "attach", "r", "s1"]);
        let cmp = qemu_img_compare(&on_c, &there);
        assert!(cmp.status.success(), "s1 differs on {}: {cmp:?}", n.name);
    }
    fio(&on_c, &["--randseed=1", "--verify_only"]);
    for n in [&a, &b, &c] {
        n.d.ok(&["snapshot", "detach", "r", "s1"]);
    }
    // Deleting it deletes it on every replica.
    a.d.ok(&["snapshot", "delete", "r", "s1"]);
    for n in [&b, &c] {
        assert!(
            !n.d.ok(&["snapshot", "list", "r"]).contains("s1"),
            "s1 is still on {}",
            n.name
        );
    }

    // A replica's node dies: the volume goes on, on the other two.
    c.d.kill9();
    fio(&uri, &["--randseed=2", "--do_verify=1"]);
    let (r, list) = replicas(&a, "r");
    assert_eq!(
        list,
        states(&[("n0", "healthy"), ("n1", "healthy"), ("n2", "faulted")]),
        "{r}"
    );
    assert_eq!(r["state"], "degraded", "{r}");
    let reason = r["replicas"][2]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("replica volume r on n2"), "{r}");
    // The same, as `lamina replica list` shows it.
    assert_eq!(a.d.json(&["replica", "list", "r"]), r);
    let table = a.d.ok(&["replica", "list", "r"]);
    assert!(
        table.contains("degraded") && table.contains("faulted"),
        "{table}"
    );

    // The replicas called healthy hold every acknowledged write: the same
    // bytes on both, and the second pass's pattern verifies on the other
    // node's.
    // Detached, a snapshot reaches the healthy replicas over sessions of
    // its own; the faulted one is left out.
    a.d.ok(&["volume", "detach", "r"]);
    a.d.ok(&["snapshot", "create", "r", "after"]);
    let on = |n: &Node| n.d.ok(&["snapshot", "list", "r"]).contains("after");
    assert!(on(&b), "the snapshot did not reach n1");
    let here = a.d.attach(&["snapshot", "attach", "r", "after"]);
    let there = b.d.attach(&["snapshot", "attach", "r", "after"]);
    let cmp = qemu_img_compare(&here, &there);
    assert!(cmp.status.success(), "the healthy replicas differ: {cmp:?}");
    fio(&there, &["--randseed=2", "--verify_only"]);

    // The dead node comes back: its replica stays out (it missed writes
    // and a snapshot) while no front end serves the volume.
    c.d.start_again();
    assert!(!on(&c), "a faulted replica got a snapshot");
    assert_eq!(replicas(&a, "r").1[2].1, "faulted");
    // The next front end takes generation 2 and rebuilds it from what
    // changed: the snapshot it missed, with its data, then what was
    // written since, while a third pass writes.
    let uri = a.d.attach(&["volume", "attach", "r"]);
    assert_eq!(replicas(&a, "r").0["generation"], 2);
    fio(&uri, &["--randseed=3", "--do_verify=1", "--size=8m"]);
    let r = wait_until("n2 rebuilt", std::time::Duration::from_secs(120), || {
        let (r, list) = replicas(&a, "r");
        (list[2].1 == "healthy").then_some(r)
    });
    assert_eq!(r["state"], "healthy", "{r}");
    // Sent: about what was written while it was away (the second pass's
    // 32 MiB, and the third's 8 MiB), not the volume.
    let sent = r["replicas"][2]["last_rebuild"]["sent_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no last rebuild: {r}"));
    let written = 40u64 << 20;
    let took = &r["replicas"][2]["last_rebuild"];
    eprintln!(
        "rebuild of a killed node's replica: {sent} bytes sent for {written} written ({took})"
    );
    assert!(
        sent <= written * 3 / 2,
        "sent {sent} bytes for {written} written: {r}"
    );
    assert!(on(&c), "the missed snapshot did not reach n2");
    let here = a.d.attach(&["snapshot", "attach", "r", "after"]);
    let there = c.d.attach(&["snapshot", "attach", "r", "after"]);
    let cmp = qemu_img_compare(&here, &there);
    assert!(
        cmp.status.success(),
        "n2's missed snapshot differs: {cmp:?}"
    );
    for n in [&a, &c] {
        n.d.ok(&["snapshot", "detach", "r", "after"]);
    }
    // Healthy again: it takes the writes, and every replica ends alike.
    fio(&uri, &["--randseed=4", "--do_verify=1", "--size=8m"]);
    let ends = alike(&a, &[&b, &c]);
    fio(&ends[2], &["--randseed=4", "--verify_only", "--size=8m"]);
}

/// Wait until volume r's second replica (on n1) is healthy with a last
/// rebuild other than `before`: the replica set, and the bytes it sent.
fn rebuilt_again(a: &Node, before: &Value, what: &str) -> (Value, Option<u64>) {
    let r = wait_until(
        &format!("n1 rebuilt, {what}"),
        std::time::Duration::from_secs(120),
        || {
            let (r, list) = replicas(a, "r");
            let done = list[1].1 == "healthy" && r["replicas"][1]["last_rebuild"] != *before;
            done.then_some(r)
        },
    );
    let sent = r["replicas"][1]["last_rebuild"]["sent_bytes"].as_u64();
    (r, sent)
}

#[test]
fn a_replica_whose_link_is_cut_is_faulted_after_its_silence_busy_or_idle_and_the_volume_goes_on() {
    need("fio", "fio");
    need("qemu-img", "qemu-utils");
    let net = Net::new(2);
    let certs = Certs::new();
    let mut n = nodes(&net, &certs).into_iter();
    let (a, mut b) = (n.next().unwrap(), n.next().unwrap());
    create_on_two(&a, "64MiB");
    let uri = a.d.attach(&["volume", "attach", "r"]);
    // Both halves written, and no flush: every write unflushed at the cut.
    fio(&uri, &["--randseed=1", "--do_verify=1"]);
    fio(&uri, &["--randseed=5", "--do_verify=1", "--offset=32m"]);

    // The link goes silent (packets dropped, no reset): the front end
    // waits out its silence (5 s), faults the replica, and goes on.
    b.host.cut();
    // Flushed at its end: what the kill below may not lose.
    fio(&uri, &["--randseed=2", "--do_verify=1", "--end_fsync=1"]);
    let (r, list) = replicas(&a, "r");
    assert_eq!(list, states(&[("n0", "healthy"), ("n1", "faulted")]), "{r}");
    let reason = r["replicas"][1]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("no answer for 5 s"), "{r}");
    // The link back, the replica is sent what it missed, and is healthy
    // again. Its daemon lived through the cut: it still holds the 64 MiB
    // it answered before, unflushed, which a flush there makes durable
    // instead of their being sent again.
    b.host.restore();
    let r = wait_until("n1 rebuilt", std::time::Duration::from_secs(120), || {
        let (r, list) = replicas(&a, "r");
        (list[1].1 == "healthy").then_some(r)
    });
    let sent = r["replicas"][1]["last_rebuild"]["sent_bytes"].as_u64();
    eprintln!(
        "rebuild after a cut link: {sent:?} bytes sent for 32 MiB written ({})",
        r["replicas"][1]["last_rebuild"]
    );
    assert!(
        sent.is_some_and(|s| s <= 48 << 20),
        "32 MiB written while it was away: {r}"
    );
    fio(&uri, &["--randseed=2", "--verify_only"]);
    fio(&uri, &["--randseed=5", "--verify_only", "--offset=32m"]);

    // The link cut while the volume is idle: its pings go unanswered, and
    // the replica is faulted with no I/O to find out, then rebuilt once
    // the link is back.
    b.host.cut();
    let r = wait_until(
        "n1 faulted, idle",
        std::time::Duration::from_secs(30),
        || {
            let (r, list) = replicas(&a, "r");
            (list[1].1 == "faulted").then_some(r)
        },
    );
    let reason = r["replicas"][1]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("its session failed"), "{r}");
    b.host.restore();
    wait_until(
        "n1 rebuilt, idle",
        std::time::Duration::from_secs(120),
        || {
            let (_, list) = replicas(&a, "r");
            (list[1].1 == "healthy").then_some(())
        },
    );
    fio(&uri, &["--randseed=2", "--verify_only"]);

    // The replica's daemon killed with 32 MiB it answered that no flush
    // covered: its node may have lost them, and it comes back at another
    // instance, so they are sent again with nothing else written.
    fio(&uri, &["--randseed=6", "--do_verify=1", "--offset=32m"]);
    let before = replicas(&a, "r").0["replicas"][1]["last_rebuild"].clone();
    b.d.kill9();
    wait_until(
        "n1 faulted, killed",
        std::time::Duration::from_secs(30),
        || {
            let (_, list) = replicas(&a, "r");
            (list[1].1 == "faulted").then_some(())
        },
    );
    b.d.start_again();
    let (r, sent) = rebuilt_again(&a, &before, "restarted");
    eprintln!("rebuild after a restart: {sent:?} bytes sent for 32 MiB unflushed");
    assert!(
        sent.is_some_and(|s| (32 << 20..=48 << 20).contains(&s)),
        "32 MiB unflushed at the kill: {r}"
    );
    fio(&uri, &["--randseed=6", "--verify_only", "--offset=32m"]);

    // The front end's own daemon killed: it comes back serving the export
    // at the next generation, from both replicas, with every flushed write.
    let mut a = a;
    a.d.kill9();
    a.d.start_again();
    let (r, list) = replicas(&a, "r");
    assert_eq!(r["generation"], 2, "{r}");
    assert_eq!(list, states(&[("n0", "healthy"), ("n1", "healthy")]), "{r}");
    fio(&uri, &["--randseed=2", "--verify_only"]);
    alike(&a, &[&b]);

    // Detached, a snapshot whose replica's daemon is down faults it. It
    // held every write until then: the next front end tracks it from its
    // start, and it is sent what was written since and the snapshot it
    // missed, not the volume.
    b.d.kill9();
    a.d.ok(&["snapshot", "create", "r", "while-down"]);
    let (r, list) = replicas(&a, "r");
    assert_eq!(list, states(&[("n0", "healthy"), ("n1", "faulted")]), "{r}");
    let before = r["replicas"][1]["last_rebuild"].clone();
    b.d.start_again();
    a.d.ok(&["snapshot", "detach", "r", "end"]);
    let uri = a.d.attach(&["volume", "attach", "r"]);
    fio(&uri, &["--randseed=7", "--do_verify=1", "--size=4m"]);
    let (r, sent) = rebuilt_again(&a, &before, "faulted while detached");
    eprintln!("rebuild after a fault while detached: {sent:?} bytes sent for 4 MiB written");
    // Each block written since goes twice: as the missed snapshot has it,
    // then as the volume does (and a third time if written during the
    // last round).
    assert!(
        sent.is_some_and(|s| s <= 12 << 20),
        "4 MiB written since, of a 64 MiB volume: {r}"
    );
    let here = a.d.attach(&["snapshot", "attach", "r", "while-down"]);
    let there = b.d.attach(&["snapshot", "attach", "r", "while-down"]);
    let cmp = qemu_img_compare(&here, &there);
    assert!(cmp.status.success(), "while-down differs: {cmp:?}");
    fio(&there, &["--randseed=2", "--verify_only"]);
    fio(&uri, &["--randseed=7", "--verify_only", "--size=4m"]);
}

#[test]
fn snapshots_taken_under_writes_hold_the_same_data_on_every_replica() {
    need("fio", "fio");
    need("qemu-img", "qemu-utils");
    let net = Net::new(2);
    let certs = Certs::new();
    let mut n = nodes(&net, &certs).into_iter();
    let (a, b) = (n.next().unwrap(), n.next().unwrap());
    a.d.ok(&[
        "volume",
        "create",
        "r",
        "--size",
        "64MiB",
        "--replicas",
        "2",
    ]);
    let uri = a.d.attach(&["volume", "attach", "r"]);
    // Writes run while the snapshots are taken: each must be one point of
    // the write stream on both replicas.
    let writer = {
        let uri = uri.clone();
        std::thread::spawn(move || {
            fio(
                &uri,
                &["--randseed=3", "--time_based", "--runtime=4", "--verify=0"],
            )
        })
    };
    let names: Vec<String> = (1..=5).map(|i| format!("s{i}")).collect();
    for n in &names {
        std::thread::sleep(std::time::Duration::from_millis(300));
        a.d.ok(&["snapshot", "create", "r", n]);
    }
    writer.join().unwrap();
    let (r, list) = replicas(&a, "r");
    assert_eq!(list, states(&[("n0", "healthy"), ("n1", "healthy")]), "{r}");
    for n in &names {
        let here = a.d.attach(&["snapshot", "attach", "r", n]);
        let there = b.d.attach(&["snapshot", "attach", "r", n]);
        let cmp = qemu_img_compare(&here, &there);
        assert!(
            cmp.status.success(),
            "{n} differs between the replicas: {cmp:?}"
        );
    }
}

/// fio on `uri` with `job` (4 KiB at random, 4 in flight) for up to two
/// minutes, in the background.
fn background(uri: &str, job: &[&str]) -> std::process::Child {
    Command::new("fio")
        .args([
            // Its job a thread of the process killed, not a child.
            "--thread",
            "--ioengine=nbd",
            "--bs=4k",
            "--iodepth=4",
            "--time_based",
            "--runtime=120",
            "--output=/dev/null",
        ])
        .args(job)
        .arg(format!("--uri={uri}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("fio runs")
}

/// fio reading `uri` at random, in the background: I/O that makes the
/// node pace its rebuilds.
fn busy(uri: &str) -> std::process::Child {
    background(uri, &["--name=busy", "--rw=randread"])
}

/// The rebuild of replica `i` of volume `name` on `n`, once it has sent at
/// least `bytes` of its round.
fn rebuilding_past(n: &Node, name: &str, i: usize, bytes: u64) -> Value {
    wait_until(
        &format!("replica {i} rebuilding past {bytes} bytes"),
        std::time::Duration::from_secs(120),
        || {
            let (r, _) = replicas(n, name);
            let x = &r["replicas"][i];
            (x["state"] == "rebuilding" && x["rebuild"]["round_sent_bytes"].as_u64() >= Some(bytes))
                .then(|| x.clone())
        },
    )
}

#[test]
fn a_rebuild_killed_on_either_side_resumes_where_it_got_and_ends_identical() {
    need("fio", "fio");
    need("qemu-img", "qemu-utils");
    let net = Net::new(2);
    let certs = Certs::new();
    let hosts = net.hosts();
    // Rebuilds yield to the volume's I/O down to 16 MiB/s: slow enough to
    // be killed half way.
    let mut a = Node::start_args(
        &hosts[0],
        "n0",
        certs.issue("n0"),
        60,
        &["--transfer-busy-rate", "16MiB"],
    );
    let mut b = Node::start(&hosts[1], "n1", &certs, 60);
    a.d.ok(&["node", "add", "n1", &b.transfer()]);
    create_on_two(&a, "512MiB");
    let uri = a.d.attach(&["volume", "attach", "r"]);
    fio(
        &uri,
        &[
            "--randseed=1",
            "--do_verify=1",
            "--size=16m",
            "--end_fsync=1",
        ],
    );
    // n1 is lost while 160 MiB are written.
    b.d.kill9();
    let written: u64 = 160 << 20;
    fio(
        &uri,
        &[
            "--rw=write",
            "--bs=1m",
            "--size=160m",
            "--offset=64m",
            "--randseed=2",
            "--do_verify=1",
            // Flushed: the front end's own kill below may not lose it
            // (docs/replicas.md: what a killed front end loses of writes
            // no flush covered is not reconciled yet).
            "--end_fsync=1",
        ],
    );
    assert_eq!(replicas(&a, "r").1[1].1, "faulted");
    let mut load = busy(&uri);
    b.d.start_again();
    // Killed on the replica's side a third of the way: it resumes there.
    let x = rebuilding_past(&a, "r", 1, 48 << 20);
    b.d.kill9();
    b.d.start_again();
    let y = rebuilding_past(&a, "r", 1, 64 << 20);
    assert!(
        y["rebuild"]["round_sent_bytes"].as_u64() >= x["rebuild"]["round_sent_bytes"].as_u64(),
        "it went back: {x} then {y}"
    );
    // Killed on the front end's side further on: the next front end's
    // round sends only what was left (from the last record, every 16 MiB).
    rebuilding_past(&a, "r", 1, 96 << 20);
    let _ = load.kill();
    let _ = load.wait();
    a.d.kill9();
    a.d.start_again();
    let mut load = busy(&uri);
    wait_until(
        "a round of what was left",
        std::time::Duration::from_secs(60),
        || {
            let (r, list) = replicas(&a, "r");
            let left = r["replicas"][1]["rebuild"]["round_bytes"].as_u64();
            (list[1].1 == "healthy" || left.is_some_and(|l| l <= written - (80 << 20)))
                .then_some(())
        },
    );
    let r = wait_until("n1 rebuilt", std::time::Duration::from_secs(180), || {
        let (r, list) = replicas(&a, "r");
        (list[1].1 == "healthy").then_some(r)
    });
    let _ = load.kill();
    let _ = load.wait();
    let sent = r["replicas"][1]["last_rebuild"]["sent_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no last rebuild: {r}"));
    eprintln!("rebuild after two kills: {sent} bytes sent for {written} written");
    // Resumed from its last record each time: started again from zero, it
    // would have sent 48 MiB more at least (and what a killed front end sent
    // after its last record is not counted).
    assert!(
        sent >= written && sent <= written + (40 << 20),
        "sent {sent} bytes for {written} written: {r}"
    );
    fio(&uri, &["--randseed=1", "--verify_only", "--size=16m"]);
    // Once the killed readers' connections end.
    alike(&a, &[&b]);
}

#[test]
fn a_killed_front_end_leaves_its_replicas_alike_where_no_flush_covered_its_writes() {
    need("fio", "fio");
    need("qemu-img", "qemu-utils");
    let net = Net::new(2);
    let certs = Certs::new();
    let mut n = nodes(&net, &certs).into_iter();
    let (mut a, b) = (n.next().unwrap(), n.next().unwrap());
    create_on_two(&a, "192MiB");
    let uri = a.d.attach(&["volume", "attach", "r"]);
    // Flushed, in the first region.
    fio(&uri, &["--randseed=1", "--do_verify=1", "--end_fsync=1"]);
    // Not flushed, in the second and third (64 MiB each): each replica may
    // keep or lose them when the front end is killed.
    fio(&uri, &["--randseed=2", "--offset=64m", "--size=96m"]);
    a.d.kill9();
    a.d.start_again();
    // Served again at the next generation, with both replicas healthy and
    // made alike in the regions the killed front end left dirty.
    let (r, list) = replicas(&a, "r");
    assert_eq!(r["generation"], 2, "{r}");
    assert_eq!(list, states(&[("n0", "healthy"), ("n1", "healthy")]), "{r}");
    let log = a.d.log();
    // The two unflushed regions at least (the flushed one too when no
    // flush came 5 s after the last clean: regions are cleaned lazily).
    assert!(
        log.contains("replicas made alike") && !log.contains("regions=1 "),
        "no reconcile of the dirty regions in the log"
    );
    fio(&uri, &["--randseed=1", "--verify_only"]);
    alike(&a, &[&b]);
}

#[test]
fn a_replica_added_later_is_sent_the_volume_and_its_snapshots_and_one_removed_leaves_the_volume() {
    need("fio", "fio");
    need("qemu-img", "qemu-utils");
    let net = Net::new(3);
    let certs = Certs::new();
    let mut n = nodes(&net, &certs).into_iter();
    let (a, b, c) = (n.next().unwrap(), n.next().unwrap(), n.next().unwrap());

    // A volume of one replica, written, with a snapshot between passes.
    a.d.ok(&["volume", "create", "r", "--size", "96MiB"]);
    let uri = a.d.attach(&["volume", "attach", "r"]);
    fio(&uri, &["--randseed=1", "--do_verify=1"]);
    a.d.ok(&["snapshot", "create", "r", "s1"]);
    fio(&uri, &["--randseed=2", "--do_verify=1", "--offset=32m"]);
    // Its first other replica waits for it to be detached.
    let e = a.d.err(&["replica", "add", "r", "n1"]);
    assert!(e.contains("detach"), "{e}");
    a.d.ok(&["volume", "detach", "r"]);

    // Added detached: made on n1, and copied to by a front end of its own,
    // the snapshot first, then the volume.
    let r = a.d.json(&["replica", "add", "r", "n1"]);
    assert_eq!(r["replicas"][1]["node"], "n1", "{r}");
    assert_eq!(r["replicas"][1]["state"], "faulted", "{r}");
    let r = wait_until("n1 copied", std::time::Duration::from_secs(120), || {
        let (r, list) = replicas(&a, "r");
        (list == states(&[("n0", "healthy"), ("n1", "healthy")])).then_some(r)
    });
    let sent = r["replicas"][1]["last_rebuild"]["sent_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no last rebuild: {r}"));
    eprintln!("a new replica of 64 MiB written: {sent} bytes sent ({r})");
    // What was written once (64 MiB), not the volume twice.
    assert!(sent <= 64 << 20, "sent {sent}: {r}");
    assert!(b.d.ok(&["snapshot", "list", "r"]).contains("s1"));
    let here = a.d.attach(&["snapshot", "attach", "r", "s1"]);
    let there = b.d.attach(&["snapshot", "attach", "r", "s1"]);
    let cmp = qemu_img_compare(&here, &there);
    assert!(cmp.status.success(), "s1 differs on n1: {cmp:?}");
    fio(&there, &["--randseed=1", "--verify_only"]);
    a.d.ok(&["snapshot", "detach", "r", "s1"]);
    b.d.ok(&["snapshot", "detach", "r", "s1"]);
    // Asked again: nothing changes.
    a.d.ok(&["replica", "add", "r", "n1"]);

    // Attached (served by that front end), a third replica is added while
    // fio writes: it rejoins the write set and ends alike.
    let uri = a.d.attach(&["volume", "attach", "r"]);
    let writer = {
        let uri = uri.clone();
        std::thread::spawn(move || fio(&uri, &["--randseed=3", "--do_verify=1", "--size=16m"]))
    };
    a.d.ok(&["replica", "add", "r", "n2"]);
    writer.join().unwrap();
    wait_until("n2 copied", std::time::Duration::from_secs(120), || {
        let (_, list) = replicas(&a, "r");
        (list[2].1 == "healthy").then_some(())
    });
    let e = a.d.err(&["replica", "add", "r", "n2x"]);
    assert!(e.contains("no node") || e.contains("at most 3"), "{e}");

    // Removed: the volume goes on with the others; its volume there goes,
    // with its snapshot.
    let e = a.d.err(&["replica", "remove", "r", "n0"]);
    assert!(e.contains("this node's"), "{e}");
    a.d.ok(&["replica", "remove", "r", "n1"]);
    assert!(a
        .d
        .ok(&["replica", "remove", "r", "n1"])
        .contains("nothing to remove"));
    assert_eq!(
        replicas(&a, "r").1,
        states(&[("n0", "healthy"), ("n2", "healthy")])
    );
    fio(&uri, &["--randseed=4", "--do_verify=1", "--size=8m"]);
    assert!(!holds(&b, "r"), "n1 still holds r: {:?}", held(&b));
    let ends = alike(&a, &[&c]);
    fio(&ends[1], &["--randseed=4", "--verify_only", "--size=8m"]);
}

/// qemu-io `cmds` on `uri` (`-r URI` to open it read only), run to the
/// end whatever they answer: its output (stdout and stderr).
fn qemu_io_any(uri: &str, cmds: &[&str]) -> String {
    let mut c = Command::new("qemu-io");
    // "-r URI": read only (a snapshot's export).
    c.args(["-f", "raw"]).args(uri.split(' '));
    for x in cmds {
        c.args(["-c", x]);
    }
    let out = c.output().expect("qemu-io runs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_front_end_of_an_older_generation_is_refused_once_a_newer_one_took_over() {
    need("fio", "fio");
    need("qemu-io", "qemu-utils");
    let net = Net::new(3);
    let certs = Certs::new();
    let a = Node::start(net.host(0), "n0", &certs, 60);
    let b = Node::start(net.host(1), "n1", &certs, 60);
    a.d.ok(&["node", "add", "n1", &b.transfer()]);
    create_on_two(&a, "64MiB");
    let old = a.d.attach(&["volume", "attach", "r"]);
    fio(&old, &["--randseed=1", "--do_verify=1", "--end_fsync=1"]);
    assert_eq!(replicas(&a, "r").0["generation"], 1);

    // n0's daemon hangs (SIGSTOP), and a second daemon takes its place on
    // another host from a copy of its data directory, as a node whose
    // record was restored elsewhere would: it opens the attached volume
    // at the next generation, and n1's replica fences at it.
    let pid = a.d.pid().expect("n0 runs").to_string();
    run(Command::new("kill").args(["-STOP", &pid])).ok();
    let copy = tempfile::Builder::new()
        .prefix("lamina-usurper")
        .tempdir_in("/tmp")
        .unwrap();
    let mut cp = Command::new("cp");
    cp.args(["-a", "--sparse=always"]);
    for f in ["pool", "lamina.redb", "token"] {
        let p = a.d.data().join(f);
        if p.exists() {
            cp.arg(p);
        }
    }
    cp.arg(copy.path());
    run(&mut cp).ok();
    let usurper = Node::start_on(net.host(2), "n0", certs.issue("n0"), copy.path().into());
    wait_until(
        "the second front end",
        std::time::Duration::from_secs(30),
        || (replicas(&usurper, "r").0["generation"] == 2).then_some(()),
    );
    let new = usurper.d.attach(&["volume", "attach", "r"]);
    // n0 wakes up, its session to n1 still open (its silence is well
    // under n1's 30 s): every write it is asked for now is refused by n1,
    // and fails; so does everything after.
    run(Command::new("kill").args(["-CONT", &pid])).ok();
    let out = qemu_io_any(&old, &["write -P 0x55 0 64k"]);
    assert!(
        out.contains("failed") || out.contains("error"),
        "a fenced front end acknowledged a write: {out}"
    );
    let out = qemu_io_any(&old, &["read 0 4k"]);
    assert!(
        out.contains("failed") || out.contains("error"),
        "a fenced front end answered a read: {out}"
    );
    let log = a.d.log();
    assert!(
        log.contains("higher generation") || log.contains("enced"),
        "n0 does not say it was fenced: {}",
        a.d.log_tail()
    );
    // The newer front end goes on: n1 holds neither the refused write nor
    // anything but what was acknowledged, and both its replicas read alike.
    fio(&new, &["--randseed=1", "--verify_only"]);
    fio(&new, &["--randseed=2", "--do_verify=1", "--size=8m"]);
    assert_eq!(
        replicas(&usurper, "r").1,
        states(&[("n0", "healthy"), ("n1", "healthy")])
    );
    let ends = alike(&usurper, &[&b]);
    let head = qemu_io_any(&format!("-r {}", ends[1]), &["read -P 0x55 0 64k"]);
    assert!(head.contains("Pattern verification failed"), "{head}");
}

/// A tmpfs of a given size, mounted on a directory of its own until
/// dropped: a disk that fills up.
struct SmallDisk(tempfile::TempDir);

impl SmallDisk {
    fn new(size: &str) -> SmallDisk {
        let dir = tempfile::Builder::new()
            .prefix("lamina-full")
            .tempdir_in("/tmp")
            .unwrap();
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path()))
        .ok();
        SmallDisk(dir)
    }

    fn path(&self) -> std::path::PathBuf {
        self.0.path().to_path_buf()
    }

    /// Its size changed (more room).
    fn resize(&self, size: &str) {
        run(Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.0.path()))
        .ok();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

#[test]
fn a_replica_whose_disk_fills_up_is_faulted_and_rebuilt_once_there_is_room() {
    need("fio", "fio");
    need("qemu-img", "qemu-utils");
    let net = Net::new(2);
    let certs = Certs::new();
    // Declared first: dropped after the daemon on it.
    // The pool preallocates its log (64 MiB) and journal (16 MiB): about
    // 48 MiB are left for data.
    let disk = SmallDisk::new("128m");
    let a = Node::start(net.host(0), "n0", &certs, 60);
    let b = Node::start_on(net.host(1), "n1", certs.issue("n1"), disk.path());
    a.d.ok(&["node", "add", "n1", &b.transfer()]);
    create_on_two(&a, "96MiB");
    let uri = a.d.attach(&["volume", "attach", "r"]);
    fio(&uri, &["--randseed=1", "--do_verify=1"]);
    assert_eq!(
        replicas(&a, "r").1,
        states(&[("n0", "healthy"), ("n1", "healthy")])
    );
    // 32 MiB more do not fit on n1's disk: its writes fail, it is faulted,
    // and the volume goes on with no error reaching fio.
    fio(&uri, &["--randseed=2", "--do_verify=1", "--offset=32m"]);
    // Out of the healthy set (its rebuild may be trying already, and
    // failing while the disk is full).
    let (r, list) = replicas(&a, "r");
    assert_eq!(list[0], ("n0".to_string(), "healthy".to_string()), "{r}");
    assert_ne!(list[1].1, "healthy", "{r}");
    let reason = r["replicas"][1]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("no space left"), "{r}");
    fio(&uri, &["--randseed=1", "--verify_only"]);
    // Room again: it is rebuilt, and ends alike.
    disk.resize("512m");
    wait_until("n1 rebuilt", std::time::Duration::from_secs(120), || {
        let (_, list) = replicas(&a, "r");
        (list[1].1 == "healthy").then_some(())
    });
    fio(
        &uri,
        &["--randseed=3", "--do_verify=1", "--size=8m", "--offset=64m"],
    );
    let ends = alike(&a, &[&b]);
    fio(&ends[1], &["--randseed=2", "--verify_only", "--offset=32m"]);
}

/// Node n0 on `net`'s first host, its pool on a small disk (128 MiB, about
/// 48 MiB for data), its store beside it on the machine's (the faults are
/// recorded): the disk, the data directory and the node, in the order they
/// must outlive one another (bound in that order, the node stops first).
fn n0_on_a_small_disk<'a>(net: &'a Net, certs: &Certs) -> (SmallDisk, tempfile::TempDir, Node<'a>) {
    let disk = SmallDisk::new("128m");
    let data = tempfile::Builder::new()
        .prefix("lamina-n0")
        .tempdir_in("/tmp")
        .unwrap();
    std::os::unix::fs::symlink(disk.path(), data.path().join("pool")).unwrap();
    let a = Node::start_on(net.host(0), "n0", certs.issue("n0"), data.path().into());
    (disk, data, a)
}

#[test]
fn the_front_ends_own_replica_whose_disk_fills_up_is_rebuilt_first_and_the_others_from_it() {
    need("fio", "fio");
    need("qemu-img", "qemu-utils");
    let net = Net::new(3);
    let certs = Certs::new();
    let (disk, _data, a) = n0_on_a_small_disk(&net, &certs);
    let b = Node::start(net.host(1), "n1", &certs, 60);
    let c = Node::start(net.host(2), "n2", &certs, 60);
    for n in [&b, &c] {
        a.d.ok(&["node", "add", &n.name, &n.transfer()]);
    }
    a.d.ok(&[
        "volume",
        "create",
        "r",
        "--size",
        "96MiB",
        "--replicas",
        "3",
        "--replica-node",
        "n1",
        "--replica-node",
        "n2",
    ]);
    let uri = a.d.attach(&["volume", "attach", "r"]);
    fio(&uri, &["--randseed=1", "--do_verify=1"]);
    // 32 MiB more do not fit in n0's pool: the front end's own replica is
    // faulted, and the volume goes on from n1 and n2 with no error
    // reaching fio.
    fio(&uri, &["--randseed=2", "--do_verify=1", "--offset=32m"]);
    let (r, list) = replicas(&a, "r");
    assert_ne!(list[0].1, "healthy", "{r}");
    assert_eq!(
        list[1..],
        states(&[("n1", "healthy"), ("n2", "healthy")]),
        "{r}"
    );
    let reason = r["replicas"][0]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("no space left"), "{r}");
    // Its snapshot would miss what it failed: refused, saying why.
    let out = a.d.lamina(&["snapshot", "create", "r", "while-full"]);
    let err = &out.stderr;
    assert!(
        !out.status.success() && err.contains("this node's replica is faulted"),
        "{out:?}"
    );
    // n2's link cut too: n1 alone holds the next writes.
    c.host.cut();
    fio(
        &uri,
        &["--randseed=3", "--do_verify=1", "--size=8m", "--offset=64m"],
    );
    let (r, list) = replicas(&a, "r");
    assert_eq!(
        list[1..],
        states(&[("n1", "healthy"), ("n2", "faulted")]),
        "{r}"
    );
    // n2 answers again, but it would be rebuilt from n0's replica, which
    // lacks what n1 holds: it waits for n0's rebuild (4 turns here).
    c.host.restore();
    std::thread::sleep(std::time::Duration::from_secs(8));
    let (r, list) = replicas(&a, "r");
    assert_ne!(list[0].1, "healthy", "{r}");
    assert_ne!(list[2].1, "healthy", "{r}");
    // Room again: n0's replica is copied what it missed, from n1, then n2
    // is rebuilt from it.
    disk.resize("512m");
    let r = wait_until("all rebuilt", std::time::Duration::from_secs(120), || {
        let (r, list) = replicas(&a, "r");
        list.iter().all(|(_, s)| s == "healthy").then_some(r)
    });
    let sent = r["replicas"][0]["last_rebuild"]["sent_bytes"].as_u64();
    eprintln!(
        "this node's replica rebuilt: {sent:?} bytes copied for at most 40 MiB written while away ({})",
        r["replicas"][0]["last_rebuild"]
    );
    // Of what fio wrote after the fault (part of the second 32 MiB) and
    // then 8 MiB, each 4 KiB block copied once: never the volume (96 MiB).
    assert!(
        sent.is_some_and(|s| (1..=60 << 20).contains(&s)),
        "at most 40 MiB written while it was away: {r}"
    );
    fio(&uri, &["--randseed=1", "--verify_only", "--size=32m"]);
    fio(&uri, &["--randseed=2", "--verify_only", "--offset=32m"]);
    fio(
        &uri,
        &["--randseed=3", "--verify_only", "--size=8m", "--offset=64m"],
    );
    let ends = alike(&a, &[&b, &c]);
    for end in &ends {
        fio(end, &["--randseed=2", "--verify_only", "--offset=32m"]);
        fio(
            end,
            &["--randseed=3", "--verify_only", "--size=8m", "--offset=64m"],
        );
    }
}

#[test]
fn the_front_ends_own_replica_faulted_then_its_daemon_killed_is_copied_only_the_regions_it_missed()
{
    need("fio", "fio");
    need("qemu-img", "qemu-utils");
    let net = Net::new(2);
    let certs = Certs::new();
    // A volume of four 64 MiB regions.
    let (disk, _data, mut a) = n0_on_a_small_disk(&net, &certs);
    let b = Node::start(net.host(1), "n1", &certs, 60);
    a.d.ok(&["node", "add", &b.name, &b.transfer()]);
    create_on_two(&a, "256MiB");
    let uri = a.d.attach(&["volume", "attach", "r"]);
    // Region 0, flushed.
    fio(&uri, &["--randseed=1", "--do_verify=1", "--end_fsync=1"]);
    // Region 3 fills n0's disk: its replica is faulted with region 3 at
    // risk in its record, and n1 holds the rest.
    fio(
        &uri,
        &[
            "--randseed=2",
            "--do_verify=1",
            "--offset=192m",
            "--end_fsync=1",
        ],
    );
    let (r, list) = replicas(&a, "r");
    assert_ne!(list[0].1, "healthy", "{r}");
    assert_eq!(list[1].1, "healthy", "{r}");
    // Region 2 written with no flush: recorded as missed before the first
    // write there is sent, and still dirty when the daemon is killed.
    fio(
        &uri,
        &[
            "--randseed=3",
            "--do_verify=1",
            "--size=4m",
            "--offset=128m",
        ],
    );
    a.d.kill9();
    disk.resize("512m");
    a.d.start_again();
    // The next front end copies regions 2 and 3 from n1 (36 MiB of data),
    // not the volume (68 MiB of data: region 0 too).
    let r = wait_until("n0 rebuilt", std::time::Duration::from_secs(120), || {
        let (r, list) = replicas(&a, "r");
        (list[0].1 == "healthy").then_some(r)
    });
    assert_eq!(r["generation"], 2, "{r}");
    let sent = r["replicas"][0]["last_rebuild"]["sent_bytes"].as_u64();
    eprintln!(
        "this node's replica rebuilt after a restart: {sent:?} bytes copied, 36 MiB of data in the regions it missed ({})",
        r["replicas"][0]["last_rebuild"]
    );
    assert!(
        sent.is_some_and(|s| (32 << 20..=44 << 20).contains(&s)),
        "regions 2 and 3 hold 36 MiB of data, the volume 68 MiB: {r}"
    );
    fio(&uri, &["--randseed=1", "--verify_only"]);
    fio(&uri, &["--randseed=2", "--verify_only", "--offset=192m"]);
    fio(
        &uri,
        &[
            "--randseed=3",
            "--verify_only",
            "--size=4m",
            "--offset=128m",
        ],
    );
    let ends = alike(&a, &[&b]);
    fio(
        &ends[0],
        &["--randseed=2", "--verify_only", "--offset=192m"],
    );
    fio(
        &ends[0],
        &[
            "--randseed=3",
            "--verify_only",
            "--size=4m",
            "--offset=128m",
        ],
    );
}

/// Volume `name` on `a` with replicas on `others` (none: unreplicated).
fn create_with(a: &Node, name: &str, others: &[&str]) {
    let n = (others.len() + 1).to_string();
    let mut args = vec!["volume", "create", name, "--size", "16MiB"];
    if !others.is_empty() {
        args.extend(["--replicas", &n]);
        for o in others {
            args.extend(["--replica-node", o]);
        }
    }
    a.d.ok(&args);
}

/// The counter a block of `data` holds (its first 8 bytes), checked to
/// fill the whole block.
fn counter(data: &[u8]) -> u64 {
    let k = u64::from_le_bytes(data[..8].try_into().unwrap());
    assert!(
        data.chunks(8).all(|c| c == k.to_le_bytes()),
        "a torn block: {:?}",
        &data[..32]
    );
    k
}

#[test]
fn a_group_snapshot_of_replicated_volumes_holds_one_instant_on_every_replica() {
    need("qemu-img", "qemu-utils");
    let net = Net::new(3);
    let certs = Certs::new();
    let n = nodes(&net, &certs);
    let (a, b, c) = (&n[0], &n[1], &n[2]);
    // r on two nodes, q on three, u unreplicated: all three written in
    // order by one writer; d on two nodes, detached, written before.
    create_with(a, "r", &["n1"]);
    create_with(a, "q", &["n1", "n2"]);
    create_with(a, "u", &[]);
    create_with(a, "d", &["n2"]);
    let uri = a.d.attach(&["volume", "attach", "d"]);
    qemu_io(&uri, &["write -P 0x5d 0 1M", "flush"]);
    a.d.ok(&["volume", "detach", "d"]);
    let uris: Vec<String> = ["r", "q", "u"]
        .iter()
        .map(|v| a.d.attach(&["volume", "attach", v]))
        .collect();
    // Round k writes k into the first block of r, then of q, then of u,
    // each once the one before was acknowledged: at any one instant r >=
    // q >= u >= r - 1.
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let done = std::sync::Arc::new(AtomicU64::new(0));
    let writer = {
        let (uris, stop, done) = (uris.clone(), stop.clone(), done.clone());
        std::thread::spawn(move || {
            let mut c: Vec<NbdClient> = uris.iter().map(|u| NbdClient::connect(u)).collect();
            let mut k = 0u64;
            while !stop.load(SeqCst) {
                k += 1;
                let block: Vec<u8> = k.to_le_bytes().repeat(512);
                for x in c.iter_mut() {
                    x.write(0, &block);
                }
                done.store(k, SeqCst);
            }
            k
        })
    };
    // Each group snapshot once the writer has completed a few more rounds
    // since the last (so snapshots and writes interleave however busy the
    // machine), with writes in flight as it is taken.
    const ROUNDS_BETWEEN: u64 = 5;
    let groups: Vec<String> = (1..=6).map(|i| format!("g{i}")).collect();
    let mut last = 0;
    for g in &groups {
        let t0 = std::time::Instant::now();
        while done.load(SeqCst) < last + ROUNDS_BETWEEN {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(120),
                "the writer is stuck at round {}",
                done.load(SeqCst)
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        last = done.load(SeqCst);
        a.d.ok(&["snapshot", "create-group", g, "r", "q", "u", "d"]);
    }
    stop.store(true, SeqCst);
    let rounds = writer.join().unwrap();
    assert!(
        rounds >= 6 * ROUNDS_BETWEEN,
        "the writer ran {rounds} rounds"
    );
    for (v, list) in [("r", vec!["healthy", "healthy"]), ("q", vec!["healthy"; 3])] {
        let (r, states) = replicas(a, v);
        assert!(states.iter().map(|(_, s)| s.as_str()).eq(list), "{v}: {r}");
    }
    let read = |n: &Node, v: &str, g: &str| -> u64 {
        let uri = n.d.attach(&["snapshot", "attach", v, g]);
        let k = counter(&NbdClient::connect(&uri).read(0, 4096));
        n.d.ok(&["snapshot", "detach", v, g]);
        k
    };
    let mut seen = Vec::new();
    for g in &groups {
        let members = a.d.json(&["snapshot", "get-group", g]);
        assert_eq!(
            members["snapshots"].as_array().map(Vec::len),
            Some(4),
            "{members}"
        );
        // Every replica's member holds what this node's does...
        let r = read(a, "r", g);
        assert_eq!(read(b, "r", g), r, "{g}: r on n1");
        let q = read(a, "q", g);
        assert_eq!(
            (read(b, "q", g), read(c, "q", g)),
            (q, q),
            "{g}: q on n1, n2"
        );
        let u = read(a, "u", g);
        // ...and all of them one instant of the writer's rounds.
        assert!(r >= q && q >= u && u + 1 >= r, "{g}: r {r}, q {q}, u {u}");
        seen.push(r);
        let here = a.d.attach(&["snapshot", "attach", "d", g]);
        let there = c.d.attach(&["snapshot", "attach", "d", g]);
        let cmp = qemu_img_compare(&here, &there);
        assert!(cmp.status.success(), "{g}: d differs on n2: {cmp:?}");
        a.d.ok(&["snapshot", "detach", "d", g]);
        c.d.ok(&["snapshot", "detach", "d", g]);
    }
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    // Every replica's member carries the group's label: on another node,
    // `snapshot get-group` lists the members that node holds.
    for (node, want) in [(b, ["q", "r"]), (c, ["d", "q"])] {
        let m = node.d.json(&["snapshot", "get-group", "g2"]);
        let vols: Vec<&str> = m["snapshots"]
            .as_array()
            .unwrap_or_else(|| panic!("{}: {m}", node.name))
            .iter()
            .map(|s| s["volume"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(vols, want, "{}: {m}", node.name);
    }
    // Deleting the group deletes its members on every replica.
    a.d.ok(&["snapshot", "delete-group", "g1"]);
    for (node, v) in [(b, "r"), (b, "q"), (c, "q"), (c, "d")] {
        let list = node.d.ok(&["snapshot", "list", v]);
        assert!(!list.contains("g1"), "{v} on {}: {list}", node.name);
        assert!(list.contains("g2"), "{v} on {}: {list}", node.name);
    }
}

#[test]
fn a_front_end_killed_between_its_snapshot_and_the_replicas_has_them_take_it_at_restart() {
    need("qemu-img", "qemu-utils");
    let net = Net::new(2);
    let certs = Certs::new();
    let mut n = nodes(&net, &certs).into_iter();
    let (mut a, b) = (n.next().unwrap(), n.next().unwrap());
    create_on_two(&a, "16MiB");
    let uri = a.d.attach(&["volume", "attach", "r"]);
    qemu_io(&uri, &["write -P 0x31 0 2M", "flush"]);
    // Killed (abort) once this node's snapshot is made, with the front
    // end holding the volume's writes, before the other replica's.
    let args = a.d.extra();
    let mut crashing: Vec<&str> = args.iter().map(String::as_str).collect();
    crashing.extend(["--test-crash-at", "snapshot-after-local"]);
    a.d.kill9();
    a.d.set_extra(&crashing);
    a.d.start_again();
    let uri = a.d.attach(&["volume", "attach", "r"]);
    qemu_io(&uri, &["write -P 0x32 1M 2M", "flush"]);
    assert!(!a
        .d
        .lamina(&["snapshot", "create", "r", "s1"])
        .status
        .success());
    assert!(
        a.d.wait_exit(std::time::Duration::from_secs(30)).is_some(),
        "the daemon did not stop at its crash point"
    );
    a.d.kill9(); // reaped
    assert!(!b.d.ok(&["snapshot", "list", "r"]).contains("s1"));
    // At restart the interrupted snapshot is finished: n1 takes it, and
    // it holds what n0's does.
    let plain: Vec<&str> = args.iter().map(String::as_str).collect();
    a.d.set_extra(&plain);
    a.d.start_again();
    let op = a.d.json(&["operation", "list", "--volume", "r"]);
    assert!(
        op.to_string().contains("create-snapshot"),
        "no snapshot operation recorded: {op}"
    );
    let (r, list) = replicas(&a, "r");
    assert_eq!(list, states(&[("n0", "healthy"), ("n1", "healthy")]), "{r}");
    let here = a.d.attach(&["snapshot", "attach", "r", "s1"]);
    let there = b.d.attach(&["snapshot", "attach", "r", "s1"]);
    let cmp = qemu_img_compare(&here, &there);
    assert!(cmp.status.success(), "s1 differs on n1: {cmp:?}");
    let mut c = NbdClient::connect(&there);
    assert!(c.read(1 << 20, 2 << 20).iter().all(|&x| x == 0x32));
    assert!(c.read(0, 1 << 20).iter().all(|&x| x == 0x31));
}

/// fio writing 4 KiB blocks at random over 8 MiB of `uri` from 48 MiB on,
/// with no flush, in the background.
fn writing(uri: &str) -> std::process::Child {
    background(
        uri,
        &[
            "--name=writing",
            "--rw=randwrite",
            "--size=8m",
            "--offset=48m",
        ],
    )
}

#[test]
fn a_front_end_killed_as_a_rebuild_ends_comes_back_with_the_replica_equal_healthy_or_not() {
    need("fio", "fio");
    need("qemu-img", "qemu-utils");
    let net = Net::new(2);
    let certs = Certs::new();
    let mut n = nodes(&net, &certs).into_iter();
    let (mut a, b) = (n.next().unwrap(), n.next().unwrap());
    create_on_two(&a, "64MiB");
    let uri = a.d.attach(&["volume", "attach", "r"]);
    fio(&uri, &["--randseed=1", "--do_verify=1", "--end_fsync=1"]);
    let plain = a.d.extra();
    // Killed (abort) in the last round's quiesced step: before n1 is
    // recorded healthy, then between that record and its promotion.
    for (i, point) in ["rebuild-before-healthy", "rebuild-before-promote"]
        .into_iter()
        .enumerate()
    {
        let seed = format!("--randseed={}", i + 2);
        // n1 away while 8 MiB are written, and flushed.
        b.host.cut();
        fio(
            &uri,
            &[
                &seed,
                "--do_verify=1",
                "--size=8m",
                "--offset=32m",
                "--end_fsync=1",
            ],
        );
        assert_eq!(replicas(&a, "r").1[1].1, "faulted");
        let mut crashing: Vec<&str> = plain.iter().map(String::as_str).collect();
        crashing.extend(["--test-crash-at", point]);
        a.d.kill9();
        a.d.set_extra(&crashing);
        a.d.start_again();
        // Writes going on through its last round; the link back.
        let mut load = writing(&uri);
        b.host.restore();
        assert!(
            a.d.wait_exit(std::time::Duration::from_secs(90)).is_some(),
            "the daemon did not stop at {point}"
        );
        let _ = load.kill();
        let _ = load.wait();
        a.d.kill9(); // reaped
        assert!(
            a.d.log().contains(&format!("crashing at {point}")),
            "it stopped elsewhere: {}",
            a.d.log_tail()
        );
        let healthy = point == "rebuild-before-promote";
        let plain: Vec<&str> = plain.iter().map(String::as_str).collect();
        a.d.set_extra(&plain);
        a.d.start_again();
        // Recorded healthy, it is served as such at once (made alike where
        // the writes no flush covered went); else it is rebuilt again.
        let (r, list) = replicas(&a, "r");
        assert_eq!(list[1].1 == "healthy", healthy, "{point}: {r}");
        wait_until(
            &format!("n1 healthy after {point}"),
            std::time::Duration::from_secs(120),
            || (replicas(&a, "r").1[1].1 == "healthy").then_some(()),
        );
        fio(&uri, &[&seed, "--verify_only", "--size=8m", "--offset=32m"]);
    }
    fio(&uri, &["--randseed=1", "--verify_only", "--size=32m"]);
    let ends = alike(&a, &[&b]);
    fio(
        &ends[1],
        &["--randseed=3", "--verify_only", "--size=8m", "--offset=32m"],
    );
    fio(&ends[1], &["--randseed=1", "--verify_only", "--size=32m"]);
}

/// The names of the volumes on `n`, and of the volumes its snapshots are
/// of (deleted ones' too), as its API lists them.
fn held(n: &Node) -> (Vec<String>, Vec<String>) {
    let names = |v: Value, key: &str| -> Vec<String> {
        v.as_array()
            .unwrap_or_else(|| panic!("not a list: {v}"))
            .iter()
            .map(|x| x[key].as_str().unwrap_or_default().to_string())
            .collect()
    };
    (
        names(n.d.json(&["volume", "list"]), "name"),
        names(n.d.json(&["snapshot", "list"]), "volume"),
    )
}

/// Whether `n` holds volume `name` or a snapshot of one of that name.
fn holds(n: &Node, name: &str) -> bool {
    let (volumes, snapshots) = held(n);
    volumes.iter().chain(&snapshots).any(|v| v == name)
}

#[test]
fn deleting_a_replicated_volume_or_removing_a_replica_deletes_its_volume_on_its_node() {
    let net = Net::new(3);
    let certs = Certs::new();
    let mut n = nodes(&net, &certs).into_iter();
    let (a, b, mut c) = (n.next().unwrap(), n.next().unwrap(), n.next().unwrap());
    let create = |name: &str, all: [&Node; 3]| {
        all[0].d.ok(&[
            "volume",
            "create",
            name,
            "--size",
            "64MiB",
            "--replicas",
            "3",
        ]);
        all[0].d.ok(&["snapshot", "create", name, "s1"]);
        for n in all {
            assert!(holds(n, name), "{} lacks {name}", n.name);
        }
    };

    // A node down: the delete fails naming it, and nothing is deleted,
    // on any node.
    create("r", [&a, &b, &c]);
    c.d.kill9();
    let e = a.d.err(&["volume", "delete", "r"]);
    assert!(
        e.contains("node n2 cannot delete its replica") && e.contains("nothing was deleted"),
        "{e}"
    );
    assert_eq!(
        replicas(&a, "r").1,
        states(&[("n0", "healthy"), ("n1", "healthy"), ("n2", "healthy")])
    );
    assert!(holds(&a, "r") && holds(&b, "r"));
    c.d.start_again();
    assert!(holds(&c, "r"));
    // Back: deleted on every node, with its snapshots.
    a.d.ok(&["volume", "delete", "r", "--with-snapshots"]);
    for n in [&a, &b, &c] {
        assert!(!holds(n, "r"), "{} still holds r: {:?}", n.name, held(n));
    }
    assert!(a
        .d
        .ok(&["volume", "delete", "r"])
        .contains("nothing to delete"));

    // A replica removed: its volume goes on its node, the others stay.
    create("q", [&a, &b, &c]);
    let out = a.d.ok(&["replica", "remove", "q", "n1"]);
    assert!(out.contains("and its volume there"), "{out}");
    assert!(!holds(&b, "q"), "n1 still holds q: {:?}", held(&b));
    assert!(holds(&a, "q") && holds(&c, "q"));
    // Its node down: the removal goes on, and says what stays there.
    c.d.kill9();
    let r = a.d.json(&["replica", "remove", "q", "n2"]);
    assert_eq!(r["existed"], true, "{r}");
    let left = r["left"]
        .as_str()
        .unwrap_or_else(|| panic!("nothing left: {r}"));
    assert!(
        left.contains("its volume q on node n2 stays") && left.contains("lamina volume delete q"),
        "{left}"
    );
    assert_eq!(replicas(&a, "q").1, states(&[("n0", "healthy")]));
    assert!(a
        .d
        .log()
        .contains("a removed replica's volume stays on its node"));
    c.d.start_again();
    assert!(holds(&c, "q"), "left on n2, as answered");
    a.d.ok(&["volume", "delete", "q", "--with-snapshots"]);
    assert!(!holds(&a, "q"));
    // A new volume of that name and size is not given the one left there
    // (an earlier volume's data) as its replica: refused, saying what to
    // delete, and nothing is made.
    let e = a.d.err(&[
        "volume",
        "create",
        "q",
        "--size",
        "64MiB",
        "--replicas",
        "2",
        "--replica-node",
        "n2",
    ]);
    assert!(
        e.contains("node n2 could not make its replica")
            && e.contains("left from an earlier volume")
            && e.contains("lamina volume delete q"),
        "{e}"
    );
    assert!(!holds(&a, "q"), "{:?}", held(&a));
    // Deleted there by hand, as the answer said.
    c.d.ok(&["volume", "delete", "q", "--with-snapshots"]);
    assert!(!holds(&c, "q"));

    // A node's own volume is never deleted by a peer: its replica deleted
    // by hand and a volume of its own made under the name, the front end's
    // delete leaves it.
    a.d.ok(&[
        "volume",
        "create",
        "x",
        "--size",
        "64MiB",
        "--replicas",
        "2",
        "--replica-node",
        "n1",
    ]);
    b.d.ok(&["volume", "delete", "x"]);
    b.d.ok(&["volume", "create", "x", "--size", "32MiB"]);
    a.d.ok(&["volume", "delete", "x"]);
    assert!(!holds(&a, "x"));
    let own = b.d.json(&["volume", "get", "x"]);
    assert_eq!(own["size"], 32 << 20, "{own}");
}
