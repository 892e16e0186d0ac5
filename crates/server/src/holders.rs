//! Which other nodes hold a snapshot of this node's, for the transfer
//! listener to name in its Answers (`lamina_transfer::Holders`), so that a
//! pull from this node can go on from another if this one goes away:
//!
//! - on a replicated volume's front end's node, the other replicas in its
//!   replica set, in order, but those that missed the snapshot (they do
//!   not hold it yet) and those it was deleted for while they were out;
//! - on a node holding a replica for another node's front end (its volume
//!   labelled `lamina.io/replica-of=NODE`), that front end's node, if the
//!   node list here has its address;
//! - else none.
//!
//! Naming a node is no promise: each one asked says whether it holds the
//! snapshot, and whether it is the same one (by its identity,
//! `lamina_transfer::identity`).

use crate::store::Store;
use lamina_transfer::Holder;

/// This node's knowledge of who else holds its snapshots.
pub struct Known {
    pool: lamina_engine::Pool,
    store: std::sync::Arc<Store>,
}

impl Known {
    pub fn new(pool: lamina_engine::Pool, store: std::sync::Arc<Store>) -> Known {
        Known { pool, store }
    }

    fn find(&self, volume: &str, snapshot: &str) -> Result<Vec<Holder>, String> {
        let set =
            crate::front::replica_set(&self.store, &self.pool, volume).map_err(|e| e.1.message)?;
        if let Some(set) = set {
            let holds = |r: &&crate::store::ReplicaRec| {
                !r.address.is_empty()
                    && !r.missed_snapshots.iter().any(|s| s == snapshot)
                    && !r.pending_deletes.iter().any(|s| s == snapshot)
            };
            return Ok(set
                .replicas
                .iter()
                .skip(1)
                .filter(holds)
                .map(|r| Holder {
                    node: r.node.clone(),
                    address: crate::front::remote_of(&self.store, r).address,
                })
                .collect());
        }
        let Ok(v) = self.pool.volume_info_by_name(volume) else {
            return Ok(Vec::new());
        };
        let front = v
            .labels
            .iter()
            .find(|(k, _)| k == crate::replicas::REPLICA_OF)
            .map(|(_, n)| n.clone());
        let Some(front) = front else {
            return Ok(Vec::new());
        };
        Ok(self
            .store
            .node(&front)
            .map_err(|e| e.to_string())?
            .map(|n| Holder {
                node: n.name,
                address: n.address,
            })
            .into_iter()
            .collect())
    }
}

impl lamina_transfer::Holders for Known {
    fn holders(&self, volume: &str, snapshot: &str) -> Vec<Holder> {
        self.find(volume, snapshot).unwrap_or_else(|e| {
            tracing::warn!(volume, snapshot, error = %e, "cannot name the other holders of a snapshot");
            Vec::new()
        })
    }
}
