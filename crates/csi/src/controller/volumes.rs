//! CreateVolume (empty, restore, clone), DeleteVolume, ListVolumes,
//! ControllerGetVolume, ValidateVolumeCapabilities, GetCapacity and
//! ControllerExpandVolume.

use super::{
    check_capabilities, check_capability, parse_token, volume_id, ControllerService, DEFAULT_SIZE,
};
use crate::ids::{lamina_name, SnapshotId, VolumeId};
use crate::proto::volume_content_source::{SnapshotSource, Type as Source, VolumeSource};
use crate::proto::*;
use crate::status::{from_client, invalid};
use lamina_api as api;
use std::time::Duration;
use tonic::Status;

/// StorageClass parameter: `linked` (default) or `full` clones and restores.
pub const PARAM_CLONE: &str = "clone";
/// Parameters the CO adds on its own (`csi.storage.k8s.io/...`) are ignored.
const CO_PARAM_PREFIX: &str = "csi.storage.k8s.io/";

/// How long one CreateVolume waits for a full clone's copy before it
/// answers ABORTED (the CO calls again, and the call waits again).
const COPY_WAIT: Duration = Duration::from_secs(60);

const SECTOR: u64 = 512;

fn round_up(n: u64) -> u64 {
    n.max(1).div_ceil(SECTOR).saturating_mul(SECTOR)
}

/// Whether clones and restores copy the data (`clone: full`).
fn full_clone(params: &std::collections::HashMap<String, String>) -> Result<bool, Status> {
    let mut full = false;
    for (k, v) in params {
        if k.starts_with(CO_PARAM_PREFIX) {
            continue;
        }
        match (k.as_str(), v.as_str()) {
            (PARAM_CLONE, "linked") => full = false,
            (PARAM_CLONE, "full") => full = true,
            (PARAM_CLONE, other) => {
                return invalid!("parameter clone={other:?}: expected linked or full")
            }
            _ => return invalid!("unknown parameter {k:?} (Lamina takes: {PARAM_CLONE})"),
        }
    }
    Ok(full)
}

/// The (required, limit) bytes of a capacity range, checked.
fn range(r: Option<&CapacityRange>) -> Result<(u64, u64), Status> {
    let (req, lim) = r
        .map(|r| (r.required_bytes, r.limit_bytes))
        .unwrap_or((0, 0));
    if req < 0 || lim < 0 {
        return invalid!("capacity_range must not be negative");
    }
    let (req, lim) = (req as u64, lim as u64);
    if lim > 0 && req > lim {
        return invalid!("required_bytes {req} exceeds limit_bytes {lim}");
    }
    Ok((req, lim))
}

/// A requested source, resolved.
enum Resolved {
    None,
    Snapshot(SnapshotId, api::Snapshot),
    Volume(VolumeId, api::Volume),
}

