//! The part of the kernel's FUSE protocol (`include/uapi/linux/fuse.h`,
//! protocol 7.x) that serving one regular file needs: the request header,
//! the bodies of the requests the server answers, and the replies. Every
//! integer is little-endian on the machines Lamina runs on (the protocol is
//! the host's byte order; Lamina builds only for little-endian targets).
//!
//! Decoding checks every length before it reads: a request shorter than its
//! header or its body, a header whose length is not the bytes read, or a
//! write whose data is not the length it names is an error, never a panic.
//! docs/fuse.md gives each structure byte by byte.

/// The protocol's major version; the only one there is.
pub const MAJOR: u32 = 7;
/// The newest minor version this server speaks (the kernel and the server
/// settle on the lower of theirs).
pub const MINOR: u32 = 39;

/// The request header's size in bytes.
pub const IN_HEADER: usize = 40;
/// The reply header's size in bytes.
pub const OUT_HEADER: usize = 16;
/// The largest write (and read) the server accepts, in bytes: 1 MiB, what
/// `max_write` and `max_pages` (256 pages) tell the kernel.
pub const MAX_IO: u32 = 1 << 20;
/// The buffer one read of `/dev/fuse` needs: the largest write with its
/// headers, rounded up to a page.
pub const READ_BUFFER: usize = MAX_IO as usize + 4096;

/// Opcodes (`enum fuse_opcode`).
pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const LSEEK: u32 = 46;
}

/// INIT flags (`FUSE_*` of `fuse_init_in.flags`) the server asks for.
pub mod init {
    /// Reads may be sent in parallel.
    pub const ASYNC_READ: u32 = 1 << 0;
    /// Writes larger than a page.
    pub const BIG_WRITES: u32 = 1 << 5;
    /// Asynchronous direct I/O: an `io_submit` of many requests is many
    /// requests in flight, not one after another.
    pub const ASYNC_DIO: u32 = 1 << 15;
    /// `max_pages` in the reply is read.
    pub const MAX_PAGES: u32 = 1 << 22;
    /// What the server asks for; the reply carries its intersection with the
    /// kernel's offer.
    pub const WANTED: u32 = ASYNC_READ | BIG_WRITES | ASYNC_DIO | MAX_PAGES;
}

/// `fuse_open_out.open_flags`.
pub mod fopen {
    /// Bypass the page cache: every read and write reaches the server.
    pub const DIRECT_IO: u32 = 1 << 0;
    /// Direct writes to the file may run in parallel (the kernel does not
    /// take the inode lock for them).
    pub const PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
}

/// `fuse_setattr_in.valid`: the size is to be set.
pub const FATTR_SIZE: u32 = 1 << 3;

/// `fallocate(2)` modes the server understands.
pub mod falloc {
    pub const KEEP_SIZE: u32 = 0x01;
    pub const PUNCH_HOLE: u32 = 0x02;
    pub const ZERO_RANGE: u32 = 0x10;
}

/// `lseek(2)` whences that reach the server (the kernel answers the others).
pub const SEEK_DATA: u32 = 3;
pub const SEEK_HOLE: u32 = 4;

/// Why a request could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("{got} bytes is shorter than a request header ({IN_HEADER})")]
    ShortHeader { got: usize },
    #[error("the header says {said} bytes but {got} were read")]
    Length { said: u32, got: usize },
    #[error("opcode {opcode}: body of {got} bytes, at least {need} needed")]
    ShortBody {
        opcode: u32,
        got: usize,
        need: usize,
    },
    #[error("write of {size} bytes carries {got} bytes of data")]
    WriteData { size: u32, got: usize },
    #[error("{what} of {size} bytes is over the {MAX_IO}-byte limit")]
    TooLarge { what: &'static str, size: u32 },
}

