//! The rules of the crate's documentation, each checked with in-memory
//! replicas whose operations a test fails or holds (`Gated`), and a
//! model-based test: random writes, reads and flushes, with replicas
//! failing at random, against a model of what was acknowledged.

use super::*;
use lamina_blockio::testing::{Gated, MemDevice};
use lamina_blockio::wait;
use proptest::prelude::*;
use std::sync::mpsc;
use std::time::Duration;

const SIZE: usize = 1 << 20;

/// The records made, and whether the next ones fail or wait.
#[derive(Default)]
struct Record {
    faults: Mutex<Vec<(usize, String)>>,
    refuse: AtomicBool,
    /// While set, a record waits for `go`.
    hold: Mutex<Option<mpsc::Receiver<()>>>,
}

impl Membership for Record {
    fn fault(&self, index: usize, name: &str, _reason: &str, _: &[u64]) -> Result<(), IoError> {
        if let Some(go) = self.hold.lock().unwrap().take() {
            go.recv().unwrap();
        }
        if self.refuse.load(Ordering::SeqCst) {
            return Err(IoError::new(IoErrorKind::Io, "the store failed"));
        }
        self.faults.lock().unwrap().push((index, name.to_string()));
        Ok(())
    }
}

impl Record {
    fn faulted(&self) -> Vec<usize> {
        self.faults.lock().unwrap().iter().map(|f| f.0).collect()
    }
}

struct Set {
    devices: Vec<Arc<MemDevice>>,
    gates: Vec<Arc<Gated<MemDevice>>>,
    record: Arc<Record>,
    vol: Arc<Replicated>,
}

fn set(n: usize) -> Set {
    let devices: Vec<_> = (0..n).map(|_| Arc::new(MemDevice::new(SIZE))).collect();
    let gates: Vec<_> = devices
        .iter()
        .map(|d| Arc::new(Gated::new(d.clone())))
        .collect();
    let record = Arc::new(Record::default());
    let vol = Arc::new(
        Replicated::new(
            "v",
            gates
                .iter()
                .enumerate()
                .map(|(i, g)| Replica {
                    name: format!("r{i}"),
                    io: g.clone() as Arc<dyn BlockIo>,
                })
                .collect(),
            record.clone(),
        )
        .unwrap(),
    );
    Set {
        devices,
        gates,
        record,
        vol,
    }
}

fn write(v: &dyn BlockIo, offset: u64, byte: u8) -> Result<(), IoError> {
    wait(
        v,
        IoOp::Write {
            offset,
            data: vec![byte; 4096],
            fua: false,
        },
    )
    .map(|_| ())
}

fn read(v: &dyn BlockIo, offset: u64) -> Result<Vec<u8>, IoError> {
    match wait(
        v,
        IoOp::Read {
            offset,
            buf: vec![0xEE; 4096],
        },
    )? {
        IoDone::Read(b) => Ok(b),
        d => panic!("a read completed as {d:?}"),
    }
}

fn is_write(op: &IoOp) -> bool {
    matches!(op, IoOp::Write { .. })
}

fn is_read(op: &IoOp) -> bool {
    matches!(op, IoOp::Read { .. })
}

#[test]
fn changes_reach_every_replica_and_reads_the_first() {
    let s = set(3);
    write(&*s.vol, 8192, 7).unwrap();
    wait(&*s.vol, IoOp::Flush).unwrap();
    for d in &s.devices {
        assert_eq!(&d.contents()[8192..8192 + 4096], &[7u8; 4096][..]);
        assert_eq!(d.flush_count(), 1);
    }
    s.gates[1].fail(IoErrorKind::Io, is_read);
    s.gates[2].fail(IoErrorKind::Io, is_read);
    assert_eq!(read(&*s.vol, 8192).unwrap(), vec![7; 4096]);
    assert_eq!(s.vol.size().unwrap(), SIZE as u64);
    assert!(s.record.faulted().is_empty());
}

