//! Lamina's cross-node transfer protocol. A volume restored or cloned onto
//! another node pulls the source snapshot's allocated extents from the node
//! that holds it: this crate owns that wire protocol (its frames, their
//! checksums, its version handshake) and its mutual TLS (node identities,
//! certificates, verification), on both sides: [`Source`] serves a pool's
//! snapshots, [`pull_into`] and [`describe`] are the target. It must not
//! touch what others own: the engine owns the data (this crate only calls
//! its export and apply API), and the daemon owns scheduling, job records,
//! progress reporting and when a snapshot may be deleted (it asks
//! [`Source::readers`]). The protocol is described byte by byte in
//! `docs/transfer.md`.

pub mod certs;
mod conn;
mod error;
mod frames;
pub mod identity;
mod pull;
pub mod replica;
mod source;
mod tls;
pub mod wire;

pub use conn::Remote;
pub use error::{Reason, TransferError};
pub use pull::{describe, pull_into, pull_into_counting, Pull, Pulled, RemoteSnapshot};
pub use source::{Holders, Limits, Pace, Source, SESSION_FRAMES};
pub use tls::{cert_node, Identity, CA_FILE, CERT_FILE, KEY_FILE};
pub use wire::Holder;
