//! NBD exports: attach and detach a volume or a snapshot, recorded in the
//! store so that they come back after a restart. The caller holds the
//! volume's operation lock.

use super::State;
use crate::error::Failure;
use crate::files::FileError;
use crate::store::ExportRec;
use lamina_api as api;
use std::sync::Arc;

/// How long a detach waits for NBD clients that are disconnecting before it
/// refuses (without `force`).
const DETACH_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Export name of a snapshot: `VOLUME@SNAPSHOT` ('@' is never in a name).
pub fn snapshot_export(volume: &str, snapshot: &str) -> String {
    format!("{volume}@{snapshot}")
}

impl State {
    /// Export a volume or snapshot over NBD (idempotent), and with `file`
    /// also as a file on this host. The caller holds the volume's operation
    /// lock, so that an attach cannot race the deletion of what it exports;
    /// blocking (engine and store calls). A file that cannot be served
    /// leaves nothing of this call behind: an export it made is undone.
    pub fn attach(
        &self,
        volume: &str,
        snapshot: Option<&str>,
        file: bool,
    ) -> Result<api::Export, Failure> {
        let name = match snapshot {
            None => volume.to_string(),
            Some(s) => snapshot_export(volume, s),
        };
        let rec = |file| ExportRec {
            volume: volume.into(),
            snapshot: snapshot.map(Into::into),
            file,
        };
        let fresh = !self.exports.contains(&name);
        if fresh {
            // A front end open with no export (one `lamina replica add`
            // opened for a rebuild) serves it; else one is opened.
            let open = snapshot
                .is_none()
                .then(|| self.fronts.get(volume))
                .flatten();
            let (dev, front) = match open {
                Some(f) => (
                    f.replicated.clone() as Arc<dyn lamina_blockio::BlockIo>,
                    None,
                ),
                None => crate::front::open_device(&self.front_parts(), volume, snapshot)?,
            };
            self.store
                .put_export(&name, &rec(false))
                .map_err(Failure::from)?;
            if let Some(f) = front {
                self.fronts.insert(volume, f);
            }
            self.exports
                .insert(&name, dev, self.volume_io(&name), self.activity.clone());
            self.changes.bump();
        }
        if file && self.files.served(&name).is_none() {
            let served = self.serve_file(&name).and_then(|_| {
                self.store.put_export(&name, &rec(true)).map_err(|e| {
                    let _ = self.files.close(&name, true);
                    Failure::from(e)
                })
            });
            if let Err(e) = served {
                if fresh {
                    let _ = self.store.remove_export(&name);
                    let _ = self.exports.remove(&name);
                }
                return Err(e);
            }
            self.changes.bump();
        }
        self.export_of(&name).ok_or_else(|| {
            Failure::internal(format!(
                "export {name:?} vanished while it was being attached"
            ))
        })
    }

    /// Serve export `name`'s volume as its file.
    pub(super) fn serve_file(&self, name: &str) -> Result<std::path::PathBuf, Failure> {
        let vol = self
            .exports
            .open_for_file(name)
            .ok_or_else(|| Failure::internal(format!("export {name:?} is not attached")))?;
        self.files.serve(name, vol).map_err(|e| match e {
            FileError::Refused { .. } => Failure::new(
                api::ErrorCode::Unavailable,
                e.to_string(),
                Some("use the export's NBD URI instead"),
            ),
            e => Failure::internal(e.to_string()),
        })
    }

    /// Stop exporting; whether it was exported. Same locking as `attach`.
    /// While NBD clients are connected it refuses unless `force`: they would
    /// get I/O errors from then on (what they wrote is flushed first).
    pub fn detach(
        &self,
        volume: &str,
        snapshot: Option<&str>,
        force: bool,
    ) -> Result<bool, Failure> {
        let name = match snapshot {
            None => volume.to_string(),
            Some(s) => snapshot_export(volume, s),
        };
        // A client that has just disconnected (sent NBD_CMD_DISC or closed
        // its socket) may not be gone yet: its session ends once its last
        // replies are written. Give it a moment before refusing.
        let deadline = std::time::Instant::now() + DETACH_GRACE;
        let mut clients = self.exports.connections(&name);
        while clients > 0 && !force && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
            clients = self.exports.connections(&name);
        }
        let cmd = match snapshot {
            None => format!("lamina volume detach {volume} --force"),
            Some(s) => format!("lamina snapshot detach {volume} {s} --force"),
        };
        if clients > 0 && !force {
            return Err(Failure::conflict(
                format!("export {name} has {clients} NBD client(s) connected: they would get I/O errors"),
                &format!("disconnect them first, or cut them off: {cmd}"),
            ));
        }
        // The file: a loop device that was just detached, or a process
        // this daemon forked, may hold it a moment longer.
        let had_file = loop {
            match self.files.close(&name, force) {
                Ok(closed) => break closed,
                Err(FileError::Busy { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(FileError::Busy { path }) => {
                    return Err(Failure::conflict(
                        format!(
                            "export {name}'s file {} is in use (a loop device or a process has it open): it would get I/O errors",
                            path.display()
                        ),
                        &format!("detach its loop device first (losetup -d), or cut it off: {cmd}"),
                    ));
                }
                Err(e) => return Err(Failure::internal(e.to_string())),
            }
        };
        if let Err(e) = self.store.remove_export(&name) {
            // Nothing may change when the answer is an error: the file is
            // served again (unforced, it was closed only while unused; a
            // forced close has cut its users off already).
            if had_file {
                let _ = self.serve_file(&name);
            }
            return Err(Failure::from(e));
        }
        let removed = self
            .exports
            .remove(&name)
            .map_err(|e| Failure::internal(format!("flushing export {name} at its detach: {e}")))?;
        // A front end with no export (one opened for a rebuild) stays.
        if snapshot.is_none() && removed {
            self.fronts.remove(volume);
        }
        if removed {
            self.metrics.forget_volume(&name);
            self.changes.bump();
        }
        Ok(removed)
    }

    /// What a replicated volume's front end needs of this daemon.
    pub fn front_parts(&self) -> crate::front::Parts<'_> {
        crate::front::Parts {
            pool: &self.pool,
            exports: &self.exports,
            store: &self.store,
            identity: self.identity.as_ref(),
            pace: self.pace.as_ref(),
            pool_dir: &self.layout.pool,
            crash_at: self.schedules.crash_at(),
        }
    }

    /// Where an export's I/O is counted, unless that is turned off.
    pub(super) fn volume_io(&self, export: &str) -> Option<Arc<dyn lamina_blockio::IoObserver>> {
        self.volume_io_metrics
            .then(|| self.metrics.volume_io(export) as Arc<dyn lamina_blockio::IoObserver>)
    }

    pub fn is_attached(&self, export: &str) -> bool {
        self.exports.contains(export)
    }
}
