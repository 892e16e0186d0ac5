//! Replica sessions against the real Source over real sockets and TLS: a
//! remote volume answers as the volume it reaches, large operations split,
//! a silent replica or a lost link fails the calls waiting (and every later
//! one), a session holds a bounded number of calls, attaching is refused
//! with a clear error where it must be, and a retire is answered or
//! refused as its version and the node say. The volumes served are in
//! memory, held or failed as each test says (`Gated`); the daemon's
//! engine volumes and their generations are held to the whole contract in
//! `crates/server/src/replicas.rs`.

mod common;

use common::*;
use lamina_blockio::testing::{Gated, MemDevice};
use lamina_blockio::{wait, BlockIo, Caps, IoDone, IoError, IoErrorKind, IoOp};
use lamina_transfer::replica::{retire, RemoteVolume, SessionOptions, Volumes, SESSION_CALLS};
use lamina_transfer::wire::{self, Code, Frame, OpCode, VERSION};
use lamina_transfer::{Reason, TransferError};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// The instance the node below says.
const INSTANCE: u64 = 0x5eed_0001;

/// Volumes in memory, by name; calls on the runners of the Source's
/// runtime, snapshots each on its own thread.
struct Mems(HashMap<String, Arc<Gated<MemDevice>>>);

impl Volumes for Mems {
    fn open(
        &self,
        volume: &str,
        _peer: &str,
        _create: Option<u64>,
    ) -> Result<Arc<dyn BlockIo>, IoError> {
        match self.0.get(volume) {
            Some(v) => Ok(v.clone()),
            None => Err(IoError::new(
                IoErrorKind::Gone,
                format!("no volume {volume}"),
            )),
        }
    }
    fn runtime(&self) -> tokio::runtime::Handle {
        // The Source's own, which serves the session.
        tokio::runtime::Handle::current()
    }
    fn run(&self, job: Box<dyn FnOnce() + Send>) {
        std::thread::spawn(job);
    }
    fn instance(&self, _volume: &str) -> Option<u64> {
        Some(INSTANCE)
    }
    fn delete_snapshot(&self, volume: &str, name: &str, peer: &str) -> Result<(), IoError> {
        self.snapshot(volume, name, 0, false, peer)
    }
    /// "v" is there (never deleted: the daemon's own test deletes), "own"
    /// is the node's own, any other is gone.
    fn retire(&self, volume: &str, peer: &str, _check: bool) -> Result<bool, IoError> {
        match volume {
            "own" => Err(IoError::new(
                IoErrorKind::Invalid,
                format!("volume own is this node's own, not a replica of node {peer}'s"),
            )),
            v => Ok(self.0.contains_key(v)),
        }
    }
    fn snapshot(
        &self,
        volume: &str,
        name: &str,
        origin: u64,
        group: bool,
        _peer: &str,
    ) -> Result<(), IoError> {
        if name == "origin" && origin != 0x1234 {
            return Err(IoError::new(
                IoErrorKind::Invalid,
                format!("origin {origin:x}"),
            ));
        }
        if group != (name == "member") {
            return Err(IoError::new(
                IoErrorKind::Invalid,
                format!("{name}: group {group}"),
            ));
        }
        match name {
            "refused" => Err(IoError::new(
                IoErrorKind::NoSpace,
                format!("no room for {volume}/{name}"),
            )),
            _ => Ok(()),
        }
    }
}

/// A node serving volume "v" (8 MiB in memory, with `contents` at 0) to
/// front ends of the same CA.
struct Node {
    _ca: Ca,
    _dirs: Vec<tempfile::TempDir>,
    served: Served,
    /// The replica's node's identity (for a fake source in its place).
    replica: Arc<lamina_transfer::Identity>,
    volume: Arc<Gated<MemDevice>>,
    front: Arc<lamina_transfer::Identity>,
}

fn node(contents: &[u8]) -> Node {
    let ca = Ca::new();
    let (d1, replica) = ca.identity("replica");
    let (d2, front) = ca.identity("front");
    let (d3, pool) = pool();
    let served = Served::new(pool, replica.clone());
    let mem = MemDevice::new(8 << 20);
    mem.load(0, contents);
    let volume = Arc::new(Gated::new(Arc::new(mem)));
    let mems = Mems(HashMap::from([("v".to_string(), volume.clone())]));
    served.source.serve_volumes(Arc::new(mems));
    Node {
        _ca: ca,
        _dirs: vec![d1, d2, d3],
        served,
        replica,
        volume,
        front,
    }
}

