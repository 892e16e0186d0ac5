//! The `lamina` CLI against the real daemon (`lamina serve` as a child
//! process): volumes, snapshots and their tree, output formats, errors.

use lamina_test_support::*;

const LAMINA: Lamina = Lamina::new(env!("CARGO_BIN_EXE_lamina"));

#[test]
fn volumes_in_table_json_and_yaml() {
    let d = LAMINA.start();

    let out = d.ok(&["volume", "create", "vol-a", "--size", "10GiB"]);
    assert!(
        out.contains("created volume vol-a") && out.contains("10.0 GiB"),
        "{out}"
    );
    // Idempotent: the same name and size again succeeds.
    let out = d.ok(&["volume", "create", "vol-a", "--size", "10GiB"]);
    assert!(
        out.contains("vol-a") && out.contains("exists already"),
        "{out}"
    );
    // Another size under the same name does not.
    let err = d.err(&["volume", "create", "vol-a", "--size", "1GiB"]);
    assert!(
        err.starts_with("error: ") && err.contains("already exists"),
        "{err}"
    );
    assert!(err.contains("\nhint: "), "{err}");
    d.ok(&["volume", "create", "vol-b", "--size", "512MiB"]);

    // Table: a header and aligned rows with human sizes.
    let table = d.ok(&["volume", "list"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("SIZE"),
        "{table}"
    );
    let size_col = lines[0].find("SIZE").unwrap();
    assert!(
        lines[1].starts_with("vol-a") && lines[1][size_col..].starts_with("10.0 GiB"),
        "{table}"
    );
    assert!(
        lines[2].starts_with("vol-b") && lines[2][size_col..].starts_with("512.0 MiB"),
        "{table}"
    );

    // JSON: what the API returned.
    let list = d.json(&["volume", "list"]);
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["vol-a", "vol-b"]);
    let v = d.json(&["volume", "get", "vol-a"]);
    assert_eq!(v["size"], 10u64 << 30);
    assert_eq!(v["clone_state"], "none");

    // YAML: the same.
    let y = d.ok(&["volume", "get", "vol-a", "-o", "yaml"]);
    assert!(
        y.contains("name: vol-a\n") && y.contains(&format!("size: {}\n", 10u64 << 30)),
        "{y}"
    );
    assert!(y.contains("clone_state: none\n"), "{y}");
    let y = d.ok(&["-o", "yaml", "volume", "list"]);
    assert!(y.starts_with("- ") && y.contains("name: vol-b"), "{y}");

    let g = d.ok(&["volume", "get", "vol-b"]);
    assert!(
        g.contains("Name:") && g.contains("vol-b") && g.contains("512.0 MiB"),
        "{g}"
    );
    assert!(g.contains("Clone state:") && g.contains("none"), "{g}");

    // Expand, then shrinking is refused.
    let out = d.ok(&["volume", "expand", "vol-b", "--size", "1GiB"]);
    assert!(out.contains("1.0 GiB"), "{out}");
    assert_eq!(d.json(&["volume", "get", "vol-b"])["size"], 1u64 << 30);
    d.err(&["volume", "expand", "vol-b", "--size", "1MiB"]);

    // A 256-character name: refused with the naming rule.
    let long = "a".repeat(256);
    let err = d.err(&["volume", "create", &long, "--size", "1MiB"]);
    assert!(
        err.starts_with("error: ") && err.contains("1 to 255 characters"),
        "{err}"
    );
    // 255 is fine.
    d.ok(&["volume", "create", &"b".repeat(255), "--size", "1MiB"]);

    // A bad size is a usage error (exit 2) that says what sizes look like.
    let err = d
        .lamina(&["volume", "create", "vol-c", "--size", "10parsecs"])
        .fails(2);
    assert!(err.contains("10parsecs") && err.contains("GiB"), "{err}");
    let err = d
        .lamina(&["volume", "create", "vol-c", "--size", "-1"])
        .fails(2);
    assert!(err.contains("-1"), "{err}");

    // Unknown volume: exit 1 with the API's message and hint.
    let err = d.err(&["volume", "get", "nope"]);
    assert!(err.starts_with("error: ") && err.contains("nope"), "{err}");
    assert!(
        err.contains("hint: ") && err.contains("lamina volume list"),
        "{err}"
    );

    let out = d.ok(&["volume", "delete", "vol-b"]);
    assert!(out.contains("deleted volume vol-b"), "{out}");
    assert_eq!(d.json(&["volume", "list"]).as_array().unwrap().len(), 2);

    // A second daemon on the same data directory is refused; the first goes on.
    let err = d.lamina(&["serve"]).fails(1);
    assert!(
        err.contains("another Lamina daemon is already serving"),
        "{err}"
    );
    assert!(
        !err.contains("replaying log"),
        "it must not open the pool: {err}"
    );
    d.ok(&["volume", "get", "vol-a"]);

    let status = d.ok(&["status"]);
    assert!(status.contains(d.data().to_str().unwrap()), "{status}");
    d.stop_cleanly();
}

