//! The frame codec: bytes in, frames or a clear error out. Pure (no I/O, no
//! state), so the fuzz target and the proptests drive it directly.
//!
//! Every frame is `kind u8, 3 zero bytes, body length u32`, the body, then
//! a CRC-32C over header and body. All integers are big-endian. The bodies
//! are described in `docs/transfer.md`.

/// First bytes of a Hello body: says "this is Lamina's transfer protocol".
pub const MAGIC: [u8; 8] = *b"LAMINAXF";
/// The newest protocol version this code speaks: 2 added replica sessions
/// (Attach, Attached, Call, Reply); 3 added the other holders of a
/// snapshot in an Answer, and a snapshot Call's origin; 4 added Retire and
/// Retired (a front end deletes its replica's volume); 5 added the node's
/// instance to Attached; 6 added a snapshot Call's group flag. A source
/// serves peers of versions 1 to 6 alike, each in its own version. A peer
/// says the oldest version that has all its session uses: a target says 3
/// ([`ORIGIN_VERSION`]), a front end 6 ([`GROUP_VERSION`]) and, answered
/// an Error of code 1 (an older source), they say again what they can do
/// with less: a pull 1, a front end 5, 3, then 2; a retire says 4
/// ([`RETIRE_VERSION`]) and has nothing less to fall back to.
pub const VERSION: u16 = 6;
/// The version that added an Answer's holders and a snapshot Call's
/// origin: what a pull and a front end's session say first.
pub const ORIGIN_VERSION: u16 = 3;
/// The version that added Retire: what a front end deleting its replica's
/// volume says (an older node refuses it with code 1).
pub const RETIRE_VERSION: u16 = 4;
/// The version that added the node's instance to Attached: what a front
/// end's session says first.
pub const INSTANCE_VERSION: u16 = 5;
/// The version that added a snapshot Call's group flag: what a front end's
/// session says first.
pub const GROUP_VERSION: u16 = 6;
/// The oldest version a source still serves, and the one a pull falls back
/// to (all a pull needs).
pub const PULL_VERSION: u16 = 1;
/// The version that added replica sessions: what a front end falls back to.
pub const REPLICA_VERSION: u16 = 2;
/// Most other holders an Answer names.
pub const MAX_HOLDERS: usize = 4;
/// Bytes of a frame header: kind, 3 reserved zero bytes, body length.
pub const HEADER: usize = 8;
/// Bytes of a frame trailer: the CRC-32C.
pub const TRAILER: usize = 4;
/// Most payload bytes in one Data frame.
pub const MAX_DATA: usize = 1 << 20;
/// Longest volume or snapshot name (the engine's name limit).
pub const MAX_NAME: usize = 255;
/// Longest message in an Error frame.
pub const MAX_MESSAGE: usize = 4096;

mod calls;
pub use calls::{
    caps_byte, status_of, Answered, Call, CallOp, OpCode, Outcome, Reply, FLAG_FUA, FLAG_GROUP,
    FLAG_MAY_TRIM, MAX_EXTENTS,
};
use lamina_blockio::Caps;

/// Frame kinds, as on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Hello = 1,
    Request = 2,
    Answer = 3,
    Data = 4,
    Zero = 5,
    End = 6,
    Error = 7,
    Attach = 8,
    Attached = 9,
    Call = 10,
    Reply = 11,
    Retire = 12,
    Retired = 13,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Hello,
            2 => Kind::Request,
            3 => Kind::Answer,
            4 => Kind::Data,
            5 => Kind::Zero,
            6 => Kind::End,
            7 => Kind::Error,
            8 => Kind::Attach,
            9 => Kind::Attached,
            10 => Kind::Call,
            11 => Kind::Reply,
            12 => Kind::Retire,
            13 => Kind::Retired,
            _ => return None,
        })
    }

    /// The largest body a frame of this kind may announce.
    fn max_body(self) -> usize {
        match self {
            Kind::Hello => 10,
            Kind::Request => 1 + 8 + 8 + 2 * (2 + MAX_NAME),
            Kind::Answer => 32 + 1 + MAX_HOLDERS * 2 * (2 + MAX_NAME),
            Kind::Data => 8 + MAX_DATA,
            Kind::Zero => 16,
            Kind::End => 16,
            Kind::Error => 2 + MAX_MESSAGE,
            Kind::Attach => 8 + 2 + MAX_NAME,
            Kind::Attached => 18,
            Kind::Call => calls::CALL_MAX,
            Kind::Reply => calls::REPLY_MAX,
            Kind::Retire => 1 + 2 + MAX_NAME,
            Kind::Retired => 1,
        }
    }
}

