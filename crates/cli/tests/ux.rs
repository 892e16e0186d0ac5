//! What a new user tripped on, each checked through the `lamina` binary:
//! one document per command in JSON and YAML, one size rule, plain
//! messages, help that lists only what applies, errors that say each
//! thing once, and Ctrl-C while waiting.

use lamina_test_support::*;
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const LAMINA: Lamina = Lamina::new(env!("CARGO_BIN_EXE_lamina"));

/// Run `args` with `-o FORMAT`: it must succeed and print exactly one
/// JSON or YAML document. Returns it.
#[track_caller]
fn document(mut cmd: Command, args: &[&str], format: &str) -> Value {
    let out = run(cmd.args(args).args(["-o", format])).ok();
    let v: Value = match format {
        "json" => serde_json::from_str(&out).map_err(|e| e.to_string()),
        _ => serde_yaml::from_str(&out).map_err(|e| e.to_string()),
    }
    .unwrap_or_else(|e| panic!("{args:?} -o {format} printed {out:?}: {e}"));
    assert!(!v.is_null(), "{args:?} -o {format} printed no document");
    v
}

/// The same, in JSON and in YAML: the two must be the same document.
#[track_caller]
fn one_document(cmd: impl Fn() -> Command, args: &[&str]) -> Value {
    let j = document(cmd(), args, "json");
    let y = document(cmd(), args, "yaml");
    assert_eq!(j, y, "{args:?}: JSON and YAML differ");
    j
}

#[test]
fn every_command_prints_one_json_or_yaml_document() {
    let mut d = LAMINA.start();
    let cmd = || d.cmd();
    // Creates run twice (json, then yaml); the second finds it there.
    assert_eq!(
        one_document(cmd, &["volume", "create", "v", "--size", "1M"])["name"],
        "v"
    );
    one_document(cmd, &["volume", "list"]);
    one_document(cmd, &["volume", "get", "v"]);
    one_document(cmd, &["volume", "expand", "v", "--size", "2M"]);
    let uri = one_document(cmd, &["volume", "attach", "v"])["uri"]
        .as_str()
        .unwrap()
        .to_string();
    // Data for the clones to share (else there is nothing to flatten).
    need("qemu-io", "qemu-utils");
    run(Command::new("qemu-io").args(["-f", "raw", &uri, "-c", "write -P 7 0 64k"])).ok();
    one_document(cmd, &["snapshot", "create", "v", "s"]);
    one_document(cmd, &["snapshot", "list"]);
    one_document(cmd, &["snapshot", "list", "v"]);
    one_document(cmd, &["snapshot", "get", "v", "s"]);
    one_document(cmd, &["snapshot", "tree", "v"]);
    one_document(cmd, &["snapshot", "attach", "v", "s"]);
    // The free space can change between the two calls: compared apart.
    let mut j = document(cmd(), &["status"], "json");
    let mut y = document(cmd(), &["status"], "yaml");
    assert!(j["capacity_bytes"].as_u64().unwrap() > 0, "{j}");
    assert!(y["capacity_bytes"].as_u64().unwrap() > 0, "{y}");
    j.as_object_mut().unwrap().remove("capacity_bytes");
    y.as_object_mut().unwrap().remove("capacity_bytes");
    assert_eq!(j, y, "status: JSON and YAML differ");
    // One clone per format: a clone of that name exists after the first.
    for (name, format) in [("c1", "json"), ("c2", "yaml")] {
        let c = document(
            cmd(),
            &["clone", "create", name, "--from-snapshot", "v/s"],
            format,
        );
        assert_eq!(c["volume"]["name"], name, "{c}");
        let f = document(cmd(), &["volume", "flatten", name, "--wait"], format);
        assert_eq!(f["clone_state"], "independent", "{f}");
        let c = document(
            cmd(),
            &[
                "clone",
                "create",
                &format!("f{name}"),
                "--from-volume",
                "v",
                "--full",
            ],
            format,
        );
        assert_eq!(c["operation"]["state"], "succeeded", "{c}");
    }
    let ops = one_document(cmd, &["operation", "list"]);
    let id = ops[0]["id"].as_str().unwrap().to_string();
    one_document(cmd, &["operation", "get", &id]);
    one_document(cmd, &["operation", "wait", &id]);

    // Removals print what was removed.
    for (args, format) in [
        (&["snapshot", "detach", "v", "s"][..], "json"),
        (&["volume", "detach", "v"], "yaml"),
        (&["snapshot", "delete", "v", "s"], "json"),
        (&["volume", "delete", "c1"], "yaml"),
        (&["volume", "delete", "c2"], "json"),
        (&["volume", "delete", "v", "--with-snapshots"], "yaml"),
    ] {
        let r = document(cmd(), args, format);
        assert_eq!(r["existed"], true, "{args:?}: {r}");
        assert!(r["what"].is_string(), "{args:?}: {r}");
    }
    assert!(d.stop().is_some_and(|s| s.success()), "{}", d.log());

    // The offline pool tools, on the daemon's pool once it has stopped.
    let pool = d.data().join("pool");
    let pool = pool.to_str().unwrap();
    // Both read a pool without writing to it: every file's bytes and
    // modification time stay as they were.
    let files = || -> Vec<(String, u64, std::time::SystemTime)> {
        use std::hash::{Hash, Hasher};
        let mut v: Vec<_> = std::fs::read_dir(pool)
            .unwrap()
            .map(|e| {
                let p = e.unwrap().path();
                let m = std::fs::metadata(&p).unwrap();
                let mut h = std::collections::hash_map::DefaultHasher::new();
                if m.is_file() {
                    std::fs::read(&p).unwrap().hash(&mut h);
                }
                (p.display().to_string(), h.finish(), m.modified().unwrap())
            })
            .collect();
        v.sort();
        v
    };
    let before = files();
    let check = one_document(|| LAMINA.cmd(), &["pool", "check", pool]);
    assert_eq!(check["ok"], true, "{check}");
    assert_eq!(check["problem_count"], 0, "{check}");
    let stats = one_document(|| LAMINA.cmd(), &["pool", "stats", pool]);
    assert_eq!(stats["volume_count"], 2, "{stats}");
    assert!(stats["used_bytes"].is_u64(), "{stats}");
    assert!(
        before == files(),
        "pool check or pool stats DIR changed the pool's files"
    );
    let dir = tempfile::tempdir().unwrap();
    let new = dir.path().join("p");
    let created = document(
        LAMINA.cmd(),
        &["pool", "create", new.to_str().unwrap()],
        "json",
    );
    assert_eq!(created["pool"], new.to_str().unwrap());
}

