//! The node plugin's freeze service: what the daemon asks the CSI node
//! plugin of its node, on the unix socket `DATA_DIR/freeze.sock`, to take
//! a snapshot of a mounted volume with its filesystem frozen
//! (docs/csi-node.md, "Frozen snapshots"). HTTP/1 and JSON like the
//! daemon's own API: `POST /v1/freeze` with [`Freeze`], answered with
//! [`Frozen`]; `POST /v1/thaw` with [`Thaw`], answered with [`Thawed`];
//! errors as [`crate::ApiError`].

use serde::{Deserialize, Serialize};

/// The socket's file name in the daemon's data directory.
pub const SOCKET: &str = "freeze.sock";
/// The longest a freeze may be asked to last.
pub const MAX_HOLD_MS: u64 = 60_000;

/// Freeze the filesystems the node plugin mounted from these volumes
/// (staged with mount access); a volume it has not mounted has nothing to
/// freeze. All or none: if one cannot be frozen, those frozen already are
/// thawed and the call fails.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Freeze {
    /// Lamina volume names.
    pub volumes: Vec<String>,
    /// The plugin thaws them itself this long after freezing, if no thaw
    /// came by then (the daemon died, or hangs); at most [`MAX_HOLD_MS`].
    pub hold_ms: u64,
}

/// What a freeze did: an id to thaw with, and the staging paths frozen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frozen {
    /// Names this freeze for [`Thaw`]; a later thaw of an earlier id
    /// touches nothing.
    pub id: String,
    /// The filesystems frozen, by volume: `(volume, staging path)`.
    pub frozen: Vec<(String, String)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Thaw {
    pub id: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Thawed {
    /// The staging paths thawed now: none when the freeze had ended
    /// already (thawed at its hold's end).
    pub thawed: Vec<String>,
}
