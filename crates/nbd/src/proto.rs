//! Wire constants of the NBD protocol and the encoders and decoders the
//! handshake and transmission phases share. Everything here is pure: no I/O.
//!
//! Numbers are big-endian on the wire. Names follow the protocol document
//! (doc/proto.md of the NetworkBlockDevice project) without the `NBD_` prefix.

use crate::device::{IoError, IoErrorKind};

/// `NBDMAGIC`, the first eight bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: newstyle handshake magic, also prefixing every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic prefixing every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic prefixing every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flag: fixed newstyle negotiation.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag: the server may omit the 124 zero bytes after EXPORT_NAME.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag: the client speaks fixed newstyle.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: omit the 124 zero bytes after EXPORT_NAME.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flag: always set.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
/// Transmission flag: the export refuses writes.
pub const FLAG_READ_ONLY: u16 = 1 << 1;
/// Transmission flag: NBD_CMD_FLUSH is supported.
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
/// Transmission flag: NBD_CMD_FLAG_FUA is supported.
pub const FLAG_SEND_FUA: u16 = 1 << 3;
/// Transmission flag: NBD_CMD_TRIM is supported.
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
/// Transmission flag: NBD_CMD_WRITE_ZEROES is supported.
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// Transmission flag: NBD_CMD_FLAG_DF is supported (structured replies only).
pub const FLAG_SEND_DF: u16 = 1 << 7;
/// Transmission flag: flushes and FUA are visible across connections.
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
/// Transmission flag: NBD_CMD_CACHE is supported.
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
/// Transmission flag: NBD_CMD_FLAG_FAST_ZERO is supported.
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

/// Option: choose an export and enter transmission (cannot fail politely).
pub const OPT_EXPORT_NAME: u32 = 1;
/// Option: the client gives up.
pub const OPT_ABORT: u32 = 2;
/// Option: list exports.
pub const OPT_LIST: u32 = 3;
/// Option: start TLS (unsupported here).
pub const OPT_STARTTLS: u32 = 5;
/// Option: describe an export.
pub const OPT_INFO: u32 = 6;
/// Option: describe an export and enter transmission.
pub const OPT_GO: u32 = 7;
/// Option: use structured replies.
pub const OPT_STRUCTURED_REPLY: u32 = 8;
/// Option: list metadata contexts.
pub const OPT_LIST_META_CONTEXT: u32 = 9;
/// Option: select metadata contexts.
pub const OPT_SET_META_CONTEXT: u32 = 10;

/// Option reply: success / end of a list.
pub const REP_ACK: u32 = 1;
/// Option reply: one export of a list.
pub const REP_SERVER: u32 = 2;
/// Option reply: one piece of export information.
pub const REP_INFO: u32 = 3;
/// Option reply: one metadata context.
pub const REP_META_CONTEXT: u32 = 4;
/// Option reply error: unknown option.
pub const REP_ERR_UNSUP: u32 = (1 << 31) | 1;
/// Option reply error: refused by policy.
pub const REP_ERR_POLICY: u32 = (1 << 31) | 2;
/// Option reply error: malformed option.
pub const REP_ERR_INVALID: u32 = (1 << 31) | 3;
/// Option reply error: no such export.
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) | 6;
/// Option reply error: the server is shutting down.
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) | 7;

/// Info type: size and transmission flags.
pub const INFO_EXPORT: u16 = 0;
/// Info type: canonical export name.
pub const INFO_NAME: u16 = 1;
/// Info type: human-readable description.
pub const INFO_DESCRIPTION: u16 = 2;
/// Info type: block size constraints.
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Command: read.
pub const CMD_READ: u16 = 0;
/// Command: write (followed by its payload).
pub const CMD_WRITE: u16 = 1;
/// Command: disconnect (no reply).
pub const CMD_DISC: u16 = 2;
/// Command: flush.
pub const CMD_FLUSH: u16 = 3;
/// Command: trim / discard.
pub const CMD_TRIM: u16 = 4;
/// Command: prefetch hint.
pub const CMD_CACHE: u16 = 5;
/// Command: write zeroes.
pub const CMD_WRITE_ZEROES: u16 = 6;
/// Command: block status.
pub const CMD_BLOCK_STATUS: u16 = 7;

