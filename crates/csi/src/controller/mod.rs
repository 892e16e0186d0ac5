//! The controller service: volumes, snapshots, clones and restores, each
//! RPC a thin layer over the daemon's typed client. What CSI demands beyond
//! the daemon's own rules (ids, idempotency by name, its error codes, page
//! tokens) is decided here; docs/csi.md lists it.

mod snapshots;
mod volumes;

pub(crate) use snapshots::{csi_snapshot, CSI_NAME_LABEL};

use crate::ids::{SnapshotId, VolumeId};
use crate::proto::controller_server::Controller;
use crate::proto::controller_service_capability::{rpc, Rpc, Type};
use crate::proto::*;
use crate::status::from_client;
use lamina_api as api;
use lamina_client::Client;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tonic::{Request, Response, Status};

/// The size of a volume asked for without a capacity: 1 GiB.
pub const DEFAULT_SIZE: u64 = 1 << 30;

/// The RPCs this controller offers; exactly these work.
const CAPABILITIES: [rpc::Type; 10] = [
    rpc::Type::CreateDeleteVolume,
    rpc::Type::ListVolumes,
    rpc::Type::GetCapacity,
    rpc::Type::CreateDeleteSnapshot,
    rpc::Type::ListSnapshots,
    rpc::Type::CloneVolume,
    rpc::Type::ExpandVolume,
    rpc::Type::GetVolume,
    rpc::Type::GetSnapshot,
    rpc::Type::VolumeCondition,
];

pub struct ControllerService {
    pub(crate) client: Client,
    /// The node whose daemon this controller drives.
    storage_node: String,
    /// One lock per Lamina name being created or deleted, so that a CO's
    /// retries and concurrent calls for one name run one at a time.
    names: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl ControllerService {
    pub fn new(client: Client, storage_node: String) -> ControllerService {
        ControllerService {
            client,
            storage_node,
            names: Mutex::new(HashMap::new()),
        }
    }

    /// Serialise work on one name (volume or snapshot).
    pub(crate) async fn lock(&self, name: &str) -> NameGuard<'_> {
        let m = self
            .names
            .lock()
            .unwrap()
            .entry(name.to_string())
            .or_default()
            .clone();
        let guard = m.clone().lock_owned().await;
        NameGuard {
            svc: self,
            name: name.to_string(),
            _guard: Some(guard),
        }
    }

    /// The topology of every volume this controller makes.
    pub(crate) fn topology(&self) -> Topology {
        Topology {
            segments: [(crate::TOPOLOGY_KEY.to_string(), self.storage_node.clone())].into(),
        }
    }

    /// The volume a CSI id names, if it still exists (same name and id).
    pub(crate) async fn volume_by_id(&self, vid: &VolumeId) -> Result<Option<api::Volume>, Status> {
        match self.client.get_volume(&vid.name).await {
            Ok(v) if v.id == vid.id => Ok(Some(v)),
            Ok(_) => Ok(None),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(from_client(&e)),
        }
    }

    /// The snapshot a CSI id names, if it still exists.
    pub(crate) async fn snapshot_by_id(
        &self,
        sid: &SnapshotId,
    ) -> Result<Option<api::Snapshot>, Status> {
        let filter = api::SnapshotFilter {
            name: Some(sid.name.clone()),
            id: Some(sid.id),
        };
        let found = self
            .client
            .find_snapshots(&filter)
            .await
            .map_err(|e| from_client(&e))?;
        Ok(found
            .into_iter()
            .find(|s| s.volume == sid.volume && !s.system))
    }
}

/// Held while one name is worked on; forgets the name's lock when the last
/// holder leaves, so the map stays as small as the work in flight.
pub(crate) struct NameGuard<'a> {
    svc: &'a ControllerService,
    name: String,
    _guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for NameGuard<'_> {
    fn drop(&mut self) {
        self._guard.take();
        let mut names = self.svc.names.lock().unwrap();
        if let Some(m) = names.get(&self.name) {
            // Only the map holds it: nobody waits.
            if Arc::strong_count(m) == 1 {
                names.remove(&self.name);
            }
        }
    }
}

/// A CSI volume id for a daemon volume.
pub(crate) fn volume_id(v: &api::Volume) -> String {
    VolumeId {
        name: v.name.clone(),
        id: v.id,
    }
    .to_string()
}

