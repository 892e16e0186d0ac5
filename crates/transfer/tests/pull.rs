//! Pulls between two pools over real sockets on 127.0.0.1.

mod common;

use common::*;
use lamina_engine::{CopyEnd, SnapshotInfo};
use lamina_transfer::{describe, pull_into, Pace, Pull, Reason};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// 40 extents of 256 KiB 1 MiB apart, plus two unaligned 4 KiB pieces.
fn scattered() -> Vec<(u64, usize, u8)> {
    let mut w: Vec<(u64, usize, u8)> = (0..40u64)
        .map(|i| (i * MIB, 256 << 10, i as u8 + 1))
        .collect();
    w.push((50 * MIB + 4096, 4096, 0xaa));
    w.push((63 * MIB, 4096, 0xbb));
    w
}

/// A pace that lets two pieces through, then holds every stream until
/// `open` (or 10 s).
#[derive(Default)]
struct Gate {
    calls: AtomicU64,
    open: AtomicBool,
}

impl Pace for Gate {
    fn wait(&self, _bytes: u64) -> Duration {
        if self.calls.fetch_add(1, Ordering::Relaxed) >= 2 {
            let t = Instant::now();
            while !self.open.load(Ordering::Relaxed) && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Duration::ZERO
    }
}

fn snap(p: &lamina_engine::Pool) -> SnapshotInfo {
    p.snapshot_info_by_name("src", "s").unwrap()
}

#[test]
fn a_full_pull_equals_the_snapshot_and_keeps_holes() {
    capture_logs();
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_t, dst_id) = ca.identity("target");
    let (_a, src) = source_pool(64 * MIB, &scattered());
    // The source holds its stream after two pieces until the target's
    // first progress has looked at its readers: otherwise the whole
    // stream (10 MiB) fits in the target's queue and socket, and the
    // source may be done before the target writes anything.
    let gate = Arc::new(Gate::default());
    let pace: Arc<dyn Pace> = gate.clone();
    let served = Served::paced(src.clone(), src_id, Some(pace));
    let (_b, dst) = pool();
    dst.create_volume("copy", 64 * MIB).unwrap();
    let info = snap(&src);

    let remote = served.remote("source");
    let d = describe(&dst_id, &remote, "src", "s").unwrap();
    assert_eq!(
        (d.id, d.size, d.data_bytes),
        (identity_of(&src, &info), 64 * MIB, info.allocated_bytes)
    );

    // While the pull runs, the source lists the target as a reader.
    let mut seen = Vec::new();
    let mut ctl = OnProgress(|_: &_| {
        if seen.is_empty() {
            seen = served.source.readers("src", "s");
            gate.open.store(true, Ordering::Relaxed);
        }
    });
    let pull = Pull {
        into: "copy",
        remote: &remote,
        volume: "src",
        snapshot: "s",
        expect_id: identity_of(&src, &info),
        resume_offset: 0,
        checkpoint_bytes: 8 * MIB,
        stall_timeout: lamina_transfer::Limits::STALL_TIMEOUT,
    };
    let end = pull_into(&dst, &dst_id, &pull, &mut ctl);
    assert_eq!(seen, vec!["target".to_string()]);
    let Ok(CopyEnd::Done(p)) = end.end else {
        panic!("not done: {end:?}")
    };
    assert_eq!(
        (p.done_bytes, p.total_bytes, p.resume_offset),
        (info.allocated_bytes, info.allocated_bytes, 64 * MIB)
    );
    assert!(read_all(&src, "src", Some("s")) == read_all(&dst, "copy", None));
    // Holes stay holes; only allocated data crossed, with little overhead.
    let allocated = dst.volume_info_by_name("copy").unwrap().allocated_bytes;
    assert_eq!(allocated, info.allocated_bytes);
    assert!(end.wire_bytes >= info.allocated_bytes);
    assert!(
        end.wire_bytes as f64 <= 1.05 * info.allocated_bytes as f64,
        "{} wire bytes for {} allocated",
        end.wire_bytes,
        info.allocated_bytes
    );
    assert!(served.source.bytes_sent_to("target") >= info.allocated_bytes);
    eventually("the reader is gone", || {
        served.source.readers("src", "s").is_empty()
    });
    assert!(logs().contains("accepted a session"));
}

