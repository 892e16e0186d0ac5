//! Fuzz the on-disk metadata decoders: superblock, records, page checks.
#![no_main]

use lamina_engine::format::{self, Record, Superblock, BLOCK};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut p = format::new_page();
    let n = data.len().min(BLOCK);
    p[..n].copy_from_slice(&data[..n]);
    let _ = Superblock::decode(&p);
    let _ = Record::decode(&p, 7);
    for m in [format::MAGIC_NODE, format::MAGIC_RC, format::MAGIC_RECORD] {
        let _ = format::verify(&p, 7, m);
    }
    // Past the checksum: garbage under a valid seal must decode to an error.
    format::put_u32(&mut p[..], 0, format::MAGIC_RECORD);
    format::seal(&mut p, 7, 1);
    if let Ok(r) = Record::decode(&p, 7) {
        let mut q = format::new_page();
        if r.encode(&mut q).is_ok() {
            format::seal(&mut q, 7, 1);
            assert_eq!(Record::decode(&q, 7).unwrap(), r, "re-encoding must round-trip");
        }
    }
    format::put_u32(&mut p[..], 0, format::MAGIC_SUPER);
    p[format::HEADER..format::HEADER + 8].copy_from_slice(b"LAMINA\0\0");
    format::seal(&mut p, 0, 1);
    let _ = Superblock::decode(&p);
});
