//! Group snapshots as operations: the checks a request passes before it is
//! recorded, and taking or deleting a group. A group has no record of its
//! own: its members are the snapshots named like it that carry the label
//! `lamina.io/group` with its name, made together by the engine in one
//! transaction (so that they hold one instant of all the volumes). The
//! same-name rules are in docs/daemon.md.

use super::{labels_vec, Outcome};
use crate::error::Failure;
use crate::state::{blocking, rfc3339, snapshot_export, State};
use lamina_api as api;
use lamina_engine::{Pool, SnapshotInfo, GROUP_LABEL};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The label is the group's: a plain snapshot may not carry it, or it
/// would pass for a member.
pub(super) fn refuse_group_label(labels: &BTreeMap<String, String>) -> Result<(), Failure> {
    if labels.contains_key(GROUP_LABEL) {
        return Err(Failure::invalid(format!(
            "the label {GROUP_LABEL:?} is reserved for group snapshots (lamina snapshot create-group)"
        )));
    }
    Ok(())
}

/// A group request's name, volumes and labels, before anything is recorded.
pub fn check_create(
    name: &str,
    volumes: &[String],
    labels: &BTreeMap<String, String>,
) -> Result<(), Failure> {
    lamina_engine::check_name(name)?;
    crate::schedules::refuse_schedule_labels(labels)?;
    if volumes.is_empty() {
        return Err(Failure::invalid(
            "a group snapshot needs at least one volume",
        ));
    }
    let mut sorted: Vec<&String> = volumes.iter().collect();
    sorted.sort();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(Failure::invalid(format!(
            "volume {:?} is named twice in the group",
            w[0]
        )));
    }
    refuse_group_label(labels)?;
    let mut all = labels_vec(labels);
    all.push((GROUP_LABEL.into(), name.into()));
    lamina_engine::format::check_labels(&all)?;
    Ok(())
}

/// The members of group `name`, ordered by volume name (none: no group).
pub fn members(p: &Pool, name: &str) -> Result<Vec<SnapshotInfo>, Failure> {
    let mut m: Vec<SnapshotInfo> = p
        .find_snapshots(Some(name), None)?
        .into_iter()
        .filter(|s| s.labels.iter().any(|(k, v)| k == GROUP_LABEL && v == name))
        .collect();
    m.sort_by(|a, b| a.volume.cmp(&b.volume));
    Ok(m)
}

/// A member's labels without the group's own.
fn own_labels(s: &SnapshotInfo) -> BTreeMap<String, String> {
    s.labels
        .iter()
        .filter(|(k, _)| k != GROUP_LABEL)
        .cloned()
        .collect()
}

fn delete_hint(name: &str) -> String {
    format!("pick another name, or delete it first: lamina snapshot delete-group {name}")
}

/// Take group `name` of `volumes` (sorted), or answer the identical group
/// that is there. Runs under the group's and the volumes' locks.
pub(super) async fn create(
    st: &Arc<State>,
    name: String,
    volumes: Vec<String>,
    labels: BTreeMap<String, String>,
    recovering: bool,
) -> Result<Outcome, Failure> {
    let (p, st2) = (st.pool.clone(), st.clone());
    blocking(move || {
        // A replicated member's on each of its healthy replicas too, all
        // of them at one point of every member's write stream.
        let parts = st2.front_parts();
        let fronts: Vec<_> = volumes.iter().map(|v| st2.fronts.get(v)).collect();
        let members: Vec<_> = volumes
            .iter()
            .zip(&fronts)
            .map(|(v, f)| (v.as_str(), f.as_deref()))
            .collect();
        if let Some(made) = existing(&p, &name, &volumes, &labels)? {
            if recovering {
                // As a single snapshot's (operations::snapshots::create):
                // the replicas a killed daemon did not reach take theirs.
                crate::front::snapshot_together(&parts, &members, &name, || Ok(()))?;
            }
            return Ok(Outcome::Group {
                members: made,
                created: false,
            });
        }
        let vols: Vec<&str> = volumes.iter().map(String::as_str).collect();
        let mut made = crate::front::snapshot_together(&parts, &members, &name, || {
            Ok(p.create_snapshot_group(&vols, &name, &labels_vec(&labels))?)
        })?;
        made.sort_by(|a, b| a.volume.cmp(&b.volume));
        Ok(Outcome::Group {
            members: made,
            created: true,
        })
    })
    .await
}

