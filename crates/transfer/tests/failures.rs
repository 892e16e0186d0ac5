//! Pulls that fail midway: a full target pool, a source that stops, a
//! snapshot deleted on the source.

mod common;

use common::*;
use lamina_engine::{CopyProgress, Pool, PoolOptions};
use lamina_transfer::{pull_into, Reason};
use std::sync::Arc;

/// 48 MiB of data in 1 MiB extents 2 MiB apart: more than every queue and
/// socket buffer between the two sides holds, so the source is still
/// reading when the target applies its first frame.
fn big() -> Vec<(u64, usize, u8)> {
    (0..48u64)
        .map(|i| (2 * i * MIB, MIB as usize, i as u8 + 1))
        .collect()
}

#[test]
fn a_full_target_pool_fails_with_no_space() {
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_t, dst_id) = ca.identity("target");
    let (_a, src) = source_pool(96 * MIB, &big());
    let served = Served::new(src, src_id);
    let d = tempfile::tempdir().unwrap();
    let opts = PoolOptions {
        max_bytes: 24 * MIB,
        background: false,
        ..PoolOptions::default()
    };
    let dst = Pool::create_dir(d.path(), opts).unwrap();
    dst.create_volume("copy", 96 * MIB).unwrap();
    let e = pull_into(
        &dst,
        &dst_id,
        &fresh("copy", &served.remote("source"), "src", "s", 8 * MIB),
        &mut Nothing,
    )
    .end
    .unwrap_err();
    assert_eq!(e.reason(), Reason::NoSpace, "{e}");
}

#[test]
fn a_source_that_stops_midway_is_unreachable() {
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_t, dst_id) = ca.identity("target");
    let (_a, src) = source_pool(96 * MIB, &big());
    let mut served = Some(Served::new(src, src_id));
    let remote = served.as_ref().unwrap().remote("source");
    let (_b, dst) = pool();
    dst.create_volume("copy", 96 * MIB).unwrap();
    let mut last = CopyProgress::default();
    let mut ctl = OnProgress(|p: &CopyProgress| {
        // Stop the source (its sessions are cut) after the first frame.
        served.take();
        last = *p;
    });
    let pulled = pull_into(
        &dst,
        &dst_id,
        &fresh("copy", &remote, "src", "s", 8 * MIB),
        &mut ctl,
    );
    let e = pulled.end.unwrap_err();
    assert_eq!(e.reason(), Reason::SourceUnreachable, "{e}");
    assert!(last.done_bytes > 0 && last.done_bytes < 48 * MIB);
    // What came before the cut is counted on the wire all the same.
    assert!(
        pulled.wire_bytes >= last.done_bytes,
        "{} wire bytes, {} bytes of data applied",
        pulled.wire_bytes,
        last.done_bytes
    );
}

#[test]
fn a_snapshot_deleted_midway_fails_the_pull() {
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_t, dst_id) = ca.identity("target");
    let (_a, src) = source_pool(96 * MIB, &big());
    let served = Served::new(src.clone(), src_id);
    let (_b, dst) = pool();
    dst.create_volume("copy", 96 * MIB).unwrap();
    let s2: Arc<Pool> = src.clone();
    let mut deleted = false;
    let mut ctl = OnProgress(|_: &CopyProgress| {
        if !deleted {
            s2.delete_snapshot("src", "s").unwrap();
            deleted = true;
        }
    });
    let e = pull_into(
        &dst,
        &dst_id,
        &fresh("copy", &served.remote("source"), "src", "s", 8 * MIB),
        &mut ctl,
    )
    .end
    .unwrap_err();
    assert!(deleted);
    assert_eq!(e.reason(), Reason::SnapshotMissing, "{e}");
}
