//! Attached volumes served as files (`DATA/files/NAME`, [`lamina_fuse`]):
//! which exports have a file, starting and stopping their FUSE servers, and
//! whether this node serves files at all. It serves the volume the export
//! registry hands it and knows nothing of the store or the engine; the
//! state layer decides what to serve and records it.
//!
//! With a keeper (`lamina keeper`, [`lamina_keeper`]), a stop hands each
//! file's FUSE connection to it instead of ending it, and the next start
//! takes the connections back: the files stay mounted and their I/O waits
//! in the kernel while no daemon runs (docs/daemon.md, "Files across a
//! restart").

use lamina_blockio::BlockIo;
use lamina_fuse::{FileServer, Handover, MountError, Options};
use lamina_keeper::{Client, Held};
use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
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
    keeper: Option<Client>,
    /// Connections the keeper held at the start, by the file's path, until
    /// served again or forgotten.
    held: Mutex<HashMap<String, Held>>,
}

impl Files {
    /// Files under `dir` (made mode 0700 on first use: the mounts let any
    /// process of the host in, so the directory is what keeps other users
    /// out); `enabled` false refuses every file.
    /// With `keeper`, the connections it holds are taken now, to be
    /// served again as their exports are.
    pub fn new(dir: PathBuf, enabled: bool, keeper: Option<PathBuf>) -> Files {
        let keeper = keeper.map(|p| Client::new(&p));
        let mut held = HashMap::new();
        if let Some(k) = &keeper {
            match k.list() {
                Ok(list) => {
                    for h in list {
                        tracing::info!(path = %h.key, "the keeper holds this file's connection");
                        held.insert(h.key.clone(), h);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "the keeper holds nothing for this start"),
            }
        }
        Files {
            dir,
            enabled,
            served: Mutex::new(HashMap::new()),
            keeper,
            held: Mutex::new(held),
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
        let opts = Options {
            threads: THREADS,
            ..Options::default()
        };
        if let Some(server) = self.take_back(&path, volume.clone(), opts) {
            served.insert(name.to_string(), server);
            return Ok(path);
        }
        for _ in 0..8 {
            if !lamina_fuse::is_mounted(&path) {
                break;
            }
            tracing::info!(path = %path.display(), "detaching a file mount left by an earlier run");
            let _ = lamina_fuse::unmount(&path, true);
        }
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

    /// Serve the connection the keeper held for `path`, if it held one
    /// and it is still the one mounted there; the keeper then lets go of
    /// it. One it held that cannot be served is let go too (the caller
    /// mounts the file anew).
    fn take_back(
        &self,
        path: &Path,
        volume: Arc<dyn BlockIo>,
        opts: Options,
    ) -> Option<FileServer> {
        let key = path.to_string_lossy().into_owned();
        let held = self.lock_held().remove(&key)?;
        let served = FileServer::resume(path, volume, opts, &held.token, held.fds);
        self.let_go(&key);
        match served {
            Ok(server) => {
                tracing::info!(path = %key, connection = server.connection(), "serving the file again on the connection the keeper held: its I/O resumes");
                Some(server)
            }
            Err(e) => {
                tracing::warn!(path = %key, error = %e, "the connection the keeper held cannot be served again; mounting the file anew");
                None
            }
        }
    }

    fn let_go(&self, key: &str) {
        if let Some(k) = &self.keeper {
            if let Err(e) = k.drop_entry(key) {
                tracing::warn!(path = %key, error = %e, "the keeper could not be told to let go (it does at its hold limit)");
            }
        }
    }

    /// End the connections the keeper held for files no export serves now
    /// (exports detached, or volumes gone, while no daemon ran).
    pub fn forget_unclaimed(&self) {
        let left: Vec<Held> = self.lock_held().drain().map(|(_, h)| h).collect();
        for h in left {
            let path = PathBuf::from(&h.key);
            if let Some(t) = Handover::decode(&h.token) {
                if lamina_fuse::connection_of(&path) == Some(t.conn) {
                    let _ = lamina_fuse::abort(t.conn);
                    let _ = lamina_fuse::unmount(&path, true);
                }
            }
            tracing::info!(path = %h.key, "no export serves this file now: its held connection is ended");
            drop(h);
            self.let_go(&path.to_string_lossy());
        }
    }

    /// Stop every reader at the daemon's stop, leaving the mounts. With a
    /// keeper, each connection is handed to it (once the requests the
    /// volume holds are answered), and a file in use only waits for the
    /// next daemon. Without one, or if the handover fails, a file in use
    /// (a staged volume's loop device) fails its I/O with `ENOTCONN` until
    /// the daemon serves it again.
    pub fn stop_all(&self) {
        let all: Vec<FileServer> = self.lock().drain().map(|(_, s)| s).collect();
        for s in all {
            let path = s.path().to_path_buf();
            let s = match &self.keeper {
                Some(k) => match hand_over(k, s) {
                    Ok(()) => continue,
                    Err(s) => s,
                },
                None => s,
            };
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

    fn lock_held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, FileServer>> {
        self.served.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Hand one file's connection to the keeper; the server back if it could
/// not be (the caller closes it).
fn hand_over(keeper: &Client, server: FileServer) -> Result<(), FileServer> {
    let path = server.path().to_path_buf();
    let key = path.to_string_lossy().into_owned();
    let (h, fds) = match server.release(lamina_fuse::DRAIN_WAIT) {
        Ok(x) => x,
        Err(s) => {
            tracing::warn!(path = %key, "requests still with the volume: the file's connection is not handed over");
            return Err(s);
        }
    };
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    match keeper.put(&key, &h.encode(), &borrowed) {
        Ok(()) => {
            tracing::info!(path = %key, connection = h.conn, "the file's connection is handed to the keeper: its I/O waits for the next daemon");
            Ok(())
        }
        Err(e) => {
            tracing::warn!(path = %key, error = %e, "the keeper did not take the file's connection: its I/O fails until the daemon serves it again");
            // Nothing serves it now and nobody will take it: end it, so that
            // its I/O fails instead of waiting.
            if lamina_fuse::connection_of(&path) == Some(h.conn) {
                let _ = lamina_fuse::abort(h.conn);
            }
            Ok(())
        }
    }
}
