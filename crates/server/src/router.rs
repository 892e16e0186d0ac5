//! The HTTP/JSON API's router: every route to its handler, the bearer
//! token on TCP, one tracing span per request, and an `ApiError` body on
//! every error, whatever produced it (a handler, a malformed path or
//! query, an unknown route or method). It also serves `/openapi.json`.

use crate::error::Failure;
use crate::extract::St;
use crate::handlers::{self, *};
use crate::state::State;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lamina_api as api;
use std::sync::Arc;
use tracing::Instrument;

pub fn router(state: Arc<State>, tcp: bool) -> Router {
    let r = Router::new()
        .route("/v1/health", get(health))
        .route("/v1/volumes", get(list_volumes).post(create_volume))
        .route("/v1/volumes/{name}", get(get_volume).delete(delete_volume))
        .route("/v1/volumes/{name}/expand", post(expand_volume))
        .route(
            "/v1/volumes/{name}/labels",
            axum::routing::put(set_volume_labels),
        )
        .route("/v1/volumes/{name}/attach", post(attach_volume))
        .route("/v1/volumes/{name}/detach", post(detach_volume))
        .route("/v1/volumes/{name}/flatten", post(flatten_volume))
        .route("/v1/volumes/{name}/replicas", post(add_replica))
        .route(
            "/v1/volumes/{name}/replicas/{node}",
            axum::routing::delete(remove_replica),
        )
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
        .route(
            "/v1/volumes/{name}/prune-snapshots",
            post(crate::space::prune_snapshots),
        )
        .route("/v1/pool", get(crate::space::pool_space))
        .route("/v1/snapshots", get(list_all_snapshots))
        .route(
            "/v1/snapshot-groups",
            post(crate::groups::create_snapshot_group),
        )
        .route(
            "/v1/snapshot-groups/{name}",
            get(crate::groups::get_snapshot_group).delete(crate::groups::delete_snapshot_group),
        )
        .route(
            "/v1/schedules",
            get(crate::schedules::api::list_schedules).post(crate::schedules::api::create_schedule),
        )
        .route(
            "/v1/schedules/{name}",
            get(crate::schedules::api::get_schedule)
                .put(crate::schedules::api::update_schedule)
                .delete(crate::schedules::api::delete_schedule),
        )
        .route("/v1/clones", post(create_clone))
        .route(
            "/v1/nodes",
            get(crate::nodes::list_nodes).post(crate::nodes::add_node),
        )
        .route(
            "/v1/nodes/{name}",
            get(crate::nodes::get_node).delete(crate::nodes::remove_node),
        )
        .route("/v1/operations", get(list_operations))
        .route("/v1/changes", get(handlers::changes))
        .route("/v1/operations/{id}", get(get_operation))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .fallback(|| async { Failure::not_found("no such API path (see /openapi.json)") });
    let r = if tcp {
        r.layer(middleware::from_fn_with_state(state.clone(), auth))
    } else {
        r
    };
    r.layer(middleware::from_fn(json_errors))
        .layer(middleware::from_fn(trace_request))
        .with_state(state)
}

/// One span per request; operations open theirs (with the operation id)
/// inside it.
async fn trace_request(req: Request, next: Next) -> Response {
    let span = tracing::info_span!("request", method = %req.method(), path = %req.uri().path());
    async move {
        let resp = next.run(req).await;
        tracing::debug!(status = resp.status().as_u16(), "answered");
        resp
    }
    .instrument(span)
    .await
}

/// Error answers that did not come from a handler (a malformed path or
/// query, a method the route lacks) get an `ApiError` body too.
async fn json_errors(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let text = match axum::body::to_bytes(resp.into_body(), 64 << 10).await {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_string(),
        Err(_) => String::new(),
    };
    let message = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("request failed")
            .to_string()
    } else {
        text
    };
    // The framework's status stays (405, 413, 415...); the code is the
    // one that status falls under.
    let code = match status {
        StatusCode::NOT_FOUND => api::ErrorCode::NotFound,
        s if s.is_server_error() => api::ErrorCode::Internal,
        _ => api::ErrorCode::Invalid,
    };
    let error = api::ApiError {
        code,
        message,
        hint: None,
    };
    Failure(status, error).into_response()
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
            api::ErrorCode::Unauthorized,
            "missing or wrong bearer token",
            Some("pass the token from the daemon's data directory (file `token`) with --token or LAMINA_TOKEN"),
        )
        .into_response(),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn openapi() -> impl IntoResponse {
    Json(crate::openapi::document())
}