/// Command flag: force unit access.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
/// Command flag (WRITE_ZEROES): do not punch a hole.
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// Command flag (READ): reply with a single content chunk.
pub const CMD_FLAG_DF: u16 = 1 << 2;
/// Command flag (BLOCK_STATUS): one extent is enough.
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
/// Command flag (WRITE_ZEROES): fail with ENOTSUP unless fast.
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Structured reply flag: last chunk of the reply.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
/// Structured chunk: nothing (final).
pub const REPLY_TYPE_NONE: u16 = 0;
/// Structured chunk: data at an offset.
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// Structured chunk: block status descriptors.
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// Structured chunk: an error.
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;

/// base:allocation flag: unallocated.
pub const STATE_HOLE: u32 = 1 << 0;
/// base:allocation flag: reads as zeroes.
pub const STATE_ZERO: u32 = 1 << 1;

/// Error: operation not permitted (writes to a read-only export).
pub const EPERM: u32 = 1;
/// Error: input/output error.
pub const EIO: u32 = 5;
/// Error: invalid argument.
pub const EINVAL: u32 = 22;
/// Error: no space left (also writes past the end).
pub const ENOSPC: u32 = 28;
/// Error: operation not supported (fast zero).
pub const ENOTSUP: u32 = 95;

/// The metadata context this server offers.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// The context id the server assigns to `base:allocation`.
pub const BASE_ALLOCATION_ID: u32 = 1;
/// Longest string (export name, query) accepted, per the protocol.
pub const MAX_STRING: usize = 4096;
/// Length of a request header.
pub const REQUEST_LEN: usize = 28;

/// The NBD error code for a volume's error.
pub fn errno(e: &IoError) -> u32 {
    match e.kind {
        IoErrorKind::Io | IoErrorKind::Gone | IoErrorKind::Fenced => EIO,
        IoErrorKind::NoSpace => ENOSPC,
        IoErrorKind::Invalid => EINVAL,
        IoErrorKind::ReadOnly => EPERM,
        IoErrorKind::NotSupported => ENOTSUP,
    }
}

/// One transmission request header (the payload of a WRITE follows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Command flags (`CMD_FLAG_*`).
    pub flags: u16,
    /// Command type (`CMD_*`).
    pub kind: u16,
    /// Opaque client handle, echoed in the reply.
    pub cookie: u64,
    /// Byte offset into the export.
    pub offset: u64,
    /// Byte length (of the payload, for WRITE).
    pub length: u32,
}

impl Request {
    /// Decode a header; `Err` carries the bad magic.
    pub fn decode(b: &[u8; REQUEST_LEN]) -> Result<Request, u32> {
        let magic = be32(&b[0..4]);
        if magic != REQUEST_MAGIC {
            return Err(magic);
        }
        Ok(Request {
            flags: be16(&b[4..6]),
            kind: be16(&b[6..8]),
            cookie: be64(&b[8..16]),
            offset: be64(&b[16..24]),
            length: be32(&b[24..28]),
        })
    }

    /// Encode a header (clients: tests and the fuzz harness).
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }
}

/// Length of a client option header.
pub const OPTION_HEADER_LEN: usize = 16;

/// Decodes a client option header: (magic, option, data length).
pub fn decode_option_header(b: &[u8; OPTION_HEADER_LEN]) -> (u64, u32, u32) {
    (be64(&b[0..8]), be32(&b[8..12]), be32(&b[12..16]))
}

fn be16(b: &[u8]) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(b);
    u16::from_be_bytes(a)
}

fn be32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(b);
    u32::from_be_bytes(a)
}

fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_be_bytes(a)
}

const HEAD_MAX: usize = 28;

/// One transmission reply, ready for the wire: a short header kept inline
/// (no allocation) and an optional body (read data, descriptors, message).
#[derive(Debug)]
pub struct Reply {
    head: [u8; HEAD_MAX],
    head_len: u8,
    body: Vec<u8>,
}

