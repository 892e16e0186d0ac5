//! The journal of index changes: a flush or a snapshot after writes
//! appends records to the journal instead of metadata pages to the log,
//! what it holds survives a power cut, a pool of format version 1 opens
//! upgraded with its data, and a pool without its journal is refused.

use lamina_engine::sim::SimBackend;
use lamina_engine::{Pool, PoolOptions, BLOCK, JOURNAL_FILE, POOL_FILE};
use std::path::Path;
use std::sync::Arc;

const BS: u64 = BLOCK as u64;

fn opts() -> PoolOptions {
    PoolOptions {
        background: false,
        ..PoolOptions::default()
    }
}

fn block(seed: u64) -> Vec<u8> {
    (0..BLOCK)
        .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 / 64) % 251) as u8 + 1)
        .collect()
}

fn read_block(v: &lamina_engine::Volume, idx: u64) -> Vec<u8> {
    let mut b = vec![0; BLOCK];
    v.read(idx * BS, &mut b).unwrap();
    b
}

/// Blocks in different leaves (504 entries each), so that each write
/// after a snapshot copies a leaf and adds references to its children.
const SPREAD: u64 = 128 * 1024;
fn scattered(i: u64) -> u64 {
    i * 509 + i % 7
}

#[test]
fn a_snapshot_after_writes_is_a_journal_commit_and_survives_a_power_cut() {
    let backend = Arc::new(SimBackend::new());
    let pool = Pool::create(backend.clone(), opts()).unwrap();
    pool.create_volume("v", SPREAD * BS).unwrap();
    let v = pool.open_volume("v").unwrap();
    for i in 0..200 {
        v.write(scattered(i) * BS, &block(i)).unwrap();
    }
    pool.create_snapshot("v", "s0", &[]).unwrap();
    let before = pool.commit_counts();
    for i in 0..200 {
        v.write(scattered(i) * BS, &block(1000 + i)).unwrap();
    }
    pool.create_snapshot("v", "s1", &[]).unwrap();
    for i in 0..50 {
        v.write(scattered(i) * BS, &block(2000 + i)).unwrap();
    }
    v.flush().unwrap();
    // Both commits went to the journal (200 copies on write, each copying
    // a leaf and referencing its children, then a snapshot; then 50
    // writes); the page log took nothing.
    let after = pool.commit_counts();
    assert_eq!((after.0 - before.0, after.1 - before.1), (2, 0));
    drop(v);
    backend.crash(Some(7));
    pool.abandon();
    let pool = Pool::open(backend.clone(), opts()).unwrap();
    let v = pool.open_volume("v").unwrap();
    let s0 = pool.open_snapshot("v", "s0").unwrap();
    let s1 = pool.open_snapshot("v", "s1").unwrap();
    for i in 0..200 {
        let idx = scattered(i);
        assert!(read_block(&s0, idx) == block(i), "s0 block {idx}");
        assert!(read_block(&s1, idx) == block(1000 + i), "s1 block {idx}");
        let now = if i < 50 { 2000 + i } else { 1000 + i };
        assert!(read_block(&v, idx) == block(now), "v block {idx}");
    }
    let report = pool.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    // The journal was applied and committed at the open: a second crash
    // right away loses nothing either.
    drop((v, s0, s1));
    backend.crash(Some(8));
    pool.abandon();
    let pool = Pool::open(backend, opts()).unwrap();
    let v = pool.open_volume("v").unwrap();
    assert!(read_block(&v, scattered(3)) == block(2003));
    assert_eq!(pool.list_snapshots("v").unwrap().len(), 2);
}

