//! Volume labels end to end: set at create, changed with `volume label`,
//! selected with `volume list --selector`, refused when reserved or
//! malformed (changing nothing), and kept across a kill -9 of the daemon.

use lamina_test_support::*;

const LAMINA: Lamina = Lamina::new(env!("CARGO_BIN_EXE_lamina"));

fn names(v: &serde_json::Value) -> Vec<String> {
    let mut n: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap().to_string())
        .collect();
    n.sort();
    n
}

#[test]
fn volume_labels_select_change_and_survive_a_kill() {
    let mut d = LAMINA.start();
    d.ok(&[
        "volume",
        "create",
        "db",
        "--size",
        "8M",
        "--label",
        "tier=gold",
        "--label",
        "app=shop",
    ]);
    d.ok(&[
        "volume",
        "create",
        "web",
        "--size",
        "8M",
        "--label",
        "tier=gold",
    ]);
    d.ok(&["volume", "create", "tmp", "--size", "8M"]);
    let v = d.json(&["volume", "get", "db"]);
    assert_eq!(
        v["labels"],
        serde_json::json!({"app": "shop", "tier": "gold"})
    );
    // The same create again is no change; other labels under the name are refused.
    d.ok(&[
        "volume",
        "create",
        "db",
        "--size",
        "8M",
        "--label",
        "app=shop",
        "--label",
        "tier=gold",
    ]);
    let e = d.err(&[
        "volume",
        "create",
        "db",
        "--size",
        "8M",
        "--label",
        "tier=silver",
    ]);
    assert!(e.contains("other labels"), "{e}");

    assert_eq!(
        names(&d.json(&["volume", "list", "--selector", "tier=gold"])),
        ["db", "web"]
    );
    assert_eq!(
        names(&d.json(&["volume", "list", "--selector", "tier=gold,app=shop"])),
        ["db"]
    );
    assert!(names(&d.json(&["volume", "list", "--selector", "tier=bronze"])).is_empty());
    assert_eq!(names(&d.json(&["volume", "list"])).len(), 3);
    // A malformed selector is a usage error (exit 2), said plainly.
    let e = d.lamina(&["volume", "list", "--selector", "tier"]).fails(2);
    assert!(e.contains("key=value"), "{e}");

    // Set one, remove one; the others stay.
    d.ok(&["volume", "label", "db", "tier=silver", "app-", "owner=ana"]);
    let v = d.json(&["volume", "get", "db"]);
    assert_eq!(
        v["labels"],
        serde_json::json!({"owner": "ana", "tier": "silver"})
    );
    // Refused, changing nothing: the system's prefix, a malformed change,
    // labels too long, a volume that is not there.
    let e = d.err(&["volume", "label", "db", "lamina.io/schedule=sch-1"]);
    assert!(e.contains("lamina.io/"), "{e}");
    let e = d.err(&[
        "volume",
        "create",
        "x",
        "--size",
        "8M",
        "--label",
        "lamina.io/x=1",
    ]);
    assert!(e.contains("lamina.io/"), "{e}");
    let long = format!("k={}", "v".repeat(3000));
    d.err(&["volume", "label", "db", &long]);
    d.err(&["volume", "label", "db", "novalue"]);
    d.err(&["volume", "label", "nope", "a=b"]);
    assert_eq!(
        d.json(&["volume", "get", "db"])["labels"],
        serde_json::json!({"owner": "ana", "tier": "silver"})
    );
    d.err(&["volume", "get", "x"]);

    d.kill9();
    d.start_again();
    assert_eq!(
        d.json(&["volume", "get", "db"])["labels"],
        serde_json::json!({"owner": "ana", "tier": "silver"})
    );
    assert_eq!(
        names(&d.json(&["volume", "list", "--selector", "tier=gold"])),
        ["web"]
    );
}