impl ControllerService {
    pub(crate) async fn create_volume_rpc(
        &self,
        req: CreateVolumeRequest,
    ) -> Result<CreateVolumeResponse, Status> {
        if req.name.is_empty() {
            return invalid!("name is required");
        }
        check_capabilities(&req.volume_capabilities)?;
        let (want_min, limit) = range(req.capacity_range.as_ref())?;
        let full = full_clone(&req.parameters)?;
        self.check_topology(req.accessibility_requirements.as_ref())?;
        let name = lamina_name(&req.name);
        let _g = self.lock(&name).await;

        // Retried, or asked again: the same volume if it is compatible.
        match self.client.get_volume(&name).await {
            Ok(v) => return self.existing(v, &req, want_min, limit).await,
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(from_client(&e)),
        }

        let source = self.resolve(req.volume_content_source.as_ref()).await?;
        let source_size = match &source {
            Resolved::None => None,
            Resolved::Snapshot(_, s) => Some(s.restore_size),
            Resolved::Volume(_, v) => Some(v.size),
        };
        let size = match source_size {
            None if want_min == 0 && limit > 0 => DEFAULT_SIZE.min(limit / SECTOR * SECTOR),
            None if want_min == 0 => DEFAULT_SIZE,
            None => round_up(want_min),
            Some(s) => {
                if want_min > 0 && want_min < s {
                    return Err(Status::out_of_range(format!(
                        "{want_min} bytes asked, but the source holds {s} bytes: a volume cannot be smaller than its source"
                    )));
                }
                s.max(round_up(want_min))
            }
        };
        if size == 0 || (limit > 0 && size > limit) {
            return Err(Status::out_of_range(format!(
                "no volume size fits the range: sizes are whole {SECTOR}-byte sectors, the source needs {} bytes, limit_bytes is {limit}",
                source_size.unwrap_or(0)
            )));
        }

        let made = match &source {
            Resolved::None => {
                let r = api::CreateVolume {
                    name: name.clone(),
                    size,
                };
                self.client
                    .create_volume(&r)
                    .await
                    .map_err(|e| from_client(&e))?
                    .value
            }
            Resolved::Snapshot(..) | Resolved::Volume(..) => {
                let (from_snapshot, from_volume) = match &source {
                    Resolved::Snapshot(id, _) => (Some(id.source()), None),
                    Resolved::Volume(id, _) => (None, Some(id.name.clone())),
                    Resolved::None => (None, None),
                };
                let r = api::CreateClone {
                    name: name.clone(),
                    from_snapshot,
                    from_volume,
                    full,
                    from_node: None,
                };
                let c = self
                    .client
                    .create_clone(&r)
                    .await
                    .map_err(|e| from_client(&e))?
                    .value;
                if let Some(op) = c.operation {
                    self.wait_copy(&name, &op.id).await?;
                }
                self.grow_to(&name, size).await?
            }
        };
        Ok(CreateVolumeResponse {
            volume: Some(self.csi_volume(&made, req.volume_content_source.clone())),
        })
    }

    /// CreateVolume for a name that exists: the same volume if its size
    /// fits the range and it came from the same source, else ALREADY_EXISTS.
    async fn existing(
        &self,
        v: api::Volume,
        req: &CreateVolumeRequest,
        want_min: u64,
        limit: u64,
    ) -> Result<CreateVolumeResponse, Status> {
        let asked = requested_source(req.volume_content_source.as_ref())?;
        let had = self.created_from(&v).await?;
        if let Some(had) = &had {
            if *had != asked {
                return Err(Status::already_exists(format!(
                    "volume {:?} exists, made from {}, not from {}",
                    req.name,
                    had.as_deref().unwrap_or("nothing"),
                    asked.as_deref().unwrap_or("nothing")
                )));
            }
        }
        if let (api::CloneState::Copying, Some(op)) = (&v.clone_state, &v.operation) {
            self.wait_copy(&v.name, op).await?;
        }
        // A clone or restore is made at its source's size, then grown: a
        // call cut off between the two left it smaller than asked, and the
        // retry finishes the growing.
        let size = round_up(want_min);
        let fits_limit = limit == 0 || size <= limit;
        if matches!(had, Some(Some(_))) && v.size < want_min && fits_limit && v.export.is_none() {
            self.grow_to(&v.name, size).await?;
        } else if v.size < want_min || (limit > 0 && v.size > limit) {
            return Err(Status::already_exists(format!(
                "volume {:?} exists with {} bytes, outside the range asked for ({want_min}..{limit})",
                req.name, v.size
            )));
        }
        let v = self
            .client
            .get_volume(&v.name)
            .await
            .map_err(|e| from_client(&e))?;
        Ok(CreateVolumeResponse {
            volume: Some(self.csi_volume(&v, req.volume_content_source.clone())),
        })
    }

    /// What a volume was made from, as the daemon names sources: `Some(None)`
    /// for an empty volume, `None` when no record says (pruned long ago).
    async fn created_from(&self, v: &api::Volume) -> Result<Option<Option<String>>, Status> {
        let f = api::OperationFilter {
            volume: Some(v.name.clone()),
            state: None,
            limit: None,
        };
        let ops = self
            .client
            .list_operations(&f)
            .await
            .map_err(|e| from_client(&e))?;
        for op in ops {
            match op.kind {
                api::OperationKind::CreateVolume => return Ok(Some(None)),
                api::OperationKind::Clone | api::OperationKind::FullClone => {
                    return Ok(Some(op.source))
                }
                _ => {}
            }
        }
        Ok(v.origin.as_ref().map(|o| match (&o.volume, &o.snapshot) {
            (Some(vol), Some(s)) if s.starts_with('.') => Some(vol.clone()),
            (Some(vol), Some(s)) => Some(format!("{vol}/{s}")),
            _ => None,
        }))
    }