#[test]
fn a_resumed_pull_sends_only_the_rest() {
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_t, dst_id) = ca.identity("target");
    let (_a, src) = source_pool(64 * MIB, &scattered());
    let served = Served::new(src.clone(), src_id);
    let (_b, dst) = pool();
    dst.create_volume("copy", 64 * MIB).unwrap();
    let info = snap(&src);
    let remote = served.remote("source");

    let mut ctl = StopAtFirstCheckpoint::default();
    let end = pull_copy(
        &dst,
        &dst_id,
        &remote,
        identity_of(&src, &info),
        0,
        &mut ctl,
    );
    let first = ctl.0.expect("a durable checkpoint");
    assert_eq!(end.end.unwrap(), CopyEnd::Stopped(first));
    assert!(first.resume_offset > 0 && first.done_bytes < first.total_bytes);
    eventually("the first session ended", || {
        served.source.readers("src", "s").is_empty()
    });
    let sent_before = served.source.bytes_sent_to("target");

    let mut done = None;
    let mut ctl = OnProgress(|p: &lamina_engine::CopyProgress| {
        // Progress starts from what the first run made durable.
        done.get_or_insert(p.done_bytes);
    });
    let end = pull_copy(
        &dst,
        &dst_id,
        &remote,
        identity_of(&src, &info),
        first.resume_offset,
        &mut ctl,
    );
    assert!(matches!(end.end, Ok(CopyEnd::Done(p)) if p.done_bytes == p.total_bytes));
    assert!(done.unwrap() > first.done_bytes);
    let rest = info.allocated_bytes - first.done_bytes;
    assert!(
        end.wire_bytes as f64 <= 1.05 * rest as f64 + 16384.0,
        "{} wire bytes for {rest}",
        end.wire_bytes
    );
    eventually("the second session ended", || {
        served.source.readers("src", "s").is_empty()
    });
    let sent = served.source.bytes_sent_to("target") - sent_before;
    assert!(
        sent >= rest && sent < rest + 64 * 1024,
        "{sent} bytes sent for the {rest} left"
    );
    assert!(read_all(&src, "src", Some("s")) == read_all(&dst, "copy", None));
}

#[test]
fn a_missing_snapshot_is_reported() {
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_t, dst_id) = ca.identity("target");
    let (_a, src) = source_pool(4 * MIB, &[(0, 4096, 1)]);
    let served = Served::new(src, src_id);
    let (_b, dst) = pool();
    dst.create_volume("copy", 4 * MIB).unwrap();
    let remote = served.remote("source");
    for (v, s) in [("src", "nope"), ("nope", "s")] {
        let e = pull_into(
            &dst,
            &dst_id,
            &fresh("copy", &remote, v, s, MIB),
            &mut Nothing,
        )
        .end
        .unwrap_err();
        assert_eq!(e.reason(), Reason::SnapshotMissing, "{e}");
        assert!(e.to_string().contains("not found"), "{e}");
        let e = describe(&dst_id, &remote, v, s).unwrap_err();
        assert_eq!(e.reason(), Reason::SnapshotMissing, "{e}");
    }
    assert_eq!(dst.volume_info_by_name("copy").unwrap().allocated_bytes, 0);
}

#[test]
fn a_snapshot_made_again_under_the_same_name_is_refused() {
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_t, dst_id) = ca.identity("target");
    let (_a, src) = source_pool(4 * MIB, &[(0, 4096, 1)]);
    let served = Served::new(src.clone(), src_id);
    let (_b, dst) = pool();
    dst.create_volume("copy", 4 * MIB).unwrap();
    let remote = served.remote("source");
    let old = describe(&dst_id, &remote, "src", "s").unwrap();
    src.delete_snapshot("src", "s").unwrap();
    src.open_volume("src")
        .unwrap()
        .write(0, &[2; 4096])
        .unwrap();
    src.create_snapshot("src", "s", &[]).unwrap();
    let e = pull_copy(&dst, &dst_id, &remote, old.id, 0, &mut Nothing)
        .end
        .unwrap_err();
    assert_eq!(e.reason(), Reason::SnapshotMissing, "{e}");
    assert!(e.to_string().contains("made again"), "{e}");
    assert_eq!(dst.volume_info_by_name("copy").unwrap().allocated_bytes, 0);
}

#[test]
fn an_unreachable_source_is_reported() {
    let ca = Ca::new();
    let (_t, dst_id) = ca.identity("target");
    let (_b, dst) = pool();
    dst.create_volume("copy", MIB).unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let remote = lamina_transfer::Remote {
        address: addr.to_string(),
        node: "source".into(),
    };
    let e = pull_copy(&dst, &dst_id, &remote, 0, 0, &mut Nothing)
        .end
        .unwrap_err();
    assert_eq!(e.reason(), Reason::SourceUnreachable, "{e}");
    assert!(e.to_string().contains(&addr.to_string()), "{e}");
}

#[test]
fn a_target_volume_too_small_is_refused_before_any_write() {
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_t, dst_id) = ca.identity("target");
    let (_a, src) = source_pool(8 * MIB, &[(0, 4096, 1)]);
    let served = Served::new(src, src_id);
    let (_b, dst) = pool();
    dst.create_volume("small", 4 * MIB).unwrap();
    let e = pull_into(
        &dst,
        &dst_id,
        &fresh("small", &served.remote("source"), "src", "s", MIB),
        &mut Nothing,
    )
    .end
    .unwrap_err();
    assert!(e.to_string().contains("smaller than"), "{e}");
    assert_eq!(dst.volume_info_by_name("small").unwrap().allocated_bytes, 0);
    // And a target volume that does not exist.
    let e = pull_into(
        &dst,
        &dst_id,
        &fresh("none", &served.remote("source"), "src", "s", MIB),
        &mut Nothing,
    )
    .end
    .unwrap_err();
    assert!(e.to_string().contains("none"), "{e}");
}

