//! The group controller: snapshots of several volumes taken at one
//! instant, in one engine transaction (the daemon's snapshot groups), so a
//! group is crash-consistent across its volumes without freezing anything.
//!
//! A CSI group snapshot id is the Lamina group's name (the group name the
//! CO gave, mapped as any name is); each member is a snapshot of that name
//! in its volume, carrying the label `lamina.io/group`. When ids carry the
//! node, so does a group's (`NODE:GROUP`), and its volumes must all be on
//! that one node (one engine transaction).

use crate::controller::{csi_snapshot, timestamp, ControllerService};
use crate::ids::{lamina_name, shown, GroupId, SnapshotId, VolumeId};
use crate::nodes::Picked;
use crate::proto::group_controller_server::GroupController;
use crate::proto::group_controller_service_capability::{rpc, Rpc, Type};
use crate::proto::*;
use crate::status::{from_client, invalid};
use lamina_api as api;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct GroupService {
    c: Arc<ControllerService>,
}

impl GroupService {
    pub fn new(c: Arc<ControllerService>) -> GroupService {
        GroupService { c }
    }

    fn csi_group(&self, node: &str, g: &api::SnapshotGroup) -> VolumeGroupSnapshot {
        let q = self.c.nodes.qualifier(node);
        VolumeGroupSnapshot {
            group_snapshot_id: GroupId {
                node: q.clone(),
                name: g.name.clone(),
            }
            .to_string(),
            snapshots: g
                .snapshots
                .iter()
                .map(|s| csi_snapshot(q.clone(), s))
                .collect(),
            creation_time: timestamp(&g.created),
            ready_to_use: true,
        }
    }

    /// The group `id` names, as the node it names answers: found there,
    /// gone, or that node silent (it does not answer, or no node Secret
    /// names it any more), and why.
    async fn named_group(&self, id: &GroupId) -> Result<Named, Status> {
        let node = match self.c.node(id.node.as_deref()) {
            Ok(n) => n,
            Err(unknown) => return Ok(Named::Silent(unknown)),
        };
        match node.client.get_snapshot_group(&id.name).await {
            Ok(g) => Ok(Named::Found(node, g)),
            Err(e) if e.is_not_found() => Ok(Named::Gone),
            Err(e @ lamina_client::Error::Unreachable { .. }) => Ok(Named::Silent(from_client(&e))),
            Err(e) => Err(from_client(&e)),
        }
    }

    /// The members of group `id` by the snapshot ids CSI gives with it,
    /// for when its node is silent (`why`): each must be a snapshot of the
    /// group's name (a mismatch is INVALID_ARGUMENT); none given, the
    /// silent node's error.
    fn members(
        &self,
        id: &GroupId,
        given: &[String],
        why: &Status,
    ) -> Result<Vec<SnapshotId>, Status> {
        if given.is_empty() {
            return Err(why.clone());
        }
        given
            .iter()
            .map(|s| {
                SnapshotId::parse(s)
                    .filter(|sid| sid.name == id.name)
                    .ok_or_else(|| {
                        Status::invalid_argument(format!(
                            "snapshot {} is not a member of group snapshot {}",
                            shown(s),
                            shown(&id.to_string())
                        ))
                    })
            })
            .collect()
    }
}

/// How the node a group id names answers for it.
// One per call, gone at its end: boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
enum Named {
    Found(Picked, api::SnapshotGroup),
    Gone,
    Silent(Status),
}

/// The CSI volume ids of a group's members, sorted.
fn member_volumes(node: Option<String>, g: &api::SnapshotGroup) -> Vec<String> {
    let mut v: Vec<String> = g
        .snapshots
        .iter()
        .map(|s| {
            VolumeId {
                node: node.clone(),
                name: s.volume.clone(),
                id: s.volume_id,
            }
            .to_string()
        })
        .collect();
    v.sort();
    v
}