impl Node {
    fn connect(&self, volume: &str, o: SessionOptions) -> Result<RemoteVolume, TransferError> {
        RemoteVolume::connect(&self.front, &self.served.remote("replica"), volume, o)
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
}

/// What an outcome says, the error's message aside (a remote one names the
/// replica).
fn gist(r: Result<IoDone, IoError>) -> Result<IoDone, (IoErrorKind, &'static str, u64, u64)> {
    r.map_err(|e| (e.kind, e.op, e.offset, e.len))
}

#[test]
fn a_remote_volume_answers_as_the_volume_it_reaches() {
    let start = pattern(3, 3 << 20);
    let n = node(&start);
    let here = MemDevice::new(8 << 20);
    here.load(0, &start);
    let remote = n.connect("v", SessionOptions::default()).unwrap();
    assert_eq!(remote.size().unwrap(), 8 << 20);
    assert_eq!(remote.caps(), here.caps());
    assert_eq!(remote.instance(), Some(INSTANCE));
    let ops = || {
        vec![
            IoOp::Read {
                offset: 4096,
                buf: vec![0; 8192],
            },
            // Larger than a frame: split in three calls, one answer.
            IoOp::Write {
                offset: 100,
                data: pattern(9, (2 << 20) + 5000),
                fua: false,
            },
            IoOp::Read {
                offset: 0,
                buf: vec![0; 3 << 20],
            },
            IoOp::Write {
                offset: 7 << 20,
                data: pattern(1, 4096),
                fua: true,
            },
            IoOp::Flush,
            IoOp::Trim {
                offset: 1 << 20,
                len: 65536,
            },
            IoOp::WriteZeroes {
                offset: 2 << 20,
                len: 4096,
                may_trim: false,
            },
            IoOp::BlockStatus {
                offset: 0,
                len: 8 << 20,
            },
            IoOp::Read {
                offset: 0,
                buf: vec![0; 3 << 20],
            },
            // Errors, placed where they happened.
            IoOp::Read {
                offset: (8 << 20) - 10,
                buf: vec![0; 4096],
            },
            IoOp::Write {
                offset: 8 << 20,
                data: vec![1; 512],
                fua: false,
            },
            IoOp::Trim {
                offset: u64::MAX - 10,
                len: 5,
            },
        ]
    };
    for (a, b) in ops().into_iter().zip(ops()) {
        let what = format!("{a:?}").chars().take(80).collect::<String>();
        assert_eq!(gist(wait(&remote, a)), gist(wait(&here, b)), "{what}");
    }
    assert_eq!(n.volume_contents(), here.contents());
    let e = wait(
        &remote,
        IoOp::Read {
            offset: 8 << 20,
            buf: vec![0; 1],
        },
    )
    .unwrap_err();
    assert!(
        e.message.starts_with("replica volume v on replica ("),
        "{e}"
    );
    // Snapshots are the node's to make, by name; a refusal comes back.
    remote.snapshot("s1", 0, false).unwrap();
    // The origin reaches the node (version 3), and a group's member says
    // so (version 6).
    remote.snapshot("origin", 0x1234, false).unwrap();
    remote.snapshot("member", 0, true).unwrap();
    let e = remote.snapshot("member", 0, false).unwrap_err();
    assert_eq!(e.kind, IoErrorKind::Invalid, "{e}");
    remote.delete_snapshot("s1").unwrap();
    let e = remote.delete_snapshot("refused").unwrap_err();
    assert_eq!((e.kind, e.op), (IoErrorKind::NoSpace, "delete-snapshot"));
    let e = remote.snapshot("refused", 0, false).unwrap_err();
    assert_eq!((e.kind, e.op), (IoErrorKind::NoSpace, "snapshot"));
    assert!(e.message.contains("no room for v/refused"), "{e}");
    // A MemDevice keeps no generation: its refusal comes back as it is.
    let e = remote.activate(3).unwrap_err();
    assert_eq!((e.kind, e.op), (IoErrorKind::NotSupported, "activate"));
}

impl Node {
    fn volume_contents(&self) -> Vec<u8> {
        let mut buf = vec![0; 8 << 20];
        match wait(
            &*self.volume,
            IoOp::Read {
                offset: 0,
                buf: std::mem::take(&mut buf),
            },
        ) {
            Ok(IoDone::Read(b)) => b,
            r => panic!("{r:?}"),
        }
    }
}

#[test]
fn a_silent_replica_fails_the_calls_waiting_and_every_later_one() {
    let n = node(&[]);
    n.volume.hold(|op| matches!(op, IoOp::Write { .. }));
    let o = SessionOptions {
        silence: Duration::from_millis(300),
        ping_every: Duration::from_millis(50),
        ..SessionOptions::default()
    };
    let remote = n.connect("v", o).unwrap();
    // Pings keep an idle session: nothing fails while nothing waits.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(remote.failed(), None);
    let e = wait(
        &remote,
        IoOp::Write {
            offset: 0,
            data: vec![1; 4096],
            fua: false,
        },
    )
    .unwrap_err();
    assert_eq!(
        (e.kind, e.op, e.offset, e.len),
        (IoErrorKind::Io, "write", 0, 4096)
    );
    assert!(e.message.contains("no answer for 0.3 s"), "{e}");
    let e = wait(
        &remote,
        IoOp::Read {
            offset: 0,
            buf: vec![0; 512],
        },
    )
    .unwrap_err();
    assert_eq!(e.kind, IoErrorKind::Io);
    assert!(e.message.contains("no answer for 0.3 s"), "{e}");
    assert!(remote.failed().is_some());
    // The replica lets the session go once its socket is closed.
    eventually("the replica's session ended", || {
        n.served.source.replica_sessions() == 0
    });
    n.volume.clear();
    n.volume.release_all();
}

#[test]
fn a_lost_link_fails_the_calls_waiting() {
    let mut n = node(&[]);
    n.volume.hold(|op| matches!(op, IoOp::Flush));
    let remote = Arc::new(n.connect("v", SessionOptions::default()).unwrap());
    let r = remote.clone();
    let t = std::thread::spawn(move || wait(&*r, IoOp::Flush));
    n.volume.wait_held(1, Duration::from_secs(30));
    // The replica's node stops: its listener and sessions close.
    let served = std::mem::replace(&mut n.served, {
        let (_d, pool) = pool();
        n._dirs.push(_d);
        Served::new(pool, n._ca.identity("other").1)
    });
    drop(served);
    let e = t.join().unwrap().unwrap_err();
    assert_eq!((e.kind, e.op), (IoErrorKind::Io, "flush"));
    assert!(e.message.contains("connection lost"), "{e}");
    n.volume.clear();
    n.volume.release_all();
}

#[test]
fn a_session_holds_a_bounded_number_of_calls() {
    let n = node(&[]);
    n.volume.hold(|op| matches!(op, IoOp::Write { .. }));
    let remote = Arc::new(
        n.connect(
            "v",
            SessionOptions {
                silence: Duration::from_secs(120),
                ..SessionOptions::default()
            },
        )
        .unwrap(),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let total = SESSION_CALLS + 36;
    for i in 0..total {
        let tx = tx.clone();
        remote.submit(
            IoOp::Write {
                offset: i as u64 * 4096,
                data: vec![i as u8; 4096],
                fua: false,
            },
            Box::new(move |r| tx.send(r.map(|_| ())).unwrap()),
        );
    }
    n.volume.wait_held(SESSION_CALLS, Duration::from_secs(30));
    // No more reach the volume while those are held: the session reads
    // nothing more from its front end.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(n.volume.held().len(), SESSION_CALLS);
    n.volume.clear();
    n.volume.release_all();
    for _ in 0..total {
        rx.recv_timeout(Duration::from_secs(30)).unwrap().unwrap();
    }
    let mut want = vec![0u8; 8 << 20];
    for i in 0..total {
        want[i * 4096..(i + 1) * 4096].fill(i as u8);
    }
    assert!(n.volume_contents() == want, "every write landed");
}

#[test]
fn attaching_is_refused_with_a_clear_error_where_it_must_be() {
    let n = node(&[]);
    let o = SessionOptions::default();
    let e = n.connect("gone", o).err().unwrap();
    assert_eq!(e.reason(), Reason::SnapshotMissing, "{e}");
    assert!(
        e.to_string().contains("no volume gone") && e.to_string().contains("VolumeMissing"),
        "{e}"
    );

    // A front end of another CA: refused in the handshake.
    let other = Ca::new();
    let (_d, stranger) = other.identity("front");
    let e = RemoteVolume::connect(&stranger, &n.served.remote("replica"), "v", o)
        .err()
        .unwrap();
    assert_eq!(e.reason(), Reason::Refused, "{e}");

    // A node that serves no replica sessions says so.
    let ca = Ca::new();
    let (_a, id) = ca.identity("replica");
    let (_b, front) = ca.identity("front");
    let (_c, p) = pool();
    let plain = Served::new(p, id);
    let e = RemoteVolume::connect(&front, &plain.remote("replica"), "v", o)
        .err()
        .unwrap();
    assert!(e.to_string().contains("serves no replica sessions"), "{e}");
}

#[test]
fn a_peer_breaking_a_replica_session_gets_an_error_frame() {
    let n = node(&[]);
    // Version 1 has no replica sessions.
    let mut c = fake_client(&n.front, n.served.addr, "replica");
    write_frame(&mut c, &Frame::Hello { version: 1 });
    assert_eq!(read_frame(&mut c), Frame::Hello { version: 1 });
    write_frame(
        &mut c,
        &Frame::Attach {
            create: 0,
            volume: "v".into(),
        },
    );
    match read_frame(&mut c) {
        Frame::Error { code, message } => {
            assert_eq!(code, Code::BadRequest);
            assert!(
                message.contains("expected Request, got Attach"),
                "{message}"
            );
        }
        f => panic!("{f:?}"),
    }
    // A malformed call in an attached session.
    let (mut c, attached) = attach_by_hand(&n, VERSION);
    assert!(matches!(
        attached,
        Frame::Attached {
            size: 8388608,
            instance: Some(INSTANCE),
            ..
        }
    ));
    let mut buf = Vec::new();
    wire::encode_call(1, OpCode::Flush, 0, 4096, 0, &[], &mut buf);
    std::io::Write::write_all(&mut c, &buf).unwrap();
    match read_frame(&mut c) {
        Frame::Error { code, message } => {
            assert_eq!(code, Code::BadRequest);
            assert!(message.contains("flush call with offset 4096"), "{message}");
        }
        f => panic!("{f:?}"),
    }
    eventually("the session ended", || {
        n.served.source.replica_sessions() == 0
    });
}

#[test]
fn a_retire_is_answered_by_the_node_and_refused_by_an_older_one() {
    let n = node(&[]);
    let t = std::time::Duration::from_secs(10);
    let remote = n.served.remote("replica");
    // There, checked or deleted; gone, as good.
    assert!(retire(&n.front, &remote, "v", true, t).unwrap());
    assert!(retire(&n.front, &remote, "v", false, t).unwrap());
    assert!(!retire(&n.front, &remote, "gone", false, t).unwrap());
    // Not a replica of this front end's: refused, with the node's reason.
    let e = retire(&n.front, &remote, "own", false, t).unwrap_err();
    assert!(
        matches!(
            e,
            TransferError::Remote {
                code: Code::NotReplica,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("this node's own"), "{e}");
    // A name the engine refuses never reaches the node's volumes.
    let e = retire(&n.front, &remote, "../x", false, t).unwrap_err();
    assert!(e.to_string().contains("BadRequest"), "{e}");
    // A Retire in a session of version 3 is an unexpected frame.
    let mut c = fake_client(&n.front, n.served.addr, "replica");
    write_frame(&mut c, &Frame::Hello { version: 3 });
    assert_eq!(read_frame(&mut c), Frame::Hello { version: 3 });
    write_frame(
        &mut c,
        &Frame::Retire {
            check: false,
            volume: "v".into(),
        },
    );
    match read_frame(&mut c) {
        Frame::Error { code, message } => {
            assert_eq!(code, Code::BadRequest);
            assert!(
                message.contains("expected Request, got Retire"),
                "{message}"
            );
        }
        f => panic!("{f:?}"),
    }
    // A node of version 3 refuses Hello 4: the retire fails with that
    // refusal, and never falls back to a version without Retire.
    let (addr, fake) = fake_source(n.replica.clone(), |s| {
        assert_eq!(read_frame(s), Frame::Hello { version: 4 });
        write_frame(
            s,
            &Frame::Error {
                code: Code::Version,
                message: "this source speaks transfer protocol version 1 to 3, the peer version 4"
                    .into(),
            },
        );
    });
    let old = lamina_transfer::Remote {
        address: addr.to_string(),
        node: "replica".into(),
    };
    let e = retire(&n.front, &old, "v", false, t).unwrap_err();
    fake.join().unwrap();
    assert!(
        matches!(
            e,
            TransferError::Remote {
                code: Code::Version,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("version 1 to 3"), "{e}");
}

#[test]
fn a_front_end_falls_back_to_what_an_older_node_speaks_and_gets_no_instance() {
    let n = node(&[]);
    // A node of version 4 refuses Hello 6 and 5 and serves a session of
    // 3, with no instance in its Attached; in a session of 3 the real node
    // says none either.
    let (addr, fake) = fake_sources(n.replica.clone(), 3, |i, s| match i {
        0 | 1 => {
            let v = 6 - i as u16;
            assert_eq!(read_frame(s), Frame::Hello { version: v });
            write_frame(
                s,
                &Frame::Error {
                    code: Code::Version,
                    message: format!(
                        "this source speaks transfer protocol version 1 to 4, the peer version {v}"
                    ),
                },
            );
        }
        _ => {
            assert_eq!(read_frame(s), Frame::Hello { version: 3 });
            write_frame(s, &Frame::Hello { version: 3 });
            assert!(matches!(read_frame(s), Frame::Attach { .. }));
            write_frame(
                s,
                &Frame::Attached {
                    size: 8 << 20,
                    caps: Caps {
                        flush: true,
                        fua: false,
                        trim: false,
                        write_zeroes: false,
                        block_status: false,
                    },
                    read_only: false,
                    instance: None,
                },
            );
        }
    });
    let old = lamina_transfer::Remote {
        address: addr.to_string(),
        node: "replica".into(),
    };
    let v = RemoteVolume::connect(&n.front, &old, "v", SessionOptions::default()).unwrap();
    fake.join().unwrap();
    assert_eq!(v.instance(), None);
    drop(v);

    let (_c, attached) = attach_by_hand(&n, 3);
    assert!(matches!(attached, Frame::Attached { instance: None, .. }));
}

#[test]
fn a_front_end_marks_a_group_snapshots_members_only_for_a_node_of_version_6() {
    let n = node(&[]);
    // A node of version 5 refuses Hello 6 and serves a session of 5: a
    // group's member is asked for with no group flag, which it would
    // refuse as malformed.
    let (addr, fake) = fake_sources(n.replica.clone(), 2, |i, s| match i {
        0 => {
            assert_eq!(read_frame(s), Frame::Hello { version: 6 });
            write_frame(
                s,
                &Frame::Error {
                    code: Code::Version,
                    message:
                        "this source speaks transfer protocol version 1 to 5, the peer version 6"
                            .into(),
                },
            );
        }
        _ => {
            assert_eq!(read_frame(s), Frame::Hello { version: 5 });
            write_frame(s, &Frame::Hello { version: 5 });
            assert!(matches!(read_frame(s), Frame::Attach { .. }));
            write_frame(
                s,
                &Frame::Attached {
                    size: 8 << 20,
                    caps: Caps {
                        flush: true,
                        fua: false,
                        trim: false,
                        write_zeroes: false,
                        block_status: false,
                    },
                    read_only: false,
                    instance: Some(7),
                },
            );
            let Frame::Call(c) = read_frame(s) else {
                panic!("not a call")
            };
            assert_eq!(
                c.op,
                wire::CallOp::Snapshot {
                    name: "g1".into(),
                    origin: 0x1234,
                    group: false
                }
            );
            write_frame(
                s,
                &Frame::Reply(wire::Reply {
                    tag: c.tag,
                    outcome: wire::Outcome::Done(wire::Answered::Snapshot),
                }),
            );
        }
    });
    let old = lamina_transfer::Remote {
        address: addr.to_string(),
        node: "replica".into(),
    };
    let v = RemoteVolume::connect(&n.front, &old, "v", SessionOptions::default()).unwrap();
    assert_eq!(v.instance(), Some(7));
    v.snapshot("g1", 0x1234, true).unwrap();
    drop(v);
    fake.join().unwrap();
}

/// A session of `version` to `n`'s volume "v" opened frame by frame: the
/// connection, and the answer to its Attach.
fn attach_by_hand(
    n: &Node,
    version: u16,
) -> (
    rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>,
    Frame,
) {
    let mut c = fake_client(&n.front, n.served.addr, "replica");
    write_frame(&mut c, &Frame::Hello { version });
    assert_eq!(read_frame(&mut c), Frame::Hello { version });
    write_frame(
        &mut c,
        &Frame::Attach {
            create: 0,
            volume: "v".into(),
        },
    );
    let answer = read_frame(&mut c);
    (c, answer)
}
