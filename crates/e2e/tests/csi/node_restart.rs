//! The real `lamina csi` binary killed with SIGKILL while a volume is
//! staged and published: the next one, on the same state directory, finds
//! what the first did, serves the volume's data, and unpublishes and
//! unstages it leaving nothing behind (no mount, loop device, nbdfuse or
//! export). The in-process version of this is crates/csi/tests/node.rs
//! (through nbdfuse); here the daemon serves the volume as a file, and a
//! staged volume grows while published.

use crate::support::Csi;
use lamina_csi::proto::volume_capability::{
    access_mode::Mode, AccessMode, AccessType, MountVolume,
};
use lamina_csi::proto::*;
use lamina_test_support::{need, run};
use std::path::Path;
use std::process::Command;

fn mount_cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

fn mounted(path: &Path) -> bool {
    let p = path.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(p.as_str()))
}

impl Csi {
    fn stage(&self, id: &str, staging: &Path) {
        self.stage_as(id, staging, &mount_cap())
    }

    fn stage_as(&self, id: &str, staging: &Path, cap: &VolumeCapability) {
        std::fs::create_dir_all(staging).unwrap();
        let req = NodeStageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        };
        self.block_on(self.node().node_stage_volume(req))
            .unwrap_or_else(|e| panic!("stage: {e}"));
    }

    fn publish(&self, id: &str, staging: &Path, target: &Path) {
        self.publish_as(id, staging, target, &mount_cap())
    }

    fn publish_as(&self, id: &str, staging: &Path, target: &Path, cap: &VolumeCapability) {
        let req = NodePublishVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        };
        self.block_on(self.node().node_publish_volume(req))
            .unwrap_or_else(|e| panic!("publish: {e}"));
    }

    /// What the kubelet does after a driver restart, then at the pod's end:
    /// stage and publish again (they must find the work done), unpublish
    /// and unstage; no mount is left.
    fn repeat_then_tear_down(&self, id: &str, staging: &Path, target: &Path) {
        self.stage(id, staging);
        self.publish(id, staging, target);
        self.unpublish_and_unstage(id, staging, target);
        assert!(!mounted(target) && !mounted(staging), "a mount is left");
    }

    fn unpublish_and_unstage(&self, id: &str, staging: &Path, target: &Path) {
        let req = NodeUnpublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.display().to_string(),
        };
        self.block_on(self.node().node_unpublish_volume(req))
            .unwrap_or_else(|e| panic!("unpublish: {e}"));
        let req = NodeUnstageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
        };
        self.block_on(self.node().node_unstage_volume(req))
            .unwrap_or_else(|e| panic!("unstage: {e}"));
    }
}

#[test]
fn a_killed_driver_is_followed_by_one_that_finishes_its_work() {
    need("nbdfuse", "nbdfuse");
    need("mkfs.ext4", "e2fsprogs");
    need("losetup", "mount");
    let mut csi = Csi::start();
    let req = CreateVolumeRequest {
        name: "pvc-killed".into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 64 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_cap()],
        ..Default::default()
    };
    let id = csi
        .block_on(csi.controller().create_volume(req))
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let staging = csi.daemon.data().join("stage");
    let target = csi.daemon.data().join("pods/p/mount");
    std::fs::create_dir_all(&staging).unwrap();
    csi.stage(&id, &staging);
    csi.publish(&id, &staging, &target);
    std::fs::write(target.join("f"), b"written before the kill").unwrap();
    run(Command::new("sync").arg("-f").arg(target.join("f"))).ok();

    csi.kill_and_restart_driver();

    // The pod's mount outlives the driver; the new one repeats the calls
    // the kubelet repeats, and they find the work done.
    assert_eq!(
        std::fs::read(target.join("f")).unwrap(),
        b"written before the kill"
    );
    csi.repeat_then_tear_down(&id, &staging, &target);
    let loops = run(Command::new("losetup").arg("-a")).ok();
    let data = csi.daemon.data().display().to_string();
    assert!(!loops.contains(&data), "a loop device is left: {loops}");
    let v = csi.daemon.json(&["volume", "get", "pvc-killed"]);
    assert!(v["export"].is_null(), "the export is left: {v}");
    let procs = run(Command::new("pgrep").args(["-af", "nbdfuse"])).stdout;
    assert!(!procs.contains(&data), "an nbdfuse is left: {procs}");

    // And the data is the volume's: staged again, the file is there.
    csi.stage(&id, &staging);
    csi.publish(&id, &staging, &target);
    assert_eq!(
        std::fs::read(target.join("f")).unwrap(),
        b"written before the kill"
    );
    csi.unpublish_and_unstage(&id, &staging, &target);
}

