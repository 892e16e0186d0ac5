//! Time as the scheduler sees it: whole seconds since the Unix epoch, read
//! through a trait so tests drive it instead of sleeping through minutes.

use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};

/// The scheduler's clock, in Unix seconds.
pub trait Clock: Send + Sync {
    fn now(&self) -> i64;
}

/// The machine's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> i64 {
        jiff::Timestamp::now().as_second()
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn new(at: i64) -> ManualClock {
        ManualClock(AtomicI64::new(at))
    }
    pub fn set(&self, at: i64) {
        self.0.store(at, Ordering::SeqCst)
    }
    pub fn advance(&self, secs: i64) {
        self.0.fetch_add(secs, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A clock read from a file holding Unix seconds, for tests that move time
/// instead of waiting for it (`--test-clock`). An unreadable file leaves
/// the time where it was last read.
#[derive(Debug)]
pub struct FileClock {
    path: PathBuf,
    last: AtomicI64,
}

impl FileClock {
    pub fn new(path: PathBuf) -> FileClock {
        FileClock {
            path,
            last: AtomicI64::new(0),
        }
    }
}

impl Clock for FileClock {
    fn now(&self) -> i64 {
        match std::fs::read_to_string(&self.path)
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
        {
            Some(t) => {
                self.last.store(t, Ordering::SeqCst);
                t
            }
            None => self.last.load(Ordering::SeqCst),
        }
    }
}
