//! Replicated volumes' records, kept by the daemon that runs the volume's
//! front end (docs/replicas.md): which nodes hold a replica, which of them
//! are healthy (hold every acknowledged write), and the generation the
//! front end last took. Table `replica_sets`: volume name → [`ReplicaSetRec`]
//! (JSON). Every change is one write transaction, durable when it returns:
//! a replica is recorded faulted before any write it missed is
//! acknowledged, and a generation is taken before any replica is opened
//! at it.
//!
//! Where a [`SharedRecord`] is given (under Kubernetes: the Volume
//! resource's status in the API server), a change of what a record shows
//! is made there first, and here only once it was: a change it refuses
//! (another front end holds the volume) or cannot make (the API server out
//! of reach) changes nothing here either.

use super::db::Fail;
use super::Store;
use crate::error::ServerError;
pub use crate::shared::{SharedRecord, SharedRecordError, SharedSet};
use redb::{ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

const SETS: TableDefinition<&str, &str> = TableDefinition::new("replica_sets");

/// A volume has at most this many replicas, this node's included.
pub const MAX_REPLICAS: usize = 3;

/// A replicated volume as recorded.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReplicaSetRec {
    /// The pool's id of the local volume: a record of a volume deleted and
    /// made again under its name is not this one's. 0 for a front end
    /// that holds no replica (`diskless`).
    pub volume_id: u64,
    /// The last generation a front end took (0: none yet).
    pub generation: u64,
    /// In order, this node's first (none on this node when `diskless`).
    pub replicas: Vec<ReplicaRec>,
    /// This node holds no replica: its front end reaches every replica
    /// over a replica session (record format 8; docs/replicas.md, "A front
    /// end with no replica").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub diskless: bool,
    /// The volume's size, kept for a `diskless` front end (no local volume
    /// says it); 0 until its first front end opened.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub size: u64,
    /// Regions (of `lamina_replica::REGION` bytes, by index) where the
    /// healthy replicas may differ: written, and no flush covered it yet
    /// (the write intent, lamina-replica's rule 14). Sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dirty: Vec<u64>,
}

/// One replica as recorded.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReplicaRec {
    pub node: String,
    /// Its node's transfer listener, `HOST:PORT`; empty for this node's.
    pub address: String,
    /// Why it was faulted; none while healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub faulted: Option<String>,
    /// Since when it is in its state (Unix seconds).
    pub since: i64,
    /// The generation of the front end that keeps what this replica missed
    /// since its fault (the one that recorded it); 0 for none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tracked: u64,
    /// Faulted while no front end served the volume (its snapshot failed
    /// while the volume was detached): it held every write until then,
    /// but for the regions left dirty. The next front end tracks it from
    /// its start, as one it could not reach then.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held_all: bool,
    /// Where its rebuild stands, once it has a base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuild: Option<RebuildRec>,
    /// Snapshots of the volume taken without it, oldest first: it gets
    /// each, with its data, before it counts as healthy again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missed_snapshots: Vec<String>,
    /// Snapshots deleted while it was out, that it still holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_deletes: Vec<String>,
    /// Its last rebuild that ended healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rebuild: Option<LastRebuild>,
    /// This node's replica, out of the healthy set (record format 7): the
    /// regions (of `lamina_replica::REGION` bytes, by index, sorted) where
    /// it may lack changes, as lamina-replica's rule 16 records them (those
    /// at risk at its fault, and each one a change went to since, recorded
    /// before the change was sent): every change it may lack, whichever
    /// front end sent it, so a front end that opens after a crash copies
    /// only those, not the volume. None: not kept
    /// (healthy, another node's, or faulted before format 7); emptied when
    /// it is healthy again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missed_regions: Option<Vec<u64>>,
}

/// A rebuild that ended: bytes of data sent, when it began and ended
/// (Unix seconds).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct LastRebuild {
    pub sent: u64,
    pub started: i64,
    pub ended: i64,
}

