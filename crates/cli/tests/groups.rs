//! `lamina snapshot create-group | get-group | delete-group` against a
//! running daemon, end to end through NBD: three attached volumes written by
//! qemu-io, a group snapshot, and every member read back (qemu-img compare)
//! equal to its volume as it was then, while the volumes have moved on.

use lamina_test_support::*;
use std::process::Command;

const LAMINA: Lamina = Lamina::new(env!("CARGO_BIN_EXE_lamina"));

fn compare(a: &str, b: &str) -> bool {
    qemu_img_compare(a, b).status.success()
}

#[test]
fn a_group_snapshot_holds_every_volume_as_it_was() {
    need("qemu-io", "qemu-utils");
    need("qemu-img", "qemu-utils");
    let d = LAMINA.start();
    let files = tempfile::tempdir().unwrap();
    let vols = ["db", "log", "idx"];
    let mut uris = Vec::new();
    for (i, v) in vols.iter().enumerate() {
        d.ok(&["volume", "create", v, "--size", "8M"]);
        let uri = d.attach(&["volume", "attach", v]);
        qemu_io(
            &uri,
            &[
                &format!("write -P {} 0 1M", 0x21 + i),
                &format!("write -P {} 5M 64k", 0x41 + i),
            ],
        );
        uris.push(uri);
    }
    // What each volume holds at the instant of the group, kept aside.
    let saved: Vec<String> = vols
        .iter()
        .zip(&uris)
        .map(|(v, uri)| {
            let f = files.path().join(format!("{v}.raw"));
            run(Command::new("qemu-img")
                .args(["convert", "-f", "raw", "-O", "raw", uri])
                .arg(&f))
            .ok();
            f.display().to_string()
        })
        .collect();

    let out = d.ok(&[
        "snapshot",
        "create-group",
        "g1",
        "log",
        "db",
        "idx",
        "--label",
        "app=pg",
    ]);
    assert!(
        out.contains("created group snapshot g1 of db, idx, log"),
        "{out}"
    );
    // The volumes move on.
    for uri in &uris {
        qemu_io(uri, &["write -P 0x99 0 2M", "write -P 0x98 7M 4k"]);
    }
    for ((v, uri), file) in vols.iter().zip(&uris).zip(&saved) {
        let member = d.attach(&["snapshot", "attach", v, "g1"]);
        assert!(compare(&member, file), "{v}@g1 differs from {v} as it was");
        assert!(!compare(uri, file), "{v} should have moved on");
    }

    // Asking again: the same group, said so; JSON and YAML documents.
    let out = d.ok(&[
        "snapshot",
        "create-group",
        "g1",
        "idx",
        "db",
        "log",
        "--label",
        "app=pg",
    ]);
    assert!(out.contains("exists already"), "{out}");
    let g = d.json(&["snapshot", "get-group", "g1"]);
    assert_eq!(g["name"], "g1");
    let members = g["snapshots"].as_array().unwrap();
    let names: Vec<&str> = members
        .iter()
        .map(|m| m["volume"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["db", "idx", "log"]);
    for m in members {
        assert_eq!(m["created"], g["created"], "{g}");
        assert_eq!(m["labels"]["app"], "pg");
        assert_eq!(m["labels"]["lamina.io/group"], "g1");
    }
    let y = d.ok(&["snapshot", "get-group", "g1", "-o", "yaml"]);
    assert!(
        y.contains("name: g1") && y.contains("lamina.io/group: g1"),
        "{y}"
    );
    let t = d.ok(&["snapshot", "get-group", "g1"]);
    assert!(t.contains("Group:") && t.contains("db, idx, log"), "{t}");

    // Another spec under that name: refused, naming the clash.
    let e = d.err(&["snapshot", "create-group", "g1", "db", "log"]);
    assert!(e.contains("already exists") && e.contains("idx"), "{e}");
    let e = d.err(&["snapshot", "get-group", "nope"]);
    assert!(e.contains("no group snapshot \"nope\""), "{e}");

    // Delete: refused while members are attached; then all go, and again is
    // a success that says there was nothing.
    let e = d.err(&["snapshot", "delete-group", "g1"]);
    assert!(
        e.contains("attached") && e.contains("lamina snapshot detach"),
        "{e}"
    );
    for v in vols {
        d.ok(&["snapshot", "detach", v, "g1"]);
    }
    let out = d.ok(&["snapshot", "delete-group", "g1"]);
    assert!(out.contains("deleted group snapshot g1"), "{out}");
    let r = d.json(&["snapshot", "delete-group", "g1"]);
    assert_eq!(r["existed"], false, "{r}");
    assert!(d.json(&["snapshot", "list"]).as_array().unwrap().is_empty());
    let ops = d.json(&["operation", "list", "--volume", "idx"]);
    let kinds: Vec<&str> = ops
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"create-snapshot-group") && kinds.contains(&"delete-snapshot-group"),
        "{kinds:?}"
    );
    d.stop_cleanly();
}