/// `fuse_in_header`, less the fields the server does not use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// A decoded request: the header and what the server needs of its body.
#[derive(Debug, PartialEq, Eq)]
pub enum Request<'a> {
    Init {
        major: u32,
        minor: u32,
        max_readahead: u32,
        flags: u32,
    },
    GetAttr,
    SetAttr {
        valid: u32,
        size: u64,
    },
    Open {
        flags: u32,
    },
    Read {
        offset: u64,
        size: u32,
    },
    Write {
        offset: u64,
        data: &'a [u8],
    },
    Fsync,
    Flush,
    Release,
    StatFs,
    Fallocate {
        offset: u64,
        length: u64,
        mode: u32,
    },
    Lseek {
        offset: u64,
        whence: u32,
    },
    /// FORGET, BATCH_FORGET and INTERRUPT: no reply is sent.
    NoReply,
    Destroy,
    /// Any other opcode: answered ENOSYS.
    Other(u32),
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Decode one request as read from `/dev/fuse` (`buf` is exactly the bytes
/// one read returned).
pub fn decode(buf: &[u8]) -> Result<(Header, Request<'_>), DecodeError> {
    if buf.len() < IN_HEADER {
        return Err(DecodeError::ShortHeader { got: buf.len() });
    }
    let h = Header {
        len: u32_at(buf, 0),
        opcode: u32_at(buf, 4),
        unique: u64_at(buf, 8),
        nodeid: u64_at(buf, 16),
        uid: u32_at(buf, 24),
        gid: u32_at(buf, 28),
        pid: u32_at(buf, 32),
    };
    // total_extlen (u16 at 36, in units of 8 bytes) counts extensions after
    // the body; the server asks for none, so they are only skipped.
    let _ext = u16_at(buf, 36);
    if h.len as usize != buf.len() {
        return Err(DecodeError::Length {
            said: h.len,
            got: buf.len(),
        });
    }
    let body = &buf[IN_HEADER..];
    let need = |n: usize| {
        if body.len() < n {
            Err(DecodeError::ShortBody {
                opcode: h.opcode,
                got: body.len(),
                need: n,
            })
        } else {
            Ok(())
        }
    };
    let r = match h.opcode {
        op::INIT => {
            need(16)?;
            Request::Init {
                major: u32_at(body, 0),
                minor: u32_at(body, 4),
                max_readahead: u32_at(body, 8),
                flags: u32_at(body, 12),
            }
        }
        op::GETATTR => Request::GetAttr,
        op::SETATTR => {
            need(88)?;
            Request::SetAttr {
                valid: u32_at(body, 0),
                size: u64_at(body, 16),
            }
        }
        op::OPEN => {
            need(8)?;
            Request::Open {
                flags: u32_at(body, 0),
            }
        }
        op::READ => {
            need(40)?;
            let size = u32_at(body, 16);
            if size > MAX_IO {
                return Err(DecodeError::TooLarge { what: "read", size });
            }
            Request::Read {
                offset: u64_at(body, 8),
                size,
            }
        }
        op::WRITE => {
            need(40)?;
            let size = u32_at(body, 16);
            if size > MAX_IO {
                return Err(DecodeError::TooLarge {
                    what: "write",
                    size,
                });
            }
            let data = &body[40..];
            if data.len() < size as usize {
                return Err(DecodeError::WriteData {
                    size,
                    got: data.len(),
                });
            }
            Request::Write {
                offset: u64_at(body, 8),
                data: &data[..size as usize],
            }
        }
        op::FSYNC => {
            need(16)?;
            Request::Fsync
        }
        op::FLUSH => {
            need(24)?;
            Request::Flush
        }
        op::RELEASE => {
            need(24)?;
            Request::Release
        }
        op::STATFS => Request::StatFs,
        op::FALLOCATE => {
            need(32)?;
            Request::Fallocate {
                offset: u64_at(body, 8),
                length: u64_at(body, 16),
                mode: u32_at(body, 24),
            }
        }
        op::LSEEK => {
            need(24)?;
            Request::Lseek {
                offset: u64_at(body, 8),
                whence: u32_at(body, 16),
            }
        }
        op::FORGET | op::BATCH_FORGET | op::INTERRUPT => Request::NoReply,
        op::DESTROY => Request::Destroy,
        other => Request::Other(other),
    };
    Ok((h, r))
}

/// A reply header: `len` is the whole reply's length, `error` 0 or a
/// negated errno.
pub fn out_header(unique: u64, error: i32, payload: usize) -> [u8; OUT_HEADER] {
    let mut h = [0u8; OUT_HEADER];
    h[0..4].copy_from_slice(&((OUT_HEADER + payload) as u32).to_le_bytes());
    h[4..8].copy_from_slice(&error.to_le_bytes());
    h[8..16].copy_from_slice(&unique.to_le_bytes());
    h
}

/// What the server settles on in its INIT reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitOut {
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub max_background: u16,
    pub congestion_threshold: u16,
}

