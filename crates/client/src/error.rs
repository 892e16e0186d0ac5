//! What can go wrong talking to the daemon: its own refusal (status and
//! `ApiError`), not reaching it at all, losing the connection before the
//! answer (the daemon stopped or died mid-call), or an answer that breaks
//! the API's contract. Every message names where the daemon was looked for.

use hyper::StatusCode;
use lamina_api::{ApiError, ErrorCode};

/// Why the daemon could not be reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unreachable {
    /// Nothing at the socket path: no daemon has run with that data directory.
    NoSocket,
    /// The socket or port is there but nobody accepts: the daemon is not running.
    Refused,
    /// The caller may not open the unix socket (it belongs to the daemon's user).
    PermissionDenied,
    /// Anything else, as the system put it.
    Other(String),
}

impl Unreachable {
    /// Classify a failed connect.
    pub fn from_io(e: &std::io::Error) -> Unreachable {
        match e.kind() {
            std::io::ErrorKind::NotFound => Unreachable::NoSocket,
            std::io::ErrorKind::ConnectionRefused => Unreachable::Refused,
            std::io::ErrorKind::PermissionDenied => Unreachable::PermissionDenied,
            _ => Unreachable::Other(e.to_string()),
        }
    }
}

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unreachable::NoSocket => f.write_str("no socket there"),
            Unreachable::Refused => f.write_str("connection refused"),
            Unreachable::PermissionDenied => f.write_str("permission denied"),
            Unreachable::Other(s) => f.write_str(s),
        }
    }
}

/// An error from a [`crate::Client`] call.
///
/// `Display` gives one line without the daemon's hint (see [`Error::hint`]),
/// so that a caller printing the message and the hint shows each once.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The daemon answered with an error status and its `ApiError` body.
    #[error("{}", .error.message)]
    Api { status: StatusCode, error: ApiError },
    /// No connection to the daemon.
    #[error("cannot reach the Lamina daemon at {target} ({reason})")]
    Unreachable { target: String, reason: Unreachable },
    /// The connection closed before the whole answer came: the daemon
    /// stopped or died during the call. Unlike [`Error::Unreachable`], the
    /// request may have been carried out; asking again finds out.
    #[error("the Lamina daemon at {target} closed the connection before answering ({detail}); the request may or may not have been carried out")]
    ConnectionClosed { target: String, detail: String },
    /// The exchange failed or the answer is not what the API promises.
    #[error("the Lamina daemon at {target}: {detail}")]
    Protocol {
        target: String,
        /// The status, when an answer came at all.
        status: Option<StatusCode>,
        detail: String,
    },
    /// An endpoint that is not `http://HOST:PORT[/PREFIX]`.
    #[error("endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
}

impl Error {
    /// The HTTP status of the daemon's answer, when there was one.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Error::Api { status, .. } => Some(*status),
            Error::Protocol { status, .. } => *status,
            _ => None,
        }
    }

    /// The daemon's error body, when it refused the request.
    pub fn api(&self) -> Option<&ApiError> {
        match self {
            Error::Api { error, .. } => Some(error),
            _ => None,
        }
    }

    /// The daemon's stable error code, when it refused the request.
    pub fn code(&self) -> Option<&ErrorCode> {
        self.api().map(|e| &e.code)
    }

    /// The daemon's hint: what to do about it.
    pub fn hint(&self) -> Option<&str> {
        self.api().and_then(|e| e.hint.as_deref())
    }

    /// The daemon answered 404: no such volume, snapshot or operation.
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(StatusCode::NOT_FOUND)
    }

    /// The daemon answered 409: the request conflicts with the current state.
    pub fn is_conflict(&self) -> bool {
        self.status() == Some(StatusCode::CONFLICT)
    }

    /// The daemon serves no files (`attach` with a file, answered 503 with
    /// [`lamina_api::FILES_REFUSED`]): use the export's NBD URI instead.
    pub fn is_files_refused(&self) -> bool {
        self.status() == Some(StatusCode::SERVICE_UNAVAILABLE)
            && self
                .api()
                .is_some_and(|e| e.message.starts_with(lamina_api::FILES_REFUSED))
    }

    /// No answer from the daemon, for want of one running: it could not be
    /// reached, or its connection closed mid-call. Trying again later is
    /// the remedy.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            Error::Unreachable { .. } | Error::ConnectionClosed { .. }
        )
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_failures_are_classified() {
        use std::io::{Error as Io, ErrorKind as K};
        assert_eq!(
            Unreachable::from_io(&Io::from(K::NotFound)),
            Unreachable::NoSocket
        );
        assert_eq!(
            Unreachable::from_io(&Io::from(K::ConnectionRefused)),
            Unreachable::Refused
        );
        assert_eq!(
            Unreachable::from_io(&Io::from(K::PermissionDenied)),
            Unreachable::PermissionDenied
        );
        assert!(matches!(
            Unreachable::from_io(&Io::other("no route")),
            Unreachable::Other(s) if s == "no route"
        ));
    }

    #[test]
    fn api_errors_show_the_message_once_and_keep_the_hint_apart() {
        let e = Error::Api {
            status: StatusCode::CONFLICT,
            error: ApiError {
                code: ErrorCode::Conflict,
                message: "volume \"a\" is attached".into(),
                hint: Some("detach it first".into()),
            },
        };
        assert_eq!(e.to_string(), "volume \"a\" is attached");
        assert_eq!(e.hint(), Some("detach it first"));
        assert_eq!(e.code(), Some(&ErrorCode::Conflict));
        assert!(e.is_conflict() && !e.is_not_found());
        let u = Error::Unreachable {
            target: "/d/api.sock".into(),
            reason: Unreachable::PermissionDenied,
        };
        assert_eq!(
            u.to_string(),
            "cannot reach the Lamina daemon at /d/api.sock (permission denied)"
        );
        assert_eq!(u.status(), None);
        assert_eq!(u.hint(), None);
    }
}