/// What a client asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Answer, then stream the snapshot's extents from `from_offset`.
    Pull = 0,
    /// Answer, then End: no data.
    Describe = 1,
}

/// A client's request: which snapshot, and from where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub mode: Mode,
    /// The snapshot id the transfer started from (0: any).
    pub expect_id: u64,
    pub from_offset: u64,
    pub volume: String,
    pub snapshot: String,
}

/// The source's answer to a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The snapshot's identity (`crate::identity`): the same on every
    /// replica of a replicated volume.
    pub id: u64,
    pub size: u64,
    /// Bytes of data in the whole snapshot.
    pub data_bytes: u64,
    /// Of those, bytes below the request's `from_offset` (not sent).
    pub skipped_bytes: u64,
    /// Other nodes that may hold the same snapshot (the other replicas of
    /// its volume), at most [`MAX_HOLDERS`]: sent only in a session of
    /// version 3, and empty in older ones.
    pub holders: Vec<Holder>,
}

/// Another node that may hold a snapshot: its name (as its certificate
/// names it) and its transfer address (`HOST:PORT`), each 1 to 255 bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Holder {
    pub node: String,
    pub address: String,
}

/// Why a source refuses or ends a transfer (an Error frame's code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Version,
    SnapshotMissing,
    SnapshotReplaced,
    BadRequest,
    SourceIo,
    ShuttingDown,
    /// The source holds as many sessions as its limits allow (in all, or
    /// of this peer): try again later.
    Busy,
    /// An Attach named a volume the node does not hold.
    VolumeMissing,
    /// The node serves no replica sessions.
    NotServed,
    /// A Retire named a volume that is not a replica of the asking node's
    /// front end (the node's own, or another front end's): it stays.
    NotReplica,
    /// A code this version does not know.
    Other(u16),
}

impl Code {
    pub fn to_u16(self) -> u16 {
        match self {
            Code::Version => 1,
            Code::SnapshotMissing => 2,
            Code::SnapshotReplaced => 3,
            Code::BadRequest => 4,
            Code::SourceIo => 5,
            Code::ShuttingDown => 6,
            Code::Busy => 7,
            Code::VolumeMissing => 8,
            Code::NotServed => 9,
            Code::NotReplica => 10,
            Code::Other(n) => n,
        }
    }

    pub fn from_u16(n: u16) -> Code {
        match n {
            1 => Code::Version,
            2 => Code::SnapshotMissing,
            3 => Code::SnapshotReplaced,
            4 => Code::BadRequest,
            5 => Code::SourceIo,
            6 => Code::ShuttingDown,
            7 => Code::Busy,
            8 => Code::VolumeMissing,
            9 => Code::NotServed,
            10 => Code::NotReplica,
            n => Code::Other(n),
        }
    }
}

