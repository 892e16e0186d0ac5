//! The node service end to end: a real daemon, the driver on its socket,
//! and real nbdfuse, loop devices, ext4 and mounts (run as root; this
//! machine has FUSE and loop devices, not the nbd kernel module).

mod node_env;

use lamina_test_support::{need, qemu_io, run};
use node_env::{block_cap, mount_cap, name_of, pattern, Env};
use std::io::Write;
use std::path::Path;
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
