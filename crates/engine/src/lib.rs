//! Lamina's storage engine. It owns a **pool** (one directory on a node's
//! disk: a block file and a write-ahead log) holding thin **volumes**,
//! their **snapshots** and **linked clones**. Each volume and snapshot is one
//! copy-on-write radix tree over a shared, refcounted block space: a
//! snapshot or clone is O(1) (one more reference on a root), reads and
//! writes cost the same at any snapshot depth, and deleting frees exactly
//! the blocks nothing else references, copying no data. Metadata changes
//! commit atomically through the log; `docs/on-disk-format.md` gives every
//! byte and `docs/design.md` the reasoning.
//!
//! The engine knows nothing of NBD, HTTP, Kubernetes or the daemon's own
//! records: it must not grow a network protocol or a scheduler. Those live in
//! other crates and call this API.

mod cache;
mod catalog;
mod check;
mod commit;
mod copy;
pub mod error;
mod extents;
mod flatten;
mod flusher;
pub mod format;
mod group;
mod home;
mod io;
mod journal;
mod latch;
mod meta;
mod ops;
mod order;
mod pool;
mod replay;
pub mod sim;
mod space;
pub mod storage;
mod tree;
mod wal;

pub use check::CheckReport;
pub use copy::{Applier, CopyControl, CopyEnd, CopyProgress};
pub use error::{Error, ErrorKind, IoFailure, Result};
pub use extents::{Chunk, Export, Extent, ExtentKind, Piece, Target};
pub use format::{
    check_labels, check_name, check_volume_reference, BLOCK, LABELS_MAX_BYTES, LABEL_KEY_MAX_LEN,
    LABEL_OVERHEAD, LABEL_PATTERN, LABEL_VALUE_MAX_LEN, NAME_MAX_LEN, NAME_PATTERN, NAME_RULE,
    VOLUME_REFERENCE_PATTERN,
};
pub use group::GROUP_LABEL;
pub use io::Volume;
pub use ops::{
    is_system_name, round_up_size, CloneState, Freed, OfflineStats, OfflineVolume, OriginInfo,
    PoolStats, SnapshotInfo, Usage, VolumeInfo, MAX_VOLUME_SIZE, SECTOR, SYSTEM_PREFIX,
};
pub use pool::{FlattenProgress, Pool, PoolOptions, JOURNAL_FILE, POOL_FILE, WAL_FILE};