/// One frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    Hello {
        version: u16,
    },
    Request(Request),
    Answer(Answer),
    Data {
        offset: u64,
        payload: Vec<u8>,
    },
    Zero {
        offset: u64,
        len: u64,
    },
    /// The stream is complete: Data and Zero frames and payload bytes sent.
    End {
        frames: u64,
        data_bytes: u64,
    },
    Error {
        code: Code,
        message: String,
    },
    /// A replica session on `volume`: a handle to it, never activated.
    /// With `create` above 0, a volume of that size is made first if the
    /// node has none of that name.
    Attach {
        create: u64,
        volume: String,
    },
    /// The attached volume: its size, what it does, whether it is
    /// read-only; and, in a session of version 5, the serving node's
    /// instance when it says one (drawn when its pool was opened: a node
    /// that answers with the same instance has lost nothing it
    /// acknowledged, flushed or not).
    Attached {
        size: u64,
        caps: Caps,
        read_only: bool,
        instance: Option<u64>,
    },
    Call(Call),
    Reply(Reply),
    /// Delete the replica's volume `volume` on the node (with `check`,
    /// only say whether there is one to delete): in place of an Attach, in
    /// a session of version 4. Answered by Retired, or an Error.
    Retire {
        check: bool,
        volume: String,
    },
    /// A Retire's answer: whether the volume was there (and, unless it was
    /// a check, is now deleted).
    Retired {
        existed: bool,
    },
}

/// Most bytes of a peer's text (a name, an Error message), quoted, that
/// [`Frame::summary`] shows.
const ECHO: usize = 128;

/// `s` quoted and escaped, cut to at most [`ECHO`] bytes.
fn echo(s: &str) -> String {
    let mut q = format!("{s:?}");
    if q.len() > ECHO {
        let mut end = ECHO;
        while !q.is_char_boundary(end) {
            end -= 1;
        }
        q.truncate(end);
        q.push_str("...");
    }
    q
}

impl Frame {
    /// The frame in a few words, for a log line or an error message about
    /// a peer's input: bounded whatever the frame holds (a payload by its
    /// length, names and messages cut short), where `{:?}` would print a
    /// MiB of payload.
    pub fn summary(&self) -> String {
        match self {
            Frame::Data { offset, payload } => {
                format!("Data at {offset} ({} bytes)", payload.len())
            }
            Frame::Request(r) => format!(
                "Request ({:?} of {}/{} from {})",
                r.mode,
                echo(&r.volume),
                echo(&r.snapshot),
                r.from_offset
            ),
            Frame::Error { code, message } => format!("Error ({code:?}: {})", echo(message)),
            Frame::Retire { check, volume } => format!(
                "Retire ({}{})",
                echo(volume),
                if *check { ", check" } else { "" }
            ),
            Frame::Attach { create, volume } => match create {
                0 => format!("Attach ({})", echo(volume)),
                n => format!("Attach ({}, creating {n} bytes)", echo(volume)),
            },
            Frame::Call(c) => match &c.op {
                CallOp::Write { offset, data, fua } => format!(
                    "Call {} (write at {offset}, {} bytes{})",
                    c.tag,
                    data.len(),
                    if *fua { ", FUA" } else { "" }
                ),
                op => format!("Call {} ({op:?})", c.tag),
            },
            Frame::Reply(r) => match &r.outcome {
                Outcome::Done(Answered::Read(d)) => {
                    format!("Reply {} (read, {} bytes)", r.tag, d.len())
                }
                Outcome::Done(Answered::BlockStatus(e)) => {
                    format!("Reply {} (block-status, {} extents)", r.tag, e.len())
                }
                Outcome::Done(a) => format!("Reply {} ({a:?})", r.tag),
                Outcome::Failed { op, kind, message } => {
                    format!("Reply {} ({op:?} failed: {kind}: {})", r.tag, echo(message))
                }
            },
            // Numbers only.
            Frame::Answer(a) => format!(
                "Answer (id {}, size {}, {} data bytes, {} skipped, {} holders)",
                a.id,
                a.size,
                a.data_bytes,
                a.skipped_bytes,
                a.holders.len()
            ),
            Frame::Hello { .. }
            | Frame::Zero { .. }
            | Frame::End { .. }
            | Frame::Attached { .. }
            | Frame::Retired { .. } => format!("{self:?}"),
        }
    }
}

/// A frame that cannot be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("reserved header bytes are not zero")]
    Reserved,
    #[error("{kind:?} frame announces {len} bytes of body, more than its limit {max}")]
    TooLong { kind: Kind, len: usize, max: usize },
    #[error("checksum mismatch in {kind:?} frame{}", at(*.offset))]
    Checksum { kind: Kind, offset: Option<u64> },
    #[error("malformed {kind:?} frame: {detail}")]
    Malformed { kind: Kind, detail: String },
}

