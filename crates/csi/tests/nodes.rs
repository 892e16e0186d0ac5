//! The controller driving several nodes: two real daemons (the server
//! crate's `run`, in process, each with its own data directory) and a node
//! that does not exist, served in Mode::Controller over a unix socket with
//! a fixed node set. Volumes land where the topology requirements say,
//! every RPC reaches the node its id names, and a node that cannot be
//! reached answers UNAVAILABLE.

mod node_env;

use lamina_csi::proto::controller_client::ControllerClient;
use lamina_csi::proto::volume_content_source::{SnapshotSource, Type as Source, VolumeSource};
use lamina_csi::proto::*;
use lamina_csi::{NodeSource, StorageNode, TOPOLOGY_KEY};
use node_env::LIMIT;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use tonic::transport::Channel;
use tonic::Code;

const MIB: u64 = 1 << 20;
/// Node b's pool cap: small, so that it has less room than node a.
const B_CAP: u64 = 64 * MIB;

struct Cluster {
    _dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
    a: lamina_client::Client,
    b: lamina_client::Client,
    channel: Channel,
}

fn daemon(
    rt: &tokio::runtime::Runtime,
    data: &Path,
    cap: Option<u64>,
    transfer: lamina_server::TransferConfig,
) -> (lamina_client::Client, tokio::sync::oneshot::Sender<()>) {
    if let Some(max_bytes) = cap {
        let opts = lamina_engine::PoolOptions {
            max_bytes,
            background: false,
            ..Default::default()
        };
        lamina_engine::Pool::create_dir(data.join("pool"), opts)
            .expect("a capped pool")
            .close()
            .expect("closing the pool");
    }
    let (_, tx, client) = node_env::spawn_daemon_with(rt, data, transfer);
    (client, tx)
}

impl Cluster {
    /// Nodes a (default), b (capped) and, with `gone`, a node whose daemon
    /// does not exist; `b_transfer`: node b's transfer address, if any.
    fn start(b_transfer: Option<&str>, gone: bool) -> Cluster {
        Cluster::start_with(b_transfer, gone, [Default::default(), Default::default()])
    }

    /// [`Cluster::start`] with the daemons' transfer configurations (a, b).
    fn start_with(
        b_transfer: Option<&str>,
        gone: bool,
        transfers: [lamina_server::TransferConfig; 2],
    ) -> Cluster {
        Cluster::start_zoned(b_transfer, gone, transfers, [None, None])
    }

    /// [`Cluster::start_with`], nodes a and b in zones `zones`.
    fn start_zoned(
        b_transfer: Option<&str>,
        gone: bool,
        [ta, tb]: [lamina_server::TransferConfig; 2],
        [za, zb]: [Option<&str>; 2],
    ) -> Cluster {
        let (dir, rt) = node_env::temp_dir_and_runtime("lnodes");
        let (a, stop_a) = daemon(&rt, &dir.path().join("a"), None, ta);
        let (b, stop_b) = daemon(&rt, &dir.path().join("b"), Some(B_CAP), tb);
        let node =
            |client: &lamina_client::Client, t: Option<&str>, zone: Option<&str>| StorageNode {
                client: client.clone(),
                transfer_address: t.map(str::to_string),
                zone: zone.map(str::to_string),
            };
        let mut nodes: BTreeMap<String, StorageNode> = [
            ("a".to_string(), node(&a, Some("127.0.0.1:1"), za)),
            ("b".to_string(), node(&b, b_transfer, zb)),
        ]
        .into();
        if gone {
            let client = lamina_client::Client::unix(dir.path().join("gone/api.sock"));
            nodes.insert("gone".to_string(), node(&client, None, None));
        }
        let sock = dir.path().join("csi.sock");
        let opts = lamina_csi::Options {
            mode: lamina_csi::Mode::Controller,
            endpoint: format!("unix://{}", sock.display()),
            driver_name: lamina_csi::DRIVER_NAME.into(),
            node_id: "a".into(),
            storage_node: "a".into(),
            nodes: NodeSource::Fixed(nodes),
            state_dir: dir.path().join("state"),
            freeze_socket: None,
            client: a.clone(),
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        rt.spawn(lamina_csi::serve(opts, async {
            let _ = rx.await;
        }));
        let channel = node_env::connect(&rt, &sock);
        Cluster {
            _dir: dir,
            rt,
            stops: vec![stop_a, stop_b, tx],
            a,
            b,
            channel,
        }
    }

    fn ctl(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel.clone())
    }

