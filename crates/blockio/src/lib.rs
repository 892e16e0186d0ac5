//! The data path's one seam: [`BlockIo`], the volume every frontend serves
//! (the NBD server today; the CSI node path next) and every backend
//! implements (the local engine volume today; a replicated volume over the
//! network later). It owns the trait, its ordering and durability contract,
//! and its one error type; it must not know NBD, the engine, or any
//! transport. `docs/volume-io.md` states the same contract for readers who
//! are not reading Rust.
//!
//! # The shape: completion-based
//!
//! [`BlockIo::submit`] starts an operation and returns; the volume calls the
//! [`Completion`] exactly once with the outcome, on any thread, possibly
//! before `submit` returns. A volume whose work is quick and local (the
//! engine: page-cache copies and the odd disk I/O) completes inline on the
//! submitting thread, so the data path pays no thread hop; a volume that
//! waits on a network (a replica set) keeps the completion and calls it from
//! its own task when the answers are in. Callers must therefore submit from a
//! thread that may block (never an async reactor), and must not hold a lock
//! their completion takes. The NBD server submits from its runner threads.
//!
//! # Ordering and durability
//!
//! 1. **Completed writes are visible.** Once a write (or trim, or zeroing)
//!    completes successfully, every read submitted after that completion, by
//!    any caller on any handle to the same volume, sees its data.
//! 2. **No order between operations in flight.** Operations submitted and
//!    not yet completed may take effect in any order, and complete in any
//!    order. Two overlapping writes in flight at once leave either's data.
//!    A caller that needs an order waits for the first completion before it
//!    submits the second.
//! 3. **Completion is not durability.** A completed write may be lost by a
//!    crash or power cut until a flush covers it.
//! 4. **Flush.** When a flush completes successfully, every write that had
//!    completed before the flush was submitted is durable, on every handle
//!    to the volume (the NBD server may therefore advertise CAN_MULTI_CONN).
//!    Writes still in flight when the flush is submitted are not covered.
//! 5. **FUA.** A write with `fua` completes only once its own data is
//!    durable; it says nothing of other writes.
//! 6. **Errors.** A failed operation may have taken effect in part (a write
//!    may have reached some blocks). After an error of kind
//!    [`IoErrorKind::Io`] a volume may refuse everything until it is reopened
//!    (the engine latches); callers must not assume a retry will succeed.
//!    [`IoErrorKind::NoSpace`] leaves the volume usable: freeing space and
//!    retrying is expected to work. Nothing acknowledged before an error is
//!    lost by it.
//! 7. **Zeroes.** After trim or write-zeroes completes, the range reads as
//!    zeros (Lamina's volumes have no backing chain, so a trimmed block is a
//!    hole that reads as zeros).
//! 8. **Capabilities.** [`BlockIo::caps`] says which of flush, FUA, trim,
//!    native write-zeroes and block status the volume does; a frontend
//!    offers its clients exactly those (the NBD handshake advertises them)
//!    and submits no operation the volume did not declare.
//! 9. **Generations.** [`BlockIo::activate`] makes a handle the holder of an
//!    activation generation. Once `activate(g)` has returned on any handle,
//!    every request from a handle of a lower generation (a handle never
//!    activated holds generation 0) fails with [`IoErrorKind::Fenced`], and
//!    no request such a handle submitted earlier is still in flight. An
//!    activation below the highest generation the volume has seen is refused
//!    the same way. The highest generation is durable before `activate`
//!    returns, so a restart keeps it (see [`generation`]).

pub mod generation;
mod observed;
#[cfg(feature = "testing")]
pub mod testing;

pub use generation::{Admitted, Fence, GenerationStore, Holder};
pub use observed::{IoObserver, Observed, OpKind};

/// What a volume does beyond reads and writes. A frontend offers exactly
/// these and sends nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// [`IoOp::Flush`] makes completed writes durable (without it, a
    /// completed write is already durable and no flush is sent).
    pub flush: bool,
    /// A write with `fua` is durable when it completes.
    pub fua: bool,
    /// [`IoOp::Trim`].
    pub trim: bool,
    /// [`IoOp::WriteZeroes`] zeroes natively (fast, without writing the
    /// zeros); without it a frontend writes zeros itself.
    pub write_zeroes: bool,
    /// [`IoOp::BlockStatus`] reports allocation.
    pub block_status: bool,
}

