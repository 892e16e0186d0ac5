//! The node service end to end: a real daemon, the driver on its socket,
//! and real nbdfuse, loop devices, ext4 and mounts (run as root; this
//! machine has FUSE and loop devices, not the nbd kernel module).

mod node_env;

use lamina_test_support::{need, qemu_io, run};
use node_env::{block_cap, mount_cap, name_of, pattern, Env};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use tonic::Code;

const MIB: u64 = 1 << 20;

fn tools() {
    for (t, p) in [
        ("nbdfuse", "nbdfuse"),
        ("losetup", "mount"),
        ("mkfs.ext4", "e2fsprogs"),
        ("resize2fs", "e2fsprogs"),
        ("blkid", "util-linux"),
        ("qemu-io", "qemu-utils"),
    ] {
        need(t, p);
    }
}

#[track_caller]
fn code<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> Code {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(s) => s.code(),
    }
}

/// Write a file and make it durable.
fn write_synced(path: &Path, data: &[u8]) {
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

/// The filesystem type the kernel shows mounted at `path`.
fn mounted_fs(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    text.lines().rev().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (left.split(' ').nth(4)? == path.to_str()?)
            .then(|| right.split(' ').next().unwrap().to_string())
    })
}

#[test]
fn a_mounted_volume_keeps_its_files_across_unstage_and_stage() {
    tools();
    let env = Env::start();
    let id = env.create_volume("pvc-files", 256 * MIB);
    let name = name_of(&id);
    let staging = env.path("staging");
    let target = env.path("pods/a/mount");
    let target_ro = env.path("pods/b/mount");
    std::fs::create_dir_all(&staging).unwrap();

    env.stage(&id, &staging, mount_cap("")).unwrap();
    assert_eq!(mounted_fs(&staging).as_deref(), Some("ext4"));
    let pids = env.nbdfuse_pids();
    assert_eq!(pids.len(), 1, "one nbdfuse for the volume");
    assert_eq!(env.loops().len(), 1, "one loop device");
    assert_eq!(
        env.volume(&name).export.map(|x| x.connections > 0),
        Some(true)
    );

    // Staging again is a no-op: same nbdfuse, same loop device.
    let loops = env.loops();
    env.stage(&id, &staging, mount_cap("")).unwrap();
    assert_eq!(env.nbdfuse_pids(), pids);
    assert_eq!(env.loops(), loops);

    env.publish(&id, &staging, &target, mount_cap(""), false)
        .unwrap();
    env.publish(&id, &staging, &target, mount_cap(""), false)
        .unwrap();
    let data = pattern(3 * MIB as usize + 123, 1);
    write_synced(&target.join("data.bin"), &data);
    std::fs::create_dir(target.join("dir")).unwrap();

    // A read-only publish beside it sees the file and cannot write.
    env.publish(&id, &staging, &target_ro, mount_cap(""), true)
        .unwrap();
    assert_eq!(std::fs::read(target_ro.join("data.bin")).unwrap(), data);
    let e = std::fs::write(target_ro.join("nope"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    // The same target with the other read-only flag is another publish.
    assert_eq!(
        code(env.publish(&id, &staging, &target_ro, mount_cap(""), false)),
        Code::AlreadyExists
    );

    env.unpublish(&id, &target_ro).unwrap();
    env.unpublish(&id, &target).unwrap();
    assert!(!target.exists() && !target_ro.exists(), "targets removed");
    env.unpublish(&id, &target).unwrap();
    env.unstage(&id, &staging).unwrap();
    env.unstage(&id, &staging).unwrap();
    env.assert_clean(&name);
    assert!(staging.is_dir(), "the CO's staging directory stays");

    // Staged again: the filesystem was found, not made anew.
    env.stage(&id, &staging, mount_cap("ext4")).unwrap();
    env.publish(&id, &staging, &target, mount_cap("ext4"), false)
        .unwrap();
    assert_eq!(std::fs::read(target.join("data.bin")).unwrap(), data);
    assert!(target.join("dir").is_dir());
    env.unpublish(&id, &target).unwrap();
    env.unstage(&id, &staging).unwrap();
    env.assert_clean(&name);
}

#[test]
fn block_access_writes_through_the_published_device_reach_the_volume() {
    tools();
    let env = Env::start();
    let id = env.create_volume("pvc-block", 64 * MIB);
    let name = name_of(&id);
    let staging = env.path("staging");
    let target = env.path("pods/a/dev/block");
    std::fs::create_dir_all(&staging).unwrap();

    env.stage(&id, &staging, block_cap()).unwrap();
    assert_eq!(mounted_fs(&staging), None, "block staging mounts nothing");
    env.publish(&id, &staging, &target, block_cap(), false)
        .unwrap();
    env.publish(&id, &staging, &target, block_cap(), false)
        .unwrap();

    // 2 MiB of 0xab at 1 MiB, past the page cache, made durable.
    let src = env.path("src.bin");
    std::fs::write(&src, vec![0xab_u8; 2 * MIB as usize]).unwrap();
    run(Command::new("dd")
        .arg(format!("if={}", src.display()))
        .arg(format!("of={}", target.display()))
        .args(["bs=1M", "seek=1", "oflag=direct", "conv=fsync,notrunc"]))
    .ok();

    let stats = env.stats(&id, &target).unwrap();
    assert_eq!(stats.usage.len(), 1);
    assert_eq!(stats.usage[0].total, (64 * MIB) as i64);
    let cond = stats.volume_condition.unwrap();
    assert!(!cond.abnormal, "{}", cond.message);

    env.unpublish(&id, &target).unwrap();
    assert!(!target.exists(), "the target file is removed");
    env.unstage(&id, &staging).unwrap();
    env.assert_clean(&name);

    // Read back through the daemon's own export.
    let export = env.call("attach", env.client.attach_volume(&name)).unwrap();
    qemu_io(
        &export.uri,
        &["read -P 0 0 1M", "read -P 0xab 1M 2M", "read -P 0 3M 1M"],
    );
    env.call("detach", env.client.detach_volume(&name, false))
        .unwrap();
}

#[test]
fn a_restarted_plugin_unstages_what_the_one_before_staged() {
    tools();
    let mut env = Env::start();
    let id = env.create_volume("pvc-restart", 128 * MIB);
    let name = name_of(&id);
    let staging = env.path("staging");
    let target = env.path("pods/a/mount");
    std::fs::create_dir_all(&staging).unwrap();
    env.stage(&id, &staging, mount_cap("")).unwrap();
    env.publish(&id, &staging, &target, mount_cap(""), false)
        .unwrap();
    write_synced(&target.join("f"), b"before the restart");
    let pids = env.nbdfuse_pids();

    env.restart_csi();

    // nbdfuse lives on in its own session, and the new plugin knows it.
    assert_eq!(env.nbdfuse_pids(), pids);
    let stats = env.stats(&id, &target).unwrap();
    let cond = stats.volume_condition.unwrap();
    assert!(!cond.abnormal, "{}", cond.message);
    env.stage(&id, &staging, mount_cap("")).unwrap();
    assert_eq!(env.nbdfuse_pids(), pids, "a repeated stage reuses it");
    env.publish(&id, &staging, &target, mount_cap(""), false)
        .unwrap();
    assert_eq!(
        std::fs::read(target.join("f")).unwrap(),
        b"before the restart"
    );

    env.unpublish(&id, &target).unwrap();
    env.unstage(&id, &staging).unwrap();
    env.assert_clean(&name);
}

#[test]
fn a_dead_nbdfuse_shows_as_an_abnormal_condition_and_unstage_still_cleans_up() {
    tools();
    let env = Env::start();
    let id = env.create_volume("pvc-dead", 64 * MIB);
    let name = name_of(&id);
    let staging = env.path("staging");
    let target = env.path("pods/a/dev/block");
    std::fs::create_dir_all(&staging).unwrap();
    env.stage(&id, &staging, block_cap()).unwrap();
    env.publish(&id, &staging, &target, block_cap(), false)
        .unwrap();
    let cond = env.stats(&id, &target).unwrap().volume_condition.unwrap();
    assert!(!cond.abnormal, "{}", cond.message);

    let pids = env.nbdfuse_pids();
    assert_eq!(pids.len(), 1);
    run(Command::new("kill").args(["-9", &pids[0].to_string()])).ok();
    lamina_test_support::wait_until("nbdfuse to die", node_env::LIMIT, || {
        env.nbdfuse_pids().is_empty().then_some(())
    });
    let cond = env.stats(&id, &target).unwrap().volume_condition.unwrap();
    assert!(cond.abnormal);
    assert!(cond.message.contains("nbdfuse"), "{}", cond.message);
    // A broken staging is not published anew.
    let other = env.path("pods/b/dev/block");
    assert_eq!(
        code(env.publish(&id, &staging, &other, block_cap(), false)),
        Code::FailedPrecondition
    );

    env.unpublish(&id, &target).unwrap();
    env.unstage(&id, &staging).unwrap();
    env.assert_clean(&name);
}

#[test]
fn a_volume_expanded_while_unstaged_gets_a_filesystem_of_its_new_size() {
    tools();
    let env = Env::start();
    let id = env.create_volume("pvc-grow", 128 * MIB);
    let name = name_of(&id);
    let staging = env.path("staging");
    let target = env.path("pods/a/mount");
    std::fs::create_dir_all(&staging).unwrap();
    env.stage(&id, &staging, mount_cap("")).unwrap();
    env.publish(&id, &staging, &target, mount_cap(""), false)
        .unwrap();
    write_synced(&target.join("f"), b"kept");
    let total = |env: &Env| env.stats(&id, &target).unwrap().usage[0].total as u64;
    let small = total(&env);
    assert!(small > 100 * MIB && small <= 128 * MIB, "{small}");

    // Lamina grows volumes offline: not while a node is connected.
    let grow = |env: &Env| {
        let req = lamina_csi::proto::ControllerExpandVolumeRequest {
            volume_id: id.clone(),
            capacity_range: Some(lamina_csi::proto::CapacityRange {
                required_bytes: (512 * MIB) as i64,
                limit_bytes: 0,
            }),
            volume_capability: Some(mount_cap("")),
            ..Default::default()
        };
        env.call(
            "ControllerExpandVolume",
            env.ctl().controller_expand_volume(req),
        )
    };
    assert_eq!(code(grow(&env)), Code::FailedPrecondition);
    assert_eq!(
        code(env.expand(&id, &target, 512 * MIB)),
        Code::FailedPrecondition,
        "the node cannot see a size the volume does not have"
    );

    env.unpublish(&id, &target).unwrap();
    env.unstage(&id, &staging).unwrap();
    let r = grow(&env).unwrap().into_inner();
    assert_eq!(r.capacity_bytes, (512 * MIB) as i64);
    assert!(r.node_expansion_required);

    env.stage(&id, &staging, mount_cap("")).unwrap();
    env.publish(&id, &staging, &target, mount_cap(""), false)
        .unwrap();
    let cap = env.expand(&id, &target, 512 * MIB).unwrap();
    assert_eq!(cap, (512 * MIB) as i64);
    let big = total(&env);
    assert!(big > 448 * MIB && big <= 512 * MIB, "{big}");
    assert_eq!(std::fs::read(target.join("f")).unwrap(), b"kept");
    // Again: nothing more to grow, the same answer.
    assert_eq!(env.expand(&id, &staging, 0).unwrap(), (512 * MIB) as i64);

    env.unpublish(&id, &target).unwrap();
    env.unstage(&id, &staging).unwrap();
    env.assert_clean(&name);
}

#[test]
fn stats_report_bytes_and_inodes_of_the_mounted_filesystem() {
    tools();
    let env = Env::start();
    let id = env.create_volume("pvc-stats", 128 * MIB);
    let staging = env.path("staging");
    let target = env.path("pods/a/mount");
    std::fs::create_dir_all(&staging).unwrap();
    env.stage(&id, &staging, mount_cap("")).unwrap();
    env.publish(&id, &staging, &target, mount_cap(""), false)
        .unwrap();
    let usage = |path: &Path| {
        let s = env.stats(&id, path).unwrap();
        assert!(!s.volume_condition.as_ref().unwrap().abnormal);
        let by = |unit: lamina_csi::proto::volume_usage::Unit| {
            s.usage
                .iter()
                .find(|u| u.unit == unit as i32)
                .cloned()
                .unwrap_or_else(|| panic!("no {unit:?} usage in {s:?}"))
        };
        (
            by(lamina_csi::proto::volume_usage::Unit::Bytes),
            by(lamina_csi::proto::volume_usage::Unit::Inodes),
        )
    };
    let (b0, i0) = usage(&target);
    assert!(b0.total > 0 && b0.available > 0 && b0.available <= b0.total);
    assert!(i0.total > 0 && i0.used > 0 && i0.used + i0.available <= i0.total);

    write_synced(&target.join("big"), &pattern(16 * MIB as usize, 3));
    for i in 0..10 {
        write_synced(&target.join(format!("small-{i}")), b"x");
    }
    let (b1, i1) = usage(&target);
    assert_eq!(b1.total, b0.total);
    assert!(b1.used >= b0.used + (16 * MIB) as i64, "{b0:?} then {b1:?}");
    assert_eq!(i1.used, i0.used + 11, "{i0:?} then {i1:?}");
    // The staging path reports the same filesystem.
    assert_eq!(usage(&staging).0.total, b1.total);

    assert_eq!(code(env.stats(&id, &env.path("elsewhere"))), Code::NotFound);
    assert_eq!(code(env.stats("pvc-none@99", &target)), Code::NotFound);
    env.unpublish(&id, &target).unwrap();
    env.unstage(&id, &staging).unwrap();
    env.assert_clean(&name_of(&id));
}

#[test]
fn requests_that_do_not_fit_get_the_codes_the_spec_names() {
    tools();
    let env = Env::start();
    let id = env.create_volume("pvc-codes", 64 * MIB);
    let staging = env.path("staging");
    let target = env.path("pods/a/mount");
    std::fs::create_dir_all(&staging).unwrap();

    // Before staging: nothing to publish, nothing to unstage or unpublish.
    assert_eq!(
        code(env.publish(&id, &staging, &target, mount_cap(""), false)),
        Code::FailedPrecondition
    );
    env.unstage(&id, &staging).unwrap();
    std::fs::create_dir_all(&target).unwrap();
    env.unpublish(&id, &target).unwrap();
    assert!(!target.exists(), "an unmounted target directory is removed");
    assert_eq!(
        code(env.stage("pvc-missing@12345", &staging, mount_cap(""))),
        Code::NotFound
    );
    assert_eq!(
        code(env.stage("not an id", &staging, mount_cap(""))),
        Code::NotFound
    );
    assert_eq!(
        code(env.stage(&id, &staging, mount_cap("btrfs"))),
        Code::InvalidArgument
    );
    assert_eq!(
        code(env.stage(&id, Path::new(""), mount_cap(""))),
        Code::InvalidArgument
    );

    env.stage(&id, &staging, mount_cap("")).unwrap();
    // The same volume at another staging path, or with another capability.
    let elsewhere = env.path("staging2");
    std::fs::create_dir_all(&elsewhere).unwrap();
    assert_eq!(
        code(env.stage(&id, &elsewhere, mount_cap(""))),
        Code::FailedPrecondition
    );
    assert_eq!(
        code(env.stage(&id, &staging, block_cap())),
        Code::AlreadyExists
    );
    assert_eq!(
        code(env.stage(&id, &staging, mount_cap("xfs"))),
        Code::AlreadyExists
    );
    // Published with the other access type than staged.
    assert_eq!(
        code(env.publish(&id, &staging, &target, block_cap(), false)),
        Code::InvalidArgument
    );
    env.publish(&id, &staging, &target, mount_cap(""), false)
        .unwrap();
    // Unstaging while published is refused; nothing is torn down.
    assert_eq!(code(env.unstage(&id, &staging)), Code::FailedPrecondition);
    assert_eq!(mounted_fs(&target).as_deref(), Some("ext4"));

    env.unpublish(&id, &target).unwrap();
    env.unstage(&id, &staging).unwrap();
    env.assert_clean(&name_of(&id));
}

#[test]
fn staging_a_broken_staged_volume_again_starts_over_and_keeps_the_data() {
    tools();
    let env = Env::start();
    let id = env.create_volume("pvc-repair", 64 * MIB);
    let name = name_of(&id);
    let staging = env.path("staging");
    let target = env.path("pods/a/mount");
    std::fs::create_dir_all(&staging).unwrap();
    env.stage(&id, &staging, mount_cap("")).unwrap();
    env.publish(&id, &staging, &target, mount_cap(""), false)
        .unwrap();
    write_synced(&target.join("f"), b"durable");
    run(Command::new("sync").arg("-f").arg(target.join("f"))).ok();

    let old = env.nbdfuse_pids();
    run(Command::new("kill").args(["-9", &old[0].to_string()])).ok();
    lamina_test_support::wait_until("nbdfuse to die", node_env::LIMIT, || {
        env.nbdfuse_pids().is_empty().then_some(())
    });
    // Still published: the broken device is held, so no new start.
    assert_eq!(
        code(env.stage(&id, &staging, mount_cap(""))),
        Code::FailedPrecondition
    );
    env.unpublish(&id, &target).unwrap();
    env.stage(&id, &staging, mount_cap("")).unwrap();
    let new = env.nbdfuse_pids();
    assert_eq!(new.len(), 1);
    assert_ne!(new, old);
    env.publish(&id, &staging, &target, mount_cap(""), false)
        .unwrap();
    assert_eq!(std::fs::read(target.join("f")).unwrap(), b"durable");
    let cond = env.stats(&id, &target).unwrap().volume_condition.unwrap();
    assert!(!cond.abnormal, "{}", cond.message);

    env.unpublish(&id, &target).unwrap();
    env.unstage(&id, &staging).unwrap();
    env.assert_clean(&name);
}

#[test]
fn xfs_is_made_grown_and_mounted_beside_a_clone_with_the_same_uuid() {
    tools();
    need("mkfs.xfs", "xfsprogs");
    need("xfs_growfs", "xfsprogs");
    let env = Env::start();
    // mkfs.xfs refuses filesystems under 300 MiB.
    let id = env.create_volume("pvc-xfs", 320 * MIB);
    let staging = env.path("staging");
    let target = env.path("pods/a/mount");
    std::fs::create_dir_all(&staging).unwrap();
    env.stage(&id, &staging, mount_cap("xfs")).unwrap();
    assert_eq!(mounted_fs(&staging).as_deref(), Some("xfs"));
    env.publish(&id, &staging, &target, mount_cap("xfs"), false)
        .unwrap();
    write_synced(&target.join("f"), b"on xfs");
    env.unpublish(&id, &target).unwrap();
    env.unstage(&id, &staging).unwrap();

    // Grown offline, then staged: xfs grows once mounted.
    let req = lamina_csi::proto::ControllerExpandVolumeRequest {
        volume_id: id.clone(),
        capacity_range: Some(lamina_csi::proto::CapacityRange {
            required_bytes: (640 * MIB) as i64,
            limit_bytes: 0,
        }),
        volume_capability: Some(mount_cap("xfs")),
        ..Default::default()
    };
    env.call(
        "ControllerExpandVolume",
        env.ctl().controller_expand_volume(req),
    )
    .unwrap();
    // Asked for no filesystem in particular, the one found is used.
    env.stage(&id, &staging, mount_cap("")).unwrap();
    env.publish(&id, &staging, &target, mount_cap(""), false)
        .unwrap();
    assert_eq!(
        env.expand(&id, &target, 640 * MIB).unwrap(),
        (640 * MIB) as i64
    );
    let total = env.stats(&id, &target).unwrap().usage[0].total as u64;
    // statvfs leaves out the log and reserved blocks: more than 320 MiB is grown.
    assert!(total > 512 * MIB && total <= 640 * MIB, "{total}");

    // A clone holds the same filesystem UUID; both mount at once.
    let req = lamina_csi::proto::CreateVolumeRequest {
        name: "pvc-xfs-clone".into(),
        volume_capabilities: vec![mount_cap("xfs")],
        volume_content_source: Some(lamina_csi::proto::VolumeContentSource {
            r#type: Some(lamina_csi::proto::volume_content_source::Type::Volume(
                lamina_csi::proto::volume_content_source::VolumeSource {
                    volume_id: id.clone(),
                },
            )),
        }),
        ..Default::default()
    };
    let clone = env
        .call("CreateVolume", env.ctl().create_volume(req))
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let staging2 = env.path("staging2");
    let target2 = env.path("pods/b/mount");
    std::fs::create_dir_all(&staging2).unwrap();
    env.stage(&clone, &staging2, mount_cap("xfs")).unwrap();
    env.publish(&clone, &staging2, &target2, mount_cap("xfs"), false)
        .unwrap();
    assert_eq!(std::fs::read(target2.join("f")).unwrap(), b"on xfs");

    for (v, s, t) in [(&clone, &staging2, &target2), (&id, &staging, &target)] {
        env.unpublish(v, t).unwrap();
        env.unstage(v, s).unwrap();
    }
    env.assert_clean(&name_of(&id));
    env.assert_clean(&name_of(&clone));
}

