//! Volume, snapshot and clone operations. Each takes the gate of the volume
//! it changes exclusively (so it waits only for I/O in flight on that
//! volume), changes metadata under the mutex, and commits before returning:
//! an operation that returned survives a crash; one that did not is absent.
//! The state machines are drawn in docs/design.md.

use crate::error::{Error, Result};
use crate::format::*;
use crate::pool::{now_ns, Pool};
use crate::space::Walked;
use crate::tree::levels_for;
use std::collections::HashMap;

/// Largest volume: 2^56 bytes (64 PiB).
pub const MAX_VOLUME_SIZE: u64 = 1 << 56;

/// Volume sizes are whole 512-byte sectors: the kernel's NBD client and
/// filesystems address whole sectors, so a ragged tail would be unreachable
/// or, worse, half-used. Callers that take sizes from people or from CSI
/// round up to this before they ask (`round_up_size`).
pub const SECTOR: u64 = 512;

/// The smallest valid volume size at least `size` (at least one sector).
pub fn round_up_size(size: u64) -> u64 {
    size.max(1).div_ceil(SECTOR).saturating_mul(SECTOR)
}

/// Names of system snapshots start with this character. The user naming
/// rule ([`check_name`]) requires a letter or digit first, so a system
/// snapshot can never have a name a user could give, take or reuse.
pub const SYSTEM_PREFIX: char = '.';

/// The name of the system snapshot with id `id` taken so that volume
/// `target` can be cloned from it: `.clone-ID-TARGET`, cut to 255 bytes (the
/// id alone makes it unique: ids are never reused).
fn system_snapshot_name(id: u64, target: &str) -> String {
    let mut n = format!("{SYSTEM_PREFIX}clone-{id}-{target}");
    n.truncate(255);
    n
}

/// Whether a snapshot name is in the system's name space.
pub fn is_system_name(name: &str) -> bool {
    name.starts_with(SYSTEM_PREFIX)
}

/// How a volume relates to the snapshot it was cloned from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CloneState {
    /// Not a clone.
    None,
    /// Shares blocks with its origin snapshot.
    Linked,
    /// A flatten is copying the shared blocks.
    Flattening,
    /// Was a clone; shares nothing with its origin any more.
    Independent,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OriginInfo {
    /// Volume the origin snapshot belongs to (None once its record is
    /// gone; a retired volume's name while it is retired).
    pub volume: Option<String>,
    /// The origin snapshot (None if deleted since).
    pub snapshot: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeInfo {
    pub id: u64,
    pub name: String,
    pub size: u64,
    /// Nanoseconds since the Unix epoch.
    pub created: u64,
    /// Snapshot the live data descends from.
    pub parent_snapshot: Option<String>,
    /// Bytes mapped in the live volume.
    pub allocated_bytes: u64,
    pub origin: Option<OriginInfo>,
    pub clone_state: CloneState,
    /// The volume's labels, sorted by key.
    pub labels: Vec<(String, String)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub id: u64,
    pub volume: String,
    /// Id of the volume it belongs to.
    pub volume_id: u64,
    /// The volume was deleted and is retired: `volume` is the name it had
    /// (a live volume may have it now), and `NAME@ID` names it alone.
    pub volume_deleted: bool,
    pub name: String,
    /// Size of the volume when the snapshot was taken (its restore size).
    pub restore_size: u64,
    pub created: u64,
    pub parent: Option<String>,
    pub children: Vec<String>,
    /// Linked clones that share blocks with it (volume names).
    pub clones: Vec<String>,
    pub system: bool,
    pub labels: Vec<(String, String)>,
    /// Bytes mapped in the snapshot.
    pub allocated_bytes: u64,
    /// Bytes of data only this snapshot references: what deleting it frees.
    pub exclusive_bytes: u64,
}

/// Space used by a volume or snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Usage {
    /// Bytes mapped.
    pub allocated_bytes: u64,
    /// Bytes of data referenced by this object alone: what deleting it frees.
    pub exclusive_bytes: u64,
    /// Bytes of index nodes referenced by this object alone.
    pub exclusive_metadata_bytes: u64,
}

/// What deleting a set of trees would free, exactly.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Freed {
    /// Bytes of data blocks.
    pub data_bytes: u64,
    /// Bytes of index nodes.
    pub metadata_bytes: u64,
}

/// Space of the whole pool.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PoolStats {
    pub total_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub volumes: u64,
    pub snapshots: u64,
    /// Deleted volumes kept as records because snapshots or linked clones
    /// of theirs remain (not counted in `volumes`).
    pub retired_volumes: u64,
    /// Tree nodes deleted but not yet reclaimed.
    pub reclaim_pending: bool,
    /// The most the pool may grow to, if capped (else it grows while its
    /// filesystem has room).
    pub max_bytes: Option<u64>,
}

fn check_size(size: u64) -> Result<()> {
    if size == 0 {
        return Err(Error::InvalidArgument(format!(
            "a volume size must be at least {SECTOR} bytes"
        )));
    }
    if size > MAX_VOLUME_SIZE {
        return Err(Error::InvalidArgument(format!(
            "a volume size must be at most 64 PiB ({MAX_VOLUME_SIZE} bytes); {size} bytes was asked"
        )));
    }
    if !size.is_multiple_of(SECTOR) {
        return Err(Error::InvalidArgument(format!(
            "a volume size must be a whole number of {SECTOR}-byte sectors: {size} bytes is not ({} would be)",
            round_up_size(size)
        )));
    }
    Ok(())
}

