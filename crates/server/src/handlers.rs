//! The HTTP/JSON API: thin handlers that parse a request, run it through
//! `apply::run` (recorded, serialised per volume, idempotent by name) or read
//! state, and answer JSON. Errors are `ApiError` bodies with a stable code.

use crate::apply::{self, operation, Outcome};
use crate::error::Failure;
use crate::state::{blocking, State};
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, Request, State as S};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lamina_api as api;
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;

type St = S<Arc<State>>;
type R<T> = Result<T, Failure>;

fn body<T>(b: Result<Json<T>, JsonRejection>) -> R<T> {
    b.map(|Json(v)| v)
        .map_err(|e| Failure::invalid(format!("malformed request body: {}", e.body_text())))
}

pub fn router(state: Arc<State>, tcp: bool) -> Router {
    let r = Router::new()
        .route("/v1/health", get(health))
        .route("/v1/volumes", get(list_volumes).post(create_volume))
        .route("/v1/volumes/{name}", get(get_volume).delete(delete_volume))
        .route("/v1/volumes/{name}/expand", post(expand_volume))
        .route("/v1/volumes/{name}/attach", post(attach_volume))
        .route("/v1/volumes/{name}/detach", post(detach_volume))
        .route("/v1/volumes/{name}/flatten", post(flatten_volume))
        .route(
            "/v1/volumes/{name}/snapshots",
            get(list_snapshots).post(create_snapshot),
        )
        .route(
            "/v1/volumes/{name}/snapshots/{snap}",
            get(get_snapshot).delete(delete_snapshot),
        )
        .route("/v1/volumes/{name}/snapshots/{snap}/revert", post(revert))
        .route(
            "/v1/volumes/{name}/snapshots/{snap}/attach",
            post(attach_snapshot),
        )
        .route(
            "/v1/volumes/{name}/snapshots/{snap}/detach",
            post(detach_snapshot),
        )
        .route("/v1/snapshots", get(list_all_snapshots))
        .route("/v1/clones", post(create_clone))
        .route("/v1/operations", get(list_operations))
        .route("/v1/operations/{id}", get(get_operation))
        .route("/openapi.json", get(openapi))
        .fallback(|| async { Failure::not_found("no such API path (see /openapi.json)") });
    let r = if tcp {
        r.layer(middleware::from_fn_with_state(state.clone(), auth))
    } else {
        r
    };
    r.with_state(state)
}

/// On TCP every request needs `Authorization: Bearer TOKEN` (the token is in
/// the data directory's `token` file).
async fn auth(st: St, req: Request, next: Next) -> Response {
    let want = st.token.as_deref().map(|t| format!("Bearer {t}"));
    let got = req
        .headers()
        .get(api::AUTH_HEADER)
        .and_then(|v| v.to_str().ok());
    match (want, got) {
        (Some(w), Some(g)) if constant_time_eq(w.as_bytes(), g.as_bytes()) => next.run(req).await,
        _ => Failure::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token",
            Some("pass the token from the daemon's data directory (file `token`) with --token or LAMINA_TOKEN"),
        )
        .into_response(),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[utoipa::path(get, path = "/v1/health", responses((status = 200, body = api::Health)))]
pub async fn health(st: St) -> R<Json<api::Health>> {
    let s = st.clone();
    let stats = blocking(move || Ok(s.pool.stats()?)).await?;
    Ok(Json(api::Health {
        version: env!("CARGO_PKG_VERSION").into(),
        data_dir: st.layout.root.display().to_string(),
        nbd_socket: st.layout.nbd_socket.display().to_string(),
        volumes: stats.volumes,
        snapshots: stats.snapshots,
        pool_used_bytes: stats.used_bytes,
    }))
}

#[utoipa::path(get, path = "/v1/volumes", responses((status = 200, body = Vec<api::Volume>)))]
pub async fn list_volumes(st: St) -> R<Json<Vec<api::Volume>>> {
    let s = st.clone();
    blocking(move || {
        Ok(Json(
            s.pool
                .list_volumes()
                .into_iter()
                .map(|v| s.volume(v))
                .collect(),
        ))
    })
    .await
}

#[utoipa::path(post, path = "/v1/volumes", request_body = api::CreateVolume,
    responses((status = 201, body = api::Volume), (status = 200, description = "exists already with the same size", body = api::Volume), (status = 409, body = api::ApiError)))]
pub async fn create_volume(
    st: St,
    b: Result<Json<api::CreateVolume>, JsonRejection>,
) -> R<(StatusCode, Json<api::Volume>)> {
    let req = body(b)?;
    let existed = st.pool.volume_info_by_name(&req.name).is_ok();
    match apply::run(
        &st,
        "create-volume",
        &req.name,
        apply::args_create_volume(&req.name, req.size),
    )
    .await?
    {
        Outcome::Volume(v) => Ok((
            if existed {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            },
            Json(st.volume(v)),
        )),
        _ => unreachable!("create-volume yields a volume"),
    }
}

