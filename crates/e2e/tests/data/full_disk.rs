//! A pool on a full file system, killed: `lamina serve` on a pool in a
//! small tmpfs, written through NBD until writes get ENOSPC, a snapshot
//! taken, then SIGKILL. `lamina pool check` on the killed pool must succeed
//! without changing a byte of it (the journal is applied in memory), the
//! daemon must start again with every acknowledged write there, deletes
//! must work, and after space is freed writes must work again. And `pool
//! check` changes no file of a pool that needs no space either.

use crate::LAMINA;
use lamina_test_support::*;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1 << 20;
/// Blocks per index leaf: writes this far apart each need a new node.
const LEAF: u64 = 504 * 4096;

/// Each file of a pool: (name, size, modification time, contents).
type Snapshot = Vec<(String, u64, (i64, i64), Vec<u8>)>;

fn files_of(dir: &Path) -> Snapshot {
    let mut out = Vec::new();
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    for p in names {
        let m = std::fs::metadata(&p).unwrap();
        out.push((
            p.file_name().unwrap().to_string_lossy().into_owned(),
            m.len(),
            (m.mtime(), m.mtime_nsec()),
            std::fs::read(&p).unwrap(),
        ));
    }
    out
}

/// `lamina pool check DIR` must succeed and leave every file of the pool as
/// it was: size, modification time and bytes. Returns its JSON report.
#[track_caller]
fn check_changes_nothing(dir: &Path) -> serde_json::Value {
    let before = files_of(dir);
    let out = run(LAMINA.cmd().args(["pool", "check", "-o", "json"]).arg(dir));
    let after = files_of(dir);
    for ((name, size, mtime, bytes), (_, size2, mtime2, bytes2)) in before.iter().zip(&after) {
        assert_eq!(size, size2, "pool check changed the size of {name}");
        assert_eq!(mtime, mtime2, "pool check changed the mtime of {name}");
        assert!(bytes == bytes2, "pool check changed the bytes of {name}");
    }
    assert_eq!(
        before.len(),
        after.len(),
        "pool check made or removed a file"
    );
    let doc = out.ok();
    let v: serde_json::Value = serde_json::from_str(&doc).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    v
}

/// A tmpfs of `size` mounted over `dir`, holding what `dir` held (files
/// copied whole, so that the preallocated log and journal stay allocated).
/// Unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn over(dir: &Path, size: &str) -> Tmpfs {
        let side = dir.with_extension("orig");
        std::fs::rename(dir, &side).unwrap();
        std::fs::create_dir(dir).unwrap();
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir))
        .ok();
        let t = Tmpfs(dir.to_path_buf());
        for e in std::fs::read_dir(&side).unwrap() {
            let e = e.unwrap();
            run(Command::new("cp")
                .arg("--sparse=never")
                .arg(e.path())
                .arg(dir.join(e.file_name())))
            .ok();
        }
        t
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Run qemu-io commands; returns stdout, whatever failed.
fn qemu_io_any(uri: &str, cmds: &[String]) -> String {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw", uri]);
    for x in cmds {
        c.args(["-c", x]);
    }
    run(&mut c).stdout
}

/// Write `len` bytes of `pattern(offset)` at each offset, in one qemu-io
/// run ending with a flush, until the first write that fails, which must
/// fail for want of space. Returns the offsets written (the flush
/// acknowledged them).
fn write_until_full(uri: &str, offsets: &[u64], len: u64) -> Vec<u64> {
    let mut cmds: Vec<String> = offsets
        .iter()
        .map(|&o| format!("write -P {} {o} {len}", pattern(o)))
        .collect();
    cmds.push("flush".into());
    let out = qemu_io_any(uri, &cmds);
    assert!(
        out.contains("No space left on device"),
        "the disk did not fill: {out}"
    );
    assert!(!out.contains("flush failed"), "{out}");
    let written: Vec<u64> = out
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("wrote {len}/{len} bytes at offset ")))
        .map(|n| n.trim().parse().unwrap())
        .collect();
    // Every write before the first failure succeeded (later ones may too,
    // in blocks the trims freed: they are acknowledged as well).
    written
}

fn pattern(offset: u64) -> u8 {
    ((offset / 4096) % 251 + 1) as u8
}

