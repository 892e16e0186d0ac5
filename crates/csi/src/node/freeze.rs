//! Freezing the filesystems this node plugin mounted, for the daemon's
//! frozen snapshots (`lamina_api::freeze`, docs/csi-node.md "Frozen
//! snapshots"). The plugin holds the mounts and the privilege, so it does
//! the freezing; the daemon asks, on a unix socket in its data directory,
//! and thaws once its snapshot is taken.
//!
//! A freeze never outlives its bound: the plugin thaws by itself when the
//! hold asked for ends, and before it freezes it writes the paths to
//! `STATE/frozen/ID.json`, so that a plugin that crashed or was killed
//! while a filesystem was frozen thaws it when it starts again
//! ([`Freezer::recover`]). Thawing a filesystem that is not frozen is not
//! an error (the kernel answers EINVAL), so every thaw may be repeated.
//!
//! Freezes and thaws block (the kernel writes the filesystem through the
//! volume's export) and run on the blocking pool, never on the runtime's
//! workers: the daemon serving that I/O may share the runtime (in tests it
//! does), and a worker stuck in FITHAW then waits for itself.

use super::state::{Access, Store};
use lamina_api::freeze::{Freeze, Frozen, Thaw, Thawed, MAX_HOLD_MS};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `_IOWR('X', 119, int)` and `_IOWR('X', 120, int)` (linux/fs.h).
const FIFREEZE: libc::c_ulong = 0xC004_5877;
const FITHAW: libc::c_ulong = 0xC004_5878;

#[derive(Debug, thiserror::Error)]
pub enum FreezeError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Busy(String),
    #[error("cannot freeze {path}: {source}")]
    Freeze {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Other(String),
}

/// The freezes in force, by id.
#[derive(Clone)]
pub struct Freezer {
    store: Store,
    dir: PathBuf,
    held: Arc<Mutex<HashMap<String, Vec<PathBuf>>>>,
    next: Arc<std::sync::atomic::AtomicU64>,
    /// Names this run of the plugin in freeze ids (a pid would not: in a
    /// container the plugin is often pid 1 every time), so that a thaw
    /// sent to an earlier run never ends a freeze of this one.
    run: String,
}

