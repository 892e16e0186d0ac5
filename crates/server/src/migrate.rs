//! Reading operation records of format 1 (a kind string and untyped JSON
//! arguments, written before issue 9) as typed ones. Every argument an
//! operation needs must be there: a missing one is an error naming it, not
//! a default.

use crate::store::{CloneSource, CopyRec, Op, OpRec};
use lamina_api::OperationState;
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
struct V1 {
    id: String,
    kind: String,
    args: Value,
    state: String,
    #[serde(default)]
    done_bytes: u64,
    #[serde(default)]
    total_bytes: u64,
    started: String,
    error: Option<String>,
}

fn s(a: &Value, k: &str) -> Result<String, String> {
    a[k].as_str()
        .map(Into::into)
        .ok_or_else(|| format!("argument {k:?} is missing or not a string"))
}

fn n(a: &Value, k: &str) -> Result<u64, String> {
    a[k].as_u64()
        .ok_or_else(|| format!("argument {k:?} is missing or not a number"))
}

fn b(a: &Value, k: &str) -> Result<bool, String> {
    match &a[k] {
        Value::Null => Ok(false),
        v => v
            .as_bool()
            .ok_or_else(|| format!("argument {k:?} is not true or false")),
    }
}

/// One format-1 record (JSON text) as a format-2 record.
pub fn v1_to_v2(json: &str) -> Result<OpRec, String> {
    let r: V1 = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let a = &r.args;
    let mut copy = None;
    let op = match r.kind.as_str() {
        "create-volume" => Op::CreateVolume {
            name: s(a, "name")?,
            size: n(a, "size")?,
            labels: Default::default(),
            replicas: Vec::new(),
        },
        "expand-volume" => Op::ExpandVolume {
            name: s(a, "name")?,
            size: n(a, "size")?,
        },
        "delete-volume" => Op::DeleteVolume {
            name: s(a, "name")?,
            with_snapshots: b(a, "with_snapshots")?,
        },
        "create-snapshot" => Op::CreateSnapshot {
            volume: s(a, "volume")?,
            name: s(a, "name")?,
            labels: match &a["labels"] {
                Value::Null => Default::default(),
                l => serde_json::from_value(l.clone()).map_err(|e| format!("labels: {e}"))?,
            },
        },
        "delete-snapshot" => Op::DeleteSnapshot {
            volume: s(a, "volume")?,
            name: s(a, "name")?,
        },
        "revert" => Op::Revert {
            volume: s(a, "volume")?,
            snapshot: s(a, "snapshot")?,
        },
        "flatten" => Op::Flatten {
            name: s(a, "name")?,
        },
        "clone" => {
            let name = s(a, "name")?;
            let full = b(a, "full")?;
            let (source, snap) = match (a["from_snapshot"].as_str(), a["from_volume"].as_str()) {
                (Some(vs), None) => {
                    let (v, sn) = vs
                        .split_once('/')
                        .ok_or_else(|| format!("from_snapshot {vs:?} is not VOLUME/SNAPSHOT"))?;
                    (
                        CloneSource::Snapshot {
                            volume: v.into(),
                            snapshot: sn.into(),
                        },
                        (v.to_string(), sn.to_string(), false),
                    )
                }
                // Format 1 named the system snapshot `clone-NAME`.
                (None, Some(v)) => (
                    CloneSource::Volume { volume: v.into() },
                    (
                        v.to_string(),
                        format!("clone-{name}").chars().take(255).collect(),
                        true,
                    ),
                ),
                _ => return Err("exactly one of from_snapshot and from_volume is needed".into()),
            };
            if full {
                copy = Some(CopyRec {
                    resume_offset: a["resume_offset"].as_u64().unwrap_or(0),
                    ..CopyRec::new(snap.0, snap.1, snap.2)
                });
            }
            Op::Clone { name, source, full }
        }
        other => return Err(format!("unknown operation kind {other:?}")),
    };
    let state = match r.state.as_str() {
        "running" | "recovering" => OperationState::Running,
        "succeeded" => OperationState::Succeeded,
        "failed" => OperationState::Failed,
        other => return Err(format!("unknown state {other:?}")),
    };
    Ok(OpRec {
        id: r.id,
        op,
        state,
        started: r.started,
        error: r.error,
        done_bytes: r.done_bytes,
        total_bytes: r.total_bytes,
        copy,
        reason: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_1_records_become_typed() {
        let r = v1_to_v2(r#"{"id":"op-1","kind":"clone","volume":"x","args":{"name":"x","from_snapshot":null,"from_volume":"src","full":true,"resume_offset":4096},"state":"running","done_bytes":1,"total_bytes":9,"started":"2026-01-01T00:00:00Z","error":null}"#).unwrap();
        assert_eq!(
            r.op,
            Op::Clone {
                name: "x".into(),
                source: CloneSource::Volume {
                    volume: "src".into()
                },
                full: true
            }
        );
        let c = r.copy.unwrap();
        assert_eq!(
            (c.snapshot.as_str(), c.system, c.resume_offset),
            ("clone-x", true, 4096)
        );
        assert_eq!(r.state, OperationState::Running);
        let r = v1_to_v2(r#"{"id":"op-2","kind":"create-snapshot","volume":"v","args":{"volume":"v","name":"s","labels":{"a":"b"}},"state":"succeeded","done_bytes":0,"total_bytes":0,"started":"t","error":null}"#).unwrap();
        assert!(matches!(r.op, Op::CreateSnapshot { ref labels, .. } if labels["a"] == "b"));
    }

    #[test]
    fn a_missing_argument_is_an_error_not_a_zero() {
        let e = v1_to_v2(r#"{"id":"op-1","kind":"create-volume","volume":"v","args":{"name":"v"},"state":"running","started":"t","error":null}"#).unwrap_err();
        assert!(e.contains("size"), "{e}");
        let e = v1_to_v2(r#"{"id":"op-1","kind":"bogus","volume":"v","args":{},"state":"running","started":"t","error":null}"#).unwrap_err();
        assert!(e.contains("bogus"), "{e}");
    }
}
