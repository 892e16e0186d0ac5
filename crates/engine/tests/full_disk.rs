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

/// A small tmpfs mounted on a new temporary directory for the length of
/// `f` (needs root, which CI has); `None` if it cannot be mounted.
fn on_tmpfs<T>(
    size: &str,
    f: impl FnOnce(&std::path::Path) -> T + std::panic::UnwindSafe,
) -> Option<T> {
    let dir = tempfile::tempdir().unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(dir.path())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        eprintln!("SKIPPED: cannot mount a tmpfs here (not root?)");
        return None;
    }
    let path = dir.path().to_path_buf();
    let result = std::panic::catch_unwind(move || f(&path));
    let _ = Command::new("umount").arg(dir.path()).status();
    match result {
        Ok(v) => Some(v),
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// Options for the crash tests on a small file system: a small log and
/// journal, so that most of the disk is the pool's; no background threads,
/// so that nothing commits through the page log behind the test's back and
/// the crash leaves journal records to replay.
fn small_opts() -> PoolOptions {
    PoolOptions {
        wal_bytes: 1 << 20,
        journal_bytes: 1 << 20,
        background: false,
        ..PoolOptions::default()
    }
}

/// Each file of a pool: name, size, modification time, contents.
fn files_of(dir: &std::path::Path) -> Vec<(String, u64, std::time::SystemTime, Vec<u8>)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let m = std::fs::metadata(&p).unwrap();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (
                name,
                m.len(),
                m.modified().unwrap(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

/// What a volume holds: block -> the byte it is filled with.
type Blocks = std::collections::BTreeMap<u64, u8>;

fn value(b: u64) -> u8 {
    (b % 251) as u8 + 1
}

/// Write each of `blocks` (flushing every 16) until the disk is full, then
/// flush: every write that succeeded is acknowledged, and in `model`.
/// Returns how many were written.
fn write_until_full(
    v: &lamina_engine::Volume,
    blocks: impl Iterator<Item = u64>,
    model: &mut Blocks,
) -> u64 {
    let mut n = 0;
    for b in blocks {
        if let Err(e) = v.write(b * BS, &[value(b); BLOCK]) {
            assert!(e.is_no_space(), "expected ENOSPC, got {e}");
            v.flush().unwrap();
            return n;
        }
        model.insert(b, value(b));
        n += 1;
        if n % 16 == 0 {
            v.flush().unwrap();
        }
    }
    panic!("the disk never filled");
}

fn verify(v: &lamina_engine::Volume, model: &Blocks, what: &str) {
    let mut buf = vec![0u8; BLOCK];
    for (&b, &x) in model {
        v.read(b * BS, &mut buf).unwrap();
        assert!(buf.iter().all(|&y| y == x), "{what}: block {b} lost");
    }
}

/// A pool that ran out of space, took a snapshot and was killed
/// (its journal holds the writes, trims and the snapshot; the page log
/// none of them) opens again with no space for anything new: the open
/// applies the journal in the disk space the killed process had taken for
/// the same changes. The trim in the middle frees blocks that the writes
/// after it reuse, for data and for index nodes, so that the open must
/// reuse them too. Reads and deletes work after the open, writes get ENOSPC
/// until space is freed, then work again.
fn kill_when_full_and_reopen(dir: &std::path::Path, opts: PoolOptions) {
    let pool = Pool::create_dir(dir, opts.clone()).unwrap();
    pool.create_volume("v", 1 << 30).unwrap();
    pool.checkpoint().unwrap();
    let before = pool.commit_counts();
    let v = pool.open_volume("v").unwrap();
    let mut model = Blocks::new();
    let filled = write_until_full(&v, 0.., &mut model);
    assert!(filled > 500, "only {filled} blocks fit");
    // Free 64 blocks, then write one block in each of 64 leaves' worth
    // of the volume far from the rest: each needs a new index node too.
    v.trim(0, 64 * BS).unwrap();
    v.flush().unwrap();
    (0..64).for_each(|b| {
        model.remove(&b);
    });
    let leaf = lamina_engine::format::FANOUT as u64;
    let sparse = write_until_full(&v, (1..).map(|i| 100 * leaf + i * leaf), &mut model);
    assert!(sparse > 4, "only {sparse} sparse blocks fit");
    let snapshot = match pool.create_snapshot("v", "s", &[]) {
        Ok(_) => true,
        Err(e) => {
            assert!(e.is_no_space(), "{e}");
            false
        }
    };
    let (journal, pages) = pool.commit_counts();
    let (journal, pages) = (journal - before.0, pages - before.1);
    assert!(
        journal > 0 && pages == 0,
        "{journal} journal commits, {pages} page-log commits"
    );
    drop(v);
    pool.abandon();

    // A check reads the killed pool as the open will find it, and writes
    // nothing.
    let before = files_of(dir);
    let report = Pool::check_read_only(dir, opts.clone()).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    assert!(report.journal_records > 0, "{report:?}");
    assert_eq!(report.volumes, 1);
    assert_eq!(report.snapshots, u64::from(snapshot));
    assert!(
        files_of(dir) == before,
        "pool check changed the pool's files"
    );

    let pool = Pool::open_dir(dir, opts.clone())
        .unwrap_or_else(|e| panic!("a pool killed out of space does not open: {e}"));
    let v = pool.open_volume("v").unwrap();
    verify(&v, &model, "volume");
    if snapshot {
        verify(&pool.open_snapshot("v", "s").unwrap(), &model, "snapshot");
    }
    let report = pool.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    // Writing a new block needs space there may be none of.
    if let Err(e) = v.write(50 * leaf * BS, &[7; BLOCK]) {
        assert!(e.is_no_space(), "{e}");
    }
    assert!(pool.failure().is_none(), "{:?}", pool.failure());
    // Deleting frees space, then writes work again.
    if snapshot {
        pool.delete_snapshot("v", "s").unwrap();
    }
    v.trim(64 * BS, 256 * BS).unwrap();
    v.flush().unwrap();
    pool.reclaim_all().unwrap();
    pool.commit().unwrap();
    (64..320).for_each(|b| {
        model.remove(&b);
    });
    for b in 64..128 {
        v.write(b * BS, &[value(b); BLOCK]).unwrap();
        model.insert(b, value(b));
    }
    v.flush().unwrap();
    drop(v);
    pool.close().unwrap();
    let pool = Pool::open_dir(dir, opts.clone()).unwrap();
    verify(
        &pool.open_volume("v").unwrap(),
        &model,
        "after a clean reopen",
    );
    let report = pool.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    pool.close().unwrap();
}

/// The same at a pool's capacity limit (`max_bytes`) on a roomy disk:
/// there the blocks the trim freed are the only free ones, and the writes
/// after it put their index nodes in them; the open must put its nodes in
/// them again, or find no block within the limit.
#[test]
fn a_pool_killed_at_its_capacity_limit_opens_again() {
    let dir = tempfile::tempdir().unwrap();
    let opts = PoolOptions {
        max_bytes: 24 << 20,
        ..small_opts()
    };
    kill_when_full_and_reopen(&dir.path().join("pool"), opts);
}

/// On a real file system run full: a 12 MiB tmpfs.
#[test]
fn a_pool_killed_at_a_full_disk_opens_again() {
    on_tmpfs("12m", |root| {
        kill_when_full_and_reopen(&root.join("pool"), small_opts());
    });
}
