//! Clones across nodes: each `lamina serve` in a network namespace of its
//! own (the harness's `netns`), the target pulling a snapshot from the
//! source over Lamina's transfer protocol (mutual TLS), with the link slowed
//! by tbf, cut, or a node killed mid-copy. Data is checked end to end with
//! qemu-img compare through both nodes' NBD exports (or against the
//! generator that filled the source, when the source is gone).
//!
//! Progress is waited on through the operation (`done_bytes`, `state`),
//! never on a sleep; a copy that must still be running while something is
//! checked is frozen by cutting the source's link first.

use crate::LAMINA;
use lamina_test_support::netns::{Host, Net};
use lamina_test_support::*;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

pub(crate) const MIB: u64 = 1 << 20;
/// The ports every node listens on (each node has its own namespace).
const API_PORT: u16 = 7400;
const TRANSFER_PORT: u16 = 7401;
/// What a slowed link carries each way: a copy of 100+ MiB takes a while.
pub(crate) const SLOW: u64 = 8_000_000;
/// A generous bound on one copy (slowed, on 2 busy cores); it times nothing.
const COPY_LIMIT: Duration = Duration::from_secs(900);
/// The source's data: nbdkit's sparse-random plugin, the same bytes for the
/// same arguments (random data in runs, holes between them).
const SEED: &str = "seed=1204";
const PERCENT: &str = "percent=50";

/// A CA and the certificates issued by it, in a temporary directory.
pub(crate) struct Certs {
    dir: tempfile::TempDir,
}

impl Certs {
    pub(crate) fn new() -> Certs {
        let dir = tempfile::tempdir().unwrap();
        run(LAMINA
            .cmd()
            .args(["certs", "create-ca"])
            .arg(dir.path().join("ca")))
        .ok();
        Certs { dir }
    }

    /// The directory holding `node`'s ca.crt, tls.crt and tls.key.
    pub(crate) fn issue(&self, node: &str) -> PathBuf {
        let out = self.dir.path().join(node);
        run(LAMINA
            .cmd()
            .args(["certs", "issue", "--ca"])
            .arg(self.dir.path().join("ca"))
            .args(["--node", node])
            .arg(&out))
        .ok();
        for f in ["ca.crt", "tls.crt", "tls.key"] {
            assert!(out.join(f).is_file(), "certs issue wrote no {f}");
        }
        out
    }
}

/// `lamina serve`'s addresses in `host`, and its transfer credentials.
fn serve_args(host: &Host, tls: &std::path::Path) -> Vec<String> {
    vec![
        "--listen".into(),
        format!("{}:{API_PORT}", host.addr()),
        "--transfer-listen".into(),
        format!("{}:{TRANSFER_PORT}", host.addr()),
        "--transfer-tls".into(),
        tls.to_str().unwrap().into(),
    ]
}

/// A node: a daemon in a host, with its name and transfer credentials.
pub(crate) struct Node<'a> {
    pub(crate) name: String,
    pub(crate) host: &'a Host,
    pub(crate) d: Daemon,
}