#[tonic::async_trait]
impl GroupController for GroupService {
    async fn group_controller_get_capabilities(
        &self,
        _: Request<GroupControllerGetCapabilitiesRequest>,
    ) -> Result<Response<GroupControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(GroupControllerGetCapabilitiesResponse {
            capabilities: vec![GroupControllerServiceCapability {
                r#type: Some(Type::Rpc(Rpc {
                    r#type: rpc::Type::CreateDeleteGetVolumeGroupSnapshot as i32,
                })),
            }],
        }))
    }

    async fn create_volume_group_snapshot(
        &self,
        r: Request<CreateVolumeGroupSnapshotRequest>,
    ) -> Result<Response<CreateVolumeGroupSnapshotResponse>, Status> {
        let req = r.into_inner();
        if req.name.is_empty() {
            return invalid!("name is required");
        }
        if req.source_volume_ids.is_empty() {
            return invalid!("source_volume_ids is required");
        }
        let freeze = crate::controller::snapshots::freeze_parameter(
            &req.parameters,
            "group snapshot",
            &["deletionPolicy"],
        )?;
        let name = lamina_name(&req.name);
        let _g = self.c.lock(&format!("snapshot/{name}")).await;
        let mut vids = vec![];
        for id in &req.source_volume_ids {
            let not_found =
                || Status::not_found(format!("source volume {} does not exist", shown(id)));
            vids.push(VolumeId::parse(id).ok_or_else(not_found)?);
        }
        let node = self.c.node(vids[0].node.as_deref())?;
        for v in &vids[1..] {
            if self.c.node(v.node.as_deref())?.name != node.name {
                return invalid!(
                    "a group snapshot's volumes must be on one node: {} and {v} are not",
                    vids[0]
                );
            }
        }
        let q = self.c.nodes.qualifier(&node.name);
        // The ids as this driver writes them (an id without a node names
        // the default node).
        let mut asked: Vec<String> = vids
            .iter()
            .map(|v| {
                VolumeId {
                    node: q.clone(),
                    ..v.clone()
                }
                .to_string()
            })
            .collect();
        asked.sort();
        let gid = GroupId {
            node: q.clone(),
            name: name.clone(),
        };
        let existing = match self.named_group(&gid).await? {
            Named::Found(_, g) => Some(g),
            Named::Gone => None,
            Named::Silent(why) => return Err(why),
        };
        if let Some(g) = existing {
            if member_volumes(q.clone(), &g) == asked {
                return Ok(Response::new(CreateVolumeGroupSnapshotResponse {
                    group_snapshot: Some(self.csi_group(&node.name, &g)),
                }));
            }
            return Err(Status::already_exists(format!(
                "group snapshot {} exists already, of volumes {:?}",
                shown(&req.name),
                member_volumes(q, &g)
            )));
        }
        let mut volumes = vec![];
        for (id, vid) in req.source_volume_ids.iter().zip(&vids) {
            let not_found =
                || Status::not_found(format!("source volume {} does not exist", shown(id)));
            let (on, v) = self.c.volume_by_id(vid).await?.ok_or_else(not_found)?;
            if on.name != node.name {
                return Err(Status::failed_precondition(format!(
                    "source volume {} is served by node {} now (taken over), not by node {}: a group snapshot's volumes are served by one node",
                    shown(id),
                    on.name,
                    node.name
                )));
            }
            volumes.push(v.name);
        }
        let mut labels = std::collections::BTreeMap::new();
        if name != req.name && req.name.len() <= 1024 {
            labels.insert(
                crate::controller::CSI_NAME_LABEL.to_string(),
                req.name.clone(),
            );
        }
        let made = node
            .client
            .create_snapshot_group(&api::CreateSnapshotGroup {
                name,
                volumes,
                labels,
                freeze,
            })
            .await
            .map_err(|e| from_client(&e))?;
        Ok(Response::new(CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(self.csi_group(&node.name, &made.value)),
        }))
    }

    async fn delete_volume_group_snapshot(
        &self,
        r: Request<DeleteVolumeGroupSnapshotRequest>,
    ) -> Result<Response<DeleteVolumeGroupSnapshotResponse>, Status> {
        let req = r.into_inner();
        if req.group_snapshot_id.is_empty() {
            return invalid!("group_snapshot_id is required");
        }
        let Some(id) = GroupId::parse(&req.group_snapshot_id) else {
            return Ok(Response::new(DeleteVolumeGroupSnapshotResponse {}));
        };
        let _g = self.c.lock(&format!("snapshot/{}", id.name)).await;
        let done = || Ok(Response::new(DeleteVolumeGroupSnapshotResponse {}));
        let (node, g) = match self.named_group(&id).await? {
            Named::Found(node, g) => (node, g),
            Named::Gone => return done(),
            Named::Silent(why) => {
                // Member by member, by the ids CSI gives, each where its
                // volume is served now (a copy on a node that took it
                // over); a member whose volume is the silent node's own
                // stays UNAVAILABLE, and a retry finds the members left.
                for sid in self.members(&id, &req.snapshot_ids, &why)? {
                    self.c
                        .delete_snapshot_locked(&sid, &sid.to_string())
                        .await?;
                }
                return done();
            }
        };
        // A member whose volume was taken over by another node since (a
        // replica here now, labelled with its front end's node) is deleted
        // through that front end, which deletes every replica's copy; this
        // node refuses to delete a replica's snapshot itself.
        let mut fronts: Vec<(String, String)> = Vec::new();
        for s in &g.snapshots {
            if let Ok(v) = node.client.get_volume(&s.volume).await {
                if let (true, Some(front)) =
                    (v.id == s.volume_id, v.labels.get(api::REPLICA_OF_LABEL))
                {
                    fronts.push((s.volume.clone(), front.clone()));
                }
            }
        }
        if fronts.is_empty() {
            // One engine transaction, as the group was taken.
            return match node.client.delete_snapshot_group(&id.name).await {
                Ok(_) => done(),
                Err(e) if e.is_not_found() => done(),
                Err(e) => Err(from_client(&e)),
            };
        }
        // Member by member, each on the node serving its volume; a retry
        // finds the members left.
        for s in &g.snapshots {
            let at = match fronts.iter().find(|(v, _)| *v == s.volume) {
                Some((_, front)) => self.c.node(Some(front))?,
                None => node.clone(),
            };
            match at.client.delete_snapshot(&s.volume, &id.name).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(from_client(&e)),
            }
        }
        done()
    }

    async fn get_volume_group_snapshot(
        &self,
        r: Request<GetVolumeGroupSnapshotRequest>,
    ) -> Result<Response<GetVolumeGroupSnapshotResponse>, Status> {
        let req = r.into_inner();
        if req.group_snapshot_id.is_empty() {
            return invalid!("group_snapshot_id is required");
        }
        let not_found = || {
            Status::not_found(format!(
                "group snapshot {} does not exist",
                shown(&req.group_snapshot_id)
            ))
        };
        let id = GroupId::parse(&req.group_snapshot_id).ok_or_else(not_found)?;
        let (node, g) = match self.named_group(&id).await? {
            Named::Found(node, g) => (node, g),
            Named::Gone => return Err(not_found()),
            Named::Silent(why) => {
                // Answered from its members, by the ids CSI gives, each
                // where its volume is served now.
                let mut snapshots = Vec::new();
                for sid in self.members(&id, &req.snapshot_ids, &why)? {
                    let found = self.c.snapshot_by_id(&sid).await?.ok_or_else(|| {
                        Status::not_found(format!(
                            "group snapshot {}: its member {} does not exist",
                            shown(&req.group_snapshot_id),
                            shown(&sid.to_string())
                        ))
                    })?;
                    snapshots.push(found.csi(&self.c.nodes));
                }
                let creation_time = snapshots.iter().find_map(|s| s.creation_time);
                return Ok(Response::new(GetVolumeGroupSnapshotResponse {
                    group_snapshot: Some(VolumeGroupSnapshot {
                        group_snapshot_id: req.group_snapshot_id.clone(),
                        snapshots,
                        creation_time,
                        ready_to_use: true,
                    }),
                }));
            }
        };
        Ok(Response::new(GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(self.csi_group(&node.name, &g)),
        }))
    }
}
