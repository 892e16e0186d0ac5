//! Volumes served as files by the daemon (`lamina volume attach --file`,
//! the FUSE server in `crates/fuse`): xfs on a loop device over the file
//! with fio's verify, a snapshot of it checked through NBD, the volume grown
//! while mounted, detach refused while the loop device holds the file, the
//! file served again after the daemon is killed, and refused on a daemon
//! that serves no files. Needs root (FUSE, loop devices, mount), as CI has.
//!
//! The daemon is a process of its own: the process that mounts a file
//! system on the file never serves it, so nothing here can wait on itself.

use crate::LAMINA;
use lamina_test_support::*;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A loop device over a file, detached at the end.
struct Loop(String);

impl Loop {
    fn over(file: &str) -> Loop {
        let dev = run(Command::new("losetup").args(["--find", "--show", file]))
            .ok()
            .trim()
            .to_string();
        Loop(dev)
    }

    fn size(&self) -> u64 {
        run(Command::new("blockdev").args(["--getsize64", &self.0]))
            .ok()
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = try_run(Command::new("losetup").args(["-d", &self.0]));
    }
}

/// A file system mounted on a directory, unmounted at the end.
struct Mounted(PathBuf);

impl Mounted {
    fn new(dev: &str, dir: PathBuf) -> Mounted {
        std::fs::create_dir_all(&dir).unwrap();
        run(Command::new("mount").arg(dev).arg(&dir)).ok();
        Mounted(dir)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = try_run(Command::new("umount").arg(&self.0));
    }
}

fn file_of(d: &Daemon, volume: &str) -> String {
    let e = d.json(&["volume", "attach", volume, "--file"]);
    e["file"]
        .as_str()
        .unwrap_or_else(|| panic!("attach --file printed no file: {e}"))
        .to_string()
}

fn fs_blocks(dir: &Path) -> u64 {
    run(Command::new("stat").args(["-f", "-c", "%b"]).arg(dir))
        .ok()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn xfs_on_the_daemons_file_passes_fio_verify_snapshots_and_grows_while_mounted() {
    let d = LAMINA.start();
    let base = tempfile::tempdir().unwrap();
    d.ok(&["volume", "create", "v", "--size", "320M"]);
    let file = file_of(&d, "v");
    assert_eq!(
        Path::new(&file),
        d.data().join("files").join("v"),
        "the file lives in the daemon's data directory"
    );
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 320 << 20);
    let dev = Loop::over(&file);
    run(Command::new("mkfs.xfs").args(["-q", "-f", &dev.0])).ok();
    let fs = Mounted::new(&dev.0, base.path().join("fs"));

    // fio writes with verify headers, then reads everything back and checks
    // it, through xfs, the loop device, FUSE and the engine.
    let out = run(Command::new("fio")
        .args([
            "--name=verify",
            "--size=48M",
            "--rw=randwrite",
            "--bs=4k",
            "--ioengine=libaio",
            "--iodepth=16",
            "--direct=1",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--output-format=terse",
        ])
        .arg(format!("--filename={}", fs.0.join("data").display())))
    .ok();
    assert!(!out.contains(";fio: "), "fio: {out}");
    std::fs::write(fs.0.join("note"), b"kept in the snapshot").unwrap();
    run(Command::new("sync").arg("-f").arg(&fs.0)).ok();
    run(Command::new("xfs_freeze").arg("-f").arg(&fs.0)).ok();
    d.ok(&["snapshot", "create", "v", "s1"]);
    run(Command::new("xfs_freeze").arg("-u").arg(&fs.0)).ok();

    // The loop device holds the file: a detach would cut it off.
    let e = d.err(&["volume", "detach", "v"]);
    assert!(e.contains("in use"), "{e}");

    // Grown while mounted: the file shows the new size at once, the loop
    // device takes it when asked, and xfs grows into it.
    let before = fs_blocks(&fs.0);
    d.ok(&["volume", "expand", "v", "--size", "640M"]);
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 640 << 20);
    run(Command::new("losetup").args(["--set-capacity", &dev.0])).ok();
    assert_eq!(dev.size(), 640 << 20);
    run(Command::new("xfs_growfs").arg(&fs.0)).ok();
    assert!(fs_blocks(&fs.0) > before * 3 / 2, "xfs grew");
    let big = vec![7u8; 64 << 20];
    std::fs::write(fs.0.join("big"), &big).unwrap();
    run(Command::new("sync").arg("-f").arg(&fs.0)).ok();
    drop(fs);
    drop(dev);
    let r = d.json(&["volume", "detach", "v"]);
    assert_eq!(r["existed"], true);
    assert!(!Path::new(&file).exists(), "the detached file is gone");

    // The snapshot, read through its NBD export (a copy, mounted): it holds
    // what was written before it, and nothing after.
    let uri = d.attach(&["snapshot", "attach", "v", "s1"]);
    let img = base.path().join("s1.img");
    run(Command::new("nbdcopy").arg(&uri).arg(&img)).ok();
    let dev = Loop::over(img.to_str().unwrap());
    let snap = Mounted::new(&dev.0, base.path().join("snap"));
    assert_eq!(
        std::fs::read(snap.0.join("note")).unwrap(),
        b"kept in the snapshot"
    );
    assert!(!snap.0.join("big").exists());
}

#[test]
fn the_file_comes_back_after_a_kill_and_is_refused_where_files_are_off() {
    let mut d = LAMINA.start();
    d.ok(&["volume", "create", "v", "--size", "16M"]);
    let file = file_of(&d, "v");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&file)
        .unwrap();
    f.write_all_at(b"written through the file", 1 << 20)
        .unwrap();
    f.sync_all().unwrap();
    drop(f);

    // SIGKILL: the mount is left with a dead connection; the restarted
    // daemon serves the file again in its place.
    d.restart();
    let v = d.json(&["volume", "get", "v"]);
    assert_eq!(v["export"]["file"].as_str(), Some(file.as_str()), "{v}");
    let mut back = [0u8; 24];
    std::fs::File::open(&file)
        .unwrap()
        .read_exact_at(&mut back, 1 << 20)
        .unwrap();
    assert_eq!(&back, b"written through the file");

    // A daemon that serves no files keeps the NBD export, and refuses a
    // file with the words the CSI node plugin looks for, attaching nothing.
    d.stop();
    d.set_extra(&["--files", "off"]);
    d.start_again();
    let v = d.json(&["volume", "get", "v"]);
    assert!(v["export"]["uri"].is_string(), "{v}");
    assert!(v["export"]["file"].is_null(), "{v}");
    d.ok(&["volume", "create", "w", "--size", "16M"]);
    let e = d.err(&["volume", "attach", "w", "--file"]);
    assert!(e.contains(lamina_api::FILES_REFUSED), "{e}");
    let w = d.json(&["volume", "get", "w"]);
    assert!(
        w["export"].is_null(),
        "a refused file attaches nothing: {w}"
    );
}
