//! CreateVolume (empty, restore, clone), DeleteVolume, ListVolumes,
//! ControllerGetVolume, ValidateVolumeCapabilities, GetCapacity and
//! ControllerExpandVolume.

use super::{check_capabilities, check_capability, volume_id, ControllerService, DEFAULT_SIZE};
use crate::ids::{fits_csi_limit, lamina_name, shown, SnapshotId, VolumeId};
use crate::nodes::ZONE_LABEL;
use crate::nodes::{topology_of, Picked};
use crate::placement::{allowed, choose, choose_replicas, fits, Candidate, Spread};
use crate::proto::volume_content_source::{SnapshotSource, Type as Source, VolumeSource};
use crate::proto::*;
use crate::status::{from_client, invalid};
use lamina_api as api;
use std::time::Duration;
use tonic::Status;

/// StorageClass parameter: `linked` (default) or `full` clones and restores.
pub const PARAM_CLONE: &str = "clone";
/// StorageClass parameter: how many replicas a volume has, each in the
/// pool of a node of its own (1 to [`MAX_REPLICAS`], default 1).
pub const PARAM_REPLICAS: &str = "replicas";
/// The most replicas a volume has (the daemon's limit).
pub const MAX_REPLICAS: usize = 3;
/// StorageClass parameter: `required` (default: where nodes carry zones,
/// each replica in a zone of its own, or none is made) or `preferred`
/// (distinct zones first, then distinct nodes).
pub const PARAM_REPLICA_ZONES: &str = "replicaZones";
/// Parameters the CO adds on its own (`csi.storage.k8s.io/...`) are ignored.
const CO_PARAM_PREFIX: &str = "csi.storage.k8s.io/";

/// How long one CreateVolume waits for a full clone's copy before it
/// answers ABORTED (the CO calls again, and the call waits again).
const COPY_WAIT: Duration = Duration::from_secs(60);

const SECTOR: u64 = 512;
/// The largest volume Lamina makes: 64 PiB. The engine's
/// `MAX_VOLUME_SIZE`, restated because this crate must not depend on the
/// engine (a test checks that they agree).
const MAX_SIZE: u64 = 1 << 56;

fn round_up(n: u64) -> u64 {
    n.max(1).div_ceil(SECTOR).saturating_mul(SECTOR)
}

/// The smallest device mkfs.xfs formats: it refuses anything under 300 MiB
/// ("Filesystem must be larger than 300MB", xfsprogs 5.19 and later).
pub const XFS_MIN_SIZE: u64 = 300 << 20;

/// The least size a new volume with these capabilities is made at, and the
/// file system that sets it: a volume to be mounted as xfs gets at least
/// [`XFS_MIN_SIZE`] (CSI lets a plugin give more than `required_bytes`), so
/// that NodeStageVolume's mkfs succeeds on a claim of 1Mi. ext4 and block
/// volumes have no floor.
fn fs_floor(caps: &[VolumeCapability]) -> Option<(u64, &'static str)> {
    use volume_capability::AccessType;
    caps.iter()
        .any(|c| matches!(&c.access_type, Some(AccessType::Mount(m)) if m.fs_type == "xfs"))
        .then_some((XFS_MIN_SIZE, "xfs"))
}

/// A StorageClass's parameters, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Params {
    /// Clones and restores copy the data (`clone: full`).
    pub full: bool,
    /// Replicas, each on a node of its own (`replicas`, 1 to 3).
    pub replicas: usize,
    /// Whether they must be in distinct zones (`replicaZones`).
    pub spread: Spread,
}

