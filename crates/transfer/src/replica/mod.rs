//! Replica sessions: a front end reaches a replica's volume on another node
//! through the data path's trait, over the transfer protocol's TLS and
//! frames (version 2 on, `docs/transfer.md`, "Replica sessions"). One protocol
//! serves both pulls and replicas: the same listener, certificates, frame
//! codec, checksums and limits; a session is a pull or a replica session by
//! its first frame after the Hellos.
//!
//! - The replica's side ([`serve`]): a [`Source`](crate::Source) given
//!   [`Volumes`] answers Attach with a handle the daemon opens, and runs
//!   the Calls on it where the daemon runs volume I/O, through the runners
//!   the NBD server's connections use too (crate `lamina-runners`).
//! - The front end's side ([`RemoteVolume`]): a [`BlockIo`] whose every
//!   operation is a Call on one session, answered by a Reply of the same
//!   tag.
//!
//! Written here rather than taken from an RPC crate (tonic): a call carries
//! a MiB of data that must go into the frame without a copy, and each
//! frame's checksum and limits are checked before anything is allocated,
//! as for the pulls it shares the codec with.

mod client;
pub(crate) mod retire;
pub(crate) mod serve;

pub use client::{retire, RemoteVolume, SessionOptions};
pub use serve::{CALL_BYTES, SESSION_CALLS, SESSION_CALL_BYTES};

use crate::source::{refuse, Refusal, Source};
use crate::wire::Code;
use lamina_blockio::{BlockIo, IoError};
use std::sync::Arc;

/// What a node serves replica sessions from: the daemon's volumes, and the
/// threads its volume I/O runs on.
pub trait Volumes: Send + Sync + 'static {
    /// A new handle to `volume`, never activated, for the front end of node
    /// `peer`. With `create`, a volume of that size is made first if the
    /// node has none of that name (one of another size is an error of kind
    /// [`IoErrorKind::Invalid`](lamina_blockio::IoErrorKind::Invalid)).
    /// A volume this node does not hold is an error of kind
    /// [`IoErrorKind::Gone`](lamina_blockio::IoErrorKind::Gone). Called
    /// from a thread that may block.
    fn open(
        &self,
        volume: &str,
        peer: &str,
        create: Option<u64>,
    ) -> Result<Arc<dyn BlockIo>, IoError>;
    /// Snapshot this node's `volume` as `name` for the front end of node
    /// `peer`, a copy of the snapshot whose identity is `origin`
    /// (`crate::identity`; 0: not said, by a front end of version 2), which
    /// the snapshot keeps as its own ([`crate::identity::ORIGIN_LABEL`]).
    /// One of that name there already is as good if it has that origin (or
    /// none was said); one of another origin is another snapshot, an error
    /// of kind [`IoErrorKind::Invalid`](lamina_blockio::IoErrorKind::Invalid).
    /// With `group` (version 6), it is a member of the group snapshot
    /// `name`, and carries that group's label. Called from a thread that
    /// may block.
    fn snapshot(
        &self,
        volume: &str,
        name: &str,
        origin: u64,
        group: bool,
        peer: &str,
    ) -> Result<(), IoError>;
    /// Delete this node's snapshot `volume`/`name`, made for the front end
    /// of node `peer`; one not there is as good. Called from a thread that
    /// may block.
    fn delete_snapshot(&self, volume: &str, name: &str, peer: &str) -> Result<(), IoError>;
    /// Delete this node's `volume`, made for the front end of node `peer`,
    /// with the snapshots made for it (with `check`, delete nothing: only
    /// say whether there is one to delete): whether it was there. A volume
    /// that is not a replica of `peer`'s (this node's own, or another front
    /// end's) is never deleted: an error of kind
    /// [`IoErrorKind::Invalid`](lamina_blockio::IoErrorKind::Invalid). Called
    /// from a thread that may block.
    fn retire(&self, volume: &str, peer: &str, check: bool) -> Result<bool, IoError>;
    /// The runtime whose blocking threads run the node's volume I/O, at its
    /// priority: a session's calls run there (see [`serve`]), never on an
    /// async reactor, nor on the listener's threads. Called from the
    /// session's task.
    fn runtime(&self) -> tokio::runtime::Handle;
    /// The instance of this node's `volume`, said in Attached (sessions of
    /// version 5): a number that stays the same exactly as long as nothing
    /// the volume acknowledged can be lost, flushed or not (the daemon's
    /// draws it from one drawn when its pool was opened, and the volume's
    /// identity). A front end that finds a replica at the instance it
    /// failed at knows the replica kept every write it answered, and has a
    /// flush make them durable instead of sending them again. None (the
    /// default): not said, and every write no flush covered counts as
    /// possibly lost. Called once the volume is opened.
    fn instance(&self, _volume: &str) -> Option<u64> {
        None
    }
    /// Run `job` (it may block: a snapshot or a snapshot's deletion) on a
    /// thread that may block, at the priority of the node's volume I/O. By
    /// default a blocking task of [`Volumes::runtime`].
    fn run(&self, job: Box<dyn FnOnce() + Send>) {
        self.runtime().spawn_blocking(job);
    }
}

/// The node's volumes for a session opened on `volume` (an Attach's or a
/// Retire's): refused if the node serves no replica sessions, or if the
/// name is not a volume's.
pub(crate) fn served<'a>(
    source: &'a Source,
    volume: &str,
) -> Result<&'a Arc<dyn Volumes>, Refusal> {
    let Some(volumes) = source.volumes() else {
        return Err(refuse(
            Code::NotServed,
            "this node serves no replica sessions",
        ));
    };
    lamina_engine::check_name(volume).map_err(|e| refuse(Code::BadRequest, e.to_string()))?;
    Ok(volumes)
}