impl Reply {
    fn new(parts: &[&[u8]], body: Vec<u8>) -> Reply {
        let mut head = [0u8; HEAD_MAX];
        let mut n = 0;
        for p in parts {
            head[n..n + p.len()].copy_from_slice(p);
            n += p.len();
        }
        Reply {
            head,
            head_len: n as u8,
            body,
        }
    }

    /// A simple reply; `data` only for a successful READ.
    pub fn simple(cookie: u64, error: u32, data: Vec<u8>) -> Reply {
        Reply::new(
            &[
                &SIMPLE_REPLY_MAGIC.to_be_bytes(),
                &error.to_be_bytes(),
                &cookie.to_be_bytes(),
            ],
            data,
        )
    }

    fn chunk_head(flags: u16, kind: u16, cookie: u64, len: u32) -> [u8; 20] {
        let mut h = [0u8; 20];
        h[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        h[4..6].copy_from_slice(&flags.to_be_bytes());
        h[6..8].copy_from_slice(&kind.to_be_bytes());
        h[8..16].copy_from_slice(&cookie.to_be_bytes());
        h[16..20].copy_from_slice(&len.to_be_bytes());
        h
    }

    /// A final NBD_REPLY_TYPE_NONE chunk.
    pub fn done(cookie: u64) -> Reply {
        Reply::new(
            &[&Reply::chunk_head(
                REPLY_FLAG_DONE,
                REPLY_TYPE_NONE,
                cookie,
                0,
            )],
            Vec::new(),
        )
    }

    /// A final OFFSET_DATA chunk. `data.len()` must be at most
    /// `u32::MAX - 8` (the server's payload limit guarantees it).
    pub fn offset_data(cookie: u64, offset: u64, data: Vec<u8>) -> Reply {
        let len = (data.len() as u64 + 8).min(u64::from(u32::MAX)) as u32;
        let h = Reply::chunk_head(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, cookie, len);
        Reply::new(&[&h, &offset.to_be_bytes()], data)
    }

    /// A final NBD_REPLY_TYPE_ERROR chunk with a message for humans.
    pub fn error_chunk(cookie: u64, error: u32, message: &str) -> Reply {
        let mut msg = message.as_bytes();
        if msg.len() > MAX_STRING {
            msg = &msg[..MAX_STRING];
        }
        let len = 6 + msg.len() as u32;
        let h = Reply::chunk_head(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, cookie, len);
        Reply::new(
            &[&h, &error.to_be_bytes(), &(msg.len() as u16).to_be_bytes()],
            msg.to_vec(),
        )
    }

    /// A final BLOCK_STATUS chunk for context `id` with `(length, flags)`
    /// descriptors (at least one).
    pub fn block_status(cookie: u64, id: u32, descriptors: &[(u32, u32)]) -> Reply {
        let mut body = Vec::with_capacity(descriptors.len() * 8);
        for (len, flags) in descriptors {
            body.extend_from_slice(&len.to_be_bytes());
            body.extend_from_slice(&flags.to_be_bytes());
        }
        let len = (4 + body.len()).min(u32::MAX as usize) as u32;
        let h = Reply::chunk_head(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, cookie, len);
        Reply::new(&[&h, &id.to_be_bytes()], body)
    }

    /// The fixed header bytes.
    pub fn head(&self) -> &[u8] {
        &self.head[..self.head_len as usize]
    }

    /// The bytes after the header.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The body, to reuse its buffer once the reply is written.
    pub(crate) fn into_body(self) -> Vec<u8> {
        self.body
    }
}

/// Turn block-status extents into base:allocation descriptors for a request
/// of `len` bytes: zero-length extents skipped, neighbours with equal flags
/// merged, clipped to `len`, at most one descriptor with `req_one`, at most
/// `max` descriptors. Never empty: with no usable extent it reports the whole
/// range as plain data (flags 0), which the protocol always allows.
pub fn descriptors(
    extents: &[crate::Extent],
    len: u32,
    req_one: bool,
    max: usize,
) -> Vec<(u32, u32)> {
    let limit = if req_one { 1 } else { max.max(1) };
    let mut out: Vec<(u32, u32)> = Vec::new();
    let mut left = u64::from(len);
    for e in extents {
        if left == 0 {
            break;
        }
        let take = e.length.min(left);
        if take == 0 {
            continue;
        }
        let flags = (if e.hole { STATE_HOLE } else { 0 }) | (if e.zero { STATE_ZERO } else { 0 });
        let full = out.len() == limit;
        match out.last_mut() {
            // Sums stay within `len`, which fits in u32.
            Some(last) if last.1 == flags => last.0 += take as u32,
            _ if full => break,
            _ => out.push((take as u32, flags)),
        }
        left -= take;
    }
    if out.is_empty() {
        out.push((len, 0));
    }
    out
}

/// Appends an option reply to `out`.
pub fn option_reply(out: &mut Vec<u8>, option: u32, kind: u32, data: &[&[u8]]) {
    let len: usize = data.iter().map(|d| d.len()).sum();
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(len as u32).to_be_bytes());
    for d in data {
        out.extend_from_slice(d);
    }
}