pub(crate) fn params(params: &std::collections::HashMap<String, String>) -> Result<Params, Status> {
    let mut p = Params {
        full: false,
        replicas: 1,
        spread: Spread::Required,
    };
    for (k, v) in params {
        if k.starts_with(CO_PARAM_PREFIX) {
            continue;
        }
        match (k.as_str(), v.as_str()) {
            (PARAM_CLONE, "linked") => p.full = false,
            (PARAM_CLONE, "full") => p.full = true,
            (PARAM_CLONE, other) => {
                return invalid!("parameter clone={}: expected linked or full", shown(other))
            }
            (PARAM_REPLICAS, n) => match n.parse::<usize>() {
                Ok(n @ 1..=MAX_REPLICAS) => p.replicas = n,
                _ => {
                    return invalid!(
                        "parameter replicas={}: expected 1 to {MAX_REPLICAS}",
                        shown(n)
                    )
                }
            },
            (PARAM_REPLICA_ZONES, "required") => p.spread = Spread::Required,
            (PARAM_REPLICA_ZONES, "preferred") => p.spread = Spread::Preferred,
            (PARAM_REPLICA_ZONES, other) => {
                return invalid!(
                    "parameter {PARAM_REPLICA_ZONES}={}: expected required or preferred",
                    shown(other)
                )
            }
            _ => {
                return invalid!(
                    "unknown parameter {} (Lamina takes: {PARAM_CLONE}, {PARAM_REPLICAS}, {PARAM_REPLICA_ZONES})",
                    shown(k)
                )
            }
        }
    }
    Ok(p)
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
    // A capacity no Lamina volume can have: CSI's code for an unsupported
    // capacity, as when no whole number of sectors fits the range.
    if req > MAX_SIZE {
        return Err(Status::out_of_range(format!(
            "required_bytes {req} is more than a Lamina volume holds (64 PiB, {MAX_SIZE} bytes)"
        )));
    }
    Ok((req, lim))
}

/// A requested source, resolved: with the node it is on.
enum Resolved {
    None,
    Snapshot(api::Snapshot, Picked),
    Volume(VolumeId, api::Volume, Picked),
}

impl Resolved {
    fn node(&self) -> Option<&Picked> {
        match self {
            Resolved::None => None,
            Resolved::Snapshot(.., n) | Resolved::Volume(.., n) => Some(n),
        }
    }
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
        let Params {
            full,
            replicas,
            spread,
        } = params(&req.parameters)?;
        let name = lamina_name(&req.name);
        let _g = self.lock(&name).await;

        // Retried, or asked again: the same volume if it is compatible.
        if let Some((node, v)) = self.find_volume(&name).await? {
            return self
                .existing(&node, v, &req, want_min, limit, (replicas, spread))
                .await;
        }

        let source = self.resolve(req.volume_content_source.as_ref()).await?;
        let source_size = match &source {
            Resolved::None => None,
            Resolved::Snapshot(s, _) => Some(s.restore_size),
            Resolved::Volume(_, v, _) => Some(v.size),
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
        let size = match fs_floor(&req.volume_capabilities) {
            Some((floor, fs)) if size < floor => {
                if limit > 0 && floor > limit {
                    return Err(Status::out_of_range(format!(
                        "a volume formatted {fs} needs at least {floor} bytes (mkfs.{fs} refuses a smaller device), but limit_bytes is {limit}"
                    )));
                }
                floor
            }
            _ => size,
        };

        let node = self
            .place(req.accessibility_requirements.as_ref(), &source, size)
            .await?;
        if !fits_csi_limit(self.nodes.qualifier(&node.name).as_deref(), &name) {
            return invalid!(
                "the id of volume {name:?} on node {:?} could exceed CSI's {} bytes",
                node.name,
                crate::ids::MAX_ID_LEN
            );
        }
        // An empty volume is made with its replicas; a clone or restore is
        // made here first, then given its other replicas (each a full copy).
        let others = match &source {
            Resolved::None if replicas > 1 => {
                self.replica_nodes(&node, &[], replicas - 1, spread).await?
            }
            _ => vec![],
        };
        let made = match &source {
            Resolved::None => {
                let labels = if replicas > 1 {
                    [(api::REPLICAS_WANTED_LABEL.to_string(), replicas.to_string())].into()
                } else {
                    Default::default()
                };
                let r = api::CreateVolume {
                    name: name.clone(),
                    size,
                    replicas: others,
                    labels,
                };
                node.client
                    .create_volume(&r)
                    .await
                    .map_err(|e| from_client(&e))?
                    .value
            }
            Resolved::Snapshot(..) | Resolved::Volume(..) => {
                let (from_snapshot, from_volume) = match &source {
                    // The volume may have been deleted since (its snapshots
                    // stay): `NAME@ID` reaches it alone.
                    Resolved::Snapshot(s, _) => {
                        (Some(format!("{}/{}", s.volume_reference(), s.name)), None)
                    }
                    Resolved::Volume(id, ..) => (None, Some(id.name.clone())),
                    Resolved::None => (None, None),
                };
                let from_node = match source.node() {
                    Some(src) if src.name != node.name => Some(peer(src)?),
                    _ => None,
                };
                let r = api::CreateClone {
                    name: name.clone(),
                    from_snapshot,
                    from_volume,
                    full,
                    from_node,
                };
                let c = node
                    .client
                    .create_clone(&r)
                    .await
                    .map_err(|e| from_client(&e))?
                    .value;
                if let Some(op) = c.operation {
                    self.wait_copy(&node, &name, &op.id).await?;
                }
                self.grow_to(&node, &name, size).await?;
                self.ensure_replicas(&node, &name, (replicas, spread))
                    .await?
            }
        };
        Ok(CreateVolumeResponse {
            volume: Some(self.csi_volume(&node.name, &made, req.volume_content_source.clone())),
        })
    }

