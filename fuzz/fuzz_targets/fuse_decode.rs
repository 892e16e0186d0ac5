//! The FUSE server's request decoder on arbitrary bytes: an error or a
//! request, never a panic; a decoded write's data lies inside the input and
//! is exactly the size its header names.
#![no_main]

use lamina_fuse::proto::{decode, Request, IN_HEADER, MAX_IO};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // As the kernel sends them: the header's length is the bytes read.
    let mut fixed = data.to_vec();
    if fixed.len() >= IN_HEADER {
        let n = fixed.len() as u32;
        fixed[0..4].copy_from_slice(&n.to_le_bytes());
    }
    for buf in [data, &fixed[..]] {
        if let Ok((h, r)) = decode(buf) {
            assert_eq!(h.len as usize, buf.len());
            match r {
                Request::Write { data: d, .. } => {
                    assert!(d.len() <= MAX_IO as usize);
                    assert!(IN_HEADER + 40 + d.len() <= buf.len());
                }
                Request::Read { size, .. } => assert!(size <= MAX_IO),
                _ => {}
            }
        }
    }
});