#[test]
fn snapshots_labels_tree_revert_and_delete() {
    let d = LAMINA.start();
    d.ok(&["volume", "create", "db", "--size", "64MiB"]);

    let out = d.ok(&[
        "snapshot",
        "create",
        "db",
        "base",
        "--label",
        "app=postgres",
        "--label",
        "tier=gold",
    ]);
    assert!(out.contains("created snapshot db/base"), "{out}");
    // Idempotent too, with the same labels; other labels are a conflict.
    d.ok(&[
        "snapshot",
        "create",
        "db",
        "base",
        "--label",
        "app=postgres",
        "--label",
        "tier=gold",
    ]);
    let err = d.lamina(&["snapshot", "create", "db", "base"]).fails(4);
    assert!(err.contains("already exists with other labels"), "{err}");
    let err = d
        .lamina(&["snapshot", "create", "db", "x", "--label", "novalue"])
        .fails(2);
    assert!(err.contains("KEY=VALUE"), "{err}");

    d.ok(&["snapshot", "create", "db", "second"]);
    d.ok(&["volume", "create", "other", "--size", "1MiB"]);
    d.ok(&["snapshot", "create", "other", "o1"]);

    let s = d.json(&["snapshot", "get", "db", "base"]);
    assert_eq!(s["labels"]["app"], "postgres");
    assert_eq!(s["labels"]["tier"], "gold");
    assert_eq!(s["restore_size"], 64u64 << 20);
    let g = d.ok(&["snapshot", "get", "db", "base"]);
    assert!(
        g.contains("app=postgres,tier=gold") && g.contains("64.0 MiB"),
        "{g}"
    );

    let list = d.ok(&["snapshot", "list", "db"]);
    assert!(
        list.starts_with("VOLUME") && list.contains("base") && list.contains("second"),
        "{list}"
    );
    assert!(!list.contains("o1"), "{list}");
    let all = d.json(&["snapshot", "list"]);
    let mut names: Vec<String> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            format!(
                "{}/{}",
                s["volume"].as_str().unwrap(),
                s["name"].as_str().unwrap()
            )
        })
        .collect();
    names.sort();
    assert_eq!(names, ["db/base", "db/second", "other/o1"]);

    // Revert to base, then a snapshot there: the tree branches.
    let out = d.ok(&["snapshot", "revert", "db", "base"]);
    assert!(out.contains("reverted volume db to snapshot base"), "{out}");
    assert_eq!(d.json(&["volume", "get", "db"])["parent_snapshot"], "base");
    d.ok(&["snapshot", "create", "db", "third"]);
    let tree = d.ok(&["snapshot", "tree", "db"]);
    let lines: Vec<&str> = tree.lines().collect();
    assert!(lines[0].starts_with("db (64.0 MiB"), "{tree}");
    assert!(
        lines[1].contains("CREATED")
            && lines[1].contains("RESTORE SIZE")
            && lines[1].contains("EXCLUSIVE"),
        "{tree}"
    );
    assert!(lines[2].starts_with("○ base "), "{tree}");
    assert!(lines[3].starts_with("├── ○ second "), "{tree}");
    assert!(lines[4].starts_with("└── ○ third "), "{tree}");
    assert!(lines[5].starts_with("    └── ● (live volume)"), "{tree}");
    assert!(
        lines[2].contains("64.0 MiB") && lines[2].contains(" 20"),
        "restore size and date: {tree}"
    );
    let t = d.json(&["snapshot", "tree", "db"]);
    assert_eq!(t["volume"]["name"], "db");
    assert_eq!(t["snapshots"].as_array().unwrap().len(), 3);

    let out = d.ok(&["snapshot", "delete", "db", "second"]);
    assert!(out.contains("deleted snapshot db/second"), "{out}");
    d.err(&["snapshot", "get", "db", "second"]);
    let tree = d.ok(&["snapshot", "tree", "db"]);
    assert!(
        !tree.contains("second") && tree.contains("third") && tree.contains("(live volume)"),
        "{tree}"
    );

    let out = d.ok(&["volume", "delete", "db", "--with-snapshots"]);
    assert!(out.contains("deleted volume db"), "{out}");
    d.err(&["volume", "get", "db"]);
    let left = d.json(&["snapshot", "list"]);
    assert_eq!(left.as_array().unwrap().len(), 1, "{left}");

    // Without --with-snapshots the snapshots stay, under the old name and
    // id; the name is free at once, and `NAME@ID` names the deleted volume.
    d.ok(&["volume", "create", "keep", "--size", "16M"]);
    d.ok(&["snapshot", "create", "keep", "k1"]);
    let id = d.json(&["volume", "get", "keep"])["id"].as_u64().unwrap();
    let out = d.ok(&["volume", "delete", "keep"]);
    assert!(out.contains("snapshots of it stay"), "{out}");
    let kept = d.json(&["snapshot", "list", "keep"]);
    assert_eq!(kept[0]["name"], "k1", "{kept}");
    assert_eq!(kept[0]["volume_deleted"], true, "{kept}");
    assert_eq!(kept[0]["volume_id"], id, "{kept}");
    d.ok(&["volume", "create", "keep", "--size", "16M"]);
    let live = d.json(&["snapshot", "list", "keep"]);
    assert_eq!(live.as_array().unwrap().len(), 0, "the new keep's: {live}");
    let old = format!("keep@{id}");
    d.ok(&[
        "clone",
        "create",
        "restored",
        "--from-snapshot",
        &format!("{old}/k1"),
    ]);
    d.ok(&["snapshot", "delete", &old, "k1"]);
    d.err(&["snapshot", "list", &old]);
    d.ok(&["volume", "delete", "restored"]);
    d.ok(&["volume", "delete", "keep"]);

    // Operations were recorded.
    let ops = d.json(&["operation", "list"]);
    let first = ops.as_array().unwrap()[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let o = d.json(&["operation", "get", &first]);
    assert_eq!(o["state"], "succeeded");
    let table = d.ok(&["operation", "list"]);
    assert!(
        table.starts_with("ID") && table.contains("create-snapshot"),
        "{table}"
    );
    d.stop_cleanly();
}

