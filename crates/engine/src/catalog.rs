//! The catalog: every volume and snapshot record, held whole in memory (a few
//! hundred bytes each, so 30,000 snapshots fit in a few MiB) and persisted one
//! page per record under a radix tree keyed by object id. A record change
//! only marks it dirty; the page is written when the transaction commits, so
//! a change to a record and to the trees it points at commit together.

use crate::error::{Error, Result};
use crate::format::*;
use crate::meta::Meta;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

#[derive(Default)]
pub struct Catalog {
    records: BTreeMap<u64, Record>,
    vol_by_name: HashMap<String, u64>,
    /// Retired volumes by name: several may share one, and a live volume
    /// may have it too.
    retired_by_name: HashMap<String, BTreeSet<u64>>,
    snap_by_name: HashMap<(u64, String), u64>,
    snaps_by_vol: HashMap<u64, BTreeSet<u64>>,
    pub(crate) blocks: HashMap<u64, u64>,
    pub(crate) dirty: HashSet<u64>,
    /// Set by every change to a record; see `Cache::touched`.
    pub(crate) touched: bool,
}

impl Catalog {
    fn index(&mut self, rec: &Record) {
        match rec {
            Record::Volume(v) => {
                self.vol_by_name.insert(v.name.clone(), v.id);
            }
            Record::Snapshot(s) => {
                self.snap_by_name.insert((s.volume, s.name.clone()), s.id);
                self.snaps_by_vol.entry(s.volume).or_default().insert(s.id);
            }
            Record::Retired(r) => {
                self.retired_by_name
                    .entry(r.name.clone())
                    .or_default()
                    .insert(r.id);
            }
        }
    }

    fn unindex(&mut self, rec: &Record) {
        match rec {
            Record::Volume(v) => {
                self.vol_by_name.remove(&v.name);
            }
            Record::Snapshot(s) => {
                self.snap_by_name.remove(&(s.volume, s.name.clone()));
                if let Some(set) = self.snaps_by_vol.get_mut(&s.volume) {
                    set.remove(&s.id);
                    if set.is_empty() {
                        self.snaps_by_vol.remove(&s.volume);
                    }
                }
            }
            Record::Retired(r) => {
                if let Some(set) = self.retired_by_name.get_mut(&r.name) {
                    set.remove(&r.id);
                    if set.is_empty() {
                        self.retired_by_name.remove(&r.name);
                    }
                }
            }
        }
    }

    /// The volume, live or retired, that a reference names, for the
    /// operations on its snapshots. A reference is `NAME@ID` (the volume
    /// with pool id ID, which must be named NAME: unambiguous whatever else
    /// has the name) or `NAME`: the live volume of that name, else the one
    /// retired volume of that name; several retired and no live one is an
    /// error that lists their references. The naming rule has no `@`, so
    /// the two forms never meet.
    pub fn owner_id(&self, reference: &str) -> Result<u64> {
        if let Some((name, id)) = reference.rsplit_once('@') {
            let found = id
                .parse::<u64>()
                .ok()
                .filter(|n| n.to_string() == id && self.owner_name(*n) == Some(name));
            return found.ok_or_else(|| Error::VolumeNotFound(reference.to_string()));
        }
        if let Some(&id) = self.vol_by_name.get(reference) {
            return Ok(id);
        }
        match self.retired_by_name.get(reference) {
            Some(ids) if ids.len() == 1 => Ok(*ids.first().expect("one")),
            Some(ids) => Err(Error::AmbiguousVolume {
                name: reference.to_string(),
                references: ids.iter().map(|id| format!("{reference}@{id}")).collect(),
            }),
            None => Err(Error::VolumeNotFound(reference.to_string())),
        }
    }

    /// The name of volume `id`, live or retired.
    pub fn owner_name(&self, id: u64) -> Option<&str> {
        match self.records.get(&id) {
            Some(Record::Volume(v)) => Some(&v.name),
            Some(Record::Retired(r)) => Some(&r.name),
            _ => None,
        }
    }

    /// How to name volume `id` so that it resolves to it alone: its name
    /// when it is live, `NAME@ID` when it is retired.
    pub fn owner_reference(&self, id: u64) -> String {
        match self.records.get(&id) {
            Some(Record::Retired(r)) => format!("{}@{}", r.name, r.id),
            Some(Record::Volume(v)) => v.name.clone(),
            _ => format!("#{id}"),
        }
    }

