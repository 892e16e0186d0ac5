//! The operations on a volume: create, label, expand, delete.

use super::{labels_vec, Outcome};
use crate::error::Failure;
use crate::state::{blocking, snapshot_export, State};
use lamina_engine::VolumeInfo;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Volume `name` if it exists as asked (none: there is none); another
/// volume of that name is `already_exists`.
pub(super) fn existing(
    p: &lamina_engine::Pool,
    name: &str,
    size: u64,
    labels: &[(String, String)],
) -> Result<Option<VolumeInfo>, Failure> {
    match p.volume_info_by_name(name) {
        Ok(v) if v.size == size && v.origin.is_none() && v.labels == labels => Ok(Some(v)),
        Ok(v) if v.size == size && v.origin.is_none() => Err(Failure::exists(
            format!("volume {name:?} already exists with other labels"),
            &format!("change its labels with `lamina volume label {name}`, or pick another name"),
        )),
        Ok(v) => Err(Failure::exists(
            format!("volume {name:?} already exists with size {}", v.size),
            &format!("pick another name, or delete it first: lamina volume delete {name}"),
        )),
        Err(_) => Ok(None),
    }
}

/// A volume's labels: the engine's limits, and the `lamina.io/` prefix left
/// to the system.
pub(super) fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), Failure> {
    if let Some(k) = labels.keys().find(|k| k.starts_with("lamina.io/")) {
        return Err(Failure::invalid(format!(
            "volume label {k:?}: the lamina.io/ prefix is the system's"
        )));
    }
    lamina_engine::check_labels(&labels_vec(labels))?;
    Ok(())
}

pub(super) async fn create(
    st: &Arc<State>,
    name: String,
    size: u64,
    labels: BTreeMap<String, String>,
) -> Result<Outcome, Failure> {
    let p = st.pool.clone();
    let labels = labels_vec(&labels);
    blocking(move || {
        Ok(match existing(&p, &name, size, &labels)? {
            Some(info) => Outcome::Volume {
                info,
                created: false,
            },
            None => Outcome::Volume {
                info: p.create_volume_labelled(&name, size, &labels)?,
                created: true,
            },
        })
    })
    .await
}

pub(super) async fn set_labels(
    st: &Arc<State>,
    name: String,
    labels: BTreeMap<String, String>,
) -> Result<Outcome, Failure> {
    let p = st.pool.clone();
    let labels = labels_vec(&labels);
    blocking(move || {
        Ok(Outcome::Volume {
            info: p.set_volume_labels(&name, &labels)?,
            created: false,
        })
    })
    .await
}

pub(super) async fn expand(st: &Arc<State>, name: String, size: u64) -> Result<Outcome, Failure> {
    let p = st.pool.clone();
    blocking(move || {
        Ok(Outcome::Volume {
            info: p.expand_volume(&name, size)?,
            created: false,
        })
    })
    .await
}

pub(super) async fn delete(
    st: &Arc<State>,
    name: String,
    with_snapshots: bool,
    recovering: bool,
) -> Result<Outcome, Failure> {
    if st.is_attached(&name) {
        return Err(Failure::conflict(
            format!("volume {name:?} is attached"),
            &format!("detach it first: lamina volume detach {name}"),
        ));
    }
    let (p, st2) = (st.pool.clone(), st.clone());
    blocking(move || {
        if recovering && p.volume_info_by_name(&name).is_err() {
            return Ok(Outcome::Removed(true));
        }
        // The live volume's own snapshots (`NAME@ID`: deleted
        // volumes of the same name keep theirs apart).
        let id = p.volume_info_by_name(&name)?.id;
        for s in p.list_snapshots(&format!("{name}@{id}"))? {
            if st2.is_attached(&snapshot_export(&name, &s.name)) {
                return Err(Failure::conflict(
                    format!("snapshot {name}/{} is attached", s.name),
                    &format!("detach it first: lamina snapshot detach {name} {}", s.name),
                ));
            }
            st2.refuse_if_copying_from(&name, &s.name)?;
        }
        p.delete_volume(&name, with_snapshots)?;
        Ok(Outcome::Removed(true))
    })
    .await
}
