//! The bodies of a replica session's frames: Attach and Attached open the
//! session on one volume, then each Call (one operation of the data path's
//! trait, tagged) gets one Reply with the same tag. Pure, as the rest of
//! the codec: the proptests and the fuzz target drive it directly. The
//! layout is in `docs/transfer.md`, "Replica sessions".

use super::{Body, WireError, MAX_DATA, MAX_MESSAGE, MAX_NAME};
use lamina_blockio::{Caps, Extent, IoErrorKind};

/// Most extents in a BlockStatus reply (a replica answers the first ones:
/// the trait asks only that they cover the first byte).
pub const MAX_EXTENTS: usize = 1024;
/// Bytes of an extent in a BlockStatus reply: length u64, flags u8.
const EXTENT: usize = 9;
/// Bytes of a Call body before its payload: tag, op, flags, offset, len.
pub const CALL_FIXED: usize = 8 + 1 + 1 + 8 + 8;
/// Bytes of a Reply body before what follows its status: tag, op, status.
pub const REPLY_FIXED: usize = 8 + 1 + 1;
/// The largest Reply body: a read's data (larger than the most extents and
/// the longest message).
pub const REPLY_MAX: usize = REPLY_FIXED + MAX_DATA;
/// The largest Call body: a write's.
pub const CALL_MAX: usize = CALL_FIXED + MAX_DATA;

/// Call flag: a write's FUA.
pub const FLAG_FUA: u8 = 1;
/// Call flag: a write-zeroes may leave a hole.
pub const FLAG_MAY_TRIM: u8 = 2;
/// Call flag: a snapshot is a member of the group snapshot of its name
/// (version 6).
pub const FLAG_GROUP: u8 = 4;

/// An operation's code on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum OpCode {
    Read = 0,
    Write = 1,
    Flush = 2,
    Trim = 3,
    WriteZeroes = 4,
    BlockStatus = 5,
    Activate = 6,
    Size = 7,
    Ping = 8,
    Snapshot = 9,
    DeleteSnapshot = 10,
}

impl OpCode {
    fn from_u8(b: u8) -> Option<OpCode> {
        Some(match b {
            0 => OpCode::Read,
            1 => OpCode::Write,
            2 => OpCode::Flush,
            3 => OpCode::Trim,
            4 => OpCode::WriteZeroes,
            5 => OpCode::BlockStatus,
            6 => OpCode::Activate,
            7 => OpCode::Size,
            8 => OpCode::Ping,
            9 => OpCode::Snapshot,
            10 => OpCode::DeleteSnapshot,
            _ => return None,
        })
    }
}

/// One operation a front end asks of a replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallOp {
    /// `len` bytes (1 to [`MAX_DATA`]) from `offset`.
    Read {
        offset: u64,
        len: u64,
    },
    /// `data` (1 to [`MAX_DATA`] bytes) at `offset`.
    Write {
        offset: u64,
        data: Vec<u8>,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        len: u64,
    },
    WriteZeroes {
        offset: u64,
        len: u64,
        may_trim: bool,
    },
    BlockStatus {
        offset: u64,
        len: u64,
    },
    /// Make the session's handle the holder of `generation`.
    Activate {
        generation: u64,
    },
    /// The volume's size now.
    Size,
    /// Nothing: keeps an idle session alive and proves the peer answers.
    Ping,
    /// Snapshot the attached volume as `name` (1 to 255 bytes of UTF-8;
    /// the replica's node applies the engine's naming rule), a copy of the
    /// snapshot whose identity is `origin` (`crate::identity`; carried in
    /// the call's offset, 0 for none: a version 2 session's); with
    /// `group` (flag [`FLAG_GROUP`], version 6), a member of the group
    /// snapshot `name`.
    Snapshot {
        name: String,
        origin: u64,
        group: bool,
    },
    /// Delete the attached volume's snapshot `name` (one that is not there
    /// is as good).
    DeleteSnapshot {
        name: String,
    },
}

impl CallOp {
    pub fn code(&self) -> OpCode {
        match self {
            CallOp::Read { .. } => OpCode::Read,
            CallOp::Write { .. } => OpCode::Write,
            CallOp::Flush => OpCode::Flush,
            CallOp::Trim { .. } => OpCode::Trim,
            CallOp::WriteZeroes { .. } => OpCode::WriteZeroes,
            CallOp::BlockStatus { .. } => OpCode::BlockStatus,
            CallOp::Activate { .. } => OpCode::Activate,
            CallOp::Size => OpCode::Size,
            CallOp::Ping => OpCode::Ping,
            CallOp::Snapshot { .. } => OpCode::Snapshot,
            CallOp::DeleteSnapshot { .. } => OpCode::DeleteSnapshot,
        }
    }
}