/// A call to the node plugin's freeze service, as the daemon makes it
/// (curl on the unix socket): the status and the body.
fn freeze_service(env: &Env, path: &str, body: &str) -> (u16, serde_json::Value) {
    let socket = env.path("data").join(lamina_api::freeze::SOCKET);
    let out = run(Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", "--unix-socket"])
        .arg(&socket)
        .args(["-H", "content-type: application/json", "-d", body])
        .arg(format!("http://localhost{path}")))
    .ok();
    let (body, status) = out.trim_end().rsplit_once('\n').unwrap();
    (status.parse().unwrap(), serde_json::from_str(body).unwrap())
}

/// Write and sync a file on another thread: Ok when it finished within
/// `LIMIT` (a filesystem left frozen would hold it for good).
#[track_caller]
fn write_finishes(path: &Path) {
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.to_path_buf();
    std::thread::spawn(move || {
        write_synced(&p, b"written after the freeze");
        let _ = tx.send(());
    });
    rx.recv_timeout(node_env::LIMIT)
        .unwrap_or_else(|_| panic!("writing {} did not finish: still frozen?", path.display()));
}

/// `dumpe2fs -h` and `e2fsck -fn` of a snapshot's filesystem, read whole
/// through its NBD export: whether its journal needs replaying, and
/// whether the check (which replays nothing) found it clean.
fn snapshot_fs(env: &Env, volume: &str, snapshot: &str) -> (bool, bool) {
    let x = env
        .call("attach", env.client.attach_snapshot(volume, snapshot))
        .unwrap();
    let img = env.path(&format!("{snapshot}.img"));
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw", &x.uri])
        .arg(&img))
    .ok();
    env.call(
        "detach",
        env.client.detach_snapshot(volume, snapshot, false),
    )
    .unwrap();
    let head = run(Command::new("dumpe2fs").arg("-h").arg(&img)).ok();
    let features = head
        .lines()
        .find(|l| l.starts_with("Filesystem features:"))
        .unwrap_or_else(|| panic!("no features in {head}"))
        .to_string();
    let clean = Command::new("e2fsck")
        .arg("-fn")
        .arg(&img)
        .output()
        .unwrap()
        .status
        .success();
    std::fs::remove_file(&img).unwrap();
    (features.contains("needs_recovery"), clean)
}

