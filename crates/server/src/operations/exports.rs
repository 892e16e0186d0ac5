//! Attaching and detaching exports. They take the volume's lock, so that
//! an attach cannot race the deletion of what it exports, nor a detach an
//! attach, and run to their end whether or not their caller still waits
//! (`State::to_end`), like the recorded operations; they leave no
//! operation record (the store's `exports` table brings exports back at
//! start).

use crate::error::Failure;
use crate::state::{blocking, snapshot_export, State};
use lamina_api as api;
use std::sync::Arc;

/// Export volume `volume` (or its `snapshot`, read-only) over NBD, and
/// with `file` as a file on this host too; attaching twice is harmless. A
/// volume a full clone is still copying into is refused.
pub async fn attach(
    st: &Arc<State>,
    volume: String,
    snapshot: Option<String>,
    file: bool,
) -> Result<api::Export, Failure> {
    attach_or_take(st, volume, snapshot, file, false).await
}

/// [`attach`], and with `take_over` this node's replica of another node's
/// volume takes it over first (`super::replicas::take_over`), as does a
/// node holding no replica of it (its front end then reaches them all).
pub async fn attach_or_take(
    st: &Arc<State>,
    volume: String,
    snapshot: Option<String>,
    file: bool,
    take_over: bool,
) -> Result<api::Export, Failure> {
    let s = st.clone();
    st.to_end(async move {
        let lock = s.lock(&volume);
        let _g = lock.lock().await;
        let s2 = s.clone();
        blocking(move || {
            if snapshot.is_none() {
                // A volume this node fronts holding no replica of it, or
                // takes over so, has no volume here.
                let here = s2.pool.volume_info_by_name(&volume);
                if let Err(e) = here {
                    let diskless = crate::front::replica_set(&s2.store, &s2.pool, &volume)?
                        .is_some_and(|r| r.diskless);
                    if !(take_over || diskless) {
                        return Err(e.into());
                    }
                }
                if let Some(id) = s2.running_copy_into(&volume) {
                    return Err(Failure::conflict(
                        format!("volume {volume:?} is still being copied (operation {id})"),
                        &format!("wait for the clone to finish: lamina operation wait {id}"),
                    ));
                }
            }
            if take_over && snapshot.is_none() {
                super::replicas::take_over(&s2, &volume)?;
            }
            s2.attach(&volume, snapshot.as_deref(), file)
        })
        .await
    })
    .await
}

/// Stop exporting a volume or snapshot (see `State::detach` for `force`).
pub async fn detach(
    st: &Arc<State>,
    volume: String,
    snapshot: Option<String>,
    force: bool,
) -> Result<api::Removed, Failure> {
    let s = st.clone();
    st.to_end(async move {
        let lock = s.lock(&volume);
        let _g = lock.lock().await;
        let what = match &snapshot {
            None => format!("export {volume}"),
            Some(x) => format!("export {}", snapshot_export(&volume, x)),
        };
        let s2 = s.clone();
        let existed = blocking(move || s2.detach(&volume, snapshot.as_deref(), force)).await?;
        Ok(api::Removed {
            what,
            existed,
            left: None,
        })
    })
    .await
}
