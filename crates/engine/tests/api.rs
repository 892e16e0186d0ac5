//! The engine's API as a user meets it: snapshot trees, usage figures, diff
//! and export, full clones, names, labels and bad input.

mod common;

use common::{cached_exclusive_sizes_are_exact, pool, BS};
use lamina_engine::{Chunk, CloneState, Error, ExtentKind, Pool, PoolOptions, Target, BLOCK};

fn fill(p: &Pool, vol: &str, blocks: std::ops::Range<u64>, byte: u8) {
    let v = p.open_volume(vol).unwrap();
    for b in blocks {
        v.write(b * BS, &[byte; BLOCK]).unwrap();
    }
}

#[test]
fn usage_counts_exclusive_blocks_and_delete_frees_them() {
    let (_d, p) = pool();
    p.create_volume("v", 1 << 30).unwrap();
    fill(&p, "v", 0..10, 1);
    p.create_snapshot("v", "s1", &[]).unwrap();
    assert_eq!(
        p.usage("v", Some("s1")).unwrap().exclusive_bytes,
        0,
        "all shared with the volume"
    );
    assert_eq!(
        p.snapshot_info_by_name("v", "s1").unwrap().allocated_bytes,
        10 * BS
    );
    fill(&p, "v", 0..4, 2);
    let s1 = p.usage("v", Some("s1")).unwrap();
    assert_eq!(
        s1.exclusive_bytes,
        4 * BS,
        "the four overwritten blocks are the snapshot's alone"
    );
    assert_eq!(
        p.snapshot_info_by_name("v", "s1").unwrap().exclusive_bytes,
        4 * BS
    );
    let head = p.usage("v", None).unwrap();
    assert_eq!(head.exclusive_bytes, 4 * BS);
    assert_eq!(head.allocated_bytes, 10 * BS);
    let before = p.stats().unwrap().used_bytes;
    p.delete_snapshot("v", "s1").unwrap();
    p.reclaim_all().unwrap();
    let freed = before - p.stats().unwrap().used_bytes;
    assert!(
        (4 * BS..=8 * BS).contains(&freed),
        "freed {freed} bytes: the 4 data blocks and the snapshot's own nodes"
    );
}

#[test]
fn snapshot_tree_revert_branches_and_delete_reparents() {
    let (_d, p) = pool();
    p.create_volume("v", 1 << 20).unwrap();
    fill(&p, "v", 0..1, 1);
    p.create_snapshot("v", "a", &[("team".into(), "db".into())])
        .unwrap();
    fill(&p, "v", 0..1, 2);
    p.create_snapshot("v", "b", &[]).unwrap();
    fill(&p, "v", 0..1, 3);
    p.revert_volume("v", "a").unwrap();
    let mut buf = [0u8; 16];
    p.open_volume("v").unwrap().read(0, &mut buf).unwrap();
    assert_eq!(buf, [1; 16], "revert restores the snapshot's data");
    p.create_snapshot("v", "c", &[]).unwrap();
    let a = p.snapshot_info_by_name("v", "a").unwrap();
    assert_eq!(
        a.children,
        vec!["b".to_string(), "c".to_string()],
        "a revert starts a new branch; b stays"
    );
    assert_eq!(a.labels, vec![("team".to_string(), "db".to_string())]);
    assert!(!a.system);
    assert_eq!(
        p.volume_info_by_name("v")
            .unwrap()
            .parent_snapshot
            .as_deref(),
        Some("c")
    );
    p.delete_snapshot("v", "a").unwrap();
    let b = p.snapshot_info_by_name("v", "b").unwrap();
    assert_eq!(b.parent, None);
    let list: Vec<String> = p
        .list_snapshots("v")
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(list, ["b", "c"]);
    let mut buf = [0u8; 16];
    p.open_snapshot("v", "b")
        .unwrap()
        .read(0, &mut buf)
        .unwrap();
    assert_eq!(buf, [2; 16], "b keeps its data after its parent is deleted");
}

