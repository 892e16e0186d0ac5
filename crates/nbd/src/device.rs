//! What the NBD server serves: a block device and a registry of named
//! exports. The server knows nothing else about storage; the daemon adapts
//! Lamina's engine volumes and snapshots to these traits.
//!
//! Device methods are synchronous and may block (they do disk I/O); the
//! server calls them from blocking-capable tasks, never on the async reactor.

use std::sync::Arc;

/// Why a device operation failed; each maps to an NBD error code.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DeviceError {
    /// NBD_EIO
    #[error("I/O error: {0}")]
    Io(String),
    /// NBD_ENOSPC
    #[error("no space left: {0}")]
    NoSpace(String),
    /// NBD_EINVAL (the server checks ranges itself first; this is a backstop)
    #[error("invalid request: {0}")]
    Invalid(String),
    /// NBD_EPERM
    #[error("read-only: {0}")]
    ReadOnly(String),
    /// NBD_ENOTSUP (e.g. a fast zero the device cannot do fast)
    #[error("not supported: {0}")]
    NotSupported(String),
}

/// One extent of a block-status reply (base:allocation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Bytes covered by this extent.
    pub length: u64,
    /// NBD_STATE_HOLE: no storage allocated.
    pub hole: bool,
    /// NBD_STATE_ZERO: reads as zeros.
    pub zero: bool,
}

/// A block device served over NBD.
pub trait BlockDevice: Send + Sync + 'static {
    /// Size in bytes (may change between connections, e.g. after an expand).
    fn size(&self) -> Result<u64, DeviceError>;
    /// Whether writes are refused (the export then advertises READ_ONLY).
    fn read_only(&self) -> bool;
    /// Fill `buf` from `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError>;
    /// Write `data` at `offset`; with `fua`, durable before returning.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), DeviceError>;
    /// Durability barrier for every write completed before it, on every
    /// connection to this device (the server advertises CAN_MULTI_CONN).
    fn flush(&self) -> Result<(), DeviceError>;
    /// Discard a range (reads as zeros afterwards on Lamina).
    fn trim(&self, offset: u64, len: u64) -> Result<(), DeviceError>;
    /// Make a range read as zeros. `may_trim` is false when the client sent
    /// NBD_CMD_FLAG_NO_HOLE.
    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool) -> Result<(), DeviceError>;
    /// Allocation status of [offset, offset+len): extents covering at least
    /// the first byte, in order, none of length 0.
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, DeviceError>;
}

/// The named exports a server offers.
pub trait Exports: Send + Sync + 'static {
    /// The device behind an export name, if any.
    fn lookup(&self, name: &str) -> Option<Arc<dyn BlockDevice>>;
    /// Every export: (name, description), for NBD_OPT_LIST.
    fn list(&self) -> Vec<(String, String)>;
}
