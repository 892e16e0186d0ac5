//! A full disk (or a pool at its capacity limit) gives the writer a clear
//! ENOSPC error and leaves the pool consistent, readable, and writable again
//! once space is freed.

use lamina_engine::{Pool, PoolOptions, BLOCK};
use std::process::Command;

const BS: u64 = BLOCK as u64;

fn fill_until_full(pool: &Pool, vol: &str) -> u64 {
    let v = pool.open_volume(vol).unwrap();
    let size = v.size().unwrap();
    let mut written = 0;
    for b in 0..size / BS {
        match v.write(b * BS, &[(b % 251) as u8 + 1; BLOCK]) {
            Ok(()) => written = b + 1,
            Err(e) => {
                assert!(e.is_no_space(), "expected ENOSPC, got {e}");
                assert!(e.to_string().contains("no space left"), "{e}");
                return written;
            }
        }
    }
    panic!("the volume never filled the pool");
}

fn verify_prefix(pool: &Pool, vol: &str, blocks: u64) {
    let v = pool.open_volume(vol).unwrap();
    let mut buf = vec![0u8; BLOCK];
    for b in 0..blocks {
        v.read(b * BS, &mut buf).unwrap();
        assert!(
            buf.iter().all(|&x| x == (b % 251) as u8 + 1),
            "block {b} lost after ENOSPC"
        );
    }
}

fn exercise(pool: &Pool) {
    pool.create_volume("v", 1 << 30).unwrap();
    let written = fill_until_full(pool, "v");
    assert!(written > 100);
    // Writes that need no new block still work: overwrite in place.
    pool.open_volume("v")
        .unwrap()
        .write(0, &[1; BLOCK])
        .unwrap();
    pool.commit().unwrap();
    let report = pool.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    verify_prefix(pool, "v", written);
    // A snapshot needs a record page: it may be refused, clearly.
    match pool.create_snapshot("v", "s", &[]) {
        Ok(_) => {
            // Every block is now shared: the next write needs a new block.
            let e = pool
                .open_volume("v")
                .unwrap()
                .write(0, &[2; BLOCK])
                .unwrap_err();
            assert!(e.is_no_space(), "{e}");
            verify_prefix(pool, "v", written);
            // Deleting needs no new space.
            pool.delete_snapshot("v", "s").unwrap();
        }
        Err(e) => assert!(e.is_no_space(), "{e}"),
    }
    verify_prefix(pool, "v", written);
    // Freeing space makes the pool writable again.
    pool.open_volume("v").unwrap().trim(0, 64 * BS).unwrap();
    pool.commit().unwrap();
    pool.reclaim_all().unwrap();
    pool.commit().unwrap();
    pool.create_snapshot("v", "s2", &[]).unwrap();
    pool.open_volume("v")
        .unwrap()
        .write(0, &[3; BLOCK])
        .unwrap();
    verify_prefix(pool, "v", 0);
    let report = pool.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

#[test]
fn capacity_limit_gives_enospc_and_stays_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let opts = PoolOptions {
        max_bytes: 24 << 20,
        background: false,
        ..PoolOptions::default()
    };
    let pool = Pool::create_dir(dir.path(), opts.clone()).unwrap();
    exercise(&pool);
    pool.close().unwrap();
    let pool = Pool::open_dir(dir.path(), opts).unwrap();
    assert!(pool.check().unwrap().is_ok());
}

/// A real full filesystem: a 24 MiB tmpfs, mounted for the test (needs root,
/// which CI has). The log is preallocated, so the disk fills at a data write.
#[test]
fn full_filesystem_gives_enospc_and_stays_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=24m", "tmpfs"])
        .arg(dir.path())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        eprintln!("SKIPPED: cannot mount a tmpfs here (not root?); the capacity-limit test covers the engine path");
        return;
    }
    let result = std::panic::catch_unwind(|| {
        let opts = PoolOptions {
            wal_bytes: 1 << 20,
            background: false,
            ..PoolOptions::default()
        };
        let pool = Pool::create_dir(dir.path().join("pool"), opts.clone()).unwrap();
        exercise(&pool);
        pool.close().unwrap();
        let pool = Pool::open_dir(dir.path().join("pool"), opts).unwrap();
        assert!(pool.check().unwrap().is_ok());
        pool.close().unwrap();
    });
    let _ = Command::new("umount").arg(dir.path()).status();
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}