#[test]
fn a_replica_that_fails_a_write_is_recorded_faulted_before_the_write_completes() {
    let s = set(2);
    s.gates[1].fail(IoErrorKind::Io, is_write);
    let (go, wait_go) = mpsc::channel();
    *s.record.hold.lock().unwrap() = Some(wait_go);
    let (tx, rx) = mpsc::channel();
    // The failing replica answers at once, on the submitting thread, which
    // then records the fault: submitted from a thread of its own.
    let vol = s.vol.clone();
    let submitter = std::thread::spawn(move || {
        vol.submit(
            IoOp::Write {
                offset: 0,
                data: vec![1; 4096],
                fua: false,
            },
            Box::new(move |r| tx.send(r).unwrap()),
        )
    });
    // The record is held: the write must not have completed.
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    // Already out of the healthy set: nothing more goes to it.
    assert!(matches!(s.vol.states()[1].1, State::Faulted(_)));
    // A write that goes to the healthy one alone, and succeeds there, must
    // not complete either while the record is on its way: the record still
    // calls r1 healthy, and r1 never got it.
    let (tx2, rx2) = mpsc::channel();
    let vol = s.vol.clone();
    let other = std::thread::spawn(move || {
        vol.submit(
            IoOp::Write {
                offset: 65536,
                data: vec![9; 4096],
                fua: false,
            },
            Box::new(move |r| tx2.send(r).unwrap()),
        )
    });
    assert!(rx2.recv_timeout(Duration::from_millis(200)).is_err());
    assert_eq!(
        &s.devices[0].contents()[65536..65536 + 4096],
        &[9u8; 4096][..]
    );
    assert_eq!(
        &s.devices[1].contents()[65536..65536 + 4096],
        &[0u8; 4096][..]
    );
    go.send(()).unwrap();
    assert!(matches!(rx.recv().unwrap(), Ok(IoDone::Write(_))));
    assert!(matches!(rx2.recv().unwrap(), Ok(IoDone::Write(_))));
    submitter.join().unwrap();
    other.join().unwrap();
    assert_eq!(s.record.faulted(), vec![1]);
    assert!(matches!(s.vol.states()[1].1, State::Faulted(_)));
    // Later writes skip it; the healthy one has them.
    s.gates[1].clear();
    write(&*s.vol, 4096, 2).unwrap();
    assert_eq!(&s.devices[0].contents()[4096..8192], &[2u8; 4096][..]);
    assert_eq!(&s.devices[1].contents()[4096..8192], &[0u8; 4096][..]);
    assert_eq!(s.record.faulted(), vec![1], "recorded once");
}

#[test]
fn a_read_that_fails_is_asked_of_the_next_replica_and_the_first_is_faulted() {
    let s = set(3);
    write(&*s.vol, 0, 5).unwrap();
    s.gates[0].fail(IoErrorKind::Io, is_read);
    assert_eq!(read(&*s.vol, 0).unwrap(), vec![5; 4096]);
    assert_eq!(s.record.faulted(), vec![0]);
    // Out of range is the request's fault: nobody is faulted for it.
    let e = read(&*s.vol, SIZE as u64).unwrap_err();
    assert_eq!(e.kind, IoErrorKind::Invalid, "{e}");
    assert_eq!(s.record.faulted(), vec![0]);
}

#[test]
fn a_change_every_replica_failed_fails_and_faults_none() {
    let s = set(2);
    for g in &s.gates {
        g.fail(IoErrorKind::NoSpace, is_write);
    }
    let e = write(&*s.vol, 0, 1).unwrap_err();
    assert_eq!(e.kind, IoErrorKind::NoSpace, "{e}");
    assert!(s.record.faulted().is_empty());
    for g in &s.gates {
        g.clear();
    }
    write(&*s.vol, 0, 1).unwrap();
}

#[test]
fn a_fault_that_cannot_be_recorded_fails_the_change_until_it_is() {
    let s = set(2);
    s.gates[0].fail(IoErrorKind::Io, is_write);
    s.record.refuse.store(true, Ordering::SeqCst);
    let e = write(&*s.vol, 0, 1).unwrap_err();
    assert_eq!(e.kind, IoErrorKind::Io, "{e}");
    assert!(e.message.contains("could not be recorded"), "{e}");
    s.gates[0].clear();
    // Still out, so reads come from the other, which holds the write (the
    // first never got it); the next change tries the record again, and
    // fails while the store does.
    assert_eq!(read(&*s.vol, 0).unwrap(), vec![1; 4096]);
    assert_eq!(&s.devices[0].contents()[..4096], &[0u8; 4096][..]);
    assert!(write(&*s.vol, 4096, 2).is_err());
    s.record.refuse.store(false, Ordering::SeqCst);
    write(&*s.vol, 4096, 3).unwrap();
    assert_eq!(s.record.faulted(), vec![0]);
    assert_eq!(&s.devices[0].contents()[4096..8192], &[0u8; 4096][..]);
}

