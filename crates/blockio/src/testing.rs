//! Test scaffolding (feature `testing`), never product code:
//! - [`Gated`], a volume wrapper that holds operations a test chooses until
//!   the test releases them, and fails operations it chooses with an
//!   injected error. Held operations run, and complete, on the thread that
//!   releases them, so callers meet completions that arrive late, out of
//!   order and from another thread, exactly as a networked volume will give
//!   them. No timing is involved: a test decides the order.
//! - [`Mirror`], a volume composed of two (writes both, reads one): the
//!   second implementation of the trait, standing in for a replicated
//!   volume until there is one.
//! - [`MemDevice`], a volume in memory with an allocation map, served by
//!   the frontends' tests (NBD, FUSE) and fuzz targets.
//! - [`contract`], the one suite of the trait's contract, run against every
//!   implementation.

pub mod contract;
mod mem;
mod mirror;

pub use mem::{MemDevice, MEM_BLOCK};
pub use mirror::Mirror;

use crate::{BlockIo, Caps, Completion, IoError, IoErrorKind, IoOp};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

type Filter = Box<dyn Fn(&IoOp) -> bool + Send + Sync>;

#[derive(Default)]
struct Rules {
    hold: Vec<Filter>,
    fail: Vec<(Filter, IoErrorKind)>,
}

/// `inner`, with operations held or failed as the test says.
pub struct Gated<V: BlockIo> {
    inner: Arc<V>,
    rules: Mutex<Rules>,
    held: Mutex<Vec<(IoOp, Completion)>>,
    changed: Condvar,
}

impl<V: BlockIo> Gated<V> {
    pub fn new(inner: Arc<V>) -> Gated<V> {
        Gated {
            inner,
            rules: Mutex::new(Rules::default()),
            held: Mutex::new(Vec::new()),
            changed: Condvar::new(),
        }
    }

    /// Hold every later operation `f` matches until [`Gated::release`].
    pub fn hold(&self, f: impl Fn(&IoOp) -> bool + Send + Sync + 'static) {
        self.rules.lock().unwrap().hold.push(Box::new(f));
    }

    /// Fail every later operation `f` matches with `kind`; it never reaches
    /// the inner volume.
    pub fn fail(&self, kind: IoErrorKind, f: impl Fn(&IoOp) -> bool + Send + Sync + 'static) {
        self.rules.lock().unwrap().fail.push((Box::new(f), kind));
    }

    /// Stop holding and failing (operations already held stay held).
    pub fn clear(&self) {
        *self.rules.lock().unwrap() = Rules::default();
    }

    /// Wait until `n` operations are held; panics after `limit` (a safety
    /// net for a test that would otherwise hang, not a measurement).
    pub fn wait_held(&self, n: usize, limit: Duration) {
        let held = self.held.lock().unwrap();
        let (held, timeout) = self
            .changed
            .wait_timeout_while(held, limit, |h| h.len() < n)
            .unwrap();
        assert!(
            !timeout.timed_out(),
            "{} operation(s) held, {n} expected within {limit:?}",
            held.len()
        );
    }

    /// Operations held now, oldest first: (name, offset, length).
    pub fn held(&self) -> Vec<(&'static str, u64, u64)> {
        self.held
            .lock()
            .unwrap()
            .iter()
            .map(|(op, _)| op.describe())
            .collect()
    }

    /// Run the held operation at `index` (in [`Gated::held`] order) on the
    /// inner volume, from this thread; it completes here.
    pub fn release(&self, index: usize) {
        let (op, done) = self.held.lock().unwrap().remove(index);
        self.inner.submit(op, done);
    }

    /// Release every held operation, newest first (the order a caller is
    /// least likely to expect).
    pub fn release_all(&self) {
        let all: Vec<_> = std::mem::take(&mut *self.held.lock().unwrap());
        for (op, done) in all.into_iter().rev() {
            self.inner.submit(op, done);
        }
    }
}

impl<V: BlockIo> BlockIo for Gated<V> {
    fn size(&self) -> Result<u64, IoError> {
        self.inner.size()
    }

    fn read_only(&self) -> bool {
        self.inner.read_only()
    }

    fn caps(&self) -> Caps {
        self.inner.caps()
    }

    fn activate(&self, generation: u64) -> Result<(), IoError> {
        self.inner.activate(generation)
    }

    fn submit(&self, op: IoOp, done: Completion) {
        let (fail, hold) = {
            let r = self.rules.lock().unwrap();
            (
                r.fail.iter().find(|(f, _)| f(&op)).map(|(_, k)| *k),
                r.hold.iter().any(|f| f(&op)),
            )
        };
        if let Some(kind) = fail {
            let at = op.describe();
            return done(Err(IoError::new(kind, "injected by the test").at(at)));
        }
        if hold {
            self.held.lock().unwrap().push((op, done));
            self.changed.notify_all();
            return;
        }
        self.inner.submit(op, done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{wait, Extent, InlineIo, IoDone};

    struct Zeros;

    impl InlineIo for Zeros {
        fn size(&self) -> Result<u64, IoError> {
            Ok(1 << 20)
        }
        fn read_only(&self) -> bool {
            false
        }
        fn caps(&self) -> Caps {
            Caps::ALL
        }
        fn activate(&self, _: u64) -> Result<(), IoError> {
            Ok(())
        }
        fn read(&self, _: u64, buf: &mut [u8]) -> Result<(), IoError> {
            buf.fill(0);
            Ok(())
        }
        fn write(&self, _: u64, _: &[u8], _: bool) -> Result<(), IoError> {
            Ok(())
        }
        fn flush(&self) -> Result<(), IoError> {
            Ok(())
        }
        fn trim(&self, _: u64, _: u64) -> Result<(), IoError> {
            Ok(())
        }
        fn write_zeroes(&self, _: u64, _: u64, _: bool) -> Result<(), IoError> {
            Ok(())
        }
        fn block_status(&self, _: u64, len: u64) -> Result<Vec<Extent>, IoError> {
            Ok(vec![Extent {
                length: len,
                hole: true,
                zero: true,
            }])
        }
    }

    #[test]
    fn held_operations_complete_on_the_releasing_thread_and_injected_errors_are_placed() {
        let g = Arc::new(Gated::new(Arc::new(Zeros)));
        g.hold(|op| matches!(op, IoOp::Write { .. }));
        g.fail(IoErrorKind::Io, |op| matches!(op, IoOp::Flush));
        let (tx, rx) = std::sync::mpsc::channel();
        g.submit(
            IoOp::Write {
                offset: 8,
                data: vec![1],
                fua: false,
            },
            Box::new(move |r| tx.send((std::thread::current().id(), r)).unwrap()),
        );
        assert!(rx.try_recv().is_err(), "held, not completed");
        assert_eq!(g.held(), vec![("write", 8, 1)]);
        let g2 = g.clone();
        let releaser = std::thread::spawn(move || {
            g2.wait_held(1, Duration::from_secs(10));
            g2.release(0);
            std::thread::current().id()
        })
        .join()
        .unwrap();
        let (on, r) = rx.recv().unwrap();
        assert_eq!((on, r.unwrap()), (releaser, IoDone::Write(vec![1])));
        let e = wait(&*g, IoOp::Flush).unwrap_err();
        assert_eq!((e.kind, e.op), (IoErrorKind::Io, "flush"));
        assert!(
            matches!(wait(&*g, IoOp::Read { offset: 0, buf: vec![7] }), Ok(IoDone::Read(b)) if b == [0])
        );
    }
}
