//! The seeds' scenario: a volume through nbdfuse and a loop device,
//! formatted ext4, files written and their md5sums recorded, a snapshot,
//! more changes, then a clone of the snapshot mounted and every file checked.
//! Needs root (loop devices and mount), as CI has.

use crate::LAMINA;
use lamina_test_support::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// An NBD export mounted as a file by nbdfuse, on a loop device, mounted.
struct Mounted {
    fuse_dir: PathBuf,
    nbdfuse: Child,
    loopdev: String,
    fs_dir: PathBuf,
}

impl Mounted {
    fn new(base: &Path, tag: &str, uri: &str, mkfs: bool) -> Mounted {
        let fuse_dir = base.join(format!("fuse-{tag}"));
        let fs_dir = base.join(format!("fs-{tag}"));
        std::fs::create_dir_all(&fuse_dir).unwrap();
        std::fs::create_dir_all(&fs_dir).unwrap();
        let nbdfuse = Command::new("nbdfuse")
            .arg(&fuse_dir)
            .arg(uri)
            .stdout(Stdio::null())
            .spawn()
            .expect("nbdfuse");
        let file = fuse_dir.join("nbd");
        wait_until(
            &format!("nbdfuse to expose {}", file.display()),
            Duration::from_secs(30),
            || file.exists().then_some(()),
        );
        let loopdev = run(Command::new("losetup").args(["-f", "--show"]).arg(&file))
            .ok()
            .trim()
            .to_string();
        if mkfs {
            run(Command::new("mkfs.ext4").args(["-q", "-F", &loopdev])).ok();
        }
        run(Command::new("mount").arg(&loopdev).arg(&fs_dir)).ok();
        Mounted {
            fuse_dir,
            nbdfuse,
            loopdev,
            fs_dir,
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = try_run(Command::new("umount").arg(&self.fs_dir));
        let _ = try_run(Command::new("losetup").args(["-d", &self.loopdev]));
        let _ = try_run(Command::new("fusermount3").arg("-u").arg(&self.fuse_dir));
        let _ = self.nbdfuse.kill();
        let _ = self.nbdfuse.wait();
    }
}

fn md5s(dir: &Path, names: &[String]) -> Vec<String> {
    names
        .iter()
        .map(|n| {
            run(Command::new("md5sum").arg(dir.join(n)))
                .ok()
                .split_whitespace()
                .next()
                .unwrap()
                .to_string()
        })
        .collect()
}

#[test]
fn ext4_snapshot_and_clone_keep_every_file() {
    need("nbdfuse", "nbdfuse");
    need("mkfs.ext4", "e2fsprogs");
    need("losetup", "mount");
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test needs root for loop devices and mount (CI runs as root)"
    );
    let d = LAMINA.start();
    d.ok(&["volume", "create", "fsvol", "--size", "256MiB"]);
    let uri = d.attach(&["volume", "attach", "fsvol"]);
    let base = d.data().to_path_buf();
    let m = Mounted::new(&base, "vol", &uri, true);
    let mut names = Vec::new();
    for i in 0..20 {
        let name = format!("file{i}");
        let data: Vec<u8> = (0..(i + 1) * 37_000)
            .map(|j| (j * 31 + i * 7) as u8)
            .collect();
        std::fs::write(m.fs_dir.join(&name), data).unwrap();
        names.push(name);
    }
    let sums = md5s(&m.fs_dir, &names);
    // Quiesce the file system, snapshot, thaw.
    run(&mut Command::new("sync")).ok();
    run(Command::new("fsfreeze").arg("-f").arg(&m.fs_dir)).ok();
    let r = d.lamina(&["snapshot", "create", "fsvol", "before"]);
    run(Command::new("fsfreeze").arg("-u").arg(&m.fs_dir)).ok();
    assert!(r.status.success(), "snapshot: {}", r.stderr);
    // More changes after the snapshot.
    for n in &names[..10] {
        std::fs::write(m.fs_dir.join(n), b"changed after the snapshot").unwrap();
    }
    std::fs::remove_file(m.fs_dir.join(&names[15])).unwrap();
    run(&mut Command::new("sync")).ok();
    // A clone of the snapshot, mounted, has every file as it was.
    d.ok(&[
        "clone",
        "create",
        "fsclone",
        "--from-snapshot",
        "fsvol/before",
    ]);
    let curi = d.attach(&["volume", "attach", "fsclone"]);
    let c = Mounted::new(&base, "clone", &curi, false);
    assert_eq!(
        md5s(&c.fs_dir, &names),
        sums,
        "the clone's files differ from those snapshotted"
    );
    // And the volume kept its own changes.
    assert_eq!(
        std::fs::read(m.fs_dir.join(&names[0])).unwrap(),
        b"changed after the snapshot"
    );
    assert!(!m.fs_dir.join(&names[15]).exists());
    drop(c);
    drop(m);
}