/// Children and linked clones of snapshots, by snapshot id.
#[derive(Default)]
pub(crate) struct Links {
    children: HashMap<u64, Vec<String>>,
    clones: HashMap<u64, Vec<String>>,
}

pub(crate) fn blocks_of(size: u64) -> u64 {
    size.div_ceil(BLOCK as u64)
}

impl Pool {
    fn volume_info(&self, m: &crate::meta::Meta, v: &VolumeRec) -> VolumeInfo {
        // A volume that shares nothing with its origin any more (flattened)
        // shows none: the link is gone.
        let origin = v
            .origin
            .as_ref()
            .filter(|o| o.root != 0)
            .map(|o| OriginInfo {
                volume: m.catalog.owner_name(o.volume).map(str::to_string),
                snapshot: m.catalog.snapshot(o.snapshot).map(|s| s.name.clone()),
            });
        let clone_state = match &v.origin {
            None => CloneState::None,
            Some(_) if v.flattening => CloneState::Flattening,
            Some(o) if o.root != 0 => CloneState::Linked,
            Some(_) => CloneState::Independent,
        };
        VolumeInfo {
            id: v.id,
            name: v.name.clone(),
            size: v.size,
            created: v.created,
            parent_snapshot: m.catalog.snapshot(v.parent).map(|s| s.name.clone()),
            allocated_bytes: v.mapped * BLOCK as u64,
            origin,
            clone_state,
            labels: v.labels.clone(),
        }
    }

    /// Names of each snapshot's children (for the snapshots of `vol`, or of
    /// all volumes) and of the linked clones sharing its blocks, in one pass.
    fn children_of(m: &crate::meta::Meta, vol: Option<u64>) -> Links {
        let mut links = Links::default();
        let snaps: Vec<&SnapshotRec> = match vol {
            Some(v) => m.catalog.snapshots_of(v),
            None => m.catalog.snapshots().collect(),
        };
        for c in snaps {
            links
                .children
                .entry(c.parent)
                .or_default()
                .push(c.name.clone());
        }
        for v in m.catalog.volumes() {
            if let Some(o) = v.origin.as_ref().filter(|o| o.root != 0) {
                links
                    .clones
                    .entry(o.snapshot)
                    .or_default()
                    .push(v.name.clone());
            }
        }
        for v in links.children.values_mut().chain(links.clones.values_mut()) {
            v.sort();
        }
        links
    }

    /// A snapshot's description, given the blocks only it holds (see
    /// [`crate::meta::Meta::snapshot_exclusive`]).
    pub(crate) fn snapshot_info(
        &self,
        m: &crate::meta::Meta,
        s: &SnapshotRec,
        links: &Links,
        exclusive: u64,
    ) -> SnapshotInfo {
        SnapshotInfo {
            id: s.id,
            volume: m
                .catalog
                .owner_name(s.volume)
                .unwrap_or_default()
                .to_string(),
            volume_id: s.volume,
            volume_deleted: m.catalog.is_retired(s.volume),
            name: s.name.clone(),
            restore_size: s.size,
            created: s.created,
            parent: m.catalog.snapshot(s.parent).map(|p| p.name.clone()),
            children: links.children.get(&s.id).cloned().unwrap_or_default(),
            clones: links.clones.get(&s.id).cloned().unwrap_or_default(),
            system: s.system,
            labels: s.labels.clone(),
            allocated_bytes: s.mapped * BLOCK as u64,
            exclusive_bytes: exclusive * BLOCK as u64,
        }
    }

    /// Create an empty thin volume.
    pub fn create_volume(&self, name: &str, size: u64) -> Result<VolumeInfo> {
        self.create_volume_labelled(name, size, &[])
    }

    /// [`Pool::create_volume`] with labels (checked like a snapshot's).
    pub fn create_volume_labelled(
        &self,
        name: &str,
        size: u64,
        labels: &[(String, String)],
    ) -> Result<VolumeInfo> {
        check_name(name)?;
        check_size(size)?;
        check_labels(labels)?;
        let mut labels = labels.to_vec();
        labels.sort();
        let info = self.with_meta(|m| {
            if m.catalog.volume_id(name).is_ok() {
                return Err(Error::VolumeExists(name.to_string()));
            }
            let id = m.sb.next_id;
            let rec = VolumeRec {
                id,
                name: name.to_string(),
                size,
                root: 0,
                levels: levels_for(blocks_of(size)),
                created: now_ns(),
                parent: 0,
                mapped: 0,
                origin: None,
                flattening: false,
                labels,
            };
            m.create_record(Record::Volume(rec.clone()))?;
            m.sb.next_id += 1;
            Ok(self.volume_info(m, &rec))
        })?;
        self.commit()?;
        tracing::info!(volume = name, size, "volume created");
        Ok(info)
    }

    pub fn volume_info_by_name(&self, name: &str) -> Result<VolumeInfo> {
        let m = self.lock_meta();
        let id = m.catalog.volume_id(name)?;
        Ok(self.volume_info(&m, m.catalog.volume(id)))
    }

