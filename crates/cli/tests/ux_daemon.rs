//! What a new user tripped on where the daemon had to change too: removals
//! of what is absent succeed, detach refuses while NBD clients are
//! connected, operations are filtered, clones are visible, hints name the
//! object. These need the daemon of issue 9 (the `Removed` answers, the
//! detach refusal, operation filters, `clones`, `connections`, exclusive
//! and shared bytes).

use lamina_test_support::*;
use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LAMINA: Lamina = Lamina::new(env!("CARGO_BIN_EXE_lamina"));

#[test]
fn removing_what_is_absent_succeeds() {
    let d = LAMINA.start();
    let out = d.ok(&["volume", "delete", "ghost"]);
    assert!(out.contains("volume ghost does not exist"), "{out}");
    let r = d.json(&["volume", "delete", "ghost"]);
    assert_eq!(r["existed"], false, "{r}");

    d.ok(&["volume", "create", "v", "--size", "1M"]);
    let out = d.ok(&["volume", "detach", "v"]);
    assert!(out.contains("volume v was not attached"), "{out}");
    let r = d.json(&["snapshot", "delete", "v", "nope"]);
    assert_eq!(r["existed"], false, "{r}");
    d.ok(&["snapshot", "create", "v", "s"]);
    let r = d.json(&["snapshot", "detach", "v", "s"]);
    assert_eq!(r["existed"], false, "{r}");

    // Twice in a row: the second finds nothing and succeeds.
    d.ok(&["volume", "attach", "v"]);
    assert_eq!(d.json(&["volume", "detach", "v"])["existed"], true);
    assert_eq!(d.json(&["volume", "detach", "v"])["existed"], false);
    d.stop_cleanly();
}

/// qemu-io connected to `uri`, waiting for commands on its stdin.
fn connected_client(uri: &str) -> Child {
    need("qemu-io", "qemu-utils");
    Command::new("qemu-io")
        .args(["-f", "raw", uri])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start qemu-io")
}

/// Ask until the volume's export counts `n` NBD clients.
#[track_caller]
fn wait_for_connections(d: &Daemon, volume: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = d.json(&["volume", "get", volume]);
        if v["export"]["connections"] == n {
            return;
        }
        assert!(Instant::now() < deadline, "never {n} clients: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn detach_refuses_while_clients_are_connected_unless_forced() {
    let d = LAMINA.start();
    d.ok(&["volume", "create", "v", "--size", "1M"]);
    let uri = d.ok(&["volume", "attach", "v"]).trim().to_string();
    let mut client = connected_client(&uri);
    wait_for_connections(&d, "v", 1);

    let g = d.ok(&["volume", "get", "v"]);
    assert!(g.contains("1 connected"), "{g}");

    // Expand: the connected client keeps the old size until it reconnects.
    let out = d.ok(&["volume", "expand", "v", "--size", "2M"]);
    assert!(
        out.contains("1 NBD client connected") && out.contains("until they reconnect"),
        "{out}"
    );
    let o = d.lamina(&["volume", "expand", "v", "--size", "3M", "-o", "json"]);
    let v: Value = serde_json::from_str(&o.stdout).expect("one document on stdout");
    assert_eq!(v["size"], 3u64 << 20);
    assert!(o.stderr.contains("until they reconnect"), "{}", o.stderr);

    // Detach: refused with the daemon's message and hint, one line each.
    let err = d.err(&["volume", "detach", "v"]);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(
        lines[1].starts_with("hint: ") && lines[1].contains("--force"),
        "{err}"
    );
    let out = d.ok(&["volume", "detach", "v", "--force"]);
    assert!(out.contains("detached volume v"), "{out}");

    drop(client.stdin.take());
    let _ = client.kill();
    let _ = client.wait();
    d.stop_cleanly();
}

#[test]
fn operations_are_filtered_newest_first() {
    let d = LAMINA.start();
    d.ok(&["volume", "create", "a", "--size", "1M"]);
    d.ok(&["volume", "create", "b", "--size", "1M"]);
    d.ok(&["snapshot", "create", "a", "s1"]);
    d.ok(&["snapshot", "create", "a", "s2"]);

    let ops = d.json(&["operation", "list", "--volume", "a"]);
    let ops = ops.as_array().unwrap();
    assert_eq!(ops.len(), 3, "{ops:?}");
    assert!(ops.iter().all(|o| o["volume"] == "a"), "{ops:?}");
    let kinds: Vec<&str> = ops.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["create-snapshot", "create-snapshot", "create-volume"],
        "newest first"
    );
    let newest = d.json(&["operation", "list", "--limit", "1"]);
    assert_eq!(newest.as_array().unwrap().len(), 1, "{newest}");
    assert_eq!(newest[0]["id"], ops[0]["id"], "{newest}");
    let ok = d.json(&["operation", "list", "--state", "succeeded"]);
    assert_eq!(ok.as_array().unwrap().len(), 4, "{ok}");
    let failed = d.json(&["operation", "list", "--state", "failed"]);
    assert!(
        failed
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["state"] == "failed"),
        "{failed}"
    );
    let err = d
        .lamina(&["operation", "list", "--state", "sleeping"])
        .fails(2);
    assert!(
        err.contains("running") && err.contains("succeeded"),
        "{err}"
    );
    d.stop_cleanly();
}

