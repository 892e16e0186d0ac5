//! In-memory exports for tests and fuzzing (cargo feature `testing`): the
//! data path's in-memory volume ([`MemDevice`], from `lamina-blockio`'s
//! test scaffolding) in a registry of exports, and the bytes of a scripted
//! client handshake.

use std::sync::Arc;

pub use lamina_blockio::testing::{MemDevice, MEM_BLOCK};

use crate::device::{BlockIo, Exports};
use crate::proto::*;
use crate::{serve_connection, NbdError, ServerOptions};

/// A fixed set of named devices.
#[derive(Default)]
pub struct MemExports {
    entries: Vec<(String, String, Arc<dyn BlockIo>)>,
}

impl MemExports {
    /// No exports.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an export.
    pub fn with(mut self, name: &str, description: &str, device: Arc<dyn BlockIo>) -> Self {
        self.entries
            .push((name.to_string(), description.to_string(), device));
        self
    }
}

impl Exports for MemExports {
    fn lookup(&self, name: &str) -> Option<Arc<dyn BlockIo>> {
        self.entries
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, _, d)| d.clone())
    }

    fn list(&self) -> Vec<(String, String)> {
        self.entries
            .iter()
            .map(|(n, d, _)| (n.clone(), d.clone()))
            .collect()
    }
}

/// Appends one client option to `out`.
pub fn client_option(out: &mut Vec<u8>, option: u32, data: &[u8]) {
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// What a client sends to reach transmission on `export` in one go: flags
/// with NO_ZEROES, then either NBD_OPT_STRUCTURED_REPLY,
/// NBD_OPT_SET_META_CONTEXT `base:allocation` and NBD_OPT_GO (`structured`),
/// or a bare NBD_OPT_EXPORT_NAME like the Linux kernel's client.
pub fn client_handshake(export: &str, structured: bool) -> Vec<u8> {
    let mut out = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    let name_len = (export.len() as u32).to_be_bytes();
    if structured {
        client_option(&mut out, OPT_STRUCTURED_REPLY, &[]);
        let q = BASE_ALLOCATION.as_bytes();
        let meta = [
            &name_len,
            export.as_bytes(),
            &1u32.to_be_bytes(),
            &(q.len() as u32).to_be_bytes(),
            q,
        ]
        .concat();
        client_option(&mut out, OPT_SET_META_CONTEXT, &meta);
        let go = [&name_len, export.as_bytes(), &0u16.to_be_bytes()].concat();
        client_option(&mut out, OPT_GO, &go);
    } else {
        client_option(&mut out, OPT_EXPORT_NAME, export.as_bytes());
    }
    out
}

/// Runs one whole connection with `input` as everything the client sends
/// (then end of stream) and returns what the server sent and how the
/// connection ended. Uses one current-thread runtime per calling thread,
/// kept between calls. For fuzzing and property tests.
pub fn run_script(
    exports: Arc<dyn Exports>,
    opts: &ServerOptions,
    input: &[u8],
) -> (Vec<u8>, Result<(), NbdError>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    thread_local! {
        static RUNTIME: Option<tokio::runtime::Runtime> =
            tokio::runtime::Builder::new_current_thread().enable_all().build().ok();
    }
    RUNTIME.with(|rt| {
        let Some(rt) = rt else {
            return (
                Vec::new(),
                Err(NbdError::Io(std::io::Error::other("no runtime"))),
            );
        };
        rt.block_on(async {
            let (client, server) = tokio::io::duplex(64 * 1024);
            let (mut r, mut w) = tokio::io::split(client);
            let input = input.to_vec();
            let feeder = tokio::spawn(async move {
                // The server may hang up early; that is its right.
                let _ = w.write_all(&input).await;
                let _ = w.shutdown().await;
            });
            let drain = tokio::spawn(async move {
                let mut out = Vec::new();
                let _ = r.read_to_end(&mut out).await;
                out
            });
            let result = serve_connection(server, exports, opts).await;
            feeder.abort();
            // Let both tasks finish so that nothing of this connection
            // outlives the call.
            let _ = feeder.await;
            let out = drain.await.unwrap_or_default();
            (out, result)
        })
    })
}