    pub fn list_volumes(&self) -> Vec<VolumeInfo> {
        let m = self.lock_meta();
        let mut v: Vec<VolumeInfo> = m
            .catalog
            .volumes()
            .map(|v| self.volume_info(&m, v))
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Grow a volume. Shrinking is refused: it would drop data silently.
    pub fn expand_volume(&self, name: &str, size: u64) -> Result<VolumeInfo> {
        check_size(size)?;
        let id = self.lock_meta().catalog.volume_id(name)?;
        let gate = self.gate(id);
        let _g = crate::order::gate_exclusive(&gate, id);
        let info = self.with_meta(|m| {
            let v = m.catalog.volume(id).clone();
            if size < v.size {
                return Err(Error::InvalidArgument(format!(
                    "volume {name:?} is {} bytes; shrinking to {size} is not supported",
                    v.size
                )));
            }
            let (mut root, mut levels) = (v.root, v.levels);
            let r = m.tree_grow(&mut root, &mut levels, blocks_of(size));
            let vm = m.catalog.volume_mut(id);
            vm.root = root;
            vm.levels = levels;
            r?;
            vm.size = size;
            Ok(self.volume_info(m, m.catalog.volume(id)))
        })?;
        self.commit()?;
        Ok(info)
    }

    /// Replace a volume's labels (checked like a snapshot's); durable when
    /// it returns.
    pub fn set_volume_labels(&self, name: &str, labels: &[(String, String)]) -> Result<VolumeInfo> {
        check_labels(labels)?;
        let mut labels = labels.to_vec();
        labels.sort();
        let info = self.with_meta(|m| {
            let id = m.catalog.volume_id(name)?;
            m.catalog.volume_mut(id).labels = labels;
            Ok(self.volume_info(m, m.catalog.volume(id)))
        })?;
        self.commit()?;
        tracing::info!(volume = name, "volume labels set");
        Ok(info)
    }

    /// Replace a snapshot's labels (checked as at its creation); durable
    /// when it returns. `volume` names a live or retired volume as
    /// [`Pool::list_snapshots`] takes it. Nothing else of the snapshot
    /// changes: its data, its id, its place in the tree.
    pub fn set_snapshot_labels(
        &self,
        volume: &str,
        name: &str,
        labels: &[(String, String)],
    ) -> Result<SnapshotInfo> {
        check_labels(labels)?;
        let mut labels = labels.to_vec();
        labels.sort();
        self.with_meta(|m| {
            let vid = m.catalog.owner_id(volume)?;
            let sid = m.catalog.snapshot_id(vid, name)?;
            m.catalog.snapshot_mut(sid).labels = labels;
            Ok(())
        })?;
        self.commit()?;
        tracing::info!(volume, snapshot = name, "snapshot labels set");
        self.snapshot_info_by_name(volume, name)
    }

    /// Delete a volume. Its live data goes at once, and so does its name (a
    /// new volume may take it). Its snapshots stay unless `with_snapshots`
    /// (a linked clone's system snapshot stays either way while a clone
    /// needs it; one no clone needs goes): if any snapshot stays, or a
    /// linked clone still shares blocks with one deleted, the volume is
    /// **retired**: a record under its id keeps the snapshots' volume name
    /// and id, and goes with the last of them (docs/design.md, "Retired
    /// volumes"). A linked clone's system snapshot goes with the clone.
    pub fn delete_volume(&self, name: &str, with_snapshots: bool) -> Result<()> {
        let id = self.lock_meta().catalog.volume_id(name)?;
        let gate = self.gate(id);
        let g = crate::order::gate_exclusive(&gate, id);
        let (gone, origin, retired) = self.with_meta(|m| {
            if m.catalog.volume_id(name)? != id {
                // Deleted and made again while this waited for the gate.
                return Err(Error::VolumeNotFound(name.into()));
            }
            // Stop a flatten of this volume before it goes.
            self.stop_flatten(id);
            let v = m.catalog.volume(id).clone();
            let doomed: Vec<SnapshotRec> = m
                .catalog
                .snapshots_of(id)
                .into_iter()
                .filter(|s| {
                    if s.system {
                        Self::linked_clones_of(m, s.id).is_empty()
                    } else {
                        with_snapshots
                    }
                })
                .cloned()
                .collect();
            let mut gone = Vec::with_capacity(doomed.len());
            for s in &doomed {
                Self::unlink_snapshot(m, id, s.id)?;
                gone.push(s.id);
            }
            let origin = v.origin.clone();
            if let Some(o) = &origin {
                m.release_root(o.root)?;
            }
            m.release_root(v.root)?;
            m.bases.remove(&id);
            let kept = !m.catalog.snapshots_of(id).is_empty()
                || m.catalog.linked_clones_of_volume(id).next().is_some();
            if kept {
                m.replace_record(Record::Retired(RetiredRec {
                    id,
                    name: v.name.clone(),
                    size: v.size,
                    created: v.created,
                    deleted: now_ns(),
                    labels: v.labels.clone(),
                }))?;
            } else {
                m.delete_record(id)?;
            }
            // Its clone link held a retired volume that nothing else holds.
            if let Some(o) = &origin {
                if o.root != 0 && Self::drop_retired_if_unused(m, o.volume)? {
                    gone.push(o.volume);
                }
            }
            Ok((gone, origin, kept))
        })?;
        for sid in gone {
            self.drop_gate(sid);
        }
        self.drop_gate(id);
        self.commit()?;
        // The volume is gone: let go of its gate before its origin's gates
        // (lower ids) are taken below, as the lock order asks.
        drop(g);
        self.wake_background();
        if retired {
            tracing::info!(
                volume = name,
                id,
                "volume deleted; retired: snapshots or clones of it remain"
            );
        } else {
            tracing::info!(volume = name, "volume deleted");
        }
        // Also when the clone shares nothing (`root == 0`: its origin was
        // empty, or it was flattened): the snapshot goes if it is a system
        // one and no other linked clone needs it.
        if let Some(o) = origin {
            if self.lock_meta().catalog.snapshot(o.snapshot).is_some() {
                self.release_system_snapshot(o.volume, o.snapshot)?;
            }
        }
        Ok(())
    }

    /// Remove the record of snapshot `sid` of volume `vid` (live or
    /// retired) and its reference on its tree: its children, and the
    /// volume if it descends from it, take its parent.
    fn unlink_snapshot(m: &mut crate::meta::Meta, vid: u64, sid: u64) -> Result<SnapshotRec> {
        let s = m.catalog.snapshot(sid).cloned().expect("indexed");
        let children: Vec<u64> = m
            .catalog
            .snapshots_of(vid)
            .iter()
            .filter(|c| c.parent == sid)
            .map(|c| c.id)
            .collect();
        for c in children {
            m.catalog.snapshot_mut(c).parent = s.parent;
        }
        if matches!(m.catalog.get(vid), Some(Record::Volume(v)) if v.parent == sid) {
            m.catalog.volume_mut(vid).parent = s.parent;
        }
        m.delete_record(sid)?;
        m.bases.retain(|_, b| *b != sid);
        m.release_root(s.root)?;
        Ok(s)
    }

    /// Delete the record of volume `vid` if it is retired and nothing
    /// names it any more: no snapshot of it, no linked clone sharing blocks
    /// with one. Returns whether it went.
    pub(crate) fn drop_retired_if_unused(m: &mut crate::meta::Meta, vid: u64) -> Result<bool> {
        if !m.catalog.is_retired(vid)
            || !m.catalog.snapshots_of(vid).is_empty()
            || m.catalog.linked_clones_of_volume(vid).next().is_some()
        {
            return Ok(false);
        }
        m.delete_record(vid)?;
        tracing::info!(
            volume = vid,
            "retired volume's record deleted: nothing names it"
        );
        Ok(true)
    }

    /// Take a snapshot: O(1), whatever the volume's size or snapshot count.
    pub fn create_snapshot(
        &self,
        volume: &str,
        name: &str,
        labels: &[(String, String)],
    ) -> Result<SnapshotInfo> {
        check_name(name)?;
        check_labels(labels)?;
        self.snapshot_then(volume, |m, vid| {
            let rec = Self::new_snapshot(m, vid, name.to_string(), labels, false, now_ns())?;
            // It shares its root with the volume: nothing is its own yet.
            Ok(self.snapshot_info(m, &rec, &Links::default(), 0))
        })
    }

    /// Take a snapshot of `volume` marked as made by the system, so that
    /// volume `target` can be copied from it; the engine names it (see
    /// [`SYSTEM_PREFIX`]). Whoever takes one deletes it with
    /// [`Pool::delete_system_snapshot`] when done; a linked clone's is
    /// deleted with the clone.
    pub fn create_system_snapshot(&self, volume: &str, target: &str) -> Result<SnapshotInfo> {
        check_name(target)?;
        self.snapshot_then(volume, |m, vid| {
            let name = system_snapshot_name(m.sb.next_id, target);
            let rec = Self::new_snapshot(m, vid, name, &[], true, now_ns())?;
            Ok(self.snapshot_info(m, &rec, &Links::default(), 0))
        })
    }

    /// Run `f` (which adds a snapshot of the volume, and maybe more, in one
    /// transaction) with the volume's writers stopped, then commit.
    fn snapshot_then<T>(
        &self,
        volume: &str,
        f: impl FnOnce(&mut crate::meta::Meta, u64) -> Result<T>,
    ) -> Result<T> {
        let started = std::time::Instant::now();
        let vid = self.lock_meta().catalog.volume_id(volume)?;
        // No data sync before the gate: the commit's is the one that makes
        // the snapshot durable, and writers never wait for it (the gate is
        // let go before the commit). A sync here as well would put two
        // syncs of a busy volume's data in series (docs/design.md,
        // "Concurrency").
        let gate = self.gate(vid);
        let g = crate::order::gate_exclusive(&gate, vid);
        let gated = started.elapsed();
        let out = self.with_meta(|m| {
            m.catalog.volume_id(volume)?;
            f(m, vid)
        })?;
        // The snapshot shares the volume's root now, so any write from here
        // on copies before it changes a block: writers may go on while the
        // commit makes the snapshot durable (it is answered only after).
        drop(g);
        let made = started.elapsed();
        self.commit()?;
        tracing::debug!(
            volume,
            gate_us = gated.as_micros() as u64,
            made_us = (made - gated).as_micros() as u64,
            commit_us = (started.elapsed() - made).as_micros() as u64,
            "snapshot taken"
        );
        Ok(out)
    }

    /// Add a snapshot record of volume `vid` as it is now (the caller holds
    /// the volume's gate), created at `created` (ns). Its id is
    /// `m.sb.next_id` as it was on entry. On an error nothing is left
    /// changed but the id counter (the reference on the root is taken back
    /// if the record cannot be made), so that a group can undo the members
    /// it made before ([`Pool::undo_snapshot`]).
    pub(crate) fn new_snapshot(
        m: &mut crate::meta::Meta,
        vid: u64,
        name: String,
        labels: &[(String, String)],
        system: bool,
        created: u64,
    ) -> Result<SnapshotRec> {
        m.journaled(|m| {
            let rec = Self::new_snapshot_untracked(m, vid, name, labels, system, created)?;
            let op = crate::journal::Op::Snapshot {
                vol: vid,
                id: rec.id,
                created,
                system,
                name: rec.name.clone(),
                labels: rec.labels.clone(),
            };
            Ok((rec, vec![op]))
        })
    }

    fn new_snapshot_untracked(
        m: &mut crate::meta::Meta,
        vid: u64,
        name: String,
        labels: &[(String, String)],
        system: bool,
        created: u64,
    ) -> Result<SnapshotRec> {
        let id = m.sb.next_id;
        if m.catalog.has_snapshot(vid, &name) {
            return Err(Error::SnapshotExists {
                volume: m.catalog.volume(vid).name.clone(),
                snapshot: name,
            });
        }
        let v = m.catalog.volume(vid).clone();
        let rec = SnapshotRec {
            id,
            volume: vid,
            name,
            size: v.size,
            root: v.root,
            levels: v.levels,
            created,
            parent: v.parent,
            system,
            mapped: v.mapped,
            labels: labels.to_vec(),
        };
        if v.root != 0 {
            // The volume's root gains a holder: no snapshot reached it alone
            // before (only the volume did, or it was shared), none does
            // after. Charged to the new snapshot, which has no footprint
            // cached yet: other snapshots' cached footprints stay.
            m.charged(Some(id), |m| m.incref(v.root))?;
        }
        if let Err(e) = m.create_record(Record::Snapshot(rec.clone())) {
            // An error here is the caller's; a failure to take the
            // reference back too is an I/O error that latches the pool.
            m.release_root(v.root)?;
            return Err(e);
        }
        m.sb.next_id += 1;
        m.catalog.volume_mut(vid).parent = id;
        m.bases.insert(vid, id);
        Ok(rec)
    }

    /// Take back a snapshot [`Pool::new_snapshot`] made in the transaction
    /// being built: its record, its reference on the volume's root, and the
    /// volume's parent.
    pub(crate) fn undo_snapshot(m: &mut crate::meta::Meta, rec: &SnapshotRec) -> Result<()> {
        m.delete_record(rec.id)?;
        m.bases.retain(|_, s| *s != rec.id);
        m.release_root(rec.root)?;
        m.catalog.volume_mut(rec.volume).parent = rec.parent;
        Ok(())
    }

    pub fn snapshot_info_by_name(&self, volume: &str, name: &str) -> Result<SnapshotInfo> {
        self.with_meta(|m| {
            let (vid, sid) = m.catalog.snapshot_ids(volume, name)?;
            let children = Self::children_of(m, Some(vid));
            let s = m.catalog.snapshot(sid).expect("indexed").clone();
            let (root, levels) = (s.root, s.levels);
            let (_, exclusive) = m.snapshot_exclusive(sid, root, levels)?;
            Ok(self.snapshot_info(m, &s, &children, exclusive))
        })
    }

    /// A volume's snapshots, oldest first. `volume` names a live volume,
    /// or a retired one: as `NAME@ID`, or as `NAME` when no live volume has
    /// the name and one retired volume had it. Every operation on a
    /// snapshot (describe, open, clone, export, diff, delete) takes the
    /// same references; those on a volume's data take live volumes only.
    pub fn list_snapshots(&self, volume: &str) -> Result<Vec<SnapshotInfo>> {
        self.describe_snapshots(|m| {
            let vid = m.catalog.owner_id(volume)?;
            Ok((
                Some(vid),
                m.catalog.snapshots_of(vid).into_iter().cloned().collect(),
            ))
        })
    }

    /// Every snapshot in the pool, oldest first.
    pub fn list_all_snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        self.describe_snapshots(|m| Ok((None, m.catalog.snapshots().cloned().collect())))
    }