    /// A volume of this name on any node the controller can reach (not a
    /// replica of another node's: that node's volume is the one). A node
    /// that does not answer is passed over (docs/csi.md: a retry could
    /// then place the volume again elsewhere).
    async fn find_volume(&self, name: &str) -> Result<Option<(Picked, api::Volume)>, Status> {
        for n in self.nodes.all() {
            match n.client.get_volume(name).await {
                Ok(v) if crate::ids::is_replica(&v) => {}
                Ok(v) => return Ok(Some((n, v))),
                Err(e) if e.is_not_found() => {}
                Err(lamina_client::Error::Unreachable { .. }) if self.nodes.qualified() => {
                    tracing::warn!(node = %n.name, volume = %name, "node unreachable while looking for a volume");
                }
                Err(e) => return Err(from_client(&e)),
            }
        }
        Ok(None)
    }

    /// The node a new volume goes to. A clone or restore stays on its
    /// source's node when the requirements allow it (the daemon's linked
    /// or full clone); a restore elsewhere pulls the snapshot over.
    async fn place(
        &self,
        req: Option<&TopologyRequirement>,
        source: &Resolved,
        size: u64,
    ) -> Result<Picked, Status> {
        if let Some(src) = source.node() {
            if allowed(req, &src.name) {
                return Ok(src.clone());
            }
            if let Resolved::Volume(id, ..) = source {
                return Err(Status::failed_precondition(format!(
                    "volume {id} is on node {:?}, which the topology requirements exclude: Lamina clones a volume only on its own node (take a VolumeSnapshot and restore it on the other node)",
                    src.name
                )));
            }
        }
        let mut cands = vec![];
        let mut seen = vec![];
        for n in self.nodes.all() {
            match n.client.health().await {
                Ok(h) => {
                    seen.push(format!("{} ({} bytes free)", n.name, h.capacity_bytes));
                    cands.push(Candidate {
                        name: n.name.clone(),
                        free: h.capacity_bytes,
                        zone: n.zone.clone(),
                    });
                }
                Err(e) => {
                    tracing::warn!(node = %n.name, error = %e, "node left out of placement");
                    seen.push(format!("{} (unreachable)", n.name));
                }
            }
        }
        if cands.is_empty() {
            return Err(Status::unavailable(format!(
                "no storage node answers; nodes: {}",
                if seen.is_empty() {
                    "none known".to_string()
                } else {
                    seen.join(", ")
                }
            )));
        }
        let chosen = choose(req, &cands, size).ok_or_else(|| {
            Status::resource_exhausted(format!(
                "no known storage node is allowed by the topology requirements (a volume of {size} bytes); nodes: {}",
                seen.join(", ")
            ))
        })?;
        self.node(Some(&chosen))
    }

