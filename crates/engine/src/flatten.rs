//! Flatten: make a linked clone independent of its origin by giving it
//! private copies of every block it still shares with the origin snapshot,
//! a chunk at a time, in the background, while the clone stays online.
//! Progress survives nothing: after a restart the flatten starts over, which
//! is cheap, since blocks already copied no longer match the origin.

use crate::error::{Error, Result};
use crate::format::*;
use crate::ops::blocks_of;
use crate::order::Rank;
use crate::pool::{FlattenProgress, Pool};
use std::sync::atomic::Ordering;
use std::sync::Arc;

const CHUNK_BLOCKS: u64 = 16 * FANOUT as u64;

impl Pool {
    /// Start flattening a linked clone in the background (or, when the pool
    /// runs without background threads, right away). Returns its progress.
    pub fn flatten(&self, volume: &str) -> Result<Arc<FlattenProgress>> {
        let id = self.with_meta(|m| {
            let id = m.catalog.volume_id(volume)?;
            let v = m.catalog.volume(id);
            match &v.origin {
                Some(o) if o.root != 0 => {}
                _ => {
                    return Err(Error::Conflict(format!(
                        "volume {volume:?} is not a linked clone"
                    )))
                }
            }
            if !v.flattening {
                m.catalog.volume_mut(id).flattening = true;
            }
            Ok(id)
        })?;
        self.commit()?;
        if let Some(p) =
            crate::order::hold(Rank::Flatten, 0, || self.inner.flatten.lock().unwrap()).get(&id)
        {
            if !p.finished.load(Ordering::SeqCst) {
                return Ok(p.clone());
            }
        }
        if self.inner.opts.background {
            Ok(self.start_flatten_thread(id))
        } else {
            let p = Arc::new(FlattenProgress::default());
            crate::order::hold(Rank::Flatten, 0, || self.inner.flatten.lock().unwrap())
                .insert(id, p.clone());
            self.run_flatten(id, &p)?;
            Ok(p)
        }
    }

    pub(crate) fn start_flatten_thread(&self, id: u64) -> Arc<FlattenProgress> {
        let p = Arc::new(FlattenProgress::default());
        crate::order::hold(Rank::Flatten, 0, || self.inner.flatten.lock().unwrap())
            .insert(id, p.clone());
        let (pool, prog) = (self.clone(), p.clone());
        let t = std::thread::Builder::new()
            .name("lamina-flatten".into())
            .spawn(move || {
                if let Err(e) = pool.run_flatten(id, &prog) {
                    tracing::warn!(volume = id, error = %e, "flatten stopped");
                    **crate::order::hold(Rank::FlattenError, 0, || prog.error.lock().unwrap()) =
                        Some(e.to_string());
                }
                prog.finished.store(true, Ordering::SeqCst);
            })
            .expect("spawn flatten thread");
        self.add_thread(t);
        p
    }

    pub(crate) fn stop_flatten(&self, id: u64) {
        if let Some(p) =
            crate::order::hold(Rank::Flatten, 0, || self.inner.flatten.lock().unwrap()).get(&id)
        {
            **crate::order::hold(Rank::FlattenError, 0, || p.error.lock().unwrap()) =
                Some("volume deleted".into());
        }
    }

    fn flatten_cancelled(&self, p: &FlattenProgress) -> bool {
        self.stopping()
            || crate::order::hold(Rank::FlattenError, 0, || p.error.lock().unwrap()).is_some()
    }

    fn run_flatten(&self, id: u64, p: &FlattenProgress) -> Result<()> {
        let blocks = blocks_of(self.with_meta(|m| Ok(m.catalog.volume(id).size))?);
        p.total.store(blocks * BLOCK as u64, Ordering::SeqCst);
        let gate = self.gate(id);
        let mut lo = 0;
        while lo < blocks {
            if self.flatten_cancelled(p) {
                return Ok(());
            }
            let hi = (lo + CHUNK_BLOCKS).min(blocks);
            {
                let _g = crate::order::gate_shared(&gate, id);
                let shared = self.with_meta(|m| {
                    let Some(crate::format::Record::Volume(v)) = m.catalog.get(id).cloned() else {
                        return Err(Error::VolumeNotFound(format!("#{id}")));
                    };
                    let Some(o) = v.origin.filter(|o| o.root != 0) else {
                        return Ok(Vec::new());
                    };
                    let mut list = Vec::new();
                    m.tree_compare(
                        (o.root, o.levels),
                        (v.root, v.levels),
                        lo,
                        hi,
                        true,
                        &mut |i, a, b| {
                            if a == b && a != 0 {
                                list.push(i)
                            }
                        },
                    )?;
                    Ok(list)
                })?;
                for idx in shared {
                    self.unshare_block(id, idx)?;
                }
            }
            self.maybe_commit()?;
            lo = hi;
            p.done.store(lo * BLOCK as u64, Ordering::SeqCst);
        }
        let g = crate::order::gate_exclusive(&gate, id);
        let origin = self.with_meta(|m| {
            let v = m.catalog.volume_mut(id);
            v.flattening = false;
            let origin = v.origin.as_ref().map(|o| (o.volume, o.snapshot));
            let root = v
                .origin
                .as_mut()
                .map(|o| std::mem::replace(&mut o.root, 0))
                .unwrap_or(0);
            m.release_root(root)?;
            // The link held a retired origin volume that nothing else holds.
            if let Some((vol, _)) = origin.filter(|_| root != 0) {
                Self::drop_retired_if_unused(m, vol)?;
            }
            Ok(origin)
        })?;
        self.commit()?;
        drop(g);
        self.wake_background();
        // A clone of a volume no longer needs the system snapshot it was
        // made from.
        if let Some((vol, snap)) = origin {
            self.release_system_snapshot(vol, snap)?;
        }
        p.done
            .store(p.total.load(Ordering::SeqCst), Ordering::SeqCst);
        tracing::info!(volume = id, "flatten finished");
        Ok(())
    }
}