    /// The snapshots, of any volume, with this name and/or this id (both
    /// `None`: every snapshot), oldest first. Only the matching snapshots
    /// are described, so a lookup does not cost a full listing.
    pub fn find_snapshots(&self, name: Option<&str>, id: Option<u64>) -> Result<Vec<SnapshotInfo>> {
        self.describe_snapshots(|m| {
            let snaps: Vec<SnapshotRec> = match id {
                Some(id) => m.catalog.snapshot(id).cloned().into_iter().collect(),
                None => m.catalog.snapshots().cloned().collect(),
            };
            let snaps = snaps
                .into_iter()
                .filter(|s| name.is_none_or(|n| s.name == n))
                .collect();
            Ok((None, snaps))
        })
    }

    /// Describe the snapshots `pick` chooses (with the volume they all
    /// belong to, if one). Names, links and sizes are read at one moment,
    /// with every exclusive size the cache holds; the sizes it does not
    /// hold are walked in slices of about a millisecond of the metadata
    /// lock, so I/O waits for one slice, never a whole listing
    /// (docs/space.md). A snapshot deleted in between is left out.
    fn describe_snapshots(
        &self,
        pick: impl FnOnce(&mut crate::meta::Meta) -> Result<(Option<u64>, Vec<SnapshotRec>)>,
    ) -> Result<Vec<SnapshotInfo>> {
        let (mut infos, misses, file) = self.with_meta(|m| {
            let (vol, snaps) = pick(m)?;
            let links = Self::children_of(m, vol);
            let mut misses = Vec::new();
            let mut infos = Vec::with_capacity(snaps.len());
            for s in &snaps {
                let exclusive = m.cached_exclusive(s.id).map(|(_, data)| data);
                if exclusive.is_none() {
                    misses.push(infos.len());
                }
                infos.push(self.snapshot_info(m, s, &links, exclusive.unwrap_or(0)));
            }
            Ok((infos, misses, m.pool.clone()))
        })?;
        // The walks go in slices of about a millisecond, with a pause
        // between: std's mutex is not fair, and a thread that unlocks and
        // locks again at once keeps it from a waiter that has not woken yet,
        // so without the pause a read could wait out a whole listing made
        // of short holds. A slice can end inside one snapshot's tree
        // (`ExclusiveWalk`).
        const SLICE: std::time::Duration = std::time::Duration::from_millis(1);
        const PAUSE: std::time::Duration = std::time::Duration::from_micros(100);
        let mut gone = Vec::new();
        let mut next = 0;
        let mut walk: Option<crate::space::ExclusiveWalk> = None;
        // Nodes the last slice entered, whichever walks.
        let mut entered = 0;
        while next < misses.len() {
            if let Some(w) = &walk {
                // Paused inside a snapshot's tree after a slow slice: what
                // it enters next is read in, outside the lock.
                if entered < crate::space::SLOW_SLICE {
                    w.read_ahead(&*file);
                }
            }
            entered = 0;
            if next > 0 || walk.is_some() {
                std::thread::sleep(PAUSE);
            }
            self.with_meta(|m| {
                let deadline = std::time::Instant::now() + SLICE;
                while next < misses.len() {
                    let info = &mut infos[misses[next]];
                    let w = match &mut walk {
                        Some(w) => w,
                        None => match m.catalog.snapshot(info.id) {
                            Some(s) => walk.insert(crate::space::ExclusiveWalk::of_snapshot(
                                s.id, s.root, s.levels,
                            )),
                            None => {
                                gone.push(info.id);
                                next += 1;
                                continue;
                            }
                        },
                    };
                    let before = w.entered();
                    let walked = m.step_exclusive(w, Some(deadline))?;
                    entered += w.entered() - before;
                    match walked {
                        Walked::Done((_, data)) => info.exclusive_bytes = data * BLOCK as u64,
                        Walked::Gone => gone.push(info.id),
                        Walked::Paused => return Ok(()),
                    }
                    walk = None;
                    next += 1;
                    if std::time::Instant::now() >= deadline {
                        break;
                    }
                }
                Ok(())
            })?;
        }
        infos.retain(|s| !gone.contains(&s.id));
        infos.sort_by_key(|s| s.id);
        Ok(infos)
    }

