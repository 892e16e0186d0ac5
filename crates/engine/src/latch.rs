//! The I/O-failure latch: one per open pool, set by the first failed write,
//! sync, punch or log operation on the pool's files (and by a metadata
//! update that failed half-way), never cleared. Once it is set, every later
//! request that would read or change the pool gets [`Error::Unavailable`]
//! naming that first failure, and the engine does no more I/O on the pool's
//! files, until the pool is reopened and recovered from its log.
//!
//! Why one latch and no retry: after a failed `fsync` the kernel may already
//! have dropped (or marked clean) the pages it could not write, so neither a
//! retry nor a read tells what reached the disk; and a commit that failed
//! half-way leaves memory ahead of the log. The log on disk is the one
//! account that is known to be right, so the pool stops and recovers from it.
//!
//! Reads are refused too: after a failed data sync, a read could return a
//! block's older contents from disk without any error, and the engine cannot
//! tell which blocks are affected.
//!
//! What does not set the latch: a full disk on a data write or an allocation
//! (`no space left`: nothing was changed, the pool stays consistent and
//! usable) and a failed read of data (nothing was changed either).

use crate::error::{Error, IoFailure, Result};
use crate::format::BLOCK;
use std::path::Path;
use std::sync::{Arc, OnceLock};

#[derive(Default)]
pub(crate) struct Latch {
    first: OnceLock<Arc<IoFailure>>,
}

impl Latch {
    /// `Err(Unavailable)` once the latch is set.
    #[inline]
    pub fn check(&self) -> Result<()> {
        match self.first.get() {
            None => Ok(()),
            Some(f) => Err(Error::Unavailable(f.clone())),
        }
    }

    /// The first failure, if there was one.
    pub fn failure(&self) -> Option<Arc<IoFailure>> {
        self.first.get().cloned()
    }

    /// Record a failure; the first one recorded is the one reported.
    pub fn set(&self, f: IoFailure) {
        let mut logged = false;
        self.first.get_or_init(|| {
            logged = true;
            Arc::new(f)
        });
        if logged {
            if let Some(f) = self.first.get() {
                tracing::error!(failure = %f, "I/O failure: the pool refuses requests until it is reopened");
            }
        }
    }

    /// The result of one mutating I/O call on a pool file: a failure sets
    /// the latch and becomes the engine error for the caller.
    pub fn io<T>(
        &self,
        op: &'static str,
        path: &Path,
        offset: u64,
        r: std::io::Result<T>,
    ) -> Result<T> {
        r.map_err(|e| {
            self.set(IoFailure {
                op,
                path: path.to_path_buf(),
                offset,
                cause: e.to_string(),
            });
            Error::io(op, path, offset, e)
        })
    }

    /// Like [`Latch::io`] for a data write, where a full disk leaves the
    /// pool as it was (the write's block is released) and does not latch.
    pub fn data_io<T>(
        &self,
        op: &'static str,
        path: &Path,
        offset: u64,
        r: std::io::Result<T>,
    ) -> Result<T> {
        match r {
            Err(e) if is_full(&e) => Err(Error::io(op, path, offset, e)),
            r => self.io(op, path, offset, r),
        }
    }

    /// An error out of a metadata update or a commit step: one that may have
    /// left memory ahead of the disk (an I/O error or a page that failed its
    /// checks) sets the latch; others (not found, no space...) do not.
    /// Returns the error unchanged.
    pub fn error(&self, e: Error, pool_file: &Path) -> Error {
        let f = match &e {
            Error::Io {
                op,
                path,
                offset,
                source,
            } => IoFailure {
                op,
                path: path.clone(),
                offset: *offset,
                cause: source.to_string(),
            },
            Error::Corrupt { block, detail } => IoFailure {
                op: "verify metadata page",
                path: pool_file.to_path_buf(),
                offset: block * BLOCK as u64,
                cause: detail.clone(),
            },
            _ => return e,
        };
        self.set(f);
        e
    }
}

fn is_full(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}
