//! The crate's error type, and the short reason the daemon shows for it.

use crate::wire::{Code, WireError};
use std::path::PathBuf;

/// Why a transfer failed, in the words a Volume's status uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The snapshot is not on the source (or was deleted and made again).
    SnapshotMissing,
    /// The source could not be reached, or went away.
    SourceUnreachable,
    /// The target pool is full.
    NoSpace,
    /// Authentication failed, on either side.
    Refused,
    /// The peer broke the protocol (or speaks another version).
    Protocol,
    /// A frame failed its checksum.
    Checksum,
    /// A local or remote I/O error, or a bad argument.
    Io,
}

impl Reason {
    /// A few words for a status line ("snapshot missing").
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::SnapshotMissing => "snapshot missing",
            Reason::SourceUnreachable => "source unreachable",
            Reason::NoSpace => "no space",
            Reason::Refused => "refused",
            Reason::Protocol => "protocol error",
            Reason::Checksum => "checksum mismatch",
            Reason::Io => "i/o error",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything that can go wrong in a transfer, with its context.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// Reading the TLS identity's files or making certificates.
    #[error("TLS identity {path}: {detail}")]
    Identity { path: PathBuf, detail: String },
    #[error("cannot reach source {address}: {source}")]
    Unreachable {
        address: String,
        #[source]
        source: std::io::Error,
    },
    /// The TLS handshake failed or the peer refused our certificate.
    #[error("{peer}: authentication refused: {detail}")]
    Refused { peer: String, detail: String },
    /// The peer broke the protocol.
    #[error("{peer}: protocol error: {detail}")]
    Protocol { peer: String, detail: String },
    /// A frame failed its checksum; nothing of it was applied.
    #[error("{peer}: {source}")]
    Checksum {
        peer: String,
        #[source]
        source: WireError,
    },
    /// The source answered with an Error frame.
    #[error("{peer} refused {volume}/{snapshot}: {message} ({code:?})")]
    Remote {
        peer: String,
        volume: String,
        snapshot: String,
        code: Code,
        message: String,
    },
    /// The connection failed mid-transfer.
    #[error("{peer}: connection lost: {source}")]
    Connection {
        peer: String,
        #[source]
        source: std::io::Error,
    },
    /// The local engine refused or failed.
    #[error("{context}: {source}")]
    Engine {
        context: String,
        #[source]
        source: lamina_engine::Error,
    },
    /// A bad argument (a volume too small for the snapshot, a bad name).
    #[error("{0}")]
    Invalid(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl TransferError {
    /// The short reason for a status line.
    pub fn reason(&self) -> Reason {
        match self {
            TransferError::Identity { .. } => Reason::Refused,
            TransferError::Unreachable { .. } => Reason::SourceUnreachable,
            TransferError::Refused { .. } => Reason::Refused,
            TransferError::Protocol { .. } => Reason::Protocol,
            TransferError::Checksum { .. } => Reason::Checksum,
            TransferError::Remote { code, .. } => match code {
                Code::SnapshotMissing | Code::SnapshotReplaced | Code::VolumeMissing => {
                    Reason::SnapshotMissing
                }
                // Both pass: a pull retries them within its window.
                Code::ShuttingDown | Code::Busy => Reason::SourceUnreachable,
                Code::SourceIo => Reason::Io,
                // Not this node's to ask: a refusal, as of a certificate.
                Code::NotReplica => Reason::Refused,
                Code::Version | Code::BadRequest | Code::NotServed | Code::Other(_) => {
                    Reason::Protocol
                }
            },
            TransferError::Connection { .. } => Reason::SourceUnreachable,
            TransferError::Engine { source, .. } => match source {
                lamina_engine::Error::NoSpace { .. } => Reason::NoSpace,
                lamina_engine::Error::SnapshotNotFound { .. } => Reason::SnapshotMissing,
                _ => Reason::Io,
            },
            TransferError::Invalid(_) | TransferError::Io { .. } => Reason::Io,
        }
    }

    pub(crate) fn engine(context: impl Into<String>, source: lamina_engine::Error) -> Self {
        TransferError::Engine {
            context: context.into(),
            source,
        }
    }
}
