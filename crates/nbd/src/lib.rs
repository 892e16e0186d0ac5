//! An NBD server (fixed newstyle handshake, structured replies, block status)
//! over the data path's volume trait, [`BlockIo`] (crate `lamina-blockio`).
//! It owns the wire protocol only: it must not know about Lamina's engine,
//! pools or the daemon. Written by hand because no
//! permissively licensed async Rust crate offers a server with structured
//! replies (see shared/reference/facts.md).
//!
//! Use [`serve_unix`] or [`serve_tcp`] for a listener, or
//! [`serve_connection`] for one already-connected stream. What the server
//! implements (options, commands, flags, errors, ordering) is described in
//! `docs/nbd.md`.

#![warn(missing_docs)]

mod bufs;
mod device;
mod error;
mod exec;
mod handshake;
#[cfg(any(test, feature = "testing"))]
pub mod mem;
pub mod proto;
mod runner;
mod server;
mod transmission;
mod writer;

#[cfg(test)]
mod testkit;

pub use device::{BlockIo, Caps, Exports, Extent, InlineIo, IoError, IoErrorKind};
pub use error::NbdError;
pub use server::{serve_connection, serve_tcp, serve_unix, ServerOptions};