/// A volume made, staged as ext4 at `staging` and published at
/// `pods/a/mount`: `(id, name, staging, target)`.
fn mounted(env: &Env, volume: &str, size: u64) -> (String, String, PathBuf, PathBuf) {
    let id = env.create_volume(volume, size);
    let name = name_of(&id);
    let staging = env.path("staging");
    let target = env.path("pods/a/mount");
    std::fs::create_dir_all(&staging).unwrap();
    env.stage(&id, &staging, mount_cap("ext4")).unwrap();
    env.publish(&id, &staging, &target, mount_cap("ext4"), false)
        .unwrap();
    (id, name, staging, target)
}

#[test]
fn a_frozen_snapshot_of_a_filesystem_in_use_needs_no_journal_replay() {
    tools();
    need("dumpe2fs", "e2fsprogs");
    let env = Env::start();
    let (id, name, staging, target) = mounted(&env, "pvc-frozen", 128 * MIB);

    // A writer keeps creating and syncing files while both snapshots are
    // taken: its journal always has transactions in flight.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (dir, s2) = (target.clone(), stop.clone());
    let writer = std::thread::spawn(move || {
        let mut n = 0u64;
        while !s2.load(std::sync::atomic::Ordering::Relaxed) {
            write_synced(&dir.join(format!("f{}", n % 64)), &pattern(8192, n as u8));
            n += 1;
        }
        n
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    let take = |snap: &str, freeze: bool| {
        let req = lamina_api::CreateSnapshot {
            name: snap.into(),
            labels: Default::default(),
            freeze,
        };
        env.call("snapshot", env.client.create_snapshot(&name, &req))
            .unwrap_or_else(|e| panic!("snapshot {snap}: {e}"));
    };
    take("plain", false);
    take("frozen", true);
    std::thread::sleep(std::time::Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let writes = writer.join().unwrap();
    assert!(writes > 2, "the writer wrote {writes} files");

    // The snapshot taken without a freeze is a crash image (the test can
    // tell them apart); the frozen one is clean as it is.
    let (replay, _) = snapshot_fs(&env, &name, "plain");
    assert!(
        replay,
        "a snapshot of a mounted ext4 without freeze needs recovery"
    );
    assert_eq!(snapshot_fs(&env, &name, "frozen"), (false, true));

    // The filesystem was thawed: writing goes on.
    write_finishes(&target.join("after"));
    env.unpublish(&id, &target).unwrap();
    env.unstage(&id, &staging).unwrap();
    env.assert_clean(&name);
}

#[test]
fn a_freeze_nobody_thaws_ends_at_its_hold_and_after_a_plugin_restart_or_an_unstage() {
    tools();
    need("curl", "curl");
    let mut env = Env::start();
    let (id, name, staging, target) = mounted(&env, "pvc-hold", 64 * MIB);
    let freeze = |env: &Env, hold_ms: u64| {
        let body = format!(r#"{{"volumes": ["{name}", "absent"], "hold_ms": {hold_ms}}}"#);
        let (s, v) = freeze_service(env, "/v1/freeze", &body);
        assert_eq!(s, 200, "{v}");
        // Only the mounted volume is frozen; "absent" has no mount.
        assert_eq!(v["frozen"][0][1], staging.display().to_string(), "{v}");
        assert_eq!(v["frozen"].as_array().unwrap().len(), 1, "{v}");
        v["id"].as_str().unwrap().to_string()
    };

    // Refused: a hold out of range, an unknown field; a second freeze of
    // a frozen filesystem (409) changes nothing.
    for body in [
        r#"{"volumes": [], "hold_ms": 0}"#,
        r#"{"volumes": [], "hold_ms": 60001}"#,
        r#"{"volumes": [], "hold_ms": 5, "x": 1}"#,
    ] {
        let (s, v) = freeze_service(&env, "/v1/freeze", body);
        assert_eq!(
            (s, v["code"].as_str()),
            (400, Some("invalid")),
            "{body}: {v}"
        );
    }
    let first = freeze(&env, 60_000);
    let body = format!(r#"{{"volumes": ["{name}"], "hold_ms": 1000}}"#);
    let (s, v) = freeze_service(&env, "/v1/freeze", &body);
    assert_eq!((s, v["code"].as_str()), (409, Some("conflict")), "{v}");
    let (s, v) = freeze_service(&env, "/v1/thaw", &format!(r#"{{"id": "{first}"}}"#));
    assert_eq!(
        (s, v["thawed"].as_array().map(Vec::len)),
        (200, Some(1)),
        "{v}"
    );
    // A thaw again thaws nothing, and is no error.
    let (s, v) = freeze_service(&env, "/v1/thaw", &format!(r#"{{"id": "{first}"}}"#));
    assert_eq!(
        (s, v["thawed"].as_array().map(Vec::len)),
        (200, Some(0)),
        "{v}"
    );
    write_finishes(&target.join("a"));

    // No thaw comes (the daemon died): the hold ends it.
    freeze(&env, 500);
    write_finishes(&target.join("b"));

    // The plugin dies while a freeze holds: the next one thaws at start.
    freeze(&env, 60_000);
    env.restart_csi();
    write_finishes(&target.join("c"));

    // A frozen volume unstages: the freeze is let go first.
    freeze(&env, 60_000);
    env.unpublish(&id, &target).unwrap();
    env.unstage(&id, &staging).unwrap();
    env.assert_clean(&name);
}

#[test]
fn a_staging_path_no_longer_on_the_volume_is_never_frozen() {
    // The record says the volume is mounted at a path where another
    // filesystem is now (as when an unstage unmounted it beside a freeze):
    // the freeze is refused, and that filesystem (a tmpfs here, so that a
    // mistake could not freeze the host's) is not frozen.
    tools();
    need("curl", "curl");
    let env = Env::start();
    let id = env.create_volume("pvc-moved", 64 * MIB);
    let name = name_of(&id);
    let staging = env.path("staging");
    std::fs::create_dir_all(&staging).unwrap();
    env.stage(&id, &staging, mount_cap("ext4")).unwrap();
    let other = env.path("other");
    std::fs::create_dir_all(&other).unwrap();
    run(Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&other))
    .ok();
    let record = env.state_dir().join("volumes").join(format!("{id}.json"));
    let mut rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    rec["staging_path"] = other.display().to_string().into();
    std::fs::write(&record, rec.to_string()).unwrap();

    let body = format!(r#"{{"volumes": ["{name}"], "hold_ms": 60000}}"#);
    let (s, v) = freeze_service(&env, "/v1/freeze", &body);
    let unmount = || run(Command::new("umount").arg(&other)).ok();
    if s == 200 {
        // Undo before failing: a frozen tmpfs would hold the sweep.
        run(Command::new("fsfreeze").arg("-u").arg(&other)).ok();
        unmount();
        panic!("a path not on the volume was frozen: {v}");
    }
    assert_eq!((s, v["code"].as_str()), (500, Some("internal")), "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("is not the one on"),
        "{v}"
    );
    write_finishes(&other.join("x"));
    unmount();
    // The record made right again, the volume unstages cleanly.
    rec["staging_path"] = staging.display().to_string().into();
    std::fs::write(&record, rec.to_string()).unwrap();
    env.unstage(&id, &staging).unwrap();
    env.assert_clean(&name);
}