fn at(offset: Option<u64>) -> String {
    offset
        .map(|o| format!(" at offset {o}"))
        .unwrap_or_default()
}

/// Check a header: its kind, reserved bytes and body length (bounded by
/// the kind before anything is allocated). Returns the kind and the bytes
/// that follow the header (body and checksum).
pub fn check_header(h: &[u8; HEADER]) -> Result<(Kind, usize), WireError> {
    let kind = Kind::from_u8(h[0]).ok_or(WireError::UnknownKind(h[0]))?;
    if h[1..4] != [0, 0, 0] {
        return Err(WireError::Reserved);
    }
    let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
    let max = kind.max_body();
    if len > max {
        return Err(WireError::TooLong { kind, len, max });
    }
    Ok((kind, len + TRAILER))
}

/// Decode the frame at the start of `buf`: `Ok(None)` if `buf` holds only
/// part of it, else the frame and the bytes it took.
pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>, WireError> {
    let Some(h) = buf.get(..HEADER) else {
        return Ok(None);
    };
    let h: &[u8; HEADER] = h.try_into().expect("HEADER bytes");
    let (kind, rest) = check_header(h)?;
    let total = HEADER + rest;
    let Some(whole) = buf.get(..total) else {
        return Ok(None);
    };
    let (covered, sum) = whole.split_at(total - TRAILER);
    let body = &covered[HEADER..];
    if crc32c::crc32c(covered).to_be_bytes() != sum {
        let offset = match kind {
            Kind::Data | Kind::Zero => body.get(..8).map(be64),
            _ => None,
        };
        return Err(WireError::Checksum { kind, offset });
    }
    Ok(Some((body_frame(kind, body)?, total)))
}

fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}

/// Reads a body field by field; every shortfall is a Malformed error.
pub(crate) struct Body<'a> {
    kind: Kind,
    rest: &'a [u8],
}

impl<'a> Body<'a> {
    fn bad(&self, detail: impl Into<String>) -> WireError {
        WireError::Malformed {
            kind: self.kind,
            detail: detail.into(),
        }
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], WireError> {
        if self.rest.len() < n {
            return Err(self.bad(format!("body ends inside {what}")));
        }
        let (a, b) = self.rest.split_at(n);
        self.rest = b;
        Ok(a)
    }
    fn u64(&mut self, what: &str) -> Result<u64, WireError> {
        Ok(be64(self.take(8, what)?))
    }
    fn u16(&mut self, what: &str) -> Result<u16, WireError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn name(&mut self, what: &str) -> Result<String, WireError> {
        let n = self.u16(what)? as usize;
        if n > MAX_NAME {
            return Err(self.bad(format!("{what} is {n} bytes, more than {MAX_NAME}")));
        }
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.bad(format!("{what} is not UTF-8")))
    }
    /// A byte that is 0 or 1.
    fn flag(&mut self, what: &str) -> Result<bool, WireError> {
        match self.take(1, what)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            n => Err(self.bad(format!("{what} is {n}, not 0 or 1"))),
        }
    }
    fn end(self) -> Result<(), WireError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(self.bad(format!("{} bytes after the last field", self.rest.len())))
        }
    }
}

/// An Answer's other holders: nothing (a version 1 or 2 Answer, or none to
/// name), or a count of 1 to [`MAX_HOLDERS`] and that many node names and
/// addresses, each 1 to 255 bytes.
fn holders(b: &mut Body<'_>) -> Result<Vec<Holder>, WireError> {
    if b.rest.is_empty() {
        return Ok(Vec::new());
    }
    let n = b.take(1, "holders")?[0] as usize;
    if n == 0 || n > MAX_HOLDERS {
        return Err(b.bad(format!("{n} holders: 1 to {MAX_HOLDERS} when any")));
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let node = b.name("holder node")?;
        let address = b.name("holder address")?;
        if node.is_empty() || address.is_empty() {
            return Err(b.bad("a holder with an empty node or address"));
        }
        out.push(Holder { node, address });
    }
    Ok(out)
}