#[test]
fn diff_export_and_full_clone_move_only_what_changed() {
    let (_d, p) = pool();
    p.create_volume("v", 1 << 30).unwrap();
    fill(&p, "v", 0..8, 1);
    fill(&p, "v", 1000..1002, 1);
    p.create_snapshot("v", "s1", &[]).unwrap();
    fill(&p, "v", 4..6, 2);
    p.open_volume("v").unwrap().trim(1000 * BS, 2 * BS).unwrap();
    p.create_snapshot("v", "s2", &[]).unwrap();
    let d = p
        .diff(
            Some(&Target::snapshot("v", "s1")),
            &Target::snapshot("v", "s2"),
        )
        .unwrap();
    let kinds: Vec<(u64, u64, ExtentKind)> = d
        .iter()
        .map(|e| (e.offset / BS, e.len / BS, e.kind))
        .collect();
    assert_eq!(
        kinds,
        [(4, 2, ExtentKind::Data), (1000, 2, ExtentKind::Zero)]
    );
    // Extents of the snapshot: data and holes.
    let ext = p
        .open_snapshot("v", "s1")
        .unwrap()
        .extents(0, 2000 * BS)
        .unwrap();
    assert_eq!(ext[0].kind, ExtentKind::Data);
    assert_eq!((ext[0].offset, ext[0].len), (0, 8 * BS));
    assert_eq!(ext[1].kind, ExtentKind::Hole);
    // A replica: full copy of s1, then the s1 -> s2 changes.
    p.create_volume("replica", 1 << 30).unwrap();
    let r = p.open_volume("replica").unwrap();
    for c in p.export(None, &Target::snapshot("v", "s1")).unwrap() {
        r.apply(&c.unwrap()).unwrap();
    }
    let inc = p
        .export(
            Some(&Target::snapshot("v", "s1")),
            &Target::snapshot("v", "s2"),
        )
        .unwrap();
    assert_eq!(inc.data_bytes(), 2 * BS, "only the changed blocks travel");
    for c in inc {
        let c = c.unwrap();
        if let Chunk::Data { bytes, .. } = &c {
            assert!(bytes.len() as u64 <= 1 << 20);
        }
        r.apply(&c).unwrap();
    }
    let same = p
        .diff(
            Some(&Target::snapshot("v", "s2")),
            &Target::volume("replica"),
        )
        .unwrap();
    assert!(
        same.is_empty() || same.iter().all(|e| e.kind == ExtentKind::Data),
        "{same:?}"
    );
    for b in [0u64, 4, 5, 7, 1000, 1001] {
        let (mut x, mut y) = ([0u8; BLOCK], [0u8; BLOCK]);
        r.read(b * BS, &mut x).unwrap();
        p.open_snapshot("v", "s2")
            .unwrap()
            .read(b * BS, &mut y)
            .unwrap();
        assert_eq!(x, y, "block {b}");
    }
    // A full clone copies only allocated data and reports progress.
    let mut last = (0, 0);
    let info = p
        .full_clone("v", "s2", "copy", &mut |d, t| last = (d, t))
        .unwrap();
    assert_eq!(last, (8 * BS, 8 * BS));
    assert_eq!(info.allocated_bytes, 8 * BS);
    assert_eq!(info.clone_state, CloneState::None);
}

