//! A minimal blocking NBD client (fixed newstyle, `NBD_OPT_GO`, simple
//! replies, one request at a time) over the daemon's unix socket, for a
//! test that must order writes across several exports: write to one,
//! wait for its reply, then write to the next. Neither qemu-io (one image
//! per process) nor fio (no order between jobs) can, and libnbd's Python
//! binding is not packaged with libnbd-bin. The protocol's numbers are
//! the NBD specification's (docs/nbd.md).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const FLAG_FIXED_NEWSTYLE: u32 = 1;
const FLAG_NO_ZEROES: u32 = 2;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;

/// One connection to an export, in its transmission phase.
pub struct NbdClient {
    s: UnixStream,
    cookie: u64,
}

impl NbdClient {
    /// Connect to a `nbd+unix:///EXPORT?socket=PATH` URI, as `lamina ...
    /// attach` prints.
    pub fn connect(uri: &str) -> NbdClient {
        let rest = uri
            .strip_prefix("nbd+unix:///")
            .unwrap_or_else(|| panic!("not an nbd+unix URI: {uri}"));
        let (export, socket) = rest
            .split_once("?socket=")
            .unwrap_or_else(|| panic!("no socket in {uri}"));
        let mut s = UnixStream::connect(socket).unwrap_or_else(|e| panic!("{socket}: {e}"));
        assert_eq!(u64_of(&mut s), NBDMAGIC, "{uri}: not an NBD server");
        assert_eq!(u64_of(&mut s), IHAVEOPT, "{uri}: not newstyle");
        let mut flags = [0u8; 2];
        s.read_exact(&mut flags).unwrap();
        s.write_all(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes())
            .unwrap();
        let mut go = Vec::new();
        go.extend_from_slice(&IHAVEOPT.to_be_bytes());
        go.extend_from_slice(&OPT_GO.to_be_bytes());
        go.extend_from_slice(&(4 + export.len() as u32 + 2).to_be_bytes());
        go.extend_from_slice(&(export.len() as u32).to_be_bytes());
        go.extend_from_slice(export.as_bytes());
        go.extend_from_slice(&0u16.to_be_bytes());
        s.write_all(&go).unwrap();
        loop {
            assert_eq!(u64_of(&mut s), REPLY_MAGIC, "{uri}: bad option reply");
            let (_option, kind, len) = (u32_of(&mut s), u32_of(&mut s), u32_of(&mut s));
            let mut data = vec![0; len as usize];
            s.read_exact(&mut data).unwrap();
            match kind {
                REP_ACK => break,
                REP_INFO => {}
                _ => panic!(
                    "{uri}: NBD_OPT_GO refused ({kind:#x}): {}",
                    String::from_utf8_lossy(&data)
                ),
            }
        }
        NbdClient { s, cookie: 0 }
    }

    fn request(&mut self, kind: u16, offset: u64, len: u32, data: &[u8]) -> std::io::Result<()> {
        self.cookie += 1;
        let mut r = Vec::with_capacity(28 + data.len());
        r.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        r.extend_from_slice(&0u16.to_be_bytes());
        r.extend_from_slice(&kind.to_be_bytes());
        r.extend_from_slice(&self.cookie.to_be_bytes());
        r.extend_from_slice(&offset.to_be_bytes());
        r.extend_from_slice(&len.to_be_bytes());
        r.extend_from_slice(data);
        self.s.write_all(&r)
    }

    /// The simple reply to the last request; panics on an error.
    fn reply(&mut self, what: &str) {
        assert_eq!(u32_of(&mut self.s), SIMPLE_REPLY_MAGIC, "{what}: bad reply");
        let error = u32_of(&mut self.s);
        assert_eq!(u64_of(&mut self.s), self.cookie, "{what}: another cookie");
        assert_eq!(error, 0, "{what} failed: errno {error}");
    }

    /// Write `data` at `offset`, and wait for its reply.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        self.request(CMD_WRITE, offset, data.len() as u32, data)
            .unwrap();
        self.reply("write");
    }

    /// Read `len` bytes at `offset`.
    pub fn read(&mut self, offset: u64, len: u32) -> Vec<u8> {
        self.request(CMD_READ, offset, len, &[]).unwrap();
        self.reply("read");
        let mut buf = vec![0; len as usize];
        self.s.read_exact(&mut buf).unwrap();
        buf
    }
}

impl Drop for NbdClient {
    fn drop(&mut self) {
        let _ = self.request(CMD_DISC, 0, 0, &[]);
    }
}

fn u64_of(s: &mut UnixStream) -> u64 {
    let mut b = [0u8; 8];
    s.read_exact(&mut b).unwrap();
    u64::from_be_bytes(b)
}

fn u32_of(s: &mut UnixStream) -> u32 {
    let mut b = [0u8; 4];
    s.read_exact(&mut b).unwrap();
    u32::from_be_bytes(b)
}