fn body_frame(kind: Kind, body: &[u8]) -> Result<Frame, WireError> {
    let mut b = Body { kind, rest: body };
    let frame = match kind {
        Kind::Hello => {
            if b.take(8, "magic")? != MAGIC {
                return Err(
                    b.bad("wrong magic: the peer does not speak Lamina's transfer protocol")
                );
            }
            Frame::Hello {
                version: b.u16("version")?,
            }
        }
        Kind::Request => {
            let mode = match b.take(1, "mode")?[0] {
                0 => Mode::Pull,
                1 => Mode::Describe,
                m => return Err(b.bad(format!("unknown mode {m}"))),
            };
            Frame::Request(Request {
                mode,
                expect_id: b.u64("expect_id")?,
                from_offset: b.u64("from_offset")?,
                volume: b.name("volume")?,
                snapshot: b.name("snapshot")?,
            })
        }
        Kind::Answer => Frame::Answer(Answer {
            id: b.u64("id")?,
            size: b.u64("size")?,
            data_bytes: b.u64("data_bytes")?,
            skipped_bytes: b.u64("skipped_bytes")?,
            holders: holders(&mut b)?,
        }),
        Kind::Data => {
            let offset = b.u64("offset")?;
            data_frame(offset, std::mem::take(&mut b.rest).to_vec())?
        }
        Kind::Zero => {
            let (offset, len) = (b.u64("offset")?, b.u64("len")?);
            if len == 0 || offset.checked_add(len).is_none() {
                return Err(b.bad(format!("bad range {offset}+{len}")));
            }
            Frame::Zero { offset, len }
        }
        Kind::End => Frame::End {
            frames: b.u64("frames")?,
            data_bytes: b.u64("data_bytes")?,
        },
        Kind::Error => {
            let code = Code::from_u16(b.u16("code")?);
            let msg = std::mem::take(&mut b.rest);
            let message =
                String::from_utf8(msg.to_vec()).map_err(|_| b.bad("message is not UTF-8"))?;
            Frame::Error { code, message }
        }
        Kind::Attach => Frame::Attach {
            create: b.u64("create")?,
            volume: b.name("volume")?,
        },
        Kind::Attached => {
            let (size, caps, read_only, instance) = calls::attached(&mut b)?;
            Frame::Attached {
                size,
                caps,
                read_only,
                instance,
            }
        }
        Kind::Call => Frame::Call(calls::call(&mut b)?),
        Kind::Reply => Frame::Reply(calls::reply(&mut b)?),
        Kind::Retire => {
            let check = b.flag("mode")?;
            let volume = b.name("volume")?;
            if volume.is_empty() {
                return Err(b.bad("an empty volume name"));
            }
            Frame::Retire { check, volume }
        }
        Kind::Retired => Frame::Retired {
            existed: b.flag("existed")?,
        },
    };
    b.end()?;
    Ok(frame)
}