impl Caps {
    /// Everything.
    pub const ALL: Caps = Caps {
        flush: true,
        fua: true,
        trim: true,
        write_zeroes: true,
        block_status: true,
    };

    /// Only what both volumes do (a volume composed of the two).
    pub fn and(self, o: Caps) -> Caps {
        Caps {
            flush: self.flush && o.flush,
            fua: self.fua && o.fua,
            trim: self.trim && o.trim,
            write_zeroes: self.write_zeroes && o.write_zeroes,
            block_status: self.block_status && o.block_status,
        }
    }
}

/// One extent of an allocation map, in order from the asked offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Bytes covered.
    pub length: u64,
    /// No storage is allocated.
    pub hole: bool,
    /// Reads as zeros.
    pub zero: bool,
}

/// An operation on a volume. Buffers travel with the operation and come
/// back in its [`IoDone`], so a caller can reuse them.
#[derive(Debug)]
pub enum IoOp {
    /// Fill `buf` (its length is the length read) from `offset`.
    Read { offset: u64, buf: Vec<u8> },
    /// Write `data` at `offset`; with `fua`, durable before it completes.
    Write {
        offset: u64,
        data: Vec<u8>,
        fua: bool,
    },
    /// Make every write completed before this was submitted durable.
    Flush,
    /// Discard a range: it reads as zeros afterwards.
    Trim { offset: u64, len: u64 },
    /// Make a range read as zeros; `may_trim` false asks for allocated
    /// zeros (NBD's NO_HOLE), which a volume may ignore.
    WriteZeroes {
        offset: u64,
        len: u64,
        may_trim: bool,
    },
    /// The allocation map of `[offset, offset + len)`: extents covering at
    /// least its first byte, none of length 0.
    BlockStatus { offset: u64, len: u64 },
}

impl IoOp {
    /// The same operation, for another volume (a mirror's second leg, a
    /// replica): a write's data copied, a read given a new buffer of its
    /// length.
    pub fn again(&self) -> IoOp {
        match self {
            IoOp::Read { offset, buf } => IoOp::Read {
                offset: *offset,
                buf: vec![0; buf.len()],
            },
            IoOp::Write { offset, data, fua } => IoOp::Write {
                offset: *offset,
                data: data.clone(),
                fua: *fua,
            },
            IoOp::Flush => IoOp::Flush,
            IoOp::Trim { offset, len } => IoOp::Trim {
                offset: *offset,
                len: *len,
            },
            IoOp::WriteZeroes {
                offset,
                len,
                may_trim,
            } => IoOp::WriteZeroes {
                offset: *offset,
                len: *len,
                may_trim: *may_trim,
            },
            IoOp::BlockStatus { offset, len } => IoOp::BlockStatus {
                offset: *offset,
                len: *len,
            },
        }
    }

    /// The operation's name, offset and length, for errors and logs.
    pub fn describe(&self) -> (&'static str, u64, u64) {
        match self {
            IoOp::Read { offset, buf } => ("read", *offset, buf.len() as u64),
            IoOp::Write { offset, data, .. } => ("write", *offset, data.len() as u64),
            IoOp::Flush => ("flush", 0, 0),
            IoOp::Trim { offset, len } => ("trim", *offset, *len),
            IoOp::WriteZeroes { offset, len, .. } => ("write-zeroes", *offset, *len),
            IoOp::BlockStatus { offset, len } => ("block-status", *offset, *len),
        }
    }
}

/// What a successful operation gives back.
#[derive(Debug, PartialEq, Eq)]
pub enum IoDone {
    /// The filled buffer.
    Read(Vec<u8>),
    /// The written buffer, to reuse.
    Write(Vec<u8>),
    Flush,
    Trim,
    WriteZeroes,
    BlockStatus(Vec<Extent>),
}

/// Called exactly once with an operation's outcome.
pub type Completion = Box<dyn FnOnce(Result<IoDone, IoError>) + Send>;

