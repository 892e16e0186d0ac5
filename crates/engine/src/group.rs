//! Group snapshots: one snapshot of each of several volumes, all taken at
//! one instant in one metadata transaction, so that the group is
//! crash-consistent across the volumes (an application whose writes span
//! them, a database and its log, finds in the group a state it could have
//! crashed in). The reasoning is in docs/design.md ("Group snapshots").
//!
//! How: the data file is synced while writers still run; then the gates of
//! all the volumes are taken exclusively, in ascending volume id (so two
//! groups that share volumes never wait on each other in a cycle, and a
//! single-volume operation, which holds one gate, never waits while holding
//! another); with every gate held no write is in flight on any of them, and
//! every member shares its volume's root in memory. The gates are let go
//! before the commit, as for one snapshot: writers wait for the same short
//! metadata step, whatever the number of volumes.

use crate::error::{Error, Result};
use crate::format::{check_labels, check_name, SnapshotRec};
use crate::ops::SnapshotInfo;
use crate::pool::{now_ns, Pool};

/// The label every member of a group snapshot carries; its value is the
/// group's name (which is also every member's name).
pub const GROUP_LABEL: &str = "lamina.io/group";

impl Pool {
    /// Take a snapshot named `name` of every volume in `volumes` at one
    /// instant, in one transaction: all of them are made or none is. Each
    /// member carries `labels` plus [`GROUP_LABEL`]`=name`, and all share
    /// one creation time. Refused, with nothing changed: an empty list, a
    /// volume named twice, a missing volume, a snapshot `name` already on
    /// any of them, a bad name or labels (a label `GROUP_LABEL` among them
    /// too). Returns the members in the order of `volumes`.
    pub fn create_snapshot_group(
        &self,
        volumes: &[&str],
        name: &str,
        labels: &[(String, String)],
    ) -> Result<Vec<SnapshotInfo>> {
        check_name(name)?;
        if volumes.is_empty() {
            return Err(Error::InvalidArgument(
                "a group snapshot needs at least one volume".into(),
            ));
        }
        if labels.iter().any(|(k, _)| k == GROUP_LABEL) {
            return Err(Error::InvalidArgument(format!(
                "the label {GROUP_LABEL:?} is the group's own: it cannot be given"
            )));
        }
        let mut all = vec![(GROUP_LABEL.to_string(), name.to_string())];
        all.extend_from_slice(labels);
        check_labels(&all)?;
        let mut sorted = volumes.to_vec();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::InvalidArgument(format!(
                "volume {:?} is named twice in the group",
                w[0]
            )));
        }
        // Resolve and check before syncing: a refusal costs no I/O.
        let mut ids = {
            let m = self.lock_meta();
            let mut ids = Vec::with_capacity(volumes.len());
            for (i, v) in volumes.iter().enumerate() {
                let id = m.catalog.volume_id(v)?;
                if m.catalog.has_snapshot(id, name) {
                    return Err(Error::SnapshotExists {
                        volume: v.to_string(),
                        snapshot: name.to_string(),
                    });
                }
                ids.push((id, i));
            }
            ids
        };
        ids.sort_unstable();
        // As for one snapshot, the commit's sync is the only one (see
        // `Pool::snapshot_then`).
        let gates: Vec<_> = ids.iter().map(|&(id, _)| (self.gate(id), id)).collect();
        let held: Vec<_> = gates
            .iter()
            .map(|(g, id)| crate::order::gate_exclusive(g, *id))
            .collect();
        let out = self.with_meta(|m| {
            // A volume deleted (and maybe made again) since it was resolved.
            for &(id, i) in &ids {
                if m.catalog.volume_id(volumes[i])? != id {
                    return Err(Error::VolumeNotFound(volumes[i].to_string()));
                }
            }
            let created = now_ns();
            let mut made: Vec<(usize, SnapshotRec)> = Vec::with_capacity(ids.len());
            for &(id, i) in &ids {
                let r = Self::new_snapshot(m, id, name.to_string(), &all, false, created);
                #[cfg(test)]
                let r = match r {
                    Ok(rec) if tests::fail_now(made.len()) => {
                        made.push((i, rec));
                        Err(tests::injected())
                    }
                    r => r,
                };
                match r {
                    Ok(rec) => made.push((i, rec)),
                    Err(e) => {
                        for (_, rec) in made.iter().rev() {
                            Self::undo_snapshot(m, rec)?;
                        }
                        return Err(e);
                    }
                }
            }
            made.sort_unstable_by_key(|(i, _)| *i);
            let links = crate::ops::Links::default();
            // Each shares its root with its volume: nothing is its own yet.
            Ok(made
                .iter()
                .map(|(_, rec)| self.snapshot_info(m, rec, &links, 0))
                .collect::<Vec<_>>())
        });
        // Every member shares its volume's root: writes from here on copy
        // first, so writers may go on while the commit makes them durable.
        drop(held);
        let out = out?;
        self.commit()?;
        tracing::info!(
            group = name,
            volumes = volumes.len(),
            "group snapshot taken"
        );
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PoolOptions;
    use std::cell::Cell;

    thread_local! {
        /// Fail the group as member number N (from 0) is made (tests only):
    /// the member is made and then reported failed, so the undo of a
    /// member that exists is tested too.
        static FAIL_AT: Cell<Option<usize>> = const { Cell::new(None) };
    }

    pub(super) fn fail_now(made: usize) -> bool {
        FAIL_AT.with(|f| f.get()) == Some(made)
    }

    pub(super) fn injected() -> Error {
        Error::NoSpace {
            path: "test".into(),
            detail: "injected after a group member was made".into(),
        }
    }

    fn pool() -> (tempfile::TempDir, Pool) {
        let d = tempfile::tempdir().unwrap();
        let p = Pool::create_dir(
            d.path(),
            PoolOptions {
                background: false,
                ..PoolOptions::default()
            },
        )
        .unwrap();
        (d, p)
    }

    /// A failure after some members were made in memory takes them back:
    /// nothing of the group is left, in memory or after a reopen, and the
    /// volumes' lineage is as it was.
    #[test]
    fn a_failure_part_way_leaves_no_member() {
        let (d, p) = pool();
        for v in ["a", "b", "c"] {
            p.create_volume(v, 1 << 20).unwrap();
            p.open_volume(v).unwrap().write(0, &[7; 4096]).unwrap();
            p.create_snapshot(v, "before", &[]).unwrap();
        }
        let before = p.list_volumes();
        let stats = p.stats().unwrap();
        for at in 0..3 {
            FAIL_AT.with(|f| f.set(Some(at)));
            let e = p.create_snapshot_group(&["c", "a", "b"], "g", &[]);
            FAIL_AT.with(|f| f.set(None));
            assert!(e.unwrap_err().is_no_space());
            assert!(p.failure().is_none(), "an undone group latches nothing");
            assert_eq!(p.list_all_snapshots().unwrap().len(), 3);
            assert_eq!(p.list_volumes(), before);
        }
        p.commit().unwrap();
        assert_eq!(p.stats().unwrap().snapshots, stats.snapshots);
        let report = p.check().unwrap();
        assert!(report.is_ok(), "{:?}", report.problems);
        p.close().unwrap();
        let p = Pool::open_dir(d.path(), PoolOptions::default()).unwrap();
        assert_eq!(p.list_all_snapshots().unwrap().len(), 3);
        assert!(p.check().unwrap().is_ok());
        // And the group can be taken afterwards.
        let g = p.create_snapshot_group(&["c", "a", "b"], "g", &[]).unwrap();
        let vols: Vec<&str> = g.iter().map(|s| s.volume.as_str()).collect();
        assert_eq!(vols, ["c", "a", "b"]);
        assert!(g.iter().all(|s| s.parent.as_deref() == Some("before")));
    }
}
