//! Attach, linked and full clones, flatten, driven through the CLI, with
//! data written and checked over NBD by system tools (qemu-io, qemu-img
//! from qemu-utils; nbdinfo from libnbd-bin).

use lamina_test_support::*;
use std::process::Command;

const LAMINA: Lamina = Lamina::new(env!("CARGO_BIN_EXE_lamina"));

/// The volume's attach URI from table output (the URI alone on its line).
fn attach(d: &Daemon, args: &[&str]) -> String {
    let out = d.ok(args);
    assert_eq!(out.lines().count(), 1, "{out:?}");
    out.trim_end().to_string()
}

#[test]
fn attach_prints_a_uri_nbdinfo_accepts() {
    need("nbdinfo", "libnbd-bin");
    let d = LAMINA.start();
    d.ok(&["volume", "create", "disk", "--size", "16MiB"]);
    let uri = attach(&d, &["volume", "attach", "disk"]);
    assert!(uri.starts_with("nbd+unix://"), "{uri}");
    assert!(
        uri.contains(d.data().join("nbd.sock").to_str().unwrap()),
        "{uri}"
    );
    // Attaching again gives the same export.
    assert_eq!(attach(&d, &["volume", "attach", "disk"]), uri);
    let e = d.json(&["volume", "attach", "disk"]);
    assert_eq!(e["uri"], uri.as_str());
    assert_eq!(e["read_only"], false);

    let info: serde_json::Value =
        serde_json::from_str(&run(Command::new("nbdinfo").args(["--json", &uri])).ok()).unwrap();
    assert_eq!(info["exports"][0]["export-size"], 16u64 << 20, "{info}");
    let size = run(Command::new("nbdinfo").args(["--size", &uri])).ok();
    assert_eq!(size.trim(), (16u64 << 20).to_string());

    let g = d.ok(&["volume", "get", "disk"]);
    assert!(g.contains(&uri), "{g}");
    // An attached volume is not deleted.
    let err = d.err(&["volume", "delete", "disk"]);
    assert!(err.contains("attached") && err.contains("hint: "), "{err}");

    // A snapshot exports read-only.
    d.ok(&["snapshot", "create", "disk", "s1"]);
    let s = d.json(&["snapshot", "attach", "disk", "s1"]);
    assert_eq!(s["read_only"], true);
    let suri = s["uri"].as_str().unwrap().to_string();
    let ro = run(Command::new("nbdinfo").args(["--json", &suri])).ok();
    let ro: serde_json::Value = serde_json::from_str(&ro).unwrap();
    assert_eq!(ro["exports"][0]["is_read_only"], true, "{ro}");
    let out = d.ok(&["snapshot", "detach", "disk", "s1"]);
    assert!(out.contains("detached snapshot disk/s1"), "{out}");

    let out = d.ok(&["volume", "detach", "disk"]);
    assert!(out.contains("detached volume disk"), "{out}");
    assert_eq!(
        d.json(&["volume", "get", "disk"])["export"],
        serde_json::Value::Null
    );
    // Detaching what is not attached succeeds (callers such as CSI retry).
    d.ok(&["volume", "detach", "disk"]);
    d.stop_cleanly();
}

