//! The store's records, migrations and failure latch, against real redb
//! files (and a real full file system).

use super::*;
use lamina_api::OperationKind;
use redb::Database;

fn rec(id: &str, op: Op) -> OpRec {
    OpRec {
        id: id.into(),
        op,
        state: OperationState::Running,
        started: "2026-01-01T00:00:00Z".into(),
        error: None,
        done_bytes: 0,
        total_bytes: 0,
        copy: None,
        reason: None,
    }
}

/// A tmpfs of its own, unmounted when dropped (the tests run as root).
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "mount: {out:?}");
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Take every free byte with a file outside the store; its path.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.path().join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0x55u8; 4096];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling: {e}"),
            }
        }
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// redb latches its first I/O error: the store reopens it once it can,
/// and then holds what its callers were told. A record whose write
/// failed is not there; an operation's end kept for the reopen is; a
/// done mark committed without a sync before the failure is too.
#[test]
fn a_store_broken_by_a_full_file_system_reopens_and_holds_what_was_answered() {
    let fs = Tmpfs::mount("2m");
    let path = fs.path().join("store.redb");
    let s = Store::open(&path).unwrap();
    // Records big enough to need new pages, each followed by a
    // snapshot's done mark (committed without a sync), until one
    // cannot be written.
    let big = |i: usize| {
        rec(
            &format!("op-{i:05}"),
            Op::CreateVolume {
                name: format!("v{i}"),
                size: 4096,
                labels: [("k".to_string(), "x".repeat(16 << 10))].into(),
                replicas: Vec::new(),
            },
        )
    };
    let done_mark = |i: usize| {
        let mut r = rec(
            &format!("op-{i:05}-s"),
            Op::CreateSnapshot {
                volume: "v".into(),
                name: format!("s{i}"),
                labels: Default::default(),
            },
        );
        r.state = OperationState::Succeeded;
        r
    };
    s.put_op(&big(0)).unwrap();
    let mut written = vec![big(0)];
    let filler = fs.fill();
    let mut failed = None;
    'fill: for i in 1..1000 {
        for r in [big(i), done_mark(i)] {
            match s.put_op(&r) {
                Ok(()) => written.push(r),
                Err(e) => {
                    failed = Some((r, e));
                    break 'fill;
                }
            }
        }
    }
    let (lost, e) = failed.expect("the file system fills up");
    assert!(matches!(e, ServerError::StoreUnavailable(_)), "{e}");
    assert!(e.to_string().contains("No space left"), "{e}");
    let mut end = written[0].clone();
    end.state = OperationState::Failed;
    end.error = Some("it failed".into());
    // The next write fails too, unless the store reopened in place.
    let kept = s.put_op_end(&end).unwrap();
    std::fs::remove_file(filler).unwrap();
    // Space is back: the next call reopens the store.
    s.check().unwrap();
    assert_eq!(s.op(&lost.id).unwrap(), None, "a failed write is undone");
    let state = |r: Option<OpRec>| r.map(|r| (r.state, r.error));
    assert_eq!(
        state(s.op(&end.id).unwrap()),
        state(Some(end.clone())),
        "the end kept for the reopen ({kept:?}) is written"
    );
    for r in &written[1..] {
        assert_eq!(s.op(&r.id).unwrap().as_ref(), Some(r));
    }
    s.put_op(&lost).unwrap();
    // All of it on disk.
    drop(s);
    let s = Store::open(&path).unwrap();
    assert_eq!(s.ops().unwrap().len(), written.len() + 1);
    assert_eq!(s.op(&end.id).unwrap(), Some(end));
    assert_eq!(s.op(&lost.id).unwrap(), Some(lost));
}

