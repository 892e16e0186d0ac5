//! Corrupt and foreign input: damaged metadata gives a clear error, never a
//! panic or silent garbage. The decoders are also fuzzed with cargo-fuzz
//! (see fuzz/); this test runs the same properties on stable in CI.

mod common;

use common::*;
use lamina_engine::format::{self, Page, Record, Superblock, BLOCK};
use lamina_engine::sim::SimBackend;
use lamina_engine::{Error, Pool, PoolOptions};
use proptest::prelude::*;
use std::sync::Arc;

fn opts() -> PoolOptions {
    PoolOptions {
        background: false,
        cache_bytes: 64 * 4096,
        ..PoolOptions::default()
    }
}

/// A small pool with volumes, snapshots and a clone, closed cleanly.
fn sample() -> (Arc<SimBackend>, Model) {
    let backend = Arc::new(SimBackend::new());
    let pool = Pool::create(backend.clone(), opts()).unwrap();
    let mut model = Model::default();
    pool.create_volume("v", 1 << 30).unwrap();
    let mut m = MVol::new(1 << 30);
    let h = pool.open_volume("v").unwrap();
    for b in [0u64, 5, 600, 260_000] {
        let d = pattern(b as u8, b * BS, BLOCK);
        h.write(b * BS, &d).unwrap();
        m.write(b * BS, &d);
    }
    pool.create_snapshot("v", "s", &[("app".into(), "db".into())])
        .unwrap();
    model.snaps.insert(("v".into(), "s".into()), m.clone());
    pool.clone_snapshot("v", "s", "c").unwrap();
    model.vols.insert("c".into(), m.clone());
    h.write(0, &[9; 4096]).unwrap();
    m.write(0, &[9; 4096]);
    model.vols.insert("v".into(), m);
    pool.close().unwrap();
    (backend, model)
}

/// Open, check and read everything; errors are fine, panics are not.
fn exercise(backend: Arc<SimBackend>) -> Result<(), Error> {
    let pool = Pool::open(backend, opts())?;
    let report = pool.check()?;
    for v in pool.list_volumes() {
        let h = pool.open_volume(&v.name)?;
        for e in h.extents(0, v.size)? {
            let mut buf = vec![0u8; e.len.min(1 << 16) as usize];
            h.read(e.offset, &mut buf)?;
        }
        for s in pool.list_snapshots(&v.name)? {
            let mut buf = vec![0u8; 4096];
            pool.open_snapshot(&v.name, &s.name)?.read(0, &mut buf)?;
        }
    }
    if !report.is_ok() {
        return Err(Error::Corrupt {
            block: 0,
            detail: report.problems.join("; "),
        });
    }
    pool.abandon();
    Ok(())
}

#[test]
fn foreign_files_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let e = Pool::open_dir(dir.path(), opts()).err().unwrap();
    assert!(matches!(e, Error::NotAPool { .. }), "{e}");
    std::fs::write(dir.path().join("pool.lam"), b"#!/bin/sh\necho not a pool\n").unwrap();
    std::fs::write(dir.path().join("wal.lam"), vec![0u8; 8192]).unwrap();
    let e = Pool::open_dir(dir.path(), opts()).err().unwrap();
    assert!(e.to_string().contains("not a Lamina pool"), "{e}");
    // Creating over an existing pool is refused too.
    let d2 = tempfile::tempdir().unwrap();
    Pool::create_dir(d2.path(), opts())
        .unwrap()
        .close()
        .unwrap();
    assert!(Pool::create_dir(d2.path(), opts()).is_err());
}

#[test]
fn newer_format_version_is_refused() {
    let mut p: Box<Page> = format::new_page();
    let sb = Superblock {
        pool_id: [1; 16],
        total_blocks: format::GROUP,
        catalog_root: 0,
        catalog_levels: 1,
        dead_head: 0,
        next_id: 1,
        max_blocks: 0,
        created: 0,
        journal_covered: 0,
        version: format::FORMAT_VERSION,
    };
    sb.encode(&mut p);
    format::put_u32(&mut p[..], format::HEADER + 8, 99);
    format::seal(&mut p, 0, 1);
    let e = Superblock::decode(&p).unwrap_err();
    assert!(e.to_string().contains("format version 99"), "{e}");
}

#[test]
fn every_metadata_bit_flip_is_detected() {
    let (backend, model) = sample();
    let len = backend.file_len("pool.lam");
    // Which blocks hold metadata: every block the check walks is listed by
    // flipping it and looking for a complaint; data blocks (no checksums)
    // may read differently but must never panic.
    let mut detected = 0;
    let mut flips = 0;
    for block in 0..len / BS {
        let fresh = sample().0;
        let mut page = vec![0u8; BLOCK];
        // Read through a pool-less path: the raw file.
        {
            use lamina_engine::storage::Backend;
            fresh
                .open("pool.lam", false)
                .unwrap()
                .read_at(&mut page, block * BS)
                .unwrap();
        }
        let is_meta = [
            format::MAGIC_NODE,
            format::MAGIC_RC,
            format::MAGIC_RECORD,
            format::MAGIC_SUPER,
        ]
        .contains(&format::get_u32(&page, 0));
        fresh.corrupt("pool.lam", block * BS + 100);
        let r = exercise(fresh.clone());
        if is_meta {
            flips += 1;
            match r {
                Err(_) => detected += 1,
                Ok(()) => {
                    // An unreferenced (free) page may be damaged harmlessly;
                    // a referenced one must be caught.
                    let pool = Pool::open(fresh, opts()).unwrap();
                    model.verify(&pool, &Default::default());
                }
            }
        }
    }
    assert!(
        flips > 5 && detected > 5,
        "{detected} of {flips} metadata flips detected"
    );
}

#[test]
fn torn_or_garbage_log_is_ignored_past_the_last_commit() {
    let (backend, model) = sample();
    let len = backend.file_len("wal.lam");
    backend.write_raw("wal.lam", 4096, &vec![0xAB; 9000]);
    let _ = len;
    let pool = Pool::open(backend, opts()).unwrap();
    model.verify(&pool, &Default::default());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    /// The page decoders never panic, whatever the bytes.
    #[test]
    fn decoders_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..BLOCK), block in any::<u64>()) {
        let mut p = format::new_page();
        p[..bytes.len()].copy_from_slice(&bytes);
        let _ = Superblock::decode(&p);
        let _ = Record::decode(&p, block);
        for m in [format::MAGIC_NODE, format::MAGIC_RC, format::MAGIC_RECORD] {
            let _ = format::verify(&p, block, m);
        }
        // Valid magic and checksum with garbage inside must still not panic.
        format::put_u32(&mut p[..], 0, format::MAGIC_RECORD);
        format::seal(&mut p, block, 1);
        let _ = Record::decode(&p, block);
        format::put_u32(&mut p[..], 0, format::MAGIC_SUPER);
        p[format::HEADER..format::HEADER + 8].copy_from_slice(b"LAMINA\0\0");
        format::seal(&mut p, 0, 1);
        let _ = Superblock::decode(&p);
    }

    /// Overwriting any range of a pool's files with anything never panics:
    /// open, check and reads succeed or return an error.
    #[test]
    fn damaged_pools_never_panic(file in 0..2usize, at in 0u64..(64 * 4096), bytes in prop::collection::vec(any::<u8>(), 1..64)) {
        let (backend, _) = sample();
        let name = ["pool.lam", "wal.lam"][file];
        backend.write_raw(name, at, &bytes);
        let _ = exercise(backend);
    }
}
