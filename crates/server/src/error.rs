//! The daemon's errors, and how engine errors become API errors with an
//! HTTP status, a stable code, and a hint.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use lamina_api::ApiError;
use lamina_engine::Error as E;

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
    #[error("store: {0}")]
    Store(String),
    /// The store failed on an I/O error (a full file system, say) and
    /// cannot be reopened yet (store.rs, `Db`).
    #[error("store unavailable: {0}")]
    StoreUnavailable(String),
    #[error("transfer: {0}")]
    Transfer(#[source] lamina_transfer::TransferError),
    #[error("{0}")]
    Config(String),
}

impl ServerError {
    pub fn io(op: &'static str, path: String, source: std::io::Error) -> Self {
        ServerError::Io { op, path, source }
    }
}

macro_rules! store_err {
    ($($t:ty),*) => {$(
        impl From<$t> for ServerError {
            fn from(e: $t) -> Self {
                ServerError::Store(e.to_string())
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
    redb::CommitError,
    serde_json::Error
);

/// An API error with its status.
#[derive(Debug)]
pub struct Failure(pub StatusCode, pub ApiError);

impl Failure {
    pub fn new(
        status: StatusCode,
        code: &str,
        message: impl Into<String>,
        hint: Option<&str>,
    ) -> Self {
        Failure(
            status,
            ApiError {
                code: code.into(),
                message: message.into(),
                hint: hint.map(Into::into),
            },
        )
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Failure::new(StatusCode::BAD_REQUEST, "invalid", message, None)
    }
    pub fn conflict(message: impl Into<String>, hint: &str) -> Self {
        Failure::new(StatusCode::CONFLICT, "conflict", message, Some(hint))
    }
    pub fn exists(message: impl Into<String>, hint: &str) -> Self {
        Failure::new(StatusCode::CONFLICT, "already_exists", message, Some(hint))
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Failure::new(StatusCode::NOT_FOUND, "not_found", message, None)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Failure::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            message,
            Some("see the daemon's log"),
        )
    }
}

impl From<E> for Failure {
    fn from(e: E) -> Self {
        let msg = e.to_string();
        match e {
            E::InvalidName { .. } | E::InvalidArgument(_) | E::OutOfRange { .. } => {
                Failure::new(StatusCode::BAD_REQUEST, "invalid", msg, None)
            }
            E::VolumeNotFound(_) => Failure::new(
                StatusCode::NOT_FOUND,
                "not_found",
                msg,
                Some("list volumes with `lamina volume list`"),
            ),
            E::SnapshotNotFound { ref volume, .. } => Failure::new(
                StatusCode::NOT_FOUND,
                "not_found",
                msg,
                Some(&format!(
                    "list its snapshots with `lamina snapshot list {volume}`"
                )),
            ),
            E::VolumeExists(_) | E::SnapshotExists { .. } => Failure::new(
                StatusCode::CONFLICT,
                "already_exists",
                msg,
                Some("pick another name"),
            ),
            E::Conflict(_) | E::ReadOnly(_) => {
                Failure::new(StatusCode::CONFLICT, "conflict", msg, None)
            }
            E::AmbiguousVolume { ref references, .. } => Failure::new(
                StatusCode::CONFLICT,
                "conflict",
                msg,
                Some(&format!(
                    "name the deleted volume by name and id, e.g. {}",
                    references.first().map(String::as_str).unwrap_or("NAME@ID")
                )),
            ),
            E::NoSpace { .. } => Failure::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "no_space",
                msg,
                Some("free space by deleting snapshots or volumes"),
            ),
            E::Unavailable(_) => Failure::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                msg,
                Some("restart the daemon: it recovers the pool from its log"),
            ),
            _ => Failure::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                msg,
                Some("see the daemon's log"),
            ),
        }
    }
}

impl From<ServerError> for Failure {
    fn from(e: ServerError) -> Self {
        match e {
            ServerError::Engine(e) => e.into(),
            e @ ServerError::StoreUnavailable(_) => Failure::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                e.to_string(),
                Some("the daemon's records cannot be written: free space on the file system of its data directory (or fix what the message names); the daemon reopens its store at the next call, no restart needed"),
            ),
            other => Failure::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                other.to_string(),
                Some("see the daemon's log"),
            ),
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, axum::Json(self.1)).into_response()
    }
}
