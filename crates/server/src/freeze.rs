//! Frozen snapshots: a snapshot taken while the filesystems on the volumes
//! are frozen where this node's CSI node plugin mounted them, so that it
//! needs no journal replay (docs/csi-node.md, "Frozen snapshots"). The
//! plugin holds the mounts and freezes them, on its socket in this data
//! directory (`lamina_api::freeze`); this module asks it, runs the
//! snapshot, and thaws. It owns no state: a freeze the daemon never thaws
//! (it died) ends at its hold, in the plugin.

use crate::error::Failure;
use crate::state::State;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use lamina_api::freeze::{Freeze, Frozen, Thaw, Thawed, SOCKET};
use lamina_api::{ApiError, ErrorCode};
use std::future::Future;
use std::path::Path;
use std::time::Duration;

/// How long the plugin keeps a freeze if no thaw comes: far above a
/// snapshot's commit (milliseconds), short enough that a daemon killed
/// between the two leaves applications stalled no longer than this.
const HOLD: Duration = Duration::from_secs(10);
/// A plugin that does not answer within this is taken for absent.
const ANSWER: Duration = Duration::from_secs(30);

/// How a frozen snapshot went: its outcome, and whether the freeze had
/// ended (its hold passed) when the thaw came, in which case the snapshot
/// may have been taken after the filesystem was thawed, and the caller
/// must not keep it as a frozen one.
pub struct Taken<T> {
    pub outcome: T,
    pub lapsed: bool,
}

/// The answer to a frozen snapshot whose freeze lapsed, once what it made
/// is deleted: the caller may try again.
pub fn lapsed() -> Failure {
    Failure::new(
        ErrorCode::Unavailable,
        format!(
            "the filesystem's freeze ended (its {} s hold passed) before the snapshot was taken: nothing was kept",
            HOLD.as_secs()
        ),
        Some("try again; a daemon this slow to take a snapshot is short of disk or CPU"),
    )
}

/// Run `snapshot` with `volumes` frozen. A volume that is not attached has
/// no mount to freeze (nothing reaches it through this daemon); an
/// attached one needs the node plugin's freeze service, or the call is
/// refused before anything is taken.
pub async fn frozen<T>(
    st: &State,
    volumes: &[String],
    snapshot: impl Future<Output = Result<T, Failure>>,
) -> Result<Taken<T>, Failure> {
    let attached: Vec<String> = volumes
        .iter()
        .filter(|v| st.is_attached(v))
        .cloned()
        .collect();
    if attached.is_empty() {
        return Ok(Taken {
            outcome: snapshot.await?,
            lapsed: false,
        });
    }
    let socket = st.layout.root.join(SOCKET);
    if !socket.exists() {
        return Err(Failure::new(
            ErrorCode::Conflict,
            format!(
                "cannot freeze {}: attached, and no CSI node plugin serves freezes on this node ({} is absent)",
                attached.join(", "),
                socket.display()
            ),
            Some("take the snapshot without freeze, or freeze the filesystem yourself (fsfreeze)"),
        ));
    }
    let req = Freeze {
        volumes: attached,
        hold_ms: HOLD.as_millis() as u64,
    };
    let f: Frozen = call(&socket, "/v1/freeze", &req).await?;
    tracing::info!(id = f.id, frozen = ?f.frozen, "filesystems frozen for a snapshot");
    let r = snapshot.await;
    // The snapshot was taken before this thaw: if the freeze still held
    // every path now, it held them when the snapshot was taken.
    let thaw = Thaw { id: f.id.clone() };
    let lapsed = match call::<_, Thawed>(&socket, "/v1/thaw", &thaw).await {
        Ok(t) if t.thawed.len() == f.frozen.len() => false,
        Ok(t) => {
            tracing::warn!(id = f.id, thawed = ?t.thawed, frozen = ?f.frozen,
                "the freeze had ended before the thaw: its hold passed while the snapshot was taken");
            true
        }
        Err(e) => {
            // Unknown: taken for lapsed, so that a snapshot is never kept
            // as a frozen one without the plugin's word.
            tracing::error!(id = f.id, error = %e.1, "cannot thaw; the node plugin thaws at the hold's end");
            true
        }
    };
    Ok(Taken {
        outcome: r?,
        lapsed,
    })
}

fn unavailable(socket: &Path, detail: impl std::fmt::Display) -> Failure {
    Failure::new(
        ErrorCode::Unavailable,
        format!(
            "the node plugin's freeze service ({}): {detail}",
            socket.display()
        ),
        Some("is the CSI node plugin running on this node?"),
    )
}

/// One request on the plugin's socket (a connection each: a few a
/// snapshot).
async fn call<Q: serde::Serialize, A: serde::de::DeserializeOwned>(
    socket: &Path,
    path: &str,
    body: &Q,
) -> Result<A, Failure> {
    let go = async {
        let stream = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|e| unavailable(socket, e))?;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| unavailable(socket, e))?;
        tokio::spawn(conn);
        let req = hyper::Request::post(path)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(
                serde_json::to_vec(body).expect("requests encode"),
            )))
            .expect("a valid request");
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| unavailable(socket, e))?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| unavailable(socket, e))?
            .to_bytes();
        if status.is_success() {
            return serde_json::from_slice(&bytes)
                .map_err(|e| unavailable(socket, format!("an answer that does not parse: {e}")));
        }
        match serde_json::from_slice::<ApiError>(&bytes) {
            Ok(e) => Err(Failure::new(
                e.code,
                format!("the node plugin cannot freeze: {}", e.message),
                None,
            )),
            Err(_) => Err(unavailable(socket, format!("status {status}"))),
        }
    };
    tokio::time::timeout(ANSWER, go)
        .await
        .map_err(|_| unavailable(socket, format!("no answer within {ANSWER:?}")))?
}
