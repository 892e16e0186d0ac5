//! Volumes served as files by the daemon (`lamina volume attach --file`,
//! the FUSE server in `crates/fuse`): xfs on a loop device over the file
//! with fio's verify, a snapshot of it checked through NBD, the volume grown
//! while mounted, detach refused while the loop device holds the file, the
//! file served again after the daemon is killed, fio's I/O and verify
//! carried through a daemon restart by the keeper (`lamina keeper`), and
//! refused on a daemon that serves no files. Needs root (FUSE, loop
//! devices, mount), as CI has.
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

    /// Detach the loop device and wait until the kernel has let go of its
    /// file: a detach is only marked while anything else has the device open
    /// (another process probing it, or another mount namespace holding a
    /// copy of a file system mounted on it), and the daemon refuses to stop
    /// serving a file that is held.
    fn detach(self) {
        let name = Path::new(&self.0).file_name().unwrap().to_owned();
        let sys = Path::new("/sys/block").join(&name);
        let dev = std::fs::read_to_string(sys.join("dev")).unwrap_or_default();
        run(Command::new("losetup").args(["-d", &self.0])).ok();
        std::mem::forget(self);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while sys.join("loop").exists() {
            if std::time::Instant::now() > deadline {
                panic!(
                    "{} still holds its file 60 s after losetup -d; mount namespaces with a file system on it: {:?}",
                    name.to_string_lossy(),
                    mounted_in(dev.trim())
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// The processes (pid and name) whose mount namespace has a file system on
/// the block device `majmin` ("7:3").
fn mounted_in(majmin: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let info = std::fs::read_to_string(e.path().join("mountinfo")).unwrap_or_default();
        if info.lines().any(|l| l.split(' ').nth(2) == Some(majmin)) {
            let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
            found.push(format!(
                "{} {}",
                e.file_name().to_string_lossy(),
                comm.trim()
            ));
        }
    }
    found
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

    /// Unmount now; a failure fails the test (the drop only tries).
    fn unmount(self) {
        run(Command::new("umount").arg(&self.0)).ok();
        std::mem::forget(self);
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
            // no verify state file in the working directory (the crate's)
            "--verify_state_save=0",
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
    fs.unmount();
    dev.detach();
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

/// `lamina keeper` on a socket of its own, killed at the end; then the
/// files it may have held (a test that failed half-way) are unmounted.
struct KeeperProc {
    child: std::process::Child,
    socket: PathBuf,
    files: Vec<String>,
    _dir: tempfile::TempDir,
}

impl KeeperProc {
    fn start(hold: &str) -> KeeperProc {
        let dir = tempfile::Builder::new()
            .prefix("keeper")
            .tempdir_in("/tmp")
            .unwrap();
        let socket = dir.path().join("keeper.sock");
        let log = std::fs::File::create(dir.path().join("keeper.log")).unwrap();
        let child = LAMINA
            .cmd()
            .arg("keeper")
            .arg("--socket")
            .arg(&socket)
            .args(["--hold", hold])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let up = poll_until(std::time::Duration::from_secs(20), || {
            socket.exists().then_some(())
        });
        assert!(up.is_some(), "lamina keeper made no socket");
        KeeperProc {
            child,
            socket,
            files: Vec::new(),
            _dir: dir,
        }
    }
}

impl Drop for KeeperProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for f in &self.files {
            if fuse_connection(f).is_some() {
                let _ = try_run(Command::new("umount").args(["-l", f]));
            }
        }
    }
}

/// The FUSE connection mounted on `file`.
fn fuse_connection(file: &str) -> Option<u32> {
    lamina_fuse::connection_of(Path::new(file))
}

#[test]
fn io_on_the_file_waits_through_a_daemon_restart_handed_to_the_keeper() {
    // The keeper lets go after a minute: if the new daemon never took the
    // connection back, fio's I/O fails instead of waiting for ever.
    let mut keeper = KeeperProc::start("60s");
    let sock = keeper.socket.to_str().unwrap().to_string();
    let mut d = LAMINA
        .serve()
        .args(["--keeper", sock.as_str()])
        .start()
        .unwrap();
    let base = tempfile::tempdir().unwrap();
    d.ok(&["volume", "create", "v", "--size", "320M"]);
    let file = file_of(&d, "v");
    keeper.files.push(file.clone());
    let conn = fuse_connection(&file).expect("the file is a FUSE mount");
    let dev = Loop::over(&file);
    run(Command::new("mkfs.xfs").args(["-q", "-f", &dev.0])).ok();
    let fs = Mounted::new(&dev.0, base.path().join("fs"));

    // fio writes at a bounded rate (so that it is mid-run when the daemon
    // stops), then reads everything back and checks it.
    let report = base.path().join("fio.json");
    let mut fio = Command::new("fio")
        .args([
            "--name=restart",
            "--size=64M",
            "--rw=randwrite",
            "--bs=4k",
            "--ioengine=libaio",
            "--iodepth=8",
            "--direct=1",
            "--rate=8m",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--output-format=json",
        ])
        .arg(format!("--filename={}", fs.0.join("data").display()))
        .arg(format!("--output={}", report.display()))
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));

    // SIGTERM, as a DaemonSet rollout sends: the daemon answers what the
    // volume holds, hands the connection to the keeper and exits 0.
    let st = d.stop();
    assert!(st.is_some_and(|s| s.success()), "{st:?}\n{}", d.log());
    assert!(d.log().contains("handed to the keeper"), "{}", d.log_tail());
    assert_eq!(
        fuse_connection(&file),
        Some(conn),
        "the file stays mounted on the same connection"
    );
    // Two seconds with no daemon: fio's rate limit leaves gaps between its
    // writes (a run here saw none submitted in the first 0.2 s of a 1.05 s
    // gap), so a write it sends in the first second away waits at least the
    // second after it, which the check below asks of the longest.
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert!(
        fio.try_wait().unwrap().is_none(),
        "fio waits while no daemon runs"
    );

    // The new daemon (the same binary: what matters is a new process on the
    // same data) takes the connection back and fio goes on.
    d.start_again();
    assert!(
        d.log()
            .contains("serving the file again on the connection the keeper held"),
        "{}",
        d.log_tail()
    );
    let done = poll_until(std::time::Duration::from_secs(120), || {
        fio.try_wait().unwrap()
    });
    let status = match done {
        Some(s) => s,
        None => {
            // Unstick everything before failing: abort the connection.
            let _ = std::fs::write(format!("/sys/fs/fuse/connections/{conn}/abort"), "1");
            let _ = fio.kill();
            let _ = fio.wait();
            panic!("fio did not finish within 2 minutes of the restart");
        }
    };
    let out: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert!(status.success(), "fio failed: {out}");
    let job = &out["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    let longest = job["write"]["clat_ns"]["max"].as_f64().unwrap_or(0.0) / 1e9;
    eprintln!("the longest write waited {longest:.2} s across the restart");
    assert!(
        longest >= 1.0,
        "some write waited through the stop ({longest} s)"
    );
    assert_eq!(
        fuse_connection(&file),
        Some(conn),
        "the same connection still serves the file"
    );
    fs.unmount();
    dev.detach();

    // Handed over once more, to a daemon that serves no files: nothing
    // claims the connection, so it is ended and its mount detached, and the
    // file's users get an error at once instead of waiting for the keeper's
    // hold limit.
    d.stop();
    assert_eq!(fuse_connection(&file), Some(conn), "held by the keeper");
    d.set_extra(&["--keeper", sock.as_str(), "--files", "off"]);
    d.start_again();
    assert_eq!(fuse_connection(&file), None, "{}", d.log_tail());
    assert!(
        d.log().contains("its held connection is ended"),
        "{}",
        d.log_tail()
    );
    d.ok(&["volume", "detach", "v"]);
    drop(keeper);
}
