//! The replica's side of a Retire (version 4): a front end deletes the
//! volume this node holds as its replica, in place of attaching to it. The
//! node's [`Volumes`](super::Volumes) decides (only a volume made for that
//! front end, with the snapshots made for it); this answers Retired, or an
//! Error whose code says why, and the session ends.

use crate::source::{refuse, Ended, Refusal, Source};
use crate::wire::{Code, Frame};
use lamina_blockio::IoErrorKind;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tracing::info;

/// Answer a Retire of `volume` from `node`'s front end (`check`: delete
/// nothing, say whether it is there).
pub(crate) async fn serve(
    source: &Source,
    tls: &mut TlsStream<TcpStream>,
    node: &str,
    volume: String,
    check: bool,
) -> Result<Ended, Refusal> {
    let volumes = super::served(source, &volume)?;
    let (v, peer, name) = (volumes.clone(), node.to_string(), volume.clone());
    let done = tokio::task::spawn_blocking(move || v.retire(&name, &peer, check))
        .await
        .map_err(|e| refuse(Code::SourceIo, format!("deleting the volume failed: {e}")))?;
    let existed = done.map_err(|e| match e.kind {
        IoErrorKind::Invalid => refuse(Code::NotReplica, e.message),
        _ => refuse(Code::SourceIo, e.to_string()),
    })?;
    if !check {
        info!(volume = %volume, peer = node, existed, "replica: volume retired");
    }
    // The caller closes the session once it is answered.
    Ok(source.send(tls, &Frame::Retired { existed }).await)
}