    pub fn is_retired(&self, id: u64) -> bool {
        matches!(self.records.get(&id), Some(Record::Retired(_)))
    }

    pub fn retired(&self) -> impl Iterator<Item = &RetiredRec> {
        self.records.values().filter_map(|r| match r {
            Record::Retired(r) => Some(r),
            _ => None,
        })
    }

    /// Live volumes that still share blocks with a snapshot of volume
    /// `vid` (their clone link names it, and is not yet flattened away).
    pub fn linked_clones_of_volume(&self, vid: u64) -> impl Iterator<Item = &VolumeRec> {
        self.volumes().filter(move |v| {
            v.origin
                .as_ref()
                .is_some_and(|o| o.volume == vid && o.root != 0)
        })
    }

    pub fn volume_id(&self, name: &str) -> Result<u64> {
        self.vol_by_name
            .get(name)
            .copied()
            .ok_or_else(|| Error::VolumeNotFound(name.to_string()))
    }

    pub fn volume(&self, id: u64) -> &VolumeRec {
        match self.records.get(&id) {
            Some(Record::Volume(v)) => v,
            _ => panic!("catalog index names volume {id} but holds no such record"),
        }
    }

    pub fn volume_mut(&mut self, id: u64) -> &mut VolumeRec {
        self.touched = true;
        self.dirty.insert(id);
        match self.records.get_mut(&id) {
            Some(Record::Volume(v)) => v,
            _ => panic!("catalog index names volume {id} but holds no such record"),
        }
    }

    pub fn snapshot_id(&self, vol: u64, name: &str) -> Result<u64> {
        self.snap_by_name
            .get(&(vol, name.to_string()))
            .copied()
            .ok_or_else(|| Error::SnapshotNotFound {
                volume: self.owner_reference(vol),
                snapshot: name.to_string(),
            })
    }

    /// (volume id, snapshot id) of `volume/snapshot`, where `volume` is a
    /// reference to a live or retired volume ([`Catalog::owner_id`]).
    pub fn snapshot_ids(&self, volume: &str, snapshot: &str) -> Result<(u64, u64)> {
        let vid = self.owner_id(volume)?;
        Ok((vid, self.snapshot_id(vid, snapshot)?))
    }

    /// The record of a snapshot looked up earlier, unless deleted since.
    pub fn snapshot_still(&self, id: u64, volume: &str, snapshot: &str) -> Result<SnapshotRec> {
        self.snapshot(id)
            .cloned()
            .ok_or_else(|| Error::SnapshotNotFound {
                volume: volume.into(),
                snapshot: snapshot.into(),
            })
    }

    pub fn has_snapshot(&self, vol: u64, name: &str) -> bool {
        self.snap_by_name.contains_key(&(vol, name.to_string()))
    }

    pub fn snapshot(&self, id: u64) -> Option<&SnapshotRec> {
        match self.records.get(&id) {
            Some(Record::Snapshot(s)) => Some(s),
            _ => None,
        }
    }

    pub fn snapshot_mut(&mut self, id: u64) -> &mut SnapshotRec {
        self.touched = true;
        self.dirty.insert(id);
        match self.records.get_mut(&id) {
            Some(Record::Snapshot(s)) => s,
            _ => panic!("no snapshot record {id}"),
        }
    }

    pub fn volumes(&self) -> impl Iterator<Item = &VolumeRec> {
        self.records.values().filter_map(|r| match r {
            Record::Volume(v) => Some(v),
            _ => None,
        })
    }

    /// Volumes (live and retired) and snapshots, in O(1).
    pub fn record_count(&self) -> usize {
        self.records.len()
    }

    pub fn snapshots(&self) -> impl Iterator<Item = &SnapshotRec> {
        self.records.values().filter_map(|r| match r {
            Record::Snapshot(s) => Some(s),
            _ => None,
        })
    }

    /// A volume's snapshots, oldest first.
    pub fn snapshots_of(&self, vol: u64) -> Vec<&SnapshotRec> {
        let ids = self.snaps_by_vol.get(&vol);
        ids.into_iter()
            .flatten()
            .filter_map(|id| self.snapshot(*id))
            .collect()
    }

