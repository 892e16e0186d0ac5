//! NodeStageVolume and NodeUnstageVolume.
//!
//! Staging: the record first, then the daemon's export, the block device,
//! and for mount access the filesystem (made only where blkid finds
//! nothing) mounted at the staging path and grown to the device (a volume
//! expanded while unstaged is bigger than its filesystem). Each step looks
//! at what is there first, so a call after a crash or a failure resumes.
//!
//! Unstaging undoes it in reverse from the record and what the kernel
//! shows: unmount, loop device and nbdfuse (or the kernel client), then the
//! daemon's export, then the record.

use super::state::{same_path, Access, Record};
use super::{access_of, fs, not_found, sys, NodeService};
use crate::controller::check_capability;
use crate::ids::{diskless_front_of, is_replica, names, VolumeId};
use crate::proto::*;
use crate::status::{from_client, invalid};
use std::path::{Path, PathBuf};
use tonic::Status;

/// Whether a record's staging is what a new request asks for.
fn compatible(rec: &Record, access: &Access, mode: i32) -> Result<(), String> {
    if rec.mode != mode {
        return Err(format!("it was staged with access mode {}", rec.mode));
    }
    match (&rec.access, access) {
        (Access::Block, Access::Block) => Ok(()),
        (
            Access::Mount {
                fs_type: had,
                mount_flags: had_flags,
            },
            Access::Mount {
                fs_type: want,
                mount_flags: want_flags,
            },
        ) => {
            let fs_ok = want.is_empty() || want == had || rec.fs.as_deref() == Some(want);
            if !fs_ok {
                return Err(format!(
                    "it was staged with filesystem {:?}",
                    rec.fs.as_deref().unwrap_or(had)
                ));
            }
            if had_flags != want_flags {
                return Err(format!("it was staged with mount flags {had_flags:?}"));
            }
            Ok(())
        }
        (Access::Block, _) => Err("it was staged for block access".into()),
        (Access::Mount { .. }, _) => Err("it was staged for mount access".into()),
    }
}

/// A read-only access mode.
pub(super) fn read_only_mode(mode: i32) -> bool {
    use volume_capability::access_mode::Mode;
    matches!(
        Mode::try_from(mode),
        Ok(Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly)
    )
}