/// Whether a capability is one Lamina serves, and if not why.
pub(crate) fn check_capability(c: &VolumeCapability) -> Result<(), String> {
    use volume_capability::access_mode::Mode;
    use volume_capability::AccessType;
    let mode = c.access_mode.as_ref().map(|m| m.mode).unwrap_or(0);
    match Mode::try_from(mode) {
        Ok(Mode::SingleNodeWriter | Mode::SingleNodeReaderOnly | Mode::SingleNodeSingleWriter) => {}
        Ok(m) => {
            return Err(format!(
            "access mode {} is not supported: a Lamina volume is used on one node by one writer",
            m.as_str_name()
        ))
        }
        Err(_) => return Err(format!("unknown access mode {mode}")),
    }
    match &c.access_type {
        Some(AccessType::Block(_)) => Ok(()),
        Some(AccessType::Mount(m)) => match m.fs_type.as_str() {
            "" | "ext4" | "xfs" => Ok(()),
            other => Err(format!(
                "filesystem {other:?} is not supported (ext4 or xfs)"
            )),
        },
        None => Err("the capability has no access type (block or mount)".into()),
    }
}

/// Check a list of capabilities: present, and each supported.
pub(crate) fn check_capabilities(caps: &[VolumeCapability]) -> Result<(), Status> {
    if caps.is_empty() {
        return Err(Status::invalid_argument("volume_capabilities is required"));
    }
    for c in caps {
        check_capability(c).map_err(Status::invalid_argument)?;
    }
    Ok(())
}

/// A page token: the id of the last entry of the page before.
pub(crate) fn parse_token(t: &str) -> Result<u64, Status> {
    if t.is_empty() {
        return Ok(0);
    }
    t.parse()
        .map_err(|_| Status::aborted(format!("starting_token {t:?} is not one this driver gave")))
}

/// An RFC 3339 time from the daemon as a protobuf timestamp.
pub(crate) fn timestamp(rfc3339: &str) -> Option<prost_types::Timestamp> {
    rfc3339.parse().ok()
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        r: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        self.create_volume_rpc(r.into_inner())
            .await
            .map(Response::new)
    }

    async fn delete_volume(
        &self,
        r: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        self.delete_volume_rpc(r.into_inner())
            .await
            .map(Response::new)
    }

    async fn controller_publish_volume(
        &self,
        _: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "Lamina needs no controller publish: the node attaches the volume when it stages it",
        ))
    }

    async fn controller_unpublish_volume(
        &self,
        _: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "Lamina needs no controller unpublish: the node detaches the volume when it unstages it",
        ))
    }

    async fn validate_volume_capabilities(
        &self,
        r: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        self.validate_rpc(r.into_inner()).await.map(Response::new)
    }

    async fn list_volumes(
        &self,
        r: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        self.list_volumes_rpc(r.into_inner())
            .await
            .map(Response::new)
    }

    async fn get_capacity(
        &self,
        r: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        self.get_capacity_rpc(r.into_inner())
            .await
            .map(Response::new)
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: CAPABILITIES
                .iter()
                .map(|t| ControllerServiceCapability {
                    r#type: Some(Type::Rpc(Rpc { r#type: *t as i32 })),
                })
                .collect(),
        }))
    }

    async fn create_snapshot(
        &self,
        r: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        self.create_snapshot_rpc(r.into_inner())
            .await
            .map(Response::new)
    }

    async fn delete_snapshot(
        &self,
        r: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        self.delete_snapshot_rpc(r.into_inner())
            .await
            .map(Response::new)
    }

    async fn list_snapshots(
        &self,
        r: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        self.list_snapshots_rpc(r.into_inner())
            .await
            .map(Response::new)
    }

    async fn get_snapshot(
        &self,
        r: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        self.get_snapshot_rpc(r.into_inner())
            .await
            .map(Response::new)
    }

    async fn controller_expand_volume(
        &self,
        r: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        self.expand_rpc(r.into_inner()).await.map(Response::new)
    }

    async fn controller_get_volume(
        &self,
        r: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        self.get_volume_rpc(r.into_inner()).await.map(Response::new)
    }

    async fn controller_modify_volume(
        &self,
        _: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "Lamina volumes have no mutable parameters (MODIFY_VOLUME is not offered)",
        ))
    }
}
