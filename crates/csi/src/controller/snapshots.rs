//! CreateSnapshot, DeleteSnapshot, ListSnapshots and GetSnapshot. A CSI
//! snapshot name is unique across the driver, while Lamina names snapshots
//! per volume: a name is looked up over every volume, and calls for one
//! name run one at a time, so that one CSI name never becomes two snapshots.

use super::{parse_token, timestamp, ControllerService};
use crate::ids::{lamina_name, SnapshotId, VolumeId};
use crate::proto::*;
use crate::status::{from_client, invalid};
use lamina_api as api;
use tonic::Status;

/// Label recording the CSI name of a snapshot whose Lamina name differs.
pub const CSI_NAME_LABEL: &str = "csi.lamina.io/name";

/// A CSI snapshot for a daemon snapshot.
pub(crate) fn csi_snapshot(s: &api::Snapshot) -> Snapshot {
    Snapshot {
        size_bytes: s.restore_size as i64,
        snapshot_id: SnapshotId {
            volume: s.volume.clone(),
            name: s.name.clone(),
            id: s.id,
        }
        .to_string(),
        source_volume_id: VolumeId {
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
        if let Some(k) = req
            .parameters
            .keys()
            .find(|k| !k.starts_with("csi.storage.k8s.io/"))
        {
            return invalid!("unknown snapshot parameter {k:?} (Lamina takes none)");
        }
        let name = lamina_name(&req.name);
        let _g = self.lock(&format!("snapshot/{name}")).await;
        let filter = api::SnapshotFilter {
            name: Some(name.clone()),
            id: None,
        };
        let same = self
            .client
            .find_snapshots(&filter)
            .await
            .map_err(|e| from_client(&e))?;
        let source = VolumeId::parse(&req.source_volume_id);
        if let Some(s) = same.iter().find(|s| !s.system) {
            let from_here = source
                .as_ref()
                .is_some_and(|v| v.name == s.volume && v.id == s.volume_id);
            if from_here && !s.labels.contains_key(api::GROUP_LABEL) {
                return Ok(CreateSnapshotResponse {
                    snapshot: Some(csi_snapshot(s)),
                });
            }
            return Err(Status::already_exists(format!(
                "snapshot {:?} exists already, of volume {}",
                req.name,
                VolumeId {
                    name: s.volume.clone(),
                    id: s.volume_id
                }
            )));
        }
        let not_found = || {
            Status::not_found(format!(
                "source volume {:?} does not exist",
                req.source_volume_id
            ))
        };
        let vid = source.ok_or_else(not_found)?;
        let v = self.volume_by_id(&vid).await?.ok_or_else(not_found)?;
        let mut labels = std::collections::BTreeMap::new();
        if name != req.name && req.name.len() <= 1024 {
            labels.insert(CSI_NAME_LABEL.to_string(), req.name.clone());
        }
        let made = self
            .client
            .create_snapshot(&v.name, &api::CreateSnapshot { name, labels })
            .await
            .map_err(|e| from_client(&e))?;
        Ok(CreateSnapshotResponse {
            snapshot: Some(csi_snapshot(&made.value)),
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
        let Some(s) = self.snapshot_by_id(&id).await? else {
            return Ok(DeleteSnapshotResponse {});
        };
        if let Some(x) = &s.export {
            if x.connections > 0 {
                return Err(Status::failed_precondition(format!(
                    "snapshot {:?} is in use: {} NBD client(s) read it",
                    req.snapshot_id, x.connections
                )));
            }
            self.client
                .detach_snapshot(&s.volume, &s.name, false)
                .await
                .map_err(|e| from_client(&e))?;
        }
        match self.client.delete_snapshot(&s.volume, &s.name).await {
            Ok(_) => Ok(DeleteSnapshotResponse {}),
            Err(e) if e.is_not_found() => Ok(DeleteSnapshotResponse {}),
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
        let after = parse_token(&req.starting_token)?;
        let mut snaps = if !req.snapshot_id.is_empty() {
            match SnapshotId::parse(&req.snapshot_id) {
                Some(id) => self.snapshot_by_id(&id).await?.into_iter().collect(),
                None => vec![],
            }
        } else if !req.source_volume_id.is_empty() {
            match VolumeId::parse(&req.source_volume_id) {
                Some(id) if self.volume_by_id(&id).await?.is_some() => {
                    match self.client.list_snapshots(&id.name).await {
                        Ok(v) => v,
                        Err(e) if e.is_not_found() => vec![],
                        Err(e) => return Err(from_client(&e)),
                    }
                }
                _ => vec![],
            }
        } else {
            self.client
                .list_all_snapshots()
                .await
                .map_err(|e| from_client(&e))?
        };
        if !req.source_volume_id.is_empty() {
            snaps.retain(|s| {
                VolumeId {
                    name: s.volume.clone(),
                    id: s.volume_id,
                }
                .to_string()
                    == req.source_volume_id
            });
        }
        // System snapshots (taken for clones of volumes) are not the CO's.
        snaps.retain(|s| !s.system && s.id > after);
        snaps.sort_by_key(|s| s.id);
        let max = if req.max_entries == 0 {
            usize::MAX
        } else {
            req.max_entries as usize
        };
        let next_token = if snaps.len() > max {
            snaps[max - 1].id.to_string()
        } else {
            String::new()
        };
        snaps.truncate(max);
        Ok(ListSnapshotsResponse {
            entries: snaps
                .iter()
                .map(|s| list_snapshots_response::Entry {
                    snapshot: Some(csi_snapshot(s)),
                })
                .collect(),
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
        let not_found =
            || Status::not_found(format!("snapshot {:?} does not exist", req.snapshot_id));
        let id = SnapshotId::parse(&req.snapshot_id).ok_or_else(not_found)?;
        let s = self.snapshot_by_id(&id).await?.ok_or_else(not_found)?;
        Ok(GetSnapshotResponse {
            snapshot: Some(csi_snapshot(&s)),
        })
    }
}