#[test]
fn fenced_fails_everything_and_faults_nobody() {
    let s = set(2);
    s.gates[1].fail(IoErrorKind::Fenced, |_| true);
    let e = write(&*s.vol, 0, 1).unwrap_err();
    assert_eq!(e.kind, IoErrorKind::Fenced, "{e}");
    s.gates[1].clear();
    assert_eq!(write(&*s.vol, 0, 1).unwrap_err().kind, IoErrorKind::Fenced);
    assert_eq!(read(&*s.vol, 0).unwrap_err().kind, IoErrorKind::Fenced);
    assert!(s.record.faulted().is_empty());
}

#[test]
fn with_no_healthy_replica_left_everything_fails() {
    let s = set(2);
    s.gates[0].fail(IoErrorKind::Io, is_read);
    s.gates[1].fail(IoErrorKind::Io, is_read);
    let e = read(&*s.vol, 0).unwrap_err();
    assert!(e.message.contains("no healthy replica"), "{e}");
    let e = write(&*s.vol, 0, 1).unwrap_err();
    assert!(e.message.contains("no healthy replica"), "{e}");
    assert!(s.vol.size().is_err());
}

#[derive(Debug, Clone)]
enum Step {
    /// Write `byte` to block `block`, the replicas of `failing` (a bit
    /// each) failing it.
    Write {
        block: u8,
        byte: u8,
        failing: u8,
    },
    Read {
        block: u8,
        failing: u8,
    },
    Flush,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..16, 1u8..=255, 0u8..8).prop_map(|(block, byte, failing)| Step::Write { block, byte, failing }),
        3 => (0u8..16, 0u8..8).prop_map(|(block, failing)| Step::Read { block, failing }),
        1 => Just(Step::Flush),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Whatever fails: an acknowledged write is read back, every replica
    /// not recorded faulted holds every acknowledged write, and a write
    /// that failed leaves its block old or new.
    #[test]
    fn acknowledged_writes_survive_failing_replicas(steps in prop::collection::vec(step(), 1..60)) {
        let s = set(3);
        // Per block: the values it may hold (one once acknowledged).
        let mut model: Vec<Vec<u8>> = vec![vec![0]; 16];
        for st in steps {
            match st {
                Step::Write { block, byte, failing } => {
                    for (i, g) in s.gates.iter().enumerate() {
                        if failing & (1 << i) != 0 {
                            g.fail(IoErrorKind::Io, is_write);
                        }
                    }
                    let r = write(&*s.vol, block as u64 * 4096, byte);
                    for g in &s.gates {
                        g.clear();
                    }
                    let m = &mut model[block as usize];
                    match r {
                        Ok(()) => *m = vec![byte],
                        Err(_) => m.push(byte),
                    }
                }
                Step::Read { block, failing } => {
                    for (i, g) in s.gates.iter().enumerate() {
                        if failing & (1 << i) != 0 {
                            g.fail(IoErrorKind::Io, is_read);
                        }
                    }
                    let r = read(&*s.vol, block as u64 * 4096);
                    for g in &s.gates {
                        g.clear();
                    }
                    if let Ok(b) = r {
                        prop_assert!(model[block as usize].contains(&b[0]), "block {block}: {} not in {:?}", b[0], model[block as usize]);
                        prop_assert!(b.iter().all(|&x| x == b[0]));
                    }
                }
                Step::Flush => {
                    let _ = wait(&*s.vol, IoOp::Flush);
                }
            }
            // Every replica the record does not call faulted holds what was
            // acknowledged.
            let faulted = s.record.faulted();
            for (i, d) in s.devices.iter().enumerate() {
                if faulted.contains(&i) {
                    continue;
                }
                let c = d.contents();
                for (b, m) in model.iter().enumerate() {
                    if m.len() == 1 {
                        prop_assert_eq!(c[b * 4096], m[0], "replica {} block {}", i, b);
                    }
                }
            }
        }
    }
}

#[test]
fn overlapping_changes_reach_every_replica_in_the_order_they_were_submitted() {
    let s = set(2);
    // The first replica holds every write: the second answers at once.
    s.gates[0].hold(is_write);
    let submit = |byte: u8| {
        let vol = s.vol.clone();
        let (tx, rx) = mpsc::channel();
        vol.submit(
            IoOp::Write {
                offset: 0,
                data: vec![byte; 8192],
                fua: false,
            },
            Box::new(move |r| tx.send(r).unwrap()),
        );
        rx
    };
    let first = submit(1);
    s.gates[0].wait_held(1, Duration::from_secs(10));
    // Overlapping the first, still in flight: it waits, and reaches
    // neither replica; one that does not overlap goes at once.
    let second = submit(2);
    let apart = std::thread::spawn({
        let vol = s.vol.clone();
        move || write(&*vol, 65536, 3)
    });
    s.gates[0].wait_held(2, Duration::from_secs(10));
    assert_eq!(
        s.gates[0].held(),
        vec![("write", 0, 8192), ("write", 65536, 4096)]
    );
    assert_eq!(&s.devices[1].contents()[..8192], &[1u8; 8192][..]);
    // The first completes, then the second is sent to both.
    s.gates[0].release(0);
    assert!(first.recv().unwrap().is_ok());
    s.gates[0].wait_held(2, Duration::from_secs(10));
    s.gates[0].release_all();
    assert!(second.recv().unwrap().is_ok());
    apart.join().unwrap().unwrap();
    for d in &s.devices {
        assert_eq!(&d.contents()[..8192], &[2u8; 8192][..]);
    }
}

