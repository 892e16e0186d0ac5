//! The trait's contract (crate documentation, items 1 to 9) as one suite,
//! run against every implementation: the engine's volume and the mirror
//! (`crates/server/src/device.rs`), so a new volume is held to the same
//! rules by the same code. Each check's message names the item it checks.

use crate::{wait, BlockIo, IoDone, IoError, IoErrorKind, IoOp};
use std::sync::Arc;

/// A volume under test: at least 4 MiB, empty (never written, never
/// activated) when the suite starts.
pub trait Subject {
    /// A new handle to the volume (each call: another handle, never
    /// activated).
    fn open(&mut self) -> Arc<dyn BlockIo>;
    /// Lose everything that is not durable, as a crash would, and come back
    /// as a restarted process would. The suite has dropped its handles.
    fn restart(&mut self);
}

const MIB: u64 = 1 << 20;

fn write(v: &dyn BlockIo, offset: u64, data: &[u8], fua: bool) -> Result<(), IoError> {
    wait(
        v,
        IoOp::Write {
            offset,
            data: data.to_vec(),
            fua,
        },
    )
    .map(|_| ())
}

fn read(v: &dyn BlockIo, offset: u64, len: usize) -> Result<Vec<u8>, IoError> {
    match wait(
        v,
        IoOp::Read {
            offset,
            buf: vec![0xEE; len],
        },
    )? {
        IoDone::Read(b) => Ok(b),
        d => panic!("a read completed as {d:?}"),
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

/// Run every check, in order, on `s`.
pub fn run(s: &mut dyn Subject) {
    visible(s);
    durable(s);
    zeroes(s);
    block_status(s);
    errors(s);
    generations(s);
}

/// Item 1, and 2: completed writes are seen through another handle;
/// operations in flight together all complete, once each.
fn visible(s: &mut dyn Subject) {
    let (a, b) = (s.open(), s.open());
    assert!(a.size().unwrap() >= 4 * MIB, "the suite needs 4 MiB");
    let p = pattern(1, 10_000);
    write(&*a, 4096 + 100, &p, false).unwrap();
    assert_eq!(
        read(&*b, 4096 + 100, p.len()).unwrap(),
        p,
        "item 1: a completed write is visible through another handle"
    );
    write(&*b, 8192, &[0xAA; 512], false).unwrap();
    let mut want = p.clone();
    want[8192 - 4196..8192 - 4196 + 512].fill(0xAA);
    assert_eq!(read(&*a, 4096 + 100, p.len()).unwrap(), want, "item 1");

    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..16u64 {
        let tx = tx.clone();
        a.submit(
            IoOp::Write {
                offset: 64 * 1024 + i * 4096,
                data: vec![i as u8 + 1; 4096],
                fua: false,
            },
            Box::new(move |r| tx.send((i, r)).unwrap()),
        );
    }
    drop(tx);
    let mut seen: Vec<u64> = rx
        .iter()
        .map(|(i, r)| {
            assert_eq!(r.unwrap(), IoDone::Write(vec![i as u8 + 1; 4096]));
            i
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        (0..16).collect::<Vec<_>>(),
        "item 2: each write in flight completes exactly once"
    );
    let all = read(&*b, 64 * 1024, 16 * 4096).unwrap();
    for (i, c) in all.chunks(4096).enumerate() {
        assert!(c.iter().all(|&x| x == i as u8 + 1), "item 1: block {i}");
    }
}

/// Items 4 and 5: a flushed write and a FUA write survive a crash.
fn durable(s: &mut dyn Subject) {
    let v = s.open();
    let caps = v.caps();
    let (x, y) = (pattern(2, 70_000), pattern(3, 5_000));
    write(&*v, MIB, &x, false).unwrap();
    if caps.flush {
        wait(&*v, IoOp::Flush).unwrap();
    }
    write(&*v, 2 * MIB + 10, &y, caps.fua).unwrap();
    drop(v);
    s.restart();
    let v = s.open();
    assert_eq!(
        read(&*v, MIB, x.len()).unwrap(),
        x,
        "item 4: a write covered by a flush survives a crash"
    );
    if caps.fua || !caps.flush {
        assert_eq!(
            read(&*v, 2 * MIB + 10, y.len()).unwrap(),
            y,
            "item 5: a FUA write survives a crash"
        );
    }
}

/// Item 7: trimmed and zeroed ranges read as zeros, and nothing beside them
/// changes.
fn zeroes(s: &mut dyn Subject) {
    let v = s.open();
    let caps = v.caps();
    let base = 3 * MIB;
    write(&*v, base, &[0x55; 65536], false).unwrap();
    let mut want = vec![0x55; 65536];
    if caps.trim {
        wait(
            &*v,
            IoOp::Trim {
                offset: base + 4096,
                len: 8192,
            },
        )
        .unwrap();
        want[4096..12288].fill(0);
    }
    if caps.write_zeroes {
        for (at, may_trim) in [(20_000u64, false), (40_960, true)] {
            wait(
                &*v,
                IoOp::WriteZeroes {
                    offset: base + at,
                    len: 5000,
                    may_trim,
                },
            )
            .unwrap();
            want[at as usize..at as usize + 5000].fill(0);
        }
    }
    assert_eq!(
        read(&*v, base, 65536).unwrap(),
        want,
        "item 7: zeroed ranges read as zeros, the rest is unchanged"
    );
}

/// Block status: extents of non-zero length from the asked offset, data
/// reported as data, a trimmed block as zeros.
fn block_status(s: &mut dyn Subject) {
    let v = s.open();
    let caps = v.caps();
    if !caps.block_status {
        return;
    }
    let at = 3 * MIB + 512 * 1024;
    let status = |v: &dyn BlockIo| match wait(
        v,
        IoOp::BlockStatus {
            offset: at,
            len: 8192,
        },
    )
    .unwrap()
    {
        IoDone::BlockStatus(e) => e,
        d => panic!("block status completed as {d:?}"),
    };
    write(&*v, at, &[7; 4096], false).unwrap();
    let e = status(&*v);
    assert!(!e.is_empty() && e.iter().all(|x| x.length > 0), "{e:?}");
    assert!(!e[0].zero && !e[0].hole, "written data is data: {e:?}");
    if caps.trim {
        wait(
            &*v,
            IoOp::Trim {
                offset: at,
                len: 4096,
            },
        )
        .unwrap();
        let e = status(&*v);
        assert!(e[0].zero, "a trimmed block reads as zeros: {e:?}");
    }
}

/// Item 6, and bad input: a request past the end fails as invalid and
/// changes nothing.
fn errors(s: &mut dyn Subject) {
    let v = s.open();
    let size = v.size().unwrap();
    let e = read(&*v, size - 1, 2).unwrap_err();
    assert_eq!((e.kind, e.op), (IoErrorKind::Invalid, "read"), "{e}");
    write(&*v, size - 4096, &[9; 4096], false).unwrap();
    let e = write(&*v, size - 1, &[1, 2], false).unwrap_err();
    assert!(
        matches!(e.kind, IoErrorKind::Invalid | IoErrorKind::NoSpace),
        "{e}"
    );
    assert_eq!(read(&*v, size - 4096, 4096).unwrap(), vec![9; 4096]);
}

/// Item 9: a lower generation is fenced, durably.
fn generations(s: &mut dyn Subject) {
    let (a, b, never) = (s.open(), s.open(), s.open());
    a.activate(2).unwrap();
    write(&*a, 0, &[2; 4096], false).unwrap();
    let e = write(&*never, 0, &[0xFF; 4096], false).unwrap_err();
    assert_eq!(
        (e.kind, e.op),
        (IoErrorKind::Fenced, "write"),
        "item 9: a handle never activated holds generation 0: {e}"
    );

    b.activate(3).unwrap();
    for e in [
        write(&*a, 0, &[0xFF; 4096], false).unwrap_err(),
        read(&*a, 0, 4096).unwrap_err(),
        wait(&*a, IoOp::Flush).unwrap_err(),
    ] {
        assert_eq!(
            e.kind,
            IoErrorKind::Fenced,
            "item 9: generation 2 is fenced once 3 is activated: {e}"
        );
        assert!(
            e.message.contains("generation 3"),
            "names the holder's: {e}"
        );
    }
    let e = a.activate(1).unwrap_err();
    assert_eq!(
        (e.kind, e.op),
        (IoErrorKind::Fenced, "activate"),
        "item 9: activating below the highest is refused: {e}"
    );
    assert_eq!(
        read(&*b, 0, 4096).unwrap(),
        vec![2; 4096],
        "a fenced write changed nothing"
    );
    write(&*b, 4096, &[3; 4096], false).unwrap();
    s.open().activate(3).unwrap();
    write(&*b, 8192, &[3; 4096], false).unwrap();
    if b.caps().flush {
        wait(&*b, IoOp::Flush).unwrap();
    }
    drop((a, b, never));

    s.restart();
    let d = s.open();
    let e = d.activate(2).unwrap_err();
    assert_eq!(
        e.kind,
        IoErrorKind::Fenced,
        "item 9: a restart keeps the highest generation: {e}"
    );
    assert_eq!(
        read(&*d, 0, 4096).unwrap_err().kind,
        IoErrorKind::Fenced,
        "item 9: after a restart too, generation 0 is fenced"
    );
    d.activate(4).unwrap();
    assert_eq!(read(&*d, 4096, 8192).unwrap(), vec![3; 8192]);
    write(&*d, 0, &[4; 4096], false).unwrap();
}
