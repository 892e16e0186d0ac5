//! Space in the API: the pool's figures (`GET /v1/pool`) and bulk pruning of
//! a volume's snapshots (`POST /v1/volumes/{name}/prune-snapshots`). The
//! figures are the engine's (exact, from the refcounts); what a prune does is
//! `prune.rs`'s: this only reads the request and answers.

use crate::error::Failure;
use crate::extract::{body, St};
use crate::paths::capacity_bytes;
use crate::prune;
use crate::state::blocking;
use axum::extract::rejection::JsonRejection;
use axum::extract::Path;
use axum::Json;
use lamina_api as api;

type R<T> = Result<T, Failure>;

#[utoipa::path(get, path = "/v1/pool",
    responses((status = 200, description = "the pool's space, exact from the refcounts", body = api::PoolSpace),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn pool_space(st: St) -> R<Json<api::PoolSpace>> {
    let s = st.clone();
    let (stats, only) = blocking(move || Ok((s.pool.stats()?, s.pool.snapshot_only()?))).await?;
    let warning = st.space_warning_of(&stats);
    let free = capacity_bytes(&st.layout.root, &stats);
    let capacity = stats.used_bytes.saturating_add(free);
    Ok(Json(api::PoolSpace {
        capacity_bytes: capacity,
        used_bytes: stats.used_bytes,
        free_bytes: free,
        snapshot_only_bytes: only.data_bytes + only.metadata_bytes,
        snapshot_only_metadata_bytes: only.metadata_bytes,
        volumes: stats.volumes,
        snapshots: stats.snapshots,
        high_water: st.high_water.to_string(),
        high_water_bytes: st.high_water.threshold(capacity),
        reclaim_pending: stats.reclaim_pending,
        warnings: warning.into_iter().collect(),
    }))
}

#[utoipa::path(post, path = "/v1/volumes/{name}/prune-snapshots", params(("name" = String, Path, description = "volume name")), request_body = api::PruneSnapshots,
    responses((status = 200, description = "what was deleted (or, in a dry run, would be), what was kept and why, and exactly what it frees", body = api::PruneResult),
        (status = 400, description = "no filter, or a malformed selector", body = api::ApiError),
        (status = 404, description = "no such volume or schedule", body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn prune_snapshots(
    st: St,
    Path(volume): Path<String>,
    b: Result<Json<api::PruneSnapshots>, JsonRejection>,
) -> R<Json<api::PruneResult>> {
    let req = body(b)?;
    Ok(Json(prune::prune(&st, volume, req).await?))
}
