//! `lamina serve` against a flood on its transfer port (issue 38): the
//! daemon raises its own limit on open files, and connections that never
//! authenticate cannot take the descriptors its API needs. The daemon is
//! started under `prlimit`, with the common soft limit of 1,024 open files.

use crate::LAMINA;
use lamina_test_support::*;
use std::io::Read;
use std::net::TcpStream;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// The soft and hard limits on open files of process `pid`.
fn open_files(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("no open files limit in {limits}"));
    let n: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (n[0], n[1])
}

/// A daemon started by `prlimit --nofile=SOFT:HARD`, with `extra` arguments.
fn limited(soft: u64, hard: u64, extra: &[&str]) -> Daemon {
    need("prlimit", "util-linux");
    let prefix = [
        "prlimit".to_string(),
        format!("--nofile={soft}:{hard}"),
        "--".to_string(),
    ];
    LAMINA
        .start_in(&prefix, extra)
        .unwrap_or_else(|e| panic!("lamina serve did not start: {e}"))
}

#[test]
fn the_daemon_raises_its_open_files_limit_to_the_hard_limit() {
    let d = limited(1024, 4096, &[]);
    let pid = d.pid().expect("running");
    assert_eq!(open_files(pid), (4096, 4096), "{}", d.log());
    assert!(
        d.log().contains("raised the limit on open files"),
        "{}",
        d.log()
    );
}

/// This process's soft limit on open files raised to at least `n`.
fn allow_open_files(n: u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read or write the local they are given.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        if r.rlim_cur < n {
            assert!(r.rlim_max >= n, "this test needs {n} open files");
            r.rlim_cur = n;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &r), 0);
        }
    }
}

fn certs(dir: &Path) -> std::path::PathBuf {
    let ca = dir.join("ca");
    run(LAMINA.cmd().args(["certs", "create-ca"]).arg(&ca)).ok();
    let out = dir.join("n0");
    run(LAMINA
        .cmd()
        .args(["certs", "issue", "--ca"])
        .arg(&ca)
        .args(["--node", "n0"])
        .arg(&out))
    .ok();
    out
}

#[test]
fn idle_connections_to_the_transfer_port_leave_the_api_answering() {
    // More idle connections than the daemon has descriptors, which it
    // cannot raise (soft = hard = 1,024).
    const IDLE: usize = 1100;
    allow_open_files(IDLE as u64 + 256);
    let tmp = tempfile::tempdir().unwrap();
    let tls = certs(tmp.path());
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let d = limited(
        1024,
        1024,
        &[
            "--transfer-listen",
            &listen,
            "--transfer-tls",
            tls.to_str().unwrap(),
        ],
    );
    let idle: Vec<TcpStream> = (0..IDLE)
        .map(|_| TcpStream::connect(&listen).unwrap())
        .collect();
    for s in &idle {
        s.set_nonblocking(true).unwrap();
    }
    // All from 127.0.0.1: all but the handshake limit per address are
    // closed at once.
    let per_address = lamina_transfer::Limits::HANDSHAKES_PER_ADDRESS;
    let closed = |s: &TcpStream| {
        let mut b = [0u8; 1];
        match (&*s).read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        }
    };
    wait_until("the extra connections closed", COMMAND_LIMIT, || {
        (idle.iter().filter(|s| closed(s)).count() >= IDLE - per_address).then_some(())
    });
    // The API answers while the rest are held. (A give-up limit: status
    // answers in milliseconds; a daemon out of descriptors answers when
    // the held handshakes time out, if ever.)
    let mut status = d
        .cmd()
        .arg("status")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let answered = poll_until(Duration::from_secs(20), || status.try_wait().unwrap());
    if answered.is_none() {
        let _ = status.kill();
        let _ = status.wait();
    }
    assert!(
        answered.is_some_and(|s| s.success()),
        "lamina status did not answer: {answered:?}\n{}",
        d.log()
    );
    drop(idle);
}
