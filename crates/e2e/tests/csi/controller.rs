//! What csi-sanity does not check about the CSI controller, against a real
//! daemon and the real `lamina csi`: restores and clones hold their source's
//! data (read back through NBD), linked and full; retried calls answer the
//! same volume; a name reused with another source is refused; deleting
//! with dependents (a deleted PVC's snapshot restores after its name is
//! reused); stale ids after a name is reused.

use crate::support::Csi;
use lamina_csi::proto::volume_capability::{
    access_mode::Mode, AccessMode, AccessType, MountVolume,
};
use lamina_csi::proto::volume_content_source::{SnapshotSource, Type as Source, VolumeSource};
use lamina_csi::proto::*;
use lamina_test_support::{need, qemu_io};
use tonic::Code;

const MIB: i64 = 1 << 20;

fn mount_cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

fn create(name: &str, size: i64, source: Option<Source>, full: bool) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: size,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_cap()],
        parameters: if full {
            [("clone".to_string(), "full".to_string())].into()
        } else {
            Default::default()
        },
        volume_content_source: source.map(|t| VolumeContentSource { r#type: Some(t) }),
        ..Default::default()
    }
}

fn from_snapshot(id: &str) -> Option<Source> {
    Some(Source::Snapshot(SnapshotSource {
        snapshot_id: id.into(),
    }))
}

fn from_volume(id: &str) -> Option<Source> {
    Some(Source::Volume(VolumeSource {
        volume_id: id.into(),
    }))
}

impl Csi {
    #[track_caller]
    fn create_ok(&self, req: CreateVolumeRequest) -> Volume {
        let mut c = self.controller();
        self.block_on(c.create_volume(req))
            .unwrap_or_else(|e| panic!("CreateVolume: {e}"))
            .into_inner()
            .volume
            .unwrap()
    }

    #[track_caller]
    fn create_err(&self, req: CreateVolumeRequest) -> tonic::Status {
        let mut c = self.controller();
        self.block_on(c.create_volume(req))
            .expect_err("CreateVolume should fail")
    }

    #[track_caller]
    fn snapshot_ok(&self, name: &str, volume_id: &str) -> Snapshot {
        let mut c = self.controller();
        let req = CreateSnapshotRequest {
            name: name.into(),
            source_volume_id: volume_id.into(),
            ..Default::default()
        };
        self.block_on(c.create_snapshot(req))
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap()
    }

    /// The NBD URI of a volume (by its Lamina name), attached.
    #[track_caller]
    fn uri(&self, name: &str) -> String {
        self.daemon.attach(&["volume", "attach", name])
    }

    #[track_caller]
    fn detach(&self, name: &str) {
        self.daemon.ok(&["volume", "detach", name]);
    }
}

/// The Lamina name in a CSI volume id (`NAME@ID`).
fn name_of(volume_id: &str) -> &str {
    volume_id.rsplit_once('@').unwrap().0
}

