//! A tiny NBD client over `tokio::io::duplex` for the unit tests.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};
use tokio::task::JoinHandle;

use crate::mem::{client_option, MemDevice, MemExports};
use crate::proto::*;
use crate::{serve_connection, Exports, NbdError, ServerOptions};

/// The device size the unit tests use.
pub const SIZE: usize = 1 << 20;

/// One option reply.
#[derive(Debug)]
pub struct OptReply {
    pub option: u32,
    pub kind: u32,
    pub data: Vec<u8>,
}

/// One structured reply chunk.
#[derive(Debug)]
pub struct Chunk {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub payload: Vec<u8>,
}

impl Chunk {
    /// The error code of an error chunk.
    pub fn errno(&self) -> u32 {
        u32::from_be_bytes(self.payload[0..4].try_into().unwrap())
    }
}

pub struct Client {
    pub r: ReadHalf<DuplexStream>,
    pub w: WriteHalf<DuplexStream>,
    pub server: JoinHandle<Result<(), NbdError>>,
}

/// Exports "disk" (writable, with a pattern in its first 64 KiB), "ro"
/// (read-only) and "slow-zero" (no native zeroing), plus the devices.
pub fn exports() -> (
    Arc<MemExports>,
    Arc<MemDevice>,
    Arc<MemDevice>,
    Arc<MemDevice>,
) {
    let disk = Arc::new(MemDevice::new(SIZE).failing(SIZE as u64 - 4096, SIZE as u64 - 4095));
    disk.load(0, &(0..65536u32).map(|i| i as u8).collect::<Vec<_>>());
    let ro = Arc::new(MemDevice::new(SIZE).read_only());
    let nz = Arc::new(MemDevice::new(SIZE).without_native_zeroes());
    let e = MemExports::new()
        .with("disk", "a test disk", disk.clone())
        .with("ro", "", ro.clone())
        .with("slow-zero", "", nz.clone());
    (Arc::new(e), disk, ro, nz)
}

impl Client {
    /// Starts a server on a duplex pipe and reads its greeting.
    pub async fn start(exports: Arc<dyn Exports>, opts: ServerOptions) -> Client {
        let (client, server) = tokio::io::duplex(1 << 20);
        let server = tokio::spawn(async move { serve_connection(server, exports, &opts).await });
        let (r, w) = tokio::io::split(client);
        let mut c = Client { r, w, server };
        let mut greeting = [0u8; 18];
        c.r.read_exact(&mut greeting).await.unwrap();
        assert_eq!(&greeting[0..8], b"NBDMAGIC");
        assert_eq!(&greeting[8..16], b"IHAVEOPT");
        assert_eq!(&greeting[16..18], &[0, 3]);
        c
    }

    /// Starts a server and sends the client flags.
    pub async fn with_flags(flags: u32) -> Client {
        let mut c = Client::start(exports().0, ServerOptions::default()).await;
        c.send(&flags.to_be_bytes()).await;
        c
    }

    pub async fn send(&mut self, b: &[u8]) {
        self.w.write_all(b).await.unwrap();
    }

    /// Sends an option and collects replies up to the final one.
    pub async fn option(&mut self, option: u32, data: &[u8]) -> Vec<OptReply> {
        let mut b = Vec::new();
        client_option(&mut b, option, data);
        self.send(&b).await;
        let mut out = Vec::new();
        loop {
            let r = self.opt_reply().await;
            let last = !matches!(r.kind, REP_SERVER | REP_INFO | REP_META_CONTEXT);
            out.push(r);
            if last {
                return out;
            }
        }
    }

    pub async fn opt_reply(&mut self) -> OptReply {
        let mut h = [0u8; 20];
        self.r.read_exact(&mut h).await.unwrap();
        assert_eq!(&h[0..8], &OPTION_REPLY_MAGIC.to_be_bytes());
        let option = u32::from_be_bytes(h[8..12].try_into().unwrap());
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
        let mut data = vec![0; len as usize];
        self.r.read_exact(&mut data).await.unwrap();
        OptReply { option, kind, data }
    }

