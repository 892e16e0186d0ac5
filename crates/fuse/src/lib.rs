//! Lamina's FUSE server: one volume of the data path ([`lamina_blockio`])
//! served as one regular file on the host, for a loop device to turn into a
//! block device (the CSI node path) in one hop, without an NBD socket or a
//! second process. It owns the kernel protocol's subset a single file needs
//! (`proto`), the mount and the connection (`mount`), and the reader
//! threads that answer the kernel from the volume's completions (`server`).
//! It must not know the engine, the daemon's records, NBD or Kubernetes.
//!
//! Written by hand, not with a FUSE crate: the crates at hand are built
//! around a filesystem of inodes and synchronous replies, and this server
//! answers from completions that come out of order on other threads, on
//! one file whose size is the volume's. docs/fuse.md specifies the protocol
//! subset byte by byte and lists the invariants with the test of each.

pub mod mount;
pub mod proto;
pub mod server;

pub use mount::{abort, connection_of, is_mounted, unmount, Mount, MountError};
pub use server::{errno, FileServer, Handover, Options, ServeError, DRAIN_WAIT};
