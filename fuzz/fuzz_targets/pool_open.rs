//! Fuzz recovery: a small pool whose files the fuzzer overwrites, then open,
//! check and read everything. Errors are expected; panics are bugs.
#![no_main]

use lamina_engine::sim::SimBackend;
use lamina_engine::{Pool, PoolOptions};
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

fn opts() -> PoolOptions {
    PoolOptions { background: false, cache_bytes: 64 * 4096, ..PoolOptions::default() }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let backend = Arc::new(SimBackend::new());
    let pool = Pool::create(backend.clone(), opts()).unwrap();
    pool.create_volume("v", 1 << 30).unwrap();
    let h = pool.open_volume("v").unwrap();
    for b in [0u64, 600, 260_000] {
        h.write(b * 4096, &[b as u8; 4096]).unwrap();
    }
    pool.create_snapshot("v", "s", &[]).unwrap();
    h.write(0, &[1; 4096]).unwrap();
    pool.commit().unwrap(); // leave the last changes in the log only
    pool.abandon();
    let file = if data[0] & 1 == 0 { "pool.lam" } else { "wal.lam" };
    let at = u16::from_le_bytes([data[1], data[2]]) as u64 * 8;
    backend.write_raw(file, at, &data[3..]);
    let Ok(pool) = Pool::open(backend, opts()) else { return };
    let _ = pool.check();
    for v in pool.list_volumes() {
        if let Ok(h) = pool.open_volume(&v.name) {
            if let Ok(ext) = h.extents(0, v.size) {
                for e in ext.iter().take(16) {
                    let mut buf = vec![0u8; e.len.min(1 << 16) as usize];
                    let _ = h.read(e.offset, &mut buf);
                }
            }
        }
    }
    pool.abandon();
});
