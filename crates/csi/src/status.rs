//! From the daemon's answers to CSI's gRPC status codes. The daemon's error
//! codes (`invalid`, `not_found`, `already_exists`, `conflict`, `no_space`,
//! ...) map one to one onto the codes the CSI spec names for each case;
//! callers override where an RPC gives a case its own code.

use lamina_client::Error;
use tonic::{Code, Status};

/// The status for a failed daemon call, with the daemon's message and hint.
pub fn from_client(e: &Error) -> Status {
    let code = match e {
        Error::Api { .. } => match e.code().unwrap_or("") {
            "invalid" => Code::InvalidArgument,
            "not_found" => Code::NotFound,
            "already_exists" => Code::AlreadyExists,
            "conflict" => Code::FailedPrecondition,
            "no_space" => Code::ResourceExhausted,
            "unavailable" => Code::Unavailable,
            // The driver's token is wrong: an operator must fix it.
            "unauthorized" => Code::Unauthenticated,
            // Two nodes do not accept each other's transfer certificates
            // (a restore from another node): no retry helps until an
            // operator issues them from one CA.
            "refused" => Code::FailedPrecondition,
            _ => Code::Internal,
        },
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