#[test]
fn clones_are_visible_and_keep_their_data() {
    need("qemu-io", "qemu-utils");
    let d = LAMINA.start();
    d.ok(&["volume", "create", "v", "--size", "1M"]);
    let uri = d.ok(&["volume", "attach", "v"]).trim().to_string();
    run(Command::new("qemu-io").args(["-f", "raw", &uri, "-c", "write -P 7 0 64k"])).ok();
    d.ok(&["snapshot", "create", "v", "s"]);
    d.ok(&["clone", "create", "c", "--from-snapshot", "v/s"]);

    let s = d.json(&["snapshot", "get", "v", "s"]);
    assert_eq!(s["clones"], serde_json::json!(["c"]), "{s}");
    let g = d.ok(&["snapshot", "get", "v", "s"]);
    assert!(
        g.lines()
            .any(|l| l.starts_with("Clones:") && l.ends_with(" c")),
        "{g}"
    );
    let tree = d.ok(&["snapshot", "tree", "v"]);
    assert!(
        tree.lines()
            .any(|l| l.starts_with("○ s ") && l.ends_with(" c")),
        "{tree}"
    );

    // Space: the written 64 KiB is shared with the snapshot; new writes
    // are the volume's own.
    run(Command::new("qemu-io").args(["-f", "raw", &uri, "-c", "write -P 8 512k 64k"])).ok();
    let v = d.json(&["volume", "get", "v"]);
    assert_eq!(v["shared_bytes"], 64u64 << 10, "{v}");
    assert_eq!(v["exclusive_bytes"], 64u64 << 10, "{v}");
    let g = d.ok(&["volume", "get", "v"]);
    assert!(g.contains("64.0 KiB (held by the live volume only)"), "{g}");

    let out = d.ok(&["snapshot", "delete", "v", "s"]);
    assert!(out.contains("deleted snapshot v/s"), "{out}");
    assert!(out.contains("its clones keep their data: c"), "{out}");
    d.ok(&["volume", "attach", "c"]);
    d.stop_cleanly();
}

#[test]
fn hints_name_the_object() {
    let d = LAMINA.start();
    d.ok(&["volume", "create", "disk", "--size", "1M"]);
    d.ok(&["volume", "attach", "disk"]);
    let mut errs = vec![];
    let err = d.err(&["volume", "delete", "disk"]);
    assert!(
        err.contains("hint: ") && err.contains("lamina volume detach disk"),
        "{err}"
    );
    errs.push(err);
    d.ok(&["snapshot", "create", "disk", "snap"]);
    d.ok(&["snapshot", "attach", "disk", "snap"]);
    let err = d.err(&["snapshot", "delete", "disk", "snap"]);
    assert!(err.contains("lamina snapshot detach disk snap"), "{err}");
    errs.push(err);
    let err = d.err(&["snapshot", "get", "disk", "nope"]);
    assert!(err.contains("lamina snapshot list disk"), "{err}");
    errs.push(err);
    for e in &errs {
        assert!(
            !e.contains("VOLUME") && !e.contains(" NAME"),
            "a placeholder: {e}"
        );
    }
    d.stop_cleanly();
}