#[test]
fn trims_and_snapshot_ids_come_back_from_the_journal() {
    let backend = Arc::new(SimBackend::new());
    let pool = Pool::create(backend.clone(), opts()).unwrap();
    pool.create_volume("v", 64 * BS).unwrap();
    let v = pool.open_volume("v").unwrap();
    v.write(0, &vec![7; 16 * BLOCK]).unwrap();
    v.flush().unwrap();
    let labels = vec![("app".to_string(), "db".to_string())];
    let s = pool.create_snapshot("v", "a", &labels).unwrap();
    v.trim(4 * BS, 8 * BS).unwrap();
    let t = pool.create_snapshot("v", "b", &[]).unwrap();
    v.write(20 * BS, &vec![9; 2 * BLOCK]).unwrap();
    v.flush().unwrap();
    drop(v);
    backend.crash(None);
    pool.abandon();
    let pool = Pool::open(backend, opts()).unwrap();
    let snaps = pool.list_snapshots("v").unwrap();
    let a = snaps.iter().find(|x| x.name == "a").unwrap();
    let b = snaps.iter().find(|x| x.name == "b").unwrap();
    assert_eq!((a.id, b.id), (s.id, t.id));
    assert_eq!(a.labels, labels);
    let b_vol = pool.open_snapshot("v", "b").unwrap();
    assert!(read_block(&b_vol, 5) == vec![0; BLOCK]);
    assert!(read_block(&b_vol, 3) == vec![7; BLOCK]);
    let v = pool.open_volume("v").unwrap();
    assert!(read_block(&v, 21) == vec![9; BLOCK]);
    assert!(read_block(&v, 11) == vec![0; BLOCK]);
    assert!(read_block(&v, 12) == vec![7; BLOCK]);
    let report = pool.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// `tests/fixtures/v1-pool` is a pool written by the build before the
/// journal (format version 1), killed with `kill -9` after a flush, so its
/// log holds committed transactions: volume `v` (4 MiB) had block `i` of
/// its first 64 filled with byte `i % 251 + 1`, then snapshot `s1`, then
/// its first 32 KiB written with 0xAB and flushed. It opens upgraded, and
/// then works as any pool, deleting a volume with snapshots included.
#[test]
fn a_version_1_pool_opens_upgraded_with_its_data() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1-pool");
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture, dir.path());
    assert!(!dir.path().join(JOURNAL_FILE).exists());
    let pool = Pool::open_dir(dir.path(), opts()).unwrap();
    let check = |pool: &Pool| {
        let v = pool.open_volume("v").unwrap();
        let s1 = pool.open_snapshot("v", "s1").unwrap();
        for i in 0..68u64 {
            let was = if i < 64 {
                vec![(i % 251 + 1) as u8; BLOCK]
            } else {
                vec![0; BLOCK]
            };
            let now = if i < 8 {
                vec![0xAB; BLOCK]
            } else {
                was.clone()
            };
            assert!(read_block(&s1, i) == was, "s1 block {i}");
            assert!(read_block(&v, i) == now, "v block {i}");
        }
        let report = pool.check().unwrap();
        assert!(report.is_ok(), "{:?}", report.problems);
    };
    check(&pool);
    // Upgraded on disk: the superblock says version 2 and the journal is there.
    let mut sb = [0u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(
        &std::fs::File::open(dir.path().join(POOL_FILE)).unwrap(),
        &mut sb,
        0,
    )
    .unwrap();
    let version = u32::from_le_bytes(sb[72..76].try_into().unwrap());
    assert_eq!(version, 2);
    assert!(dir.path().join(JOURNAL_FILE).exists());
    // And it works as a version-2 pool: journal commits, then a crash.
    let v = pool.open_volume("v").unwrap();
    v.write(70 * BS, &vec![0xCD; BLOCK]).unwrap();
    pool.create_snapshot("v", "s2", &[]).unwrap();
    drop(v);
    pool.abandon();
    let pool = Pool::open_dir(dir.path(), opts()).unwrap();
    check(&pool);
    let s2 = pool.open_snapshot("v", "s2").unwrap();
    assert!(read_block(&s2, 70) == vec![0xCD; BLOCK]);
    drop(s2);
    // A pool of the old format retires a volume like a new one (retired
    // records need no upgrade): its snapshots stay, across a reopen.
    let id = pool.volume_info_by_name("v").unwrap().id;
    pool.delete_volume("v", false).unwrap();
    pool.close().unwrap();
    let pool = Pool::open_dir(dir.path(), opts()).unwrap();
    let old = format!("v@{id}");
    let s1 = pool.open_snapshot(&old, "s1").unwrap();
    assert!(read_block(&s1, 3) == vec![4; BLOCK]);
    assert_eq!(pool.list_snapshots(&old).unwrap().len(), 2);
    assert!(pool.open_volume("v").is_err());
    let report = pool.check().unwrap();
    assert!(report.is_ok() && report.retired_volumes == 1, "{report:?}");
}