impl InitOut {
    /// `fuse_init_out`: 64 bytes.
    pub fn encode(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[0..4].copy_from_slice(&MAJOR.to_le_bytes());
        b[4..8].copy_from_slice(&self.minor.to_le_bytes());
        b[8..12].copy_from_slice(&self.max_readahead.to_le_bytes());
        b[12..16].copy_from_slice(&self.flags.to_le_bytes());
        b[16..18].copy_from_slice(&self.max_background.to_le_bytes());
        b[18..20].copy_from_slice(&self.congestion_threshold.to_le_bytes());
        b[20..24].copy_from_slice(&MAX_IO.to_le_bytes()); // max_write
        b[24..28].copy_from_slice(&1u32.to_le_bytes()); // time_gran: 1 ns
        b[28..30].copy_from_slice(&((MAX_IO / 4096) as u16).to_le_bytes()); // max_pages
                                                                            // map_alignment, flags2, max_stack_depth and the unused words: 0.
        b
    }
}

/// The file's attributes, as `fuse_attr_out` (104 bytes) with a validity of
/// 0: the kernel asks again at each `stat`, so a volume grown under the
/// mount shows its new size at once.
pub fn attr_out(size: u64, mode: u32, uid: u32, gid: u32) -> [u8; 104] {
    let mut b = [0u8; 104];
    // attr_valid (u64), attr_valid_nsec (u32), dummy (u32): all 0.
    let a = &mut b[16..];
    a[0..8].copy_from_slice(&1u64.to_le_bytes()); // ino
    a[8..16].copy_from_slice(&size.to_le_bytes());
    a[16..24].copy_from_slice(&size.div_ceil(512).to_le_bytes()); // blocks
                                                                  // atime, mtime, ctime and their nanoseconds: 0.
    a[60..64].copy_from_slice(&mode.to_le_bytes());
    a[64..68].copy_from_slice(&1u32.to_le_bytes()); // nlink
    a[68..72].copy_from_slice(&uid.to_le_bytes());
    a[72..76].copy_from_slice(&gid.to_le_bytes());
    // rdev: 0
    a[80..84].copy_from_slice(&4096u32.to_le_bytes()); // blksize
    b
}

/// `fuse_open_out` (16 bytes): file handle 0 and `open_flags`.
pub fn open_out(open_flags: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[8..12].copy_from_slice(&open_flags.to_le_bytes());
    b
}

/// `fuse_write_out` (8 bytes).
pub fn write_out(size: u32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0..4].copy_from_slice(&size.to_le_bytes());
    b
}

/// `fuse_lseek_out` (8 bytes).
pub fn lseek_out(offset: u64) -> [u8; 8] {
    offset.to_le_bytes()
}

