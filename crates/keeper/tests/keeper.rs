//! The keeper over its real socket, with pipes standing in for FUSE
//! descriptors: a pipe's read end sees EOF exactly when every copy of its
//! write end is closed, which is how a FUSE connection ends too.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use lamina_keeper::{Client, Keeper, KeeperError};

fn pipe() -> (std::fs::File, OwnedFd) {
    let (r, w) = std::io::pipe().unwrap();
    (std::fs::File::from(OwnedFd::from(r)), OwnedFd::from(w))
}

fn keeper(dir: &tempfile::TempDir, hold: Duration) -> lamina_keeper::KeeperHandle {
    Keeper::bind(&dir.path().join("keeper.sock"), hold)
        .unwrap()
        .spawn()
}

/// Whether the pipe's read end sees EOF within a few seconds (every write
/// end closed), or stays open.
fn ends(mut r: std::fs::File) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut b = [0u8; 64];
        loop {
            match r.read(&mut b) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(_) => break,
            }
        }
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(5)).is_ok()
}

#[test]
fn descriptors_put_are_held_listed_and_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let k = keeper(&dir, Duration::from_secs(300));
    let c = Client::new(k.path());
    let (mut r, w) = pipe();
    c.put("/data/files/a", b"token-a", &[w.as_fd()]).unwrap();
    // The caller's copy goes; the keeper's keeps the pipe open.
    drop(w);
    let held = c.list().unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].key, "/data/files/a");
    assert_eq!(held[0].token, b"token-a");
    assert_eq!(held[0].fds.len(), 1);
    // The copy listed is the same pipe.
    std::fs::File::from(held[0].fds[0].try_clone().unwrap())
        .write_all(b"x")
        .unwrap();
    let mut b = [0u8; 1];
    r.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"x");
    drop(held);
    // A put under the same key replaces (and closes) what it held.
    let (r2, w2) = pipe();
    c.put("/data/files/a", b"token-b", &[w2.as_fd()]).unwrap();
    assert!(ends(r), "the replaced entry's descriptors are closed");
    drop(w2);
    assert_eq!(c.list().unwrap()[0].token, b"token-b");
    c.drop_entry("/data/files/a").unwrap();
    assert!(ends(r2), "a dropped entry's descriptors are closed");
    assert!(c.list().unwrap().is_empty());
    // Dropping what is not held is fine.
    c.drop_entry("/data/files/none").unwrap();
}

#[test]
fn an_entry_nobody_takes_back_is_let_go_after_the_hold_limit() {
    let dir = tempfile::tempdir().unwrap();
    let k = keeper(&dir, Duration::from_millis(300));
    let c = Client::new(k.path());
    let (r, w) = pipe();
    c.put("k", b"", &[w.as_fd()]).unwrap();
    drop(w);
    assert!(ends(r), "the hold limit closes the descriptors");
    let until = Instant::now() + Duration::from_secs(5);
    while !k.keys().is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(k.keys().is_empty());
}

#[test]
fn bad_requests_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let k = keeper(&dir, Duration::from_secs(300));
    let c = Client::new(k.path());
    let (_r, w) = pipe();
    c.put("kept", b"t", &[w.as_fd()]).unwrap();
    // Refused before sending: no descriptor, an empty key, a long token.
    assert!(matches!(
        c.put("x", b"", &[]),
        Err(KeeperError::Protocol { .. })
    ));
    assert!(matches!(
        c.put("", b"", &[w.as_fd()]),
        Err(KeeperError::Protocol { .. })
    ));
    assert!(matches!(
        c.put("x", &[0u8; 300], &[w.as_fd()]),
        Err(KeeperError::Protocol { .. })
    ));
    // Junk on a raw connection is answered with an error and the
    // connection closed; the keeper goes on.
    for junk in [
        &b""[..],
        b"\x01",
        b"\x02\x03",
        b"\x01\x01\xff\xff",
        b"\x01\x80",
    ] {
        let raw = rustix::net::socket(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            None,
        )
        .unwrap();
        rustix::net::connect(&raw, &rustix::net::SocketAddrUnix::new(k.path()).unwrap()).unwrap();
        rustix::net::send(&raw, junk, rustix::net::SendFlags::empty()).unwrap();
        let mut b = [0u8; 2048];
        let _ = rustix::net::recv(&raw, &mut b, rustix::net::RecvFlags::empty());
    }
    let held = c.list().unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].key, "kept");
}