    /// CreateVolume for a name that exists: the same volume if its size
    /// fits the range and it came from the same source, else ALREADY_EXISTS.
    async fn existing(
        &self,
        node: &Picked,
        v: api::Volume,
        req: &CreateVolumeRequest,
        want_min: u64,
        limit: u64,
        replicas: (usize, Spread),
    ) -> Result<CreateVolumeResponse, Status> {
        let asked = requested_source(req.volume_content_source.as_ref())?;
        let had = self.created_from(node, &v).await?;
        if let Some(had) = &had {
            if *had != asked {
                return Err(Status::already_exists(format!(
                    "volume {} exists, made from {}, not from {}",
                    shown(&req.name),
                    had.as_deref().unwrap_or("nothing"),
                    asked.as_deref().unwrap_or("nothing")
                )));
            }
        }
        if let (api::CloneState::Copying, Some(op)) = (&v.clone_state, &v.operation) {
            self.wait_copy(node, &v.name, op).await?;
        }
        // A clone or restore is made at its source's size, then grown: a
        // call cut off between the two left it smaller than asked, and the
        // retry finishes the growing.
        let size = round_up(want_min);
        let fits_limit = limit == 0 || size <= limit;
        if matches!(had, Some(Some(_))) && v.size < want_min && fits_limit && v.export.is_none() {
            self.grow_to(node, &v.name, size).await?;
        } else if v.size < want_min || (limit > 0 && v.size > limit) {
            return Err(Status::already_exists(format!(
                "volume {} exists with {} bytes, outside the range asked for ({want_min}..{limit})",
                shown(&req.name),
                v.size
            )));
        }
        // A call cut off before every replica was added: the retry adds the
        // rest. A volume with more than asked keeps them.
        let v = self.ensure_replicas(node, &v.name, replicas).await?;
        Ok(CreateVolumeResponse {
            volume: Some(self.csi_volume(&node.name, &v, req.volume_content_source.clone())),
        })
    }

    /// Volume `name` on `node` with at least `want` replicas: those it
    /// lacks added on other nodes (each a full copy, made in the
    /// background: the volume is usable meanwhile, degraded). The volume
    /// as it is then.
    async fn ensure_replicas(
        &self,
        node: &Picked,
        name: &str,
        (want, spread): (usize, Spread),
    ) -> Result<api::Volume, Status> {
        let v = node
            .client
            .get_volume(name)
            .await
            .map_err(|e| from_client(&e))?;
        let held: Vec<String> = v
            .replication
            .iter()
            .flat_map(|r| r.replicas.iter().map(|x| x.node.clone()))
            .collect();
        let have = held.len().max(1);
        // The count asked for, recorded with the volume: Lamina's
        // controllers add back a replica a replacement could not.
        let wanted = want.to_string();
        if want > 1
            && v.labels.get(api::REPLICAS_WANTED_LABEL) != Some(&wanted)
            && !v.labels.keys().any(|k| k.starts_with("lamina.io/"))
        {
            let mut labels = v.labels.clone();
            labels.insert(api::REPLICAS_WANTED_LABEL.into(), wanted);
            node.client
                .set_volume_labels(name, &labels)
                .await
                .map_err(|e| from_client(&e))?;
        }
        if have >= want {
            return node
                .client
                .get_volume(name)
                .await
                .map_err(|e| from_client(&e));
        }
        let zones = self.nodes.all();
        let held: Vec<(String, Option<String>)> = held
            .into_iter()
            .map(|n| {
                let z = zones
                    .iter()
                    .find(|x| x.name == n)
                    .and_then(|x| x.zone.clone());
                (n, z)
            })
            .collect();
        for other in self.replica_nodes(node, &held, want - have, spread).await? {
            node.client
                .add_replica(name, &other)
                .await
                .map_err(|e| from_client(&e))?;
        }
        node.client
            .get_volume(name)
            .await
            .map_err(|e| from_client(&e))
    }

