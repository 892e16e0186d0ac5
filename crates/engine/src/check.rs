//! `lamina pool check`: verify a pool offline. Every tree is walked from
//! every root (volumes, snapshots, clone links, the catalog, the dead list)
//! to compute what each block's refcount must be; the refcount pages are then
//! compared block by block, and every page read is checksum-verified.
//! Memory grows with the pool (one counter per referenced block): this is an
//! offline tool, not part of the I/O path. Offline, the pool is read and
//! never written ([`Pool::check_read_only`]): a check must be safe on any
//! pool, a damaged one or one on a full disk included.

use crate::error::Result;
use crate::format::*;
use crate::meta::Meta;
use crate::pool::{Pool, PoolOptions};
use crate::storage::{Backend, DirBackend};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

/// What a check found.
#[derive(Debug, Default, Clone)]
pub struct CheckReport {
    pub total_blocks: u64,
    /// Index nodes reached, the catalog's included.
    pub tree_nodes: u64,
    /// Data blocks reached, the catalog's record pages included.
    pub data_blocks: u64,
    /// Of those, the catalog tree's nodes and its record pages.
    pub catalog_nodes: u64,
    pub catalog_pages: u64,
    pub volumes: u64,
    /// Deleted volumes whose records remain for their snapshots and clones.
    pub retired_volumes: u64,
    pub snapshots: u64,
    pub dead_nodes: u64,
    /// Blocks whose refcount says used but nothing references (leaked).
    pub leaked: u64,
    /// Everything wrong, one line each (the first 100).
    pub problems: Vec<String>,
    pub problem_count: u64,
    /// Page-log transactions not yet copied home, read where they are
    /// ([`Pool::check_read_only`]; 0 for a check of an open pool).
    pub log_transactions: u64,
    /// Journal records applied in memory ([`Pool::check_read_only`]; 0 for
    /// a check of an open pool, whose open applied them).
    pub journal_records: u64,
}

impl CheckReport {
    /// Index nodes and data blocks of volumes, snapshots and dead trees,
    /// the catalog's left out: what deleting snapshots can free.
    pub fn tree_blocks(&self) -> (u64, u64) {
        (
            self.tree_nodes - self.catalog_nodes,
            self.data_blocks - self.catalog_pages,
        )
    }

    pub fn is_ok(&self) -> bool {
        self.problem_count == 0
    }

    fn problem(&mut self, p: String) {
        self.problem_count += 1;
        if self.problems.len() < 100 {
            self.problems.push(p);
        }
    }
}

struct Walk<'a> {
    m: &'a mut Meta,
    expected: HashMap<u64, u32>,
    visited: HashSet<u64>,
    report: CheckReport,
}

impl Walk<'_> {
    fn reference(&mut self, b: u64, what: &str) -> bool {
        if b >= self.m.sb.total_blocks || is_system_block(b) {
            self.report.problem(format!(
                "{what} points at block {b}, outside the usable pool"
            ));
            return false;
        }
        *self.expected.entry(b).or_default() += 1;
        true
    }

    /// Count a reference to node `b` and, on first visit, everything below it.
    fn node(&mut self, b: u64, level: u8, what: &str) {
        if !self.reference(b, what) || !self.visited.insert(b) {
            return;
        }
        self.children(b, level, what);
    }

    fn children(&mut self, b: u64, level: u8, what: &str) {
        let entries: Vec<u64> = match self.m.page(b, MAGIC_NODE) {
            Ok(p) if node::level(p) == level => (0..FANOUT).map(|i| node::entry(p, i)).collect(),
            Ok(p) => {
                let l = node::level(p);
                self.report
                    .problem(format!("{what}: node {b} has level {l}, expected {level}"));
                return;
            }
            Err(e) => {
                self.report.problem(format!("{what}: {e}"));
                return;
            }
        };
        self.report.tree_nodes += 1;
        for e in entries.into_iter().filter(|&e| e != 0) {
            if level == 0 {
                if self.reference(e, what) && self.visited.insert(e) {
                    self.report.data_blocks += 1;
                }
            } else {
                self.node(e, level - 1, what);
            }
        }
    }
}

impl Pool {
    /// Verify the pool: refcounts, reachability and checksums. Commits
    /// first and holds the metadata lock throughout.
    pub fn check(&self) -> Result<CheckReport> {
        self.commit()?;
        self.lock_meta().verify_all()
    }

    /// Verify the pool in a directory without writing to it (`lamina pool
    /// check`): its files are opened read-only and what a crash left in
    /// the page log and the journal is applied in memory, as the next
    /// open will apply it, and checked with the rest; the report says how
    /// much there was. Nothing needs disk space, so a pool on a full disk
    /// checks too. The pool must not be open elsewhere (its lock is taken).
    pub fn check_read_only(dir: impl AsRef<Path>, opts: PoolOptions) -> Result<CheckReport> {
        let backend: Arc<dyn Backend> = Arc::new(DirBackend::new(dir.as_ref()));
        let (mut meta, transactions, records) = Pool::open_meta_read_only(backend, &opts)?;
        let mut report = meta.verify_all()?;
        report.log_transactions = transactions;
        report.journal_records = records as u64;
        Ok(report)
    }
}