impl<'a> Node<'a> {
    /// `lamina serve` in `host` as node `name` with a certificate of
    /// `certs`, retrying an interrupted transfer for `window` seconds.
    pub(crate) fn start(host: &'a Host, name: &str, certs: &Certs, window: u32) -> Node<'a> {
        Node::start_with(host, name, certs.issue(name), window)
    }

    /// The same with the credentials in `tls`.
    fn start_with(host: &'a Host, name: &str, tls: PathBuf, window: u32) -> Node<'a> {
        Node::start_args(host, name, tls, window, &[])
    }

    /// The same with more arguments for `lamina serve`.
    pub(crate) fn start_args(
        host: &'a Host,
        name: &str,
        tls: PathBuf,
        window: u32,
        extra: &[&str],
    ) -> Node<'a> {
        let mut args = serve_args(host, &tls);
        args.extend(["--transfer-retry-window".to_string(), window.to_string()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let d = host.serve(&LAMINA, &args);
        Node {
            name: name.into(),
            host,
            d,
        }
    }

    /// `lamina serve` in `host` as node `name` with credentials `tls`, on
    /// data directory `data` (one copied from another node's, say).
    pub(crate) fn start_on(host: &'a Host, name: &str, tls: PathBuf, data: PathBuf) -> Node<'a> {
        let d = LAMINA
            .serve()
            .prefix(&host.prefix())
            .data_dir(data)
            .args(serve_args(host, &tls))
            .start()
            .unwrap_or_else(|e| panic!("lamina serve as {name} did not start: {e}"));
        Node {
            name: name.into(),
            host,
            d,
        }
    }

    pub(crate) fn transfer(&self) -> String {
        format!("{}:{TRANSFER_PORT}", self.host.addr())
    }

    /// Start pulling `src/gold` from `from` into a new volume `name`; the
    /// operation's id.
    fn pull(&self, name: &str, from: &Node) -> String {
        self.start_pull(name, from, Some(&from.transfer()))
    }

    /// [`Node::pull`], `from` named alone: its address comes from this
    /// daemon's node list.
    fn pull_by_name(&self, name: &str, from: &Node) -> String {
        self.start_pull(name, from, None)
    }

    fn start_pull(&self, name: &str, from: &Node, address: Option<&str>) -> String {
        let mut args = vec![
            "clone",
            "create",
            name,
            "--from-snapshot",
            "src/gold",
            "--from-node",
            &from.name,
            "--no-wait",
        ];
        if let Some(a) = address {
            args.extend(["--from-address", a]);
        }
        let j = self.d.json(&args);
        let id = j["operation"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("clone create printed no operation id: {j}"))
            .to_string();
        let op = self.op(&id);
        assert_eq!(op["kind"], "remote-clone", "{op}");
        id
    }

    pub(crate) fn op(&self, id: &str) -> Value {
        self.d.json(&["operation", "get", id])
    }

    /// Wait until the operation has done at least `bytes` (it must not
    /// fail or finish first); the operation then.
    pub(crate) fn done_at_least(&self, id: &str, bytes: u64) -> Value {
        wait_until(&format!("{bytes} bytes done"), COPY_LIMIT, || {
            let op = self.op(id);
            assert_eq!(op["state"], "running", "before {bytes} bytes: {op}");
            (op["done_bytes"].as_u64().unwrap() >= bytes).then_some(op)
        })
    }

    /// Wait until the operation has ended; the operation then.
    pub(crate) fn ended(&self, id: &str) -> Value {
        wait_until("the clone's end", COPY_LIMIT, || {
            let op = self.op(id);
            (op["state"] != "running").then_some(op)
        })
    }

    /// Wait for success; the operation then.
    pub(crate) fn succeeded(&self, id: &str) -> Value {
        let op = self.ended(id);
        assert_eq!(op["state"], "succeeded", "{op}\n{}", self.d.log());
        assert_eq!(op["done_bytes"], op["total_bytes"], "{op}");
        op
    }

    /// The volume `name` does not exist here (a failed clone leaves none).
    pub(crate) fn has_no_volume(&self, name: &str) {
        let o = self.d.lamina(&["volume", "get", name]);
        assert!(!o.status.success(), "{name} is still there: {}", o.stdout);
        assert!(!self.d.ok(&["volume", "list"]).contains(name));
    }
}

/// Fill a new volume `src` of `size` on `n` with the generator's data and
/// take the snapshot `src/gold`; the bytes it maps.
fn source(n: &Node, size: u64) -> u64 {
    need("nbdcopy", "libnbd-bin");
    need("nbdkit", "nbdkit");
    n.d.ok(&["volume", "create", "src", "--size", &size.to_string()]);
    let uri = n.d.attach(&["volume", "attach", "src"]);
    run(Command::new("nbdcopy")
        .args(["--destination-is-zero", "--", "["])
        .args(generator(size))
        .args(["]", uri.as_str()]))
    .ok();
    n.d.ok(&["snapshot", "create", "src", "gold"]);
    let s = n.d.json(&["snapshot", "get", "src", "gold"]);
    let allocated = s["allocated_bytes"].as_u64().unwrap();
    // Data, and holes.
    assert!(allocated > 0 && allocated < size, "{s}");
    allocated
}

/// The nbdkit command that makes the source's data.
pub(crate) fn generator(size: u64) -> Vec<String> {
    [
        "nbdkit",
        "sparse-random",
        &format!("size={size}"),
        SEED,
        PERCENT,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The clone `name` on `target` holds the source snapshot's data, read
/// through both nodes' exports.
fn same_data(source: &Node, target: &Node, name: &str) {
    let a = source.d.attach(&["snapshot", "attach", "src", "gold"]);
    let b = target.d.attach(&["volume", "attach", name]);
    let cmp = qemu_img_compare(&a, &b);
    assert!(
        cmp.status.success(),
        "{name} differs from src/gold: {cmp:?}"
    );
}

/// The clone `name` on `target` holds the generator's data (the source's
/// snapshot may be gone).
fn generator_data(target: &Node, name: &str, size: u64) {
    let b = target.d.attach(&["volume", "attach", name]);
    let cmp = run(Command::new("nbdkit")
        .args(["-U", "-"])
        .args(&generator(size)[1..])
        .args([
            "--run",
            "qemu-img compare -f raw -F raw \"$uri\" \"$CLONE\"",
        ])
        .env("CLONE", &b));
    assert!(
        cmp.status.success(),
        "{name} differs from its source: {cmp:?}"
    );
}

pub(crate) fn error_starts_with_reason(op: &Value, reason: &str) {
    assert_eq!(op["reason"], reason, "{op}");
    let e = op["error"].as_str().unwrap_or_default();
    assert!(
        e.starts_with(reason) || e.starts_with(&reason.replace('-', " ")),
        "the error should open with its reason {reason}: {op}"
    );
}

#[test]
fn a_clone_crosses_nodes_sparse_and_unusable_until_done() {
    let net = Net::new(3);
    let certs = Certs::new();
    let src = Node::start(net.host(0), "n0", &certs, 60);
    let dst = Node::start(net.host(1), "n1", &certs, 60);
    let third = Node::start(net.host(2), "n2", &certs, 60);
    let size = 256 * MIB;
    let allocated = source(&src, size);

    // Slowed, so that it is still copying while it is looked at.
    src.host.shape(SLOW);
    let rx = dst.host.rx_bytes();
    let id = dst.pull("c1", &src);
    let v = dst.d.json(&["volume", "get", "c1"]);
    assert_eq!(v["clone_state"], "copying", "{v}");
    assert_eq!(v["operation"], id.as_str(), "{v}");
    let refused = dst.d.lamina(&["volume", "attach", "c1"]);
    // Still copying after the refusal: it was refused while copying.
    assert_eq!(dst.op(&id)["state"], "running");
    assert!(
        !refused.status.success(),
        "attach of a copying clone: {refused:?}"
    );
    assert!(refused.stderr.contains("c1"), "{refused:?}");

    let op = dst.succeeded(&id);
    let wire = dst.host.rx_bytes() - rx;
    // Everything the target received, TCP, TLS and the protocol included:
    // at most 5% over the data, and a little for the handshakes.
    assert!(
        wire <= allocated + allocated / 20 + MIB,
        "{wire} bytes on the link for {allocated} allocated: {op}"
    );
    // The generator's data is random: it cannot have come in fewer bytes.
    assert!(wire >= allocated, "{wire} < {allocated}: {op}");
    let counted = op["wire_bytes"].as_u64().expect("wire_bytes");
    assert!(counted > 0 && counted <= wire, "{counted} vs {wire}: {op}");
    assert_eq!(op["resent_bytes"], 0, "{op}");
    let v = dst.d.json(&["volume", "get", "c1"]);
    assert_ne!(v["clone_state"], "copying", "{v}");
    assert!(v["operation"].is_null(), "{v}");
    same_data(&src, &dst, "c1");

    // A second clone of the same snapshot, to the third node, at full speed,
    // naming the source alone: the third node has it in its node list.
    src.host.unshape();
    third.d.ok(&["node", "add", &src.name, &src.transfer()]);
    let id = third.pull_by_name("c2", &src);
    third.succeeded(&id);
    same_data(&src, &third, "c2");
}

/// The source's `lamina_transfer_paced_seconds_total`.
fn paced_seconds(n: &Node) -> f64 {
    let m = n.d.ok(&["metrics"]);
    prometheus_sample(&m, "lamina_transfer_paced_seconds_total", "")
        .unwrap_or_else(|| panic!("no lamina_transfer_paced_seconds_total in\n{m}"))
}

#[test]
fn a_source_with_volume_io_paces_its_transfers_and_an_idle_one_does_not() {
    need("qemu-img", "qemu-utils");
    let net = Net::new(2);
    let certs = Certs::new();
    let src = Node::start_args(
        net.host(0),
        "n0",
        certs.issue("n0"),
        60,
        &["--transfer-busy-rate", "16M"],
    );
    let dst = Node::start(net.host(1), "n1", &certs, 60);
    // ~59 MiB allocated: far more than the frames queued and the socket's
    // buffers hold, so the stream keeps asking the pace to the end.
    let allocated = source(&src, 192 * MIB);
    // The link is shaped so that no copy ends within the pace's first
    // windows however fast the machine (at 64 MB/s: over a second).
    src.host.shape(64_000_000);

    // The fill's writes are behind a quiet spell longer than the pace's
    // (200 ms): they do not count, and the copy is not held back.
    std::thread::sleep(Duration::from_millis(500));
    let id = dst.pull("idle", &src);
    dst.succeeded(&id);
    assert_eq!(paced_seconds(&src), 0.0, "{}", src.d.log());

    // 4 KiB writes into the live volume, one after another, all through the
    // next copy: seen at the pace's next look, it holds the stream to 16 MiB/s.
    // (Attached already by `source`: attaching again gives its export.)
    let uri = src.d.attach(&["volume", "attach", "src"]);
    let mut writer = Command::new("qemu-img")
        .args([
            "bench",
            "-w",
            "-f",
            "raw",
            "-c",
            "100000000",
            "-d",
            "1",
            "-s",
            "4096",
            "-S",
            "4096",
            "-o",
            "0",
        ])
        .arg(&uri)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("qemu-img bench");
    let writes = || {
        let m = src.d.ok(&["metrics"]);
        prometheus_sample(&m, "lamina_volume_io_total", "volume=\"src\",op=\"write\"")
            .unwrap_or(0.0)
    };
    let before = writes();
    wait_until("the writer's first writes", COPY_LIMIT, || {
        (writes() > before).then_some(())
    });
    let id = dst.pull("busy", &src);
    let op = dst.succeeded(&id);
    let _ = writer.kill();
    let _ = writer.wait();
    let paced = paced_seconds(&src);
    assert!(
        paced > 0.0,
        "a copy of {allocated} bytes under writes was never held back: {op}"
    );
    same_data(&src, &dst, "busy");
    same_data(&src, &dst, "idle");
}

#[test]
fn seed_004_a_dead_source_fails_the_clone_and_a_new_clone_completes() {
    let net = Net::new(2);
    let certs = Certs::new();
    let mut src = Node::start(net.host(0), "n0", &certs, 5);
    let dst = Node::start(net.host(1), "n1", &certs, 5);
    let size = 256 * MIB;
    source(&src, size);
    src.host.shape(SLOW);
    let id = dst.pull("c", &src);
    dst.done_at_least(&id, 1);
    // Frozen mid-copy, then the source dies and stays down.
    src.host.cut();
    assert_eq!(dst.op(&id)["state"], "running");
    src.d.kill9();
    src.host.restore();

    let op = dst.ended(&id);
    assert_eq!(op["state"], "failed", "{op}");
    error_starts_with_reason(&op, "source-unreachable");
    dst.has_no_volume("c");

    src.d.start_again();
    src.host.unshape();
    let id = dst.pull("c", &src);
    dst.succeeded(&id);
    same_data(&src, &dst, "c");
}

#[test]
fn a_restarted_target_resumes_from_its_last_checkpoint() {
    let net = Net::new(2);
    let certs = Certs::new();
    let src = Node::start(net.host(0), "n0", &certs, 60);
    let mut dst = Node::start(net.host(1), "n1", &certs, 60);
    // ~192 MiB allocated: past the first checkpoint (every 64 MiB) with
    // plenty left.
    let size = 384 * MIB;
    source(&src, size);
    src.host.shape(SLOW);
    let id = dst.pull("c", &src);
    dst.done_at_least(&id, 72 * MIB);
    src.host.cut();
    let before = dst.op(&id);
    assert_eq!(before["state"], "running");
    let total = before["total_bytes"].as_u64().unwrap();
    assert!(total > 100 * MIB, "{before}");
    dst.d.kill9();
    src.host.restore();
    dst.d.start_again();

    let resumed = dst.op(&id);
    assert_eq!(resumed["kind"], "remote-clone", "{resumed}");
    let done = resumed["done_bytes"].as_u64().unwrap();
    assert!(done > 0, "resumed from zero: {resumed}");
    let op = dst.succeeded(&id);
    let resent = op["resent_bytes"].as_u64().expect("resent_bytes");
    assert!(resent > 0 && resent < total, "{op}");
    same_data(&src, &dst, "c");
}

#[test]
fn a_cut_link_restored_within_the_window_resumes() {
    let net = Net::new(2);
    let certs = Certs::new();
    let src = Node::start(net.host(0), "n0", &certs, 120);
    let dst = Node::start(net.host(1), "n1", &certs, 120);
    let size = 256 * MIB;
    source(&src, size);
    src.host.shape(SLOW);
    let id = dst.pull("c", &src);
    dst.done_at_least(&id, 8 * MIB);
    let log = dst.d.log().len();
    src.host.cut();
    // The link stays cut until the target has noticed (its log says it is
    // retrying the source), well within the window.
    wait_until(
        "the target noticing the cut",
        Duration::from_secs(90),
        || {
            let l = dst.d.log()[log..].to_lowercase();
            ["retry", "interrupt", "unreachable", "reconnect"]
                .iter()
                .any(|w| l.contains(w))
                .then_some(())
        },
    );
    assert_eq!(dst.op(&id)["state"], "running");
    src.host.restore();
    src.host.unshape();
    let op = dst.succeeded(&id);
    let resent = op["resent_bytes"].as_u64().expect("resent_bytes");
    assert!(resent < op["total_bytes"].as_u64().unwrap(), "{op}");
    same_data(&src, &dst, "c");
}

#[test]
fn a_peer_certified_by_another_ca_is_refused_and_logged() {
    let net = Net::new(3);
    let certs = Certs::new();
    let other = Certs::new();
    let src = Node::start(net.host(0), "n0", &certs, 5);
    // Named like a node of the cluster and trusting the cluster's CA (so it
    // accepts the source), its own certificate from another CA: the source
    // is the one to refuse.
    let tls = other.issue("n1");
    std::fs::copy(certs.dir.path().join("n0/ca.crt"), tls.join("ca.crt")).unwrap();
    let rogue = Node::start_with(net.host(1), "n1", tls, 5);
    let good = Node::start(net.host(2), "n2", &certs, 5);
    source(&src, 64 * MIB);

    // Refused at the first handshake, the request itself fails with the
    // reason, and its operation is recorded as failed with it.
    let err = rogue.d.err(&[
        "clone",
        "create",
        "c",
        "--from-snapshot",
        "src/gold",
        "--from-node",
        &src.name,
        "--from-address",
        &src.transfer(),
    ]);
    assert!(err.contains("refused"), "{err}");
    let ops = rogue.d.json(&["operation", "list", "--volume", "c"]);
    let op = &ops[0];
    assert_eq!(
        (&op["kind"], &op["state"]),
        (&"remote-clone".into(), &"failed".into()),
        "{ops}"
    );
    error_starts_with_reason(op, "refused");
    rogue.has_no_volume("c");
    let peer = net.host(1).addr().to_string();
    wait_until("the source logging the refusal", COMMAND_LIMIT, || {
        let log = src.d.log();
        let refusal = log.lines().any(|l| {
            let l = l.to_lowercase();
            l.contains(&peer)
                && ["refus", "reject", "denied", "unauthori", "certificate"]
                    .iter()
                    .any(|w| l.contains(w))
        });
        refusal.then_some(())
    });

    // The source itself is fine: a peer of its CA clones.
    let id = good.pull("c", &src);
    good.succeeded(&id);
    same_data(&src, &good, "c");
}

#[test]
fn deleting_the_source_snapshot_mid_copy_never_leaves_a_partial_clone() {
    let net = Net::new(2);
    let certs = Certs::new();
    let src = Node::start(net.host(0), "n0", &certs, 30);
    let dst = Node::start(net.host(1), "n1", &certs, 30);
    let size = 256 * MIB;
    source(&src, size);
    src.host.shape(SLOW);
    let id = dst.pull("c", &src);
    dst.done_at_least(&id, 1);
    // Frozen mid-copy while the snapshot is deleted.
    src.host.cut();
    let del = src.d.lamina(&["snapshot", "delete", "src", "gold"]);
    assert_eq!(dst.op(&id)["state"], "running");
    src.host.restore();
    src.host.unshape();

    let op = dst.ended(&id);
    if del.status.success() {
        // Deleted: the clone fails for it, or it completed from data the
        // source still held; never a completed clone with other data.
        if op["state"] == "succeeded" {
            generator_data(&dst, "c", size);
        } else {
            error_starts_with_reason(&op, "snapshot-missing");
            dst.has_no_volume("c");
        }
    } else {
        // Refused (a conflict, exit 5) naming the node reading it; the
        // clone goes on.
        assert_eq!(del.code(), Some(5), "{del:?}");
        assert!(del.stderr.contains(&dst.name), "{del:?}");
        assert_eq!(op["state"], "succeeded", "{op}");
        same_data(&src, &dst, "c");
    }
}