#[test]
fn quiesced_work_runs_with_no_change_in_flight_and_holds_new_ones_until_it_returns() {
    let s = set(2);
    s.gates[0].hold(is_write);
    let (tx, rx) = mpsc::channel();
    let submit = |offset: u64, byte: u8, tx: mpsc::Sender<(u64, Result<(), IoError>)>| {
        s.vol.submit(
            IoOp::Write {
                offset,
                data: vec![byte; 4096],
                fua: false,
            },
            Box::new(move |r| tx.send((offset, r.map(|_| ()))).unwrap()),
        )
    };
    submit(0, 1, tx.clone());
    s.gates[0].wait_held(1, Duration::from_secs(30));

    // The work waits for the write in flight.
    let (ran_tx, ran) = mpsc::channel();
    let (go, wait_go) = mpsc::channel::<()>();
    let vol = s.vol.clone();
    let quiet = std::thread::spawn(move || {
        vol.quiesced(|healthy| {
            ran_tx.send(healthy.to_vec()).unwrap();
            wait_go.recv().unwrap();
        })
    });
    assert!(
        ran.recv_timeout(Duration::from_millis(200)).is_err(),
        "the work ran while a write was in flight"
    );
    s.gates[0].clear();
    s.gates[0].release_all();
    assert_eq!(rx.recv().unwrap(), (0, Ok(())));
    assert_eq!(
        ran.recv().unwrap(),
        vec!["r0".to_string(), "r1".to_string()]
    );

    // While the work runs, a new change (not overlapping anything) waits:
    // no replica has it.
    submit(8192, 2, tx.clone());
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    for d in &s.devices {
        assert_eq!(&d.contents()[8192..8192 + 4096], &[0u8; 4096][..]);
    }
    go.send(()).unwrap();
    quiet.join().unwrap();
    assert_eq!(rx.recv().unwrap(), (8192, Ok(())));
    for d in &s.devices {
        assert_eq!(&d.contents()[8192..8192 + 4096], &[2u8; 4096][..]);
    }
    // A replica the work failed is faulted and recorded as a change's.
    s.vol.fault("r1", "the snapshot failed").unwrap();
    assert_eq!(s.record.faulted(), vec![1]);
    assert!(s.vol.fault("r9", "x").is_err());
}

#[test]
fn what_a_faulted_replica_missed_is_kept_from_the_changes_in_flight_on() {
    let s = set(2);
    // A write held on r0 is in flight when r1 fails another one.
    s.gates[0].hold(|op| matches!(op, IoOp::Write { offset: 0, .. }));
    let vol = s.vol.clone();
    let held = std::thread::spawn(move || write(&*vol, 0, 1));
    s.gates[0].wait_held(1, Duration::from_secs(5));
    s.gates[1].fail(IoErrorKind::Io, is_write);
    write(&*s.vol, 65536, 2).unwrap();
    s.gates[0].release_all();
    held.join().unwrap().unwrap();
    // Sent since: kept, adjacent ones merged.
    write(&*s.vol, 8192, 3).unwrap();
    write(&*s.vol, 12288, 4).unwrap();
    wait(&*s.vol, IoOp::Flush).unwrap();
    let m = s.vol.quiesced(|_| s.vol.take_missed("r1")).unwrap();
    // Nothing it answered was unflushed at its fault.
    assert_eq!(m.unflushed, Missed::Ranges(vec![]));
    let Missed::Ranges(mut r) = m.missed else {
        panic!("kept ranges, got {m:?}")
    };
    r.sort();
    assert_eq!(r, vec![(0, 4096), (8192, 16384), (65536, 69632)]);
    // Handed over once: not kept any more.
    write(&*s.vol, 4096, 5).unwrap();
    assert_eq!(s.vol.take_missed("r1").unwrap(), Kept::NONE);
    assert_eq!(s.vol.take_missed("r0").unwrap(), Kept::NONE);
}

