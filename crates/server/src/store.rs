//! The daemon's own records in redb: NBD exports (so they come back after a
//! restart) and operation records (written before an operation runs, so a
//! daemon killed mid-operation finishes it at restart). The engine's
//! metadata is not here: the pool keeps its own, crash-consistently.

use crate::error::ServerError;
use redb::{Database, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::path::Path;

const EXPORTS: TableDefinition<&str, &str> = TableDefinition::new("exports");
const OPERATIONS: TableDefinition<&str, &str> = TableDefinition::new("operations");

/// An export to restore at start.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExportRec {
    pub volume: String,
    pub snapshot: Option<String>,
}

/// A recorded operation.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct OpRec {
    pub id: String,
    pub kind: String,
    pub volume: String,
    /// What the operation needs to be run again (JSON).
    pub args: serde_json::Value,
    /// running, succeeded, failed
    pub state: String,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub started: String,
    pub error: Option<String>,
}

pub struct Store {
    db: Database,
}

impl Store {
    pub fn open(path: &Path) -> Result<Store, ServerError> {
        let db = Database::create(path)?;
        let w = db.begin_write()?;
        w.open_table(EXPORTS)?;
        w.open_table(OPERATIONS)?;
        w.commit()?;
        Ok(Store { db })
    }

    fn put<T: Serialize>(
        &self,
        table: TableDefinition<&str, &str>,
        key: &str,
        v: &T,
    ) -> Result<(), ServerError> {
        let json = serde_json::to_string(v)?;
        let w = self.db.begin_write()?;
        w.open_table(table)?.insert(key, json.as_str())?;
        w.commit()?;
        Ok(())
    }

    fn remove(&self, table: TableDefinition<&str, &str>, key: &str) -> Result<(), ServerError> {
        let w = self.db.begin_write()?;
        w.open_table(table)?.remove(key)?;
        w.commit()?;
        Ok(())
    }

    fn all<T: for<'a> Deserialize<'a>>(
        &self,
        table: TableDefinition<&str, &str>,
    ) -> Result<Vec<(String, T)>, ServerError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(table)?;
        let mut out = Vec::new();
        for item in t.iter()? {
            let (k, v) = item?;
            out.push((k.value().to_string(), serde_json::from_str(v.value())?));
        }
        Ok(out)
    }

    pub fn put_export(&self, name: &str, rec: &ExportRec) -> Result<(), ServerError> {
        self.put(EXPORTS, name, rec)
    }
    pub fn remove_export(&self, name: &str) -> Result<(), ServerError> {
        self.remove(EXPORTS, name)
    }
    pub fn exports(&self) -> Result<Vec<(String, ExportRec)>, ServerError> {
        self.all(EXPORTS)
    }

    pub fn put_op(&self, op: &OpRec) -> Result<(), ServerError> {
        self.put(OPERATIONS, &op.id, op)
    }
    pub fn op(&self, id: &str) -> Result<Option<OpRec>, ServerError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(OPERATIONS)?;
        let v = t.get(id)?;
        Ok(match v {
            Some(v) => Some(serde_json::from_str(v.value())?),
            None => None,
        })
    }
    pub fn ops(&self) -> Result<Vec<OpRec>, ServerError> {
        Ok(self.all(OPERATIONS)?.into_iter().map(|(_, v)| v).collect())
    }
}
