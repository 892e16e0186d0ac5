//! NodeGetVolumeStats (bytes and inodes of a mounted filesystem, the size
//! of a block device, and the volume's condition) and NodeExpandVolume
//! (the filesystem grown to the device).
//!
//! Expansion is online where the volume is staged on the daemon's file: the
//! file's size is the volume's, so NodeExpandVolume tells the loop device
//! to take the file's new size (`LOOP_SET_CAPACITY`) and grows the
//! filesystem. Staged through an NBD client (a daemon that serves no
//! files), a volume sees its new size only when it connects again, so the
//! controller grows it while no node uses it and staging sees the new size;
//! NodeStageVolume grows the filesystem already, and NodeExpandVolume does
//! the same again and reports the device's size.

use super::state::{Access, Record};
use super::{access_of, fs, not_found, sys, NodeService};
use crate::controller::check_capability;
use crate::ids::VolumeId;
use crate::proto::volume_usage::Unit;
use crate::proto::*;
use crate::status::invalid;
use std::path::{Path, PathBuf};
use tonic::Status;

impl NodeService {
    /// The record of a volume that `path` belongs to (its staging path or a
    /// publish target), or NOT_FOUND.
    fn record_at(&self, volume_id: &str, path: &Path) -> Result<Record, Status> {
        VolumeId::parse(volume_id).ok_or_else(|| not_found(volume_id))?;
        let rec = self
            .store
            .load(volume_id)?
            .ok_or_else(|| not_found(volume_id))?;
        if !rec.owns_path(path) || !path.exists() {
            return Err(Status::not_found(format!(
                "volume {volume_id} is neither staged nor published at {}",
                path.display()
            )));
        }
        Ok(rec)
    }

    /// The volume's condition as seen at `path`.
    fn condition(&self, rec: &Record, path: &Path) -> VolumeCondition {
        let mut problem = self.staged_ok(rec).err();
        if problem.is_none() && matches!(rec.access, Access::Mount { .. }) {
            problem = self.mounted_from_device(rec, path).err();
        }
        match problem {
            None => VolumeCondition {
                abnormal: false,
                message: "attached and mounted".into(),
            },
            Some(m) => VolumeCondition {
                abnormal: true,
                message: m,
            },
        }
    }

    pub(super) async fn stats(
        &self,
        req: NodeGetVolumeStatsRequest,
    ) -> Result<NodeGetVolumeStatsResponse, Status> {
        if req.volume_id.is_empty() {
            return invalid!("volume_id is required");
        }
        if req.volume_path.is_empty() {
            return invalid!("volume_path is required");
        }
        let path = PathBuf::from(&req.volume_path);
        let _g = self.locks.lock(&req.volume_id).await;
        let rec = self.record_at(&req.volume_id, &path)?;
        let condition = self.condition(&rec, &path);
        let mut usage = Vec::new();
        match rec.access {
            Access::Mount { .. } if !condition.abnormal => {
                let u = sys::statvfs(&path)?;
                usage.push(VolumeUsage {
                    available: u.bytes_available as i64,
                    total: u.bytes_total as i64,
                    used: u.bytes_used as i64,
                    unit: Unit::Bytes as i32,
                });
                usage.push(VolumeUsage {
                    available: u.inodes_available as i64,
                    total: u.inodes_total as i64,
                    used: u.inodes_used as i64,
                    unit: Unit::Inodes as i32,
                });
            }
            // Numbers of whatever is below a missing mount would mislead.
            Access::Mount { .. } => {}
            Access::Block => {
                if let Some(dev) = rec.device_path() {
                    if let Ok(size) = sys::rdev(dev).and_then(sys::device_size) {
                        usage.push(VolumeUsage {
                            available: 0,
                            total: size as i64,
                            used: 0,
                            unit: Unit::Bytes as i32,
                        });
                    }
                }
            }
        }
        Ok(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(condition),
        })
    }

    pub(super) async fn expand(
        &self,
        req: NodeExpandVolumeRequest,
    ) -> Result<NodeExpandVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return invalid!("volume_id is required");
        }
        if req.volume_path.is_empty() {
            return invalid!("volume_path is required");
        }
        let (required, limit) = match &req.capacity_range {
            Some(r) if r.required_bytes < 0 || r.limit_bytes < 0 => {
                return invalid!("capacity_range must not be negative")
            }
            Some(r) => (r.required_bytes as u64, r.limit_bytes as u64),
            None => (0, 0),
        };
        let path = PathBuf::from(&req.volume_path);
        let _g = self.locks.lock(&req.volume_id).await;
        let rec = self.record_at(&req.volume_id, &path)?;
        if let Some(cap) = &req.volume_capability {
            check_capability(cap).map_err(Status::invalid_argument)?;
            let block = matches!(access_of(cap).0, Access::Block);
            if block != matches!(rec.access, Access::Block) {
                return invalid!(
                    "volume_capability's access type is not the one volume {} was staged with",
                    req.volume_id
                );
            }
        }
        if let Err(why) = self.staged_ok(&rec) {
            return Err(Status::failed_precondition(format!(
                "volume {} is not usable on this node: {why}",
                req.volume_id
            )));
        }
        let dev = rec
            .device_path()
            .ok_or_else(|| Status::internal("a staged volume has no device in its record"))?;
        let mut size = sys::device_size(sys::rdev(dev)?)?;
        if let Some(super::state::Device::File { file, .. }) = &rec.device {
            // The stat asks the daemon for the file's size (never cached).
            let m = std::fs::metadata(file).map_err(|e| super::Error::io("stat", file, e))?;
            if m.len() > size {
                let d = dev.to_string_lossy();
                super::exec::run("losetup", &["--set-capacity", &d], super::exec::QUICK).await?;
                size = sys::device_size(sys::rdev(dev)?)?;
            }
        }
        if required > size {
            return Err(Status::failed_precondition(format!(
                "this node sees {size} bytes of volume {}, not the {required} asked for: a volume \
                 staged through an NBD client grows offline (unstage, expand, stage again)",
                req.volume_id
            )));
        }
        if limit > 0 && size > limit {
            return Err(Status::out_of_range(format!(
                "the device has {size} bytes, more than limit_bytes {limit}"
            )));
        }
        if let (Access::Mount { .. }, Some(fs)) = (&rec.access, rec.fs.as_deref()) {
            if !super::stage::read_only_mode(rec.mode) {
                fs::grow(fs, dev, &rec.staging_path).await?;
            }
        }
        Ok(NodeExpandVolumeResponse {
            capacity_bytes: size as i64,
        })
    }
}