    /// The source a request names, resolved: NOT_FOUND when it is missing.
    async fn resolve(&self, src: Option<&VolumeContentSource>) -> Result<Resolved, Status> {
        match src.and_then(|s| s.r#type.as_ref()) {
            None => Ok(Resolved::None),
            Some(Source::Snapshot(SnapshotSource { snapshot_id })) => {
                let not_found =
                    || Status::not_found(format!("source snapshot {snapshot_id:?} does not exist"));
                let id = SnapshotId::parse(snapshot_id).ok_or_else(not_found)?;
                let s = self.snapshot_by_id(&id).await?.ok_or_else(not_found)?;
                Ok(Resolved::Snapshot(id, s))
            }
            Some(Source::Volume(VolumeSource { volume_id })) => {
                let not_found =
                    || Status::not_found(format!("source volume {volume_id:?} does not exist"));
                let id = VolumeId::parse(volume_id).ok_or_else(not_found)?;
                let v = self.volume_by_id(&id).await?.ok_or_else(not_found)?;
                if v.clone_state == api::CloneState::Copying {
                    return Err(Status::unavailable(format!(
                        "source volume {volume_id:?} is still being copied into; try again when it is done"
                    )));
                }
                Ok(Resolved::Volume(id, v))
            }
        }
    }

    /// Wait for a full clone's copy; ABORTED if it is still running after a
    /// while (the CO calls again), the daemon's error if it failed.
    async fn wait_copy(&self, name: &str, op: &str) -> Result<(), Status> {
        let deadline = tokio::time::Instant::now() + COPY_WAIT;
        loop {
            let o = self
                .client
                .get_operation(op)
                .await
                .map_err(|e| from_client(&e))?;
            match o.state {
                api::OperationState::Succeeded => return Ok(()),
                api::OperationState::Failed => {
                    return Err(Status::internal(format!(
                        "copying data into volume {name:?} failed: {}",
                        o.error.unwrap_or_default()
                    )))
                }
                api::OperationState::Running if tokio::time::Instant::now() >= deadline => {
                    return Err(Status::aborted(format!(
                        "volume {name:?} is still being copied ({} of {} bytes); call again",
                        o.done_bytes, o.total_bytes
                    )))
                }
                api::OperationState::Running => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
            }
        }
    }

    /// Expand a new clone to the size asked for, if larger than its source.
    async fn grow_to(&self, name: &str, size: u64) -> Result<api::Volume, Status> {
        let v = self
            .client
            .get_volume(name)
            .await
            .map_err(|e| from_client(&e))?;
        if v.size >= size {
            return Ok(v);
        }
        self.client
            .expand_volume(name, &api::ExpandVolume { size })
            .await
            .map_err(|e| from_client(&e))
    }

    /// RESOURCE_EXHAUSTED when the requirements exclude this storage node.
    fn check_topology(&self, t: Option<&TopologyRequirement>) -> Result<(), Status> {
        let Some(t) = t else { return Ok(()) };
        let ours = self.topology();
        let all: Vec<&Topology> = t.requisite.iter().chain(&t.preferred).collect();
        if all.is_empty() || all.iter().any(|x| fits(x, &ours)) {
            return Ok(());
        }
        Err(Status::resource_exhausted(format!(
            "no accessible topology includes the storage node {:?}",
            ours.segments
                .get(crate::TOPOLOGY_KEY)
                .cloned()
                .unwrap_or_default()
        )))
    }

    pub(crate) fn csi_volume(
        &self,
        v: &api::Volume,
        source: Option<VolumeContentSource>,
    ) -> Volume {
        Volume {
            capacity_bytes: v.size as i64,
            volume_id: volume_id(v),
            volume_context: Default::default(),
            content_source: source,
            accessible_topology: vec![self.topology()],
        }
    }

