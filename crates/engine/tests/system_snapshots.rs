//! The rules the engine owns for system snapshots, clones and sizes
//! (issue 9's wrong-data defects): a system snapshot never collides with,
//! reuses or deletes a user's; it goes when nothing needs it; a volume with
//! linked clones cannot be deleted; sizes are whole sectors; a copy resumes
//! from its last durable offset.

mod common;

use common::pool;
use lamina_engine::{
    CloneState, CopyControl, CopyEnd, CopyProgress, Error, Pool, Target, BLOCK, SECTOR,
};

fn write(p: &Pool, vol: &str, at: u64, data: &[u8]) {
    let v = p.open_volume(vol).unwrap();
    v.write(at, data).unwrap();
    v.flush().unwrap();
}

fn read(p: &Pool, vol: &str, at: u64, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    p.open_volume(vol).unwrap().read(at, &mut buf).unwrap();
    buf
}

fn snapshot_names(p: &Pool, vol: &str) -> Vec<(String, bool)> {
    p.list_snapshots(vol)
        .unwrap()
        .into_iter()
        .map(|s| (s.name, s.system))
        .collect()
}

#[test]
fn a_clone_of_a_volume_takes_the_volume_as_it_is_and_leaves_user_snapshots_alone() {
    let (_d, p) = pool();
    p.create_volume("src", 1 << 20).unwrap();
    write(&p, "src", 0, b"OLD");
    // A user snapshot with the name the old code gave system snapshots.
    p.create_snapshot("src", "clone-x", &[]).unwrap();
    write(&p, "src", 0, b"NEW");
    let x = p.clone_volume("src", "x").unwrap();
    assert_eq!(read(&p, "x", 0, 3), b"NEW", "the clone is the volume now");
    assert_eq!(x.clone_state, CloneState::Linked);
    let snaps = snapshot_names(&p, "src");
    assert_eq!(snaps.len(), 2, "{snaps:?}");
    assert!(snaps.contains(&("clone-x".into(), false)));
    let (sys, _) = snaps.iter().find(|(_, s)| *s).unwrap();
    assert!(
        sys.starts_with('.'),
        "system names are outside the user rule: {sys}"
    );
    assert!(lamina_engine::check_name(sys).is_err());
    assert_eq!(x.origin.unwrap().snapshot.as_deref(), Some(sys.as_str()));

    // Deleting the clone deletes its system snapshot, not the user's.
    p.delete_volume("x", false).unwrap();
    assert_eq!(snapshot_names(&p, "src"), vec![("clone-x".into(), false)]);
    assert_eq!(read(&p, "src", 0, 3), b"NEW");
    // A second clone of the same name takes a fresh snapshot.
    write(&p, "src", 0, b"3RD");
    p.clone_volume("src", "x").unwrap();
    assert_eq!(read(&p, "x", 0, 3), b"3RD");
    assert!(p.check().unwrap().is_ok());
}

#[test]
fn system_snapshots_go_when_nothing_needs_them() {
    let (_d, p) = pool();
    p.create_volume("src", 1 << 20).unwrap();
    write(&p, "src", 0, &[7; BLOCK]);
    // Two linked clones of one user snapshot, one clone of the volume.
    p.create_snapshot("src", "s", &[]).unwrap();
    p.clone_snapshot("src", "s", "a").unwrap();
    p.clone_volume("src", "b").unwrap();
    assert_eq!(p.unneeded_system_snapshots(), vec![]);
    // A system snapshot for a full copy is the caller's to delete; until
    // then it is listed as needed by no clone.
    let full = p.create_system_snapshot("src", "f").unwrap();
    assert!(full.system && full.name.starts_with(".clone-") && full.name.ends_with("-f"));
    assert_eq!(
        p.unneeded_system_snapshots(),
        vec![("src".to_string(), full.name.clone())]
    );
    // The system path refuses to delete a user's snapshot.
    assert!(matches!(
        p.delete_system_snapshot("src", "s"),
        Err(Error::Conflict(_))
    ));
    p.delete_system_snapshot("src", &full.name).unwrap();
    // Flattening b ends its need of its snapshot: it goes.
    p.flatten("b").unwrap();
    assert_eq!(snapshot_names(&p, "src"), vec![("s".into(), false)]);
    // Deleting a does not touch the user's snapshot.
    p.delete_volume("a", false).unwrap();
    assert_eq!(snapshot_names(&p, "src"), vec![("s".into(), false)]);
    p.delete_volume("src", true).unwrap();
    assert_eq!(read(&p, "b", 0, BLOCK), vec![7; BLOCK]);
    p.reclaim_all().unwrap();
    assert!(p.check().unwrap().is_ok());
}

