//! A volume that reports each operation it completes to an observer: how
//! the daemon counts I/O per volume (operations, bytes, latency) without the
//! data path knowing any metrics library. It wraps any [`BlockIo`], so a
//! replicated volume is counted the same way as a local one.

use crate::{BlockIo, Completion, IoError, IoOp};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What an [`Observed`] volume reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    BlockStatus,
}

impl OpKind {
    pub const ALL: [OpKind; 6] = [
        OpKind::Read,
        OpKind::Write,
        OpKind::Flush,
        OpKind::Trim,
        OpKind::WriteZeroes,
        OpKind::BlockStatus,
    ];

    /// The name errors and metrics use (`read`, `write-zeroes`...).
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Read => "read",
            OpKind::Write => "write",
            OpKind::Flush => "flush",
            OpKind::Trim => "trim",
            OpKind::WriteZeroes => "write-zeroes",
            OpKind::BlockStatus => "block-status",
        }
    }

    fn of(op: &IoOp) -> (OpKind, u64) {
        match op {
            IoOp::Read { buf, .. } => (OpKind::Read, buf.len() as u64),
            IoOp::Write { data, .. } => (OpKind::Write, data.len() as u64),
            IoOp::Flush => (OpKind::Flush, 0),
            IoOp::Trim { len, .. } => (OpKind::Trim, *len),
            IoOp::WriteZeroes { len, .. } => (OpKind::WriteZeroes, *len),
            // Block status moves no data: its length is the range asked about.
            IoOp::BlockStatus { .. } => (OpKind::BlockStatus, 0),
        }
    }
}

/// Told of every operation an [`Observed`] volume completes, on the thread
/// that completes it (so it must be quick and must not block).
pub trait IoObserver: Send + Sync + 'static {
    /// `bytes` is the data the operation covered (read, written, trimmed or
    /// zeroed; 0 for flush and block status); `elapsed` runs from submit to
    /// completion.
    fn completed(&self, op: OpKind, bytes: u64, elapsed: Duration, result: Result<(), &IoError>);
}

/// `V`, reporting each completed operation to an observer. It changes
/// nothing of `V`'s contract: operations and completions pass through as
/// they are.
pub struct Observed<V> {
    inner: V,
    observer: Arc<dyn IoObserver>,
}

impl<V: BlockIo> Observed<V> {
    pub fn new(inner: V, observer: Arc<dyn IoObserver>) -> Observed<V> {
        Observed { inner, observer }
    }
}

impl<V: BlockIo> BlockIo for Observed<V> {
    fn size(&self) -> Result<u64, IoError> {
        self.inner.size()
    }

    fn read_only(&self) -> bool {
        self.inner.read_only()
    }

    fn caps(&self) -> crate::Caps {
        self.inner.caps()
    }

    fn activate(&self, generation: u64) -> Result<(), IoError> {
        self.inner.activate(generation)
    }

    fn submit(&self, op: IoOp, done: Completion) {
        let (kind, bytes) = OpKind::of(&op);
        let observer = self.observer.clone();
        let start = Instant::now();
        self.inner.submit(
            op,
            Box::new(move |r| {
                observer.completed(kind, bytes, start.elapsed(), r.as_ref().map(|_| ()));
                done(r)
            }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{wait, Extent, InlineIo, IoDone, IoErrorKind};
    use std::sync::Mutex;

    /// 8 KiB of memory; writes past 4 KiB fail.
    struct Small;

    impl InlineIo for Small {
        fn size(&self) -> Result<u64, IoError> {
            Ok(8192)
        }
        fn read_only(&self) -> bool {
            false
        }
        fn caps(&self) -> crate::Caps {
            crate::Caps::ALL
        }
        fn activate(&self, _: u64) -> Result<(), IoError> {
            Ok(())
        }
        fn read(&self, _offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
            buf.fill(7);
            Ok(())
        }
        fn write(&self, offset: u64, _data: &[u8], _fua: bool) -> Result<(), IoError> {
            if offset >= 4096 {
                return Err(IoError::new(IoErrorKind::NoSpace, "full"));
            }
            Ok(())
        }
        fn flush(&self) -> Result<(), IoError> {
            Ok(())
        }
        fn trim(&self, _offset: u64, _len: u64) -> Result<(), IoError> {
            Ok(())
        }
        fn write_zeroes(&self, _offset: u64, _len: u64, _may_trim: bool) -> Result<(), IoError> {
            Ok(())
        }
        fn block_status(&self, _offset: u64, len: u64) -> Result<Vec<Extent>, IoError> {
            Ok(vec![Extent {
                length: len,
                hole: true,
                zero: true,
            }])
        }
    }

    #[derive(Default)]
    struct Seen(Mutex<Vec<(OpKind, u64, bool)>>);

    impl IoObserver for Seen {
        fn completed(&self, op: OpKind, bytes: u64, _elapsed: Duration, r: Result<(), &IoError>) {
            self.0.lock().unwrap().push((op, bytes, r.is_ok()));
        }
    }

    #[test]
    fn every_completion_is_reported_once_and_passes_through_unchanged() {
        let seen = Arc::new(Seen::default());
        let v = Observed::new(Small, seen.clone());
        let r = wait(
            &v,
            IoOp::Read {
                offset: 0,
                buf: vec![0; 512],
            },
        )
        .unwrap();
        assert_eq!(r, IoDone::Read(vec![7; 512]));
        wait(
            &v,
            IoOp::Write {
                offset: 0,
                data: vec![1; 1024],
                fua: false,
            },
        )
        .unwrap();
        let e = wait(
            &v,
            IoOp::Write {
                offset: 4096,
                data: vec![1; 4096],
                fua: true,
            },
        )
        .unwrap_err();
        assert_eq!(
            (e.kind, e.op, e.offset),
            (IoErrorKind::NoSpace, "write", 4096)
        );
        wait(&v, IoOp::Flush).unwrap();
        wait(
            &v,
            IoOp::Trim {
                offset: 0,
                len: 2048,
            },
        )
        .unwrap();
        wait(
            &v,
            IoOp::WriteZeroes {
                offset: 0,
                len: 4096,
                may_trim: true,
            },
        )
        .unwrap();
        wait(
            &v,
            IoOp::BlockStatus {
                offset: 0,
                len: 8192,
            },
        )
        .unwrap();
        assert_eq!(
            *seen.0.lock().unwrap(),
            [
                (OpKind::Read, 512, true),
                (OpKind::Write, 1024, true),
                (OpKind::Write, 4096, false),
                (OpKind::Flush, 0, true),
                (OpKind::Trim, 2048, true),
                (OpKind::WriteZeroes, 4096, true),
                (OpKind::BlockStatus, 0, true),
            ]
        );
        assert_eq!(v.size().unwrap(), 8192);
    }
}