/// What kind of failure; each maps to one NBD error code and one HTTP-ish
/// meaning for callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoErrorKind {
    /// The device failed (or an earlier failure latched it).
    Io,
    /// No space for new data; the volume stays usable.
    NoSpace,
    /// Out of range or malformed.
    Invalid,
    /// Writes are refused here (a snapshot).
    ReadOnly,
    /// The volume cannot do this (e.g. fast zeroing); nothing happened.
    NotSupported,
    /// The volume was detached or deleted under its handle.
    Gone,
    /// The handle's activation generation is lower than one the volume has
    /// been activated at since: another holder took the volume over. Nothing
    /// happened, and nothing will through this handle again.
    Fenced,
}

impl std::fmt::Display for IoErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoErrorKind::Io => "I/O error",
            IoErrorKind::NoSpace => "no space left",
            IoErrorKind::Invalid => "invalid request",
            IoErrorKind::ReadOnly => "read-only",
            IoErrorKind::NotSupported => "not supported",
            IoErrorKind::Gone => "volume gone",
            IoErrorKind::Fenced => "fenced by a newer generation",
        })
    }
}

/// The one error of the data path: what failed, where, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op} at offset {offset} ({len} bytes): {kind}: {message}")]
pub struct IoError {
    pub kind: IoErrorKind,
    /// The operation (`read`, `write`, `flush`...), or `open` for a volume
    /// that could not be reached at all.
    pub op: &'static str,
    pub offset: u64,
    pub len: u64,
    pub message: String,
}

impl IoError {
    /// An error of `kind`; its operation and range are filled in by
    /// [`IoError::at`] (the inline adapter does it for its implementors).
    pub fn new(kind: IoErrorKind, message: impl Into<String>) -> IoError {
        IoError {
            kind,
            op: "open",
            offset: 0,
            len: 0,
            message: message.into(),
        }
    }

    /// The same error, placed at an operation and range.
    pub fn at(mut self, (op, offset, len): (&'static str, u64, u64)) -> IoError {
        self.op = op;
        self.offset = offset;
        self.len = len;
        self
    }
}

/// A volume on the data path. See the crate documentation for the contract
/// every implementor keeps and every caller may rely on.
pub trait BlockIo: Send + Sync + 'static {
    /// Size in bytes (may grow between handles, e.g. after an expand).
    fn size(&self) -> Result<u64, IoError>;
    /// Whether writes are refused.
    fn read_only(&self) -> bool;
    /// What the volume does beyond reads and writes.
    fn caps(&self) -> Caps;
    /// Make this handle the holder of activation `generation` (contract
    /// item 9): refused with [`IoErrorKind::Fenced`] below the highest the
    /// volume has seen; otherwise durable when it returns, after every
    /// request of a lower generation still in flight has completed. A
    /// volume that cannot be written (a snapshot) answers `NotSupported`.
    fn activate(&self, generation: u64) -> Result<(), IoError>;
    /// Start `op`; `done` gets its outcome, exactly once, on any thread,
    /// possibly before this returns. Submit from a thread that may block.
    fn submit(&self, op: IoOp, done: Completion);
}

/// For volumes whose operations finish on the calling thread (the local
/// engine volume, in-memory test volumes): write the operations as plain
/// calls and get [`BlockIo`] from the blanket implementation, which runs
/// each inline and completes at once. Errors get their operation and range
/// filled in.
pub trait InlineIo: Send + Sync + 'static {
    fn size(&self) -> Result<u64, IoError>;
    fn read_only(&self) -> bool;
    fn caps(&self) -> Caps;
    fn activate(&self, generation: u64) -> Result<(), IoError>;
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError>;
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), IoError>;
    fn flush(&self) -> Result<(), IoError>;
    fn trim(&self, offset: u64, len: u64) -> Result<(), IoError>;
    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool) -> Result<(), IoError>;
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, IoError>;
}

impl<T: InlineIo> BlockIo for T {
    fn size(&self) -> Result<u64, IoError> {
        InlineIo::size(self)
    }

    fn read_only(&self) -> bool {
        InlineIo::read_only(self)
    }

    fn caps(&self) -> Caps {
        InlineIo::caps(self)
    }

    fn activate(&self, generation: u64) -> Result<(), IoError> {
        InlineIo::activate(self, generation).map_err(|e| e.at(("activate", 0, 0)))
    }

