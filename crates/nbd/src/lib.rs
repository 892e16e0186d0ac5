//! An NBD server (fixed newstyle handshake, structured replies, block status)
//! over the [`BlockDevice`] trait. It owns the wire protocol only: it must not
//! know about Lamina's engine, pools or the daemon. Written by hand because no
//! permissively licensed async Rust crate offers a server with structured
//! replies (see shared/reference/facts.md).

mod device;

pub use device::{BlockDevice, DeviceError, Exports, Extent};
