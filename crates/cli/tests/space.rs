//! Space accounting and bulk pruning end to end: `lamina pool stats` and
//! `lamina snapshot delete VOL --selector/--older-than/--schedule` against a
//! real daemon, with the data written over NBD by qemu-io so that every
//! figure is checked against bytes actually written.

use lamina_test_support::*;
use serde_json::Value;
use std::time::{SystemTime, UNIX_EPOCH};

const LAMINA: Lamina = Lamina::new(env!("CARGO_BIN_EXE_lamina"));
const K: u64 = 1024;
const DAY: i64 = 86_400;

/// Run qemu-io commands on the volume, attached for the while.
fn write(d: &Daemon, volume: &str, cmds: &[&str]) {
    need("qemu-io", "qemu-utils");
    let uri = d.attach(&["volume", "attach", volume]);
    qemu_io(&uri, cmds);
    d.ok(&["volume", "detach", volume]);
}

fn pool(d: &Daemon) -> Value {
    d.json(&["pool", "stats"])
}

/// The data part of what only snapshots hold.
fn snapshot_only_data(p: &Value) -> u64 {
    p["snapshot_only_bytes"].as_u64().unwrap() - p["snapshot_only_metadata_bytes"].as_u64().unwrap()
}

fn names(v: &Value, key: &str) -> Vec<String> {
    v[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s.get("name")
                .or_else(|| s.get("snapshot"))
                .and_then(Value::as_str)
                .unwrap()
                .to_string()
        })
        .collect()
}