#[test]
fn sizes_follow_one_case_insensitive_binary_rule() {
    let d = LAMINA.start();
    for (i, size) in ["10g", "10G", "10GiB", "10gb", "10GB", "10gib"]
        .iter()
        .enumerate()
    {
        let name = format!("v{i}");
        let v = d.json(&["volume", "create", &name, "--size", size]);
        assert_eq!(v["size"], 10u64 << 30, "{size}");
    }
    let v = d.json(&["volume", "create", "t", "--size", "1TB"]);
    assert_eq!(v["size"], 1u64 << 40);

    // -1 reaches the size parser and gets a plain answer, not clap's tip.
    let err = d
        .lamina(&["volume", "create", "x", "--size", "-1"])
        .fails(2);
    assert!(err.contains("cannot be negative"), "{err}");
    assert!(!err.contains("tip:") && !err.contains("-- -1"), "{err}");
    // 0 and too large: limits in units people read.
    for size in ["0", "65P"] {
        let err = d
            .lamina(&["volume", "create", "x", "--size", size])
            .fails(2);
        assert!(err.contains("between 1 byte and 64.0 PiB"), "{err}");
        assert!(!err.contains("72057594037927936"), "{err}");
    }
    let err = d.lamina(&["volume", "expand", "t", "--size", "0"]).fails(2);
    assert!(err.contains("64.0 PiB"), "{err}");
    let err = d
        .lamina(&["volume", "create", "x", "--size", "10parsecs"])
        .fails(2);
    assert!(err.contains("powers of 1024"), "{err}");

    // Shrinking: refused, said once.
    let err = d.err(&["volume", "expand", "t", "--size", "1G"]);
    assert_eq!(err.matches("shrinking").count(), 1, "{err}");
    assert!(err.contains("not supported"), "{err}");
    d.stop_cleanly();
}

#[test]
fn help_lists_what_applies_and_describes_every_argument() {
    let help = |args: &[&str]| run(LAMINA.cmd().args(args).arg("--help")).ok();

    let h = help(&["volume", "create"]);
    assert!(h.contains("<NAME>  Name of the new volume"), "{h}");
    assert!(h.contains("--size") && h.contains("power of 1024"), "{h}");
    assert!(h.contains("--data-dir") && h.contains("--endpoint"), "{h}");
    let h = help(&["volume", "detach"]);
    assert!(h.contains("--force"), "{h}");
    let h = help(&["snapshot", "get"]);
    assert!(h.contains("<VOLUME>  The snapshot's volume"), "{h}");
    let h = help(&["operation", "list"]);
    for opt in ["--volume", "--state", "--limit"] {
        assert!(h.contains(opt), "{h}");
    }

    // Pool tools work offline on the directory they are given; `pool
    // stats` without one asks the daemon.
    for sub in ["create", "check", "stats"] {
        let h = help(&["pool", sub]);
        assert!(h.contains("--output"), "{h}");
        assert!(h.contains("DIR>"), "pool {sub}: {h}");
    }
    assert!(help(&["pool", "stats"]).contains("[DIR]"));
    for args in [
        &["pool", "stats", "/nowhere", "--endpoint", "http://h:1"][..],
        &["pool", "check", "/nowhere", "--data-dir", "/tmp"][..],
    ] {
        let err = run(LAMINA.cmd().args(args)).fails(2);
        assert!(err.contains("work offline"), "{err}");
    }
    // The daemon talks to no daemon and prints nothing.
    let h = help(&["serve"]);
    for opt in ["--endpoint", "--token", "--output"] {
        // (as a word: serve's own --token-file is not the client's --token)
        let listed = h.split_whitespace().any(|w| w.trim_end_matches(',') == opt);
        assert!(!listed, "serve lists {opt}:\n{h}");
    }
    assert!(
        h.contains("--operation-retention") && h.contains("7days"),
        "{h}"
    );
    // --no-wait only means something for a full clone.
    let err = run(LAMINA
        .cmd()
        .args(["clone", "create", "c", "--from-volume", "v", "--no-wait"]))
    .fails(2);
    assert!(err.contains("--full"), "{err}");
}