fn create(csi: &Csi, name: &str, size: u64, cap: VolumeCapability) -> String {
    let req = CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: size as i64,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap],
        ..Default::default()
    };
    csi.block_on(csi.controller().create_volume(req))
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id
}

/// ControllerExpandVolume, then NodeExpandVolume at `path`, as the
/// resizer and the kubelet call them on a volume in use.
fn grow(csi: &Csi, id: &str, cap: &VolumeCapability, path: &Path, size: u64) -> i64 {
    let req = ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: size as i64,
            limit_bytes: 0,
        }),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    };
    let r = csi
        .block_on(csi.controller().controller_expand_volume(req))
        .unwrap_or_else(|e| panic!("ControllerExpandVolume of a volume in use: {e}"))
        .into_inner();
    assert!(r.node_expansion_required, "the node grows its loop device");
    let req = NodeExpandVolumeRequest {
        volume_id: id.into(),
        volume_path: path.display().to_string(),
        capacity_range: Some(CapacityRange {
            required_bytes: size as i64,
            limit_bytes: 0,
        }),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    };
    csi.block_on(csi.node().node_expand_volume(req))
        .unwrap_or_else(|e| panic!("NodeExpandVolume: {e}"))
        .into_inner()
        .capacity_bytes
}

#[test]
fn volumes_staged_on_the_daemons_file_grow_while_published_filesystem_and_block() {
    need("mkfs.xfs", "xfsprogs");
    need("losetup", "mount");
    let csi = Csi::start();
    let data = csi.daemon.data().to_path_buf();

    // xfs, published: grown while a file on it stays open for writing.
    let cap = VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "xfs".into(),
            ..Default::default()
        })),
    };
    let id = create(&csi, "pvc-grow", 320 << 20, cap.clone());
    let staging = data.join("stage-fs");
    let target = data.join("pods/p/fs");
    csi.stage_as(&id, &staging, &cap);
    csi.publish_as(&id, &staging, &target, &cap);
    let v = csi.daemon.json(&["volume", "get", "pvc-grow"]);
    let file = v["export"]["file"]
        .as_str()
        .unwrap_or_else(|| panic!("staged on the daemon's file: {v}"))
        .to_string();
    let loops = run(Command::new("losetup").args(["-j", &file])).ok();
    assert!(!loops.trim().is_empty(), "a loop device over {file}");
    let open = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(target.join("open"))
        .unwrap();
    let blocks = |p: &Path| -> u64 {
        run(Command::new("stat").args(["-f", "-c", "%b"]).arg(p))
            .ok()
            .trim()
            .parse()
            .unwrap()
    };
    let before = blocks(&target);
    assert_eq!(grow(&csi, &id, &cap, &target, 640 << 20), 640 << 20);
    assert!(blocks(&target) > before * 3 / 2, "xfs grew while published");
    use std::io::Write;
    (&open).write_all(&vec![5u8; 400 << 20]).unwrap();
    open.sync_all().unwrap();
    drop(open);
    csi.unpublish_and_unstage(&id, &staging, &target);
    let v = csi.daemon.json(&["volume", "get", "pvc-grow"]);
    assert!(v["export"].is_null(), "unstage detaches the file: {v}");

    // Block, published: the device grows.
    let bcap = VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(Default::default())),
    };
    let id = create(&csi, "pvc-grow-block", 16 << 20, bcap.clone());
    let staging = data.join("stage-block");
    let target = data.join("pods/p/dev");
    csi.stage_as(&id, &staging, &bcap);
    csi.publish_as(&id, &staging, &target, &bcap);
    let size = |p: &Path| -> u64 {
        run(Command::new("blockdev").arg("--getsize64").arg(p))
            .ok()
            .trim()
            .parse()
            .unwrap()
    };
    assert_eq!(size(&target), 16 << 20);
    assert_eq!(grow(&csi, &id, &bcap, &target, 48 << 20), 48 << 20);
    assert_eq!(size(&target), 48 << 20, "the published device grew");
    csi.unpublish_and_unstage(&id, &staging, &target);
}