/// The members of group `name` if it exists as asked, of `volumes`
/// (sorted) with `labels`; none if there is no group and no snapshot of
/// that name on the volumes. A group of that name made otherwise, or a
/// plain snapshot of that name, is `already_exists`.
pub(super) fn existing(
    p: &Pool,
    name: &str,
    volumes: &[String],
    labels: &BTreeMap<String, String>,
) -> Result<Option<Vec<SnapshotInfo>>, Failure> {
    let existing = members(p, name)?;
    if !existing.is_empty() {
        let have: Vec<&str> = existing.iter().map(|s| s.volume.as_str()).collect();
        if have != volumes {
            return Err(Failure::exists(
                format!(
                    "group snapshot {name:?} already exists, of volumes {have:?} (asked: {volumes:?})"
                ),
                &delete_hint(name),
            ));
        }
        if let Some(s) = existing.iter().find(|s| own_labels(s) != *labels) {
            return Err(Failure::exists(
                format!(
                    "group snapshot {name:?} already exists with other labels ({:?} on volume {:?})",
                    own_labels(s),
                    s.volume
                ),
                &delete_hint(name),
            ));
        }
        return Ok(Some(existing));
    }
    for v in volumes {
        if p.snapshot_info_by_name(v, name).is_ok() {
            return Err(Failure::exists(
                format!("volume {v:?} already has a snapshot {name:?} that is no member of a group snapshot"),
                &format!("pick another name for the group, or delete that snapshot: lamina snapshot delete {v} {name}"),
            ));
        }
    }
    Ok(None)
}

/// Delete every member of group `name`, after checking none is exported
/// or read by a full clone. Runs under the group's and the volumes' locks.
pub(super) async fn delete(
    st: &Arc<State>,
    name: String,
    recovering: bool,
) -> Result<Outcome, Failure> {
    let st = st.clone();
    blocking(move || delete_members(&st, &name, recovering)).await
}

fn delete_members(st: &State, name: &str, recovering: bool) -> Result<Outcome, Failure> {
    let found = members(&st.pool, name)?;
    if found.is_empty() {
        // Gone since the request came (or, after a restart, deleted).
        return Ok(Outcome::Removed(recovering));
    }
    for s in &found {
        if st.is_attached(&snapshot_export(&s.volume, name)) {
            return Err(Failure::conflict(
                format!(
                    "snapshot {}/{name} (a member of group snapshot {name:?}) is attached",
                    s.volume
                ),
                &format!(
                    "detach it first: lamina snapshot detach {} {name}",
                    s.volume
                ),
            ));
        }
        st.refuse_if_copying_from(&s.volume, name)?;
    }
    let parts = st.front_parts();
    for s in &found {
        st.pool.delete_snapshot(&s.volume, name)?;
        // A replicated member's, on its other replicas too.
        let front = st.fronts.get(&s.volume);
        crate::front::delete_snapshot(&parts, front.as_deref(), &s.volume, name);
    }
    Ok(Outcome::Removed(true))
}

/// Group `name` of `members` as the API shows it.
pub fn describe(st: &State, name: &str, members: Vec<SnapshotInfo>) -> api::SnapshotGroup {
    api::SnapshotGroup {
        name: name.to_string(),
        created: members
            .first()
            .map(|s| rfc3339(s.created))
            .unwrap_or_default(),
        snapshots: members.into_iter().map(|s| st.snapshot(s)).collect(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_engine_and_the_api_name_the_same_label() {
        assert_eq!(lamina_engine::GROUP_LABEL, lamina_api::GROUP_LABEL);
    }
}