    /// `n` nodes for more replicas of a volume on `front` (none of
    /// `taken`), each known to `front`'s daemon by its transfer address
    /// (its node list, where a replicated volume names its replicas'
    /// nodes): RESOURCE_EXHAUSTED naming what is missing when there are
    /// not enough.
    async fn replica_nodes(
        &self,
        front: &Picked,
        taken: &[(String, Option<String>)],
        n: usize,
        spread: Spread,
    ) -> Result<Vec<String>, Status> {
        let mut cands = vec![];
        let mut seen = vec![];
        for x in self.nodes.all() {
            if x.name == front.name {
                continue;
            }
            if x.transfer_address.is_none() {
                seen.push(format!("{} (no transfer address)", x.name));
                continue;
            }
            let zone = match &x.zone {
                Some(z) => format!(", zone {z}"),
                None => String::new(),
            };
            match x.client.health().await {
                Ok(h) => {
                    seen.push(format!(
                        "{} ({} bytes free{zone})",
                        x.name, h.capacity_bytes
                    ));
                    cands.push(Candidate {
                        name: x.name.clone(),
                        free: h.capacity_bytes,
                        zone: x.zone.clone(),
                    });
                }
                Err(e) => {
                    tracing::warn!(node = %x.name, error = %e, "node left out of replica placement");
                    seen.push(format!("{} (unreachable)", x.name));
                }
            }
        }
        let front_zone = (front.name.as_str(), front.zone.as_deref());
        let chosen = choose_replicas(front_zone, taken, &cands, n, spread).map_err(|short| {
            let besides = std::iter::once(front.name.clone())
                .chain(taken.iter().map(|t| t.0.clone()))
                .collect::<Vec<_>>()
                .join(", ");
            let other_nodes = if seen.is_empty() {
                "none known".to_string()
            } else {
                seen.join(", ")
            };
            let msg = match short.new_zones {
                None => format!(
                    "{n} more replica(s) need as many storage nodes besides {besides} that answer and have a transfer address; {} found (other nodes: {other_nodes})",
                    short.nodes
                ),
                Some(z) => format!(
                    "{n} more replica(s) need as many storage nodes besides {besides}, each in a zone ({ZONE_LABEL}) no replica is in{}; {z} found, of {} nodes that answer and have a transfer address (other nodes: {other_nodes}); {PARAM_REPLICA_ZONES}: preferred allows replicas in zones already used",
                    match front.zone.as_deref() {
                        Some(fz) => format!(" (the front end's node is in zone {fz})"),
                        None => String::new(),
                    },
                    short.nodes
                ),
            };
            Status::resource_exhausted(msg)
        })?;
        for name in &chosen {
            let other = self.node(Some(name))?;
            let address = peer(&other)?.address;
            self.know_node(front, name, &address).await?;
        }
        Ok(chosen)
    }

    /// Put node `name` at `address` in `front`'s daemon's node list (a
    /// node pod that came back with a new IP registers that one).
    async fn know_node(&self, front: &Picked, name: &str, address: &str) -> Result<(), Status> {
        let req = api::AddNode {
            name: name.to_string(),
            address: address.to_string(),
        };
        front
            .client
            .put_node(&req)
            .await
            .map_err(|e| from_client(&e))
    }