fn ioctl(path: &Path, op: libc::c_ulong) -> std::io::Result<()> {
    let f = std::fs::File::open(path)?;
    // SAFETY: `f` is an open descriptor for the call's length; FIFREEZE
    // and FITHAW take an int argument the kernel ignores.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), op as _, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Freeze the filesystem mounted at `path`, only if it is the one on
/// `device` (the volume's block device): the directory is opened, its
/// filesystem's device checked, and that same descriptor frozen, so that
/// a staging path unmounted meanwhile (an unstage beside the freeze) can
/// never freeze the filesystem below it, the host's.
fn freeze_path(path: &Path, device: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let dev = std::fs::metadata(device)?;
    if !dev.file_type().is_block_device() {
        return Err(std::io::Error::other(format!(
            "{} is not a block device",
            device.display()
        )));
    }
    let f = std::fs::File::open(path)?;
    if f.metadata()?.dev() != dev.rdev() {
        return Err(std::io::Error::other(format!(
            "the filesystem there is not the one on {} (unstaged meanwhile?)",
            device.display()
        )));
    }
    // SAFETY: `f` is an open descriptor for the call's length; FIFREEZE
    // takes an int argument the kernel ignores.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), FIFREEZE as _, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Thaw `path`; one that is not frozen (EINVAL) or gone is thawed enough.
fn thaw_path(path: &Path) {
    match ioctl(path, FITHAW) {
        Ok(()) => tracing::info!(path = %path.display(), "thawed"),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::error!(path = %path.display(), error = %e, "cannot thaw"),
    }
}

impl Freezer {
    pub fn new(store: Store, state_dir: &Path) -> Result<Freezer, super::Error> {
        let dir = state_dir.join("frozen");
        std::fs::create_dir_all(&dir).map_err(|e| super::Error::io("create", &dir, e))?;
        Ok(Freezer {
            store,
            dir,
            held: Arc::default(),
            next: Arc::default(),
            run: format!(
                "{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos())
            ),
        })
    }

    /// Thaw what a plugin before this one froze and did not thaw (it was
    /// killed during a freeze). Blocking: run it off the runtime's workers.
    pub fn recover(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            let paths: Vec<PathBuf> = std::fs::read(e.path())
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default();
            tracing::warn!(file = %e.path().display(), ?paths, "thawing what an earlier run froze");
            for p in &paths {
                thaw_path(p);
            }
            let _ = std::fs::remove_file(e.path());
        }
    }

    fn marker(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// The staging paths of the volumes named, mounted by this plugin.
    fn mounts_of(
        &self,
        volumes: &[String],
    ) -> Result<Vec<(String, PathBuf, PathBuf)>, FreezeError> {
        let all = self
            .store
            .all()
            .map_err(|e| FreezeError::Other(e.to_string()))?;
        let mut out = Vec::new();
        for v in volumes {
            for r in all.iter().filter(|r| &r.name == v) {
                if let (true, Access::Mount { .. }, Some(dev)) =
                    (r.staged, &r.access, r.device_path())
                {
                    out.push((v.clone(), r.staging_path.clone(), dev.to_path_buf()));
                }
            }
        }
        Ok(out)
    }

    /// Freeze the mounts of `req.volumes`, all or none (blocking: the
    /// kernel syncs each filesystem first).
    pub fn freeze(&self, req: &Freeze) -> Result<Frozen, FreezeError> {
        if req.hold_ms == 0 || req.hold_ms > MAX_HOLD_MS {
            return Err(FreezeError::Invalid(format!(
                "hold_ms must be 1 to {MAX_HOLD_MS}, not {}",
                req.hold_ms
            )));
        }
        let mounts = self.mounts_of(&req.volumes)?;
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("{}-{n}", self.run);
        let paths: Vec<PathBuf> = mounts.iter().map(|(_, p, _)| p.clone()).collect();
        {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(p) = paths
                .iter()
                .find(|p| held.values().flatten().any(|q| q == *p))
            {
                return Err(FreezeError::Busy(format!(
                    "{} is frozen already for another snapshot",
                    p.display()
                )));
            }
            held.insert(id.clone(), paths.clone());
        }
        let undo = |done: &[PathBuf]| {
            for p in done {
                thaw_path(p);
            }
            let _ = std::fs::remove_file(self.marker(&id));
            self.held
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        };
        if !paths.is_empty() {
            let body = serde_json::to_vec(&paths).expect("paths encode");
            if let Err(e) = std::fs::write(self.marker(&id), body) {
                undo(&[]);
                return Err(FreezeError::Other(format!(
                    "cannot record the freeze in {}: {e}",
                    self.dir.display()
                )));
            }
        }
        for (i, p) in paths.iter().enumerate() {
            if let Err(source) = freeze_path(p, &mounts[i].2) {
                undo(&paths[..i]);
                return Err(FreezeError::Freeze {
                    path: p.display().to_string(),
                    source,
                });
            }
            tracing::info!(path = %p.display(), id, "frozen");
        }
        // The bound: thawed by the plugin itself if the daemon does not.
        let me = self.clone();
        let (tid, hold) = (id.clone(), Duration::from_millis(req.hold_ms));
        tokio::spawn(async move {
            tokio::time::sleep(hold).await;
            // A thaw writes the superblock through the volume's export:
            // off the runtime's workers, which may be serving that I/O.
            let _ = tokio::task::spawn_blocking(move || {
                let left = me.thaw_now(&tid);
                if !left.is_empty() {
                    tracing::warn!(id = tid, paths = ?left, "no thaw came within the hold: thawed");
                }
            })
            .await;
        });
        Ok(Frozen {
            id,
            frozen: mounts
                .into_iter()
                .map(|(v, p, _)| (v, p.display().to_string()))
                .collect(),
        })
    }

    fn thaw_now(&self, id: &str) -> Vec<String> {
        let paths = self
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id)
            .unwrap_or_default();
        for p in &paths {
            thaw_path(p);
        }
        let _ = std::fs::remove_file(self.marker(id));
        paths.iter().map(|p| p.display().to_string()).collect()
    }

    pub fn thaw(&self, req: &Thaw) -> Thawed {
        Thawed {
            thawed: self.thaw_now(&req.id),
        }
    }

    /// Thaw `path` if a freeze holds it (unstage runs this before it
    /// unmounts), off the runtime's workers.
    pub async fn release(&self, path: &Path) {
        let (me, path) = (self.clone(), path.to_path_buf());
        let _ = tokio::task::spawn_blocking(move || me.release_now(&path)).await;
    }

    fn release_now(&self, path: &Path) {
        let ids: Vec<String> = self
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, ps)| ps.iter().any(|p| p == path))
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            self.thaw_now(&id);
        }
    }
}