#[test]
fn clones_survive_their_origin_and_flatten() {
    let (_d, p) = pool();
    p.create_volume("v", 1 << 24).unwrap();
    fill(&p, "v", 0..100, 9);
    let c = p.clone_volume("v", "c").unwrap();
    assert_eq!(c.clone_state, CloneState::Linked);
    let sys = p.list_snapshots("v").unwrap();
    assert!(
        sys[0].system,
        "a clone from a volume takes a system snapshot"
    );
    assert_eq!(c.origin.as_ref().unwrap().volume.as_deref(), Some("v"));
    // The origin goes while the clone shares its blocks: it is retired,
    // keeping the system snapshot the clone still needs.
    p.delete_volume("v", true).unwrap();
    assert!(matches!(
        p.volume_info_by_name("v"),
        Err(Error::VolumeNotFound(_))
    ));
    let c = p.volume_info_by_name("c").unwrap();
    assert_eq!(c.origin.as_ref().unwrap().volume.as_deref(), Some("v"));
    let sys = p.list_snapshots("v").unwrap();
    assert!(sys.len() == 1 && sys[0].system && sys[0].volume_deleted);
    assert_eq!(p.stats().unwrap().retired_volumes, 1);
    p.flatten("c").unwrap();
    let c = p.volume_info_by_name("c").unwrap();
    assert_eq!(c.clone_state, CloneState::Independent);
    assert_eq!(c.origin, None, "a flattened clone shows no origin");
    // The clone's system snapshot went when the flatten ended, and the
    // retired volume's record with it.
    assert!(matches!(
        p.list_snapshots("v"),
        Err(Error::VolumeNotFound(_))
    ));
    assert_eq!(p.stats().unwrap().retired_volumes, 0);
    p.reclaim_all().unwrap();
    let mut buf = [0u8; BLOCK];
    p.open_volume("c").unwrap().read(99 * BS, &mut buf).unwrap();
    assert_eq!(buf, [9; BLOCK]);
    assert!(
        matches!(p.flatten("c"), Err(Error::Conflict(_))),
        "not a linked clone any more"
    );
    assert!(p.check().unwrap().is_ok());
}

#[test]
fn background_flatten_finishes_while_the_clone_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let p = Pool::create_dir(dir.path(), PoolOptions::default()).unwrap();
    p.create_volume("v", 64 << 20).unwrap();
    fill(&p, "v", 0..4000, 5);
    p.create_snapshot("v", "s", &[]).unwrap();
    p.clone_snapshot("v", "s", "c").unwrap();
    let prog = p.flatten("c").unwrap();
    fill(&p, "c", 0..50, 6);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !prog.finished.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(
            std::time::Instant::now() < deadline,
            "flatten did not finish"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(prog.error.lock().unwrap().is_none());
    assert_eq!(
        p.volume_info_by_name("c").unwrap().clone_state,
        CloneState::Independent
    );
    let h = p.open_volume("c").unwrap();
    let mut buf = [0u8; BLOCK];
    h.read(10 * BS, &mut buf).unwrap();
    assert_eq!(buf, [6; BLOCK]);
    h.read(3999 * BS, &mut buf).unwrap();
    assert_eq!(buf, [5; BLOCK]);
    // Nothing is shared any more: deleting the origin frees all of its data.
    assert_eq!(p.usage("c", None).unwrap().exclusive_bytes, 4000 * BS);
    p.close().unwrap();
}

