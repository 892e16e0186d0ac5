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
        }
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
                volume: self.volume(vol).name.clone(),
                snapshot: name.to_string(),
            })
    }

    /// (volume id, snapshot id) of `volume/snapshot`.
    pub fn snapshot_ids(&self, volume: &str, snapshot: &str) -> Result<(u64, u64)> {
        let vid = self.volume_id(volume)?;
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

    /// Volumes and snapshots, in O(1).
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
        match self.catalog.records.remove(&id) {
            Some(Record::Volume(v)) => {
                self.catalog.vol_by_name.remove(&v.name);
            }
            Some(Record::Snapshot(s)) => {
                self.catalog.snap_by_name.remove(&(s.volume, s.name));
                if let Some(set) = self.catalog.snaps_by_vol.get_mut(&s.volume) {
                    set.remove(&s.id);
                    if set.is_empty() {
                        self.catalog.snaps_by_vol.remove(&s.volume);
                    }
                }
            }
            None => {}
        }
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
        // Every snapshot must belong to a volume.
        for s in self.catalog.snapshots() {
            if !matches!(self.catalog.records.get(&s.volume), Some(Record::Volume(_))) {
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