/// A Call frame: an operation and the tag its Reply carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub tag: u64,
    pub op: CallOp,
}

/// What a successful operation answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answered {
    /// The bytes read (as many as asked).
    Read(Vec<u8>),
    Write,
    Flush,
    Trim,
    WriteZeroes,
    /// 1 to [`MAX_EXTENTS`] extents from the asked offset.
    BlockStatus(Vec<Extent>),
    Activate,
    Size(u64),
    Ping,
    Snapshot,
    DeleteSnapshot,
}

impl Answered {
    pub fn code(&self) -> OpCode {
        match self {
            Answered::Read(_) => OpCode::Read,
            Answered::Write => OpCode::Write,
            Answered::Flush => OpCode::Flush,
            Answered::Trim => OpCode::Trim,
            Answered::WriteZeroes => OpCode::WriteZeroes,
            Answered::BlockStatus(_) => OpCode::BlockStatus,
            Answered::Activate => OpCode::Activate,
            Answered::Size(_) => OpCode::Size,
            Answered::Ping => OpCode::Ping,
            Answered::Snapshot => OpCode::Snapshot,
            Answered::DeleteSnapshot => OpCode::DeleteSnapshot,
        }
    }
}

/// A Reply's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Done(Answered),
    /// The operation failed on the replica, as the trait's error says.
    Failed {
        op: OpCode,
        kind: IoErrorKind,
        message: String,
    },
}

/// A Reply frame: the outcome of the Call of the same tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub tag: u64,
    pub outcome: Outcome,
}

/// An error kind's status byte (0 is success).
pub fn status_of(kind: IoErrorKind) -> u8 {
    match kind {
        IoErrorKind::Io => 1,
        IoErrorKind::NoSpace => 2,
        IoErrorKind::Invalid => 3,
        IoErrorKind::ReadOnly => 4,
        IoErrorKind::NotSupported => 5,
        IoErrorKind::Gone => 6,
        IoErrorKind::Fenced => 7,
    }
}

fn kind_of(status: u8) -> Option<IoErrorKind> {
    Some(match status {
        1 => IoErrorKind::Io,
        2 => IoErrorKind::NoSpace,
        3 => IoErrorKind::Invalid,
        4 => IoErrorKind::ReadOnly,
        5 => IoErrorKind::NotSupported,
        6 => IoErrorKind::Gone,
        7 => IoErrorKind::Fenced,
        _ => return None,
    })
}

/// Caps as Attached's byte: bit 0 flush, 1 FUA, 2 trim, 3 write-zeroes,
/// 4 block status.
pub fn caps_byte(c: Caps) -> u8 {
    u8::from(c.flush)
        | u8::from(c.fua) << 1
        | u8::from(c.trim) << 2
        | u8::from(c.write_zeroes) << 3
        | u8::from(c.block_status) << 4
}

pub(super) fn caps_of(b: u8) -> Caps {
    Caps {
        flush: b & 1 != 0,
        fua: b & 2 != 0,
        trim: b & 4 != 0,
        write_zeroes: b & 8 != 0,
        block_status: b & 16 != 0,
    }
}

pub(super) fn attached(b: &mut Body<'_>) -> Result<(u64, Caps, bool, Option<u64>), WireError> {
    let size = b.u64("size")?;
    let caps = b.take(1, "caps")?[0];
    if caps & !0x1f != 0 {
        return Err(b.bad(format!("unknown caps bits {caps:#04x}")));
    }
    let read_only = match b.take(1, "read_only")?[0] {
        0 => false,
        1 => true,
        r => return Err(b.bad(format!("read_only is {r}, not 0 or 1"))),
    };
    // Version 5's instance, when the node says one.
    let instance = if b.rest.is_empty() {
        None
    } else {
        Some(b.u64("instance")?)
    };
    Ok((size, caps_of(caps), read_only, instance))
}

fn ranged(b: &Body<'_>, what: &str, offset: u64, len: u64) -> Result<(), WireError> {
    if len == 0 || offset.checked_add(len).is_none() {
        return Err(b.bad(format!("{what} of bad range {offset}+{len}")));
    }
    Ok(())
}

