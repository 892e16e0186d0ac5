//! The daemon's store (redb) on a file system that runs full (issue 38):
//! a failed write must not leave the store latched until a restart, health
//! must say the store is broken, and a call answered with an error must
//! have changed nothing. The data directory is a small tmpfs of its own
//! (the tests run as root), filled by a file outside Lamina and freed by
//! deleting it, as an operator would.

mod support;

use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use support::{qemu_io, Daemon};

const MIB: u64 = 1 << 20;

/// A tmpfs mounted on a directory, unmounted when dropped (after the
/// daemon using it, which is declared after it).
struct Mount {
    path: PathBuf,
}

impl Mount {
    fn tmpfs(dir: &Path, size: &str) -> Mount {
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("mount runs");
        assert!(out.status.success(), "mount tmpfs: {out:?}");
        Mount {
            path: dir.to_path_buf(),
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}

/// Take every free byte of the file system with a file outside Lamina.
fn fill(path: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0x55u8; 64 << 10];
    let mut small = false;
    loop {
        let buf = if small { &chunk[..4096] } else { &chunk[..] };
        match f.write(buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(28) && !small => small = true,
            Err(e) if e.raw_os_error() == Some(28) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
}

fn snapshot(d: &Daemon, vol: &str, name: &str) -> (StatusCode, Value) {
    d.call(
        Method::POST,
        &format!("/v1/volumes/{vol}/snapshots"),
        Some(&json!({"name": name}).to_string()),
    )
}

fn exists(d: &Daemon, path: &str) -> bool {
    let (s, v) = d.call(Method::GET, path, None);
    assert!(
        s == StatusCode::OK || s == StatusCode::NOT_FOUND,
        "GET {path}: {s} {v}"
    );
    s == StatusCode::OK
}

#[test]
fn a_store_failed_on_a_full_disk_changes_nothing_and_recovers_once_space_is_back() {
    // The store on a small file system of its own (the data directory's
    // `lamina.redb` a link to it): it runs full while the pool has room,
    // so the engine makes what the store cannot record.
    let small = tempfile::tempdir().unwrap();
    let _mount = Mount::tmpfs(small.path(), "2m");
    let filler = small.path().join("filler");
    let dir = tempfile::Builder::new()
        .prefix("lamina-full")
        .tempdir_in("/tmp")
        .unwrap();
    std::os::unix::fs::symlink(
        small.path().join("lamina.redb"),
        dir.path().join("lamina.redb"),
    )
    .unwrap();
    let mut d = Daemon::start_in(dir);
    for (name, size) in [("v", 4 * MIB), ("spare", 4 * MIB)] {
        let b = json!({"name": name, "size": size}).to_string();
        d.ok(Method::POST, "/v1/volumes", Some(&b));
    }
    let uri = d.attach("/v1/volumes/v");
    qemu_io(&uri, &["write -P 0x61 0 1M"]);
    d.ok(Method::POST, "/v1/volumes/v/detach", None);
    fill(&filler);

    // Snapshots until one is refused: each is made and recorded, or
    // neither.
    let mut refused = None;
    let mut made = Vec::new();
    for i in 0..5000 {
        let name = format!("s{i}");
        let (s, v) = snapshot(&d, "v", &name);
        if s.is_success() {
            made.push(name);
        } else {
            refused = Some((name, s, v));
            break;
        }
    }
    let (name, status, body) = refused.expect("a full file system refuses a snapshot");
    eprintln!("refused after {} snapshots: {status} {body}", made.len());
    assert!(
        !exists(&d, &format!("/v1/volumes/v/snapshots/{name}")),
        "answered {status} {body}, yet made"
    );
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("store"),
        "{body}"
    );
    for n in &made {
        assert!(exists(&d, &format!("/v1/volumes/v/snapshots/{n}")), "{n}");
    }
    // While the store is broken, health says so and changes are refused,
    // the operator's deletes too; nothing they ask is made or removed.
    let (hs, hv) = d.call(Method::GET, "/v1/health", None);
    assert_eq!(hs, StatusCode::SERVICE_UNAVAILABLE, "{hv}");
    assert!(
        hv["message"].as_str().unwrap().contains("store"),
        "health names the store: {hv}"
    );
    let (s, v) = d.call(Method::DELETE, "/v1/volumes/spare", None);
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert!(exists(&d, "/v1/volumes/spare"));
    let (s, v) = d.call(Method::POST, "/v1/volumes/v/attach", None);
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    let (s, _) = snapshot(&d, "v", "while-broken");
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert!(!exists(&d, "/v1/volumes/v/snapshots/while-broken"));

    // Space is back: every call works again, without a restart.
    std::fs::remove_file(&filler).unwrap();
    let (hs, hv) = d.call(Method::GET, "/v1/health", None);
    assert_eq!(hs, StatusCode::OK, "{hv}");
    let (s, v) = snapshot(&d, "v", "after");
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let taken = made.len() + 1;
    d.ok(Method::DELETE, "/v1/volumes/v/snapshots/s0", None);
    made.retain(|n| n != "s0");
    d.ok(Method::DELETE, "/v1/volumes/spare", None);
    let uri = d.attach("/v1/volumes/v");
    qemu_io(&uri, &["read -P 0x61 0 1M"]);
    let ops = d.ok(Method::GET, "/v1/operations?state=running", None);
    assert_eq!(ops.as_array().unwrap().len(), 0, "{ops}");

    // A restart finds what the answers said, and nothing else.
    let dir = d.stop();
    d = Daemon::start_in(dir);
    assert!(!exists(&d, &format!("/v1/volumes/v/snapshots/{name}")));
    assert!(!exists(&d, "/v1/volumes/v/snapshots/while-broken"));
    assert!(!exists(&d, "/v1/volumes/v/snapshots/s0"));
    assert!(!exists(&d, "/v1/volumes/spare"));
    for n in made.iter().chain(["after".to_string()].iter()) {
        assert!(exists(&d, &format!("/v1/volumes/v/snapshots/{n}")), "{n}");
    }
    let v = d.ok(Method::GET, "/v1/volumes/v", None);
    assert!(v["export"].is_object(), "the attach is restored: {v}");
    // One record per snapshot made, each succeeded (the one whose record
    // failed beside its commit too), and none running.
    let ops = d.ok(Method::GET, "/v1/operations?volume=v", None);
    let snaps: Vec<&Value> = ops
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["kind"] == "create-snapshot")
        .collect();
    assert_eq!(snaps.len(), taken, "{ops}");
    assert!(snaps.iter().all(|o| o["state"] == "succeeded"), "{ops}");
    let ops = d.ok(Method::GET, "/v1/operations?state=running", None);
    assert_eq!(ops.as_array().unwrap().len(), 0, "{ops}");
}