/// The source device of the mount at `path`, as this namespace sees it.
fn mount_source(path: &Path) -> Option<String> {
    let p = path.display().to_string();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(p.as_str()))?;
    let (_, after) = line.split_once(" - ")?;
    after.split(' ').nth(1).map(str::to_string)
}

/// A loop device's file as the kernel names it, and the device's sequence
/// number (`diskseq`: new at every setup, so a number reused by another
/// loop device is told apart), while it is set up.
fn loop_state(dev: &str) -> Option<(String, u64)> {
    let sys = Path::new("/sys/block").join(dev.trim_start_matches("/dev/"));
    let file = std::fs::read_to_string(sys.join("loop/backing_file")).ok()?;
    let seq = std::fs::read_to_string(sys.join("diskseq")).ok()?;
    Some((file.trim_end().to_string(), seq.trim().parse().ok()?))
}

#[test]
fn a_driver_whose_mount_namespace_ended_still_detaches_its_loop_device() {
    need("mkfs.ext4", "e2fsprogs");
    need("losetup", "mount");
    need("unshare", "util-linux");
    let mut csi = Csi::start_in_mount_namespace();
    let id = create(&csi, "pvc-ns", 64 << 20, mount_cap());
    let data = csi.daemon.data().to_path_buf();
    let staging = data.join("stage");
    let target = data.join("pods/p/mount");
    csi.stage(&id, &staging);
    csi.publish(&id, &staging, &target);
    let v = csi.daemon.json(&["volume", "get", "pvc-ns"]);
    let file = v["export"]["file"]
        .as_str()
        .unwrap_or_else(|| panic!("staged on the daemon's file: {v}"))
        .to_string();
    let dev = mount_source(&staging).expect("the staging mount reached this namespace");
    let (named, seq) = loop_state(&dev).unwrap_or_else(|| panic!("{dev} is set up"));
    assert_eq!(named, file, "{dev} over the daemon's file");
    std::fs::write(target.join("f"), b"written before the kill").unwrap();
    run(Command::new("sync").arg("-f").arg(target.join("f"))).ok();

    // The driver's namespace ends with it, and with it the copy of the
    // file's mount that the loop device was set up through: the kernel no
    // longer names the device's file by that path. The device, and the
    // pod's mounts on it, live on.
    csi.kill_and_restart_driver();
    let (named, again) = loop_state(&dev).unwrap_or_else(|| panic!("{dev} is still set up"));
    assert_eq!(again, seq);
    assert_ne!(
        named, file,
        "the premise: the path is gone with the namespace"
    );
    assert_eq!(
        std::fs::read(target.join("f")).unwrap(),
        b"written before the kill"
    );

    // The kubelet repeats its calls, then unpublishes and unstages: the
    // loop device goes with the staging, as when it was named by the path.
    csi.repeat_then_tear_down(&id, &staging, &target);
    let left = loop_state(&dev).filter(|(_, s)| *s == seq);
    assert!(left.is_none(), "{dev} is left set up over {left:?}");
    let v = csi.daemon.json(&["volume", "get", "pvc-ns"]);
    assert!(v["export"].is_null(), "the export is left: {v}");
}