/// Append `frame` to `out`. Names, payloads and messages must be within
/// their bounds (the caller's job: an oversized one would not decode);
/// a message longer than the bound is cut at a character boundary.
pub fn encode(frame: &Frame, out: &mut Vec<u8>) {
    let start = out.len();
    let kind = match frame {
        Frame::Hello { .. } => Kind::Hello,
        Frame::Request(_) => Kind::Request,
        Frame::Answer(_) => Kind::Answer,
        Frame::Data { .. } => Kind::Data,
        Frame::Zero { .. } => Kind::Zero,
        Frame::End { .. } => Kind::End,
        Frame::Error { .. } => Kind::Error,
        Frame::Attach { .. } => Kind::Attach,
        Frame::Attached { .. } => Kind::Attached,
        Frame::Call(_) => Kind::Call,
        Frame::Reply(_) => Kind::Reply,
        Frame::Retire { .. } => Kind::Retire,
        Frame::Retired { .. } => Kind::Retired,
    };
    out.extend_from_slice(&[kind as u8, 0, 0, 0, 0, 0, 0, 0]);
    match frame {
        Frame::Hello { version } => {
            out.extend_from_slice(&MAGIC);
            out.extend_from_slice(&version.to_be_bytes());
        }
        Frame::Request(r) => {
            out.push(r.mode as u8);
            out.extend_from_slice(&r.expect_id.to_be_bytes());
            out.extend_from_slice(&r.from_offset.to_be_bytes());
            for name in [&r.volume, &r.snapshot] {
                out.extend_from_slice(&(name.len() as u16).to_be_bytes());
                out.extend_from_slice(name.as_bytes());
            }
        }
        Frame::Answer(a) => {
            for v in [a.id, a.size, a.data_bytes, a.skipped_bytes] {
                out.extend_from_slice(&v.to_be_bytes());
            }
            if !a.holders.is_empty() {
                let n = a.holders.len().min(MAX_HOLDERS);
                out.push(n as u8);
                for h in &a.holders[..n] {
                    for name in [&h.node, &h.address] {
                        out.extend_from_slice(&(name.len() as u16).to_be_bytes());
                        out.extend_from_slice(name.as_bytes());
                    }
                }
            }
        }
        Frame::Data { offset, payload } => {
            out.extend_from_slice(&offset.to_be_bytes());
            out.extend_from_slice(payload);
        }
        Frame::Zero { offset, len } => {
            out.extend_from_slice(&offset.to_be_bytes());
            out.extend_from_slice(&len.to_be_bytes());
        }
        Frame::End { frames, data_bytes } => {
            out.extend_from_slice(&frames.to_be_bytes());
            out.extend_from_slice(&data_bytes.to_be_bytes());
        }
        Frame::Error { code, message } => {
            out.extend_from_slice(&code.to_u16().to_be_bytes());
            push_message(message, out);
        }
        Frame::Attach { create, volume } => {
            out.extend_from_slice(&create.to_be_bytes());
            out.extend_from_slice(&(volume.len() as u16).to_be_bytes());
            out.extend_from_slice(volume.as_bytes());
        }
        Frame::Attached {
            size,
            caps,
            read_only,
            instance,
        } => {
            out.extend_from_slice(&size.to_be_bytes());
            out.push(calls::caps_byte(*caps));
            out.push(u8::from(*read_only));
            if let Some(i) = instance {
                out.extend_from_slice(&i.to_be_bytes());
            }
        }
        Frame::Call(c) => calls::encode_call(c, out),
        Frame::Reply(r) => calls::encode_reply(r, out),
        Frame::Retire { check, volume } => {
            out.push(u8::from(*check));
            out.extend_from_slice(&(volume.len() as u16).to_be_bytes());
            out.extend_from_slice(volume.as_bytes());
        }
        Frame::Retired { existed } => out.push(u8::from(*existed)),
    }
    let body = (out.len() - start - HEADER) as u32;
    out[start + 4..start + HEADER].copy_from_slice(&body.to_be_bytes());
    let sum = crc32c::crc32c(&out[start..]);
    out.extend_from_slice(&sum.to_be_bytes());
}

/// Append `message`, cut at a character boundary to at most
/// [`MAX_MESSAGE`] bytes (an Error frame's, a failed Reply's).
fn push_message(message: &str, out: &mut Vec<u8>) {
    let mut end = message.len().min(MAX_MESSAGE);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&message.as_bytes()[..end]);
}

/// Append a Data frame without building a [`Frame`] (no copy of the payload
/// besides the one into `out`).
pub fn encode_data(offset: u64, payload: &[u8], out: &mut Vec<u8>) {
    let start = out.len();
    out.reserve(HEADER + 8 + payload.len() + TRAILER);
    out.extend_from_slice(&[Kind::Data as u8, 0, 0, 0]);
    out.extend_from_slice(&((8 + payload.len()) as u32).to_be_bytes());
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(payload);
    let sum = crc32c::crc32c(&out[start..]);
    out.extend_from_slice(&sum.to_be_bytes());
}