/// Blocks two snapshots share with each other and nothing else belong to
/// neither's exclusive size, yet deleting both frees them: the set's figure
/// counts them, and so does the pool's "held only by snapshots".
#[test]
fn deleting_a_set_frees_what_only_the_set_holds() {
    let (_d, p) = pool();
    p.create_volume("v", 1 << 30).unwrap();
    fill(&p, "v", 0..8, 1);
    p.create_snapshot("v", "s1", &[]).unwrap();
    fill(&p, "v", 100..103, 2); // in the volume and s2, not s1
    p.create_snapshot("v", "s2", &[]).unwrap();
    fill(&p, "v", 0..5, 3); // blocks 0-4 of s1 and s2 are now theirs alone
    fill(&p, "v", 100..101, 4); // block 100 of s2 is s2's alone
    let excl = |s: &str| p.usage("v", Some(s)).unwrap().exclusive_bytes;
    assert_eq!(excl("s1"), 0, "s1 shares everything with s2");
    assert_eq!(excl("s2"), BS, "block 100");
    let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let both = p.freed_by_deleting("v", &names(&["s1", "s2"])).unwrap();
    assert_eq!(both.data_bytes, 6 * BS, "blocks 0-4 and 100");
    assert_eq!(
        p.freed_by_deleting("v", &names(&["s2", "s1", "s2"]))
            .unwrap(),
        both,
        "order and repeats do not matter"
    );
    assert_eq!(
        p.freed_by_deleting("v", &names(&["s2"]))
            .unwrap()
            .data_bytes,
        BS
    );
    assert_eq!(p.snapshot_only().unwrap().data_bytes, 6 * BS);
    assert!(matches!(
        p.freed_by_deleting("v", &names(&["s1", "nope"])),
        Err(Error::SnapshotNotFound { .. })
    ));

    // A linked clone of s2 maps its blocks: they are no longer snapshot-only.
    p.clone_snapshot("v", "s2", "c").unwrap();
    assert_eq!(p.snapshot_only().unwrap().data_bytes, 0);
    assert_eq!(
        p.freed_by_deleting("v", &names(&["s1", "s2"]))
            .unwrap()
            .data_bytes,
        0
    );
    p.delete_volume("c", false).unwrap();

    // What was predicted is what goes.
    let predicted = p.freed_by_deleting("v", &names(&["s1", "s2"])).unwrap();
    assert_eq!(predicted.data_bytes, 6 * BS);
    p.reclaim_all().unwrap();
    let before = p.check().unwrap().tree_blocks();
    p.delete_snapshot("v", "s1").unwrap();
    p.delete_snapshot("v", "s2").unwrap();
    p.reclaim_all().unwrap();
    let after = p.check().unwrap().tree_blocks();
    assert_eq!(
        ((before.0 - after.0) * BS, (before.1 - after.1) * BS),
        (predicted.metadata_bytes, predicted.data_bytes)
    );
    assert_eq!(p.snapshot_only().unwrap(), lamina_engine::Freed::default());
    p.close().unwrap();
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let (_d, p) = pool();
    let long = "a".repeat(256);
    for bad in ["", "Upper", "-dash", "a b", "ü", long.as_str()] {
        let e = p.create_volume(bad, 1 << 20).unwrap_err();
        assert!(matches!(e, Error::InvalidName { .. }), "{bad:?}: {e}");
        assert!(
            e.to_string().contains("1 to 255 characters"),
            "the rule is in the message: {e}"
        );
    }
    p.create_volume(&"a".repeat(255), 1 << 20).unwrap();
    p.create_snapshot(&"a".repeat(255), &"s".repeat(255), &[])
        .unwrap();
    assert!(p.create_volume("zero", 0).is_err());
    assert!(p.create_volume("huge", u64::MAX).is_err());
    p.create_volume("v", 10_240).unwrap();
    assert!(matches!(
        p.create_volume("v", 10_240),
        Err(Error::VolumeExists(_))
    ));
    let v = p.open_volume("v").unwrap();
    assert!(matches!(
        v.write(10_239, &[1, 2]),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(
        v.write(u64::MAX, &[1]),
        Err(Error::OutOfRange { .. })
    ));
    let mut buf = [0u8; 2];
    assert!(matches!(
        v.read(u64::MAX - 1, &mut buf),
        Err(Error::OutOfRange { .. })
    ));
    v.write(9_998, &[1, 2]).unwrap(); // the last two bytes of an unaligned size
    v.read(9_998, &mut buf).unwrap();
    assert_eq!(buf, [1, 2]);
    assert!(p
        .create_snapshot("v", "s", &[("".into(), "x".into())])
        .is_err());
    assert!(p
        .create_snapshot("v", "s", &[("k".into(), "v".repeat(5000))])
        .is_err());
    p.create_snapshot("v", "s", &[]).unwrap();
    assert!(matches!(
        p.create_snapshot("v", "s", &[]),
        Err(Error::SnapshotExists { .. })
    ));
    let snap = p.open_snapshot("v", "s").unwrap();
    assert!(matches!(snap.write(0, &[1]), Err(Error::ReadOnly(_))));
    assert!(matches!(
        p.delete_snapshot("v", "nope"),
        Err(Error::SnapshotNotFound { .. })
    ));
    assert!(matches!(
        p.open_volume("nope"),
        Err(Error::VolumeNotFound(_))
    ));
    assert!(p.check().unwrap().is_ok());
}

#[test]
fn a_pool_is_opened_by_one_owner_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let opts = PoolOptions {
        background: false,
        ..PoolOptions::default()
    };
    let p = Pool::create_dir(dir.path(), opts.clone()).unwrap();
    let e = Pool::open_dir(dir.path(), opts.clone())
        .err()
        .expect("a second opener is refused");
    assert!(e.to_string().contains("in use by another process"), "{e}");
    p.close().unwrap();
    Pool::open_dir(dir.path(), opts).unwrap().close().unwrap();
}