/// Serve the freeze service on `socket` (replacing a stale socket file)
/// until the process ends.
pub async fn serve(freezer: Freezer, socket: PathBuf) -> std::io::Result<()> {
    use axum::extract::rejection::JsonRejection;
    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;
    use axum::Json;
    use lamina_api::{ApiError, ErrorCode};

    fn refuse(status: StatusCode, code: ErrorCode, message: String) -> Response {
        (
            status,
            Json(ApiError {
                code,
                message,
                hint: None,
            }),
        )
            .into_response()
    }
    async fn freeze(State(f): State<Freezer>, b: Result<Json<Freeze>, JsonRejection>) -> Response {
        let req = match b {
            Ok(Json(r)) => r,
            Err(e) => return refuse(StatusCode::BAD_REQUEST, ErrorCode::Invalid, e.body_text()),
        };
        match tokio::task::spawn_blocking(move || f.freeze(&req)).await {
            Ok(Ok(frozen)) => Json(frozen).into_response(),
            Ok(Err(e @ FreezeError::Invalid(_))) => {
                refuse(StatusCode::BAD_REQUEST, ErrorCode::Invalid, e.to_string())
            }
            Ok(Err(e @ FreezeError::Busy(_))) => {
                refuse(StatusCode::CONFLICT, ErrorCode::Conflict, e.to_string())
            }
            Ok(Err(e)) => refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Internal,
                e.to_string(),
            ),
            Err(e) => refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Internal,
                e.to_string(),
            ),
        }
    }
    async fn thaw(State(f): State<Freezer>, b: Result<Json<Thaw>, JsonRejection>) -> Response {
        match b {
            Ok(Json(r)) => match tokio::task::spawn_blocking(move || f.thaw(&r)).await {
                Ok(t) => Json(t).into_response(),
                Err(e) => refuse(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    ErrorCode::Internal,
                    e.to_string(),
                ),
            },
            Err(e) => refuse(StatusCode::BAD_REQUEST, ErrorCode::Invalid, e.body_text()),
        }
    }

    // A socket someone answers on is another plugin's on the same data
    // directory (one per node is the rule; tests run a second one): it
    // is left to it. One nobody answers on is a dead plugin's: replaced.
    if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
        tracing::warn!(socket = %socket.display(),
            "another node plugin serves freezes on this data directory: this one serves none");
        return Ok(());
    }
    match std::fs::remove_file(&socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = tokio::net::UnixListener::bind(&socket)?;
    // Only root (the daemon) may freeze this node's filesystems.
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))?;
    let ino = std::fs::metadata(&socket)?.ino();
    // Removed when the service stops (its task ends or is aborted), if the
    // file is still this listener's: a daemon then finds no socket rather
    // than one nobody answers on.
    struct Unlink(PathBuf, u64);
    impl Drop for Unlink {
        fn drop(&mut self) {
            if std::fs::metadata(&self.0).is_ok_and(|m| m.ino() == self.1) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }
    let _unlink = Unlink(socket.clone(), ino);
    tracing::info!(socket = %socket.display(), "freeze service listening");
    let app = axum::Router::new()
        .route("/v1/freeze", post(freeze))
        .route("/v1/thaw", post(thaw))
        .with_state(freezer);
    axum::serve(listener, app).await
}