#[test]
fn serve_takes_an_operation_retention() {
    let d = LAMINA
        .start_with(&["--operation-retention", "90min"])
        .unwrap_or_else(|e| panic!("lamina serve --operation-retention did not start: {e:?}"));
    d.ok(&["volume", "create", "v", "--size", "1M"]);
    d.stop_cleanly();
    let dir = tempfile::tempdir().unwrap();
    let err = run(LAMINA
        .cmd()
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--operation-retention", "soon"]))
    .fails(2);
    assert!(err.contains("--operation-retention"), "{err}");
}

/// `error:` then `hint:`, one line each, neither repeating the other.
#[track_caller]
fn error_and_hint(err: &str) -> (String, String) {
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    let e = lines[0].strip_prefix("error: ").expect("an error line");
    let h = lines[1].strip_prefix("hint: ").expect("a hint line");
    assert!(!e.contains(h) && !h.contains(e), "{err}");
    (e.to_string(), h.to_string())
}

#[test]
fn errors_say_the_message_and_the_hint_once_each() {
    let d = LAMINA.start();
    let (e, h) = error_and_hint(&d.err(&["volume", "get", "nope"]));
    assert!(e.contains("\"nope\" not found"), "{e}");
    assert!(h.contains("lamina volume list"), "{h}");
    assert_eq!(e.matches("not found").count(), 1, "{e}");
    d.ok(&["volume", "create", "v", "--size", "1M"]);
    let (e, _) = error_and_hint(&d.err(&["volume", "create", "v", "--size", "2M"]));
    assert_eq!(e.matches("already exists").count(), 1, "{e}");
    d.stop_cleanly();
}

/// A unix socket in a fresh directory that accepts and never answers.
fn silent_daemon() -> (tempfile::TempDir, std::os::unix::net::UnixListener) {
    let dir = tempfile::Builder::new()
        .prefix("lamina-ux")
        .tempdir_in("/tmp")
        .unwrap();
    let l = std::os::unix::net::UnixListener::bind(dir.path().join("api.sock")).unwrap();
    (dir, l)
}

#[test]
fn permission_denied_on_the_socket_says_what_to_do() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let (dir, _l) = silent_daemon();
    let sock = dir.path().join("api.sock");
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o000)).unwrap();
    let mut c = LAMINA.cmd();
    c.arg("--data-dir").arg(dir.path()).args(["volume", "list"]);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // Root passes any permission check: ask as nobody, as a user would.
        c.uid(65534).gid(65534);
    }
    let err = run(&mut c).fails(1);
    let (e, h) = error_and_hint(&err);
    assert!(
        e.contains("permission denied") && e.contains(sock.to_str().unwrap()),
        "{e}"
    );
    assert!(h.contains("run as root") && h.contains("--endpoint"), "{h}");
    assert!(!err.contains("running?"), "{err}");
}

#[test]
fn ctrl_c_while_waiting_says_the_operation_goes_on() {
    let (dir, listener) = silent_daemon();
    let mut child = LAMINA
        .cmd()
        .arg("--data-dir")
        .arg(dir.path())
        .args(["operation", "wait", "op-42"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // It has connected (so its Ctrl-C handler is in place: it is installed
    // before the first request) once the listener accepts.
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let _conn = loop {
        match listener.accept() {
            Ok((c, _)) => break c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "lamina never connected");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    // SAFETY: kill(2) on the pid of a child we own and have not reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("lamina did not stop after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(130), "{err}");
    let (e, h) = error_and_hint(&err);
    assert!(
        e.contains("goes on in the daemon") && e.contains("op-42"),
        "{e}"
    );
    assert_eq!(h, "follow it with `lamina operation wait op-42`");
}

#[test]
fn volume_get_shows_clients_and_space() {
    let d = LAMINA.start();
    d.ok(&["volume", "create", "v", "--size", "1M"]);
    let g = d.ok(&["volume", "get", "v"]);
    for field in ["Exclusive:", "Shared:", "NBD clients:"] {
        assert!(g.contains(field), "{g}");
    }
    d.ok(&["volume", "attach", "v"]);
    let g = d.ok(&["volume", "get", "v"]);
    assert!(g.contains("0 connected"), "{g}");
    let v = d.json(&["volume", "get", "v"]);
    assert_eq!(v["export"]["connections"], 0, "{v}");
    d.stop_cleanly();
}