/// Every (offset, length, byte) must read back.
#[track_caller]
fn verify(uri: &str, written: &[(u64, u64, u8)]) {
    let cmds: Vec<String> = written
        .iter()
        .map(|&(o, len, p)| format!("read -P {p} {o} {len}"))
        .collect();
    for chunk in cmds.chunks(64) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        qemu_io(uri, &refs);
    }
}

#[test]
fn a_daemon_killed_at_a_full_disk_starts_again_and_check_writes_nothing() {
    need("qemu-io", "qemu-utils");
    let mut d = LAMINA.start();
    d.ok(&["volume", "create", "v", "--size", "1GiB"]);
    d.stop();
    // The daemon's pool (a 64 MiB log and a 16 MiB journal, preallocated)
    // on a 104 MiB file system: about 20 MiB for data and index.
    let pool = d.data().join("pool");
    let _fs = Tmpfs::over(&pool, "104m");
    d.start_again();
    let uri = d.attach(&["volume", "attach", "v"]);

    // Fill it in 1 MiB writes.
    let offsets: Vec<u64> = (0..64).map(|i| i * MIB).collect();
    let mut written: Vec<(u64, u64, u8)> = write_until_full(&uri, &offsets, MIB)
        .into_iter()
        .map(|o| (o, MIB, pattern(o)))
        .collect();
    assert!(written.len() >= 4, "{written:?}");
    assert_eq!(written[0].0, 0, "the first write failed");
    // Free 64 blocks, then write one block in each of many leaves far
    // from the rest: the index nodes and data of these take the blocks
    // just freed, which the restart must find again.
    qemu_io(&uri, &["discard 0 256k", "flush"]);
    written[0] = (256 << 10, MIB - (256 << 10), pattern(0));
    written.push((0, 256 << 10, 0));
    let sparse: Vec<u64> = (1..200).map(|i| 100 * LEAF + i * LEAF).collect();
    let more = write_until_full(&uri, &sparse, 4096);
    assert!(!more.is_empty(), "no sparse write fit");
    written.extend(more.iter().map(|&o| (o, 4096, pattern(o))));
    let snap = d.lamina(&["snapshot", "create", "v", "s"]);
    if !snap.status.success() {
        assert!(
            snap.stderr.to_lowercase().contains("space"),
            "{}",
            snap.stderr
        );
    }
    d.kill9();

    // Offline, the pool checks clean and no file of it changes.
    let report = check_changes_nothing(&pool);
    assert_eq!(report["volumes"], 1, "{report}");

    d.start_again();
    let uri = d.attach(&["volume", "attach", "v"]);
    verify(&uri, &written);
    if snap.status.success() {
        let s = d.attach(&["snapshot", "attach", "v", "s"]);
        verify(&s, &written);
        d.ok(&["snapshot", "detach", "v", "s"]);
        d.ok(&["snapshot", "delete", "v", "s"]);
    }
    // Free space by trimming, then writes work again.
    qemu_io(&uri, &["discard 1M 4M", "flush"]);
    qemu_io(&uri, &["write -P 7 1M 2M", "flush", "read -P 7 1M 2M"]);
    d.ok(&["volume", "detach", "v"]);
    d.ok(&["volume", "delete", "v"]);
    d.stop();
    check_changes_nothing(&pool);
}

/// `pool check` on a pool killed with journal records to apply, on an
/// ordinary file system: the check applies them in memory and changes no
/// file; the daemon, started again, still finds every flushed write.
#[test]
fn pool_check_on_a_killed_pool_changes_no_file() {
    need("qemu-io", "qemu-utils");
    let mut d = LAMINA.start();
    d.ok(&["volume", "create", "v", "--size", "64MiB"]);
    let uri = d.attach(&["volume", "attach", "v"]);
    qemu_io(&uri, &["write -P 3 0 4M", "write -P 4 40M 1M", "flush"]);
    d.kill9();
    let pool = d.data().join("pool");
    let report = check_changes_nothing(&pool);
    assert_eq!(report["volumes"], 1, "{report}");
    assert!(
        report["journal_records"].as_u64().is_some_and(|n| n > 0),
        "the check applied no journal record: {report}"
    );
    d.start_again();
    let uri = d.attach(&["volume", "attach", "v"]);
    qemu_io(&uri, &["read -P 3 0 4M", "read -P 4 40M 1M"]);
}
