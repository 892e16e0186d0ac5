//! The node service: makes a volume usable on this node. Staging attaches
//! the volume's NBD export as a block device, puts a filesystem on it when
//! it has none, and mounts it at the staging path; publishing bind-mounts
//! that (or exposes the device itself for block access). Everything done is
//! recorded under the state directory so that unstage and unpublish undo
//! exactly it, also after the plugin restarts.

use crate::proto::node_server::Node;
use crate::proto::*;
use lamina_client::Client;
use std::path::PathBuf;
use tonic::{Request, Response, Status};

/// What the node service needs to know about its node.
#[derive(Clone, Debug)]
pub struct Config {
    /// The node's name (the Kubernetes node name).
    pub node_id: String,
    /// Where the node's records of staged and published volumes live.
    pub state_dir: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        source: std::io::Error,
    },
}

pub struct NodeService {
    #[allow(dead_code)]
    client: Client,
    cfg: Config,
}

impl NodeService {
    pub fn new(client: Client, cfg: Config) -> Result<NodeService, Error> {
        std::fs::create_dir_all(&cfg.state_dir).map_err(|source| Error::Io {
            op: "create",
            path: cfg.state_dir.display().to_string(),
            source,
        })?;
        Ok(NodeService { client, cfg })
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        _: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        Err(Status::unimplemented("node staging is being written"))
    }

    async fn node_unstage_volume(
        &self,
        _: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        Err(Status::unimplemented("node staging is being written"))
    }

    async fn node_publish_volume(
        &self,
        _: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        Err(Status::unimplemented("node publishing is being written"))
    }

    async fn node_unpublish_volume(
        &self,
        _: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        Err(Status::unimplemented("node publishing is being written"))
    }

    async fn node_get_volume_stats(
        &self,
        _: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        Err(Status::unimplemented("volume stats are being written"))
    }

    async fn node_expand_volume(
        &self,
        _: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        Err(Status::unimplemented("node expansion is being written"))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.cfg.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: Some(Topology {
                segments: [(crate::TOPOLOGY_KEY.to_string(), self.cfg.node_id.clone())].into(),
            }),
        }))
    }
}