/// A reader over option data that never panics on short input.
#[derive(Debug)]
pub struct Cursor<'a> {
    buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    /// Reads from the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Cursor { buf }
    }

    /// The next `n` bytes, if there are that many.
    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.buf.len() {
            return None;
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(head)
    }

    /// A big-endian u16.
    pub fn u16(&mut self) -> Option<u16> {
        self.bytes(2).map(be16)
    }

    /// A big-endian u32.
    pub fn u32(&mut self) -> Option<u32> {
        self.bytes(4).map(be32)
    }

    /// A protocol string: u32 length then UTF-8 without NUL, at most
    /// [`MAX_STRING`] bytes.
    pub fn string(&mut self) -> Option<&'a str> {
        let n = self.u32()? as usize;
        if n > MAX_STRING {
            return None;
        }
        check_string(self.bytes(n)?)
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }
}

/// `b` as a protocol string (UTF-8, no NUL, at most [`MAX_STRING`] bytes).
pub fn check_string(b: &[u8]) -> Option<&str> {
    if b.len() > MAX_STRING || b.contains(&0) {
        return None;
    }
    std::str::from_utf8(b).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Extent;

    #[test]
    fn request_round_trip_and_bad_magic() {
        let r = Request {
            flags: 5,
            kind: CMD_WRITE,
            cookie: 0x0102_0304_0506_0708,
            offset: 1 << 40,
            length: 4096,
        };
        let b = r.encode();
        assert_eq!(Request::decode(&b), Ok(r));
        let mut bad = b;
        bad[0] ^= 0xff;
        assert_eq!(Request::decode(&bad), Err(REQUEST_MAGIC ^ 0xff00_0000));
    }

    #[test]
    fn simple_reply_layout() {
        let r = Reply::simple(7, EIO, Vec::new());
        assert_eq!(
            r.head(),
            &[0x67, 0x44, 0x66, 0x98, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 7]
        );
        assert!(r.body().is_empty());
    }

    #[test]
    fn structured_chunks_layout() {
        let r = Reply::offset_data(9, 512, vec![1, 2, 3]);
        assert_eq!(&r.head()[0..4], &STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&r.head()[4..8], &[0, 1, 0, 1]); // DONE, OFFSET_DATA
        assert_eq!(&r.head()[8..16], &9u64.to_be_bytes());
        assert_eq!(&r.head()[16..20], &11u32.to_be_bytes());
        assert_eq!(&r.head()[20..28], &512u64.to_be_bytes());
        assert_eq!(r.body(), &[1, 2, 3]);

        let e = Reply::error_chunk(1, EINVAL, "bad");
        assert_eq!(&e.head()[4..8], &[0, 1, 0x80, 1]);
        assert_eq!(&e.head()[16..20], &9u32.to_be_bytes());
        assert_eq!(&e.head()[20..26], &[0, 0, 0, 22, 0, 3]);
        assert_eq!(e.body(), b"bad");
        let long = "x".repeat(10_000);
        let e = Reply::error_chunk(1, EIO, &long);
        assert_eq!(e.body().len(), MAX_STRING);

        let b = Reply::block_status(3, BASE_ALLOCATION_ID, &[(4096, 3), (512, 0)]);
        assert_eq!(&b.head()[4..8], &[0, 1, 0, 5]);
        assert_eq!(&b.head()[16..20], &20u32.to_be_bytes());
        assert_eq!(&b.head()[20..24], &1u32.to_be_bytes());
        assert_eq!(b.body(), &[0, 0, 16, 0, 0, 0, 0, 3, 0, 0, 2, 0, 0, 0, 0, 0]);

        let d = Reply::done(4);
        assert_eq!(&d.head()[4..8], &[0, 1, 0, 0]);
        assert_eq!(d.head().len(), 20);
    }

    fn ext(length: u64, hole: bool) -> Extent {
        Extent {
            length,
            hole,
            zero: hole,
        }
    }

    #[test]
    fn descriptors_clip_merge_and_limit() {
        let e = [
            ext(100, true),
            ext(0, false),
            ext(50, true),
            ext(1 << 40, false),
        ];
        assert_eq!(descriptors(&e, 1000, false, 16), vec![(150, 3), (850, 0)]);
        assert_eq!(descriptors(&e, 120, false, 16), vec![(120, 3)]);
        assert_eq!(descriptors(&e, 1000, true, 16), vec![(150, 3)]);
        assert_eq!(descriptors(&e, 1000, false, 1), vec![(150, 3)]);
        assert_eq!(descriptors(&[], 77, false, 16), vec![(77, 0)]);
        assert_eq!(descriptors(&[ext(0, true)], 77, true, 16), vec![(77, 0)]);
        // An extent longer than 4 GiB is clipped to the 32-bit request.
        assert_eq!(
            descriptors(&[ext(1 << 33, false)], u32::MAX, false, 16),
            vec![(u32::MAX, 0)]
        );
    }

    #[test]
    fn cursor_never_reads_past_the_end() {
        let mut c = Cursor::new(&[0, 0, 0, 2, b'h', b'i', 0, 9]);
        assert_eq!(c.string(), Some("hi"));
        assert_eq!(c.u16(), Some(9));
        assert_eq!(c.u16(), None);
        let mut c = Cursor::new(&[0xff, 0xff, 0xff, 0xff, 1]);
        assert_eq!(c.string(), None);
        let mut c = Cursor::new(&[0, 0, 0, 1, 0]);
        assert_eq!(c.string(), None, "NUL is not allowed");
        let mut c = Cursor::new(&[0, 0, 0, 2, 0xc3, 0x28]);
        assert_eq!(c.string(), None, "invalid UTF-8");
    }

    #[test]
    fn option_reply_layout() {
        let mut v = Vec::new();
        option_reply(&mut v, OPT_LIST, REP_SERVER, &[&[0, 0, 0, 1], b"a"]);
        assert_eq!(&v[0..8], &OPTION_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&v[8..20], &[0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 5]);
        assert_eq!(&v[20..], &[0, 0, 0, 1, b'a']);
    }

    #[test]
    fn device_errors_map_to_nbd_codes() {
        let s = String::new;
        let e = |k| IoError::new(k, s());
        assert_eq!(errno(&e(IoErrorKind::Io)), 5);
        assert_eq!(errno(&e(IoErrorKind::Gone)), 5);
        assert_eq!(errno(&e(IoErrorKind::Fenced)), 5);
        assert_eq!(errno(&e(IoErrorKind::NoSpace)), 28);
        assert_eq!(errno(&e(IoErrorKind::Invalid)), 22);
        assert_eq!(errno(&e(IoErrorKind::ReadOnly)), 1);
        assert_eq!(errno(&e(IoErrorKind::NotSupported)), 95);
    }
}