/// Make `buf` one Data frame of `len` payload bytes at `offset` and return
/// its payload to fill, then [`seal_data`] it: a sender that reads data
/// straight into a frame buffer it reuses (no copy, no new allocation per
/// frame). The payload holds whatever `buf` held before until filled.
pub fn data_frame_start(buf: &mut Vec<u8>, offset: u64, len: usize) -> &mut [u8] {
    debug_assert!(len > 0 && len <= MAX_DATA, "a Data payload of {len} bytes");
    buf.resize(HEADER + 8 + len + TRAILER, 0);
    buf[..4].copy_from_slice(&[Kind::Data as u8, 0, 0, 0]);
    buf[4..HEADER].copy_from_slice(&((8 + len) as u32).to_be_bytes());
    buf[HEADER..HEADER + 8].copy_from_slice(&offset.to_be_bytes());
    &mut buf[HEADER + 8..HEADER + 8 + len]
}

/// Set the trailer of a frame [`data_frame_start`] made and the caller
/// filled.
pub fn seal_data(buf: &mut [u8]) {
    let n = buf.len() - TRAILER;
    let sum = crc32c::crc32c(&buf[..n]);
    buf[n..].copy_from_slice(&sum.to_be_bytes());
}

/// A Data frame read in parts (header, offset, payload, trailer) so that
/// the payload lands in its own buffer without a copy: the same checks, in
/// the same order, as [`decode`] makes on the whole frame.
pub fn data_from_parts(
    h: &[u8; HEADER],
    offset: [u8; 8],
    payload: Vec<u8>,
    sum: [u8; TRAILER],
) -> Result<Frame, WireError> {
    let crc = crc32c::crc32c_append(crc32c::crc32c_append(crc32c::crc32c(h), &offset), &payload);
    let offset = u64::from_be_bytes(offset);
    if crc.to_be_bytes() != sum {
        return Err(WireError::Checksum {
            kind: Kind::Data,
            offset: Some(offset),
        });
    }
    data_frame(offset, payload)
}

/// A Data frame's body checks, once its checksum holds: for [`decode`] and
/// [`data_from_parts`] alike.
fn data_frame(offset: u64, payload: Vec<u8>) -> Result<Frame, WireError> {
    let bad = |detail: String| WireError::Malformed {
        kind: Kind::Data,
        detail,
    };
    if payload.is_empty() {
        return Err(bad("no payload".into()));
    }
    if offset.checked_add(payload.len() as u64).is_none() {
        return Err(bad(format!("offset {offset} + length overflows")));
    }
    Ok(Frame::Data { offset, payload })
}

/// A frame of `kind` around `body` with a valid header and checksum, for
/// tests that reach the body parsers with random bytes.
#[cfg(test)]
pub(crate) fn framed(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut buf = vec![kind, 0, 0, 0];
    buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
    buf.extend_from_slice(body);
    let sum = crc32c::crc32c(&buf);
    buf.extend_from_slice(&sum.to_be_bytes());
    buf
}

/// Append a Call frame of `op` with `flags`, `offset`, `len` and (a
/// write's) `payload`, without building a [`Frame`]: a front end sends a
/// write's data straight from the caller's buffer.
pub fn encode_call(
    tag: u64,
    op: OpCode,
    flags: u8,
    offset: u64,
    len: u64,
    payload: &[u8],
    out: &mut Vec<u8>,
) {
    let start = out.len();
    out.reserve(HEADER + calls::CALL_FIXED + payload.len() + TRAILER);
    out.extend_from_slice(&[Kind::Call as u8, 0, 0, 0, 0, 0, 0, 0]);
    calls::call_body(tag, op, flags, offset, len, payload, out);
    let body = (out.len() - start - HEADER) as u32;
    out[start + 4..start + HEADER].copy_from_slice(&body.to_be_bytes());
    let sum = crc32c::crc32c(&out[start..]);
    out.extend_from_slice(&sum.to_be_bytes());
}

#[cfg(test)]
mod tests;
