//! The operations on a snapshot: create, delete, and revert a volume to one.

use super::{labels_vec, Outcome};
use crate::error::Failure;
use crate::state::{blocking, snapshot_export, State};
use lamina_engine::SnapshotInfo;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Snapshot `volume/name` if it exists as asked (none: there is none);
/// one with other labels is `already_exists`.
pub(super) fn existing(
    p: &lamina_engine::Pool,
    volume: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> Result<Option<SnapshotInfo>, Failure> {
    match p.snapshot_info_by_name(volume, name) {
        Ok(s) if s.labels == labels_vec(labels) => Ok(Some(s)),
        Ok(_) => Err(Failure::exists(
            format!("snapshot {volume}/{name} already exists with other labels"),
            &format!(
                "pick another name, or delete it first: lamina snapshot delete {volume} {name}"
            ),
        )),
        Err(_) => Ok(None),
    }
}

pub(super) async fn create(
    st: &Arc<State>,
    volume: String,
    name: String,
    labels: BTreeMap<String, String>,
    recovering: bool,
) -> Result<Outcome, Failure> {
    let (p, st2) = (st.pool.clone(), st.clone());
    blocking(move || {
        let parts = st2.front_parts();
        let front = st2.fronts.get(&volume);
        if let Some(info) = existing(&p, &volume, &name, &labels)? {
            if recovering {
                // Made here by a daemon killed before the other replicas
                // had theirs: they take it now, of the same origin (one
                // that has it answers as done), or are faulted with it
                // missed. Nothing has written since: the front end held
                // its writes then, and NBD serves only once recovery is
                // over.
                crate::front::snapshot(&parts, front.as_deref(), &volume, &name, || Ok(()))?;
            }
            return Ok(Outcome::Snapshot {
                info,
                created: false,
            });
        }
        // A replicated volume's on every healthy replica at one point.
        let info = crate::front::snapshot(&parts, front.as_deref(), &volume, &name, || {
            let info = p.create_snapshot(&volume, &name, &labels_vec(&labels))?;
            st2.schedules.crash_point("snapshot-after-local");
            Ok(info)
        })?;
        Ok(Outcome::Snapshot {
            info,
            created: true,
        })
    })
    .await
}

pub(super) async fn delete(
    st: &Arc<State>,
    volume: String,
    name: String,
    recovering: bool,
) -> Result<Outcome, Failure> {
    if st.is_attached(&snapshot_export(&volume, &name)) {
        return Err(Failure::conflict(
            format!("snapshot {volume}/{name} is attached"),
            &format!("detach it first: lamina snapshot detach {volume} {name}"),
        ));
    }
    let (p, st2) = (st.pool.clone(), st.clone());
    blocking(move || {
        if recovering && p.snapshot_info_by_name(&volume, &name).is_err() {
            return Ok(Outcome::Removed(true));
        }
        st2.refuse_if_copying_from(&volume, &name)?;
        p.delete_snapshot(&volume, &name)?;
        // A replicated volume's, on its other replicas too.
        let parts = st2.front_parts();
        let front = st2.fronts.get(&volume);
        crate::front::delete_snapshot(&parts, front.as_deref(), &volume, &name);
        Ok(Outcome::Removed(true))
    })
    .await
}

pub(super) async fn revert(
    st: &Arc<State>,
    volume: String,
    snapshot: String,
) -> Result<Outcome, Failure> {
    if st.is_attached(&volume) {
        return Err(Failure::conflict(
            format!(
                "volume {volume:?} is attached: reverting would change its data under its clients"
            ),
            &format!("detach it first: lamina volume detach {volume}"),
        ));
    }
    let p = st.pool.clone();
    blocking(move || {
        Ok(Outcome::Volume {
            info: p.revert_volume(&volume, &snapshot)?,
            created: false,
        })
    })
    .await
}
