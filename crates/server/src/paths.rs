//! Where things live under the data directory.

use crate::error::ServerError;
use std::path::{Path, PathBuf};

/// The data directory the daemon and the CLI use when given none:
/// `$LAMINA_DATA_DIR`, else `/var/lib/lamina` for root, else
/// `$XDG_DATA_HOME/lamina` or `~/.local/share/lamina`.
pub fn default_data_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("LAMINA_DATA_DIR") {
        return PathBuf::from(d);
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/lib/lamina");
    }
    if let Some(x) = std::env::var_os("XDG_DATA_HOME") {
        return PathBuf::from(x).join("lamina");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".local/share/lamina")
}

/// The files of one daemon.
#[derive(Clone, Debug)]
pub struct Layout {
    pub root: PathBuf,
    pub pool: PathBuf,
    pub store: PathBuf,
    pub api_socket: PathBuf,
    pub nbd_socket: PathBuf,
    pub token: PathBuf,
    /// Attached volumes served as files (mode 0700).
    pub files: PathBuf,
}

impl Layout {
    pub fn new(root: &Path) -> Layout {
        Layout {
            root: root.to_path_buf(),
            pool: root.join("pool"),
            store: root.join("lamina.redb"),
            api_socket: root.join("api.sock"),
            nbd_socket: root.join("nbd.sock"),
            token: root.join("token"),
            files: root.join("files"),
        }
    }

    pub fn prepare(&self) -> Result<(), ServerError> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(&self.root).map_err(|e| {
            ServerError::io("create data directory", self.root.display().to_string(), e)
        })?;
        std::fs::set_permissions(&self.root, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| ServerError::io("chmod", self.root.display().to_string(), e))?;
        Ok(())
    }

    /// The TCP bearer token, made (random, mode 0600) on first use.
    pub fn token(&self) -> Result<String, ServerError> {
        use std::io::{Read, Write};
        use std::os::unix::fs::OpenOptionsExt;
        if let Ok(t) = std::fs::read_to_string(&self.token) {
            return Ok(t.trim().to_string());
        }
        let mut raw = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut raw))
            .map_err(|e| ServerError::io("read /dev/urandom", "/dev/urandom".into(), e))?;
        let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&self.token)
            .map_err(|e| ServerError::io("create token", self.token.display().to_string(), e))?;
        writeln!(f, "{token}")
            .map_err(|e| ServerError::io("write token", self.token.display().to_string(), e))?;
        Ok(token)
    }
}

/// The TCP bearer token in `file`, which the daemon only reads
/// (`Config::token_file`): its first line, trimmed, which may not be empty.
pub(crate) fn read_token_file(file: &Path) -> Result<String, ServerError> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| ServerError::io("read token file", file.display().to_string(), e))?;
    let token = text.lines().next().unwrap_or("").trim();
    if token.is_empty() {
        return Err(ServerError::Config(format!(
            "the token file {} is empty: the TCP API needs a bearer token",
            file.display()
        )));
    }
    Ok(token.to_string())
}

/// Bytes new data can still take in a pool with `stats` in `dir`: its free
/// space plus what its filesystem can still give, up to its cap if it has one.
pub(crate) fn capacity_bytes(dir: &std::path::Path, stats: &lamina_engine::PoolStats) -> u64 {
    let fs_free = fs_available(dir).unwrap_or(0);
    let grow = match stats.max_bytes {
        Some(max) => max.saturating_sub(stats.total_bytes).min(fs_free),
        None => fs_free,
    };
    stats.free_bytes.saturating_add(grow)
}

/// Bytes an unprivileged writer may still add to the filesystem of `dir`.
pub(crate) fn fs_available(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain old data; all-zero bytes are a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable
    // statvfs the call fills in; both outlive the call.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}
