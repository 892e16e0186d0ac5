//! A minimal NBD client for the suite's own timings: the first read of a
//! new clone, without a client process's start-up in the figure. Written
//! here because the clients on the machine are programs (qemu-io, nbdinfo)
//! and libnbd's Rust bindings need its C library at build time; a blocking
//! client of two messages (NBD_OPT_GO, then simple requests) is short.

use anyhow::{bail, ensure, Context, Result};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

/// A minimal blocking NBD client over a unix socket (fixed newstyle
/// handshake with NBD_OPT_GO, simple replies): enough to time a first read
/// and to write a few blocks.
pub struct Nbd {
    s: UnixStream,
    pub size: u64,
    cookie: u64,
}

const NBD_MAGIC: &[u8; 8] = b"NBDMAGIC";
const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const INFO_EXPORT: u16 = 0;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;

fn be_u16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be_u64(b: &[u8]) -> u64 {
    u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

impl Nbd {
    /// Connect to `nbd+unix:///EXPORT?socket=PATH`.
    pub fn connect(uri: &str) -> Result<Nbd> {
        let rest = uri
            .strip_prefix("nbd+unix:///")
            .with_context(|| format!("not an nbd+unix URI: {uri}"))?;
        let (export, query) = rest
            .split_once('?')
            .with_context(|| format!("no socket in {uri}"))?;
        let sock = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("socket="))
            .with_context(|| format!("no socket in {uri}"))?;
        let s = UnixStream::connect(sock).with_context(|| format!("connecting to {sock}"))?;
        Nbd::handshake(s, export)
    }

    /// The handshake on a connected socket, onto `export`.
    pub fn handshake(mut s: UnixStream, export: &str) -> Result<Nbd> {
        let mut g = [0u8; 18];
        s.read_exact(&mut g).context("reading the NBD greeting")?;
        ensure!(
            &g[..8] == NBD_MAGIC && be_u64(&g[8..16]) == IHAVEOPT,
            "not a newstyle NBD server"
        );
        let server_flags = be_u16(&g[16..18]);
        ensure!(
            server_flags & 1 == 1,
            "the NBD server is not fixed newstyle"
        );
        // Fixed newstyle, and no zeroes if the server offers to skip them.
        let client_flags = 1 | u32::from(server_flags & 2);
        let name = export.as_bytes();
        let mut b = Vec::with_capacity(32 + name.len());
        b.extend(client_flags.to_be_bytes());
        b.extend(IHAVEOPT.to_be_bytes());
        b.extend(OPT_GO.to_be_bytes());
        b.extend((4 + name.len() as u32 + 2).to_be_bytes());
        b.extend((name.len() as u32).to_be_bytes());
        b.extend(name);
        b.extend(0u16.to_be_bytes());
        s.write_all(&b)?;
        let mut size = None;
        loop {
            let mut h = [0u8; 20];
            s.read_exact(&mut h)
                .context("reading an NBD option reply")?;
            ensure!(be_u64(&h[..8]) == OPT_REPLY_MAGIC, "bad NBD option reply");
            let kind = be_u32(&h[12..16]);
            let mut d = vec![0u8; be_u32(&h[16..20]) as usize];
            s.read_exact(&mut d)?;
            match kind {
                REP_ACK => break,
                REP_INFO if d.len() >= 10 && be_u16(&d) == INFO_EXPORT => {
                    size = Some(be_u64(&d[2..10]));
                }
                k if k & 0x8000_0000 != 0 => bail!(
                    "the NBD server refused export {export:?} ({k:#x}): {}",
                    String::from_utf8_lossy(&d)
                ),
                _ => {}
            }
        }
        Ok(Nbd {
            s,
            size: size.context("the NBD server gave no export size")?,
            cookie: 0,
        })
    }

    /// Send one request and read its reply's header.
    fn request(&mut self, kind: u16, offset: u64, len: u32, payload: &[u8]) -> Result<()> {
        self.cookie += 1;
        let mut b = Vec::with_capacity(28 + payload.len());
        b.extend(REQUEST_MAGIC.to_be_bytes());
        b.extend(0u16.to_be_bytes());
        b.extend(kind.to_be_bytes());
        b.extend(self.cookie.to_be_bytes());
        b.extend(offset.to_be_bytes());
        b.extend(len.to_be_bytes());
        b.extend(payload);
        self.s.write_all(&b)?;
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h).context("reading an NBD reply")?;
        ensure!(
            be_u32(&h[..4]) == SIMPLE_REPLY_MAGIC && be_u64(&h[8..16]) == self.cookie,
            "bad NBD reply"
        );
        let err = be_u32(&h[4..8]);
        ensure!(
            err == 0,
            "NBD request {kind} at {offset} failed: error {err}"
        );
        Ok(())
    }

    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.request(CMD_READ, offset, buf.len() as u32, &[])?;
        self.s.read_exact(buf).context("reading NBD data")?;
        Ok(())
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.request(CMD_WRITE, offset, data.len() as u32, data)
    }
}

impl Drop for Nbd {
    fn drop(&mut self) {
        let mut b = Vec::with_capacity(28);
        b.extend(REQUEST_MAGIC.to_be_bytes());
        b.extend(0u16.to_be_bytes());
        b.extend(CMD_DISC.to_be_bytes());
        b.extend(0u64.to_be_bytes());
        b.extend(0u64.to_be_bytes());
        b.extend(0u32.to_be_bytes());
        let _ = self.s.write_all(&b);
    }
}