fn snapshots(d: &Daemon, volume: &str) -> Vec<String> {
    let mut v: Vec<String> = d
        .json(&["snapshot", "list", volume])
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn pool_stats_count_what_only_snapshots_hold() {
    let d = LAMINA.start();
    d.ok(&["volume", "create", "a", "--size", "64M"]);
    write(&d, "a", &["write -P 1 0 1M"]);
    let p = pool(&d);
    assert_eq!(snapshot_only_data(&p), 0, "no snapshot yet: {p}");
    d.ok(&["snapshot", "create", "a", "s1"]);
    assert_eq!(
        snapshot_only_data(&pool(&d)),
        0,
        "all shared with the volume"
    );
    // 256 KiB of s1's data is overwritten: s1 alone holds it now.
    write(&d, "a", &["write -P 2 0 256k"]);
    d.ok(&["snapshot", "create", "a", "s2"]);
    // 128 KiB of what s2 took is overwritten: s2 alone holds that.
    write(&d, "a", &["write -P 3 0 128k"]);
    let p = pool(&d);
    assert_eq!(snapshot_only_data(&p), 384 * K, "{p}");
    assert!(
        p["snapshot_only_metadata_bytes"].as_u64().unwrap() > 0,
        "{p}"
    );
    let (cap, used, free) = (
        p["capacity_bytes"].as_u64().unwrap(),
        p["used_bytes"].as_u64().unwrap(),
        p["free_bytes"].as_u64().unwrap(),
    );
    assert_eq!(cap, used + free, "{p}");
    assert!(used >= (1024 + 384) * K, "{p}");
    assert_eq!(
        (p["volumes"].as_u64(), p["snapshots"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(p["high_water"], "90%");
    let human = d.ok(&["pool", "stats"]);
    for field in [
        "Capacity:",
        "Used:",
        "Free:",
        "Held only by snapshots:",
        "High-water mark:",
    ] {
        assert!(human.contains(field), "{field}\n{human}");
    }
    // A linked clone of s1 maps s1's blocks: they are no longer held by
    // snapshots only.
    d.ok(&["clone", "create", "c", "--from-snapshot", "a/s1"]);
    assert_eq!(snapshot_only_data(&pool(&d)), 128 * K);
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[test]
fn bulk_delete_says_what_goes_what_stays_and_frees_exactly_that() {
    let t = now() + 8 * DAY;
    // The age filter reads the schedules' clock: set eight days ahead,
    // every snapshot taken now is older than a week.
    let clock = TestClock::new(t);
    let d = LAMINA.start_with(&["--test-clock", clock.arg()]).unwrap();
    d.ok(&["volume", "create", "a", "--size", "64M"]);
    write(&d, "a", &["write -P 1 0 1M"]);
    d.ok(&["snapshot", "create", "a", "gold", "--label", "tier=gold"]);
    write(&d, "a", &["write -P 6 0 256k"]); // gold's own from here
                                            // d1 and d2 are taken with nothing written between: the 256 KiB
                                            // overwritten after them is held by the two of them only, so neither
                                            // alone frees it, and deleting both does.
    d.ok(&["snapshot", "create", "a", "d1", "--label", "tier=bronze"]);
    d.ok(&["snapshot", "create", "a", "d2", "--label", "tier=bronze"]);
    write(&d, "a", &["write -P 2 0 256k"]);
    d.ok(&["snapshot", "create", "a", "d3", "--label", "tier=bronze"]);
    write(&d, "a", &["write -P 3 0 64k"]); // 64 KiB of d3's own
    d.ok(&["snapshot", "create", "a", "d4", "--label", "tier=bronze"]);
    write(&d, "a", &["write -P 4 512k 64k"]); // 64 KiB of d4's own...
    d.ok(&["clone", "create", "x", "--from-snapshot", "a/d4"]); // ...that x maps
    d.ok(&["snapshot", "create", "a", "manual"]);
    write(&d, "a", &["write -P 5 640k 64k"]); // 64 KiB of manual's own
    let all = snapshots(&d, "a");

    // Every filter is needed; none given is refused, as are a name with filters.
    let err = d.lamina(&["snapshot", "delete", "a"]).fails(2);
    assert!(err.contains("<NAME>"), "{err}");
    d.lamina(&["snapshot", "delete", "a", "d1", "--selector", "tier=bronze"])
        .fails(2);
    let err = d.err(&["snapshot", "delete", "a", "--schedule", "nope"]);
    assert!(err.contains("nope"), "{err}");
    let err = d.err(&["snapshot", "delete", "a", "--selector", "=x"]);
    assert!(err.contains("selector"), "{err}");

    // An age past what a clock can count matches nothing (not everything).
    let r = d.json(&[
        "snapshot",
        "delete",
        "a",
        "--older-than",
        "500000000000y",
        "--selector",
        "tier=bronze",
    ]);
    assert!(names(&r, "deleted").is_empty(), "{r}");
    // Nothing is a week and a day old yet.
    let r = d.json(&[
        "snapshot",
        "delete",
        "a",
        "--older-than",
        "9d",
        "--selector",
        "tier=bronze",
    ]);
    assert!(names(&r, "deleted").is_empty(), "{r}");
    assert_eq!(snapshots(&d, "a"), all);

    // The dry run lists what would go, what stays and why, and what it frees.
    let dry = d.json(&[
        "snapshot",
        "delete",
        "a",
        "--selector",
        "tier=bronze",
        "--older-than",
        "7d",
        "--dry-run",
    ]);
    assert_eq!(names(&dry, "deleted"), ["d1", "d2", "d3"], "{dry}");
    assert_eq!(names(&dry, "kept"), ["d4"], "{dry}");
    assert!(
        dry["kept"][0]["reason"].as_str().unwrap().contains('x'),
        "{dry}"
    );
    let exclusive: Vec<u64> = dry["deleted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["exclusive_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(exclusive, [0, 0, 64 * K], "{dry}");
    let freed = dry["freed_bytes"].as_u64().unwrap();
    // 256 KiB shared by d1 and d2 only, and d3's 64 KiB; plus their index
    // nodes (a few blocks each).
    assert!(
        (320 * K..320 * K + 16 * 4 * K).contains(&freed),
        "freed {freed}: {dry}"
    );
    assert_eq!(snapshots(&d, "a"), all, "a dry run deletes nothing");
    let human = d.ok(&[
        "snapshot",
        "delete",
        "a",
        "--selector",
        "tier=bronze",
        "--older-than",
        "7d",
        "--dry-run",
    ]);
    assert!(human.contains("would delete 3 snapshot(s) of a"), "{human}");
    assert!(human.contains("d4: linked clones depend on it"), "{human}");

    // The real thing frees what the dry run said, exactly: what only
    // snapshots hold drops by that much.
    let before = pool(&d)["snapshot_only_bytes"].as_u64().unwrap();
    let r = d.json(&[
        "snapshot",
        "delete",
        "a",
        "--selector",
        "tier=bronze",
        "--older-than",
        "7d",
    ]);
    assert_eq!(names(&r, "deleted"), ["d1", "d2", "d3"], "{r}");
    assert_eq!(r["freed_bytes"].as_u64(), Some(freed), "{r}");
    let after = pool(&d)["snapshot_only_bytes"].as_u64().unwrap();
    assert_eq!(before - after, freed);
    assert_eq!(snapshots(&d, "a"), ["d4", "gold", "manual"]);

    // A schedule's own snapshots, found by its id after a rename; the
    // manual and labelled ones stay.
    d.ok(&[
        "schedule",
        "create",
        "hourly",
        "--cron",
        "0 * * * *",
        "--keep",
        "30",
        "--volume",
        "a",
    ]);
    clock.set(t - t.rem_euclid(3600) + 3600 + 5);
    let made = wait_until(
        "a scheduled snapshot",
        lamina_test_support::COMMAND_LIMIT,
        || {
            let v = d.json(&["snapshot", "list", "a", "--schedule", "hourly"]);
            let v = v.as_array().unwrap();
            (v.len() == 1).then(|| v[0]["name"].as_str().unwrap().to_string())
        },
    );
    d.ok(&["schedule", "update", "hourly", "--rename", "every-hour"]);
    let r = d.json(&["snapshot", "delete", "a", "--schedule", "every-hour"]);
    assert_eq!(names(&r, "deleted"), [made], "{r}");
    assert_eq!(snapshots(&d, "a"), ["d4", "gold", "manual"]);
}

#[test]
fn each_export_counts_its_io_operations_bytes_and_latency() {
    need("qemu-io", "qemu-utils");
    let d = LAMINA.start();
    d.ok(&["volume", "create", "v", "--size", "16M"]);
    let uri = d.attach(&["volume", "attach", "v"]);
    qemu_io(
        &uri,
        &["write -P 1 0 64k", "write -P 2 64k 64k", "read -P 1 0 64k"],
    );
    let m = d.ok(&["metrics"]);
    let io = |family: &str, op: &str| {
        prometheus_sample(&m, family, &format!("volume=\"v\",op=\"{op}\"")).unwrap_or(0.0)
    };
    assert_eq!(io("lamina_volume_io_total", "write"), 2.0, "{m}");
    assert_eq!(io("lamina_volume_io_bytes_total", "write"), 131072.0, "{m}");
    assert_eq!(io("lamina_volume_io_errors_total", "write"), 0.0, "{m}");
    assert_eq!(
        io("lamina_volume_io_duration_seconds_count", "write"),
        2.0,
        "{m}"
    );
    // qemu-io may read more than it is told (nothing it is told is lost).
    assert!(io("lamina_volume_io_bytes_total", "read") >= 65536.0, "{m}");
    assert_eq!(
        io("lamina_volume_io_total", "read"),
        io("lamina_volume_io_duration_seconds_count", "read"),
        "{m}"
    );
    // A snapshot's export is counted apart; a detached export's series go.
    d.ok(&["snapshot", "create", "v", "s"]);
    let snap = d.attach(&["snapshot", "attach", "v", "s"]);
    let out = run(std::process::Command::new("qemu-io").args([
        "-r",
        "-f",
        "raw",
        &snap,
        "-c",
        "read -P 2 64k 64k",
    ]))
    .ok();
    assert!(!out.contains("fail"), "{out}");
    let m = d.ok(&["metrics"]);
    assert!(
        prometheus_sample(
            &m,
            "lamina_volume_io_bytes_total",
            "volume=\"v@s\",op=\"read\""
        )
        .unwrap()
            >= 65536.0,
        "{m}"
    );
    d.ok(&["volume", "detach", "v"]);
    let m = d.ok(&["metrics"]);
    assert!(!m.contains("volume=\"v\""), "{m}");
    assert!(m.contains("volume=\"v@s\""), "{m}");
}