    #[track_caller]
    fn call<T>(
        &self,
        f: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, tonic::Status> {
        match self
            .rt
            .block_on(async { tokio::time::timeout(LIMIT, f).await })
        {
            Ok(r) => r.map(|r| r.into_inner()),
            Err(_) => panic!("a call did not answer within {LIMIT:?}"),
        }
    }

    fn create(
        &self,
        name: &str,
        size: u64,
        topo: Option<TopologyRequirement>,
        source: Option<Source>,
    ) -> Result<Volume, tonic::Status> {
        let req = CreateVolumeRequest {
            accessibility_requirements: topo,
            volume_content_source: source.map(|t| VolumeContentSource { r#type: Some(t) }),
            ..node_env::create_request(name, size)
        };
        self.call(self.ctl().create_volume(req))
            .map(|r| r.volume.expect("a volume"))
    }

    fn capacity(&self, node: Option<&str>) -> i64 {
        let req = GetCapacityRequest {
            accessible_topology: node.map(topo),
            ..Default::default()
        };
        self.call(self.ctl().get_capacity(req))
            .expect("GetCapacity")
            .available_capacity
    }

    fn has(&self, client: &lamina_client::Client, volume: &str) -> bool {
        self.rt.block_on(client.get_volume(volume)).is_ok()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for tx in self.stops.drain(..) {
            let _ = tx.send(());
        }
    }
}

fn topo(node: &str) -> Topology {
    Topology {
        segments: [(TOPOLOGY_KEY.to_string(), node.to_string())].into(),
    }
}

fn req(requisite: &[&str], preferred: &[&str]) -> Option<TopologyRequirement> {
    Some(TopologyRequirement {
        requisite: requisite.iter().map(|n| topo(n)).collect(),
        preferred: preferred.iter().map(|n| topo(n)).collect(),
    })
}

fn node_of(v: &Volume) -> String {
    assert_eq!(v.accessible_topology.len(), 1, "{v:?}");
    v.accessible_topology[0].segments[TOPOLOGY_KEY].clone()
}

#[test]
fn volumes_land_on_the_node_the_requirements_name_and_rpcs_follow_their_ids() {
    let c = Cluster::start(None, false);

    // Requisite and preferred name b: the volume is b's.
    let vb = c
        .create("pvc-b", 16 * MIB, req(&["b"], &["b"]), None)
        .unwrap();
    assert_eq!(node_of(&vb), "b");
    assert!(vb.volume_id.starts_with("b:pvc-b@"), "{}", vb.volume_id);
    assert!(c.has(&c.b, "pvc-b") && !c.has(&c.a, "pvc-b"));
    // A retry finds it, whatever it asks.
    let again = c
        .create("pvc-b", 16 * MIB, req(&["a", "b"], &["a"]), None)
        .unwrap();
    assert_eq!(again.volume_id, vb.volume_id);

    // The first preferred node with room wins.
    let va = c
        .create("pvc-a", 16 * MIB, req(&["a", "b"], &["a", "b"]), None)
        .unwrap();
    assert_eq!(node_of(&va), "a");
    assert!(c.has(&c.a, "pvc-a") && !c.has(&c.b, "pvc-a"));
    // Nothing asked: the node with the most room (b holds 64 MiB at most).
    let vfree = c.create("pvc-free", 128 * MIB, None, None).unwrap();
    assert_eq!(node_of(&vfree), "a");
    // Only b allowed, and b has no room for all of it: volumes are thin,
    // so it goes there all the same.
    let big = c
        .create("pvc-big", 128 * MIB, req(&["b"], &[]), None)
        .unwrap();
    assert_eq!(node_of(&big), "b");
    assert!(!c.has(&c.a, "pvc-big") && c.has(&c.b, "pvc-big"));
    c.call(c.ctl().delete_volume(DeleteVolumeRequest {
        volume_id: big.volume_id.clone(),
        ..Default::default()
    }))
    .unwrap();
    assert!(!c.has(&c.b, "pvc-big"));
    // A node that is not in the set takes nothing.
    let none = c
        .create("pvc-x", MIB, req(&["nowhere"], &[]), None)
        .unwrap_err();
    assert_eq!(none.code(), Code::ResourceExhausted, "{none:?}");

    // Capacity per segment: b's capped pool; a node that is not known: 0;
    // no segment: every node.
    let cap_b = c.capacity(Some("b"));
    assert!(cap_b > 0 && cap_b as u64 <= B_CAP, "{cap_b}");
    let cap_a = c.capacity(Some("a"));
    assert!(cap_a > cap_b, "{cap_a} {cap_b}");
    assert_eq!(c.capacity(Some("nowhere")), 0);
    let total = c.capacity(None);
    assert!(total as u64 > B_CAP, "{total}");

    // A snapshot is taken on its volume's node.
    let snap = c
        .call(c.ctl().create_snapshot(CreateSnapshotRequest {
            source_volume_id: vb.volume_id.clone(),
            name: "snap-1".into(),
            ..Default::default()
        }))
        .unwrap()
        .snapshot
        .unwrap();
    assert!(
        snap.snapshot_id.starts_with("b:pvc-b/snap-1@"),
        "{}",
        snap.snapshot_id
    );
    assert_eq!(snap.source_volume_id, vb.volume_id);
    assert_eq!(c.rt.block_on(c.b.list_snapshots("pvc-b")).unwrap().len(), 1);

    // Restored where the requirements allow the snapshot's node: b, linked.
    let src = || {
        Some(Source::Snapshot(SnapshotSource {
            snapshot_id: snap.snapshot_id.clone(),
        }))
    };
    let r = c
        .create("pvc-restored", 16 * MIB, req(&["a", "b"], &["a"]), src())
        .unwrap();
    assert_eq!(node_of(&r), "b");
    assert!(c.has(&c.b, "pvc-restored") && !c.has(&c.a, "pvc-restored"));
    // Elsewhere, b's snapshot must be pulled: b has no transfer address.
    let e = c
        .create("pvc-there", 16 * MIB, req(&["a"], &[]), src())
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("transfer-address"), "{e:?}");
    // A volume is cloned on its own node only.
    let clone_src = Some(Source::Volume(VolumeSource {
        volume_id: vb.volume_id.clone(),
    }));
    let e = c
        .create("pvc-clone", 16 * MIB, req(&["a"], &[]), clone_src)
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(!c.has(&c.a, "pvc-there") && !c.has(&c.a, "pvc-clone"));

    // ListVolumes covers both nodes, with each volume's node.
    let listed = c
        .call(c.ctl().list_volumes(ListVolumesRequest::default()))
        .unwrap();
    let mut ids: Vec<(String, String)> = listed
        .entries
        .iter()
        .map(|e| {
            let v = e.volume.as_ref().unwrap();
            (v.volume_id.clone(), node_of(v))
        })
        .collect();
    ids.sort();
    assert_eq!(ids.len(), 4, "{ids:?}");
    for (id, node) in &ids {
        assert!(id.starts_with(&format!("{node}:")), "{id} {node}");
    }
    // Paged one at a time, the same volumes.
    let mut paged = vec![];
    let mut token = String::new();
    loop {
        let p = c
            .call(c.ctl().list_volumes(ListVolumesRequest {
                max_entries: 1,
                starting_token: token.clone(),
            }))
            .unwrap();
        paged.extend(
            p.entries
                .iter()
                .map(|e| e.volume.as_ref().unwrap().volume_id.clone()),
        );
        if p.next_token.is_empty() {
            break;
        }
        token = p.next_token;
    }
    paged.sort();
    assert_eq!(paged, ids.iter().map(|i| i.0.clone()).collect::<Vec<_>>());

    // An id without a node names the default node, a.
    let plain = va.volume_id.strip_prefix("a:").unwrap().to_string();
    let got = c
        .call(
            c.ctl()
                .controller_get_volume(ControllerGetVolumeRequest { volume_id: plain }),
        )
        .unwrap();
    assert_eq!(got.volume.unwrap().volume_id, va.volume_id);

    // Deletes reach the node the id names.
    c.call(c.ctl().delete_volume(DeleteVolumeRequest {
        volume_id: r.volume_id.clone(),
        ..Default::default()
    }))
    .unwrap();
    assert!(!c.has(&c.b, "pvc-restored"));
    c.call(c.ctl().delete_snapshot(DeleteSnapshotRequest {
        snapshot_id: snap.snapshot_id.clone(),
        ..Default::default()
    }))
    .unwrap();
    assert!(c
        .rt
        .block_on(c.b.list_snapshots("pvc-b"))
        .unwrap()
        .is_empty());
    c.call(c.ctl().delete_volume(DeleteVolumeRequest {
        volume_id: vb.volume_id.clone(),
        ..Default::default()
    }))
    .unwrap();
    assert!(!c.has(&c.b, "pvc-b") && c.has(&c.a, "pvc-a"));
}

#[test]
fn a_node_that_cannot_be_reached_or_is_unknown_is_unavailable() {
    let c = Cluster::start(Some("127.0.0.1:1"), true);
    for id in ["gone:pvc-1@1", "nowhere:pvc-1@1"] {
        let e = c
            .call(c.ctl().delete_volume(DeleteVolumeRequest {
                volume_id: id.into(),
                ..Default::default()
            }))
            .unwrap_err();
        assert_eq!(e.code(), Code::Unavailable, "{id}: {e:?}");
        let e = c
            .call(c.ctl().controller_get_volume(ControllerGetVolumeRequest {
                volume_id: id.into(),
            }))
            .unwrap_err();
        assert_eq!(e.code(), Code::Unavailable, "{id}: {e:?}");
        let e = c
            .call(c.ctl().create_snapshot(CreateSnapshotRequest {
                source_volume_id: id.into(),
                name: "s".into(),
                ..Default::default()
            }))
            .unwrap_err();
        assert_eq!(e.code(), Code::Unavailable, "{id}: {e:?}");
        let e = c
            .call(c.ctl().delete_snapshot(DeleteSnapshotRequest {
                snapshot_id: format!("{}/s@1", id.rsplit_once('@').unwrap().0),
                ..Default::default()
            }))
            .unwrap_err();
        assert_eq!(e.code(), Code::Unavailable, "{id}: {e:?}");
    }
    // Listing everything needs every node: one down is not an empty list.
    let e = c
        .call(c.ctl().list_volumes(ListVolumesRequest::default()))
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    // Placement passes over it, and so does capacity.
    let v = c.create("pvc-1", MIB, None, None).unwrap();
    assert_ne!(node_of(&v), "gone");
    let e = c
        .create("pvc-2", MIB, req(&["gone"], &[]), None)
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert_eq!(c.capacity(Some("gone")), 0);
    assert!(c.capacity(None) > 0);
}

/// A restore from a node whose transfer certificate comes from another CA:
/// the daemon answers `refused`, which no retry mends until an operator
/// issues the certificates from one CA: FAILED_PRECONDITION, nothing made.
#[test]
fn a_restore_from_a_node_that_refuses_this_one_is_a_failed_precondition() {
    let certs = tempfile::tempdir().unwrap();
    let dir = |n: &str| certs.path().join(n);
    lamina_transfer::certs::create_ca(&dir("ca-a")).unwrap();
    lamina_transfer::certs::create_ca(&dir("ca-b")).unwrap();
    lamina_transfer::certs::issue(&dir("ca-a"), "a", &dir("a")).unwrap();
    lamina_transfer::certs::issue(&dir("ca-b"), "b", &dir("b")).unwrap();
    let listen: std::net::SocketAddr = format!("127.0.0.1:{}", lamina_test_support::free_port())
        .parse()
        .unwrap();
    let transfer = |node: &str, listen| lamina_server::TransferConfig {
        listen,
        tls_dir: Some(dir(node)),
        ..Default::default()
    };
    let c = Cluster::start_with(
        Some(&listen.to_string()),
        false,
        [transfer("a", None), transfer("b", Some(listen))],
    );
    let vb = c.create("pvc-b", 16 * MIB, req(&["b"], &[]), None).unwrap();
    let snap = c
        .call(c.ctl().create_snapshot(CreateSnapshotRequest {
            source_volume_id: vb.volume_id.clone(),
            name: "snap-1".into(),
            ..Default::default()
        }))
        .unwrap()
        .snapshot
        .unwrap();
    let src = Some(Source::Snapshot(SnapshotSource {
        snapshot_id: snap.snapshot_id.clone(),
    }));
    let e = c
        .create("pvc-there", 16 * MIB, req(&["a"], &[]), src)
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().starts_with("refused"), "{e:?}");
    assert!(!c.has(&c.a, "pvc-there"));
}

/// Nodes a and b (in `zones`) with certificates of one CA, b's transfer
/// listener at the address returned: a's volumes can have replicas on b.
/// The certificates' directory lives as long as the first value.
fn one_ca(zones: [Option<&str>; 2]) -> (tempfile::TempDir, Cluster, std::net::SocketAddr) {
    let certs = tempfile::tempdir().unwrap();
    let dir = |n: &str| certs.path().join(n);
    lamina_transfer::certs::create_ca(&dir("ca")).unwrap();
    for n in ["a", "b"] {
        lamina_transfer::certs::issue(&dir("ca"), n, &dir(n)).unwrap();
    }
    let listen: std::net::SocketAddr = format!("127.0.0.1:{}", lamina_test_support::free_port())
        .parse()
        .unwrap();
    let transfer = |node: &str, listen| lamina_server::TransferConfig {
        listen,
        tls_dir: Some(dir(node)),
        ..Default::default()
    };
    let c = Cluster::start_zoned(
        Some(&listen.to_string()),
        false,
        [transfer("a", None), transfer("b", Some(listen))],
        zones,
    );
    (certs, c, listen)
}

#[test]
fn a_class_of_two_replicas_puts_the_second_on_another_node_and_says_what_a_third_lacks() {
    let (_certs, c, listen) = one_ca([None, None]);
    let create = |name: &str, replicas: &str, source: Option<Source>| {
        let req = CreateVolumeRequest {
            accessibility_requirements: req(&["a"], &[]),
            volume_content_source: source.map(|t| VolumeContentSource { r#type: Some(t) }),
            parameters: [("replicas".to_string(), replicas.to_string())].into(),
            ..node_env::create_request(name, 16 * MIB)
        };
        c.call(c.ctl().create_volume(req))
            .map(|r| r.volume.expect("a volume"))
    };
    let replicas_of = |name: &str| -> Vec<String> {
        let v = c.rt.block_on(c.a.get_volume(name)).unwrap();
        v.replication
            .map(|r| r.replicas.into_iter().map(|x| x.node).collect())
            .unwrap_or_default()
    };

    // a's daemon lists b at an old address (b came back elsewhere).
    let old = lamina_api::AddNode {
        name: "b".into(),
        address: "127.0.0.1:9".into(),
    };
    c.rt.block_on(c.a.add_node(&old)).unwrap();
    // Two replicas: the volume on a (where the topology puts it), its
    // second replica on b, which a's daemon learnt from the node set.
    let v = create("pvc-r", "2", None).unwrap();
    assert!(v.volume_id.starts_with("a:"), "{v:?}");
    assert_eq!(replicas_of("pvc-r"), ["a", "b"]);
    // Usable from every node: no accessible topology (a NodeStage on b
    // takes it over, and on a node holding no replica starts a front end
    // there), with the count the node plugin then records there.
    assert!(v.accessible_topology.is_empty(), "{v:?}");
    assert_eq!(
        v.volume_context,
        [(
            lamina_api::REPLICAS_WANTED_LABEL.to_string(),
            "2".to_string()
        )]
        .into()
    );
    let there = c.rt.block_on(c.b.get_volume("pvc-r")).unwrap();
    assert_eq!(
        there
            .labels
            .get(lamina_api::REPLICA_OF_LABEL)
            .map(String::as_str),
        Some("a")
    );
    let known = c.rt.block_on(c.a.list_nodes()).unwrap();
    assert!(
        known
            .iter()
            .any(|n| n.name == "b" && n.address == listen.to_string()),
        "{known:?}"
    );
    // Asked again: the same volume. b's replica is no volume of its own.
    assert_eq!(create("pvc-r", "2", None).unwrap().volume_id, v.volume_id);
    let listed = c
        .call(c.ctl().list_volumes(ListVolumesRequest::default()))
        .unwrap();
    let ids: Vec<&str> = listed
        .entries
        .iter()
        .filter_map(|e| e.volume.as_ref().map(|v| v.volume_id.as_str()))
        .collect();
    assert_eq!(ids, [v.volume_id.as_str()]);

    // A restore gets its second replica after it is made.
    let snap = c
        .call(c.ctl().create_snapshot(CreateSnapshotRequest {
            source_volume_id: v.volume_id.clone(),
            name: "snap-r".into(),
            ..Default::default()
        }))
        .unwrap()
        .snapshot
        .unwrap();
    let listed = c
        .call(c.ctl().list_snapshots(ListSnapshotsRequest::default()))
        .unwrap();
    assert_eq!(
        listed.entries.len(),
        1,
        "b's copy of the snapshot is a's: {listed:?}"
    );
    let src = Some(Source::Snapshot(SnapshotSource {
        snapshot_id: snap.snapshot_id.clone(),
    }));
    create("pvc-restored", "2", src).unwrap();
    assert_eq!(replicas_of("pvc-restored"), ["a", "b"]);
    // Each records the count its class asks for (Lamina's controllers keep
    // it).
    for v in ["pvc-r", "pvc-restored"] {
        let labels = c.rt.block_on(c.a.get_volume(v)).unwrap().labels;
        assert_eq!(
            labels
                .get(lamina_api::REPLICAS_WANTED_LABEL)
                .map(String::as_str),
            Some("2"),
            "{v}: {labels:?}"
        );
    }

    // Three replicas need a third node; no such number is taken.
    let e = create("pvc-3", "3", None).unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("1 found"), "{e:?}");
    assert!(!c.has(&c.a, "pvc-3") && !c.has(&c.b, "pvc-3"));
    for bad in ["0", "4", "two"] {
        let e = create("pvc-x", bad, None).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad}: {e:?}");
    }

    // Deleting the volume deletes its replica on b.
    c.call(c.ctl().delete_volume(DeleteVolumeRequest {
        volume_id: v.volume_id.clone(),
        ..Default::default()
    }))
    .unwrap();
    assert!(!c.has(&c.b, "pvc-r"));
}

#[test]
fn where_nodes_have_zones_a_replica_goes_to_another_zone_or_is_refused_unless_preferred() {
    // Both nodes in zone z1.
    let (_certs, c, _) = one_ca([Some("z1"), Some("z1")]);
    let create = |name: &str, params: &[(&str, &str)]| {
        let req = CreateVolumeRequest {
            accessibility_requirements: req(&["a"], &[]),
            parameters: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..node_env::create_request(name, 16 * MIB)
        };
        c.call(c.ctl().create_volume(req))
            .map(|r| r.volume.expect("a volume"))
    };
    let e = create("pvc-z", &[("replicas", "2")]).unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("zone z1") && e.message().contains("0 found"),
        "{e:?}"
    );
    assert!(!c.has(&c.a, "pvc-z") && !c.has(&c.b, "pvc-z"));
    // Allowed to share a zone: on b.
    create("pvc-z", &[("replicas", "2"), ("replicaZones", "preferred")]).unwrap();
    let v = c.rt.block_on(c.a.get_volume("pvc-z")).unwrap();
    let nodes: Vec<String> = v
        .replication
        .unwrap()
        .replicas
        .into_iter()
        .map(|x| x.node)
        .collect();
    assert_eq!(nodes, ["a", "b"]);
    let e = create("pvc-y", &[("replicas", "2"), ("replicaZones", "any")]).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
}
