//! Errors that end a connection.

use crate::device::IoError;

/// Why a connection ended abnormally. Per-request failures are not errors
/// here: they become NBD error replies and the connection goes on.
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    /// Reading from or writing to the client failed (including the client
    /// vanishing mid-message).
    #[error("connection I/O failed: {0}")]
    Io(#[from] std::io::Error),
    /// The client set handshake flags the server did not offer.
    #[error("client sent unknown handshake flags {0:#x}")]
    ClientFlags(u32),
    /// An option did not start with `IHAVEOPT`.
    #[error("bad option magic {0:#018x}")]
    OptionMagic(u64),
    /// An option's data length is beyond any sensible option.
    #[error("option {option} has absurd length {length} (limit {limit})")]
    OptionTooLong {
        /// The option code.
        option: u32,
        /// The length the client announced.
        length: u32,
        /// The server's limit.
        limit: u32,
    },
    /// NBD_OPT_EXPORT_NAME named an export that does not exist or is not
    /// valid UTF-8; that option cannot fail politely, so the server closes.
    #[error("NBD_OPT_EXPORT_NAME for unknown export {0:?}")]
    UnknownExport(String),
    /// The device behind the chosen export could not report its size.
    #[error("export {name:?} is unavailable: {source}")]
    Export {
        /// The export name.
        name: String,
        /// What the volume said.
        source: IoError,
    },
    /// A request did not start with the request magic.
    #[error("bad request magic {0:#010x}")]
    RequestMagic(u32),
    /// A WRITE announced a payload beyond the maximum; the server cannot
    /// stay in sync with the stream, so it closes.
    #[error("write payload of {length} bytes exceeds the maximum of {max}")]
    PayloadTooLarge {
        /// The announced payload length.
        length: u32,
        /// The server's maximum payload.
        max: u32,
    },
}