    pub(crate) async fn delete_volume_rpc(
        &self,
        req: DeleteVolumeRequest,
    ) -> Result<DeleteVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return invalid!("volume_id is required");
        }
        // An id this driver never gave names nothing: deleting it succeeds.
        let Some(id) = VolumeId::parse(&req.volume_id) else {
            return Ok(DeleteVolumeResponse {});
        };
        let _g = self.lock(&id.name).await;
        let Some(v) = self.volume_by_id(&id).await? else {
            return Ok(DeleteVolumeResponse {});
        };
        if let Some(x) = &v.export {
            if x.connections > 0 {
                return Err(Status::failed_precondition(format!(
                    "volume {:?} is in use: {} NBD client(s) connected (unstage it first)",
                    req.volume_id, x.connections
                )));
            }
            // A stale export, left by a node that is gone.
            self.client
                .detach_volume(&v.name, false)
                .await
                .map_err(|e| from_client(&e))?;
        }
        match self.client.delete_volume(&v.name, false).await {
            Ok(_) => Ok(DeleteVolumeResponse {}),
            Err(e) if e.is_not_found() => Ok(DeleteVolumeResponse {}),
            Err(e) => Err(from_client(&e)),
        }
    }

    pub(crate) async fn list_volumes_rpc(
        &self,
        req: ListVolumesRequest,
    ) -> Result<ListVolumesResponse, Status> {
        if req.max_entries < 0 {
            return invalid!("max_entries must not be negative");
        }
        let after = parse_token(&req.starting_token)?;
        let mut vols = self
            .client
            .list_volumes()
            .await
            .map_err(|e| from_client(&e))?;
        vols.retain(|v| v.id > after && !v.name.starts_with('.'));
        vols.sort_by_key(|v| v.id);
        let max = if req.max_entries == 0 {
            usize::MAX
        } else {
            req.max_entries as usize
        };
        let next_token = if vols.len() > max {
            vols[max - 1].id.to_string()
        } else {
            String::new()
        };
        vols.truncate(max);
        Ok(ListVolumesResponse {
            entries: vols
                .iter()
                .map(|v| list_volumes_response::Entry {
                    volume: Some(self.csi_volume(v, None)),
                    status: Some(list_volumes_response::VolumeStatus {
                        published_node_ids: vec![],
                        volume_condition: Some(condition(v)),
                    }),
                })
                .collect(),
            next_token,
        })
    }

    pub(crate) async fn get_volume_rpc(
        &self,
        req: ControllerGetVolumeRequest,
    ) -> Result<ControllerGetVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return invalid!("volume_id is required");
        }
        let not_found = || Status::not_found(format!("volume {:?} does not exist", req.volume_id));
        let id = VolumeId::parse(&req.volume_id).ok_or_else(not_found)?;
        let v = self.volume_by_id(&id).await?.ok_or_else(not_found)?;
        Ok(ControllerGetVolumeResponse {
            volume: Some(self.csi_volume(&v, None)),
            status: Some(controller_get_volume_response::VolumeStatus {
                published_node_ids: vec![],
                volume_condition: Some(condition(&v)),
            }),
        })
    }

    pub(crate) async fn validate_rpc(
        &self,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse, Status> {
        if req.volume_id.is_empty() {
            return invalid!("volume_id is required");
        }
        if req.volume_capabilities.is_empty() {
            return invalid!("volume_capabilities is required");
        }
        let not_found = || Status::not_found(format!("volume {:?} does not exist", req.volume_id));
        let id = VolumeId::parse(&req.volume_id).ok_or_else(not_found)?;
        self.volume_by_id(&id).await?.ok_or_else(not_found)?;
        if let Err(why) = full_clone(&req.parameters) {
            return Ok(ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: why.message().into(),
            });
        }
        for c in &req.volume_capabilities {
            if let Err(why) = check_capability(c) {
                return Ok(ValidateVolumeCapabilitiesResponse {
                    confirmed: None,
                    message: why,
                });
            }
        }
        Ok(ValidateVolumeCapabilitiesResponse {
            confirmed: Some(validate_volume_capabilities_response::Confirmed {
                volume_context: req.volume_context,
                volume_capabilities: req.volume_capabilities,
                parameters: req.parameters,
                mutable_parameters: Default::default(),
            }),
            message: String::new(),
        })
    }

    pub(crate) async fn get_capacity_rpc(
        &self,
        req: GetCapacityRequest,
    ) -> Result<GetCapacityResponse, Status> {
        let fits_caps = req
            .volume_capabilities
            .iter()
            .all(|c| check_capability(c).is_ok());
        let fits_topo = req
            .accessible_topology
            .as_ref()
            .is_none_or(|t| fits(t, &self.topology()));
        let available = if fits_caps && fits_topo && full_clone(&req.parameters).is_ok() {
            let h = self.client.health().await.map_err(|e| from_client(&e))?;
            h.capacity_bytes
        } else {
            0
        };
        Ok(GetCapacityResponse {
            available_capacity: available.min(i64::MAX as u64) as i64,
            maximum_volume_size: None,
            minimum_volume_size: Some(SECTOR as i64),
        })
    }

    pub(crate) async fn expand_rpc(
        &self,
        req: ControllerExpandVolumeRequest,
    ) -> Result<ControllerExpandVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return invalid!("volume_id is required");
        }
        let Some(r) = req.capacity_range.as_ref() else {
            return invalid!("capacity_range is required");
        };
        let (want, limit) = range(Some(r))?;
        let not_found = || Status::not_found(format!("volume {:?} does not exist", req.volume_id));
        let id = VolumeId::parse(&req.volume_id).ok_or_else(not_found)?;
        let _g = self.lock(&id.name).await;
        let v = self.volume_by_id(&id).await?.ok_or_else(not_found)?;
        let node_expansion_required = !matches!(
            req.volume_capability
                .as_ref()
                .and_then(|c| c.access_type.as_ref()),
            Some(volume_capability::AccessType::Block(_))
        );
        let size = round_up(want);
        if limit > 0 && size > limit {
            return Err(Status::out_of_range(format!(
                "{size} bytes (whole sectors) exceeds limit_bytes {limit}"
            )));
        }
        if size <= v.size {
            return Ok(ControllerExpandVolumeResponse {
                capacity_bytes: v.size as i64,
                node_expansion_required,
            });
        }
        if let Some(x) = v.export.as_ref().filter(|x| x.connections > 0) {
            return Err(Status::failed_precondition(format!(
                "volume {:?} is in use by {} NBD client(s): Lamina grows volumes offline, while no node uses them",
                req.volume_id, x.connections
            )));
        }
        let grown = self
            .client
            .expand_volume(&v.name, &api::ExpandVolume { size })
            .await
            .map_err(|e| from_client(&e))?;
        Ok(ControllerExpandVolumeResponse {
            capacity_bytes: grown.size as i64,
            node_expansion_required,
        })
    }
}

