//! `lamina serve` driven by NBD clients nobody here wrote: nbdinfo,
//! qemu-io, qemu-img and fio's nbd engine.

use crate::LAMINA;
use lamina_test_support::*;
use std::process::Command;

fn compare(a: &str, b: &str) -> bool {
    qemu_img_compare(a, b).status.success()
}

#[test]
fn nbdinfo_sees_size_flags_and_allocation() {
    need("nbdinfo", "libnbd-bin");
    need("qemu-io", "qemu-utils");
    let d = LAMINA.start();
    d.ok(&["volume", "create", "disk", "--size", "64MiB"]);
    let uri = d.attach(&["volume", "attach", "disk"]);
    assert!(uri.starts_with("nbd+unix:///disk?socket="), "{uri}");
    let info: serde_json::Value =
        serde_json::from_str(&run(Command::new("nbdinfo").args(["--json", &uri])).ok()).unwrap();
    let export = &info["exports"][0];
    assert_eq!(export["export-size"], 64 << 20, "{info}");
    assert_eq!(export["can_multi_conn"], true, "{info}");
    assert_eq!(export["is_read_only"], false, "{info}");
    let contexts = export["contexts"].to_string();
    assert!(contexts.contains("base:allocation"), "{info}");
    // A fresh volume is one hole; after a write, data where it was written.
    let map = run(Command::new("nbdinfo").args(["--map", &uri])).ok();
    assert!(map.contains("hole") && !map.contains("data"), "{map}");
    qemu_io(&uri, &["write -P 0x5a 1M 64k"]);
    let map = run(Command::new("nbdinfo").args(["--map", &uri])).ok();
    assert!(
        map.lines()
            .any(|l| l.contains("1048576") && l.contains("data")),
        "{map}"
    );
    // Snapshots are exported read-only.
    d.ok(&["snapshot", "create", "disk", "s1"]);
    let suri = d.attach(&["snapshot", "attach", "disk", "s1"]);
    let sinfo: serde_json::Value =
        serde_json::from_str(&run(Command::new("nbdinfo").args(["--json", &suri])).ok()).unwrap();
    assert_eq!(sinfo["exports"][0]["is_read_only"], true, "{sinfo}");
    let o = run(Command::new("qemu-io").args(["-f", "raw", &suri, "-c", "write 0 4k"]));
    let text = format!("{}{}", o.stdout, o.stderr);
    assert!(
        !o.status.success()
            || text.contains("failed")
            || text.contains("read-only")
            || text.contains("denied"),
        "write to a snapshot export: {text}"
    );
    let list = run(Command::new("nbdinfo").args(["--list", &uri])).ok();
    assert!(list.contains("disk@s1"), "{list}");
}

#[test]
fn snapshots_and_clones_equal_what_was_written() {
    need("qemu-img", "qemu-utils");
    need("qemu-io", "qemu-utils");
    let d = LAMINA.start();
    d.ok(&["volume", "create", "vol", "--size", "32MiB"]);
    let uri = d.attach(&["volume", "attach", "vol"]);
    qemu_io(
        &uri,
        &[
            "write -P 0x11 0 4M",
            "write -P 0x22 5M 1M",
            "write -P 0x33 31M 1M",
            "flush",
        ],
    );
    // Keep a copy of the volume as it is now.
    let before = d.data().join("before.raw");
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw", &uri])
        .arg(&before))
    .ok();
    d.ok(&["snapshot", "create", "vol", "s1", "--label", "app=test"]);
    qemu_io(
        &uri,
        &[
            "write -P 0x44 0 2M",
            "write -z 5M 1M",
            "discard 31M 1M",
            "flush",
        ],
    );
    qemu_io(
        &uri,
        &[
            "read -P 0x44 0 2M",
            "read -P 0x11 2M 2M",
            "read -P 0 5M 1M",
            "read -P 0 31M 1M",
        ],
    );
    let snap = d.attach(&["snapshot", "attach", "vol", "s1"]);
    assert!(
        compare(before.to_str().unwrap(), &snap),
        "the snapshot export differs from the volume as it was"
    );
    assert!(
        !compare(before.to_str().unwrap(), &uri),
        "the volume should have changed"
    );
    d.ok(&["clone", "create", "cl", "--from-snapshot", "vol/s1"]);
    let clone = d.attach(&["volume", "attach", "cl"]);
    assert!(
        compare(&snap, &clone),
        "the linked clone differs from its snapshot"
    );
    // Writing the clone leaves the snapshot alone.
    qemu_io(&clone, &["write -P 0x55 0 1M", "flush"]);
    assert!(compare(before.to_str().unwrap(), &snap));
    // A full clone is independent and equal.
    d.ok(&[
        "clone",
        "create",
        "full",
        "--from-snapshot",
        "vol/s1",
        "--full",
    ]);
    let full = d.attach(&["volume", "attach", "full"]);
    assert!(
        compare(&snap, &full),
        "the full clone differs from its snapshot"
    );
    // Revert brings the volume back to the snapshot.
    d.ok(&["volume", "detach", "vol"]);
    d.ok(&["snapshot", "revert", "vol", "s1"]);
    let uri = d.attach(&["volume", "attach", "vol"]);
    assert!(
        compare(before.to_str().unwrap(), &uri),
        "revert did not restore the snapshot"
    );
}

#[test]
fn fio_verifies_through_snapshots_and_clones() {
    need("fio", "fio");
    let d = LAMINA.start();
    d.ok(&["volume", "create", "fio", "--size", "64MiB"]);
    let uri = d.attach(&["volume", "attach", "fio"]);
    let job = |uri: &str, extra: &[&str]| {
        let mut c = Command::new("fio");
        c.args([
            "--name=lamina",
            "--ioengine=nbd",
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=32",
            "--size=32m",
            "--verify=crc32c",
            "--randseed=1234",
            "--verify_state_save=0",
            "--output-format=json",
        ])
        .arg(format!("--uri={uri}"))
        .args(extra);
        fio_report(&mut c)
    };
    // First pass writes (and verifies) its pattern.
    job(&uri, &["--do_verify=1"]);
    d.ok(&["snapshot", "create", "fio", "first"]);
    // A second pass with another seed overwrites much of it.
    let mut c = Command::new("fio");
    c.args([
        "--name=over",
        "--ioengine=nbd",
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=16",
        "--size=32m",
        "--randseed=999",
    ])
    .arg(format!("--uri={uri}"));
    run(&mut c).ok();
    // The snapshot, and a clone of it, still verify against the first pass.
    let snap = d.attach(&["snapshot", "attach", "fio", "first"]);
    job(&snap, &["--verify_only"]);
    d.ok(&[
        "clone",
        "create",
        "fioclone",
        "--from-snapshot",
        "fio/first",
    ]);
    let clone = d.attach(&["volume", "attach", "fioclone"]);
    job(&clone, &["--verify_only"]);
}
