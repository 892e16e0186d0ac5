//! The CSI group controller against the real daemon and driver: a group
//! snapshot of three volumes is one snapshot per volume, taken at one
//! instant (the engine's crash-consistency test, crates/engine/tests/
//! group.rs, shows the instant under a write load); each member restores
//! to its volume's data; the same name asks again answers the same group,
//! other volumes are refused; deleting is idempotent.

use crate::support::Csi;
use lamina_csi::proto::volume_capability::{
    access_mode::Mode, AccessMode, AccessType, BlockVolume,
};
use lamina_csi::proto::volume_content_source::{SnapshotSource, Type as Source};
use lamina_csi::proto::*;
use lamina_test_support::{need, qemu_io};
use tonic::Code;

fn block_cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

fn create(name: &str, source: Option<Source>) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 4 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![block_cap()],
        volume_content_source: source.map(|t| VolumeContentSource { r#type: Some(t) }),
        ..Default::default()
    }
}

fn name_of(volume_id: &str) -> &str {
    volume_id.rsplit_once('@').unwrap().0
}

#[test]
fn a_group_snapshot_is_one_snapshot_per_volume_and_each_restores_its_volume() {
    need("qemu-io", "qemu-utils");
    let csi = Csi::start();
    let mut c = csi.controller();
    let mut g = csi.group();
    let caps = csi
        .block_on(g.group_controller_get_capabilities(GroupControllerGetCapabilitiesRequest {}))
        .unwrap();
    assert_eq!(caps.into_inner().capabilities.len(), 1);

    let mut ids = vec![];
    for (i, name) in ["pvc-db", "pvc-log", "pvc-idx"].iter().enumerate() {
        let v = csi
            .block_on(c.create_volume(create(name, None)))
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        let uri = csi.daemon.attach(&["volume", "attach", name]);
        qemu_io(&uri, &[&format!("write -P {:#x} 0 64k", 0x10 + i)]);
        ids.push(v.volume_id);
    }
    let req = CreateVolumeGroupSnapshotRequest {
        name: "groupsnapshot-1".into(),
        source_volume_ids: ids.clone(),
        ..Default::default()
    };
    let group = csi
        .block_on(g.create_volume_group_snapshot(req.clone()))
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert!(group.ready_to_use && group.creation_time.is_some());
    assert_eq!(group.snapshots.len(), 3);
    let mut sources: Vec<_> = group
        .snapshots
        .iter()
        .map(|s| s.source_volume_id.clone())
        .collect();
    sources.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(sources, want);
    for s in &group.snapshots {
        assert_eq!(s.group_snapshot_id, group.group_snapshot_id);
        assert_eq!(
            s.creation_time, group.creation_time,
            "one instant for every member"
        );
    }
    // Written after the group: not in it.
    for (i, id) in ids.iter().enumerate() {
        let uri = csi.daemon.attach(&["volume", "attach", name_of(id)]);
        qemu_io(&uri, &[&format!("write -P {:#x} 0 64k", 0x20 + i)]);
        csi.daemon.ok(&["volume", "detach", name_of(id)]);
    }

    // Asked again: the same group. Other volumes under the name: refused;
    // a single snapshot of that name: refused.
    let again = csi
        .block_on(g.create_volume_group_snapshot(req.clone()))
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert_eq!(again.group_snapshot_id, group.group_snapshot_id);
    let mut other = req.clone();
    other.source_volume_ids.pop();
    let e = csi
        .block_on(g.create_volume_group_snapshot(other))
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e}");
    let single = CreateSnapshotRequest {
        name: "groupsnapshot-1".into(),
        source_volume_id: ids[0].clone(),
        ..Default::default()
    };
    assert_eq!(
        csi.block_on(c.create_snapshot(single)).unwrap_err().code(),
        Code::AlreadyExists
    );
    let missing = CreateVolumeGroupSnapshotRequest {
        name: "groupsnapshot-2".into(),
        source_volume_ids: vec![ids[0].clone(), "pvc-none@999".into()],
        ..Default::default()
    };
    assert_eq!(
        csi.block_on(g.create_volume_group_snapshot(missing))
            .unwrap_err()
            .code(),
        Code::NotFound
    );

    // Members are listed as snapshots and restore their own volume's data.
    let listed = csi
        .block_on(c.list_snapshots(ListSnapshotsRequest::default()))
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries.len(), 3, "{listed:?}");
    for s in &group.snapshots {
        let i = ids.iter().position(|id| *id == s.source_volume_id).unwrap();
        let name = format!("pvc-restore-{i}");
        let src = Source::Snapshot(SnapshotSource {
            snapshot_id: s.snapshot_id.clone(),
        });
        csi.block_on(c.create_volume(create(&name, Some(src))))
            .unwrap();
        let uri = csi.daemon.attach(&["volume", "attach", &name]);
        qemu_io(&uri, &[&format!("read -P {:#x} 0 64k", 0x10 + i)]);
        csi.daemon.ok(&["volume", "detach", &name]);
    }

    let get = GetVolumeGroupSnapshotRequest {
        group_snapshot_id: group.group_snapshot_id.clone(),
        ..Default::default()
    };
    let got = csi
        .block_on(g.get_volume_group_snapshot(get.clone()))
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert_eq!(got.snapshots.len(), 3);
    let del = DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: group.group_snapshot_id.clone(),
        snapshot_ids: group
            .snapshots
            .iter()
            .map(|s| s.snapshot_id.clone())
            .collect(),
        ..Default::default()
    };
    csi.block_on(g.delete_volume_group_snapshot(del.clone()))
        .unwrap();
    csi.block_on(g.delete_volume_group_snapshot(del)).unwrap();
    assert_eq!(
        csi.block_on(g.get_volume_group_snapshot(get))
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    let listed = csi
        .block_on(c.list_snapshots(ListSnapshotsRequest::default()))
        .unwrap()
        .into_inner();
    assert!(listed.entries.is_empty(), "{listed:?}");
    // The restores keep their data without the snapshots.
    let uri = csi.daemon.attach(&["volume", "attach", "pvc-restore-1"]);
    qemu_io(&uri, &["read -P 0x11 0 64k"]);
}
