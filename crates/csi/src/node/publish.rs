//! NodePublishVolume and NodeUnpublishVolume: a bind mount of the staged
//! filesystem on the target directory, or of the device node on a target
//! file for block access; read-only when asked. Unpublish unmounts and
//! removes what publish created.

use super::stage::read_only_mode;
use super::state::{Access, Publish, Record};
use super::{access_of, exec, fs, not_found, sys, Error, NodeService};
use crate::controller::check_capability;
use crate::ids::{shown, VolumeId};
use crate::proto::*;
use crate::status::invalid;
use std::path::{Path, PathBuf};
use tonic::Status;

fn kind(a: &Access) -> &'static str {
    match a {
        Access::Block => "block",
        Access::Mount { .. } => "mount",
    }
}

impl NodeService {
    /// Whether a publish is in place: the target mounted from the volume's
    /// device, read-only exactly when it should be.
    fn published_ok(&self, rec: &Record, p: &Publish) -> Result<(), String> {
        match rec.access {
            Access::Mount { .. } => self.mounted_from_device(rec, &p.target)?,
            Access::Block => {
                let dev = rec.device_path().ok_or("no device was made")?;
                let want = sys::rdev(dev).map_err(|e| e.to_string())?;
                if sys::mount_at(&p.target)
                    .map_err(|e| e.to_string())?
                    .is_none()
                    || sys::rdev(&p.target).ok() != Some(want)
                {
                    return Err(format!(
                        "{} is not a bind mount of {}",
                        p.target.display(),
                        dev.display()
                    ));
                }
            }
        }
        let m = sys::mount_at(&p.target).map_err(|e| e.to_string())?;
        if m.is_some_and(|m| m.read_only() != p.read_only) {
            return Err(format!(
                "{} is not mounted {}",
                p.target.display(),
                if p.read_only {
                    "read-only"
                } else {
                    "read-write"
                }
            ));
        }
        Ok(())
    }