impl Meta {
    fn verify_all(&mut self) -> Result<CheckReport> {
        let mut w = Walk {
            m: self,
            expected: HashMap::new(),
            visited: HashSet::new(),
            report: CheckReport::default(),
        };
        w.report.total_blocks = w.m.sb.total_blocks;

        // The catalog tree and its record pages.
        let (croot, clevels) = (w.m.sb.catalog_root, w.m.sb.catalog_levels);
        if croot != 0 {
            w.node(croot, clevels - 1, "catalog");
        }
        w.report.catalog_nodes = w.report.tree_nodes;
        w.report.catalog_pages = w.report.data_blocks;
        let records: Vec<Record> = w.m.catalog_records();
        let ids: HashSet<u64> = records.iter().map(|r| r.id()).collect();
        // Volumes, live and retired: what a snapshot may belong to.
        let volume_ids: HashSet<u64> = records
            .iter()
            .filter(|r| !matches!(r, Record::Snapshot(_)))
            .map(|r| r.id())
            .collect();
        // Retired volumes something still names (a snapshot of theirs, a
        // linked clone sharing blocks with one): any other is a leaked record.
        let named: HashSet<u64> = records
            .iter()
            .filter_map(|r| match r {
                Record::Snapshot(s) => Some(s.volume),
                Record::Volume(v) => v.origin.as_ref().filter(|o| o.root != 0).map(|o| o.volume),
                Record::Retired(_) => None,
            })
            .collect();
        let mut live_names = HashSet::new();
        for r in &records {
            match r {
                Record::Volume(v) => {
                    w.report.volumes += 1;
                    let what = format!("volume {:?}", v.name);
                    if !live_names.insert(v.name.clone()) {
                        w.report
                            .problem(format!("{what}: two live volumes have the name"));
                    }
                    if crate::tree::span(v.levels) < crate::ops::blocks_of(v.size) {
                        w.report.problem(format!(
                            "{what}: tree of height {} cannot hold {} bytes",
                            v.levels, v.size
                        ));
                    }
                    if v.root != 0 {
                        w.node(v.root, v.levels - 1, &what);
                    }
                    if let Some(o) = &v.origin {
                        if o.root != 0 {
                            w.node(o.root, o.levels - 1, &format!("{what} (clone link)"));
                            if !volume_ids.contains(&o.volume) {
                                w.report.problem(format!(
                                    "{what}: linked clone of volume #{}, which has no record",
                                    o.volume
                                ));
                            }
                        }
                    }
                    if v.parent != 0 && !ids.contains(&v.parent) {
                        w.report.problem(format!(
                            "{what}: parent snapshot #{} does not exist",
                            v.parent
                        ));
                    }
                }
                Record::Snapshot(s) => {
                    w.report.snapshots += 1;
                    let what = format!("snapshot {:?} (#{})", s.name, s.id);
                    if s.root != 0 {
                        w.node(s.root, s.levels - 1, &what);
                    }
                    if !volume_ids.contains(&s.volume) {
                        w.report
                            .problem(format!("{what}: its volume #{} does not exist", s.volume));
                    }
                    if s.parent != 0 && !ids.contains(&s.parent) {
                        w.report
                            .problem(format!("{what}: parent #{} does not exist", s.parent));
                    }
                }
                Record::Retired(r) => {
                    w.report.retired_volumes += 1;
                    if !named.contains(&r.id) {
                        w.report.problem(format!(
                            "retired volume {:?} (#{}): no snapshot or linked clone names it, yet its record remains",
                            r.name, r.id
                        ));
                    }
                }
            }
        }

        // Dead nodes awaiting reclaim still hold their children.
        let mut dead = HashSet::new();
        let mut b = w.m.sb.dead_head;
        while b != 0 {
            if b >= w.m.sb.total_blocks || !dead.insert(b) {
                w.report
                    .problem(format!("dead list is broken at block {b}"));
                break;
            }
            let (next, level) = match w.m.page(b, MAGIC_NODE) {
                Ok(p) => (node::next_dead(p), node::level(p)),
                Err(e) => {
                    w.report.problem(format!("dead list: {e}"));
                    break;
                }
            };
            w.report.dead_nodes += 1;
            if w.visited.insert(b) {
                w.children(b, level, "dead node");
            } else {
                w.report
                    .problem(format!("dead node {b} is still referenced"));
            }
            b = next;
        }

        // Compare with the refcount pages.
        let total = w.m.sb.total_blocks;
        for g in 0..total / GROUP {
            let rcb = g * GROUP + 1;
            let counts: Vec<u32> = match w.m.page(rcb, MAGIC_RC) {
                Ok(p) => (0..GROUP as usize).map(|i| rc::get(p, i)).collect(),
                Err(e) => {
                    w.report.problem(format!("refcount page of group {g}: {e}"));
                    continue;
                }
            };
            for (i, &stored) in counts.iter().enumerate() {
                let blk = g * GROUP + i as u64;
                let want = if is_system_block(blk) {
                    RC_SYSTEM
                } else if dead.contains(&blk) {
                    RC_DEAD
                } else {
                    w.expected.get(&blk).copied().unwrap_or(0)
                };
                if stored == want {
                    continue;
                }
                if want == 0 && stored != 0 {
                    w.report.leaked += 1;
                    w.report.problem(format!(
                        "block {blk}: refcount {stored:#x} but nothing references it (leaked)"
                    ));
                } else {
                    w.report.problem(format!(
                        "block {blk}: refcount {stored:#x}, expected {want:#x}"
                    ));
                }
            }
        }
        Ok(w.report)
    }

    pub(crate) fn catalog_records(&self) -> Vec<Record> {
        self.catalog
            .volumes()
            .cloned()
            .map(Record::Volume)
            .chain(self.catalog.retired().cloned().map(Record::Retired))
            .chain(self.catalog.snapshots().cloned().map(Record::Snapshot))
            .collect()
    }
}