#[test]
fn records_round_trip_and_a_bad_one_is_named() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("store.redb");
    let s = Store::open(&path).unwrap();
    let r = rec(
        "op-1",
        Op::Clone {
            name: "x".into(),
            source: CloneSource::Volume {
                volume: "src".into(),
            },
            full: true,
        },
    );
    s.put_op(&r).unwrap();
    assert_eq!(s.op("op-1").unwrap(), Some(r.clone()));
    assert_eq!(r.op.kind(), OperationKind::FullClone);
    // A record that does not decode is an error naming it.
    s.put(
        OPERATIONS,
        "op-2",
        &serde_json::json!({"op": {"kind": "create-volume", "name": "v"}}),
    )
    .unwrap();
    let e = s.ops().unwrap_err().to_string();
    assert!(e.contains("op-2") && e.contains("size"), "{e}");
    drop(s);
    let e = Store::open(&path)
        .err()
        .expect("refuses to start")
        .to_string();
    assert!(
        e.contains("op-2") && e.contains("move this file aside"),
        "{e}"
    );
}

#[test]
fn a_format_1_store_is_migrated_when_opened() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("store.redb");
    {
        // What a daemon from before issue 9 left: no version, untyped records.
        let db = Database::create(&path).unwrap();
        let w = db.begin_write().unwrap();
        w.open_table(OPERATIONS)
            .unwrap()
            .insert(
                "op-1",
                r#"{"id":"op-1","kind":"create-volume","volume":"v","args":{"name":"v","size":4096},"state":"succeeded","done_bytes":0,"total_bytes":0,"started":"2026-01-01T00:00:00Z","error":null}"#,
            )
            .unwrap();
        w.commit().unwrap();
    }
    let s = Store::open(&path).unwrap();
    let ops = s.ops().unwrap();
    assert_eq!(
        ops[0].op,
        Op::CreateVolume {
            name: "v".into(),
            size: 4096,
            labels: Default::default(),
            replicas: Vec::new(),
        }
    );
    assert_eq!(ops[0].state, OperationState::Succeeded);
    let r = s.db.begin_read().unwrap();
    let v = r
        .open_table(META)
        .unwrap()
        .get(VERSION_KEY)
        .unwrap()
        .unwrap()
        .value();
    assert_eq!(v, RECORD_VERSION);
}

#[test]
fn a_format_2_store_is_read_as_it_is_and_a_group_record_round_trips() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("store.redb");
    let r = rec(
        "op-1",
        Op::CreateSnapshot {
            volume: "v".into(),
            name: "s".into(),
            labels: Default::default(),
        },
    );
    {
        let s = Store::open(&path).unwrap();
        s.put_op(&r).unwrap();
        let w = s.db.begin_write().unwrap();
        w.open_table(META).unwrap().insert(VERSION_KEY, 2).unwrap();
        w.commit().unwrap();
    }
    let s = Store::open(&path).unwrap();
    assert_eq!(s.ops().unwrap(), vec![r]);
    let v = s.db.begin_read().unwrap();
    let v = v.open_table(META).unwrap().get(VERSION_KEY).unwrap();
    assert_eq!(v.unwrap().value(), RECORD_VERSION);
    let g = rec(
        "op-2",
        Op::CreateSnapshotGroup {
            name: "g".into(),
            volumes: vec!["a".into(), "b".into()],
            labels: [("k".to_string(), "v".to_string())].into(),
        },
    );
    s.put_op(&g).unwrap();
    assert_eq!(s.op("op-2").unwrap(), Some(g.clone()));
    assert_eq!(g.op.kind(), OperationKind::CreateSnapshotGroup);
    assert_eq!((g.volume(), g.op.volumes()), ("a", vec!["a", "b"]));
}

#[test]
fn a_newer_format_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("store.redb");
    let s = Store::open(&path).unwrap();
    let w = s.db.begin_write().unwrap();
    w.open_table(META).unwrap().insert(VERSION_KEY, 99).unwrap();
    w.commit().unwrap();
    drop(s);
    let e = Store::open(&path).err().unwrap().to_string();
    assert!(e.contains("newer lamina"), "{e}");
}