    /// Delete a snapshot. No data is copied: blocks nothing else references
    /// are freed by reclaim, at a cost in proportion to what is freed.
    /// Linked clones made from it keep their data.
    pub fn delete_snapshot(&self, volume: &str, name: &str) -> Result<()> {
        let (vid, sid) = self.lock_meta().catalog.snapshot_ids(volume, name)?;
        self.remove_snapshot(vid, sid, |m| {
            m.catalog.snapshot_still(sid, volume, name).map(|_| true)
        })?;
        Ok(())
    }

    /// Delete a system snapshot (see [`Pool::create_system_snapshot`]);
    /// refuses a user's snapshot, so that no system path can delete one.
    pub fn delete_system_snapshot(&self, volume: &str, name: &str) -> Result<()> {
        let (vid, sid) = self.lock_meta().catalog.snapshot_ids(volume, name)?;
        self.remove_snapshot(vid, sid, |m| {
            let s = m.catalog.snapshot_still(sid, volume, name)?;
            if !s.system {
                return Err(Error::Conflict(format!(
                    "snapshot {volume}/{name} was made by a user, not the system"
                )));
            }
            Ok(true)
        })?;
        Ok(())
    }

    /// Remove snapshot `sid` of volume `vid` if `still` (run under the
    /// metadata lock with both gates held) says so; its children and the
    /// volume take its parent. Returns whether it was removed.
    fn remove_snapshot(
        &self,
        vid: u64,
        sid: u64,
        still: impl FnOnce(&mut crate::meta::Meta) -> Result<bool>,
    ) -> Result<bool> {
        let vgate = self.gate(vid);
        let _g = crate::order::gate_exclusive(&vgate, vid);
        let sgate = self.gate(sid);
        let _s = crate::order::gate_exclusive(&sgate, sid);
        let removed = self.with_meta(|m| {
            if !still(m)? {
                return Ok(None);
            }
            Self::unlink_snapshot(m, vid, sid)?;
            Ok(Some(Self::drop_retired_if_unused(m, vid)?))
        })?;
        if let Some(retired_gone) = removed {
            self.drop_gate(sid);
            if retired_gone {
                self.drop_gate(vid);
            }
            self.commit()?;
            self.wake_background();
        }
        Ok(removed.is_some())
    }

