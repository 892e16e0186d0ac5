//! What the NBD server serves: volumes on the data path's one trait
//! ([`lamina_blockio::BlockIo`]) and a registry of named exports. The server
//! knows nothing else about storage; the daemon adapts Lamina's engine
//! volumes and snapshots to that trait.
//!
//! The server submits operations from its runner threads, which may block,
//! and takes each reply from the operation's completion, whenever and on
//! whichever thread it comes (see `runner.rs`).

use std::sync::Arc;

pub use lamina_blockio::{BlockIo, Caps, Extent, InlineIo, IoError, IoErrorKind};

/// The named exports a server offers.
pub trait Exports: Send + Sync + 'static {
    /// The volume behind an export name, if any. The server holds what this
    /// returns for as long as the client's session lasts.
    fn lookup(&self, name: &str) -> Option<Arc<dyn BlockIo>>;
    /// Every export: (name, description), for NBD_OPT_LIST.
    fn list(&self) -> Vec<(String, String)>;
}
