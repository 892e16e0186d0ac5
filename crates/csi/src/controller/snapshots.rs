//! CreateSnapshot, DeleteSnapshot, ListSnapshots and GetSnapshot. A CSI
//! snapshot name is unique across the driver, while Lamina names snapshots
//! per volume: a name is looked up over every volume of the source
//! volume's node, and calls for one name run one at a time, so that one CSI
//! name never becomes two snapshots.

use super::{timestamp, ControllerService};
use crate::ids::{fits_csi_limit, lamina_name, shown, SnapshotId, VolumeId};
use crate::proto::*;
use crate::status::{from_client, invalid};
use lamina_api as api;
use tonic::Status;

/// Label recording the CSI name of a snapshot whose Lamina name differs.
pub const CSI_NAME_LABEL: &str = "csi.lamina.io/name";

/// A CSI snapshot for a daemon snapshot (`node`: the node its ids name,
/// if ids carry one).
pub(crate) fn csi_snapshot(node: Option<String>, s: &api::Snapshot) -> Snapshot {
    Snapshot {
        size_bytes: s.restore_size as i64,
        snapshot_id: SnapshotId {
            node: node.clone(),
            volume: s.volume.clone(),
            name: s.name.clone(),
            id: s.id,
        }
        .to_string(),
        source_volume_id: VolumeId {
            node,
            name: s.volume.clone(),
            id: s.volume_id,
        }
        .to_string(),
        creation_time: timestamp(&s.created),
        // A Lamina snapshot is complete when the daemon answers.
        ready_to_use: true,
        group_snapshot_id: s.labels.get(api::GROUP_LABEL).cloned().unwrap_or_default(),
    }
}

/// A snapshot of volume `v` as CSI sees it: its source the id the volume
/// was made with, when it was taken over since (a replicated volume's,
/// label [`api::CSI_VOLUME_ID_LABEL`]), not this node's.
fn of_volume(mut s: Snapshot, v: &api::Volume) -> Snapshot {
    if let Some(id) = v.labels.get(api::CSI_VOLUME_ID_LABEL) {
        s.source_volume_id = id.clone();
    }
    s
}

/// The snapshot class's parameters (`what`: "snapshot" or "group
/// snapshot"): `freeze` (`"true"` or `"false"`, default false) is the only
/// one; those the CO adds itself (`csi.storage.k8s.io/…`) are ignored, any
/// other is INVALID_ARGUMENT. Whether to freeze.
///
/// `tolerated` names parameters accepted and ignored: a group snapshot
/// class's `deletionPolicy`, which Kubernetes' storage e2e suite passes as
/// a parameter (the class's own `deletionPolicy` field is what applies).
pub(crate) fn freeze_parameter(
    parameters: &std::collections::HashMap<String, String>,
    what: &str,
    tolerated: &[&str],
) -> Result<bool, Status> {
    let mut freeze = false;
    for (k, v) in parameters {
        match k.as_str() {
            "freeze" => {
                freeze = match v.as_str() {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return invalid!(
                            "{what} parameter freeze is {}: \"true\" or \"false\"",
                            shown(v)
                        )
                    }
                }
            }
            k if k.starts_with("csi.storage.k8s.io/") => {}
            k if tolerated.contains(&k) => {
                tracing::debug!(parameter = k, "a {what} parameter Lamina ignores");
            }
            k => {
                return invalid!(
                    "unknown {what} parameter {} (Lamina takes freeze)",
                    shown(k)
                )
            }
        }
    }
    Ok(freeze)
}