#[test]
fn past_the_limit_only_too_many_is_kept() {
    let mut m = Missed::Ranges(Vec::new());
    for i in 0..=MISSED_LIMIT as u64 {
        m.add((i * 8192, i * 8192 + 4096));
    }
    assert_eq!(m, Missed::TooMany);
    m.add((0, 1));
    assert_eq!(m, Missed::TooMany);
}

/// A two-replica set whose second starts faulted (absent), keeping what it
/// misses: the front end of a daemon that found it unreachable.
fn set_with_absent() -> (Arc<MemDevice>, Arc<Replicated>, Arc<Record>) {
    let d0 = Arc::new(MemDevice::new(SIZE));
    let (vol, record) = absent_beside(d0.clone(), true);
    (d0, vol, record)
}

/// `r0` of volume `io`, healthy, and `r1` absent, faulted.
fn absent_beside(io: Arc<dyn BlockIo>, keep_missed: bool) -> (Arc<Replicated>, Arc<Record>) {
    let record = Arc::new(Record::default());
    let vol = Replicated::with_states(
        "v",
        vec![
            (
                Replica {
                    name: "r0".into(),
                    io,
                },
                Start::Healthy,
            ),
            (
                Replica::absent("r1"),
                Start::Faulted {
                    reason: "unreachable".into(),
                    keep_missed,
                },
            ),
        ],
        record.clone(),
    )
    .unwrap();
    (Arc::new(vol), record)
}

#[test]
fn a_replica_faulted_at_the_start_gets_nothing_and_is_not_recorded_again() {
    let (d0, vol, record) = set_with_absent();
    assert_eq!(vol.states()[1].1, State::Faulted("unreachable".into()));
    write(&*vol, 4096, 9).unwrap();
    assert_eq!(read(&*vol, 4096).unwrap(), vec![9; 4096]);
    assert_eq!(&d0.contents()[4096..8192], &[9u8; 4096][..]);
    assert!(record.faulted().is_empty(), "recorded before the start");
    assert_eq!(
        vol.take_missed("r1").unwrap(),
        Kept {
            missed: Missed::Ranges(vec![(4096, 8192)]),
            unflushed: Missed::Ranges(vec![]),
        }
    );
    // Only a faulted replica rejoins; only a rebuilding one is promoted.
    let e = vol
        .rejoin("r0", Arc::new(MemDevice::new(SIZE)))
        .unwrap_err();
    assert_eq!(e.kind, IoErrorKind::Invalid);
    assert_eq!(vol.promote("r1").unwrap_err().kind, IoErrorKind::Io);
    assert!(vol.copy("r1", 0, 4096).is_err(), "not rebuilding");
    assert_eq!(vol.copy("r1", 0, 0).unwrap_err().kind, IoErrorKind::Invalid);
    assert_eq!(
        vol.copy("rx", 0, 4096).unwrap_err().kind,
        IoErrorKind::Invalid
    );
}

#[test]
fn a_rebuilding_replica_gets_every_change_and_its_copies_never_put_old_data_over_new() {
    let (d0, vol, _record) = set_with_absent();
    for i in 0..16u64 {
        write(&*vol, i * 4096, i as u8 + 1).unwrap();
    }
    let d1 = Arc::new(MemDevice::new(SIZE));
    let g1 = Arc::new(Gated::new(d1.clone()));
    vol.quiesced(|healthy| {
        assert_eq!(healthy, ["r0".to_string()]);
        vol.rejoin("r1", g1.clone()).unwrap();
    });
    assert_eq!(vol.states()[1].1, State::Rebuilding);
    assert!(vol.is_rebuilding("r1"));
    // A change from now on reaches it; reads do not.
    write(&*vol, 16 * 4096, 77).unwrap();
    assert_eq!(&d1.contents()[16 * 4096..17 * 4096], &[77u8; 4096][..]);
    // A copy overlapping a write in flight waits for it, and then reads the
    // new data: hold the write on r1 and start the copy.
    g1.hold(|op| matches!(op, IoOp::Write { offset: 0, data, .. } if data.len() == 4096));
    let v2 = vol.clone();
    let w = std::thread::spawn(move || write(&*v2, 0, 99));
    g1.wait_held(1, Duration::from_secs(5));
    let v3 = vol.clone();
    let c = std::thread::spawn(move || v3.copy("r1", 0, 16 * 4096));
    std::thread::sleep(Duration::from_millis(100));
    assert!(!c.is_finished(), "the copy waits for the overlapping write");
    g1.release_all();
    w.join().unwrap().unwrap();
    assert!(c.join().unwrap().unwrap(), "data sent");
    // Zeros go as write-zeroes.
    write(&*d1, 17 * 4096, 1).unwrap();
    assert!(!vol.copy("r1", 17 * 4096, 4096).unwrap());
    assert_eq!(d1.contents(), d0.contents());
    vol.quiesced(|_| vol.promote("r1")).unwrap();
    assert_eq!(vol.states()[1].1, State::Healthy);
    // Healthy now: a change it fails faults it again, through the record.
    g1.fail(IoErrorKind::Io, is_write);
    write(&*vol, 0, 5).unwrap();
    assert!(matches!(vol.states()[1].1, State::Faulted(_)));
}