/// `fuse_statfs_out` (80 bytes): the file's blocks, no free inodes.
pub fn statfs_out(size: u64) -> [u8; 80] {
    let mut b = [0u8; 80];
    let blocks = size / 4096;
    b[0..8].copy_from_slice(&blocks.to_le_bytes());
    b[40..44].copy_from_slice(&4096u32.to_le_bytes()); // bsize
    b[44..48].copy_from_slice(&255u32.to_le_bytes()); // namelen
    b[48..52].copy_from_slice(&4096u32.to_le_bytes()); // frsize
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn request(opcode: u32, unique: u64, body: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; IN_HEADER];
        b[0..4].copy_from_slice(&((IN_HEADER + body.len()) as u32).to_le_bytes());
        b[4..8].copy_from_slice(&opcode.to_le_bytes());
        b[8..16].copy_from_slice(&unique.to_le_bytes());
        b[16..24].copy_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(body);
        b
    }

    #[test]
    fn a_write_carries_exactly_the_data_it_names() {
        let mut body = vec![0u8; 40];
        body[8..16].copy_from_slice(&8192u64.to_le_bytes());
        body[16..20].copy_from_slice(&3u32.to_le_bytes());
        body.extend_from_slice(&[7, 8, 9]);
        let b = request(op::WRITE, 5, &body);
        let (h, r) = decode(&b).unwrap();
        assert_eq!((h.unique, h.nodeid), (5, 1));
        assert_eq!(
            r,
            Request::Write {
                offset: 8192,
                data: &[7, 8, 9]
            }
        );
        // Two bytes of data for a write of three.
        let short = request(op::WRITE, 5, &body[..42]);
        assert_eq!(
            decode(&short).unwrap_err(),
            DecodeError::WriteData { size: 3, got: 2 }
        );
    }

    #[test]
    fn lengths_are_checked_before_anything_is_read() {
        assert_eq!(
            decode(&[0u8; 10]).unwrap_err(),
            DecodeError::ShortHeader { got: 10 }
        );
        let mut b = request(op::READ, 1, &[0u8; 40]);
        b[0] = 0xFF;
        assert!(matches!(decode(&b), Err(DecodeError::Length { .. })));
        let b = request(op::READ, 1, &[0u8; 39]);
        assert_eq!(
            decode(&b).unwrap_err(),
            DecodeError::ShortBody {
                opcode: op::READ,
                got: 39,
                need: 40
            }
        );
        let mut body = [0u8; 40];
        body[16..20].copy_from_slice(&(MAX_IO + 1).to_le_bytes());
        assert!(matches!(
            decode(&request(op::READ, 1, &body)),
            Err(DecodeError::TooLarge { what: "read", .. })
        ));
    }

    #[test]
    fn replies_have_the_kernels_sizes_and_offsets() {
        let h = out_header(9, -5, 8);
        assert_eq!(u32_at(&h, 0), 24);
        assert_eq!(u32_at(&h, 4) as i32, -5);
        assert_eq!(u64_at(&h, 8), 9);
        let a = attr_out(1 << 30, 0o100600, 7, 8);
        assert_eq!(u64_at(&a, 0), 0, "attr_valid 0: the size is asked again");
        assert_eq!(u64_at(&a, 16 + 8), 1 << 30);
        assert_eq!(u32_at(&a, 16 + 60), 0o100600);
        assert_eq!((u32_at(&a, 16 + 68), u32_at(&a, 16 + 72)), (7, 8));
        let i = InitOut {
            minor: 39,
            max_readahead: 4096,
            flags: init::WANTED,
            max_background: 64,
            congestion_threshold: 48,
        }
        .encode();
        assert_eq!((u32_at(&i, 0), u32_at(&i, 4)), (7, 39));
        assert_eq!(u32_at(&i, 20), MAX_IO);
        assert_eq!(u16_at(&i, 28), 256);
    }

    proptest! {
        /// Any bytes at all: an error or a request, never a panic, and a
        /// write's data always lies inside the buffer.
        #[test]
        fn decode_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&b);
        }

        #[test]
        fn any_body_under_a_valid_header_decodes_or_errs(
            opcode in 0u32..60,
            body in proptest::collection::vec(any::<u8>(), 0..120),
        ) {
            let b = request(opcode, 1, &body);
            if let Ok((h, Request::Write { data, .. })) = decode(&b) {
                prop_assert!(data.len() <= body.len().saturating_sub(40));
                prop_assert_eq!(h.len as usize, b.len());
            }
        }
    }
}