#[utoipa::path(get, path = "/v1/volumes/{name}", responses((status = 200, body = api::Volume), (status = 404, body = api::ApiError)))]
pub async fn get_volume(st: St, Path(name): Path<String>) -> R<Json<api::Volume>> {
    let s = st.clone();
    blocking(move || Ok(Json(s.volume(s.pool.volume_info_by_name(&name)?)))).await
}

#[derive(Deserialize)]
pub struct DeleteParams {
    #[serde(default)]
    with_snapshots: bool,
}

#[utoipa::path(delete, path = "/v1/volumes/{name}", params(("with_snapshots" = Option<bool>, Query, description = "delete its snapshots too")),
    responses((status = 204), (status = 409, body = api::ApiError)))]
pub async fn delete_volume(
    st: St,
    Path(name): Path<String>,
    Query(q): Query<DeleteParams>,
) -> R<StatusCode> {
    apply::run(
        &st,
        "delete-volume",
        &name,
        json!({"name": name, "with_snapshots": q.with_snapshots}),
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

fn volume_out(st: &State, o: Outcome) -> Json<api::Volume> {
    match o {
        Outcome::Volume(v) | Outcome::Clone(v, _) => Json(st.volume(v)),
        _ => unreachable!("operation yields a volume"),
    }
}

#[utoipa::path(post, path = "/v1/volumes/{name}/expand", request_body = api::ExpandVolume, responses((status = 200, body = api::Volume)))]
pub async fn expand_volume(
    st: St,
    Path(name): Path<String>,
    b: Result<Json<api::ExpandVolume>, JsonRejection>,
) -> R<Json<api::Volume>> {
    let req = body(b)?;
    let o = apply::run(
        &st,
        "expand-volume",
        &name,
        json!({"name": name, "size": req.size}),
    )
    .await?;
    Ok(volume_out(&st, o))
}

#[utoipa::path(post, path = "/v1/volumes/{name}/flatten", responses((status = 202, body = api::Volume)))]
pub async fn flatten_volume(
    st: St,
    Path(name): Path<String>,
) -> R<(StatusCode, Json<api::Volume>)> {
    let o = apply::run(&st, "flatten", &name, json!({"name": name})).await?;
    Ok((StatusCode::ACCEPTED, volume_out(&st, o)))
}

#[utoipa::path(post, path = "/v1/volumes/{name}/attach", responses((status = 200, body = api::Export)))]
pub async fn attach_volume(st: St, Path(name): Path<String>) -> R<Json<api::Export>> {
    let lock = st.lock(&name);
    let _g = lock.lock().await;
    let s = st.clone();
    blocking(move || {
        let v = s.volume(s.pool.volume_info_by_name(&name)?);
        if v.clone_state == api::CloneState::Copying {
            return Err(Failure::conflict(
                format!("volume {name:?} is still being copied"),
                "wait for the clone to finish (lamina volume get NAME)",
            ));
        }
        Ok(Json(s.attach(&name, None)?))
    })
    .await
}

#[utoipa::path(post, path = "/v1/volumes/{name}/detach", responses((status = 204)))]
pub async fn detach_volume(st: St, Path(name): Path<String>) -> R<StatusCode> {
    let lock = st.lock(&name);
    let _g = lock.lock().await;
    if !st.detach(&name, None)? {
        return Err(Failure::not_found(format!(
            "volume {name:?} is not attached"
        )));
    }
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/v1/volumes/{name}/snapshots", responses((status = 200, body = Vec<api::Snapshot>)))]
pub async fn list_snapshots(st: St, Path(name): Path<String>) -> R<Json<Vec<api::Snapshot>>> {
    let s = st.clone();
    blocking(move || {
        Ok(Json(
            s.pool
                .list_snapshots(&name)?
                .into_iter()
                .map(|x| s.snapshot(x))
                .collect(),
        ))
    })
    .await
}

#[utoipa::path(get, path = "/v1/snapshots", responses((status = 200, body = Vec<api::Snapshot>)))]
pub async fn list_all_snapshots(st: St) -> R<Json<Vec<api::Snapshot>>> {
    let s = st.clone();
    blocking(move || {
        Ok(Json(
            s.pool
                .list_all_snapshots()?
                .into_iter()
                .map(|x| s.snapshot(x))
                .collect(),
        ))
    })
    .await
}

#[utoipa::path(post, path = "/v1/volumes/{name}/snapshots", request_body = api::CreateSnapshot,
    responses((status = 201, body = api::Snapshot), (status = 200, description = "exists already", body = api::Snapshot)))]
pub async fn create_snapshot(
    st: St,
    Path(name): Path<String>,
    b: Result<Json<api::CreateSnapshot>, JsonRejection>,
) -> R<(StatusCode, Json<api::Snapshot>)> {
    let req = body(b)?;
    let existed = st.pool.snapshot_info_by_name(&name, &req.name).is_ok();
    let o = apply::run(
        &st,
        "create-snapshot",
        &name,
        json!({"volume": name, "name": req.name, "labels": req.labels}),
    )
    .await?;
    match o {
        Outcome::Snapshot(s) => Ok((
            if existed {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            },
            Json(st.snapshot(s)),
        )),
        _ => unreachable!("create-snapshot yields a snapshot"),
    }
}

#[utoipa::path(get, path = "/v1/volumes/{name}/snapshots/{snap}", responses((status = 200, body = api::Snapshot)))]
pub async fn get_snapshot(
    st: St,
    Path((name, snap)): Path<(String, String)>,
) -> R<Json<api::Snapshot>> {
    let s = st.clone();
    blocking(move || {
        Ok(Json(
            s.snapshot(s.pool.snapshot_info_by_name(&name, &snap)?),
        ))
    })
    .await
}

#[utoipa::path(delete, path = "/v1/volumes/{name}/snapshots/{snap}", responses((status = 204)))]
pub async fn delete_snapshot(st: St, Path((name, snap)): Path<(String, String)>) -> R<StatusCode> {
    apply::run(
        &st,
        "delete-snapshot",
        &name,
        json!({"volume": name, "name": snap}),
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/volumes/{name}/snapshots/{snap}/revert", responses((status = 200, body = api::Volume)))]
pub async fn revert(st: St, Path((name, snap)): Path<(String, String)>) -> R<Json<api::Volume>> {
    let o = apply::run(
        &st,
        "revert",
        &name,
        json!({"volume": name, "snapshot": snap}),
    )
    .await?;
    Ok(volume_out(&st, o))
}

#[utoipa::path(post, path = "/v1/volumes/{name}/snapshots/{snap}/attach", responses((status = 200, body = api::Export)))]
pub async fn attach_snapshot(
    st: St,
    Path((name, snap)): Path<(String, String)>,
) -> R<Json<api::Export>> {
    let s = st.clone();
    blocking(move || Ok(Json(s.attach(&name, Some(&snap))?))).await
}

#[utoipa::path(post, path = "/v1/volumes/{name}/snapshots/{snap}/detach", responses((status = 204)))]
pub async fn detach_snapshot(st: St, Path((name, snap)): Path<(String, String)>) -> R<StatusCode> {
    if !st.detach(&name, Some(&snap))? {
        return Err(Failure::not_found(format!(
            "snapshot {name}/{snap} is not attached"
        )));
    }
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/clones", request_body = api::CreateClone,
    responses((status = 201, body = api::CloneCreated), (status = 202, description = "a full clone: the copy runs in the background", body = api::CloneCreated)))]
pub async fn create_clone(
    st: St,
    b: Result<Json<api::CreateClone>, JsonRejection>,
) -> R<(StatusCode, Json<api::CloneCreated>)> {
    let req = body(b)?;
    let args = json!({"name": req.name, "from_snapshot": req.from_snapshot, "from_volume": req.from_volume, "full": req.full});
    match apply::run(&st, "clone", &req.name, args).await? {
        Outcome::Clone(v, op) => {
            let operation = match &op {
                Some(id) => st
                    .store
                    .op(id)
                    .map_err(Failure::from)?
                    .map(|r| operation(&st, &r)),
                None => None,
            };
            let status = if op.is_some() {
                StatusCode::ACCEPTED
            } else {
                StatusCode::CREATED
            };
            Ok((
                status,
                Json(api::CloneCreated {
                    volume: st.volume(v),
                    operation,
                }),
            ))
        }
        _ => unreachable!("clone yields a volume"),
    }
}

#[utoipa::path(get, path = "/v1/operations", responses((status = 200, body = Vec<api::Operation>)))]
pub async fn list_operations(st: St) -> R<Json<Vec<api::Operation>>> {
    let mut ops: Vec<api::Operation> = st
        .store
        .ops()
        .map_err(Failure::from)?
        .iter()
        .map(|r| operation(&st, r))
        .collect();
    ops.sort_by(|a, b| a.started.cmp(&b.started));
    Ok(Json(ops))
}

#[utoipa::path(get, path = "/v1/operations/{id}", responses((status = 200, body = api::Operation)))]
pub async fn get_operation(st: St, Path(id): Path<String>) -> R<Json<api::Operation>> {
    match st.store.op(&id).map_err(Failure::from)? {
        Some(r) => Ok(Json(operation(&st, &r))),
        None => Err(Failure::not_found(format!("no operation {id:?}"))),
    }
}

pub async fn openapi() -> impl IntoResponse {
    Json(crate::openapi::document())
}
