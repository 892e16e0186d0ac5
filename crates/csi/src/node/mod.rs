//! The node service: makes a volume usable on this node. Staging attaches
//! the volume's NBD export as a block device, puts a filesystem on it when
//! it has none, and mounts it at the staging path; publishing bind-mounts
//! that (or exposes the device itself for block access). Everything done is
//! recorded under the state directory so that unstage and unpublish undo
//! exactly it, also after the plugin restarts (docs/csi-node.md).
//!
//! - attach.rs: the export as a block device (kernel NBD, or nbdfuse and a
//!   loop device), and back;
//! - fs.rs: probing, making, mounting and growing filesystems;
//! - stage.rs, publish.rs, stats.rs: the RPCs;
//! - freeze.rs: freezing mounted filesystems for the daemon's frozen
//!   snapshots, on a socket of its own;
//! - state.rs: the per-volume records; sys.rs: what the kernel shows;
//!   exec.rs: the system tools, under time limits.

mod attach;
mod exec;
pub(crate) mod freeze;
mod fs;
mod publish;
mod stage;
mod state;
mod stats;
mod sys;

use crate::ids::shown;
use crate::proto::node_server::Node;
use crate::proto::node_service_capability::{rpc, Rpc, Type};
use crate::proto::*;
use lamina_client::Client;
use state::{Access, Store};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::{Request, Response, Status};
use tracing::Instrument;

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
    #[error("the node record {path} is damaged: {reason}")]
    Record { path: String, reason: String },
    #[error("cannot run {cmd}: {source}")]
    Spawn { cmd: String, source: std::io::Error },
    #[error("{cmd} did not finish within {limit:?} (killed)")]
    Timeout { cmd: String, limit: Duration },
    #[error("{cmd} failed (exit code {code:?}): {stderr}")]
    Command {
        cmd: String,
        code: Option<i32>,
        stderr: String,
    },
    #[error("{0}")]
    Busy(String),
}

impl Error {
    pub(crate) fn io(op: &'static str, path: impl AsRef<Path>, source: std::io::Error) -> Error {
        Error::Io {
            op,
            path: path.as_ref().display().to_string(),
            source,
        }
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        match e {
            // Held by someone for now: the CO tries again.
            Error::Busy(_) => Status::unavailable(e.to_string()),
            _ => Status::internal(e.to_string()),
        }
    }
}

/// The RPCs this node service offers; exactly these work.
const CAPABILITIES: [rpc::Type; 4] = [
    rpc::Type::StageUnstageVolume,
    rpc::Type::GetVolumeStats,
    rpc::Type::ExpandVolume,
    rpc::Type::VolumeCondition,
];

pub struct NodeService {
    client: Client,
    cfg: Config,
    store: Store,
    locks: Locks,
    /// Held while a free /dev/nbdN is picked and connected.
    nbd_pick: tokio::sync::Mutex<()>,
    freezer: freeze::Freezer,
}

impl NodeService {
    /// The service on `cfg`'s records. What a plugin before it froze and
    /// left frozen (killed during a frozen snapshot) is thawed by
    /// [`freeze::Freezer::recover`], which the caller runs before serving.
    pub fn new(client: Client, cfg: Config) -> Result<NodeService, Error> {
        let store = Store::open(&cfg.state_dir)?;
        let freezer = freeze::Freezer::new(store.clone(), &cfg.state_dir)?;
        Ok(NodeService {
            client,
            cfg,
            store,
            locks: Locks::default(),
            nbd_pick: tokio::sync::Mutex::new(()),
            freezer,
        })
    }

    /// What serves the daemon's freezes of this node's mounts.
    pub(crate) fn freezer(&self) -> freeze::Freezer {
        self.freezer.clone()
    }
}

/// One lock per volume id: a CO's retries and concurrent calls for one
/// volume run one at a time; other volumes do not wait.
#[derive(Default)]
struct Locks {
    held: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

struct LockGuard<'a> {
    locks: &'a Locks,
    key: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Locks {
    async fn lock(&self, key: &str) -> LockGuard<'_> {
        let m = {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            held.entry(key.to_string()).or_default().clone()
        };
        LockGuard {
            locks: self,
            key: key.to_string(),
            guard: Some(m.lock_owned().await),
        }
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        self.guard.take();
        let mut held = self.locks.held.lock().unwrap_or_else(|p| p.into_inner());
        // Only the map holds it: nobody waits, so forget the key.
        if held
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            held.remove(&self.key);
        }
    }
}

/// The access a capability asks for, and its access mode's value. The
/// capability must have passed `check_capability`.
fn access_of(cap: &VolumeCapability) -> (Access, i32) {
    let mode = cap.access_mode.as_ref().map(|m| m.mode).unwrap_or(0);
    let access = match &cap.access_type {
        Some(volume_capability::AccessType::Mount(m)) => Access::Mount {
            fs_type: m.fs_type.clone(),
            mount_flags: m.mount_flags.clone(),
        },
        _ => Access::Block,
    };
    (access, mode)
}

fn not_found(volume_id: &str) -> Status {
    Status::not_found(format!("volume {} does not exist", shown(volume_id)))
}

/// A span for one RPC on one volume.
fn span(rpc: &'static str, volume_id: &str) -> tracing::Span {
    tracing::info_span!("node", rpc, volume_id = %shown(volume_id))
}

/// Log a failed RPC (the CO shows only the message; the log keeps it too).
fn logged<T>(r: Result<T, Status>) -> Result<Response<T>, Status> {
    match r {
        Ok(v) => Ok(Response::new(v)),
        Err(s) => {
            tracing::warn!(code = ?s.code(), message = %s.message(), "failed");
            Err(s)
        }
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        r: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let r = r.into_inner();
        let s = span("NodeStageVolume", &r.volume_id);
        async { logged(self.stage(r).await) }.instrument(s).await
    }

    async fn node_unstage_volume(
        &self,
        r: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let r = r.into_inner();
        let s = span("NodeUnstageVolume", &r.volume_id);
        async { logged(self.unstage(r).await) }.instrument(s).await
    }

    async fn node_publish_volume(
        &self,
        r: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let r = r.into_inner();
        let s = span("NodePublishVolume", &r.volume_id);
        async { logged(self.publish(r).await) }.instrument(s).await
    }

    async fn node_unpublish_volume(
        &self,
        r: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let r = r.into_inner();
        let s = span("NodeUnpublishVolume", &r.volume_id);
        async { logged(self.unpublish(r).await) }
            .instrument(s)
            .await
    }

    async fn node_get_volume_stats(
        &self,
        r: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let r = r.into_inner();
        let s = span("NodeGetVolumeStats", &r.volume_id);
        async { logged(self.stats(r).await) }.instrument(s).await
    }

    async fn node_expand_volume(
        &self,
        r: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let r = r.into_inner();
        let s = span("NodeExpandVolume", &r.volume_id);
        async { logged(self.expand(r).await) }.instrument(s).await
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: CAPABILITIES
                .iter()
                .map(|t| NodeServiceCapability {
                    r#type: Some(Type::Rpc(Rpc { r#type: *t as i32 })),
                })
                .collect(),
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
