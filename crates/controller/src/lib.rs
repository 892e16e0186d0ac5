//! Lamina inside Kubernetes: the custom resources (`volumes.lamina.io`,
//! `snapshots.lamina.io`, version v1alpha1, in Lamina's namespace) and the
//! controllers that keep them in step with the node daemons. It owns the
//! resource types and their CRDs, the name mapping from engine names to
//! resource names, the mirror (one task per node long-polling the daemon's
//! change feed and writing only the differences, by server-side apply), the
//! Snapshot and Volume reconcilers with their finalizers, their events and
//! metrics, and leader election on a Lease. It reaches the daemons only
//! through `lamina-client` with the tokens kept in Secrets; it must not
//! touch the daemons' data directories, implement storage, or touch
//! Kubernetes objects other than its own resources, their events, its
//! Lease, and (read-only) the node Secrets. The standard snapshot API
//! (VolumeSnapshot and friends) is the CSI driver's business, not this
//! crate's.

pub mod crd;
mod ctx;
mod engine;
mod error;
mod metrics;
mod mirror;
pub mod names;
mod nodes;
pub mod plan;
pub mod replicas;
mod run;
mod snapshot;
mod volume;

pub use crd::{crds, crds_yaml, Snapshot, Volume};
pub use error::Error;
pub use run::{run, Options};

/// The field manager of every server-side apply the controllers make.
pub const MANAGER: &str = "lamina-controller";
/// The finalizer on every Snapshot and Volume.
pub const FINALIZER: &str = "lamina.io/engine";
