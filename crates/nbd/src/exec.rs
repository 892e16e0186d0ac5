//! Starting one validated request on the volume and building its reply
//! when the volume completes it (at once for an inline volume, later and
//! from another thread for one that waits on a network).

use crate::device::{BlockIo, IoError, IoErrorKind};
use crate::proto::*;
use lamina_blockio::{IoDone, IoOp};
use std::collections::VecDeque;
use std::sync::Arc;

/// Most descriptors in one BLOCK_STATUS reply (the protocol lets a server
/// describe less than the whole request).
const MAX_DESCRIPTORS: usize = 64 * 1024;
/// Largest buffer used when emulating WRITE_ZEROES with plain writes.
const ZERO_CHUNK: u64 = 1 << 20;

/// How replies are shaped on this connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplyMode {
    pub structured: bool,
    /// The id of `base:allocation` (meaningful only if negotiated).
    pub meta_id: u32,
}

impl ReplyMode {
    /// An error reply: a structured error chunk with a message when
    /// structured replies were negotiated, else a simple reply.
    pub(crate) fn error(&self, cookie: u64, errno: u32, message: &str) -> Reply {
        if self.structured {
            Reply::error_chunk(cookie, errno, message)
        } else {
            Reply::simple(cookie, errno, Vec::new())
        }
    }
}

/// Gets a request's outcome, once.
pub(crate) type Done = Box<dyn FnOnce(Result<Reply, IoError>) + Send>;

/// The volume answered with the wrong kind of result: a bug in the volume,
/// reported to the client as an I/O error rather than a panic.
fn mismatch(d: IoDone) -> IoError {
    IoError::new(
        IoErrorKind::Io,
        format!("the volume completed the operation with {d:?}"),
    )
}

/// Starts `req` (already checked for flags, permissions and range); `done`
/// gets its reply or the volume's error, possibly before this returns.
pub(crate) fn execute(
    dev: &Arc<dyn BlockIo>,
    mode: ReplyMode,
    req: &Request,
    payload: Vec<u8>,
    done: Done,
) {
    let (cookie, offset, len) = (req.cookie, req.offset, u64::from(req.length));
    let fua = req.flags & CMD_FLAG_FUA != 0;
    let ok = move || Reply::simple(cookie, 0, Vec::new());
    match req.kind {
        CMD_READ if len == 0 => done(Ok(if mode.structured {
            Reply::done(cookie)
        } else {
            Reply::simple(cookie, 0, Vec::new())
        })),
        CMD_READ => {
            let buf = crate::bufs::take(req.length as usize);
            dev.submit(
                IoOp::Read { offset, buf },
                Box::new(move |r| {
                    done(r.and_then(|d| match d {
                        IoDone::Read(buf) if mode.structured => {
                            Ok(Reply::offset_data(cookie, offset, buf))
                        }
                        IoDone::Read(buf) => Ok(Reply::simple(cookie, 0, buf)),
                        d => Err(mismatch(d)),
                    }))
                }),
            );
        }
        CMD_WRITE if payload.is_empty() => done(Ok(ok())),
        CMD_WRITE => dev.submit(
            IoOp::Write {
                offset,
                data: payload,
                fua,
            },
            Box::new(move |r| {
                done(r.and_then(|d| match d {
                    IoDone::Write(buf) => {
                        crate::bufs::give(buf);
                        Ok(ok())
                    }
                    d => Err(mismatch(d)),
                }))
            }),
        ),
        CMD_FLUSH => sequence(dev.clone(), VecDeque::from([IoOp::Flush]), ok, done),
        CMD_TRIM | CMD_WRITE_ZEROES if len == 0 => done(Ok(ok())),
        CMD_TRIM => {
            let mut ops = VecDeque::from([IoOp::Trim { offset, len }]);
            if fua {
                ops.push_back(IoOp::Flush);
            }
            sequence(dev.clone(), ops, ok, done)
        }
        CMD_WRITE_ZEROES => write_zeroes(dev, req, ok, done),
        CMD_BLOCK_STATUS => {
            let (req_one, length) = (req.flags & CMD_FLAG_REQ_ONE != 0, req.length);
            dev.submit(
                IoOp::BlockStatus { offset, len },
                Box::new(move |r| {
                    done(r.and_then(|d| match d {
                        IoDone::BlockStatus(extents) => {
                            let d = descriptors(&extents, length, req_one, MAX_DESCRIPTORS);
                            Ok(Reply::block_status(cookie, mode.meta_id, &d))
                        }
                        d => Err(mismatch(d)),
                    }))
                }),
            );
        }
        _ => done(Err(IoError::new(IoErrorKind::Invalid, "unknown command"))),
    }
}

/// Runs `ops` one after another, each submitted once the one before has
/// completed (the order NBD needs between a trim and its FUA flush); `done`
/// gets `ok()` or the first error.
fn sequence(
    dev: Arc<dyn BlockIo>,
    mut ops: VecDeque<IoOp>,
    ok: impl FnOnce() -> Reply + Send + 'static,
    done: Done,
) {
    let Some(op) = ops.pop_front() else {
        return done(Ok(ok()));
    };
    let next = dev.clone();
    dev.submit(
        op,
        Box::new(move |r| match r {
            Err(e) => done(Err(e)),
            Ok(_) => sequence(next, ops, ok, done),
        }),
    );
}

/// WRITE_ZEROES; without FAST_ZERO, a volume that cannot zero natively gets
/// plain writes of zeroes instead. FUA then flushes.
fn write_zeroes(
    dev: &Arc<dyn BlockIo>,
    req: &Request,
    ok: impl FnOnce() -> Reply + Send + 'static,
    done: Done,
) {
    let (offset, len) = (req.offset, u64::from(req.length));
    let fua = req.flags & CMD_FLAG_FUA != 0;
    let may_emulate = req.flags & CMD_FLAG_FAST_ZERO == 0;
    let may_trim = req.flags & CMD_FLAG_NO_HOLE == 0;
    let next = dev.clone();
    dev.submit(
        IoOp::WriteZeroes {
            offset,
            len,
            may_trim,
        },
        Box::new(move |r| {
            let mut ops = VecDeque::new();
            match r {
                Ok(_) => {}
                Err(e) if e.kind == IoErrorKind::NotSupported && may_emulate => {
                    let mut at = 0;
                    while at < len {
                        let n = (len - at).min(ZERO_CHUNK);
                        ops.push_back(IoOp::Write {
                            offset: offset + at,
                            data: vec![0; n as usize],
                            fua: false,
                        });
                        at += n;
                    }
                }
                Err(e) => return done(Err(e)),
            }
            if fua {
                ops.push_back(IoOp::Flush);
            }
            sequence(next, ops, ok, done)
        }),
    );
}
