//! The harness's promises about hosts: they reach each other, a cut stops
//! that and a restore brings it back, a shaped link holds packets back, a
//! daemon runs inside its host, and nothing is left behind.

use super::*;
use crate::{need, run, wait_until};
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::process::Stdio;

const STOPS: Lamina = Lamina::new(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/testdata/daemon-stops"
));
const WAIT: Duration = Duration::from_secs(60);

/// Run `f` on a thread inside `host`'s network namespace (sockets it makes
/// stay in that namespace whichever thread uses them after).
fn inside<T: Send + 'static>(host: &Host, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/var/run/netns/{}", host.name());
    std::thread::spawn(move || {
        let ns = File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        // SAFETY: setns(2) with a namespace fd we hold open; it moves only
        // this thread, which ends with `f`, into that network namespace.
        let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("the thread inside the namespace panicked")
}

/// A listener in `host` on port 9000 that answers each connection with the
/// number of bytes it read before the client shut its side down.
fn counter(host: &Host) -> SocketAddr {
    let addr = SocketAddr::from((host.addr(), 9000));
    let l = inside(host, move || {
        TcpListener::bind(addr).expect("bind in the host")
    });
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let mut n = 0u64;
            let mut buf = vec![0u8; 64 << 10];
            while let Ok(k) = c.read(&mut buf) {
                if k == 0 {
                    break;
                }
                n += k as u64;
            }
            let _ = c.write_all(&n.to_le_bytes());
        }
    });
    addr
}

/// From `host`, send `len` bytes to `to`; what the other end counted, or
/// the connection's error (a connect gives up after `patience`).
fn send(host: &Host, to: SocketAddr, len: usize, patience: Duration) -> std::io::Result<u64> {
    let mut c = inside(host, move || TcpStream::connect_timeout(&to, patience))?;
    c.write_all(&vec![7u8; len])?;
    c.shutdown(std::net::Shutdown::Write)?;
    let mut n = [0u8; 8];
    c.read_exact(&mut n)?;
    Ok(u64::from_le_bytes(n))
}

#[test]
fn hosts_reach_each_other_and_a_cut_link_carries_nothing_until_restored() {
    let net = Net::new(2);
    let (a, b) = (net.host(0), net.host(1));
    assert_ne!(a.addr(), b.addr());
    let to = counter(a);
    assert_eq!(send(b, to, 1 << 20, WAIT).expect("b reaches a"), 1 << 20);
    assert!(a.rx_bytes() >= 1 << 20 && b.tx_bytes() >= 1 << 20);

    a.cut();
    let before = a.rx_bytes();
    let e = send(b, to, 4096, Duration::from_secs(2)).expect_err("a is cut off");
    assert!(
        matches!(
            e.kind(),
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::HostUnreachable
        ),
        "{e}"
    );
    // Not one frame of b's arrived.
    assert_eq!(a.rx_bytes(), before);

    a.restore();
    let n = wait_until("a reachable again", WAIT, || {
        send(b, to, 4096, Duration::from_secs(2)).ok()
    });
    assert_eq!(n, 4096);
}

#[test]
fn commands_run_inside_a_host() {
    need("nbdkit", "nbdkit");
    need("nbdinfo", "libnbd-bin");
    let net = Net::new(2);
    let (a, b) = (net.host(0), net.host(1));
    let listen = a.addr().to_string();
    let mut server = a
        .cmd("nbdkit")
        .args([
            "--foreground",
            "--exit-with-parent",
            "-i",
            &listen,
            "-p",
            "10809",
        ])
        .args(["memory", "3M"])
        .stdin(Stdio::null())
        .spawn()
        .expect("nbdkit");
    let uri = format!("nbd://{listen}:10809");
    let size = wait_until("nbdkit answering in host a", WAIT, || {
        let o = run(b.cmd("nbdinfo").args(["--size", &uri]));
        o.status.success().then(|| o.stdout.trim().to_string())
    });
    assert_eq!(size, (3u64 << 20).to_string());
    let _ = server.kill();
    let _ = server.wait();
}

#[test]
fn a_shaped_link_holds_packets_back() {
    let net = Net::new(2);
    let (a, b) = (net.host(0), net.host(1));
    let to = counter(b);
    // Unshaped: veth's default, no queue that could hold anything back.
    send(a, to, 1 << 20, WAIT).expect("a reaches b");
    assert_ne!(a.qdisc_stats()["kind"], "tbf");

    a.shape(2_000_000);
    let q = a.qdisc_stats();
    assert_eq!(q["kind"], "tbf", "{q}");
    assert_eq!(q["options"]["rate"], 2_000_000, "{q}");
    let sent = a.tx_bytes();
    let len = 4usize << 20;
    assert_eq!(
        send(a, to, len, WAIT).expect("a reaches b, slowly"),
        len as u64
    );
    assert!(a.tx_bytes() - sent >= len as u64);
    let q = a.qdisc_stats();
    // Everything went through the filter, and it had to hold packets back
    // for want of tokens.
    assert!(q["bytes"].as_u64().unwrap() >= len as u64, "{q}");
    assert!(q["overlimits"].as_u64().unwrap() > 0, "{q}");

    a.unshape();
    assert_ne!(a.qdisc_stats()["kind"], "tbf");
    // netem where the kernel has it; either answer leaves the link working.
    let delayed = a.delay(Duration::from_millis(1));
    assert_eq!(a.qdisc_stats()["kind"] == "netem", delayed);
    send(a, to, 4096, WAIT).expect("a reaches b");
}

#[test]
fn a_daemon_runs_in_its_host_and_restarts_there() {
    let net = Net::new(1);
    let h = net.host(0);
    let ns_inode = std::fs::metadata(format!("/var/run/netns/{}", h.name()))
        .unwrap()
        .ino();
    let in_host = |pid: u32| {
        std::fs::metadata(format!("/proc/{pid}/ns/net"))
            .unwrap()
            .ino()
    };
    let mut d = h.serve(&STOPS, &[]);
    let pid = d.pid().expect("running");
    // nsenter execs the daemon: the pid is the daemon's own (in the
    // host's namespace once the stand-in runs).
    wait_until("the stand-in up", WAIT, || {
        d.log().contains("fake daemon up").then_some(())
    });
    assert_eq!(in_host(pid), ns_inode);
    d.kill9();
    assert!(!d.running());
    d.start_again();
    let again = d.pid().expect("running again");
    // Its log follows the first one's.
    wait_until("the stand-in up again", WAIT, || {
        (d.log().matches("fake daemon up").count() == 2).then_some(())
    });
    assert_ne!(again, pid);
    assert_eq!(in_host(again), ns_inode);
    d.stop_cleanly();
}

#[test]
fn nothing_is_left_behind_even_after_a_panic_and_stale_nets_go() {
    // A namespace of a process that cannot exist (pids stop below pid_max).
    let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let stale = format!("{PREFIX}{}-0-h0", pid_max + 1);
    run(Command::new("ip").args(["netns", "add", &stale])).ok();

    let mut names = Vec::new();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let net = Net::new(3);
        names = net.namespaces();
        assert!(!lamina_namespaces().contains(&stale), "cleaned at start");
        panic!("a failing test");
    }));
    assert!(r.is_err());
    assert_eq!(names.len(), 4);
    let left = lamina_namespaces();
    for n in &names {
        assert!(!left.contains(n), "{n} left behind: {left:?}");
    }
}