    pub(super) async fn publish(
        &self,
        req: NodePublishVolumeRequest,
    ) -> Result<NodePublishVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return invalid!("volume_id is required");
        }
        if req.target_path.is_empty() {
            return invalid!("target_path is required");
        }
        let Some(cap) = req.volume_capability.as_ref() else {
            return invalid!("volume_capability is required");
        };
        check_capability(cap).map_err(Status::invalid_argument)?;
        if req.staging_target_path.is_empty() {
            return invalid!("staging_target_path is required: this driver stages volumes");
        }
        VolumeId::parse(&req.volume_id).ok_or_else(|| not_found(&req.volume_id))?;
        let (access, mode) = access_of(cap);
        let target = PathBuf::from(&req.target_path);
        let staging = PathBuf::from(&req.staging_target_path);
        let _g = self.locks.lock(&req.volume_id).await;

        let Some(mut rec) = self.store.load(&req.volume_id)? else {
            return Err(Status::failed_precondition(format!(
                "volume {} is not staged on this node",
                req.volume_id
            )));
        };
        if !rec.staged || !super::state::same_path(&rec.staging_path, &staging) {
            return Err(Status::failed_precondition(format!(
                "volume {} is not staged at {}",
                req.volume_id,
                staging.display()
            )));
        }
        if kind(&rec.access) != kind(&access) {
            return invalid!(
                "volume {} was staged for {} access, and {} access is asked for",
                req.volume_id,
                kind(&rec.access),
                kind(&access)
            );
        }
        if let Err(why) = self.staged_ok(&rec) {
            return Err(Status::failed_precondition(format!(
                "volume {} is staged but not usable ({why}): unstage and stage it again",
                req.volume_id
            )));
        }
        let want = Publish {
            target: target.clone(),
            read_only: req.readonly || read_only_mode(mode),
            mode,
            mount_flags: match &access {
                Access::Mount { mount_flags, .. } => mount_flags.clone(),
                Access::Block => vec![],
            },
        };
        match rec.publish(&target) {
            Some(had) => {
                let same = had.read_only == want.read_only
                    && had.mode == want.mode
                    && had.mount_flags == want.mount_flags;
                if !same {
                    return Err(Status::already_exists(format!(
                        "volume {} is published at {} with another capability or read-only flag",
                        req.volume_id,
                        target.display()
                    )));
                }
                if self.published_ok(&rec, had).is_ok() {
                    return Ok(NodePublishVolumeResponse {});
                }
            }
            None => {
                use volume_capability::access_mode::Mode;
                if mode == Mode::SingleNodeSingleWriter as i32 {
                    for p in &rec.publishes {
                        if self.published_ok(&rec, p).is_ok() {
                            return Err(Status::failed_precondition(format!(
                                "volume {} has a single writer and is published at {} already",
                                req.volume_id,
                                p.target.display()
                            )));
                        }
                    }
                }
                rec.publishes.push(want.clone());
                self.store.save(&rec)?;
            }
        }
        let dev = rec
            .device_path()
            .map(Path::to_path_buf)
            .ok_or_else(|| Status::internal("a staged volume has no device in its record"))?;
        match &rec.access {
            Access::Mount { .. } => {
                std::fs::create_dir_all(&target).map_err(|e| Error::io("create", &target, e))?;
                self.bind(&rec, &staging, &want).await?;
            }
            Access::Block => {
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| Error::io("create", parent, e))?;
                }
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&target)
                    .map_err(|e| Error::io("create", &target, e))?;
                self.bind(&rec, &dev, &want).await?;
            }
        }
        tracing::info!(volume_id = %req.volume_id, target = %target.display(), read_only = want.read_only, "published");
        Ok(NodePublishVolumeResponse {})
    }

    /// Bind-mount `source` on the publish's target, unless it is there.
    async fn bind(&self, rec: &Record, source: &Path, p: &Publish) -> Result<(), Status> {
        let t = p.target.to_string_lossy();
        if sys::mount_at(&p.target)?.is_some() {
            if let Err(why) = self.published_ok(rec, p) {
                return Err(Status::failed_precondition(format!(
                    "{t} has something else mounted: {why}"
                )));
            }
            return Ok(());
        }
        let mut opts = vec!["bind".to_string()];
        opts.extend(p.mount_flags.iter().cloned());
        if p.read_only {
            opts.push("ro".into());
        }
        let o = opts.join(",");
        exec::run(
            "mount",
            &["-o", &o, &source.to_string_lossy(), &t],
            exec::QUICK,
        )
        .await?;
        // mount(8) applies a bind mount's options with a second call; make
        // sure the read-only flag took.
        if sys::mount_at(&p.target)?.is_some_and(|m| m.read_only() != p.read_only) {
            let ro = if p.read_only { "ro" } else { "rw" };
            exec::run(
                "mount",
                &["-o", &format!("remount,bind,{ro}"), &t],
                exec::QUICK,
            )
            .await?;
        }
        Ok(())
    }

    pub(super) async fn unpublish(
        &self,
        req: NodeUnpublishVolumeRequest,
    ) -> Result<NodeUnpublishVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return invalid!("volume_id is required");
        }
        if req.target_path.is_empty() {
            return invalid!("target_path is required");
        }
        let target = PathBuf::from(&req.target_path);
        let _g = self.locks.lock(&req.volume_id).await;
        let rec = self.store.load(&req.volume_id)?;
        if rec.as_ref().is_none_or(|r| r.publish(&target).is_none()) {
            let other = self
                .store
                .all()?
                .into_iter()
                .find(|r| r.volume_id != req.volume_id && r.publish(&target).is_some());
            if let Some(o) = other {
                tracing::warn!(volume_id = %shown(&req.volume_id), owner = %o.volume_id, target = %target.display(),
                    "unpublish of a path another volume is published at: left alone");
                return Ok(NodeUnpublishVolumeResponse {});
            }
        }
        fs::unmount_all(&target).await?;
        match std::fs::symlink_metadata(&target) {
            Ok(m) if m.is_dir() => {
                std::fs::remove_dir(&target).map_err(|e| Error::io("remove", &target, e))?
            }
            Ok(_) => std::fs::remove_file(&target).map_err(|e| Error::io("remove", &target, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("stat", &target, e).into()),
        }
        if let Some(mut r) = rec {
            let before = r.publishes.len();
            r.publishes
                .retain(|p| !super::state::same_path(&p.target, &target));
            if r.publishes.len() != before {
                self.store.save(&r)?;
            }
        }
        tracing::info!(volume_id = %shown(&req.volume_id), target = %target.display(), "unpublished");
        Ok(NodeUnpublishVolumeResponse {})
    }
}
