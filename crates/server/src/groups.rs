//! Group snapshots' routes (`/v1/snapshot-groups`): the HTTP side of the
//! group operations (`operations::groups`).

use crate::error::Failure;
use crate::extract::{body, created, removed, St};
use crate::operations::groups::{describe, members};
use crate::operations::{self, Outcome};
use crate::state::blocking;
use crate::store::Op;
use axum::extract::rejection::JsonRejection;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::Json;
use lamina_api as api;

#[utoipa::path(post, path = "/v1/snapshot-groups", request_body = api::CreateSnapshotGroup,
    responses((status = 201, description = "taken: one snapshot of each volume, at one instant", body = api::SnapshotGroup),
        (status = 200, description = "exists already with the same volumes and labels", body = api::SnapshotGroup),
        (status = 400, description = "malformed body, bad name or labels, no volume, a volume named twice", body = api::ApiError),
        (status = 404, description = "a volume is missing", body = api::ApiError),
        (status = 409, description = "a group of that name exists with other volumes or labels, a volume has a plain snapshot of that name, or a full clone is copying into a volume", body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError),
        (status = 507, description = "no space", body = api::ApiError)))]
pub async fn create_snapshot_group(
    st: St,
    b: Result<Json<api::CreateSnapshotGroup>, JsonRejection>,
) -> Result<(StatusCode, Json<api::SnapshotGroup>), Failure> {
    let req = body(b)?;
    operations::groups::check_create(&req.name, &req.volumes, &req.labels)?;
    let mut volumes = req.volumes;
    volumes.sort();
    let frozen = if req.freeze {
        volumes.clone()
    } else {
        Vec::new()
    };
    let op = Op::CreateSnapshotGroup {
        name: req.name.clone(),
        volumes: volumes.clone(),
        labels: req.labels,
    };
    let taken = crate::freeze::frozen(&st, &frozen, operations::run(&st, op)).await?;
    match taken.outcome {
        Outcome::Group { created: true, .. } if taken.lapsed => {
            // Not kept as a frozen group it may not be.
            let name = req.name.clone();
            operations::run(&st, Op::DeleteSnapshotGroup { name, volumes }).await?;
            Err(crate::freeze::lapsed())
        }
        Outcome::Group {
            members,
            created: c,
        } => Ok((created(c), Json(describe(&st, &req.name, members)))),
        _ => Err(Failure::internal("create-snapshot-group yielded no group")),
    }
}

#[utoipa::path(get, path = "/v1/snapshot-groups/{name}", params(("name" = String, Path, description = "group snapshot name")),
    responses((status = 200, description = "its members, ordered by volume name", body = api::SnapshotGroup),
        (status = 404, description = "no snapshot carries the group's label", body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn get_snapshot_group(
    st: St,
    Path(name): Path<String>,
) -> Result<Json<api::SnapshotGroup>, Failure> {
    let s = st.clone();
    blocking(move || {
        let m = members(&s.pool, &name)?;
        if m.is_empty() {
            return Err(Failure::not_found(format!("no group snapshot {name:?}")));
        }
        Ok(Json(describe(&s, &name, m)))
    })
    .await
}

#[utoipa::path(delete, path = "/v1/snapshot-groups/{name}", params(("name" = String, Path, description = "group snapshot name")),
    responses((status = 200, description = "every member deleted (their linked clones keep their data), or there was none (`existed: false`)", body = api::Removed),
        (status = 409, description = "a member is attached, or a full clone is copying from one", body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn delete_snapshot_group(
    st: St,
    Path(name): Path<String>,
) -> Result<Json<api::Removed>, Failure> {
    let what = format!("snapshot group {name}");
    let (s, n) = (st.clone(), name.clone());
    let mut volumes: Vec<String> = blocking(move || {
        Ok(members(&s.pool, &n)?
            .into_iter()
            .map(|m| m.volume)
            .collect())
    })
    .await?;
    if volumes.is_empty() {
        return Ok(Json(api::Removed {
            what,
            existed: false,
            left: None,
        }));
    }
    volumes.sort();
    removed(
        what,
        operations::run(&st, Op::DeleteSnapshotGroup { name, volumes }).await?,
    )
}
