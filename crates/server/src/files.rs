//! Attached volumes served as files (`DATA/files/NAME`, [`lamina_fuse`]):
//! which exports have a file, starting and stopping their FUSE servers, and
//! whether this node serves files at all. It serves the volume the export
//! registry hands it and knows nothing of the store or the engine; the
//! state layer decides what to serve and records it.

use lamina_blockio::BlockIo;
use lamina_fuse::{FileServer, MountError, Options};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Reader threads per file.
const THREADS: usize = 4;

/// Why a file could not be served or let go.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// This node serves no files (`--files off`, or no FUSE here).
    #[error("{}: {reason}", lamina_api::FILES_REFUSED)]
    Refused { reason: String },
    /// Something (a loop device, an open descriptor) still uses the file.
    #[error("{path} is in use (a loop device or a process has it open)")]
    Busy { path: PathBuf },
    #[error("serving {path}: {message}")]
    Failed { path: PathBuf, message: String },
}

/// The files this daemon serves, by export name.
pub struct Files {
    dir: PathBuf,
    enabled: bool,
    served: Mutex<HashMap<String, FileServer>>,
}

impl Files {
    /// Files under `dir` (made mode 0700 on first use: the mounts let any
    /// process of the host in, so the directory is what keeps other users
    /// out); `enabled` false refuses every file.
    pub fn new(dir: PathBuf, enabled: bool) -> Files {
        Files {
            dir,
            enabled,
            served: Mutex::new(HashMap::new()),
        }
    }

    /// Where export `name`'s file is, served or not.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The file of export `name`, if it is served.
    pub fn served(&self, name: &str) -> Option<PathBuf> {
        self.lock().get(name).map(|s| s.path().to_path_buf())
    }

    /// Serve `volume` as export `name`'s file (a file already served stays
    /// as it is). A mount left at the path by an earlier run of the daemon
    /// (its connection dead) is detached first.
    pub fn serve(&self, name: &str, volume: Arc<dyn BlockIo>) -> Result<PathBuf, FileError> {
        if !self.enabled {
            return Err(FileError::Refused {
                reason: "the daemon runs with --files off".into(),
            });
        }
        let mut served = self.lock();
        if let Some(s) = served.get(name) {
            return Ok(s.path().to_path_buf());
        }
        self.prepare_dir()?;
        let path = self.path(name);
        for _ in 0..8 {
            if !lamina_fuse::is_mounted(&path) {
                break;
            }
            tracing::info!(path = %path.display(), "detaching a file mount left by an earlier run");
            let _ = lamina_fuse::unmount(&path, true);
        }
        let opts = Options {
            threads: THREADS,
            ..Options::default()
        };
        let server = FileServer::start(&path, volume, opts).map_err(|e| match e {
            lamina_fuse::ServeError::Mount(MountError::NoFuse(err)) => FileError::Refused {
                reason: format!("FUSE is not available here (/dev/fuse: {err})"),
            },
            e => FileError::Failed {
                path: path.clone(),
                message: e.to_string(),
            },
        })?;
        tracing::info!(export = name, path = %path.display(), connection = server.connection(), "serving the file");
        served.insert(name.to_string(), server);
        Ok(path)
    }

    /// Stop serving export `name`'s file; whether it was served. Without
    /// `force` a file in use stays served and [`FileError::Busy`] says so;
    /// with it the mount is detached and whoever uses the file gets
    /// `ENOTCONN`.
    pub fn close(&self, name: &str, force: bool) -> Result<bool, FileError> {
        let mut served = self.lock();
        let Some(server) = served.remove(name) else {
            return Ok(false);
        };
        match server.close(force) {
            Ok(()) => {
                let _ = std::fs::remove_file(self.path(name));
                Ok(true)
            }
            Err((server, e)) => {
                let path = server.path().to_path_buf();
                served.insert(name.to_string(), server);
                Err(match e {
                    MountError::Busy { .. } => FileError::Busy { path },
                    e => FileError::Failed {
                        path,
                        message: e.to_string(),
                    },
                })
            }
        }
    }

    /// Stop every reader at the daemon's stop, leaving the mounts: a file
    /// in use (a staged volume's loop device) fails its I/O with
    /// `ENOTCONN` until the daemon serves it again.
    pub fn stop_all(&self) {
        let all: Vec<FileServer> = self.lock().drain().map(|(_, s)| s).collect();
        for s in all {
            let path = s.path().to_path_buf();
            match s.close(false) {
                Ok(()) => {
                    let _ = std::fs::remove_file(&path);
                }
                Err((s, _)) => drop(s),
            }
        }
    }

    fn prepare_dir(&self) -> Result<(), FileError> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let failed = |e: std::io::Error| FileError::Failed {
            path: self.dir.clone(),
            message: e.to_string(),
        };
        if !self.dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&self.dir)
                .map_err(failed)?;
        }
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700)).map_err(failed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, FileServer>> {
        self.served.lock().unwrap_or_else(|e| e.into_inner())
    }
}
