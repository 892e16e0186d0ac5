//! What the HTTP handlers share: the state extractor, the body extractor,
//! and the statuses of a create and a remove. The HTTP layer only: nothing
//! below it imports this.

use crate::error::Failure;
use crate::operations::Outcome;
use crate::state::State;
use axum::extract::rejection::JsonRejection;
use axum::extract::State as S;
use axum::http::StatusCode;
use axum::Json;
use lamina_api as api;
use std::sync::Arc;

pub(crate) type St = S<Arc<State>>;
pub(crate) type R<T> = Result<T, Failure>;

pub(crate) fn body<T>(b: Result<Json<T>, JsonRejection>) -> R<T> {
    b.map(|Json(v)| v)
        .map_err(|e| Failure::invalid(format!("malformed request body: {}", e.body_text())))
}

pub(crate) fn created(c: bool) -> StatusCode {
    if c {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    }
}

pub(crate) fn removed(what: String, o: Outcome) -> R<Json<api::Removed>> {
    match o {
        Outcome::Removed(existed) => Ok(Json(api::Removed {
            what,
            existed,
            left: None,
        })),
        Outcome::RemovedLeaving(left) => Ok(Json(api::Removed {
            what,
            existed: true,
            left: Some(left),
        })),
        _ => Err(Failure::internal("a delete yielded something else")),
    }
}