#[test]
fn a_rebuilding_replica_that_fails_a_change_leaves_the_write_set_and_the_change_succeeds() {
    let (_d0, vol, record) = set_with_absent();
    vol.take_missed("r1").unwrap();
    let g1 = Arc::new(Gated::new(Arc::new(MemDevice::new(SIZE))));
    vol.quiesced(|_| vol.rejoin("r1", g1.clone())).unwrap();
    // Answered while rebuilding, and no flush since.
    write(&*vol, 16384, 3).unwrap();
    g1.fail(IoErrorKind::Io, is_write);
    write(&*vol, 8192, 1).unwrap();
    assert!(!vol.is_rebuilding("r1"));
    assert!(matches!(vol.states()[1].1, State::Faulted(_)));
    assert!(record.faulted().is_empty(), "no record: it was not healthy");
    assert_eq!(
        vol.quiesced(|_| vol.promote("r1")).unwrap_err().kind,
        IoErrorKind::Io
    );
    // What it missed is kept again, from the failed change on; and what
    // no flush covered counts as missed, not as held: it may predate the
    // rejoin, and never have reached it.
    write(&*vol, 0, 2).unwrap();
    let kept = vol.take_missed("r1").unwrap();
    assert_eq!(kept.unflushed, Missed::Ranges(vec![]));
    let Missed::Ranges(mut r) = kept.missed else {
        panic!("kept")
    };
    r.sort();
    assert_eq!(r, vec![(0, 4096), (8192, 12288), (16384, 20480)]);
    // And a change only a rebuilding replica took fails: no healthy one
    // holds it.
    let g0 = Arc::new(Gated::new(Arc::new(MemDevice::new(SIZE))));
    let (vol, _) = absent_beside(g0.clone(), false);
    vol.quiesced(|_| vol.rejoin("r1", Arc::new(MemDevice::new(SIZE))))
        .unwrap();
    g0.fail(IoErrorKind::Io, is_write);
    assert!(write(&*vol, 0, 1).is_err());
}

#[test]
fn what_no_flush_covered_counts_as_missed_by_a_replica_that_fails() {
    let s = set(2);
    write(&*s.vol, 0, 1).unwrap();
    wait(&*s.vol, IoOp::Flush).unwrap();
    // Completed, not flushed: a replica that crashed may have lost it.
    write(&*s.vol, 8192, 2).unwrap();
    s.gates[1].fail(IoErrorKind::Io, is_write);
    write(&*s.vol, 65536, 3).unwrap();
    let kept = s.vol.take_missed("r1").unwrap();
    // Apart: the one it answered, which its node holds unless it lost what
    // was not durable, and the one it failed.
    assert_eq!(kept.unflushed, Missed::Ranges(vec![(8192, 12288)]));
    assert_eq!(kept.missed, Missed::Ranges(vec![(65536, 69632)]));
    let Missed::Ranges(r) = kept.all() else {
        panic!("kept")
    };
    assert_eq!(
        r,
        vec![(8192, 12288), (65536, 69632)],
        "not the flushed one"
    );
}

#[test]
fn kept_parts_merge_into_one_sorted_list() {
    let k = |m: Missed, u: Missed| {
        Kept {
            missed: m,
            unflushed: u,
        }
        .all()
    };
    let r = |v: &[(u64, u64)]| Missed::Ranges(v.to_vec());
    assert_eq!(k(Missed::NotKept, Missed::NotKept), Missed::NotKept);
    assert_eq!(
        k(r(&[(8192, 12288)]), r(&[(0, 4096), (4096, 8192)])),
        r(&[(0, 12288)])
    );
    assert_eq!(k(r(&[(0, 1)]), Missed::TooMany), Missed::TooMany);
    assert_eq!(k(Missed::NotKept, r(&[(5, 9)])), r(&[(5, 9)]));
}