#[test]
fn sizes_are_whole_sectors() {
    let (_d, p) = pool();
    let e = p.create_volume("v", 1000).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)));
    assert!(e.to_string().contains("1024 would be"), "{e}");
    let e = p.create_volume("v", 0).unwrap_err();
    assert!(e.to_string().contains("at least 512"), "{e}");
    let e = p.create_volume("v", u64::MAX).unwrap_err();
    assert!(e.to_string().contains("64 PiB"), "{e}");
    assert!(p.list_volumes().is_empty(), "nothing was made");
    p.create_volume("v", 3 * SECTOR).unwrap();
    assert!(p.expand_volume("v", 4 * SECTOR + 1).is_err());
    let e = p.expand_volume("v", 2 * SECTOR).unwrap_err();
    assert!(e.to_string().contains("shrinking"), "{e}");
    assert_eq!(p.expand_volume("v", 8 * SECTOR).unwrap().size, 8 * SECTOR);
    assert_eq!(lamina_engine::round_up_size(1), SECTOR);
    assert_eq!(lamina_engine::round_up_size(1025), 3 * SECTOR);
}

/// Stops a copy after its first durable checkpoint, remembering it.
struct StopAfterFirst(Option<CopyProgress>);

impl CopyControl for StopAfterFirst {
    fn durable(&mut self, p: &CopyProgress) -> bool {
        self.0 = Some(*p);
        false
    }
}

#[test]
fn a_copy_resumes_from_its_last_durable_offset() {
    let (_d, p) = pool();
    p.create_volume("src", 64 << 20).unwrap();
    let v = p.open_volume("src").unwrap();
    for i in 0..40u64 {
        // 40 extents of 256 KiB with holes between them.
        v.write(i * (1 << 20), &vec![i as u8 + 1; 256 << 10])
            .unwrap();
    }
    v.flush().unwrap();
    p.create_snapshot("src", "s", &[]).unwrap();
    p.create_volume("dst", 64 << 20).unwrap();
    let src = Target::snapshot("src", "s");
    let mut ctl = StopAfterFirst(None);
    let end = p.copy_into(&src, "dst", 0, 1 << 20, &mut ctl).unwrap();
    let first = ctl.0.expect("a durable checkpoint");
    assert_eq!(end, CopyEnd::Stopped(first));
    assert!(first.resume_offset > 0 && first.done_bytes < first.total_bytes);
    assert_eq!(first.total_bytes, 40 * (256 << 10));

    // Resume: what was durable is not copied again, the rest is.
    struct Count(u64, u64);
    impl CopyControl for Count {
        fn progress(&mut self, p: &CopyProgress) {
            self.0 = p.done_bytes;
            self.1 = p.total_bytes;
        }
    }
    let mut c = Count(0, 0);
    let end = p
        .copy_into(&src, "dst", first.resume_offset, 1 << 20, &mut c)
        .unwrap();
    assert!(matches!(end, CopyEnd::Done(d) if d.done_bytes == d.total_bytes));
    assert_eq!((c.0, c.1), (first.total_bytes, first.total_bytes));
    let (mut a, mut b) = (vec![0u8; 64 << 20], vec![0u8; 64 << 20]);
    p.open_snapshot("src", "s")
        .unwrap()
        .read(0, &mut a)
        .unwrap();
    p.open_volume("dst").unwrap().read(0, &mut b).unwrap();
    assert!(a == b, "the resumed copy equals its source");
    // A destination too small is refused before anything is written.
    p.create_volume("small", 1 << 20).unwrap();
    assert!(matches!(
        p.copy_into(&src, "small", 0, 1 << 20, &mut Count(0, 0)),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(p.usage("small", None).unwrap().allocated_bytes, 0);
}

/// A clone of an empty volume shares no block with it (its origin's tree
/// is empty), yet its system snapshot must still go with it; and a system
/// snapshot no clone needs never holds its volume back.
#[test]
fn the_system_snapshot_of_a_clone_of_an_empty_volume_goes_with_the_clone() {
    let (_d, p) = pool();
    p.create_volume("empty", 1 << 20).unwrap();
    p.clone_volume("empty", "c").unwrap();
    assert_eq!(snapshot_names(&p, "empty").len(), 1);
    p.delete_volume("c", false).unwrap();
    assert_eq!(snapshot_names(&p, "empty"), vec![]);

    // Left behind (as by a crash between a clone's end and the snapshot's
    // deletion): it goes with the volume, a user's stays (the volume is
    // retired) and goes when deleted.
    p.create_system_snapshot("empty", "gone").unwrap();
    p.create_snapshot("empty", "mine", &[]).unwrap();
    p.delete_volume("empty", false).unwrap();
    assert!(p.list_volumes().is_empty());
    let left = p.list_all_snapshots().unwrap();
    assert!(left.len() == 1 && left[0].name == "mine" && left[0].volume_deleted);
    p.delete_snapshot("empty", "mine").unwrap();
    assert_eq!(p.stats().unwrap().retired_volumes, 0);
    p.check().map(|r| assert!(r.is_ok(), "{r:?}")).unwrap();
}