/// Labels from pairs.
fn l(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn volume_labels_are_kept_replaced_and_survive_a_crash() {
    let (d, p) = pool();
    let v = p
        .create_volume_labelled("db", 1 << 20, &l(&[("tier", "gold"), ("app", "shop")]))
        .unwrap();
    assert_eq!(v.labels, l(&[("app", "shop"), ("tier", "gold")]), "sorted");
    p.create_volume("plain", 1 << 20).unwrap();
    // Bad labels change nothing.
    let too_long = "x".repeat(3000);
    assert!(p.set_volume_labels("db", &l(&[("k", &too_long)])).is_err());
    assert!(p
        .create_volume_labelled("other", 1 << 20, &l(&[("", "v")]))
        .is_err());
    assert!(p.volume_info_by_name("other").is_err());
    assert_eq!(p.volume_info_by_name("db").unwrap().labels, v.labels);
    p.set_volume_labels("db", &l(&[("tier", "silver")]))
        .unwrap();
    // Not closed: the reopened pool replays what was committed.
    drop(p);
    let p = Pool::open_dir(d.path(), PoolOptions::default()).unwrap();
    assert_eq!(
        p.volume_info_by_name("db").unwrap().labels,
        l(&[("tier", "silver")])
    );
    assert!(p.volume_info_by_name("plain").unwrap().labels.is_empty());
    p.set_volume_labels("db", &[]).unwrap();
    assert!(p.volume_info_by_name("db").unwrap().labels.is_empty());
    assert!(matches!(
        p.set_volume_labels("nope", &[]),
        Err(Error::VolumeNotFound(_))
    ));
}

#[test]
fn snapshot_labels_are_replaced_alone_and_survive_a_crash() {
    let (d, p) = pool();
    p.create_volume("v", 1 << 20).unwrap();
    fill(&p, "v", 0..2, 1);
    let s = p.create_snapshot("v", "s", &l(&[("a", "1")])).unwrap();
    // Bad labels, or an unknown snapshot or volume, change nothing.
    assert!(p
        .set_snapshot_labels("v", "s", &l(&[("k", &"x".repeat(3000))]))
        .is_err());
    assert!(p.set_snapshot_labels("v", "nope", &[]).is_err());
    assert!(p.set_snapshot_labels("nope", "s", &[]).is_err());
    assert_eq!(p.snapshot_info_by_name("v", "s").unwrap().labels, s.labels);
    let set = p
        .set_snapshot_labels("v", "s", &l(&[("z", "2"), ("b", "3")]))
        .unwrap();
    assert_eq!(set.labels, l(&[("b", "3"), ("z", "2")]), "sorted");
    // Not closed: the reopened pool replays what was committed. The rest
    // of the snapshot is as it was.
    drop(p);
    let p = Pool::open_dir(d.path(), PoolOptions::default()).unwrap();
    let again = p.snapshot_info_by_name("v", "s").unwrap();
    assert_eq!(again.labels, l(&[("b", "3"), ("z", "2")]));
    assert_eq!(
        (again.id, again.created, again.exclusive_bytes),
        (s.id, s.created, s.exclusive_bytes)
    );
    // A retired volume's snapshot, by `NAME@ID`.
    let vid = p.volume_info_by_name("v").unwrap().id;
    p.delete_volume("v", false).unwrap();
    let retired = format!("v@{vid}");
    p.set_snapshot_labels(&retired, "s", &[]).unwrap();
    assert!(p
        .snapshot_info_by_name(&retired, "s")
        .unwrap()
        .labels
        .is_empty());
    assert!(p.check().unwrap().is_ok());
}

#[test]
fn a_write_after_a_revert_and_the_delete_of_its_snapshot_updates_a_later_snapshots_size() {
    // v's tree is s1's after the revert; s2 shares blocks 2..8 with it.
    // Once s1 is gone, v's rewrite of block 5 leaves that block to s2
    // alone: s2's cached size must not outlive the write.
    let (_d, p) = pool();
    p.create_volume("v", 1 << 30).unwrap();
    fill(&p, "v", 0..8, 1);
    p.create_snapshot("v", "s1", &[]).unwrap();
    fill(&p, "v", 0..2, 2);
    p.create_snapshot("v", "s2", &[]).unwrap();
    p.revert_volume("v", "s1").unwrap();
    cached_exclusive_sizes_are_exact(&p);
    p.delete_snapshot("v", "s1").unwrap();
    cached_exclusive_sizes_are_exact(&p);
    fill(&p, "v", 5..6, 3);
    cached_exclusive_sizes_are_exact(&p);
    assert_eq!(
        p.snapshot_info_by_name("v", "s2").unwrap().exclusive_bytes,
        3 * BS,
        "s2 alone holds its two rewritten blocks and block 5"
    );
    // The same with a clone writing beside its origin.
    p.clone_snapshot("v", "s2", "c").unwrap();
    cached_exclusive_sizes_are_exact(&p);
    fill(&p, "c", 0..1, 4);
    fill(&p, "v", 1..2, 4);
    cached_exclusive_sizes_are_exact(&p);
}

fn read_block(p: &Pool, t: &Target, b: u64) -> u8 {
    let mut buf = [0u8; BLOCK];
    p.open_target(t).unwrap().read(b * BS, &mut buf).unwrap();
    assert!(
        buf.iter().all(|&x| x == buf[0]),
        "block {b} of {t:?} is uniform"
    );
    buf[0]
}

/// Deleting a volume with snapshots always succeeds: the volume is retired.
/// Its name is free at once, the data only it held is freed, and its
/// snapshots stay, listed under its old name and id, usable for restore,
/// linked and full clones, diff and export, as group members, across a
/// reopen; the record goes with its last snapshot and its last linked
/// clone. (docs/design.md, "Invariants", 13: retired volumes.)
#[test]
fn a_deleted_volumes_snapshots_stay_usable_and_its_name_is_free() {
    let (d, p) = pool();
    p.create_volume("v", 1 << 24).unwrap();
    p.create_volume("w", 1 << 20).unwrap();
    fill(&p, "v", 0..10, 1);
    p.create_snapshot("v", "s1", &[]).unwrap();
    fill(&p, "v", 0..4, 2);
    p.create_snapshot("v", "s2", &[]).unwrap();
    p.create_snapshot_group(&["v", "w"], "g", &[]).unwrap();
    // Five blocks only the live volume holds.
    fill(&p, "v", 40..45, 4);
    p.commit().unwrap();
    p.reclaim_all().unwrap();
    let before = p.check().unwrap();
    let id = p.volume_info_by_name("v").unwrap().id;

    p.delete_volume("v", false).unwrap();
    p.reclaim_all().unwrap();
    let after = p.check().unwrap();
    assert!(after.is_ok(), "{:?}", after.problems);
    assert_eq!(
        before.tree_blocks().1 - after.tree_blocks().1,
        5,
        "the data only the deleted volume held is freed, no more"
    );
    assert_eq!((after.volumes, after.retired_volumes), (1, 1));

    // The name is free at once; `NAME@ID` names the deleted one alone.
    p.create_volume("v", 1 << 20).unwrap();
    let old = format!("v@{id}");
    assert!(p.list_snapshots("v").unwrap().is_empty(), "the live v's");
    let snaps = p.list_snapshots(&old).unwrap();
    let names: Vec<&str> = snaps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["s1", "s2", "g"]);
    assert!(snaps
        .iter()
        .all(|s| s.volume == "v" && s.volume_id == id && s.volume_deleted));
    assert!(matches!(
        p.list_snapshots(&format!("w@{id}")),
        Err(Error::VolumeNotFound(_))
    ));

    // Restore: a linked and a full clone; diff and export; usage.
    p.clone_snapshot(&old, "s2", "restored").unwrap();
    let r = Target::volume("restored");
    assert_eq!((read_block(&p, &r, 0), read_block(&p, &r, 5)), (2, 1));
    p.full_clone(&old, "s1", "full", &mut |_, _| {}).unwrap();
    assert_eq!(read_block(&p, &Target::volume("full"), 0), 1);
    let (s1, s2) = (Target::snapshot(&old, "s1"), Target::snapshot(&old, "s2"));
    let changed = p.diff(Some(&s1), &s2).unwrap();
    assert_eq!(changed.len(), 1);
    assert_eq!((changed[0].offset, changed[0].len), (0, 4 * BS));
    let pieces = p.export(Some(&s1), &s2).unwrap().count();
    assert!(pieces >= 1);
    assert_eq!(p.usage(&old, Some("s1")).unwrap().exclusive_bytes, 4 * BS);
    // The group's members, the deleted volume's among them.
    let g = p.find_snapshots(Some("g"), None).unwrap();
    assert_eq!(g.len(), 2);
    assert_eq!(g.iter().filter(|s| s.volume_deleted).count(), 1);
    // Nothing writes to a deleted volume: no revert, no new snapshot.
    assert!(p.revert_volume(&old, "s1").is_err());
    assert!(p.create_snapshot(&old, "x", &[]).is_err());
    assert!(p.open_volume(&old).is_err());

    // Without a live v and with one retired v, the name alone reaches it;
    // with two retired, it is ambiguous and the error names both.
    p.create_snapshot("v", "t", &[]).unwrap();
    let id2 = p.volume_info_by_name("v").unwrap().id;
    p.delete_volume("v", false).unwrap();
    match p.list_snapshots("v") {
        Err(e @ Error::AmbiguousVolume { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains(&old) && text.contains(&format!("v@{id2}")),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    p.delete_snapshot(&format!("v@{id2}"), "t").unwrap();
    assert_eq!(
        p.list_snapshots("v").unwrap().len(),
        3,
        "one retired v left"
    );

    // All of it survives a reopen.
    p.close().unwrap();
    let p = Pool::open_dir(
        d.path(),
        PoolOptions {
            background: false,
            ..PoolOptions::default()
        },
    )
    .unwrap();
    assert_eq!(p.list_snapshots(&old).unwrap().len(), 3);
    assert_eq!(read_block(&p, &Target::snapshot(&old, "s1"), 9), 1);

    // The record goes with the last snapshot and the last linked clone.
    for s in ["s1", "s2", "g"] {
        p.delete_snapshot(&old, s).unwrap();
    }
    assert!(
        p.list_snapshots(&old).unwrap().is_empty(),
        "held by restored"
    );
    assert_eq!(p.stats().unwrap().retired_volumes, 1);
    assert!(p.check().unwrap().is_ok());
    p.delete_volume("restored", false).unwrap();
    assert!(matches!(
        p.list_snapshots(&old),
        Err(Error::VolumeNotFound(_))
    ));
    assert_eq!(p.stats().unwrap().retired_volumes, 0);
    p.reclaim_all().unwrap();
    let report = p.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}