impl NodeService {
    pub(super) async fn stage(
        &self,
        req: NodeStageVolumeRequest,
    ) -> Result<NodeStageVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return invalid!("volume_id is required");
        }
        if req.staging_target_path.is_empty() {
            return invalid!("staging_target_path is required");
        }
        let Some(cap) = req.volume_capability.as_ref() else {
            return invalid!("volume_capability is required");
        };
        check_capability(cap).map_err(Status::invalid_argument)?;
        let (access, mode) = access_of(cap);
        let vid = VolumeId::parse(&req.volume_id).ok_or_else(|| not_found(&req.volume_id))?;
        let staging = PathBuf::from(&req.staging_target_path);
        let _g = self.locks.lock(&req.volume_id).await;

        let mut rec = match self.store.load(&req.volume_id)? {
            Some(r) if same_path(&r.staging_path, &staging) => {
                if let Err(why) = compatible(&r, &access, mode) {
                    if r.staged {
                        return Err(Status::already_exists(format!(
                            "volume {} is staged at {} with another capability: {why}",
                            req.volume_id,
                            staging.display()
                        )));
                    }
                }
                if !r.staged {
                    // An unfinished staging here: resume it.
                    Record {
                        access: access.clone(),
                        mode,
                        ..r
                    }
                } else if let Err(why) = self.staged_ok(&r) {
                    // Broken (nbdfuse died, the mount went): start over,
                    // unless a publish still holds the old device.
                    for p in &r.publishes {
                        if sys::mount_at(&p.target)?.is_some() {
                            return Err(Status::failed_precondition(format!(
                                "volume {} is staged but broken ({why}) and still published at {}: unpublish it first",
                                req.volume_id,
                                p.target.display()
                            )));
                        }
                    }
                    tracing::warn!(volume_id = %req.volume_id, %why, "staged volume is broken; staging it again");
                    self.teardown(&r).await?;
                    self.new_record(&vid, &req.volume_id, staging.clone(), access, mode)
                } else {
                    return Ok(NodeStageVolumeResponse {});
                }
            }
            Some(r) => {
                if r.staged || !r.publishes.is_empty() {
                    return Err(Status::failed_precondition(format!(
                        "volume {} is staged at {}: unstage it there first",
                        req.volume_id,
                        r.staging_path.display()
                    )));
                }
                // An unfinished staging elsewhere: undo it and start over.
                self.teardown(&r).await?;
                self.new_record(&vid, &req.volume_id, staging.clone(), access, mode)
            }
            None => self.new_record(&vid, &req.volume_id, staging.clone(), access, mode),
        };

        let here = vid.node.as_deref().is_none_or(|n| n == self.cfg.node_id);
        // A replicated volume (its context says how many replicas its
        // class asks for) is usable on a node that holds none of them.
        let replicated = req
            .volume_context
            .get(lamina_api::REPLICAS_WANTED_LABEL)
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| n > 1);
        match self.client.get_volume(&vid.name).await {
            Ok(v) if names(&vid, &v, here) => {}
            Ok(v) if is_replica(&v) => self.take_over(&req, &v).await?,
            Ok(v) if diskless_front_of(&vid, &v) => {
                self.front_without_replica(&req.volume_id, &vid.name)
                    .await?
            }
            Ok(_) => return Err(not_found(&req.volume_id)),
            Err(e) if e.is_not_found() && replicated => {
                self.front_without_replica(&req.volume_id, &vid.name)
                    .await?
            }
            Err(e) if e.is_not_found() => return Err(not_found(&req.volume_id)),
            Err(e) => return Err(from_client(&e)),
        }
        self.store.save(&rec)?;
        let dev = self.ensure_device(&mut rec).await?;
        if let Access::Mount {
            fs_type,
            mount_flags,
        } = rec.access.clone()
        {
            self.ensure_mounted(&mut rec, &dev, &fs_type, &mount_flags)
                .await?;
        }
        rec.staged = true;
        self.store.save(&rec)?;
        tracing::info!(volume_id = %req.volume_id, dev = %dev.display(), staging = %staging.display(), "staged");
        Ok(NodeStageVolumeResponse {})
    }

    /// The volume's pod moved to this node, which holds one of its
    /// replicas: this node's daemon takes the volume over (docs/csi.md,
    /// "Replicas"; it checks in the shared record that this
    /// replica holds every acknowledged write, and fences the old front
    /// end). The replica is first labelled with the CSI id (and the
    /// replica count the StorageClass asks for, from the volume context),
    /// so that every later call finds the volume by that id here, and the
    /// count is kept from here on. The name is the volume's identity on a
    /// replica (a CSI name names one PVC): the shared record refuses a
    /// replica left from an earlier volume of that name.
    async fn take_over(
        &self,
        req: &NodeStageVolumeRequest,
        v: &lamina_api::Volume,
    ) -> Result<(), Status> {
        let mut labels: std::collections::BTreeMap<String, String> = v
            .labels
            .iter()
            .filter(|(k, _)| !k.starts_with("lamina.io/"))
            .map(|(k, x)| (k.clone(), x.clone()))
            .collect();
        labels.insert(
            lamina_api::CSI_VOLUME_ID_LABEL.to_string(),
            req.volume_id.clone(),
        );
        if let Some(n) = req.volume_context.get(lamina_api::REPLICAS_WANTED_LABEL) {
            labels.insert(lamina_api::REPLICAS_WANTED_LABEL.to_string(), n.clone());
        }
        if labels.iter().any(|(k, x)| v.labels.get(k) != Some(x)) {
            self.client
                .set_volume_labels(&v.name, &labels)
                .await
                .map_err(|e| from_client(&e))?;
        }
        let front = v.labels.get(lamina_api::REPLICA_OF_LABEL);
        self.client
            .take_over_volume(&v.name)
            .await
            .map_err(|e| from_client(&e))?;
        tracing::warn!(volume_id = %req.volume_id, from = ?front, "volume taken over: its front end serves it from this node");
        Ok(())
    }

    /// The volume's pod moved to this node, which holds none of its
    /// replicas: this node's daemon takes the volume over with a front end
    /// that reaches every replica over the network (docs/replicas.md, "A
    /// front end with no replica"; it checks in the shared record that a
    /// replica holds every acknowledged write, and fences the old front
    /// end). Asked again once taken, it changes nothing.
    async fn front_without_replica(&self, volume_id: &str, name: &str) -> Result<(), Status> {
        self.client
            .take_over_volume(name)
            .await
            .map_err(|e| from_client(&e))?;
        tracing::warn!(
            volume_id,
            "volume taken over by a front end on this node, which holds no replica of it"
        );
        Ok(())
    }

    fn new_record(
        &self,
        vid: &VolumeId,
        volume_id: &str,
        staging: PathBuf,
        access: Access,
        mode: i32,
    ) -> Record {
        Record {
            volume_id: volume_id.to_string(),
            name: vid.name.clone(),
            staging_path: staging,
            access,
            mode,
            device: None,
            fs: None,
            staged: false,
            publishes: vec![],
        }
    }

    /// Whether a staged volume is all there: its device, and for mount
    /// access its filesystem mounted at the staging path.
    pub(super) fn staged_ok(&self, rec: &Record) -> Result<(), String> {
        self.device_ok(rec)?;
        if matches!(rec.access, Access::Mount { .. }) {
            self.mounted_from_device(rec, &rec.staging_path)?;
        }
        Ok(())
    }

    /// Whether the volume's filesystem is mounted at `path`.
    pub(super) fn mounted_from_device(&self, rec: &Record, path: &Path) -> Result<(), String> {
        let dev = rec.device_path().ok_or("no device was made")?;
        let want = sys::rdev(dev).map_err(|e| e.to_string())?;
        match sys::mount_at(path).map_err(|e| e.to_string())? {
            Some(m) if m.dev == want => Ok(()),
            Some(m) => Err(format!(
                "{} has {} ({}) mounted, not {}",
                path.display(),
                m.source,
                m.fs_type,
                dev.display()
            )),
            None => Err(format!("nothing is mounted at {}", path.display())),
        }
    }

    /// The filesystem: found or made, mounted at the staging path, grown
    /// to the device.
    async fn ensure_mounted(
        &self,
        rec: &mut Record,
        dev: &Path,
        fs_type: &str,
        flags: &[String],
    ) -> Result<(), Status> {
        let staging = rec.staging_path.clone();
        let want = sys::rdev(dev)?;
        if let Some(m) = sys::mount_at(&staging)? {
            if m.dev != want {
                return Err(Status::failed_precondition(format!(
                    "{} already has {} mounted",
                    staging.display(),
                    m.source
                )));
            }
        } else {
            let read_only = read_only_mode(rec.mode);
            let fs = match fs::probe(dev).await? {
                fs::Found::Filesystem(t) => {
                    if !fs_type.is_empty() && t != fs_type {
                        return Err(Status::failed_precondition(format!(
                            "volume {} holds a {t} filesystem, not {fs_type}: it is not reformatted",
                            rec.volume_id
                        )));
                    }
                    if !read_only {
                        fs::grow_unmounted(&t, dev).await?;
                    }
                    t
                }
                fs::Found::Other(what) => {
                    return Err(Status::failed_precondition(format!(
                        "volume {} holds {what}, not a filesystem: it is not formatted over",
                        rec.volume_id
                    )))
                }
                fs::Found::Nothing if read_only => {
                    return Err(Status::failed_precondition(format!(
                        "volume {} has no filesystem, and a read-only access mode does not make one",
                        rec.volume_id
                    )))
                }
                fs::Found::Nothing => {
                    let t = if fs_type.is_empty() {
                        fs::DEFAULT_FS
                    } else {
                        fs_type
                    };
                    fs::make(t, dev).await?;
                    t.to_string()
                }
            };
            rec.fs = Some(fs.clone());
            self.store.save(rec)?;
            std::fs::create_dir_all(&staging)
                .map_err(|e| super::Error::io("create", &staging, e))?;
            let opts = fs::mount_options(&fs, flags, read_only);
            fs::mount(&fs, dev, &staging, &opts).await?;
        }
        let fs = rec.fs.clone().unwrap_or_default();
        if !read_only_mode(rec.mode) {
            fs::grow(&fs, dev, &staging).await?;
        }
        Ok(())
    }

    pub(super) async fn unstage(
        &self,
        req: NodeUnstageVolumeRequest,
    ) -> Result<NodeUnstageVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return invalid!("volume_id is required");
        }
        if req.staging_target_path.is_empty() {
            return invalid!("staging_target_path is required");
        }
        let staging = PathBuf::from(&req.staging_target_path);
        let _g = self.locks.lock(&req.volume_id).await;
        let Some(rec) = self.store.load(&req.volume_id)? else {
            return Ok(NodeUnstageVolumeResponse {});
        };
        if !same_path(&rec.staging_path, &staging) {
            tracing::warn!(volume_id = %req.volume_id, staged = %rec.staging_path.display(),
                asked = %staging.display(), "unstage of a path the volume is not staged at: nothing to do");
            return Ok(NodeUnstageVolumeResponse {});
        }
        let mut live = Vec::new();
        for p in &rec.publishes {
            if sys::mount_at(&p.target)?.is_some() {
                live.push(p.target.display().to_string());
            }
        }
        if !live.is_empty() {
            return Err(Status::failed_precondition(format!(
                "volume {} is still published at {}: unpublish it first",
                req.volume_id,
                live.join(", ")
            )));
        }
        // A frozen snapshot's freeze in force ends first: a frozen
        // filesystem would hold the unmount.
        self.freezer.release(&rec.staging_path).await;
        self.teardown(&rec).await?;
        self.store.remove(&rec.volume_id)?;
        tracing::info!(volume_id = %req.volume_id, "unstaged");
        Ok(NodeUnstageVolumeResponse {})
    }

    /// Undo a staging, complete or not, from its record and what the
    /// kernel shows; the record itself is left to the caller.
    pub(super) async fn teardown(&self, rec: &Record) -> Result<(), Status> {
        if matches!(rec.access, Access::Mount { .. }) {
            // Only our filesystem: a mount at the staging path from a
            // device not ours is left alone.
            let ours = match (rec.device_path(), sys::mount_at(&rec.staging_path)?) {
                (Some(dev), Some(m)) => {
                    m.source == dev.to_string_lossy() || sys::rdev(dev).is_ok_and(|d| d == m.dev)
                }
                _ => false,
            };
            if ours {
                fs::unmount_all(&rec.staging_path).await?;
            }
        }
        self.release_device(rec).await?;
        let ours = |v: &lamina_api::Volume| {
            VolumeId::parse(&rec.volume_id).is_some_and(|id| {
                let here = id.node.as_deref().is_none_or(|n| n == self.cfg.node_id);
                names(&id, v, here)
            })
        };
        match self.client.get_volume(&rec.name).await {
            Ok(v) if ours(&v) => {
                if v.export.is_some() {
                    self.client
                        .detach_volume(&rec.name, false)
                        .await
                        .map_err(|e| from_client(&e))?;
                }
            }
            // Deleted, or the name is another volume's now: no export of ours.
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(from_client(&e)),
        }
        Ok(())
    }
}