#[test]
fn a_pool_without_its_journal_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    Pool::create_dir(dir.path(), opts())
        .unwrap()
        .close()
        .unwrap();
    std::fs::remove_file(dir.path().join(JOURNAL_FILE)).unwrap();
    let e = Pool::open_dir(dir.path(), opts()).err().unwrap();
    assert!(e.to_string().contains("journal.lam is missing"), "{e}");
}

/// Rewrite the first record of the journal's first frame with `f`,
/// keeping the frame's checksum valid: what a bug in the writer, not a
/// torn write, would leave.
fn tamper(backend: &SimBackend, f: impl FnOnce(&mut Vec<u8>)) {
    use lamina_engine::storage::Backend;
    let file = backend.open(JOURNAL_FILE, false).unwrap();
    let mut h = [0u8; 64];
    file.read_at(&mut h, BS).unwrap();
    let len = u32::from_le_bytes(h[20..24].try_into().unwrap()) as usize;
    let mut payload = vec![0u8; len];
    file.read_at(&mut payload, BS + 64).unwrap();
    f(&mut payload);
    h[20..24].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    let c = crc32c::crc32c(&h[0..4]);
    let c = crc32c::crc32c_append(c, &h[8..64]);
    let c = crc32c::crc32c_append(c, &payload);
    h[4..8].copy_from_slice(&c.to_le_bytes());
    backend.write_raw(JOURNAL_FILE, BS, &h);
    backend.write_raw(JOURNAL_FILE, BS + 64, &payload);
}

/// A pool whose journal holds one frame: a map of block 0 of `v`, then
/// a crash.
fn journalled_write() -> Arc<SimBackend> {
    let backend = Arc::new(SimBackend::new());
    let pool = Pool::create(backend.clone(), opts()).unwrap();
    pool.create_volume("v", 64 * BS).unwrap();
    let v = pool.open_volume("v").unwrap();
    v.write(0, &block(1)).unwrap();
    v.flush().unwrap();
    assert_eq!(pool.commit_counts().0, 1);
    drop(v);
    backend.crash(None);
    pool.abandon();
    backend
}

#[test]
fn a_record_that_does_not_fit_the_pool_refuses_the_open() {
    // The record as written opens.
    let backend = journalled_write();
    let pool = Pool::open(backend.clone(), opts()).unwrap();
    assert!(read_block(&pool.open_volume("v").unwrap(), 0) == block(1));

    // map record: kind (1), volume (1..9), first (9..17), count (17..21), block (21..29)
    type Edit = fn(&mut Vec<u8>);
    let cases: [(&str, Edit); 5] = [
        ("volume #999 does not exist", |p| {
            p[1..9].copy_from_slice(&999u64.to_le_bytes())
        }),
        ("past the volume's end", |p| {
            p[9..17].copy_from_slice(&64u64.to_le_bytes())
        }),
        ("is not a data block", |p| {
            p[21..29].copy_from_slice(&1u64.to_le_bytes())
        }),
        ("which is in use", |p| {
            // The superblock's group holds the volume's nodes: block 2 is
            // the first one allocated.
            p[21..29].copy_from_slice(&2u64.to_le_bytes())
        }),
        ("unknown record kind 9", |p| p[0] = 9),
    ];
    for (want, f) in cases {
        let backend = journalled_write();
        tamper(&backend, f);
        let e = Pool::open(backend, opts()).err().unwrap().to_string();
        assert!(e.contains(want), "{want}: {e}");
    }
}

/// Frames past the journal size a pool is opened with are still read: the
/// size bounds appends, not what a scan may find.
#[test]
fn a_smaller_journal_setting_still_reads_every_frame() {
    let backend = Arc::new(SimBackend::new());
    let pool = Pool::create(backend.clone(), opts()).unwrap();
    pool.create_volume("v", 1024 * BS).unwrap();
    let v = pool.open_volume("v").unwrap();
    // 900 frames of one record: about 84 KiB of journal.
    for i in 0..900u64 {
        v.write((i % 1024) * BS, &block(i)).unwrap();
        v.flush().unwrap();
    }
    assert_eq!(pool.commit_counts(), (900, 1));
    drop(v);
    backend.crash(None);
    pool.abandon();
    let small = PoolOptions {
        journal_bytes: 64 << 10,
        ..opts()
    };
    let pool = Pool::open(backend, small).unwrap();
    let v = pool.open_volume("v").unwrap();
    assert!(read_block(&v, 899) == block(899));
    assert!(read_block(&v, 0) == block(0));
}
