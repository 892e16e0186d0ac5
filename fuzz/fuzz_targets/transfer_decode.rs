//! Fuzz the transfer protocol's frame decoder: any bytes decode to frames
//! or an error, never a panic; a frame that decodes encodes to the same
//! bytes. The input is read twice: as a raw stream of frames, and as one
//! body under a valid header and checksum (so the body parsers are reached
//! without the fuzzer having to forge a CRC-32C).
#![no_main]

use lamina_transfer::wire::{check_header, decode, encode, HEADER};
use libfuzzer_sys::fuzz_target;

fn round_trip(frame_bytes: &[u8]) {
    if let Ok(Some((f, n))) = decode(frame_bytes) {
        let mut again = Vec::new();
        encode(&f, &mut again);
        assert_eq!(&again[..], &frame_bytes[..n], "re-encoding must round-trip");
    }
}

fuzz_target!(|data: &[u8]| {
    // A stream: decode frame after frame as a reader would.
    let mut rest = data;
    while let Ok(Some((_, n))) = decode(rest) {
        round_trip(rest);
        rest = &rest[n..];
    }
    if let Some(h) = rest.get(..HEADER) {
        let _ = check_header(h.try_into().unwrap());
    }
    // One body: the first byte picks the kind, the rest is the body.
    if let Some((&kind, body)) = data.split_first() {
        let mut buf = vec![kind % 15, 0, 0, 0];
        buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
        buf.extend_from_slice(body);
        let sum = crc32c::crc32c(&buf);
        buf.extend_from_slice(&sum.to_be_bytes());
        let _ = decode(&buf);
        round_trip(&buf);
    }
});