    /// The snapshot of volume `vol` taken next after snapshot `id`.
    pub fn next_snapshot_of(&self, vol: u64, id: u64) -> Option<&SnapshotRec> {
        let ids = self.snaps_by_vol.get(&vol)?;
        ids.range(id + 1..).find_map(|n| self.snapshot(*n))
    }

    pub fn get(&self, id: u64) -> Option<&Record> {
        self.records.get(&id)
    }
}

fn capacity(levels: u8) -> u64 {
    (FANOUT as u64).saturating_pow(levels as u32)
}

impl Meta {
    /// Add a record: give it a page and an entry in the catalog tree.
    pub fn create_record(&mut self, rec: Record) -> Result<()> {
        let mut scratch = new_page();
        rec.encode(&mut scratch)?; // refuse what would not fit, before changing anything
        let id = rec.id();
        while capacity(self.sb.catalog_levels) <= id {
            let top = self.alloc_node(self.sb.catalog_levels)?;
            let old = self.sb.catalog_root;
            node::set_entry(self.page_mut(top, MAGIC_NODE)?, 0, old);
            self.sb.catalog_root = top;
            self.sb.catalog_levels += 1;
        }
        let block = self.alloc_meta()?;
        let mut root = self.sb.catalog_root;
        let old = self.tree_set(&mut root, self.sb.catalog_levels, id, block)?;
        debug_assert_eq!(old, 0);
        self.sb.catalog_root = root;
        self.sb_dirty = true;
        self.catalog.index(&rec);
        self.catalog.blocks.insert(id, block);
        self.catalog.records.insert(id, rec);
        self.catalog.dirty.insert(id);
        self.catalog.touched = true;
        Ok(())
    }

    /// Remove a record and free its page.
    pub fn delete_record(&mut self, id: u64) -> Result<()> {
        let mut root = self.sb.catalog_root;
        let old = self.tree_set(&mut root, self.sb.catalog_levels, id, 0)?;
        self.sb.catalog_root = root;
        self.sb_dirty = true;
        if old != 0 {
            self.release_block(old, false)?;
        }
        self.catalog.blocks.remove(&id);
        self.catalog.dirty.remove(&id);
        self.catalog.touched = true;
        if let Some(rec) = self.catalog.records.remove(&id) {
            self.catalog.unindex(&rec);
        }
        Ok(())
    }

    /// Put `rec` in place of the record with its id, in the same page
    /// (written when the transaction commits).
    pub fn replace_record(&mut self, rec: Record) -> Result<()> {
        let mut scratch = new_page();
        rec.encode(&mut scratch)?;
        let id = rec.id();
        let old = self
            .catalog
            .records
            .remove(&id)
            .expect("replace_record of a record that exists");
        self.catalog.unindex(&old);
        self.catalog.index(&rec);
        self.catalog.records.insert(id, rec);
        self.catalog.dirty.insert(id);
        self.catalog.touched = true;
        Ok(())
    }

    /// Write every dirty record into its page (part of collecting a commit).
    pub fn flush_records(&mut self) -> Result<()> {
        let dirty: Vec<u64> = self.catalog.dirty.drain().collect();
        for id in dirty {
            let (Some(rec), Some(&block)) =
                (self.catalog.records.get(&id), self.catalog.blocks.get(&id))
            else {
                continue;
            };
            let mut p = new_page();
            rec.encode(&mut p)?;
            self.cache.insert(block, p, true);
        }
        Ok(())
    }

    /// Read every record from disk into the in-memory catalog.
    pub fn load_catalog(&mut self) -> Result<()> {
        let entries = self.tree_entries(self.sb.catalog_root, self.sb.catalog_levels)?;
        for (id, block) in entries {
            let p = self.page(block, MAGIC_RECORD)?;
            let rec = Record::decode(p, block)?;
            if rec.id() != id {
                return Err(Error::corrupt(
                    block,
                    format!("record {} filed under id {id}", rec.id()),
                ));
            }
            self.catalog.index(&rec);
            self.catalog.blocks.insert(id, block);
            self.catalog.records.insert(id, rec);
        }
        // Every snapshot must belong to a volume, live or retired.
        for s in self.catalog.snapshots() {
            if self.catalog.owner_name(s.volume).is_none() {
                let block = self.catalog.blocks[&s.id];
                return Err(Error::corrupt(
                    block,
                    format!(
                        "snapshot {:?} names volume #{} that does not exist",
                        s.name, s.volume
                    ),
                ));
            }
        }
        Ok(())
    }
}