#[test]
fn daemon_not_running() {
    let dir = tempfile::tempdir().unwrap();
    let o = run(LAMINA
        .cmd()
        .arg("--data-dir")
        .arg(dir.path())
        .args(["volume", "list"]));
    let err = o.fails(1);
    let sock = dir.path().join("api.sock");
    assert!(
        err.starts_with("error: cannot reach the Lamina daemon at "),
        "{err}"
    );
    assert!(err.contains(sock.to_str().unwrap()), "{err}");
    assert!(err.contains("lamina serve --data-dir"), "{err}");

    // The data directory from the environment works the same.
    let o = run(LAMINA
        .cmd()
        .env("LAMINA_DATA_DIR", dir.path())
        .args(["snapshot", "list"]));
    assert!(o.fails(1).contains(sock.to_str().unwrap()));

    // Nothing listens on this endpoint.
    let ep = format!("http://127.0.0.1:{}", free_port());
    let o = run(LAMINA
        .cmd()
        .args(["--endpoint", &ep, "--token", "x", "volume", "list"]));
    let err = o.fails(1);
    assert!(
        err.contains("cannot reach the Lamina daemon at") && err.contains(&ep),
        "{err}"
    );
}

#[test]
fn pool_tools_still_work() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("pool");
    let out = run(LAMINA.cmd().args(["pool", "create"]).arg(&pool)).ok();
    assert!(out.contains("created pool"), "{out}");
    let out = run(LAMINA.cmd().args(["pool", "check"]).arg(&pool)).ok();
    assert!(out.trim_end().ends_with("ok"), "{out}");
    run(LAMINA.cmd().args(["pool", "stats"]).arg(&pool)).ok();
}