    /// Full structured handshake onto `export` (with base:allocation).
    pub async fn structured(export: &str) -> Client {
        let mut c = Client::with_flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).await;
        assert_eq!(c.option(OPT_STRUCTURED_REPLY, &[]).await[0].kind, REP_ACK);
        let r = c
            .option(
                OPT_SET_META_CONTEXT,
                &meta_request(export, &[BASE_ALLOCATION]),
            )
            .await;
        assert_eq!(r.last().unwrap().kind, REP_ACK);
        let r = c.option(OPT_GO, &info_request(export, &[])).await;
        assert_eq!(r.last().unwrap().kind, REP_ACK, "{r:?}");
        c
    }

    /// Sends the scripted handshake of [`crate::mem::client_handshake`]
    /// (structured) and skips its replies up to NBD_OPT_GO's ACK.
    pub async fn scripted(exports: Arc<dyn Exports>, opts: ServerOptions, export: &str) -> Client {
        let mut c = Client::start(exports, opts).await;
        c.send(&crate::mem::client_handshake(export, true)).await;
        loop {
            let r = c.opt_reply().await;
            assert!(
                matches!(r.kind, REP_ACK | REP_INFO | REP_META_CONTEXT),
                "{r:?}"
            );
            if r.option == OPT_GO && r.kind == REP_ACK {
                return c;
            }
        }
    }

    /// Old-style entry onto `export` with simple replies.
    pub async fn simple(export: &str) -> Client {
        let mut c = Client::with_flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).await;
        let mut b = Vec::new();
        client_option(&mut b, OPT_EXPORT_NAME, export.as_bytes());
        c.send(&b).await;
        let mut h = [0u8; 10];
        c.r.read_exact(&mut h).await.unwrap();
        assert_eq!(u64::from_be_bytes(h[0..8].try_into().unwrap()), SIZE as u64);
        c
    }

    pub async fn request(&mut self, kind: u16, flags: u16, cookie: u64, offset: u64, length: u32) {
        let r = Request {
            flags,
            kind,
            cookie,
            offset,
            length,
        };
        self.send(&r.encode()).await;
    }

    /// A simple reply: (error, cookie), then `data` bytes if error is 0.
    pub async fn simple_reply(&mut self, data: usize) -> (u32, u64, Vec<u8>) {
        let mut h = [0u8; 16];
        self.r.read_exact(&mut h).await.unwrap();
        assert_eq!(&h[0..4], &SIMPLE_REPLY_MAGIC.to_be_bytes());
        let err = u32::from_be_bytes(h[4..8].try_into().unwrap());
        let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
        let mut d = vec![0; if err == 0 { data } else { 0 }];
        self.r.read_exact(&mut d).await.unwrap();
        (err, cookie, d)
    }

    /// One structured chunk (or a simple reply, returned as kind 0xffff
    /// with the error in the payload).
    pub async fn chunk(&mut self) -> Chunk {
        let mut m = [0u8; 4];
        self.r.read_exact(&mut m).await.unwrap();
        let magic = u32::from_be_bytes(m);
        if magic == SIMPLE_REPLY_MAGIC {
            let mut h = [0u8; 12];
            self.r.read_exact(&mut h).await.unwrap();
            let cookie = u64::from_be_bytes(h[4..12].try_into().unwrap());
            return Chunk {
                flags: REPLY_FLAG_DONE,
                kind: 0xffff,
                cookie,
                payload: h[0..4].to_vec(),
            };
        }
        assert_eq!(magic, STRUCTURED_REPLY_MAGIC);
        let mut h = [0u8; 16];
        self.r.read_exact(&mut h).await.unwrap();
        let flags = u16::from_be_bytes(h[0..2].try_into().unwrap());
        let kind = u16::from_be_bytes(h[2..4].try_into().unwrap());
        let cookie = u64::from_be_bytes(h[4..12].try_into().unwrap());
        let len = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let mut payload = vec![0; len as usize];
        self.r.read_exact(&mut payload).await.unwrap();
        Chunk {
            flags,
            kind,
            cookie,
            payload,
        }
    }

    /// Expects the server to close its side; returns how it ended.
    pub async fn closed(mut self) -> Result<(), NbdError> {
        let mut rest = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(10), self.r.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "server did not close");
        assert!(rest.is_empty(), "unexpected trailing bytes {rest:?}");
        tokio::time::timeout(Duration::from_secs(10), self.server)
            .await
            .expect("server task hung")
            .unwrap()
    }
}

/// NBD_OPT_INFO / NBD_OPT_GO data.
pub fn info_request(export: &str, infos: &[u16]) -> Vec<u8> {
    let mut b = (export.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(export.as_bytes());
    b.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        b.extend_from_slice(&i.to_be_bytes());
    }
    b
}

/// NBD_OPT_{LIST,SET}_META_CONTEXT data.
pub fn meta_request(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut b = (export.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(export.as_bytes());
    b.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        b.extend_from_slice(&(q.len() as u32).to_be_bytes());
        b.extend_from_slice(q.as_bytes());
    }
    b
}
