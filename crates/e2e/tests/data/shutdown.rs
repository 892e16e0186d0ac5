//! SIGTERM with an NBD client that stopped reading its replies: the daemon
//! still stops (after the NBD drain time, 10 s), and every write it
//! acknowledged is there after a restart. Before issue 9 it waited forever.

use crate::LAMINA;
use lamina_test_support::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CHUNK: usize = 64 << 10;

fn request(kind: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(28);
    b.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    b.extend_from_slice(&0u16.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b
}

#[test]
fn sigterm_finishes_with_a_stalled_client_and_keeps_every_acknowledged_write() {
    need("qemu-io", "qemu-utils");
    let mut d = LAMINA.start();
    d.ok(&["volume", "create", "v", "--size", "64MiB"]);
    d.attach(&["volume", "attach", "v"]);
    let mut s = UnixStream::connect(d.data().join("nbd.sock")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).unwrap();
    s.write_all(&lamina_nbd::mem::client_handshake("v", false))
        .unwrap();
    let mut export = [0u8; 10];
    s.read_exact(&mut export).unwrap();
    assert_eq!(
        u64::from_be_bytes(export[..8].try_into().unwrap()),
        64 << 20
    );

    // Acknowledged writes (no flush): each reply read.
    for i in 0..16u64 {
        s.write_all(&request(CMD_WRITE, i, i * CHUNK as u64, CHUNK as u32))
            .unwrap();
        s.write_all(&vec![i as u8 + 1; CHUNK]).unwrap();
        let mut reply = [0u8; 16];
        s.read_exact(&mut reply).unwrap();
        assert_eq!(&reply[4..8], &[0; 4], "write {i} failed");
    }
    // Then reads whose replies (64 × 1 MiB) it never takes: the daemon's
    // writes to this socket block.
    for i in 0..64u64 {
        s.write_all(&request(CMD_READ, 100 + i, 0, 1 << 20))
            .unwrap();
    }

    // SIGTERM only once the daemon is answering those reads: their first
    // replies wait in this socket's receive queue. Sent earlier, on a busy
    // machine, the daemon could stop before it read them, with nothing of
    // its own left to write, and nothing stalled.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while queued(&s) < CHUNK {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon wrote no read reply within 30 s ({} bytes queued)\n{}",
            queued(&s),
            d.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    // The harness fails the test if the daemon has not exited within its
    // stop limit (60 s): the drain time is 10 s.
    let status = d.stop();
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        d.log()
    );
    assert!(
        d.log().contains("did not read its replies"),
        "the stalled connection was named in the log:\n{}",
        d.log()
    );
    drop(s);

    d.restart();
    let uri = d.attach(&["volume", "attach", "v"]);
    let reads: Vec<String> = (0..16u64)
        .map(|i| format!("read -P {} {} {}", i + 1, i * CHUNK as u64, CHUNK))
        .collect();
    let cmds: Vec<&str> = reads.iter().map(String::as_str).collect();
    qemu_io(&uri, &cmds);
}

/// The bytes waiting in a socket's receive queue.
fn queued(s: &UnixStream) -> usize {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which points at
    // `n`, alive for the call; the descriptor is `s`'s, open while borrowed.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut n) };
    assert_eq!(r, 0, "FIONREAD: {}", std::io::Error::last_os_error());
    n as usize
}