#[test]
fn the_token_can_come_from_a_file_the_daemon_only_reads() {
    // The chart mounts the token Secret outside the data directory and
    // passes --token-file: the daemon takes its token from there, and
    // writes no DATA/token.
    let secret = tempfile::tempdir().unwrap();
    let file = secret.path().join("token");
    std::fs::write(&file, "from-the-secret-0123456789abcdef\n").unwrap();
    let file = file.to_str().unwrap().to_string();
    let mut tries = 0;
    let (d, port) = loop {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        match LAMINA.start_with(&["--listen", &listen, "--token-file", &file]) {
            Ok(d) => break (d, port),
            Err(StartError::Exited { log, .. }) if tries < 3 && log.contains("bind") => tries += 1,
            Err(e) => panic!("lamina serve --token-file did not start: {e}"),
        }
    };
    assert!(
        !d.data().join("token").exists(),
        "the daemon wrote DATA/token"
    );
    let ep = format!("http://127.0.0.1:{port}");
    let o = run(LAMINA.cmd().args([
        "--endpoint",
        &ep,
        "--token",
        "from-the-secret-0123456789abcdef",
        "volume",
        "list",
    ]));
    o.ok();
    let o = run(LAMINA
        .cmd()
        .args(["--endpoint", &ep, "--token", "not-it", "volume", "list"]));
    assert!(o.fails(7).contains("token"));
    d.stop_cleanly();

    // An empty token file, or none: the daemon does not start, and says why.
    let empty = secret.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    for (f, says) in [
        (empty.to_str().unwrap(), "is empty"),
        ("/nonexistent/token", "/nonexistent/token"),
    ] {
        match LAMINA.start_with(&["--listen", "127.0.0.1:0", "--token-file", f]) {
            Err(StartError::Exited { log, .. }) => assert!(log.contains(says), "{log}"),
            Ok(_) => panic!("lamina serve started with the token file {f}"),
            Err(e) => panic!("{e}"),
        }
    }
    // Without --listen it has nothing to guard: refused by the command line.
    let o = run(LAMINA.cmd().args(["serve", "--token-file", "/x"]));
    assert!(o.fails(2).contains("--listen"));
}

#[test]
fn tcp_needs_the_token() {
    // The port is free when picked; another process may take it before the
    // daemon binds it, so try a few.
    let mut tries = 0;
    let (d, port) = loop {
        let port = free_port();
        match LAMINA.start_with(&["--listen", &format!("127.0.0.1:{port}")]) {
            Ok(d) => break (d, port),
            Err(StartError::Exited { log, .. }) if tries < 3 && log.contains("bind") => tries += 1,
            Err(e) => panic!("lamina serve --listen did not start: {e}"),
        }
    };
    let ep = format!("http://127.0.0.1:{port}");
    let token =
        std::fs::read_to_string(d.data().join("token")).expect("the daemon writes DATA/token");
    let token = token.trim();
    assert!(token.len() >= 32, "{token:?}");
    d.ok(&["volume", "create", "net", "--size", "1MiB"]);

    // From another directory (no token file there), without a token: refused.
    let elsewhere = tempfile::tempdir().unwrap();
    let o = run(LAMINA.cmd().arg("--data-dir").arg(elsewhere.path()).args([
        "--endpoint",
        &ep,
        "volume",
        "list",
    ]));
    let err = o.fails(7);
    assert!(err.starts_with("error: ") && err.contains("token"), "{err}");
    assert!(err.contains("hint: ") && err.contains("--token"), "{err}");

    // A wrong token: refused.
    let o = run(LAMINA.cmd().args([
        "--endpoint",
        &ep,
        "--token",
        "not-the-token",
        "volume",
        "list",
    ]));
    let err = o.fails(7);
    assert!(err.contains("token"), "{err}");

    // The right one, as an option and from the environment.
    let o = run(LAMINA
        .cmd()
        .args(["--endpoint", &ep, "--token", token, "volume", "list"]));
    assert!(o.ok().contains("net"));
    let o = run(LAMINA
        .cmd()
        .env("LAMINA_ENDPOINT", &ep)
        .env("LAMINA_TOKEN", token)
        .args(["-o", "json", "volume", "get", "net"]));
    let v: serde_json::Value = serde_json::from_str(&o.ok()).unwrap();
    assert_eq!(v["size"], 1u64 << 20);

    // With an endpoint and no token, the token is read from DATA/token.
    let o = run(LAMINA.cmd().arg("--data-dir").arg(d.data()).args([
        "--endpoint",
        &ep,
        "volume",
        "list",
    ]));
    assert!(o.ok().contains("net"));
    d.stop_cleanly();
}