#[test]
fn linked_and_full_clones() {
    need("qemu-io", "qemu-utils");
    need("qemu-img", "qemu-utils");
    let d = LAMINA.start();
    d.ok(&["volume", "create", "src", "--size", "32MiB"]);
    let src = attach(&d, &["volume", "attach", "src"]);
    qemu_io(
        &src,
        &[
            "write -P 0xab 0 1M",
            "write -P 0xcd 8M 3M",
            "write -P 0x5a 31M 1M",
            "flush",
        ],
    );
    d.ok(&["snapshot", "create", "src", "gold"]);
    // Written after the snapshot: in no clone of it.
    qemu_io(&src, &["write -P 0xee 0 64k", "flush"]);

    // Linked: instant, shares the snapshot's blocks.
    let out = d.ok(&["clone", "create", "linked", "--from-snapshot", "src/gold"]);
    assert!(
        out.contains("created linked clone linked of src/gold"),
        "{out}"
    );
    let v = d.json(&["volume", "get", "linked"]);
    assert_eq!(v["clone_state"], "linked");
    assert_eq!(v["origin"]["volume"], "src");
    assert_eq!(v["origin"]["snapshot"], "gold");
    let g = d.ok(&["volume", "get", "linked"]);
    assert!(g.contains("src/gold") && g.contains("linked"), "{g}");
    let linked = attach(&d, &["volume", "attach", "linked"]);
    qemu_io(
        &linked,
        &[
            "read -P 0xab 0 1M",
            "read -P 0xcd 8M 3M",
            "read -P 0x5a 31M 1M",
            "read -P 0 1M 7M",
        ],
    );

    d.ok(&["volume", "detach", "src"]);

    let src = attach(&d, &["volume", "attach", "src"]);

    // Full: a 202 and an operation the CLI follows to its end.
    let out = d.ok(&[
        "clone",
        "create",
        "full",
        "--from-snapshot",
        "src/gold",
        "--full",
    ]);
    assert!(out.contains("created full clone full of src/gold"), "{out}");
    let v = d.json(&["volume", "get", "full"]);
    assert_ne!(v["clone_state"], "copying", "{v}");
    assert_eq!(v["operation"], serde_json::Value::Null, "{v}");
    let full = attach(&d, &["volume", "attach", "full"]);
    let gold = d.json(&["snapshot", "attach", "src", "gold"])["uri"]
        .as_str()
        .unwrap()
        .to_string();
    let cmp =
        run(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw", &gold, &full]));
    assert!(cmp.status.success(), "qemu-img compare gold full: {cmp:?}");
    qemu_io(
        &full,
        &[
            "read -P 0xab 0 1M",
            "read -P 0xcd 8M 3M",
            "read -P 0x5a 31M 1M",
        ],
    );
    // The live source differs (written after the snapshot).
    let cmp =
        run(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw", &src, &full]));
    assert_eq!(
        cmp.code(),
        Some(1),
        "qemu-img compare src full should differ: {cmp:?}"
    );

    // The operation is listed, succeeded, with its bytes.
    let ops = d.json(&["operation", "list"]);
    let op = ops
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["volume"] == "full" && o["kind"] == "full-clone")
        .expect("the full clone's operation")
        .clone();
    assert_eq!(op["state"], "succeeded", "{op}");
    assert_eq!(op["done_bytes"], op["total_bytes"], "{op}");
    assert!(op["total_bytes"].as_u64().unwrap() >= 5 << 20, "{op}");
    let shown = d.ok(&["operation", "get", op["id"].as_str().unwrap()]);
    assert!(
        shown.contains("succeeded") && shown.contains("100%"),
        "{shown}"
    );

    // Full from the live volume, in JSON, then without waiting.
    let j = d.json(&["clone", "create", "full2", "--from-volume", "src", "--full"]);
    assert_eq!(j["operation"]["state"], "succeeded", "{j}");
    assert_eq!(j["volume"]["name"], "full2", "{j}");
    let full2 = attach(&d, &["volume", "attach", "full2"]);
    let cmp =
        run(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw", &src, &full2]));
    assert!(cmp.status.success(), "qemu-img compare src full2: {cmp:?}");
    let j = d.json(&[
        "clone",
        "create",
        "full3",
        "--from-snapshot",
        "src/gold",
        "--full",
        "--no-wait",
    ]);
    let id = j["operation"]["id"]
        .as_str()
        .expect("an operation id")
        .to_string();
    let done = d.json(&["operation", "wait", &id]);
    assert_eq!(done["state"], "succeeded", "{done}");

    // A source that does not exist: exit 1 with the API's message.
    let err = d.err(&[
        "clone",
        "create",
        "bad",
        "--from-snapshot",
        "src/nope",
        "--full",
    ]);
    assert!(err.contains("nope"), "{err}");
    // Exactly one source.
    d.lamina(&["clone", "create", "bad"]).fails(2);
    d.lamina(&[
        "clone",
        "create",
        "bad",
        "--from-snapshot",
        "src/gold",
        "--from-volume",
        "src",
    ])
    .fails(2);

    // Flatten the linked clone; then the origin can go.
    d.ok(&["volume", "detach", "linked"]);
    let out = d.ok(&["volume", "flatten", "linked", "--wait"]);
    assert!(out.contains("independent"), "{out}");
    let v = d.json(&["volume", "get", "linked"]);
    assert_eq!(v["clone_state"], "independent", "{v}");
    let linked = attach(&d, &["volume", "attach", "linked"]);
    let cmp =
        run(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw", &gold, &linked]));
    assert!(
        cmp.status.success(),
        "qemu-img compare gold linked: {cmp:?}"
    );
    d.ok(&["snapshot", "detach", "src", "gold"]);
    d.ok(&["volume", "detach", "src"]);
    d.ok(&["volume", "delete", "src", "--with-snapshots"]);
    qemu_io(&linked, &["read -P 0xab 0 1M", "read -P 0xcd 8M 3M"]);
    d.stop_cleanly();
}
