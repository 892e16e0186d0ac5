//! Lamina's CSI driver (container-storage-interface spec v1.12.0): the
//! identity, controller, group controller and node services, served on a
//! unix socket by `lamina csi`. It owns the gRPC surface, the mapping from
//! CSI's names and ids to Lamina's (docs/csi.md), and on the node side the
//! attaching of a volume's NBD export as a block device, its filesystem and
//! its mounts; and which of the storage nodes a new volume goes to. It
//! must not reach the engine or build daemon requests by
//! hand: every change goes through `lamina-client`, and the rules about
//! volumes and snapshots stay in the daemon.

pub mod proto {
    //! The CSI v1.12.0 messages and services, generated at build time from
    //! the spec's `csi.proto` (see build.rs).
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("csi.v1");
}

mod controller;
mod group;
mod identity;
pub mod ids;
pub mod node;
pub mod nodes;
pub mod placement;
mod serve;
mod status;

pub use controller::ControllerService;
pub use nodes::{NodeSet, NodeSource, StorageNode};
pub use serve::{serve, socket_path, Error, Mode, Options};
pub use status::grpc_code;

/// The driver's name, as CSIDriver objects and StorageClasses name it.
pub const DRIVER_NAME: &str = "lamina.csi.io";
/// The topology key of the node a volume lives on.
pub const TOPOLOGY_KEY: &str = "topology.lamina.io/node";