pub(super) fn call(b: &mut Body<'_>) -> Result<Call, WireError> {
    let tag = b.u64("tag")?;
    let code = b.take(1, "op")?[0];
    let op = OpCode::from_u8(code).ok_or_else(|| b.bad(format!("unknown op {code}")))?;
    let flags = b.take(1, "flags")?[0];
    let offset = b.u64("offset")?;
    let len = b.u64("len")?;
    let allowed = match op {
        OpCode::Write => FLAG_FUA,
        OpCode::WriteZeroes => FLAG_MAY_TRIM,
        OpCode::Snapshot => FLAG_GROUP,
        _ => 0,
    };
    if flags & !allowed != 0 {
        return Err(b.bad(format!("flags {flags:#04x} on a {op:?} call")));
    }
    let nothing = |b: &Body<'_>, what: &str| {
        if offset != 0 || len != 0 {
            return Err(b.bad(format!("{what} call with offset {offset} and len {len}")));
        }
        Ok(())
    };
    let op = match op {
        OpCode::Read => {
            if len as usize > MAX_DATA {
                return Err(b.bad(format!("read of {len} bytes, more than {MAX_DATA}")));
            }
            ranged(b, "read", offset, len)?;
            CallOp::Read { offset, len }
        }
        OpCode::Write => {
            let data = std::mem::take(&mut b.rest).to_vec();
            if data.len() as u64 != len {
                return Err(b.bad(format!(
                    "write announces {len} bytes and carries {}",
                    data.len()
                )));
            }
            ranged(b, "write", offset, len)?;
            CallOp::Write {
                offset,
                data,
                fua: flags & FLAG_FUA != 0,
            }
        }
        OpCode::Flush => {
            nothing(b, "flush")?;
            CallOp::Flush
        }
        OpCode::Trim => {
            ranged(b, "trim", offset, len)?;
            CallOp::Trim { offset, len }
        }
        OpCode::WriteZeroes => {
            ranged(b, "write-zeroes", offset, len)?;
            CallOp::WriteZeroes {
                offset,
                len,
                may_trim: flags & FLAG_MAY_TRIM != 0,
            }
        }
        OpCode::BlockStatus => {
            ranged(b, "block-status", offset, len)?;
            CallOp::BlockStatus { offset, len }
        }
        OpCode::Activate => {
            if len != 0 {
                return Err(b.bad(format!("activate call with len {len}")));
            }
            CallOp::Activate { generation: offset }
        }
        OpCode::Size => {
            nothing(b, "size")?;
            CallOp::Size
        }
        OpCode::Ping => {
            nothing(b, "ping")?;
            CallOp::Ping
        }
        OpCode::Snapshot | OpCode::DeleteSnapshot => {
            let name = std::mem::take(&mut b.rest);
            // A snapshot's offset is its origin; a delete has none.
            let origin_ok = offset == 0 || op == OpCode::Snapshot;
            if !origin_ok || name.len() as u64 != len || name.is_empty() || name.len() > MAX_NAME {
                return Err(b.bad(format!(
                    "snapshot call with offset {offset}, len {len} and a name of {} bytes",
                    name.len()
                )));
            }
            let name = String::from_utf8(name.to_vec())
                .map_err(|_| b.bad("snapshot name is not UTF-8"))?;
            match op {
                OpCode::Snapshot => CallOp::Snapshot {
                    name,
                    origin: offset,
                    group: flags & FLAG_GROUP != 0,
                },
                _ => CallOp::DeleteSnapshot { name },
            }
        }
    };
    Ok(Call { tag, op })
}

pub(super) fn reply(b: &mut Body<'_>) -> Result<Reply, WireError> {
    let tag = b.u64("tag")?;
    let code = b.take(1, "op")?[0];
    let op = OpCode::from_u8(code).ok_or_else(|| b.bad(format!("unknown op {code}")))?;
    let status = b.take(1, "status")?[0];
    if status != 0 {
        let kind = kind_of(status).ok_or_else(|| b.bad(format!("unknown status {status}")))?;
        let msg = std::mem::take(&mut b.rest);
        if msg.len() > MAX_MESSAGE {
            return Err(b.bad(format!("message of {} bytes", msg.len())));
        }
        let message = String::from_utf8(msg.to_vec()).map_err(|_| b.bad("message is not UTF-8"))?;
        return Ok(Reply {
            tag,
            outcome: Outcome::Failed { op, kind, message },
        });
    }
    let answered = match op {
        OpCode::Read => {
            let data = std::mem::take(&mut b.rest).to_vec();
            if data.is_empty() {
                return Err(b.bad("read reply without data"));
            }
            Answered::Read(data)
        }
        OpCode::Write => Answered::Write,
        OpCode::Flush => Answered::Flush,
        OpCode::Trim => Answered::Trim,
        OpCode::WriteZeroes => Answered::WriteZeroes,
        OpCode::BlockStatus => {
            let rest = std::mem::take(&mut b.rest);
            let n = rest.len() / EXTENT;
            if !rest.len().is_multiple_of(EXTENT) || n == 0 || n > MAX_EXTENTS {
                return Err(b.bad(format!("{} bytes of extents", rest.len())));
            }
            let mut extents = Vec::with_capacity(n);
            for e in rest.chunks_exact(EXTENT) {
                let length = super::be64(e);
                let flags = e[8];
                if length == 0 || flags & !3 != 0 {
                    return Err(b.bad(format!("extent of {length} bytes, flags {flags:#04x}")));
                }
                extents.push(Extent {
                    length,
                    hole: flags & 1 != 0,
                    zero: flags & 2 != 0,
                });
            }
            Answered::BlockStatus(extents)
        }
        OpCode::Activate => Answered::Activate,
        OpCode::Size => Answered::Size(b.u64("size")?),
        OpCode::Ping => Answered::Ping,
        OpCode::Snapshot => Answered::Snapshot,
        OpCode::DeleteSnapshot => Answered::DeleteSnapshot,
    };
    Ok(Reply {
        tag,
        outcome: Outcome::Done(answered),
    })
}