impl ControllerService {
    pub(crate) async fn create_snapshot_rpc(
        &self,
        req: CreateSnapshotRequest,
    ) -> Result<CreateSnapshotResponse, Status> {
        if req.name.is_empty() {
            return invalid!("name is required");
        }
        if req.source_volume_id.is_empty() {
            return invalid!("source_volume_id is required");
        }
        let freeze = freeze_parameter(&req.parameters, "snapshot", &[])?;
        let name = lamina_name(&req.name);
        let _g = self.lock(&format!("snapshot/{name}")).await;
        let not_found = || {
            Status::not_found(format!(
                "source volume {} does not exist",
                shown(&req.source_volume_id)
            ))
        };
        let vid = VolumeId::parse(&req.source_volume_id).ok_or_else(not_found)?;
        // Where the volume is served now (a replicated one may have been
        // taken over); a snapshot asked again after its volume was deleted
        // is looked for on the node the id names.
        let found = self.volume_by_id(&vid).await?;
        let node = match &found {
            Some((n, _)) => n.clone(),
            None => self.node(vid.node.as_deref())?,
        };
        let q = self.nodes.qualifier(&node.name);
        let filter = api::SnapshotFilter {
            name: Some(name.clone()),
            ..Default::default()
        };
        let same = node
            .client
            .find_snapshots(&filter)
            .await
            .map_err(|e| from_client(&e))?;
        if let Some(s) = same.iter().find(|s| !s.system) {
            let from_here = match &found {
                Some((_, v)) => v.name == s.volume && v.id == s.volume_id,
                None => vid.name == s.volume && vid.id == s.volume_id,
            };
            if from_here && !s.labels.contains_key(api::GROUP_LABEL) {
                let snapshot = csi_snapshot(q, s);
                return Ok(CreateSnapshotResponse {
                    snapshot: Some(match &found {
                        Some((_, v)) => of_volume(snapshot, v),
                        None => snapshot,
                    }),
                });
            }
            return Err(Status::already_exists(format!(
                "snapshot {} exists already, of volume {}",
                shown(&req.name),
                VolumeId {
                    node: q,
                    name: s.volume.clone(),
                    id: s.volume_id
                }
            )));
        }
        let (_, v) = found.ok_or_else(not_found)?;
        if !fits_csi_limit(q.as_deref(), &format!("{}/{name}", v.name)) {
            return invalid!(
                "the id of snapshot {name:?} of volume {:?} on node {:?} could exceed CSI's {} bytes",
                v.name,
                node.name,
                crate::ids::MAX_ID_LEN
            );
        }
        let mut labels = std::collections::BTreeMap::new();
        if name != req.name && req.name.len() <= 1024 {
            labels.insert(CSI_NAME_LABEL.to_string(), req.name.clone());
        }
        let made = node
            .client
            .create_snapshot(
                &v.name,
                &api::CreateSnapshot {
                    name,
                    labels,
                    freeze,
                },
            )
            .await
            .map_err(|e| from_client(&e))?;
        Ok(CreateSnapshotResponse {
            snapshot: Some(of_volume(csi_snapshot(q, &made.value), &v)),
        })
    }

    pub(crate) async fn delete_snapshot_rpc(
        &self,
        req: DeleteSnapshotRequest,
    ) -> Result<DeleteSnapshotResponse, Status> {
        if req.snapshot_id.is_empty() {
            return invalid!("snapshot_id is required");
        }
        let Some(id) = SnapshotId::parse(&req.snapshot_id) else {
            return Ok(DeleteSnapshotResponse {});
        };
        let _g = self.lock(&format!("snapshot/{}", id.name)).await;
        self.delete_snapshot_locked(&id, &req.snapshot_id).await?;
        Ok(DeleteSnapshotResponse {})
    }

