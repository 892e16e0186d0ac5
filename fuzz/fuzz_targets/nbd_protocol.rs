//! Fuzz a whole NBD connection: the input is everything a client sends.
//! The first byte picks a canned valid handshake to put in front of the
//! rest (none, structured replies with base:allocation, the old-style
//! export name, or the default export), so the fuzzer reaches the
//! transmission phase quickly, and whether the rest is raw bytes or a list
//! of 8-byte request descriptions encoded into well-formed requests.
//! Errors and early hang-ups are expected; panics and hangs are bugs, and
//! with structured replies the server's output must be a well-formed reply
//! stream.
#![no_main]

use std::sync::{Arc, OnceLock};

use lamina_nbd::mem::{client_handshake, run_script, MemDevice, MemExports};
use lamina_nbd::proto::Request;
use lamina_nbd::{Exports, ServerOptions};
use libfuzzer_sys::fuzz_target;

fn exports() -> Arc<dyn Exports> {
    static EXPORTS: OnceLock<Arc<dyn Exports>> = OnceLock::new();
    EXPORTS
        .get_or_init(|| {
            let disk = Arc::new(MemDevice::new(256 * 1024).failing(200_000, 200_001));
            disk.load(0, &[0x5a; 8192]);
            let e = MemExports::new()
                .with("disk", "fuzz disk", disk)
                .with("ro", "", Arc::new(MemDevice::new(64 * 1024).read_only()))
                .with(
                    "",
                    "default",
                    Arc::new(MemDevice::new(4096).without_native_zeroes()),
                );
            Arc::new(e)
        })
        .clone()
}

fn opts() -> ServerOptions {
    // Few slots keep the number of blocking threads (and ASan's memory) low
    // and exercise the waits for slots and buffer budget.
    ServerOptions {
        max_payload: 64 * 1024,
        max_in_flight: 4,
        max_buffer_bytes: 128 * 1024,
        ..ServerOptions::default()
    }
}

fn prefix(mode: u8) -> Vec<u8> {
    match mode % 4 {
        0 => Vec::new(),
        1 => client_handshake("disk", true),
        2 => client_handshake("disk", false),
        _ => client_handshake("", true),
    }
}

/// What the server answers to the canned handshake of a structured mode.
fn reference(mode: u8) -> &'static [u8] {
    static REFS: [OnceLock<Vec<u8>>; 4] = [
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
    ];
    REFS[usize::from(mode % 4)].get_or_init(|| run_script(exports(), &opts(), &prefix(mode)).0)
}

/// With structured replies every message is self-delimiting: simple
/// replies carry no data, chunks say how long they are.
fn check_structured_stream(mut out: &[u8]) {
    while !out.is_empty() {
        assert!(out.len() >= 16, "truncated reply: {out:?}");
        match u32::from_be_bytes([out[0], out[1], out[2], out[3]]) {
            0x6744_6698 => out = &out[16..],
            0x668e_33ef => {
                assert!(out.len() >= 20, "truncated chunk header: {out:?}");
                let len = u32::from_be_bytes([out[16], out[17], out[18], out[19]]) as usize;
                assert!(out.len() >= 20 + len, "chunk longer than the stream");
                out = &out[20 + len..];
            }
            m => panic!("bad reply magic {m:#x}"),
        }
    }
}

/// Requests from 8-byte descriptions: kind, flags, cookie, offset (2 bytes,
/// in 512-byte units, top value meaning "near u64::MAX"), length (2 bytes),
/// and a byte whose low bits cut a WRITE payload short or spoil the magic.
fn requests(rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for d in rest.chunks_exact(8) {
        let offset = match u16::from_be_bytes([d[3], d[4]]) {
            0xffff => u64::MAX - 511,
            o => u64::from(o) * 512,
        };
        let req = Request {
            kind: u16::from(d[0] % 10),
            flags: u16::from(d[1] & 0x3f),
            cookie: u64::from(d[2]),
            offset,
            length: u32::from(u16::from_be_bytes([d[5], d[6]])),
        };
        let mut b = req.encode();
        if d[7] & 0x80 != 0 {
            b[0] ^= 1;
        }
        out.extend_from_slice(&b);
        if req.kind == 1 {
            let n = if d[7] & 0x40 != 0 {
                req.length as usize / 2
            } else {
                req.length as usize
            };
            out.extend((0..n).map(|i| i as u8 ^ d[7]));
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut input = prefix(mode);
    if mode & 4 != 0 {
        input.extend_from_slice(&requests(rest));
    } else {
        input.extend_from_slice(rest);
    }
    let (out, _result) = run_script(exports(), &opts(), &input);
    // The greeting always goes out first.
    assert!(
        out.len() >= 18 && &out[..8] == b"NBDMAGIC",
        "no greeting: {out:?}"
    );
    if mode % 4 == 1 || mode % 4 == 3 {
        let r = reference(mode);
        assert!(out.starts_with(r), "handshake answered differently");
        check_structured_stream(&out[r.len()..]);
    }
});