    /// Volumes that still share blocks with snapshot `sid` (linked clones,
    /// flattening or not).
    fn linked_clones_of(m: &crate::meta::Meta, sid: u64) -> Vec<String> {
        let mut v: Vec<String> = m
            .catalog
            .volumes()
            .filter(|v| {
                v.origin
                    .as_ref()
                    .is_some_and(|o| o.snapshot == sid && o.root != 0)
            })
            .map(|v| v.name.clone())
            .collect();
        v.sort();
        v
    }

    /// Delete system snapshot `sid` of volume `vid` if no linked clone
    /// needs it any more: the rule by which a clone's system snapshot goes
    /// with the clone (deleted, or flattened). Returns whether it went.
    pub(crate) fn release_system_snapshot(&self, vid: u64, sid: u64) -> Result<bool> {
        self.remove_snapshot(vid, sid, |m| {
            Ok(m.catalog
                .snapshot(sid)
                .is_some_and(|s| s.system && s.volume == vid)
                && Self::linked_clones_of(m, sid).is_empty())
        })
    }

    /// System snapshots no linked clone needs, as (volume, snapshot): left
    /// by a crash between a clone's end and its snapshot's deletion, or
    /// taken for a full copy. The volume is named by a reference that
    /// resolves to it alone (`NAME@ID` for a retired one: see
    /// [`Pool::delete_system_snapshot`]). The daemon deletes those no running copy
    /// of its own uses when it starts.
    pub fn unneeded_system_snapshots(&self) -> Vec<(String, String)> {
        let m = self.lock_meta();
        m.catalog
            .snapshots()
            .filter(|s| s.system && Self::linked_clones_of(&m, s.id).is_empty())
            .map(|s| (m.catalog.owner_reference(s.volume), s.name.clone()))
            .collect()
    }