#[test]
fn restores_and_clones_hold_their_sources_data_linked_and_full() {
    need("qemu-io", "qemu-utils");
    let csi = Csi::start();
    let src = csi.create_ok(create("pvc-src", 8 * MIB, None, false));
    assert_eq!(src.capacity_bytes, 8 * MIB);
    let uri = csi.uri(name_of(&src.volume_id));
    qemu_io(&uri, &["write -P 0x11 0 1M", "write -P 0x22 4M 1M"]);
    let snap = csi.snapshot_ok("snapshot-1", &src.volume_id);
    assert!(snap.ready_to_use && snap.creation_time.is_some());
    assert_eq!(snap.size_bytes, 8 * MIB);
    assert_eq!(snap.source_volume_id, src.volume_id);
    // After the snapshot: what a clone of the volume sees, not a restore.
    qemu_io(&uri, &["write -P 0x33 0 1M"]);
    csi.detach(name_of(&src.volume_id));

    let cases = [
        (
            "pvc-restore-linked",
            from_snapshot(&snap.snapshot_id),
            false,
            0x11,
        ),
        (
            "pvc-restore-full",
            from_snapshot(&snap.snapshot_id),
            true,
            0x11,
        ),
        ("pvc-clone-linked", from_volume(&src.volume_id), false, 0x33),
        ("pvc-clone-full", from_volume(&src.volume_id), true, 0x33),
    ];
    for (name, source, full, first) in cases {
        // Larger than the source: grown after the clone.
        let v = csi.create_ok(create(name, 16 * MIB, source.clone(), full));
        assert_eq!(v.capacity_bytes, 16 * MIB, "{name}");
        assert_eq!(
            v.content_source.as_ref().and_then(|s| s.r#type.clone()),
            source,
            "{name}"
        );
        // A retry answers the same volume.
        let again = csi.create_ok(create(name, 16 * MIB, source.clone(), full));
        assert_eq!(again.volume_id, v.volume_id, "{name}");
        // The same name from something else is refused.
        let e = csi.create_err(create(name, 16 * MIB, None, false));
        assert_eq!(e.code(), Code::AlreadyExists, "{name}: {e}");
        let uri = csi.uri(name_of(&v.volume_id));
        qemu_io(
            &uri,
            &[
                &format!("read -P {first:#x} 0 1M"),
                "read -P 0x22 4M 1M",
                "read -P 0 8M 8M",
            ],
        );
        csi.detach(name_of(&v.volume_id));
    }

    // A restore smaller than its source is out of range; a missing source is not found.
    let e = csi.create_err(create(
        "pvc-small",
        4 * MIB,
        from_snapshot(&snap.snapshot_id),
        false,
    ));
    assert_eq!(e.code(), Code::OutOfRange, "{e}");
    let e = csi.create_err(create(
        "pvc-x",
        8 * MIB,
        from_snapshot("pvc-src/nothing@999"),
        false,
    ));
    assert_eq!(e.code(), Code::NotFound, "{e}");
    let e = csi.create_err(create(
        "pvc-x",
        8 * MIB,
        from_volume("pvc-nothing@999"),
        false,
    ));
    assert_eq!(e.code(), Code::NotFound, "{e}");
    // Nothing was made by the failed calls.
    let names = csi.daemon.json(&["volume", "list"]);
    assert!(
        !names.to_string().contains("pvc-small") && !names.to_string().contains("pvc-x"),
        "{names}"
    );
}

#[test]
fn deleting_with_dependents_and_ids_that_outlive_their_volume() {
    need("qemu-io", "qemu-utils");
    let csi = Csi::start();
    let mut c = csi.controller();
    let src = csi.create_ok(create("pvc-a", 4 * MIB, None, false));
    let uri = csi.uri("pvc-a");
    qemu_io(&uri, &["write -P 0x5a 0 64k"]);
    csi.detach("pvc-a");
    let snap = csi.snapshot_ok("snap-a", &src.volume_id);
    let restored = csi.create_ok(create(
        "pvc-b",
        4 * MIB,
        from_snapshot(&snap.snapshot_id),
        false,
    ));

    // DeleteVolume succeeds with a snapshot and a linked restore of it
    // present (a retry too); both keep working.
    let del = |id: &str| DeleteVolumeRequest {
        volume_id: id.into(),
        ..Default::default()
    };
    csi.block_on(c.delete_volume(del(&src.volume_id))).unwrap();
    csi.block_on(c.delete_volume(del(&src.volume_id))).unwrap();
    let get = |id: &str| GetSnapshotRequest {
        snapshot_id: id.into(),
        ..Default::default()
    };
    let kept = csi
        .block_on(c.get_snapshot(get(&snap.snapshot_id)))
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(
        kept.source_volume_id, src.volume_id,
        "listed under the old id"
    );
    let uri = csi.uri("pvc-b");
    qemu_io(&uri, &["read -P 0x5a 0 64k"]);
    csi.detach("pvc-b");

    // Same name again: a new id; the old one names nothing.
    let again = csi.create_ok(create("pvc-a", 4 * MIB, None, false));
    assert_ne!(again.volume_id, src.volume_id);
    let get_volume = |id: &str| ControllerGetVolumeRequest {
        volume_id: id.into(),
    };
    assert_eq!(
        csi.block_on(c.controller_get_volume(get_volume(&src.volume_id)))
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    // The deleted volume's snapshot still restores, though a new volume has
    // its name (a full copy this time), and reads its data back.
    let full = csi.create_ok(create(
        "pvc-c",
        4 * MIB,
        from_snapshot(&snap.snapshot_id),
        true,
    ));
    let uri = csi.uri(name_of(&full.volume_id));
    qemu_io(&uri, &["read -P 0x5a 0 64k", "read -P 0 64k 1M"]);
    csi.detach(name_of(&full.volume_id));

    // The snapshot goes (a retry too); the restores made from it keep their data.
    let del_snap = DeleteSnapshotRequest {
        snapshot_id: snap.snapshot_id.clone(),
        ..Default::default()
    };
    csi.block_on(c.delete_snapshot(del_snap.clone())).unwrap();
    csi.block_on(c.delete_snapshot(del_snap)).unwrap();
    assert_eq!(
        csi.block_on(c.get_snapshot(get(&snap.snapshot_id)))
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    let uri = csi.uri("pvc-b");
    qemu_io(&uri, &["read -P 0x5a 0 64k"]);
    csi.detach("pvc-b");

    csi.block_on(c.delete_volume(del(&src.volume_id))).unwrap();
    let got = csi
        .block_on(c.controller_get_volume(get_volume(&again.volume_id)))
        .unwrap()
        .into_inner();
    assert_eq!(
        got.volume.unwrap().volume_id,
        again.volume_id,
        "the stale delete left the new volume alone"
    );
    // A snapshot of the old volume's id cannot be taken.
    let req = CreateSnapshotRequest {
        name: "snap-z".into(),
        source_volume_id: src.volume_id.clone(),
        ..Default::default()
    };
    assert_eq!(
        csi.block_on(c.create_snapshot(req)).unwrap_err().code(),
        Code::NotFound
    );
    csi.block_on(c.delete_volume(del(&restored.volume_id)))
        .unwrap();
    csi.block_on(c.delete_volume(del(&full.volume_id))).unwrap();
    let left = csi.daemon.json(&["snapshot", "list"]);
    assert_eq!(left.as_array().unwrap().len(), 0, "{left}");
}

#[test]
fn snapshot_pages_stay_valid_while_snapshots_come_and_go() {
    let csi = Csi::start();
    let mut c = csi.controller();
    let v = csi.create_ok(create("pvc-p", 4 * MIB, None, false));
    let ids: Vec<String> = (0..5)
        .map(|i| csi.snapshot_ok(&format!("s{i}"), &v.volume_id).snapshot_id)
        .collect();
    let page = |token: &str| {
        let req = ListSnapshotsRequest {
            max_entries: 2,
            starting_token: token.into(),
            ..Default::default()
        };
        let r = csi
            .block_on(csi.controller().list_snapshots(req))
            .unwrap()
            .into_inner();
        (
            r.entries
                .into_iter()
                .map(|e| e.snapshot.unwrap().snapshot_id)
                .collect::<Vec<_>>(),
            r.next_token,
        )
    };
    let (first, t1) = page("");
    assert_eq!(first, ids[0..2]);
    // The last entry of the page is deleted and a new snapshot made: the
    // token still works, nothing is listed twice or skipped.
    let del = DeleteSnapshotRequest {
        snapshot_id: ids[1].clone(),
        ..Default::default()
    };
    csi.block_on(c.delete_snapshot(del)).unwrap();
    let late = csi.snapshot_ok("s5", &v.volume_id).snapshot_id;
    let (second, t2) = page(&t1);
    assert_eq!(second, ids[2..4]);
    let (third, t3) = page(&t2);
    assert_eq!(third, vec![ids[4].clone(), late]);
    assert_eq!(t3, "");
    let req = ListSnapshotsRequest {
        starting_token: "not-a-token".into(),
        ..Default::default()
    };
    assert_eq!(
        csi.block_on(c.list_snapshots(req)).unwrap_err().code(),
        Code::Aborted
    );
}

#[test]
fn garbage_on_the_socket_does_not_hurt_the_driver() {
    use std::io::{Read, Write};
    let csi = Csi::start();
    for junk in [
        &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x04\x08\x00\x00\x00\x00\x00\xff\xff"[..],
        &[0xffu8; 4096][..],
    ] {
        let mut s = std::os::unix::net::UnixStream::connect(&csi.sock).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let _ = s.write_all(junk);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut sink = vec![];
        let _ = s.read_to_end(&mut sink);
    }
    // Still serving, and a malformed request is a clear error.
    let mut c = csi.controller();
    let e = csi
        .block_on(c.create_volume(CreateVolumeRequest::default()))
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    let v = csi.create_ok(create("pvc-after", 4 * MIB, None, false));
    assert!(v.volume_id.starts_with("pvc-after@"));
}

/// A restore is made at its source's size and then grown: a call cut off
/// between the two leaves it smaller than asked, and the CO's retry must
/// finish it, not answer ALREADY_EXISTS. A plain volume of the wrong size
/// is another matter: refused.
#[test]
fn a_retry_finishes_a_restore_cut_off_before_it_was_grown() {
    let csi = Csi::start();
    let src = csi.create_ok(create("pvc-s", 4 * MIB, None, false));
    let snap = csi.snapshot_ok("snap-s", &src.volume_id);
    // What the cut-off call left: the linked restore, at the source's size.
    csi.daemon.ok(&[
        "clone",
        "create",
        "pvc-cut",
        "--from-snapshot",
        "pvc-s/snap-s",
    ]);
    let v = csi.create_ok(create(
        "pvc-cut",
        8 * MIB,
        from_snapshot(&snap.snapshot_id),
        false,
    ));
    assert_eq!(v.capacity_bytes, 8 * MIB);
    assert_eq!(
        csi.daemon.json(&["volume", "get", "pvc-cut"])["size"],
        8 * MIB
    );

    csi.daemon
        .ok(&["volume", "create", "pvc-plain", "--size", "4M"]);
    let e = csi.create_err(create("pvc-plain", 8 * MIB, None, false));
    assert_eq!(e.code(), Code::AlreadyExists, "{e}");
    assert_eq!(
        csi.daemon.json(&["volume", "get", "pvc-plain"])["size"],
        4 * MIB
    );
}

/// mkfs.xfs refuses a device under 300 MiB, and Kubernetes' claims are
/// often smaller (its own storage tests claim 1Mi): a volume to be mounted
/// as xfs is made at 300 MiB at least, a retry answers that same volume,
/// and a limit below the floor is refused with nothing made.
#[test]
fn an_xfs_volume_is_made_as_large_as_mkfs_xfs_needs() {
    const FLOOR: i64 = 300 * MIB;
    let csi = Csi::start();
    let xfs = |name: &str, required: i64, limit: i64| {
        let mut r = create(name, required, None, false);
        r.capacity_range = Some(CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        });
        if let Some(AccessType::Mount(m)) = &mut r.volume_capabilities[0].access_type {
            m.fs_type = "xfs".into();
        }
        r
    };
    let v = csi.create_ok(xfs("pvc-xfs", MIB, 0));
    assert_eq!(v.capacity_bytes, FLOOR);
    let again = csi.create_ok(xfs("pvc-xfs", MIB, 0));
    assert_eq!(
        (again.volume_id, again.capacity_bytes),
        (v.volume_id, FLOOR)
    );
    // Above the floor, the size asked; ext4 and block have no floor.
    assert_eq!(
        csi.create_ok(xfs("pvc-xfs-big", FLOOR + MIB, 0))
            .capacity_bytes,
        FLOOR + MIB
    );
    assert_eq!(
        csi.create_ok(create("pvc-ext4", MIB, None, false))
            .capacity_bytes,
        MIB
    );

    let e = csi.create_err(xfs("pvc-xfs-small", MIB, 8 * MIB));
    assert_eq!(e.code(), Code::OutOfRange, "{e}");
    assert!(e.message().contains("mkfs.xfs"), "{e}");
    let mut c = csi.controller();
    let listed = csi
        .block_on(c.list_volumes(ListVolumesRequest::default()))
        .unwrap()
        .into_inner();
    let names: Vec<_> = listed
        .entries
        .iter()
        .map(|e| name_of(&e.volume.as_ref().unwrap().volume_id).to_string())
        .collect();
    assert!(!names.iter().any(|n| n.contains("small")), "{names:?}");
    assert_eq!(names.len(), 3, "{names:?}");
}
