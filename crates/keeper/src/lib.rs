//! The file keeper (`lamina keeper`): a small process beside the daemon
//! that holds the descriptors of the FUSE connections the daemon serves
//! its files on, while the daemon is stopped and started again (a new
//! version, a DaemonSet rollout). A FUSE connection lives while any of its
//! descriptors is open: held here, the files stay mounted, their I/O waits
//! in the kernel, and the next daemon takes the descriptors back and
//! answers it. It owns the keeper's protocol over a Unix socket (`proto`),
//! the keeper's loop (`keeper`) and the daemon's side of it (`client`).
//! It must not know what the descriptors are: FUSE, the volumes, the
//! daemon's records are the caller's; an entry is a key, an opaque token
//! and descriptors.
//!
//! Written by hand: the protocol is Lamina's own (docs/keeper.md gives it
//! byte by byte). Sockets and descriptor passing go through `rustix`.

pub mod client;
pub mod keeper;
pub mod proto;
mod sock;

pub use client::{Client, Held};
pub use keeper::{Keeper, KeeperHandle, DEFAULT_HOLD};
pub use proto::{Message, ProtoError};

/// Why a call to the keeper failed.
#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    /// No keeper answers at the socket.
    #[error("no keeper answers at {path}: {source}")]
    Unreachable {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("talking to the keeper at {path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the keeper at {path} sent a malformed message: {source}")]
    Protocol {
        path: std::path::PathBuf,
        #[source]
        source: ProtoError,
    },
    /// The keeper answered with an error.
    #[error("the keeper at {path} refused: {message}")]
    Refused {
        path: std::path::PathBuf,
        message: String,
    },
    /// Binding the keeper's socket.
    #[error("cannot listen at {path}: {reason}")]
    Bind {
        path: std::path::PathBuf,
        reason: String,
    },
}
