//! The engine's one error type. Every variant carries the context a storage
//! engineer needs to act on it: which volume, snapshot, block or file.

use std::path::PathBuf;
use std::sync::Arc;

/// Result alias for engine operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O error from the underlying file, with the operation and offset.
    #[error("{op} {path} at offset {offset}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        offset: u64,
        #[source]
        source: std::io::Error,
    },
    /// The pool's disk (or its configured capacity) is full.
    #[error("no space left in pool {path}: {detail}")]
    NoSpace { path: PathBuf, detail: String },
    /// A metadata page failed its checksum, magic or self-address check.
    #[error("corrupt metadata at block {block}: {detail}")]
    Corrupt { block: u64, detail: String },
    /// The directory does not hold a pool this version can open.
    #[error("not a Lamina pool ({path}): {detail}")]
    NotAPool { path: PathBuf, detail: String },
    /// A name breaks the naming rule.
    #[error("invalid name {name:?}: {rule}")]
    InvalidName { name: String, rule: &'static str },
    /// An argument is out of range or malformed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// I/O past the end of a volume.
    #[error("{target}: range {offset}+{len} is outside the size {size}")]
    OutOfRange {
        target: String,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("volume {0:?} not found")]
    VolumeNotFound(String),
    /// A name that several deleted volumes had, and no live one has: their
    /// snapshots are named through one of `references` (`NAME@ID`).
    #[error("volume {name:?} is not live and several deleted volumes had the name: name one of {}", references.join(", "))]
    AmbiguousVolume {
        name: String,
        references: Vec<String>,
    },
    #[error("volume {0:?} already exists")]
    VolumeExists(String),
    #[error("snapshot {volume:?}/{snapshot:?} not found")]
    SnapshotNotFound { volume: String, snapshot: String },
    #[error("snapshot {volume:?}/{snapshot:?} already exists")]
    SnapshotExists { volume: String, snapshot: String },
    /// The operation conflicts with the object's current state.
    #[error("{0}")]
    Conflict(String),
    /// The snapshot or volume is read-only here.
    #[error("{0} is read-only")]
    ReadOnly(String),
    /// An earlier I/O failure (named here) set the pool's latch: it
    /// refuses every request until it is reopened and recovered.
    #[error("pool is unavailable until it is reopened: {0}")]
    Unavailable(Arc<IoFailure>),
}

/// The first I/O failure of an open pool, as its latch recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoFailure {
    /// What the engine was doing ("append to log", "sync pool", ...).
    pub op: &'static str,
    /// The file it was doing it to.
    pub path: PathBuf,
    /// Byte offset in that file (0 for whole-file operations such as a sync).
    pub offset: u64,
    /// The error the operating system (or a failed page check) gave.
    pub cause: String,
}

impl std::fmt::Display for IoFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} at offset {} failed: {}",
            self.op,
            self.path.display(),
            self.offset,
            self.cause
        )
    }
}

/// What kind of failure an [`Error`] is: the one classification every
/// caller maps from (the daemon to its API codes, the data path to NBD
/// errors). Every variant of [`Error`] has exactly one kind
/// ([`Error::kind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request is malformed: a bad name or argument, a range outside
    /// the volume.
    Invalid,
    /// The volume or snapshot named does not exist.
    NotFound,
    /// The volume or snapshot named exists already.
    AlreadyExists,
    /// The request conflicts with the object's current state.
    Conflict,
    /// A write to something read-only.
    ReadOnly,
    /// The pool is full.
    NoSpace,
    /// The pool's latch is set: nothing works until it is reopened.
    Unavailable,
    /// The engine itself failed: an I/O error, corrupt metadata, not a pool.
    Internal,
}

impl Error {
    /// The kind of this error (no wildcard: a new variant must be given one).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidName { .. } | Error::InvalidArgument(_) | Error::OutOfRange { .. } => {
                ErrorKind::Invalid
            }
            Error::VolumeNotFound(_) | Error::SnapshotNotFound { .. } => ErrorKind::NotFound,
            Error::VolumeExists(_) | Error::SnapshotExists { .. } => ErrorKind::AlreadyExists,
            Error::Conflict(_) | Error::AmbiguousVolume { .. } => ErrorKind::Conflict,
            Error::ReadOnly(_) => ErrorKind::ReadOnly,
            Error::NoSpace { .. } => ErrorKind::NoSpace,
            Error::Unavailable(_) => ErrorKind::Unavailable,
            Error::Io { .. } | Error::Corrupt { .. } | Error::NotAPool { .. } => {
                ErrorKind::Internal
            }
        }
    }

    pub(crate) fn io(
        op: &'static str,
        path: &std::path::Path,
        offset: u64,
        source: std::io::Error,
    ) -> Self {
        if source.raw_os_error() == Some(libc::ENOSPC)
            || source.raw_os_error() == Some(libc::EDQUOT)
        {
            return Error::NoSpace {
                path: path.to_path_buf(),
                detail: format!("{op} at offset {offset}: {source}"),
            };
        }
        Error::Io {
            op,
            path: path.to_path_buf(),
            offset,
            source,
        }
    }

    /// True when the error means the disk or pool is full (ENOSPC).
    pub fn is_no_space(&self) -> bool {
        self.kind() == ErrorKind::NoSpace
    }

    pub(crate) fn corrupt(block: u64, detail: impl Into<String>) -> Self {
        Error::Corrupt {
            block,
            detail: detail.into(),
        }
    }
}