    /// Make the volume's data the snapshot's again. Later snapshots stay;
    /// the volume now grows a new branch from this snapshot.
    pub fn revert_volume(&self, volume: &str, snapshot: &str) -> Result<VolumeInfo> {
        let (vid, sid) = {
            // A live volume only: a retired one has no data to revert.
            let m = self.lock_meta();
            let vid = m.catalog.volume_id(volume)?;
            (vid, m.catalog.snapshot_id(vid, snapshot)?)
        };
        let gate = self.gate(vid);
        let _g = crate::order::gate_exclusive(&gate, vid);
        let info = self.with_meta(|m| {
            let s = m.catalog.snapshot_still(sid, volume, snapshot)?;
            if m.catalog.is_retired(vid) {
                return Err(Error::VolumeNotFound(volume.into()));
            }
            if s.root != 0 {
                m.incref(s.root)?;
            }
            let old = m.catalog.volume(vid).root;
            let v = m.catalog.volume_mut(vid);
            v.root = s.root;
            v.levels = s.levels;
            v.size = s.size;
            v.mapped = s.mapped;
            v.parent = sid;
            m.release_root(old)?;
            m.bases.insert(vid, sid);
            Ok(self.volume_info(m, m.catalog.volume(vid)))
        })?;
        self.commit()?;
        self.wake_background();
        Ok(info)
    }

    /// A linked clone: a new volume sharing every block with the snapshot,
    /// made in O(1).
    pub fn clone_snapshot(
        &self,
        volume: &str,
        snapshot: &str,
        new_name: &str,
    ) -> Result<VolumeInfo> {
        check_name(new_name)?;
        let info = self.with_meta(|m| {
            let (_, sid) = m.catalog.snapshot_ids(volume, snapshot)?;
            let rec = Self::new_linked_clone(m, sid, new_name)?;
            Ok(self.volume_info(m, &rec))
        })?;
        self.commit()?;
        Ok(info)
    }

    /// Add a volume record linked to snapshot `sid`.
    fn new_linked_clone(m: &mut crate::meta::Meta, sid: u64, new_name: &str) -> Result<VolumeRec> {
        if m.catalog.volume_id(new_name).is_ok() {
            return Err(Error::VolumeExists(new_name.to_string()));
        }
        let s = m.catalog.snapshot(sid).cloned().expect("indexed");
        let id = m.sb.next_id;
        let rec = VolumeRec {
            id,
            name: new_name.to_string(),
            size: s.size,
            root: s.root,
            levels: s.levels,
            created: now_ns(),
            parent: 0,
            mapped: s.mapped,
            origin: Some(Origin {
                volume: s.volume,
                snapshot: sid,
                root: s.root,
                levels: s.levels,
            }),
            flattening: false,
            labels: Vec::new(),
        };
        m.create_record(Record::Volume(rec.clone()))?;
        m.sb.next_id += 1;
        if s.root != 0 {
            // One reference for the clone's data, one for its link to the origin.
            m.incref(s.root)?;
            m.incref(s.root)?;
        }
        m.bases.insert(id, sid);
        Ok(rec)
    }