    fn submit(&self, op: IoOp, done: Completion) {
        let at = op.describe();
        let r = match op {
            IoOp::Read { offset, mut buf } => {
                self.read(offset, &mut buf).map(|()| IoDone::Read(buf))
            }
            IoOp::Write { offset, data, fua } => {
                self.write(offset, &data, fua).map(|()| IoDone::Write(data))
            }
            IoOp::Flush => self.flush().map(|()| IoDone::Flush),
            IoOp::Trim { offset, len } => self.trim(offset, len).map(|()| IoDone::Trim),
            IoOp::WriteZeroes {
                offset,
                len,
                may_trim,
            } => self
                .write_zeroes(offset, len, may_trim)
                .map(|()| IoDone::WriteZeroes),
            IoOp::BlockStatus { offset, len } => {
                self.block_status(offset, len).map(IoDone::BlockStatus)
            }
        };
        done(r.map_err(|e| e.at(at)))
    }
}

/// Run one operation and wait for its outcome (for callers outside a hot
/// path: tools, tests). Blocks the calling thread.
pub fn wait(vol: &dyn BlockIo, op: IoOp) -> Result<IoDone, IoError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    vol.submit(
        op,
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    rx.recv().unwrap_or_else(|_| {
        Err(IoError::new(
            IoErrorKind::Io,
            "the volume dropped an operation without completing it",
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct Ram(Mutex<Vec<u8>>);

    impl InlineIo for Ram {
        fn size(&self) -> Result<u64, IoError> {
            Ok(self.0.lock().unwrap().len() as u64)
        }
        fn read_only(&self) -> bool {
            false
        }
        fn caps(&self) -> Caps {
            Caps::ALL
        }
        fn activate(&self, _: u64) -> Result<(), IoError> {
            Err(IoError::new(IoErrorKind::NotSupported, "no generations"))
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
            let d = self.0.lock().unwrap();
            let o = offset as usize;
            let src = d
                .get(o..o + buf.len())
                .ok_or_else(|| IoError::new(IoErrorKind::Invalid, "past the end"))?;
            buf.copy_from_slice(src);
            Ok(())
        }
        fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), IoError> {
            let mut d = self.0.lock().unwrap();
            let o = offset as usize;
            d.get_mut(o..o + data.len())
                .ok_or_else(|| IoError::new(IoErrorKind::NoSpace, "full"))?
                .copy_from_slice(data);
            Ok(())
        }
        fn flush(&self) -> Result<(), IoError> {
            Ok(())
        }
        fn trim(&self, offset: u64, len: u64) -> Result<(), IoError> {
            self.write(offset, &vec![0; len as usize], false)
        }
        fn write_zeroes(&self, offset: u64, len: u64, _may_trim: bool) -> Result<(), IoError> {
            self.trim(offset, len)
        }
        fn block_status(&self, _offset: u64, len: u64) -> Result<Vec<Extent>, IoError> {
            Ok(vec![Extent {
                length: len,
                hole: false,
                zero: false,
            }])
        }
    }

    #[test]
    fn inline_volumes_complete_at_once_with_their_buffers_and_placed_errors() {
        let v = Ram(Mutex::new(vec![0; 16]));
        let d = wait(
            &v,
            IoOp::Write {
                offset: 4,
                data: vec![1, 2, 3],
                fua: false,
            },
        )
        .unwrap();
        assert_eq!(d, IoDone::Write(vec![1, 2, 3]), "the buffer comes back");
        let d = wait(
            &v,
            IoOp::Read {
                offset: 3,
                buf: vec![9; 5],
            },
        )
        .unwrap();
        assert_eq!(d, IoDone::Read(vec![0, 1, 2, 3, 0]));
        let e = wait(
            &v,
            IoOp::Write {
                offset: 15,
                data: vec![1, 2],
                fua: true,
            },
        )
        .unwrap_err();
        assert_eq!(
            (e.kind, e.op, e.offset, e.len),
            (IoErrorKind::NoSpace, "write", 15, 2)
        );
        assert_eq!(
            e.to_string(),
            "write at offset 15 (2 bytes): no space left: full"
        );
    }
}