/// A Call's body, appended to `out`; `payload` is a write's data (empty
/// otherwise).
pub fn call_body(
    tag: u64,
    op: OpCode,
    flags: u8,
    offset: u64,
    len: u64,
    payload: &[u8],
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(&tag.to_be_bytes());
    out.push(op as u8);
    out.push(flags);
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(payload);
}

pub(super) fn encode_call(c: &Call, out: &mut Vec<u8>) {
    let t = c.tag;
    match &c.op {
        CallOp::Read { offset, len } => call_body(t, OpCode::Read, 0, *offset, *len, &[], out),
        CallOp::Write { offset, data, fua } => {
            let flags = if *fua { FLAG_FUA } else { 0 };
            call_body(
                t,
                OpCode::Write,
                flags,
                *offset,
                data.len() as u64,
                data,
                out,
            )
        }
        CallOp::Flush => call_body(t, OpCode::Flush, 0, 0, 0, &[], out),
        CallOp::Trim { offset, len } => call_body(t, OpCode::Trim, 0, *offset, *len, &[], out),
        CallOp::WriteZeroes {
            offset,
            len,
            may_trim,
        } => {
            let flags = if *may_trim { FLAG_MAY_TRIM } else { 0 };
            call_body(t, OpCode::WriteZeroes, flags, *offset, *len, &[], out)
        }
        CallOp::BlockStatus { offset, len } => {
            call_body(t, OpCode::BlockStatus, 0, *offset, *len, &[], out)
        }
        CallOp::Activate { generation } => {
            call_body(t, OpCode::Activate, 0, *generation, 0, &[], out)
        }
        CallOp::Size => call_body(t, OpCode::Size, 0, 0, 0, &[], out),
        CallOp::Ping => call_body(t, OpCode::Ping, 0, 0, 0, &[], out),
        CallOp::Snapshot {
            name,
            origin,
            group,
        } => call_body(
            t,
            OpCode::Snapshot,
            if *group { FLAG_GROUP } else { 0 },
            *origin,
            name.len() as u64,
            name.as_bytes(),
            out,
        ),
        CallOp::DeleteSnapshot { name } => call_body(
            t,
            OpCode::DeleteSnapshot,
            0,
            0,
            name.len() as u64,
            name.as_bytes(),
            out,
        ),
    }
}

pub(super) fn encode_reply(r: &Reply, out: &mut Vec<u8>) {
    out.extend_from_slice(&r.tag.to_be_bytes());
    match &r.outcome {
        Outcome::Failed { op, kind, message } => {
            out.push(*op as u8);
            out.push(status_of(*kind));
            super::push_message(message, out);
        }
        Outcome::Done(a) => {
            out.push(a.code() as u8);
            out.push(0);
            match a {
                Answered::Read(data) => out.extend_from_slice(data),
                Answered::BlockStatus(extents) => {
                    for e in extents.iter().take(MAX_EXTENTS) {
                        out.extend_from_slice(&e.length.to_be_bytes());
                        out.push(u8::from(e.hole) | u8::from(e.zero) << 1);
                    }
                }
                Answered::Size(s) => out.extend_from_slice(&s.to_be_bytes()),
                Answered::Write
                | Answered::Flush
                | Answered::Trim
                | Answered::WriteZeroes
                | Answered::Activate
                | Answered::Ping
                | Answered::Snapshot
                | Answered::DeleteSnapshot => {}
            }
        }
    }
}
