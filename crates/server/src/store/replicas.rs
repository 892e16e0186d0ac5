//! Replicated volumes' records, kept by the daemon that runs the volume's
//! front end (docs/replicas.md): which nodes hold a replica, which of them
//! are healthy (hold every acknowledged write), and the generation the
//! front end last took. Table `replica_sets`: volume name → [`ReplicaSetRec`]
//! (JSON). Every change is one write transaction, durable when it returns:
//! a replica is recorded faulted before any write it missed is
//! acknowledged, and a generation is taken before any replica is opened
//! at it.

use super::db::Fail;
use super::Store;
use crate::error::ServerError;
use redb::{ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

const SETS: TableDefinition<&str, &str> = TableDefinition::new("replica_sets");

/// A replicated volume as recorded.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReplicaSetRec {
    /// The pool's id of the local volume: a record of a volume deleted and
    /// made again under its name is not this one's.
    pub volume_id: u64,
    /// The last generation a front end took (0: none yet).
    pub generation: u64,
    /// In order, this node's first.
    pub replicas: Vec<ReplicaRec>,
}

/// One replica as recorded.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReplicaRec {
    pub node: String,
    /// Its node's transfer listener, `HOST:PORT`; empty for this node's.
    pub address: String,
    /// Why it was faulted; none while healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub faulted: Option<String>,
    /// Since when it is in its state (Unix seconds).
    pub since: i64,
}

fn parse(volume: &str, json: &str) -> Result<ReplicaSetRec, Fail> {
    serde_json::from_str(json).map_err(|e| {
        Fail::other(ServerError::record(format!(
            "replica set of volume {volume}"
        ))(e))
    })
}

impl Store {
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

    /// Record `rec` as volume `volume`'s replica set (replacing any).
    pub fn put_replica_set(&self, volume: &str, rec: &ReplicaSetRec) -> Result<(), ServerError> {
        let json = serde_json::to_string(rec)?;
        self.db.commit(|w| {
            w.open_table(SETS)?.insert(volume, json.as_str())?;
            Ok(())
        })
    }

    /// Forget volume `volume`'s replica set; whether there was one.
    pub fn remove_replica_set(&self, volume: &str) -> Result<bool, ServerError> {
        let mut existed = false;
        self.db.commit(|w| {
            existed = w.open_table(SETS)?.remove(volume)?.is_some();
            Ok(())
        })?;
        Ok(existed)
    }

    /// Change volume `volume`'s replica set with `f` in one write
    /// transaction; the set as written. A volume with none is an error.
    fn change_replica_set(
        &self,
        volume: &str,
        f: impl FnOnce(&mut ReplicaSetRec),
    ) -> Result<ReplicaSetRec, ServerError> {
        let mut out = None;
        let mut f = Some(f);
        self.db.commit(|w| {
            let mut t = w.open_table(SETS)?;
            let found = t
                .get(volume)?
                .map(|v| parse(volume, v.value()))
                .transpose()?;
            let Some(mut rec) = found else {
                return Err(Fail::other(ServerError::Config(format!(
                    "volume {volume} has no replica set"
                ))));
            };
            if let Some(f) = f.take() {
                f(&mut rec);
            }
            let json = serde_json::to_string(&rec).map_err(|e| Fail::other(e.into()))?;
            t.insert(volume, json.as_str())?;
            out = Some(rec);
            Ok(())
        })?;
        Ok(out.expect("the transaction ran"))
    }

    /// Take the next generation of volume `volume`'s front end: durable
    /// when it returns.
    pub fn next_replica_generation(&self, volume: &str) -> Result<ReplicaSetRec, ServerError> {
        self.change_replica_set(volume, |r| r.generation += 1)
    }

    /// Record replica `node` of volume `volume` faulted for `reason` (at
    /// `now`, Unix seconds), unless it is already: durable when it returns.
    pub fn fault_replica(
        &self,
        volume: &str,
        node: &str,
        reason: &str,
        now: i64,
    ) -> Result<ReplicaSetRec, ServerError> {
        self.change_replica_set(volume, |r| {
            if let Some(x) = r.replicas.iter_mut().find(|x| x.node == node) {
                if x.faulted.is_none() {
                    x.faulted = Some(reason.to_string());
                    x.since = now;
                }
            }
        })
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
        };
        ReplicaSetRec {
            volume_id: 3,
            generation: 0,
            replicas: vec![r("a", ""), r("b", "10.0.0.2:7481"), r("c", "10.0.0.3:7481")],
        }
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
        assert_eq!(store.next_replica_generation("v").unwrap().generation, 1);
        assert_eq!(store.next_replica_generation("v").unwrap().generation, 2);
        let f = store
            .fault_replica("v", "b", "no answer for 5 s", 9)
            .unwrap();
        assert_eq!(f.replicas[1].faulted.as_deref(), Some("no answer for 5 s"));
        assert_eq!(f.replicas[1].since, 9);
        // Faulted once: a later fault keeps the first reason and time.
        let again = store.fault_replica("v", "b", "other", 11).unwrap();
        assert_eq!(again, f);
        drop(store);
        let store = Store::open(&path).unwrap();
        let got = store.replica_set("v").unwrap().unwrap();
        assert_eq!(
            (got.generation, got.replicas[1].faulted.clone()),
            (2, Some("no answer for 5 s".into()))
        );
        assert!(store.remove_replica_set("v").unwrap());
        assert!(!store.remove_replica_set("v").unwrap());
        assert_eq!(store.replica_set("v").unwrap(), None);
    }
}
