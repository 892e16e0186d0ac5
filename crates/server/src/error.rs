//! The daemon's errors, and how engine errors become API errors with an
//! HTTP status, a stable code, and a hint.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use lamina_api::{ApiError, ErrorCode};
use lamina_engine::{Error as E, ErrorKind};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("another daemon is serving {0}")]
    AlreadyRunning(String),
    #[error("engine: {0}")]
    Engine(#[from] lamina_engine::Error),
    /// The store (redb) failed (boxed: redb's error is large).
    #[error("store: {0}")]
    Store(#[source] Box<redb::Error>),
    /// A record did not encode or decode.
    #[error("store: {what}: {source}")]
    Record {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// The store holds what this daemon cannot read (a newer format, a
    /// record from an older one that does not convert).
    #[error("store: {0}")]
    Unreadable(String),
    /// The store failed on an I/O error (a full file system, say) and
    /// cannot be reopened yet (`store/db.rs`, `Db`).
    #[error("store unavailable: {0}")]
    StoreUnavailable(String),
    #[error("transfer: {0}")]
    Transfer(#[source] lamina_transfer::TransferError),
    /// An operation the daemon finishes at start failed as a request would
    /// have.
    #[error("{0}")]
    Failed(#[source] ApiError),
    /// A task of the daemon's ended without an answer (it panicked).
    #[error("{what}: {source}")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
    #[error("{0}")]
    Config(String),
    /// The replica set's shared record refused a change or could not take
    /// it: nothing changed.
    #[error("volume {volume}: {source}")]
    Shared {
        volume: String,
        #[source]
        source: crate::shared::SharedRecordError,
    },
}

impl ServerError {
    pub fn io(op: &'static str, path: String, source: std::io::Error) -> Self {
        ServerError::Io { op, path, source }
    }

    /// A record named `what` that did not encode or decode.
    pub fn record(what: impl Into<String>) -> impl FnOnce(serde_json::Error) -> Self {
        let what = what.into();
        move |source| ServerError::Record { what, source }
    }
}

macro_rules! store_err {
    ($($t:ty),*) => {$(
        impl From<$t> for ServerError {
            fn from(e: $t) -> Self {
                ServerError::Store(Box::new(e.into()))
            }
        }
    )*};
}
store_err!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

impl From<serde_json::Error> for ServerError {
    fn from(source: serde_json::Error) -> Self {
        ServerError::Record {
            what: "a record".into(),
            source,
        }
    }
}

impl From<Failure> for ServerError {
    fn from(f: Failure) -> Self {
        ServerError::Failed(f.1)
    }
}

/// An API error with its status: the code's own
/// ([`ErrorCode::http_status`]), except for a request the HTTP framework
/// refused, which keeps the framework's (`405`, `413`, `415`...).
#[derive(Debug)]
pub struct Failure(pub StatusCode, pub ApiError);

impl Failure {
    pub fn new(code: ErrorCode, message: impl Into<String>, hint: Option<&str>) -> Self {
        let status =
            StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Failure(
            status,
            ApiError {
                code,
                message: message.into(),
                hint: hint.map(Into::into),
            },
        )
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Failure::new(ErrorCode::Invalid, message, None)
    }
    pub fn conflict(message: impl Into<String>, hint: &str) -> Self {
        Failure::new(ErrorCode::Conflict, message, Some(hint))
    }
    pub fn exists(message: impl Into<String>, hint: &str) -> Self {
        Failure::new(ErrorCode::AlreadyExists, message, Some(hint))
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Failure::new(ErrorCode::NotFound, message, None)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Failure::new(ErrorCode::Internal, message, Some("see the daemon's log"))
    }
}

/// The API code of an engine error's kind (no wildcard: a new kind must be
/// given a code).
pub fn engine_code(kind: ErrorKind) -> ErrorCode {
    match kind {
        ErrorKind::Invalid => ErrorCode::Invalid,
        ErrorKind::NotFound => ErrorCode::NotFound,
        ErrorKind::AlreadyExists => ErrorCode::AlreadyExists,
        ErrorKind::Conflict | ErrorKind::ReadOnly => ErrorCode::Conflict,
        ErrorKind::NoSpace => ErrorCode::NoSpace,
        ErrorKind::Unavailable => ErrorCode::Unavailable,
        ErrorKind::Internal => ErrorCode::Internal,
    }
}

/// What to do about an engine error, when there is something to say
/// beyond its code.
fn engine_hint(e: &E) -> Option<String> {
    Some(match e {
        E::VolumeNotFound(_) => "list volumes with `lamina volume list`".into(),
        E::SnapshotNotFound { volume, .. } => {
            format!("list its snapshots with `lamina snapshot list {volume}`")
        }
        E::VolumeExists(_) | E::SnapshotExists { .. } => "pick another name".into(),
        E::AmbiguousVolume { references, .. } => format!(
            "name the deleted volume by name and id, e.g. {}",
            references.first().map(String::as_str).unwrap_or("NAME@ID")
        ),
        E::NoSpace { .. } => "free space by deleting snapshots or volumes".into(),
        E::Unavailable(_) => "restart the daemon: it recovers the pool from its log".into(),
        E::Io { .. } | E::Corrupt { .. } | E::NotAPool { .. } => "see the daemon's log".into(),
        _ => return None,
    })
}

impl From<E> for Failure {
    fn from(e: E) -> Self {
        let hint = engine_hint(&e);
        Failure::new(engine_code(e.kind()), e.to_string(), hint.as_deref())
    }
}

impl From<ServerError> for Failure {
    fn from(e: ServerError) -> Self {
        match e {
            ServerError::Engine(e) => e.into(),
            ServerError::Failed(a) => Failure::new(a.code, a.message, a.hint.as_deref()),
            e @ ServerError::StoreUnavailable(_) => Failure::new(
                ErrorCode::Unavailable,
                e.to_string(),
                Some("the daemon's records cannot be written: free space on the file system of its data directory (or fix what the message names); the daemon reopens its store at the next call, no restart needed"),
            ),
            ServerError::Shared { volume, source } => {
                use crate::shared::SharedRecordError as S;
                let (code, hint) = match &source {
                    S::Fenced(_) => (ErrorCode::Conflict, "another node's front end serves this volume now; use it there"),
                    S::Unavailable(_) => (ErrorCode::Unavailable, "the Kubernetes API server must answer before this volume's replica set changes; nothing changed, ask again once it does"),
                };
                Failure::new(code, format!("volume {volume}: {source}"), Some(hint))
            }
            other => Failure::internal(other.to_string()),
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, axum::Json(self.1)).into_response()
    }
}