/// `lamina ... | head -n 1` with the reader gone before the output comes
/// (the pipe's read end is closed before the command writes): the command
/// ends as `cat` does, by SIGPIPE and silently: no panic, no backtrace. A
/// stdout that cannot be written for another reason is one error line.
#[test]
fn a_closed_pipe_ends_the_output_quietly() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    let d = LAMINA.start();
    d.ok(&["volume", "create", "v", "--size", "1M"]);
    let finished = |mut child: Child| {
        let status = wait_until("the command to exit", COMMAND_LIMIT, || {
            child.try_wait().unwrap()
        });
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (status, err)
    };
    for args in [
        &["-o", "json", "volume", "get", "v"][..],
        &["volume", "get", "v"],
        &["-o", "yaml", "volume", "list"],
        &["metrics"],
    ] {
        let mut child = d
            .cmd()
            .args(args)
            .env("RUST_BACKTRACE", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let (status, err) = finished(child);
        assert_eq!(
            status.signal(),
            Some(libc::SIGPIPE),
            "{args:?}: {status:?}, {err}"
        );
        assert_eq!(err, "", "{args:?}");
    }
    let child = d
        .cmd()
        .args(["-o", "json", "volume", "get", "v"])
        .env("RUST_BACKTRACE", "1")
        .stdout(std::fs::File::create("/dev/full").unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, err) = finished(child);
    assert_eq!(status.code(), Some(1), "{err}");
    assert_eq!(
        err.trim_end(),
        "error: writing the output: No space left on device (os error 28)"
    );
    d.stop_cleanly();
}

#[test]
fn the_node_list_keeps_other_nodes_by_name() {
    let mut d = LAMINA.start();
    let out = d.ok(&["node", "add", "n2", "10.0.0.2:7481"]);
    assert_eq!(out.trim(), "added node n2 at 10.0.0.2:7481");
    d.ok(&["node", "add", "n1", "[fd00::1]:7481"]);
    // The same again succeeds and changes nothing; another address is
    // refused, saying how to change it.
    let out = d.ok(&["node", "add", "n2", "10.0.0.2:7481"]);
    assert!(out.contains("in the list already"), "{out}");
    let e = d.err(&["node", "add", "n2", "10.0.0.9:7481"]);
    assert!(
        e.contains("10.0.0.2:7481") && e.contains("lamina node remove n2"),
        "{e}"
    );
    for (args, says) in [
        (["node", "add", "N2", "10.0.0.2:7481"], "node name"),
        (["node", "add", "n3", "10.0.0.3"], "no port"),
        (["node", "add", "n3", "fd00::3:7481"], "bracketed IPv6"),
    ] {
        let e = d.err(&args);
        assert!(e.contains(says), "{args:?}: {e}");
    }
    let list = d.json(&["node", "list"]);
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["n1", "n2"], "{list}");
    assert_eq!(list[1]["address"], "10.0.0.2:7481");
    let table = d.ok(&["node", "list"]);
    assert!(table.starts_with("NAME"), "{table}");

    // Kept across a restart.
    d.restart();
    assert_eq!(d.json(&["node", "list"]), list);

    // A clone naming a node the list does not have, with no address, is
    // refused before anything is made.
    d.ok(&["node", "remove", "n1"]);
    let out = d.ok(&["node", "remove", "n1"]);
    assert!(out.contains("not in the list"), "{out}");
    let e = d.err(&[
        "clone",
        "create",
        "c",
        "--from-snapshot",
        "src/gold",
        "--from-node",
        "n1",
    ]);
    assert!(
        e.contains("no node \"n1\"") && e.contains("lamina node add"),
        "{e}"
    );
    assert_eq!(d.json(&["volume", "list"]), serde_json::json!([]));

    // `register` is still the Kubernetes registration, with its own flags.
    let help =
        run(Command::new(env!("CARGO_BIN_EXE_lamina")).args(["node", "register", "--help"])).ok();
    assert!(help.contains("--token-file"), "{help}");
    d.stop_cleanly();
}