/// The write intent's records (rule 14).
#[derive(Default)]
struct Intent {
    dirty: Mutex<std::collections::BTreeSet<u64>>,
    marks: AtomicUsize,
    refuse: AtomicBool,
}

impl Membership for Intent {
    fn fault(&self, _: usize, _: &str, _: &str, _: &[u64]) -> Result<(), IoError> {
        Ok(())
    }
    fn dirty(&self, regions: &[u64]) -> Result<(), IoError> {
        if self.refuse.load(Ordering::SeqCst) {
            return Err(IoError::new(IoErrorKind::Io, "the store failed"));
        }
        self.marks.fetch_add(1, Ordering::SeqCst);
        self.dirty.lock().unwrap().extend(regions);
        Ok(())
    }
    fn clean(&self, regions: &[u64]) -> Result<(), IoError> {
        let mut d = self.dirty.lock().unwrap();
        for r in regions {
            d.remove(r);
        }
        Ok(())
    }
}

#[test]
fn a_region_is_recorded_dirty_before_a_change_is_sent_and_clean_only_once_flushed() {
    let devices: Vec<_> = (0..2).map(|_| Arc::new(MemDevice::new(SIZE))).collect();
    let intent = Arc::new(Intent::default());
    let vol = Replicated::new(
        "v",
        devices
            .iter()
            .enumerate()
            .map(|(i, d)| Replica {
                name: format!("r{i}"),
                io: d.clone(),
            })
            .collect(),
        intent.clone(),
    )
    .unwrap();
    // The record fails: the write fails, and no replica got it.
    intent.refuse.store(true, Ordering::SeqCst);
    assert!(write(&vol, 0, 1).is_err());
    for d in &devices {
        assert_eq!(&d.contents()[..4096], &[0u8; 4096][..]);
    }
    intent.refuse.store(false, Ordering::SeqCst);
    write(&vol, 0, 1).unwrap();
    write(&vol, 8192, 2).unwrap();
    assert_eq!(*intent.dirty.lock().unwrap(), [0].into());
    assert_eq!(intent.marks.load(Ordering::SeqCst), 1, "recorded once");
    // Not flushed: closing leaves it dirty.
    vol.close();
    assert_eq!(*intent.dirty.lock().unwrap(), [0].into());
    wait(&vol, IoOp::Flush).unwrap();
    vol.close();
    assert!(intent.dirty.lock().unwrap().is_empty());
    // Written again: recorded again.
    write(&vol, 4096, 3).unwrap();
    assert_eq!(*intent.dirty.lock().unwrap(), [0].into());
    assert_eq!(intent.marks.load(Ordering::SeqCst), 2);
}

#[test]
fn a_replica_added_in_a_vacant_place_is_rebuilt_and_one_removed_leaves_its_place_vacant() {
    let d0 = Arc::new(MemDevice::new(SIZE));
    let record = Arc::new(Record::default());
    let vol = Arc::new(
        Replicated::with_states(
            "v",
            vec![
                (
                    Replica {
                        name: "r0".into(),
                        io: d0.clone(),
                    },
                    Start::Healthy,
                ),
                (Replica::vacant(), Start::Vacant),
            ],
            record.clone(),
        )
        .unwrap(),
    );
    // A vacant place is not listed, gets nothing, and is no replica.
    assert_eq!(vol.states(), vec![("r0".to_string(), State::Healthy)]);
    write(&*vol, 0, 1).unwrap();
    assert!(vol.remove("").is_err());
    assert!(vol.add("r0", "new").is_err(), "a name is taken once");
    vol.quiesced(|_| vol.add("r1", "new replica")).unwrap();
    assert!(vol.add("r2", "new").is_err(), "no room left");
    assert_eq!(
        vol.states()[1],
        ("r1".to_string(), State::Faulted("new replica".into()))
    );
    // Nothing is kept of what it misses: its rebuild copies everything.
    write(&*vol, 4096, 2).unwrap();
    assert!(!vol.is_keeping("r1"));
    assert_eq!(vol.take_missed("r1").unwrap(), Kept::NONE);
    assert!(
        record.faulted().is_empty(),
        "added as recorded: no record made"
    );
    // Rebuilt: rejoined, copied, promoted.
    let d1 = Arc::new(MemDevice::new(SIZE));
    vol.quiesced(|_| vol.rejoin("r1", d1.clone())).unwrap();
    assert!(vol.copy("r1", 0, SIZE as u64).unwrap());
    vol.quiesced(|_| vol.promote("r1")).unwrap();
    write(&*vol, 8192, 3).unwrap();
    assert_eq!(d1.contents(), d0.contents());
    // A healthy one is not removed; faulted first, it is, and its place
    // takes another.
    assert!(vol.remove("r1").is_err());
    vol.fault("r1", "removed").unwrap();
    vol.quiesced(|_| vol.remove("r1")).unwrap();
    assert_eq!(vol.states(), vec![("r0".to_string(), State::Healthy)]);
    write(&*vol, 12288, 4).unwrap();
    assert_eq!(&d1.contents()[12288..12288 + 4096], &[0u8; 4096][..]);
    vol.quiesced(|_| vol.add("r2", "new")).unwrap();
    assert_eq!(vol.states()[1].0, "r2");
}