/// Regions `new` added to sorted list `to`, once each.
fn add(to: &mut Vec<u64>, new: &[u64]) {
    to.extend_from_slice(new);
    to.sort_unstable();
    to.dedup();
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A faulted replica's rebuild (docs/replicas.md, "Rebuilds").
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RebuildRec {
    /// A snapshot of this node's replica that the faulted replica's volume
    /// equals outside `uncertain`.
    pub base: String,
    /// Ranges `[start, end)` where it may differ from `base`, sorted and
    /// apart.
    pub uncertain: Vec<(u64, u64)>,
    /// Ranges it answered that no flush covered at its fault, sorted and
    /// apart: it holds them unless its node lost what it had not made
    /// durable. Settled when it next answers, before any round: at
    /// `instance` (its volume's instance when it failed), a flush makes
    /// them durable and they are dropped; else they join `uncertain`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unflushed: Vec<(u64, u64)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<u64>,
    /// The round under way: the snapshot it brings the replica to, and
    /// where it got (everything it sends below `cursor` was sent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<RoundRec>,
    /// Bytes sent to the replica since the rebuild began.
    pub sent: u64,
    /// When it began (Unix seconds).
    pub started: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RoundRec {
    pub target: String,
    pub cursor: u64,
    /// Bytes the round sends in all, and of them sent.
    pub bytes: u64,
    pub done: u64,
}

fn parse(volume: &str, json: &str) -> Result<ReplicaSetRec, Fail> {
    serde_json::from_str(json).map_err(|e| {
        Fail::other(ServerError::record(format!(
            "replica set of volume {volume}"
        ))(e))
    })
}

/// What a replica set's record shows (`volume get`): all of it but the
/// regions of rules 14 and 16, which change with the writes.
fn shown(rec: &ReplicaSetRec) -> ReplicaSetRec {
    let mut r = rec.clone();
    r.dirty.clear();
    for x in &mut r.replicas {
        x.missed_regions = None;
    }
    r
}

impl Store {
    /// Call `f` after each change of a replica set's record that shows
    /// (made, removed, or changed other than in its regions); once only.
    pub fn on_replica_set_change(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.replica_set_changed.set(f);
    }

    fn replica_set_changed(&self) {
        if let Some(f) = self.replica_set_changed.get() {
            f();
        }
    }

    /// Volume `volume`'s replica set, if it is replicated.
    pub fn replica_set(&self, volume: &str) -> Result<Option<ReplicaSetRec>, ServerError> {
        self.db.read(|r| {
            let t = match r.open_table(SETS) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            let found = t.get(volume)?;
            found.map(|v| parse(volume, v.value())).transpose()
        })
    }

    /// Every replica set, by volume.
    pub fn replica_sets(&self) -> Result<Vec<(String, ReplicaSetRec)>, ServerError> {
        self.db.read(|r| {
            let t = match r.open_table(SETS) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            };
            let mut out = Vec::new();
            for e in t.iter()? {
                let (k, v) = e?;
                out.push((k.value().to_string(), parse(k.value(), v.value())?));
            }
            Ok(out)
        })
    }

    /// Have changes of what replica sets show recorded in `shared` first,
    /// as node `node`'s (this daemon's); once only.
    pub fn share_replica_sets(&self, shared: std::sync::Arc<dyn SharedRecord>, node: String) {
        let _ = self.shared.set((shared, node));
    }

    /// The shared record and this node's name, if replica sets are shared.
    pub fn shared(&self) -> Option<(std::sync::Arc<dyn SharedRecord>, String)> {
        self.shared.get().cloned()
    }

    /// The lock that orders volume `volume`'s changes: each reads the
    /// record, records it shared, then here.
    fn replica_set_lock(&self, volume: &str) -> std::sync::Arc<std::sync::Mutex<()>> {
        let mut locks = self
            .replica_set_locks
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        locks.entry(volume.to_string()).or_default().clone()
    }

    /// `before` → `after` recorded in the shared record, if there is one
    /// and it shows a change.
    fn share(
        &self,
        volume: &str,
        before: Option<&ReplicaSetRec>,
        after: Option<&ReplicaSetRec>,
    ) -> Result<(), ServerError> {
        let Some((shared, node)) = self.shared.get() else {
            return Ok(());
        };
        let set = |r: &ReplicaSetRec| SharedSet {
            front_end: node.clone(),
            generation: r.generation,
            diskless: r.diskless,
            replicas: r
                .replicas
                .iter()
                .map(|x| (x.node.clone(), x.faulted.clone()))
                .collect(),
        };
        let (b, a) = (before.map(set), after.map(set));
        if b == a {
            return Ok(());
        }
        shared
            .record(node, volume, a.as_ref())
            .map_err(|e| ServerError::Shared {
                volume: volume.to_string(),
                source: e,
            })
    }

    /// Record `rec` as volume `volume`'s replica set (replacing any).
    pub fn put_replica_set(&self, volume: &str, rec: &ReplicaSetRec) -> Result<(), ServerError> {
        let lock = self.replica_set_lock(volume);
        let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
        let before = self.replica_set(volume)?;
        self.share(volume, before.as_ref(), Some(rec))?;
        let json = serde_json::to_string(rec)?;
        self.db.commit(|w| {
            w.open_table(SETS)?.insert(volume, json.as_str())?;
            Ok(())
        })?;
        self.replica_set_changed();
        Ok(())
    }

    /// Forget volume `volume`'s replica set; whether there was one.
    pub fn remove_replica_set(&self, volume: &str) -> Result<bool, ServerError> {
        let lock = self.replica_set_lock(volume);
        let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
        let Some(before) = self.replica_set(volume)? else {
            return Ok(false);
        };
        self.share(volume, Some(&before), None)?;
        self.remove_here(volume)
    }

    /// Forget volume `volume`'s replica set here only, not in the shared
    /// record: this node's front end was taken over, and the record there
    /// is the new front end's (docs/replicas.md, "Taking a volume over").
    pub fn forget_replica_set(&self, volume: &str) -> Result<bool, ServerError> {
        let lock = self.replica_set_lock(volume);
        let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
        self.remove_here(volume)
    }

    /// Volume `volume`'s record removed from the store (its lock held);
    /// whether there was one.
    fn remove_here(&self, volume: &str) -> Result<bool, ServerError> {
        let mut existed = false;
        self.db.commit(|w| {
            existed = w.open_table(SETS)?.remove(volume)?.is_some();
            Ok(())
        })?;
        if existed {
            self.replica_set_changed();
        }
        Ok(existed)
    }

    /// Change volume `volume`'s replica set with `f`: recorded shared
    /// first if that shows, then here in one write transaction; the set as
    /// written. A volume with none is an error, and so is a shared record
    /// that refused it or could not be written: nothing changed then.
    fn change_replica_set(
        &self,
        volume: &str,
        f: impl FnOnce(&mut ReplicaSetRec),
    ) -> Result<ReplicaSetRec, ServerError> {
        let lock = self.replica_set_lock(volume);
        let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
        let Some(before) = self.replica_set(volume)? else {
            return Err(ServerError::Config(format!(
                "volume {volume} has no replica set"
            )));
        };
        let mut rec = before.clone();
        f(&mut rec);
        let moved = shown(&rec) != shown(&before);
        if moved {
            self.share(volume, Some(&before), Some(&rec))?;
        }
        let json = serde_json::to_string(&rec)?;
        self.db.commit(|w| {
            w.open_table(SETS)?.insert(volume, json.as_str())?;
            Ok(())
        })?;
        if moved {
            self.replica_set_changed();
        }
        Ok(rec)
    }

    /// Record the size of volume `volume`, fronted here with no local
    /// replica to say it (`ReplicaSetRec::size`).
    pub fn set_replica_set_size(&self, volume: &str, size: u64) -> Result<(), ServerError> {
        self.change_replica_set(volume, |r| r.size = size)
            .map(|_| ())
    }

    /// Record regions `regions` of volume `volume` dirty (or clean):
    /// durable when it returns.
    pub fn mark_regions(
        &self,
        volume: &str,
        regions: &[u64],
        dirty: bool,
    ) -> Result<(), ServerError> {
        self.change_replica_set(volume, |r| {
            let mut all: std::collections::BTreeSet<u64> = r.dirty.iter().copied().collect();
            for x in regions {
                if dirty {
                    all.insert(*x);
                } else {
                    all.remove(x);
                }
            }
            r.dirty = all.into_iter().collect();
        })
        .map(|_| ())
    }

    /// Record that replica `node` of volume `volume` may lack changes in
    /// regions `regions` (lamina-replica's rule 16): durable when it
    /// returns.
    pub fn missed_regions(
        &self,
        volume: &str,
        node: &str,
        regions: &[u64],
    ) -> Result<(), ServerError> {
        self.change_replica(volume, node, |x| {
            add(x.missed_regions.get_or_insert_with(Vec::new), regions)
        })
        .map(|_| ())
    }

    /// Take the next generation of volume `volume`'s front end: durable
    /// when it returns.
    /// The next generation, taken by a front end that opens: the set, and
    /// the replicas faulted while no front end served that it tracks from
    /// now on (`held_all`: their `tracked` is the new generation, in the
    /// same transaction).
    pub fn next_replica_generation(
        &self,
        volume: &str,
    ) -> Result<(ReplicaSetRec, Vec<String>), ServerError> {
        let mut held = Vec::new();
        let set = self.change_replica_set(volume, |r| {
            r.generation += 1;
            held.clear();
            for x in r.replicas.iter_mut().filter(|x| x.held_all) {
                x.held_all = false;
                x.tracked = r.generation;
                held.push(x.node.clone());
            }
        })?;
        Ok((set, held))
    }

    /// [`Store::fault_replica`] for a replica faulted while no front end
    /// serves the volume: it held every write until then (`held_all`).
    pub fn fault_detached_replica(
        &self,
        volume: &str,
        node: &str,
        reason: &str,
        now: i64,
    ) -> Result<ReplicaSetRec, ServerError> {
        self.fault(volume, node, reason, now, true, &[])
    }

    /// Record replica `node` of volume `volume` faulted for `reason` (at
    /// `now`, Unix seconds), unless it is already, and, for this node's
    /// replica, that it may lack changes in regions `at_risk`
    /// (lamina-replica's rule 16): durable when it returns.
    pub fn fault_replica(
        &self,
        volume: &str,
        node: &str,
        reason: &str,
        now: i64,
        at_risk: &[u64],
    ) -> Result<ReplicaSetRec, ServerError> {
        self.fault(volume, node, reason, now, false, at_risk)
    }

    /// Replica `node` faulted, unless it is already: tracked by the front
    /// end of the set's generation, or (`detached`) held every write.
    fn fault(
        &self,
        volume: &str,
        node: &str,
        reason: &str,
        now: i64,
        detached: bool,
        at_risk: &[u64],
    ) -> Result<ReplicaSetRec, ServerError> {
        self.change_replica_set(volume, |r| {
            let g = r.generation;
            if let Some(x) = r.replicas.iter_mut().find(|x| x.node == node) {
                if x.faulted.is_none() {
                    x.faulted = Some(reason.to_string());
                    x.since = now;
                    // This node's: no base snapshot can stand for what it
                    // holds, so the regions it may lack are kept instead.
                    if x.address.is_empty() {
                        x.missed_regions.get_or_insert_with(Vec::new);
                    }
                    if detached {
                        x.held_all = true;
                    } else {
                        x.tracked = g;
                    }
                }
                if let Some(m) = x.missed_regions.as_mut() {
                    add(m, at_risk);
                }
            }
        })
    }

    /// Change replica `node` of volume `volume` with `f`, in one write
    /// transaction: durable when it returns. An unknown replica is an
    /// error, and nothing changes.
    pub fn change_replica(
        &self,
        volume: &str,
        node: &str,
        f: impl FnOnce(&mut ReplicaRec),
    ) -> Result<ReplicaSetRec, ServerError> {
        let mut found = true;
        let rec = self.change_replica_set(volume, |r| {
            match r.replicas.iter_mut().find(|x| x.node == node) {
                Some(x) => f(x),
                None => found = false,
            }
        })?;
        if !found {
            return Err(ServerError::Config(format!(
                "volume {volume} has no replica on node {node}"
            )));
        }
        Ok(rec)
    }

    /// Add replica `rec` to volume `volume`'s replica set, last (at most
    /// [`MAX_REPLICAS`] in all, each node once): durable when it returns.
    /// Asked again for a node it holds, it changes nothing.
    pub fn add_replica(&self, volume: &str, rec: ReplicaRec) -> Result<ReplicaSetRec, ServerError> {
        let mut full = false;
        let set = self.change_replica_set(volume, |r| {
            if r.replicas.iter().any(|x| x.node == rec.node) {
                return;
            }
            if r.replicas.len() >= MAX_REPLICAS {
                full = true;
                return;
            }
            r.replicas.push(rec);
        })?;
        if full {
            return Err(ServerError::Config(format!(
                "volume {volume} has {MAX_REPLICAS} replicas already"
            )));
        }
        Ok(set)
    }

    /// Take the replica on `node` out of volume `volume`'s replica set: its
    /// record as it was, if it had one. Durable when it returns.
    pub fn remove_replica(
        &self,
        volume: &str,
        node: &str,
    ) -> Result<Option<ReplicaRec>, ServerError> {
        let mut gone = None;
        self.change_replica_set(volume, |r| {
            if let Some(i) = r.replicas.iter().position(|x| x.node == node) {
                gone = Some(r.replicas.remove(i));
            }
        })?;
        Ok(gone)
    }

    /// Record snapshot `name` of volume `volume` as missed by the replicas
    /// on `nodes` (taken without them).
    pub fn snapshot_missed(
        &self,
        volume: &str,
        name: &str,
        nodes: &[String],
    ) -> Result<(), ServerError> {
        if nodes.is_empty() {
            return Ok(());
        }
        self.change_replica_set(volume, |r| {
            for x in r.replicas.iter_mut().filter(|x| nodes.contains(&x.node)) {
                if !x.missed_snapshots.iter().any(|s| s == name) {
                    x.missed_snapshots.push(name.to_string());
                }
            }
        })
        .map(|_| ())
    }

    /// Record snapshot `name` of volume `volume` deleted while its faulted
    /// replicas were out: one they missed is not theirs to get any more,
    /// one they hold is theirs to delete when they return.
    pub fn snapshot_deleted(&self, volume: &str, name: &str) -> Result<(), ServerError> {
        self.change_replica_set(volume, |r| {
            for x in r.replicas.iter_mut().filter(|x| x.faulted.is_some()) {
                // A snapshot it missed it never gets. It is deleted there
                // all the same when it returns: a replica may hold one its
                // record calls missed (a takeover counts every snapshot as
                // missed by the other replicas, which held them), and a
                // replica deletes a snapshot it lacks as a no-op.
                x.missed_snapshots.retain(|s| s != name);
                if !x.pending_deletes.iter().any(|s| s == name) {
                    x.pending_deletes.push(name.to_string());
                }
            }
        })
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set() -> ReplicaSetRec {
        let r = |node: &str, address: &str| ReplicaRec {
            node: node.into(),
            address: address.into(),
            faulted: None,
            since: 5,
            ..Default::default()
        };
        ReplicaSetRec {
            volume_id: 3,
            generation: 0,
            replicas: vec![r("a", ""), r("b", "10.0.0.2:7481"), r("c", "10.0.0.3:7481")],
            dirty: Vec::new(),
            diskless: false,
            size: 0,
        }
    }

    /// A call the shared record took: the volume, and the generation
    /// recorded (None: removed).
    type Seen = (String, Option<u64>);

    /// The shared record's calls as it saw them, and whether it takes the
    /// next one.
    #[derive(Default)]
    struct Shared {
        seen: std::sync::Mutex<Vec<Seen>>,
        refuse: std::sync::Mutex<Option<SharedRecordError>>,
    }

    impl SharedRecord for Shared {
        fn record(
            &self,
            node: &str,
            volume: &str,
            after: Option<&SharedSet>,
        ) -> Result<(), SharedRecordError> {
            assert_eq!(node, "a");
            if let Some(r) = after {
                assert_eq!(r.front_end, "a");
            }
            if let Some(e) = self.refuse.lock().unwrap().clone() {
                return Err(e);
            }
            self.seen
                .lock()
                .unwrap()
                .push((volume.to_string(), after.map(|r| r.generation)));
            Ok(())
        }

        fn read(&self, _: &str) -> Result<Option<SharedSet>, SharedRecordError> {
            Ok(None)
        }

        fn take(
            &self,
            _: &str,
            _: &str,
            _: &SharedSet,
            _: &SharedSet,
        ) -> Result<(), SharedRecordError> {
            Ok(())
        }
    }

    #[test]
    fn a_change_the_shared_record_does_not_take_changes_nothing_here() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store.redb")).unwrap();
        let shared = std::sync::Arc::new(Shared::default());
        store.share_replica_sets(shared.clone(), "a".into());
        store.put_replica_set("v", &set()).unwrap();
        store.mark_regions("v", &[1], true).unwrap();
        store.next_replica_generation("v").unwrap();
        assert_eq!(
            *shared.seen.lock().unwrap(),
            vec![("v".to_string(), Some(0)), ("v".to_string(), Some(1))],
            "made, then a generation: the regions alone were not shared"
        );
        for e in [
            SharedRecordError::Fenced("node b holds it at generation 4".into()),
            SharedRecordError::Unavailable("connection refused".into()),
        ] {
            *shared.refuse.lock().unwrap() = Some(e.clone());
            let before = store.replica_set("v").unwrap().unwrap();
            let err = store.fault_replica("v", "b", "lost", 9, &[]).unwrap_err();
            assert!(
                matches!(&err, ServerError::Shared { source, .. } if *source == e),
                "{err}"
            );
            assert!(store.next_replica_generation("v").is_err());
            assert!(store.remove_replica_set("v").is_err());
            assert_eq!(store.replica_set("v").unwrap().unwrap(), before, "{e}");
            // Regions are this node's alone: they go on changing.
            store.mark_regions("v", &[2], true).unwrap();
            store.mark_regions("v", &[2], false).unwrap();
        }
        *shared.refuse.lock().unwrap() = None;
        let rec = store.fault_replica("v", "b", "lost", 9, &[]).unwrap();
        assert_eq!(rec.replicas[1].faulted.as_deref(), Some("lost"));
        assert!(store.remove_replica_set("v").unwrap());
        assert_eq!(
            shared.seen.lock().unwrap().last().unwrap(),
            &("v".to_string(), None)
        );
    }

    #[test]
    fn a_change_that_shows_is_told_and_one_of_regions_only_is_not() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store.redb")).unwrap();
        let told = std::sync::Arc::new(AtomicUsize::new(0));
        let t = told.clone();
        store.on_replica_set_change(Box::new(move || {
            t.fetch_add(1, SeqCst);
        }));
        store.put_replica_set("v", &set()).unwrap();
        assert_eq!(told.load(SeqCst), 1, "made");
        store.mark_regions("v", &[1, 2], true).unwrap();
        store.mark_regions("v", &[1], false).unwrap();
        store.fault_replica("v", "a", "disk full", 9, &[4]).unwrap();
        assert_eq!(told.load(SeqCst), 2, "regions are not told; a fault is");
        store.missed_regions("v", "a", &[5]).unwrap();
        store.fault_replica("v", "a", "again", 10, &[6]).unwrap();
        assert_eq!(
            told.load(SeqCst),
            2,
            "a fault already recorded shows nothing new"
        );
        store.next_replica_generation("v").unwrap();
        assert_eq!(told.load(SeqCst), 3);
        assert!(store.remove_replica_set("v").unwrap());
        assert!(!store.remove_replica_set("v").unwrap());
        assert_eq!(told.load(SeqCst), 4);
    }

    #[test]
    fn a_replica_set_is_recorded_faulted_once_and_takes_generations_durably() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let store = Store::open(&path).unwrap();
        assert_eq!(store.replica_set("v").unwrap(), None);
        assert!(
            store.next_replica_generation("v").is_err(),
            "no set, no generation"
        );
        store.put_replica_set("v", &set()).unwrap();
        assert_eq!(store.next_replica_generation("v").unwrap().0.generation, 1);
        assert_eq!(store.next_replica_generation("v").unwrap().0.generation, 2);
        let f = store
            .fault_replica("v", "b", "no answer for 5 s", 9, &[])
            .unwrap();
        assert_eq!(f.replicas[1].faulted.as_deref(), Some("no answer for 5 s"));
        assert_eq!(f.replicas[1].since, 9);
        // Faulted once: a later fault keeps the first reason and time.
        let again = store.fault_replica("v", "b", "other", 11, &[]).unwrap();
        assert_eq!(again, f);
        drop(store);
        let store = Store::open(&path).unwrap();
        let got = store.replica_set("v").unwrap().unwrap();
        assert_eq!(
            (got.generation, got.replicas[1].faulted.clone()),
            (2, Some("no answer for 5 s".into()))
        );
        // The fault was recorded by generation 2's front end.
        assert_eq!(got.replicas[1].tracked, 2);
        // One faulted with no front end serving is tracked by the next
        // front end, once: the generation and its tracking in one record.
        let d = store
            .fault_detached_replica("v", "c", "snapshot failed", 12)
            .unwrap();
        assert!(d.replicas[2].held_all && d.replicas[2].tracked == 0);
        let (set, held) = store.next_replica_generation("v").unwrap();
        assert_eq!(held, vec!["c".to_string()]);
        assert_eq!(
            (set.replicas[2].tracked, set.replicas[2].held_all),
            (3, false)
        );
        assert_eq!(set.replicas[1].tracked, 2, "b stays as it was");
        let (set, held) = store.next_replica_generation("v").unwrap();
        assert!(held.is_empty());
        assert_eq!(set.replicas[2].tracked, 3);
        assert!(store.remove_replica_set("v").unwrap());
        assert!(!store.remove_replica_set("v").unwrap());
        assert_eq!(store.replica_set("v").unwrap(), None);
    }

    #[test]
    fn snapshots_missed_and_deleted_while_a_replica_is_out_are_kept_for_its_return() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store.redb")).unwrap();
        store.put_replica_set("v", &set()).unwrap();
        store.fault_replica("v", "c", "gone", 9, &[]).unwrap();
        store.snapshot_missed("v", "s1", &["c".into()]).unwrap();
        store.snapshot_missed("v", "s1", &["c".into()]).unwrap();
        store.snapshot_missed("v", "s2", &["c".into()]).unwrap();
        // s1 deleted: c never gets it, and deletes it when it returns in
        // case it held it (a takeover calls every snapshot missed); s0
        // (taken before c left) deleted: c deletes it when it returns; b
        // (healthy) keeps no list.
        store.snapshot_deleted("v", "s1").unwrap();
        store.snapshot_deleted("v", "s0").unwrap();
        store.snapshot_deleted("v", "s0").unwrap();
        let got = store.replica_set("v").unwrap().unwrap();
        assert_eq!(got.replicas[2].missed_snapshots, vec!["s2".to_string()]);
        assert_eq!(
            got.replicas[2].pending_deletes,
            vec!["s1".to_string(), "s0".to_string()]
        );
        assert!(got.replicas[1].pending_deletes.is_empty());
        // A change to one replica, in one transaction; an unknown one
        // changes nothing.
        let r = store
            .change_replica("v", "c", |x| x.pending_deletes.clear())
            .unwrap();
        assert!(r.replicas[2].pending_deletes.is_empty());
        let e = store
            .change_replica("v", "zz", |x| x.since = 0)
            .unwrap_err();
        assert!(e.to_string().contains("no replica on node zz"), "{e}");
        assert_eq!(store.replica_set("v").unwrap().unwrap(), r);
        assert_eq!(store.replica_sets().unwrap(), vec![("v".to_string(), r)]);
        // The write intent: regions recorded dirty, then clean, durably.
        store.mark_regions("v", &[3, 1], true).unwrap();
        store.mark_regions("v", &[1], true).unwrap();
        assert_eq!(store.replica_set("v").unwrap().unwrap().dirty, vec![1, 3]);
        store.mark_regions("v", &[1, 7], false).unwrap();
        assert_eq!(store.replica_set("v").unwrap().unwrap().dirty, vec![3]);
    }

    #[test]
    fn the_regions_this_nodes_replica_missed_are_kept_until_it_is_healthy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let store = Store::open(&path).unwrap();
        store.put_replica_set("v", &set()).unwrap();
        // Another node's replica faulted: its base stands for what it
        // holds, and no regions are kept.
        store.fault_replica("v", "b", "gone", 9, &[2]).unwrap();
        let got = store.replica_set("v").unwrap().unwrap();
        assert!(got.replicas.iter().all(|x| x.missed_regions.is_none()));
        // This node's: kept from its fault, the regions sorted, once each;
        // cleaning a region (rule 14) takes nothing from them.
        let f = store
            .fault_replica("v", "a", "no space left", 10, &[5])
            .unwrap();
        assert_eq!(f.replicas[0].missed_regions, Some(vec![5]));
        store.missed_regions("v", "a", &[5, 1]).unwrap();
        store.mark_regions("v", &[5, 4], true).unwrap();
        store.mark_regions("v", &[5], false).unwrap();
        store.missed_regions("v", "a", &[1, 3]).unwrap();
        drop(store);
        let store = Store::open(&path).unwrap();
        let got = store.replica_set("v").unwrap().unwrap();
        assert_eq!(got.replicas[0].missed_regions, Some(vec![1, 3, 5]));
        assert_eq!(got.dirty, vec![4]);
        // A later fault record keeps the first reason, and adds its
        // regions.
        let again = store.fault_replica("v", "a", "other", 11, &[0]).unwrap();
        assert_eq!(again.replicas[0].faulted.as_deref(), Some("no space left"));
        assert_eq!(again.replicas[0].missed_regions, Some(vec![0, 1, 3, 5]));
        // An unknown replica: an error, nothing changed.
        assert!(store.missed_regions("v", "zz", &[0]).is_err());
        assert_eq!(store.replica_set("v").unwrap().unwrap(), again);
    }

    #[test]
    fn a_replica_is_added_once_up_to_three_and_removed_durably() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let store = Store::open(&path).unwrap();
        let mut two = set();
        two.replicas.truncate(2);
        store.put_replica_set("v", &two).unwrap();
        let new = ReplicaRec {
            node: "c".into(),
            address: "10.0.0.3:7481".into(),
            faulted: Some("new".into()),
            missed_snapshots: vec!["s1".into()],
            ..Default::default()
        };
        let r = store.add_replica("v", new.clone()).unwrap();
        assert_eq!(r.replicas.len(), 3);
        // Asked again: nothing changes; a fourth: refused, nothing changes.
        assert_eq!(store.add_replica("v", new.clone()).unwrap(), r);
        let fourth = ReplicaRec {
            node: "d".into(),
            ..new.clone()
        };
        assert!(store.add_replica("v", fourth).is_err());
        assert!(store.add_replica("nope", new.clone()).is_err());
        drop(store);
        let store = Store::open(&path).unwrap();
        assert_eq!(store.replica_set("v").unwrap().unwrap(), r);
        assert_eq!(store.remove_replica("v", "b").unwrap().unwrap().node, "b");
        assert_eq!(store.remove_replica("v", "b").unwrap(), None);
        drop(store);
        let store = Store::open(&path).unwrap();
        let left: Vec<String> = store
            .replica_set("v")
            .unwrap()
            .unwrap()
            .replicas
            .into_iter()
            .map(|x| x.node)
            .collect();
        assert_eq!(left, ["a", "c"]);
    }
}