    /// Clone a volume as it is now: a system snapshot and a linked clone of
    /// it, in one transaction (a crash leaves both or neither). The
    /// snapshot goes when the clone no longer needs it (deleted or
    /// flattened).
    pub fn clone_volume(&self, volume: &str, new_name: &str) -> Result<VolumeInfo> {
        check_name(new_name)?;
        if self.lock_meta().catalog.volume_id(new_name).is_ok() {
            return Err(Error::VolumeExists(new_name.to_string()));
        }
        self.snapshot_then(volume, |m, vid| {
            if m.catalog.volume_id(new_name).is_ok() {
                return Err(Error::VolumeExists(new_name.to_string()));
            }
            let name = system_snapshot_name(m.sb.next_id, new_name);
            let snap = Self::new_snapshot(m, vid, name, &[], true, now_ns())?;
            let rec = Self::new_linked_clone(m, snap.id, new_name)?;
            Ok(self.volume_info(m, &rec))
        })
    }

    /// Space used by a volume, or by one of its snapshots (of a live or
    /// retired volume: see [`Pool::list_snapshots`]).
    pub fn usage(&self, volume: &str, snapshot: Option<&str>) -> Result<Usage> {
        let mut m = self.lock_meta();
        let (root, levels, mapped) = match snapshot {
            None => {
                let v = m.catalog.volume(m.catalog.volume_id(volume)?);
                (v.root, v.levels, v.mapped)
            }
            Some(s) => {
                let (_, sid) = m.catalog.snapshot_ids(volume, s)?;
                let s = m.catalog.snapshot(sid).expect("indexed");
                (s.root, s.levels, s.mapped)
            }
        };
        let (nodes, data) = m.tree_exclusive(root, levels)?;
        Ok(Usage {
            allocated_bytes: mapped * BLOCK as u64,
            exclusive_bytes: data * BLOCK as u64,
            exclusive_metadata_bytes: nodes * BLOCK as u64,
        })
    }

    /// Space of the whole pool (reads every refcount page).
    pub fn stats(&self) -> Result<PoolStats> {
        self.with_meta(pool_stats)
    }

    /// What `lamina pool stats DIR` shows of a pool in a directory, read
    /// without writing a byte to it, as [`Pool::check_read_only`] reads
    /// (what a crash left in the page log and the journal is applied in
    /// memory). The pool must not be open elsewhere (its lock is taken).
    pub fn stats_read_only(
        dir: impl AsRef<std::path::Path>,
        opts: crate::PoolOptions,
    ) -> Result<OfflineStats> {
        let backend: std::sync::Arc<dyn crate::storage::Backend> =
            std::sync::Arc::new(crate::storage::DirBackend::new(dir.as_ref()));
        let (mut m, _, _) = Pool::open_meta_read_only(backend, &opts)?;
        let stats = pool_stats(&mut m)?;
        let snapshot_only = Self::freed(m.snapshot_only()?);
        let mut volumes: Vec<OfflineVolume> = m
            .catalog
            .volumes()
            .map(|v| OfflineVolume {
                name: v.name.clone(),
                size: v.size,
                allocated_bytes: v.mapped * BLOCK as u64,
                snapshots: m.catalog.snapshots_of(v.id).len(),
            })
            .collect();
        volumes.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(OfflineStats {
            stats,
            snapshot_only,
            volumes,
        })
    }
}

/// Space of the whole pool, from its metadata.
fn pool_stats(m: &mut crate::meta::Meta) -> Result<PoolStats> {
    let total = m.sb.total_blocks;
    let used = m.count_refcounts(|rc| rc != 0)?;
    Ok(PoolStats {
        total_bytes: total * BLOCK as u64,
        used_bytes: used * BLOCK as u64,
        free_bytes: (total - used) * BLOCK as u64,
        volumes: m.catalog.volumes().count() as u64,
        snapshots: m.catalog.snapshots().count() as u64,
        retired_volumes: m.catalog.retired().count() as u64,
        reclaim_pending: m.sb.dead_head != 0,
        max_bytes: (m.sb.max_blocks != 0).then_some(m.sb.max_blocks * BLOCK as u64),
    })
}

/// A pool's space and volumes, read offline ([`Pool::stats_read_only`]).
#[derive(Clone, Debug)]
pub struct OfflineStats {
    pub stats: PoolStats,
    /// What deleting every snapshot would free.
    pub snapshot_only: Freed,
    /// Live volumes, by name.
    pub volumes: Vec<OfflineVolume>,
}

/// One live volume of [`OfflineStats`].
#[derive(Clone, Debug)]
pub struct OfflineVolume {
    pub name: String,
    pub size: u64,
    pub allocated_bytes: u64,
    /// Its snapshots (the system's too).
    pub snapshots: usize,
}
