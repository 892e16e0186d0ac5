//! The controller service: volumes, snapshots, clones and restores, each
//! RPC a thin layer over the daemon's typed client. What CSI demands beyond
//! the daemon's own rules (ids, idempotency by name, its error codes, page
//! tokens) is decided here; docs/csi.md lists it.

pub(crate) mod snapshots;
mod volumes;

pub(crate) use snapshots::{csi_snapshot, CSI_NAME_LABEL};

use crate::ids::{diskless_front_of, names, shown, SnapshotId, VolumeId};
use crate::nodes::{NodeSet, Picked};
use crate::proto::controller_server::Controller;
use crate::proto::controller_service_capability::{rpc, Rpc, Type};
use crate::proto::*;
use crate::status::from_client;
use lamina_api as api;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tonic::{Request, Response, Status};

/// A snapshot a CSI id names, where it is held now.
pub(crate) struct FoundSnapshot {
    pub node: Picked,
    pub snapshot: api::Snapshot,
    /// For a snapshot of a volume taken over since: the ids CSI knows it
    /// and its volume by (the snapshot's as asked; the volume's as made),
    /// which the answers keep.
    pub asked: Option<(String, Option<String>)>,
}

impl FoundSnapshot {
    /// The snapshot as CSI sees it.
    pub(crate) fn csi(&self, nodes: &NodeSet) -> Snapshot {
        let mut out = csi_snapshot(nodes.qualifier(&self.node.name), &self.snapshot);
        if let Some((id, volume)) = &self.asked {
            out.snapshot_id = id.clone();
            if let Some(v) = volume {
                out.source_volume_id = v.clone();
            }
        }
        out
    }
}

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
    /// The nodes whose daemons this controller drives.
    pub(crate) nodes: Arc<NodeSet>,
    /// One lock per Lamina name being created or deleted, so that a CO's
    /// retries and concurrent calls for one name run one at a time.
    names: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl ControllerService {
    pub fn new(nodes: Arc<NodeSet>) -> ControllerService {
        ControllerService {
            nodes,
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

    /// The node a CSI id names (its own, or the default), or UNAVAILABLE.
    pub(crate) fn node(&self, node: Option<&str>) -> Result<Picked, Status> {
        self.nodes.get(node)
    }

    /// One page of `items` (node, pool id, entry) for a list request.
    pub(crate) fn page_of<T>(
        &self,
        items: Vec<(String, u64, T)>,
        token: &str,
        max_entries: i32,
    ) -> Result<(Vec<T>, String), Status> {
        page(items, token, max_entries, self.nodes.qualified())
    }

    /// The volume a CSI id names, if it still exists, and the node whose
    /// daemon serves it now: the node the id names, holding a volume of its
    /// own of that name and pool id; or, for a replicated volume taken over
    /// since (docs/csi.md, "Replicas"), the node whose volume of
    /// that name carries the id in its label. The named node's volume, a
    /// replica now, names that node; when it does not (the named node does
    /// not answer, or lost its volume), every other node is asked. A taken
    /// over volume whose front end cannot be found is UNAVAILABLE, as is a
    /// named node that does not answer (or that no Secret names any more),
    /// when no other node has the volume.
    pub(crate) async fn volume_by_id(
        &self,
        vid: &VolumeId,
    ) -> Result<Option<(Picked, api::Volume)>, Status> {
        let named = match self.node(vid.node.as_deref()) {
            Ok(n) => n,
            // A node no Secret names any more (its pod gone, and its
            // Secret with it): a volume taken over since is served by
            // another node, which has it labelled with the id.
            Err(unknown) => {
                for n in self.nodes.all() {
                    if let Ok(v) = n.client.get_volume(&vid.name).await {
                        if names(vid, &v, false) || diskless_front_of(vid, &v) {
                            return Ok(Some((n, v)));
                        }
                    }
                }
                return Err(unknown);
            }
        };
        let (replica_of, failed) = match named.client.get_volume(&vid.name).await {
            Ok(v) if names(vid, &v, true) => return Ok(Some((named, v))),
            Ok(v) if v.id == vid.id => (v.labels.get(api::REPLICA_OF_LABEL).cloned(), None),
            Ok(_) => (None, None),
            Err(e) if e.is_not_found() => (None, None),
            Err(e) => (None, Some(e)),
        };
        if let Some(front) = &replica_of {
            if let Ok(f) = self.node(Some(front)) {
                if let Ok(v) = f.client.get_volume(&vid.name).await {
                    if names(vid, &v, false) || diskless_front_of(vid, &v) {
                        return Ok(Some((f, v)));
                    }
                }
            }
        }
        if self.nodes.all().len() > 1 {
            for n in self.nodes.all() {
                if n.name == named.name || Some(&n.name) == replica_of.as_ref() {
                    continue;
                }
                if let Ok(v) = n.client.get_volume(&vid.name).await {
                    if names(vid, &v, false) || diskless_front_of(vid, &v) {
                        return Ok(Some((n, v)));
                    }
                }
            }
        }
        match (replica_of, failed) {
            (Some(front), _) => Err(Status::unavailable(format!(
                "volume {vid} on node {} was taken over by node {front}, which does not answer for it",
                named.name
            ))),
            (None, Some(e)) => Err(from_client(&e)),
            (None, None) => Ok(None),
        }
    }

    /// The snapshot a CSI id names, if it still exists, and the node whose
    /// daemon holds it as a snapshot of its own volume: the named node's,
    /// unless that volume was taken over by another node since (it is a
    /// replica now, label `lamina.io/replica-of`): then the new front end's
    /// snapshot of that name, which every replica took at the same point
    /// (absent there: deleted through it). When the named node does not
    /// answer, or no Secret names it any more, the copy on a node that took
    /// the volume over ([`Self::taken_over_copy`]); UNAVAILABLE when there
    /// is none, or when the front end the named node's replica names does
    /// not answer.
    pub(crate) async fn snapshot_by_id(
        &self,
        sid: &SnapshotId,
    ) -> Result<Option<FoundSnapshot>, Status> {
        let filter = api::SnapshotFilter {
            name: Some(sid.name.clone()),
            id: Some(sid.id),
            ..Default::default()
        };
        let named = match self.node(sid.node.as_deref()) {
            Ok(n) => n,
            Err(unknown) => {
                return self
                    .taken_over_copy(sid, None)
                    .await?
                    .ok_or(unknown)
                    .map(Some)
            }
        };
        let found = match named.client.find_snapshots(&filter).await {
            Ok(all) => all
                .into_iter()
                .find(|s| s.volume == sid.volume && !s.system),
            Err(e) => {
                return self
                    .taken_over_copy(sid, Some(&named.name))
                    .await?
                    .ok_or_else(|| from_client(&e))
                    .map(Some)
            }
        };
        let Some(s) = found else { return Ok(None) };
        let front = match named.client.get_volume(&s.volume).await {
            Ok(v) if v.id == s.volume_id && !s.volume_deleted => {
                v.labels.get(api::REPLICA_OF_LABEL).cloned()
            }
            _ => None,
        };
        let Some(front) = front else {
            return Ok(Some(FoundSnapshot {
                node: named,
                snapshot: s,
                asked: None,
            }));
        };
        let f = self.node(Some(&front))?;
        let v = f.client.get_volume(&s.volume).await.map_err(|e| {
            Status::unavailable(format!(
                "snapshot {sid}'s volume was taken over by node {front}, which does not answer for it: {e}"
            ))
        })?;
        if crate::ids::is_replica(&v) {
            return Err(Status::unavailable(format!(
                "snapshot {sid}'s volume was taken over by node {front}, whose volume of that name is another node's replica"
            )));
        }
        let there = f
            .client
            .list_snapshots(&v.name)
            .await
            .map_err(|e| from_client(&e))?
            .into_iter()
            .find(|x| x.name == s.name && x.volume_id == v.id && !x.system);
        Ok(there.map(|snapshot| FoundSnapshot {
            node: f,
            snapshot,
            asked: Some((
                sid.to_string(),
                v.labels.get(api::CSI_VOLUME_ID_LABEL).cloned(),
            )),
        }))
    }
}

impl ControllerService {
    /// The snapshot a CSI id names, when the node it names does not answer
    /// (or no Secret names it any more): its copy on the node that took
    /// its volume over since, if one did. That node's volume of that name
    /// is its own (not a replica) and carries the CSI volume id label a
    /// takeover gives it (a volume never taken over is served by the
    /// node its snapshots' ids name); the copy is its user snapshot of the
    /// id's name (CSI snapshot names are unique in the cluster). None when
    /// no other node has such a copy.
    async fn taken_over_copy(
        &self,
        sid: &SnapshotId,
        named: Option<&str>,
    ) -> Result<Option<FoundSnapshot>, Status> {
        for n in self.nodes.all() {
            if Some(n.name.as_str()) == named {
                continue;
            }
            let Ok(v) = n.client.get_volume(&sid.volume).await else {
                continue;
            };
            let Some(volume_id) = v.labels.get(api::CSI_VOLUME_ID_LABEL).cloned() else {
                continue;
            };
            if crate::ids::is_replica(&v) {
                continue;
            }
            let Ok(all) = n.client.list_snapshots(&v.name).await else {
                continue;
            };
            if let Some(snapshot) = all
                .into_iter()
                .find(|x| x.name == sid.name && x.volume_id == v.id && !x.system)
            {
                return Ok(Some(FoundSnapshot {
                    node: n,
                    snapshot,
                    asked: Some((sid.to_string(), Some(volume_id))),
                }));
            }
        }
        Ok(None)
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

/// A CSI volume id for a daemon volume (`node`: the node it names, if ids
/// carry one).
pub(crate) fn volume_id(node: Option<String>, v: &api::Volume) -> String {
    VolumeId {
        node,
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
                "filesystem {} is not supported (ext4 or xfs)",
                shown(other)
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

/// One page of entries listed over the nodes: `items` are (node, pool id,
/// entry), ordered by node then id. A page token is the last entry's place:
/// `NODE:ID` when ids carry the node, else `ID`.
pub(crate) fn page<T>(
    mut items: Vec<(String, u64, T)>,
    token: &str,
    max_entries: i32,
    qualified: bool,
) -> Result<(Vec<T>, String), Status> {
    if max_entries < 0 {
        return Err(Status::invalid_argument("max_entries must not be negative"));
    }
    let bad = || {
        Status::aborted(format!(
            "starting_token {} is not one this driver gave",
            shown(token)
        ))
    };
    let after: Option<(String, u64)> = match (token, qualified) {
        ("", _) => None,
        (t, true) => {
            let (n, id) = t.rsplit_once(':').ok_or_else(bad)?;
            Some((n.to_string(), id.parse().map_err(|_| bad())?))
        }
        (t, false) => Some((String::new(), t.parse().map_err(|_| bad())?)),
    };
    if !qualified {
        items.iter_mut().for_each(|i| i.0.clear());
    }
    items.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    if let Some((n, id)) = &after {
        items.retain(|i| (&i.0, i.1) > (n, *id));
    }
    let max = if max_entries == 0 {
        usize::MAX
    } else {
        max_entries as usize
    };
    let next = if items.len() > max {
        let (n, id, _) = &items[max - 1];
        if qualified {
            format!("{n}:{id}")
        } else {
            id.to_string()
        }
    } else {
        String::new()
    };
    items.truncate(max);
    Ok((items.into_iter().map(|i| i.2).collect(), next))
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

#[cfg(test)]
mod tests {
    use super::page;

    #[test]
    fn pages_over_nodes_follow_node_then_id() {
        let items = || {
            vec![
                ("b".to_string(), 1, "b1"),
                ("a".to_string(), 5, "a5"),
                ("a".to_string(), 2, "a2"),
            ]
        };
        let (p, t) = page(items(), "", 2, true).unwrap();
        assert_eq!((p, t.as_str()), (vec!["a2", "a5"], "a:5"));
        let (p, t) = page(items(), "a:5", 2, true).unwrap();
        assert_eq!((p, t.as_str()), (vec!["b1"], ""));
        let (p, t) = page(items(), "", 1, false).unwrap();
        assert_eq!((p, t.as_str()), (vec!["b1"], "1"));
        assert!(page(items(), "x", 1, true).is_err());
        assert!(page(items(), "a:x", 1, true).is_err());
        assert!(page(items(), "", -1, true).is_err());
    }
}