#[test]
fn a_second_keeper_is_refused_and_a_stale_socket_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keeper.sock");
    let k = keeper(&dir, Duration::from_secs(300));
    let err = Keeper::bind(&path, Duration::from_secs(1))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("another keeper"), "{err}");
    drop(k);
    // A socket file left by a keeper that died: nobody answers, replaced.
    let stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
    drop(stale);
    let k = Keeper::bind(&path, Duration::from_secs(1)).unwrap().spawn();
    assert!(Client::new(k.path()).list().unwrap().is_empty());
    drop(k);
    assert!(matches!(
        Client::new(&path).list(),
        Err(KeeperError::Unreachable { .. })
    ));
}

#[test]
fn descriptors_go_to_no_keeper_of_another_user() {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketType};
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let path = dir.path().join("keeper.sock");
    // A listener made by a thread running as nobody: the kernel records
    // the listener's credentials at listen(2).
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.clone();
    let t = std::thread::spawn(move || {
        rustix::thread::set_thread_uid(rustix::process::Uid::from_raw(65534)).unwrap();
        let fd = rustix::net::socket(AddressFamily::UNIX, SocketType::SEQPACKET, None).unwrap();
        rustix::net::bind(&fd, &SocketAddrUnix::new(&p).unwrap()).unwrap();
        rustix::net::listen(&fd, 4).unwrap();
        tx.send(()).unwrap();
        // Accept one connection and hold it until the test is done.
        let c = rustix::net::accept(&fd);
        std::thread::sleep(Duration::from_millis(500));
        drop(c);
    });
    rx.recv().unwrap();
    let (_r, w) = pipe();
    let err = Client::new(&path)
        .put("k", b"", &[w.as_fd()])
        .expect_err("refused");
    assert!(
        matches!(&err, KeeperError::Refused { message, .. } if message.contains("uid 65534")),
        "{err}"
    );
    t.join().unwrap();
}

/// The chart runs the keeper and the daemon in pods of their own, each in
/// a PID namespace the other cannot see, where the kernel gives the peer's
/// pid as 0 (SO_PEERCRED). Here both are this test binary run again under
/// `unshare --pid --fork`, the keeper in one new namespace and the daemon's
/// side (the client) in another: a descriptor is put and listed back.
#[test]
fn a_keeper_and_a_daemon_in_pid_namespaces_of_their_own_talk() {
    const ROLE: &str = "LAMINA_KEEPER_TEST_ROLE";
    const SOCKET: &str = "LAMINA_KEEPER_TEST_SOCKET";
    if let Ok(role) = std::env::var(ROLE) {
        let path = std::path::PathBuf::from(std::env::var(SOCKET).unwrap());
        if role == "keeper" {
            let _k = Keeper::bind(&path, Duration::from_secs(300))
                .unwrap()
                .spawn();
            std::thread::sleep(Duration::from_secs(60));
        } else {
            let c = Client::new(&path);
            let (_r, w) = pipe();
            c.put("/data/files/a", b"token", &[w.as_fd()]).unwrap();
            let held = c.list().unwrap();
            assert_eq!(held.len(), 1);
            assert_eq!(held[0].token, b"token");
        }
        return;
    }
    assert!(
        rustix::process::geteuid().is_root(),
        "this test needs root: it makes PID namespaces (unshare --pid)"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keeper.sock");
    let exe = std::env::current_exe().unwrap();
    let run = |role: &str| {
        let mut c = std::process::Command::new("unshare");
        c.args(["--pid", "--fork", "--kill-child"])
            .arg(&exe)
            .args([
                "--exact",
                "a_keeper_and_a_daemon_in_pid_namespaces_of_their_own_talk",
                "--nocapture",
            ])
            .env(ROLE, role)
            .env(SOCKET, &path);
        c
    };
    let mut keeper = run("keeper").spawn().unwrap();
    let t = Instant::now();
    while !path.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the keeper never bound {path:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let daemon = run("daemon").output().unwrap();
    let _ = keeper.kill();
    let _ = keeper.wait();
    assert!(
        daemon.status.success(),
        "the daemon's side failed:\n{}\n{}",
        String::from_utf8_lossy(&daemon.stdout),
        String::from_utf8_lossy(&daemon.stderr)
    );
}