    /// What a volume was made from, as the daemon names sources: `Some(None)`
    /// for an empty volume, `None` when no record says (pruned long ago).
    async fn created_from(
        &self,
        node: &Picked,
        v: &api::Volume,
    ) -> Result<Option<Option<String>>, Status> {
        let f = api::OperationFilter {
            volume: Some(v.name.clone()),
            state: None,
            limit: None,
        };
        let ops = node
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
                // `NODE:VOLUME/SNAPSHOT`: the snapshot's path is what a
                // request names (its id's node is where it lives).
                api::OperationKind::RemoteClone => {
                    return Ok(Some(op.source.map(|s| match s.split_once(':') {
                        Some((_, path)) => path.to_string(),
                        None => s,
                    })))
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
                let not_found = || {
                    Status::not_found(format!(
                        "source snapshot {} does not exist",
                        shown(snapshot_id)
                    ))
                };
                let id = SnapshotId::parse(snapshot_id).ok_or_else(not_found)?;
                let found = self.snapshot_by_id(&id).await?.ok_or_else(not_found)?;
                Ok(Resolved::Snapshot(found.snapshot, found.node))
            }
            Some(Source::Volume(VolumeSource { volume_id })) => {
                let not_found = || {
                    Status::not_found(format!("source volume {} does not exist", shown(volume_id)))
                };
                let id = VolumeId::parse(volume_id).ok_or_else(not_found)?;
                let (node, v) = self.volume_by_id(&id).await?.ok_or_else(not_found)?;
                if v.clone_state == api::CloneState::Copying {
                    return Err(Status::unavailable(format!(
                        "source volume {} is still being copied into; try again when it is done",
                        shown(volume_id)
                    )));
                }
                Ok(Resolved::Volume(id, v, node))
            }
        }
    }

    /// Wait for a full clone's copy (local, or from another node); ABORTED
    /// if it is still running after a while (the CO calls again), the
    /// daemon's error and reason if it failed.
    async fn wait_copy(&self, node: &Picked, name: &str, op: &str) -> Result<(), Status> {
        let deadline = tokio::time::Instant::now() + COPY_WAIT;
        loop {
            let o = node
                .client
                .get_operation(op)
                .await
                .map_err(|e| from_client(&e))?;
            match o.state {
                api::OperationState::Succeeded => return Ok(()),
                api::OperationState::Failed => {
                    let reason = o
                        .reason
                        .map(|r| format!(" (reason: {})", r.as_str()))
                        .unwrap_or_default();
                    return Err(Status::internal(format!(
                        "copying data into volume {name:?} on node {:?} failed{reason}: {}",
                        node.name,
                        o.error.unwrap_or_default()
                    )));
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
    async fn grow_to(&self, node: &Picked, name: &str, size: u64) -> Result<api::Volume, Status> {
        let v = node
            .client
            .get_volume(name)
            .await
            .map_err(|e| from_client(&e))?;
        if v.size >= size {
            return Ok(v);
        }
        node.client
            .expand_volume(name, &api::ExpandVolume { size })
            .await
            .map_err(|e| from_client(&e))
    }

    /// The CSI volume for a daemon volume on `node`.
    pub(crate) fn csi_volume(
        &self,
        node: &str,
        v: &api::Volume,
        source: Option<VolumeContentSource>,
    ) -> Volume {
        // A replicated volume: usable from every node (a NodeStage on a
        // replica's node takes it over there, and on any other starts a
        // front end holding no replica: docs/csi.md), so it has no
        // accessible topology, which CSI reads as every node; and known by
        // the id it was made with wherever its front end moved.
        let at: Vec<&str> = match &v.replication {
            Some(_) => Vec::new(),
            None => vec![node],
        };
        let volume_context = v
            .labels
            .get_key_value(api::REPLICAS_WANTED_LABEL)
            .map(|(k, n)| [(k.clone(), n.clone())].into())
            .unwrap_or_default();
        Volume {
            capacity_bytes: v.size as i64,
            volume_id: v
                .labels
                .get(api::CSI_VOLUME_ID_LABEL)
                .cloned()
                .unwrap_or_else(|| volume_id(self.nodes.qualifier(node), v)),
            volume_context,
            content_source: source,
            accessible_topology: at.into_iter().map(topology_of).collect(),
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
        // A volume taken over by another node (docs/replicas.md) is found
        // there: its front end deletes it with every other replica.
        let Some((node, v)) = self.volume_by_id(&id).await? else {
            return Ok(DeleteVolumeResponse {});
        };
        if let Some(x) = &v.export {
            if x.connections > 0 {
                return Err(Status::failed_precondition(format!(
                    "volume {} is in use: {} NBD client(s) connected (unstage it first)",
                    shown(&req.volume_id),
                    x.connections
                )));
            }
            // A stale export, left by a node that is gone.
            node.client
                .detach_volume(&v.name, false)
                .await
                .map_err(|e| from_client(&e))?;
        }
        match node.client.delete_volume(&v.name, false).await {
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
        let mut all = vec![];
        for n in self.nodes.all() {
            let vols = n.client.list_volumes().await.map_err(|e| from_client(&e))?;
            for v in vols.into_iter().filter(|v| {
                // A replica, or a front end holding none: the volume's
                // id is its replicas' (docs/csi.md, "Replicas").
                !v.name.starts_with('.')
                    && !crate::ids::is_replica(v)
                    && !v.replication.as_ref().is_some_and(|r| r.diskless)
            }) {
                let entry = list_volumes_response::Entry {
                    volume: Some(self.csi_volume(&n.name, &v, None)),
                    status: Some(list_volumes_response::VolumeStatus {
                        published_node_ids: vec![],
                        volume_condition: Some(condition(&v)),
                    }),
                };
                all.push((n.name.clone(), v.id, entry));
            }
        }
        let (entries, next_token) = self.page_of(all, &req.starting_token, req.max_entries)?;
        Ok(ListVolumesResponse {
            entries,
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
        let not_found =
            || Status::not_found(format!("volume {} does not exist", shown(&req.volume_id)));
        let id = VolumeId::parse(&req.volume_id).ok_or_else(not_found)?;
        let (node, v) = self.volume_by_id(&id).await?.ok_or_else(not_found)?;
        Ok(ControllerGetVolumeResponse {
            volume: Some(self.csi_volume(&node.name, &v, None)),
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
        let not_found =
            || Status::not_found(format!("volume {} does not exist", shown(&req.volume_id)));
        let id = VolumeId::parse(&req.volume_id).ok_or_else(not_found)?;
        self.volume_by_id(&id).await?.ok_or_else(not_found)?;
        if let Err(why) = params(&req.parameters) {
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
        let mut available: u64 = 0;
        if fits_caps && params(&req.parameters).is_ok() {
            for n in self.nodes.all() {
                let counts = req
                    .accessible_topology
                    .as_ref()
                    .is_none_or(|t| fits(t, &topology_of(&n.name)));
                if !counts {
                    continue;
                }
                match n.client.health().await {
                    Ok(h) => available = available.saturating_add(h.capacity_bytes),
                    // A node that does not answer can take nothing now.
                    Err(lamina_client::Error::Unreachable { .. }) if self.nodes.qualified() => {}
                    Err(e) => return Err(from_client(&e)),
                }
            }
        }
        Ok(GetCapacityResponse {
            available_capacity: available.min(i64::MAX as u64) as i64,
            maximum_volume_size: Some(MAX_SIZE as i64),
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
        let not_found =
            || Status::not_found(format!("volume {} does not exist", shown(&req.volume_id)));
        let id = VolumeId::parse(&req.volume_id).ok_or_else(not_found)?;
        let _g = self.lock(&id.name).await;
        let (node, v) = self.volume_by_id(&id).await?.ok_or_else(not_found)?;
        // Always: a node whose loop device is over the daemon's file grows
        // it (`LOOP_SET_CAPACITY`) in NodeExpandVolume, block or filesystem.
        let node_expansion_required = true;
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
        // The export's file is no NBD client: a loop device over it grows
        // with it. An NBD client sees the size it connected with.
        if let Some(x) = v.export.as_ref().filter(|x| x.connections > 0) {
            return Err(Status::failed_precondition(format!(
                "volume {} is in use by {} NBD client(s), which see the size they connected with: it can grow while no NBD client uses it",
                shown(&req.volume_id),
                x.connections
            )));
        }
        let grown = node
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
                        "source snapshot {} does not exist",
                        shown(&s.snapshot_id)
                    ))
                })?
                .source(),
        ),
        Some(Source::Volume(v)) => Some(
            VolumeId::parse(&v.volume_id)
                .ok_or_else(|| {
                    Status::not_found(format!(
                        "source volume {} does not exist",
                        shown(&v.volume_id)
                    ))
                })?
                .name,
        ),
    })
}

/// The source node as the daemon's clone from another node names it.
fn peer(src: &Picked) -> Result<api::PeerNode, Status> {
    let address = src.transfer_address.clone().ok_or_else(|| {
        Status::failed_precondition(format!(
            "the snapshot is on node {:?}, which has no transfer address (key `{}` of its node Secret): it cannot be copied to another node",
            src.name,
            lamina_node_secrets::KEY_TRANSFER
        ))
    })?;
    Ok(api::PeerNode {
        name: src.name.clone(),
        address,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_size_is_the_engines() {
        assert_eq!(MAX_SIZE, lamina_engine::MAX_VOLUME_SIZE);
    }

    fn cap(access: volume_capability::AccessType) -> VolumeCapability {
        VolumeCapability {
            access_type: Some(access),
            access_mode: None,
        }
    }

    fn mount(fs: &str) -> VolumeCapability {
        cap(volume_capability::AccessType::Mount(
            volume_capability::MountVolume {
                fs_type: fs.into(),
                ..Default::default()
            },
        ))
    }

    #[test]
    fn only_xfs_has_a_floor() {
        assert_eq!(fs_floor(&[mount("xfs")]), Some((XFS_MIN_SIZE, "xfs")));
        assert_eq!(
            fs_floor(&[mount("ext4"), mount("xfs")]),
            Some((XFS_MIN_SIZE, "xfs"))
        );
        assert_eq!(fs_floor(&[mount("ext4")]), None);
        assert_eq!(fs_floor(&[mount("")]), None);
        let block = cap(volume_capability::AccessType::Block(Default::default()));
        assert_eq!(fs_floor(&[block]), None);
        assert_eq!(fs_floor(&[]), None);
    }
}