/// Rule 16's records of what a replica out of the healthy set may lack.
#[derive(Default)]
struct Misses {
    missed: Mutex<Vec<(usize, Vec<u64>)>>,
    refuse: AtomicBool,
}

impl Membership for Misses {
    fn fault(
        &self,
        index: usize,
        _name: &str,
        _reason: &str,
        at_risk: &[u64],
    ) -> Result<(), IoError> {
        self.missed.lock().unwrap().push((index, at_risk.to_vec()));
        Ok(())
    }
    fn missed(&self, index: usize, _name: &str, regions: &[u64]) -> Result<(), IoError> {
        if self.refuse.load(Ordering::SeqCst) {
            return Err(IoError::new(IoErrorKind::Io, "the store failed"));
        }
        self.missed.lock().unwrap().push((index, regions.to_vec()));
        Ok(())
    }
}

impl Misses {
    fn take(&self) -> Vec<(usize, Vec<u64>)> {
        std::mem::take(&mut *self.missed.lock().unwrap())
    }
}

#[test]
fn the_regions_a_replica_out_of_the_healthy_set_may_lack_are_recorded_before_a_change_there_is_sent(
) {
    // Three regions; the pages never written stay unallocated.
    const BIG: usize = 3 * REGION as usize;
    let devices: Vec<_> = (0..2).map(|_| Arc::new(MemDevice::new(BIG))).collect();
    let gate = Arc::new(Gated::new(devices[1].clone()));
    let misses = Arc::new(Misses::default());
    let vol = Replicated::new(
        "v",
        vec![
            Replica {
                name: "r0".into(),
                io: devices[0].clone(),
            },
            Replica {
                name: "r1".into(),
                io: gate.clone(),
            },
        ],
        misses.clone(),
    )
    .unwrap();
    let r = REGION;
    // Region 0 written and flushed, region 1 written and not: all healthy,
    // nothing recorded.
    write(&vol, 0, 1).unwrap();
    wait(&vol, IoOp::Flush).unwrap();
    write(&vol, r, 2).unwrap();
    assert!(misses.take().is_empty());
    // r1 fails a write in region 2: at its fault, what it answered that
    // no flush covered (region 1) and the write it failed (region 2).
    gate.fail(IoErrorKind::Io, is_write);
    write(&vol, 2 * r, 3).unwrap();
    assert_eq!(misses.take(), vec![(1, vec![1, 2])]);
    // A change to region 0 now: recorded before it is sent, and a record
    // that fails fails the change, with no replica written.
    misses.refuse.store(true, Ordering::SeqCst);
    assert!(write(&vol, 4096, 4).is_err());
    assert_eq!(&devices[0].contents()[4096..8192], &[0u8; 4096][..]);
    misses.refuse.store(false, Ordering::SeqCst);
    write(&vol, 4096, 4).unwrap();
    write(&vol, 8192, 5).unwrap();
    write(&vol, r, 6).unwrap();
    assert_eq!(misses.take(), vec![(1, vec![0])], "each region once");
    // Rebuilding, it is still out of the healthy set: recorded, as before.
    gate.clear();
    vol.quiesced(|_| {
        vol.rejoin("r1", gate.clone())?;
        vol.take_missed("r1").map(|_| ())
    })
    .unwrap();
    write(&vol, 2 * r + 4096, 7).unwrap();
    assert!(misses.take().is_empty(), "region 2 was recorded already");
    // Healthy again: nothing recorded; faulted again, recorded afresh.
    vol.quiesced(|_| vol.promote("r1")).unwrap();
    write(&vol, 0, 8).unwrap();
    assert!(misses.take().is_empty());
    wait(&vol, IoOp::Flush).unwrap();
    gate.fail(IoErrorKind::Io, is_write);
    write(&vol, r + 4096, 9).unwrap();
    assert_eq!(misses.take(), vec![(1, vec![1])]);
}