/// The source a request names, as the daemon's operations name sources.
fn requested_source(src: Option<&VolumeContentSource>) -> Result<Option<String>, Status> {
    Ok(match src.and_then(|s| s.r#type.as_ref()) {
        None => None,
        Some(Source::Snapshot(s)) => Some(
            SnapshotId::parse(&s.snapshot_id)
                .ok_or_else(|| {
                    Status::not_found(format!(
                        "source snapshot {:?} does not exist",
                        s.snapshot_id
                    ))
                })?
                .source(),
        ),
        Some(Source::Volume(v)) => Some(
            VolumeId::parse(&v.volume_id)
                .ok_or_else(|| {
                    Status::not_found(format!("source volume {:?} does not exist", v.volume_id))
                })?
                .name,
        ),
    })
}

/// Whether `want` (a CO's topology) holds for `ours`: every key it names.
fn fits(want: &Topology, ours: &Topology) -> bool {
    want.segments
        .iter()
        .all(|(k, v)| ours.segments.get(k) == Some(v))
}

fn condition(v: &api::Volume) -> VolumeCondition {
    match v.clone_state {
        api::CloneState::Copying => VolumeCondition {
            abnormal: true,
            message: "a full clone is still copying data into it".into(),
        },
        _ => VolumeCondition {
            abnormal: false,
            message: "healthy".into(),
        },
    }
}