    /// Delete the snapshot `id` names (shown as `given`), where it is
    /// served now; gone already is done. The caller holds the lock of its
    /// name.
    pub(crate) async fn delete_snapshot_locked(
        &self,
        id: &SnapshotId,
        given: &str,
    ) -> Result<(), Status> {
        let Some(found) = self.snapshot_by_id(id).await? else {
            return Ok(());
        };
        let (node, s) = (found.node, found.snapshot);
        if let Some(x) = &s.export {
            if x.connections > 0 {
                return Err(Status::failed_precondition(format!(
                    "snapshot {} is in use: {} NBD client(s) read it",
                    shown(given),
                    x.connections
                )));
            }
            node.client
                .detach_snapshot(&s.volume_reference(), &s.name, false)
                .await
                .map_err(|e| from_client(&e))?;
        }
        // The volume may have been deleted since (its snapshots stay):
        // `NAME@ID` reaches it alone.
        match node
            .client
            .delete_snapshot(&s.volume_reference(), &s.name)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(from_client(&e)),
        }
    }

    pub(crate) async fn list_snapshots_rpc(
        &self,
        req: ListSnapshotsRequest,
    ) -> Result<ListSnapshotsResponse, Status> {
        if req.max_entries < 0 {
            return invalid!("max_entries must not be negative");
        }
        // (node, its snapshots) for the nodes the filters can match.
        let mut found: Vec<(String, Vec<api::Snapshot>)> = vec![];
        // The source volume asked for, where it is served now: (node, its
        // volume there).
        let mut source: Option<(String, api::Volume)> = None;
        // The snapshot asked for by id, of a volume taken over since: the
        // ids it is known by.
        let mut asked: Option<(String, Option<String>)> = None;
        if !req.source_volume_id.is_empty() {
            if let Some(id) = VolumeId::parse(&req.source_volume_id) {
                source = self.volume_by_id(&id).await?.map(|(n, v)| (n.name, v));
            }
        }
        if !req.snapshot_id.is_empty() {
            if let Some(id) = SnapshotId::parse(&req.snapshot_id) {
                if let Some(f) = self.snapshot_by_id(&id).await? {
                    asked = f.asked.clone();
                    found.push((f.node.name, vec![f.snapshot]));
                }
            }
        } else if !req.source_volume_id.is_empty() {
            if let Some((node, v)) = &source {
                let snaps = match self.node(Some(node))?.client.list_snapshots(&v.name).await {
                    Ok(v) => v,
                    Err(e) if e.is_not_found() => vec![],
                    Err(e) => return Err(from_client(&e)),
                };
                found.push((node.clone(), snaps));
            }
        } else {
            for n in self.nodes.all() {
                let mut snaps = n
                    .client
                    .list_all_snapshots()
                    .await
                    .map_err(|e| from_client(&e))?;
                // A replica's snapshots are its front end's volume's,
                // listed from that node.
                let replicas: std::collections::HashSet<u64> = n
                    .client
                    .list_volumes()
                    .await
                    .map_err(|e| from_client(&e))?
                    .iter()
                    .filter(|v| crate::ids::is_replica(v))
                    .map(|v| v.id)
                    .collect();
                snaps.retain(|s| !replicas.contains(&s.volume_id));
                found.push((n.name, snaps));
            }
        }
        // Both ids given: the snapshot only if it is of that volume.
        let of_source = |node: &str, s: &api::Snapshot| {
            req.source_volume_id.is_empty()
                || source
                    .as_ref()
                    .is_some_and(|(n, v)| n == node && v.name == s.volume && v.id == s.volume_id)
        };
        let mut all = vec![];
        for (node, snaps) in found {
            let q = self.nodes.qualifier(&node);
            for s in snaps {
                // System snapshots (taken for clones of volumes) are not the CO's.
                if s.system || !of_source(&node, &s) {
                    continue;
                }
                let mut snapshot = csi_snapshot(q.clone(), &s);
                if let Some((id, volume)) = &asked {
                    snapshot.snapshot_id = id.clone();
                    if let Some(v) = volume {
                        snapshot.source_volume_id = v.clone();
                    }
                }
                let entry = list_snapshots_response::Entry {
                    snapshot: Some(match &source {
                        Some((_, v)) => of_volume(snapshot, v),
                        None => snapshot,
                    }),
                };
                all.push((node.clone(), s.id, entry));
            }
        }
        let (entries, next_token) = self.page_of(all, &req.starting_token, req.max_entries)?;
        Ok(ListSnapshotsResponse {
            entries,
            next_token,
        })
    }

    pub(crate) async fn get_snapshot_rpc(
        &self,
        req: GetSnapshotRequest,
    ) -> Result<GetSnapshotResponse, Status> {
        if req.snapshot_id.is_empty() {
            return invalid!("snapshot_id is required");
        }
        let not_found = || {
            Status::not_found(format!(
                "snapshot {} does not exist",
                shown(&req.snapshot_id)
            ))
        };
        let id = SnapshotId::parse(&req.snapshot_id).ok_or_else(not_found)?;
        let found = self.snapshot_by_id(&id).await?.ok_or_else(not_found)?;
        Ok(GetSnapshotResponse {
            snapshot: Some(found.csi(&self.nodes)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::freeze_parameter;
    use std::collections::HashMap;

    fn params(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn freeze_is_read_the_cos_own_ignored_and_others_refused() {
        let p = params(&[("freeze", "true"), ("csi.storage.k8s.io/x", "y")]);
        assert!(freeze_parameter(&p, "snapshot", &[]).unwrap());
        assert!(!freeze_parameter(&params(&[]), "snapshot", &[]).unwrap());
        let bad = freeze_parameter(&params(&[("freeze", "yes")]), "snapshot", &[]).unwrap_err();
        assert_eq!(bad.code(), tonic::Code::InvalidArgument);
        let unknown = freeze_parameter(&params(&[("deletionPolicy", "Delete")]), "snapshot", &[])
            .unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::InvalidArgument);
        assert!(
            unknown.message().contains("deletionPolicy"),
            "{}",
            unknown.message()
        );
    }

    #[test]
    fn a_group_class_may_pass_its_deletion_policy_as_a_parameter() {
        let p = params(&[("deletionPolicy", "Delete"), ("freeze", "false")]);
        assert!(!freeze_parameter(&p, "group snapshot", &["deletionPolicy"]).unwrap());
        let other = freeze_parameter(
            &params(&[("other", "1")]),
            "group snapshot",
            &["deletionPolicy"],
        );
        assert_eq!(other.unwrap_err().code(), tonic::Code::InvalidArgument);
    }
}
