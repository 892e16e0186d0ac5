//! The node list: other Lamina nodes this daemon knows by name, and where
//! their transfer listeners answer. Table `nodes`: name → [`NodeRec`]
//! (JSON). An add checks and writes in one write transaction (redb runs
//! one at a time), so two adds of one name cannot both succeed with
//! different addresses.

use super::db::Fail;
use super::Store;
use crate::error::ServerError;
use redb::{ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

const NODES: TableDefinition<&str, &str> = TableDefinition::new("nodes");

/// A node as stored.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeRec {
    pub name: String,
    /// Its transfer listener, `HOST:PORT`.
    pub address: String,
    /// Unix seconds.
    pub added: i64,
}

/// What an add found.
#[derive(Debug, PartialEq, Eq)]
pub enum Added {
    /// Written now.
    New(NodeRec),
    /// There already, with the same address.
    Same(NodeRec),
    /// There already, with another address (nothing changed).
    Other(NodeRec),
}

fn parse(name: &str, json: &str) -> Result<NodeRec, Fail> {
    serde_json::from_str(json)
        .map_err(|e| Fail::other(ServerError::record(format!("node record {name}"))(e)))
}

impl Store {
    /// Every node, by name.
    pub fn nodes(&self) -> Result<Vec<NodeRec>, ServerError> {
        self.db.read(|r| {
            let t = match r.open_table(NODES) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            };
            let mut out = Vec::new();
            for e in t.iter()? {
                let (k, v) = e?;
                out.push(parse(k.value(), v.value())?);
            }
            Ok(out)
        })
    }

    pub fn node(&self, name: &str) -> Result<Option<NodeRec>, ServerError> {
        self.db.read(|r| {
            let t = match r.open_table(NODES) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            let found = t.get(name)?;
            found.map(|v| parse(name, v.value())).transpose()
        })
    }

    /// Add `rec` unless its name is there: durable when it returns, and
    /// not there if the store failed on it (the caller answers an error).
    pub fn add_node(&self, rec: &NodeRec) -> Result<Added, ServerError> {
        let json = serde_json::to_string(rec)?;
        let mut added = None;
        self.db.commit(|w| {
            let mut t = w.open_table(NODES)?;
            let old = t
                .get(rec.name.as_str())?
                .map(|v| parse(&rec.name, v.value()))
                .transpose()?;
            added = Some(match old {
                Some(old) if old.address == rec.address => Added::Same(old),
                Some(old) => Added::Other(old),
                None => {
                    t.insert(rec.name.as_str(), json.as_str())?;
                    Added::New(rec.clone())
                }
            });
            Ok(())
        })?;
        Ok(added.expect("the transaction ran"))
    }

    /// Remove node `name`; whether it was there.
    pub fn remove_node(&self, name: &str) -> Result<bool, ServerError> {
        let mut existed = false;
        self.db.commit(|w| {
            existed = w.open_table(NODES)?.remove(name)?.is_some();
            Ok(())
        })?;
        Ok(existed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, address: &str) -> NodeRec {
        NodeRec {
            name: name.into(),
            address: address.into(),
            added: 7,
        }
    }

    #[test]
    fn nodes_are_added_once_listed_by_name_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store.redb")).unwrap();
        assert_eq!(store.nodes().unwrap(), vec![]);
        assert_eq!(store.node("b").unwrap(), None);
        let b = rec("b", "10.0.0.2:7481");
        assert_eq!(store.add_node(&b).unwrap(), Added::New(b.clone()));
        let a = rec("a", "[fd00::1]:7481");
        assert_eq!(store.add_node(&a).unwrap(), Added::New(a.clone()));
        // the same again: nothing changes; another address: refused as is
        let again = NodeRec {
            added: 9,
            ..b.clone()
        };
        assert_eq!(store.add_node(&again).unwrap(), Added::Same(b.clone()));
        assert_eq!(
            store.add_node(&rec("b", "10.0.0.3:7481")).unwrap(),
            Added::Other(b.clone())
        );
        assert_eq!(store.nodes().unwrap(), vec![a.clone(), b.clone()]);
        drop(store);
        // durable: a reopened store has them
        let store = Store::open(&dir.path().join("store.redb")).unwrap();
        assert_eq!(store.node("b").unwrap(), Some(b));
        assert!(store.remove_node("b").unwrap());
        assert!(!store.remove_node("b").unwrap());
        assert_eq!(store.nodes().unwrap(), vec![a]);
    }
}
