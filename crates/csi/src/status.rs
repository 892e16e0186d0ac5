//! From the daemon's answers to CSI's gRPC status codes. The daemon's error
//! codes map one to one onto the codes the CSI spec names for each case
//! ([`grpc_code`]); callers override where an RPC gives a case its own code.

use lamina_api::ErrorCode;
use lamina_client::Error;
use tonic::{Code, Status};

/// The gRPC code of a daemon error code (no wildcard: a new code must be
/// given one; docs/csi.md and docs/daemon.md list them).
pub fn grpc_code(c: &ErrorCode) -> Code {
    match c {
        ErrorCode::Invalid => Code::InvalidArgument,
        ErrorCode::NotFound => Code::NotFound,
        ErrorCode::AlreadyExists => Code::AlreadyExists,
        ErrorCode::Conflict => Code::FailedPrecondition,
        ErrorCode::NoSpace => Code::ResourceExhausted,
        ErrorCode::Unavailable => Code::Unavailable,
        // The driver's token is wrong: an operator must fix it.
        ErrorCode::Unauthorized => Code::Unauthenticated,
        // Two nodes do not accept each other's transfer certificates (a
        // restore from another node): no retry helps until an operator
        // issues them from one CA.
        ErrorCode::Refused => Code::FailedPrecondition,
        // A code from a newer daemon: a failure this driver cannot classify.
        ErrorCode::Internal | ErrorCode::Unknown(_) => Code::Internal,
    }
}

/// The status for a failed daemon call, with the daemon's message and hint.
pub fn from_client(e: &Error) -> Status {
    let code = match e {
        Error::Api { error, .. } => grpc_code(&error.code),
        // No daemon answered, or it died mid-call: the CO retries.
        Error::Unreachable { .. } | Error::ConnectionClosed { .. } => Code::Unavailable,
        Error::Protocol { .. } | Error::Endpoint { .. } => Code::Internal,
    };
    Status::new(code, message(e))
}

/// The daemon's message and, when there is one, its hint.
pub fn message(e: &Error) -> String {
    match e.hint() {
        Some(h) => format!("{e} ({h})"),
        None => e.to_string(),
    }
}

/// A shorthand for `Err(Status::invalid_argument(..))` with a formatted text.
macro_rules! invalid {
    ($($t:tt)*) => { Err(tonic::Status::invalid_argument(format!($($t)*))) };
}
pub(crate) use invalid;