/// A pool like [`source_pool`] whose snapshot `s` carries `labels`.
fn replica_pool(
    writes: &[(u64, usize, u8)],
    labels: &[(String, String)],
) -> (tempfile::TempDir, Arc<lamina_engine::Pool>) {
    let (d, p) = pool();
    p.create_volume("src", 64 * MIB).unwrap();
    let v = p.open_volume("src").unwrap();
    for &(off, len, b) in writes {
        v.write(off, &vec![b; len]).unwrap();
    }
    v.flush().unwrap();
    p.create_snapshot("src", "s", labels).unwrap();
    (d, p)
}

struct Others(Vec<lamina_transfer::Holder>);
impl lamina_transfer::Holders for Others {
    fn holders(&self, _volume: &str, _snapshot: &str) -> Vec<lamina_transfer::Holder> {
        self.0.clone()
    }
}

#[test]
fn a_pull_resumes_from_another_replica_of_the_same_snapshot_and_refuses_another() {
    use lamina_transfer::identity::{format, ORIGIN_LABEL};
    let ca = Ca::new();
    let (_a, a_id) = ca.identity("node-a");
    let (_b, b_id) = ca.identity("node-b");
    let (_c, c_id) = ca.identity("node-c");
    let (_t, dst_id) = ca.identity("target");
    // Node a's snapshot, and two replicas of the volume: b's a copy of it
    // (its origin), c's another snapshot of the same name and data.
    let (_pa, a) = source_pool(64 * MIB, &scattered());
    let origin = identity_of(&a, &snap(&a));
    let (_pb, b) = replica_pool(&scattered(), &[(ORIGIN_LABEL.into(), format(origin))]);
    let (_pc, c) = replica_pool(&scattered(), &[(ORIGIN_LABEL.into(), format(origin ^ 1))]);
    assert_eq!(identity_of(&b, &snap(&b)), origin);
    let (sa, sb, sc) = (
        Served::new(a.clone(), a_id),
        Served::new(b.clone(), b_id),
        Served::new(c.clone(), c_id),
    );
    // a names the others (never itself, nor the peer asking).
    let named = |n: &str, s: &Served| lamina_transfer::Holder {
        node: n.into(),
        address: s.addr.to_string(),
    };
    sa.source.serve_holders(Arc::new(Others(vec![
        named("node-a", &sa),
        named("target", &sa),
        named("node-b", &sb),
        named("node-c", &sc),
        named("node-b", &sb),
    ])));
    let (_d, dst) = pool();
    dst.create_volume("copy", 64 * MIB).unwrap();
    let d = describe(&dst_id, &sa.remote("node-a"), "src", "s").unwrap();
    assert_eq!(d.id, origin);
    assert_eq!(d.holders, vec![named("node-b", &sb), named("node-c", &sc)]);

    // Part of it from a, then a is gone.
    let mut ctl = StopAtFirstCheckpoint::default();
    let end = pull_copy(&dst, &dst_id, &sa.remote("node-a"), origin, 0, &mut ctl);
    let first = ctl.0.expect("a durable checkpoint");
    assert_eq!(end.end.unwrap(), CopyEnd::Stopped(first));
    assert_eq!(end.holders.len(), 2);
    drop(sa);

    // c holds another snapshot of that name: refused, nothing applied.
    let e = pull_copy(
        &dst,
        &dst_id,
        &sc.remote("node-c"),
        origin,
        first.resume_offset,
        &mut Nothing,
    )
    .end
    .unwrap_err();
    assert_eq!(e.reason(), Reason::SnapshotMissing, "{e}");
    assert!(
        e.to_string().contains("another snapshot of that name"),
        "{e}"
    );

    // b holds the same one: the rest comes from it, from the offset.
    let end = pull_copy(
        &dst,
        &dst_id,
        &sb.remote("node-b"),
        origin,
        first.resume_offset,
        &mut Nothing,
    );
    assert!(
        matches!(end.end, Ok(CopyEnd::Done(p)) if p.done_bytes == p.total_bytes),
        "{end:?}"
    );
    let rest = snap(&b).allocated_bytes - first.done_bytes;
    assert!(
        end.wire_bytes as f64 <= 1.05 * rest as f64 + 16384.0,
        "{} wire bytes for the {rest} left",
        end.wire_bytes
    );
    assert!(read_all(&a, "src", Some("s")) == read_all(&dst, "copy", None));
}
