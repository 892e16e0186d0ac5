//! Running one validated request against the device (on a blocking task)
//! and building its reply.

use crate::device::{BlockDevice, DeviceError};
use crate::proto::*;

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

/// Executes `req` (already checked for flags, permissions and range).
pub(crate) fn execute(
    dev: &dyn BlockDevice,
    mode: ReplyMode,
    req: &Request,
    payload: Vec<u8>,
) -> Result<Reply, DeviceError> {
    let (cookie, offset, len) = (req.cookie, req.offset, u64::from(req.length));
    let fua = req.flags & CMD_FLAG_FUA != 0;
    let ok = || Reply::simple(cookie, 0, Vec::new());
    match req.kind {
        CMD_READ => {
            let mut buf = crate::bufs::take(req.length as usize);
            if !buf.is_empty() {
                dev.read(offset, &mut buf)?;
            }
            Ok(match (mode.structured, buf.is_empty()) {
                (false, _) => Reply::simple(cookie, 0, buf),
                (true, true) => Reply::done(cookie),
                (true, false) => Reply::offset_data(cookie, offset, buf),
            })
        }
        CMD_WRITE => {
            if !payload.is_empty() {
                dev.write(offset, &payload, fua)?;
            }
            crate::bufs::give(payload);
            Ok(ok())
        }
        CMD_FLUSH => dev.flush().map(|()| ok()),
        CMD_TRIM => {
            if len > 0 {
                dev.trim(offset, len)?;
                if fua {
                    dev.flush()?;
                }
            }
            Ok(ok())
        }
        CMD_WRITE_ZEROES => {
            if len > 0 {
                write_zeroes(dev, req)?;
                if fua {
                    dev.flush()?;
                }
            }
            Ok(ok())
        }
        CMD_BLOCK_STATUS => {
            let extents = dev.block_status(offset, len)?;
            let req_one = req.flags & CMD_FLAG_REQ_ONE != 0;
            let d = descriptors(&extents, req.length, req_one, MAX_DESCRIPTORS);
            Ok(Reply::block_status(cookie, mode.meta_id, &d))
        }
        _ => Err(DeviceError::Invalid("unknown command".into())),
    }
}

/// WRITE_ZEROES; without FAST_ZERO, a device that cannot zero natively gets
/// plain writes of zeroes instead.
fn write_zeroes(dev: &dyn BlockDevice, req: &Request) -> Result<(), DeviceError> {
    let may_trim = req.flags & CMD_FLAG_NO_HOLE == 0;
    let len = u64::from(req.length);
    match dev.write_zeroes(req.offset, len, may_trim) {
        Err(DeviceError::NotSupported(_)) if req.flags & CMD_FLAG_FAST_ZERO == 0 => {
            let zeroes = vec![0u8; len.min(ZERO_CHUNK) as usize];
            let mut done = 0;
            while done < len {
                let n = (len - done).min(ZERO_CHUNK);
                dev.write(req.offset + done, &zeroes[..n as usize], false)?;
                done += n;
            }
            Ok(())
        }
        other => other,
    }
}
