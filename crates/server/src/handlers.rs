//! The HTTP/JSON API's handlers of volumes, snapshots, clones, operations,
//! the change feed and the daemon's health and metrics: thin handlers that
//! parse a request, run it through `operations` (recorded, serialised per
//! volume, idempotent by name) or read state, and answer JSON. Every
//! handler's parameters and statuses are declared for `/openapi.json`
//! (`openapi.rs`); `router.rs` routes to them.

use crate::error::Failure;
use crate::extract::{body, created, removed, St, R};
use crate::operations::{self, Outcome};
use crate::paths::capacity_bytes;
use crate::schedules::refuse_schedule_labels;
use crate::state::{blocking, State};
use crate::store::Op;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lamina_api as api;
use serde::Deserialize;
use std::sync::Arc;

#[utoipa::path(get, path = "/v1/health",
    responses((status = 200, body = api::Health), (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn health(st: St) -> R<Json<api::Health>> {
    // A store broken by an I/O error is retried here too: health answers
    // 503 with the reason while it cannot be reopened.
    let s = st.clone();
    blocking(move || s.store.check().map_err(Failure::from)).await?;
    let s = st.clone();
    let stats = blocking(move || Ok(s.pool.stats()?)).await?;
    let warning = st.space_warning_of(&stats);
    let capacity = capacity_bytes(&st.layout.root, &stats);
    Ok(Json(api::Health {
        version: env!("CARGO_PKG_VERSION").into(),
        data_dir: st.layout.root.display().to_string(),
        nbd_socket: st.layout.nbd_socket.display().to_string(),
        volumes: stats.volumes,
        snapshots: stats.snapshots,
        pool_used_bytes: stats.used_bytes,
        capacity_bytes: capacity,
        warnings: warning
            .map(|w| format!("{w}: scheduled snapshots pause until it drops below"))
            .into_iter()
            .collect(),
    }))
}

/// What new data can still take: the pool's free blocks, plus the room its
/// filesystem has to grow it, up to the pool's cap.
#[utoipa::path(get, path = "/metrics",
    responses((status = 200, description = "Prometheus text exposition: operations, schedule runs, pool space", content_type = "text/plain", body = String),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn metrics(st: St) -> R<Response> {
    let s = st.clone();
    let stats = blocking(move || Ok(s.pool.stats()?)).await?;
    let capacity = stats
        .used_bytes
        .saturating_add(capacity_bytes(&st.layout.root, &stats));
    let text = st
        .metrics
        .encode(stats.used_bytes, capacity, stats.volumes, stats.snapshots);
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

#[utoipa::path(get, path = "/v1/volumes", params(api::VolumeFilter),
    responses((status = 200, body = Vec<api::Volume>), (status = 400, description = "a malformed selector", body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn list_volumes(st: St, Query(f): Query<api::VolumeFilter>) -> R<Json<Vec<api::Volume>>> {
    let selector = match &f.selector {
        Some(s) => api::LabelSelector::parse(s).map_err(|e| Failure::invalid(e.to_string()))?,
        None => api::LabelSelector::default(),
    };
    let s = st.clone();
    blocking(move || {
        Ok(Json(
            s.pool
                .list_volumes()
                .into_iter()
                .filter(|v| selector.matches(&v.labels.iter().cloned().collect()))
                .map(|v| s.volume(v))
                .chain(
                    crate::front::diskless_sets(&s.store, &s.pool)?
                        .into_iter()
                        .filter(|_| selector.matches(&Default::default()))
                        .map(|(name, rec)| s.diskless_volume(name, rec)),
                )
                .collect(),
        ))
    })
    .await
}

#[utoipa::path(put, path = "/v1/volumes/{name}/labels", params(("name" = String, Path, description = "volume name")),
    request_body = api::SetLabels,
    responses((status = 200, description = "its labels replaced", body = api::Volume),
        (status = 400, description = "bad labels (or the reserved lamina.io/ prefix)", body = api::ApiError),
        (status = 404, body = api::ApiError), (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn set_volume_labels(
    st: St,
    Path(name): Path<String>,
    b: Result<Json<api::SetLabels>, JsonRejection>,
) -> R<Json<api::Volume>> {
    let req = body(b)?;
    let op = Op::SetVolumeLabels {
        name,
        labels: req.labels,
    };
    volume_out(&st, operations::run(&st, op).await?).await
}

#[utoipa::path(post, path = "/v1/volumes", request_body = api::CreateVolume,
    responses((status = 201, description = "created", body = api::Volume),
        (status = 200, description = "exists already with the same size", body = api::Volume),
        (status = 400, description = "malformed body, bad name, or a size that is not a whole number of 512-byte sectors", body = api::ApiError),
        (status = 404, description = "a replica's node is not in the node list", body = api::ApiError),
        (status = 409, description = "exists with another size or other replicas", body = api::ApiError),
        (status = 500, body = api::ApiError),
        (status = 503, description = "a replica's node could not make its replica", body = api::ApiError),
        (status = 507, description = "no space", body = api::ApiError)))]
pub async fn create_volume(
    st: St,
    b: Result<Json<api::CreateVolume>, JsonRejection>,
) -> R<(StatusCode, Json<api::Volume>)> {
    let req = body(b)?;
    let op = Op::CreateVolume {
        name: req.name,
        size: req.size,
        labels: req.labels,
        replicas: req.replicas,
    };
    match operations::run(&st, op).await? {
        Outcome::Volume { info, created: c } => Ok((created(c), Json(describe(&st, info).await?))),
        _ => Err(Failure::internal("create-volume yielded no volume")),
    }
}

/// The API's view of a volume (reads its usage from the pool).
async fn describe(st: &Arc<State>, v: lamina_engine::VolumeInfo) -> R<api::Volume> {
    let s = st.clone();
    blocking(move || Ok(s.volume(v))).await
}

#[utoipa::path(get, path = "/v1/volumes/{name}", params(("name" = String, Path, description = "volume name")),
    responses((status = 200, body = api::Volume), (status = 404, body = api::ApiError), (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn get_volume(st: St, Path(name): Path<String>) -> R<Json<api::Volume>> {
    let s = st.clone();
    blocking(move || match s.pool.volume_info_by_name(&name) {
        Ok(v) => Ok(Json(s.volume(v))),
        Err(e) => match crate::front::replica_set(&s.store, &s.pool, &name)? {
            Some(rec) if rec.diskless => Ok(Json(s.diskless_volume(name, rec))),
            _ => Err(e.into()),
        },
    })
    .await
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteParams {
    /// Delete the volume's snapshots with it.
    #[serde(default)]
    with_snapshots: bool,
}

#[utoipa::path(delete, path = "/v1/volumes/{name}", params(("name" = String, Path, description = "volume name"), DeleteParams),
    responses((status = 200, description = "deleted, or was already absent (`existed: false`)", body = api::Removed),
        (status = 400, body = api::ApiError),
        (status = 409, description = "attached (it or one of its snapshots), or a full clone is copying into it or from one of its snapshots", body = api::ApiError),
        (status = 500, body = api::ApiError),
        (status = 503, description = "the pool or store cannot change now; or a node holding one of a replicated volume's replicas cannot delete it (nothing was deleted)", body = api::ApiError)))]
pub async fn delete_volume(
    st: St,
    Path(name): Path<String>,
    Query(q): Query<DeleteParams>,
) -> R<Json<api::Removed>> {
    let what = format!("volume {name}");
    let op = Op::DeleteVolume {
        name,
        with_snapshots: q.with_snapshots,
    };
    removed(what, operations::run(&st, op).await?)
}

async fn volume_out(st: &Arc<State>, o: Outcome) -> R<Json<api::Volume>> {
    match o {
        Outcome::Volume { info, .. } | Outcome::Started { info, .. } => {
            Ok(Json(describe(st, info).await?))
        }
        _ => Err(Failure::internal("operation yielded no volume")),
    }
}

#[utoipa::path(post, path = "/v1/volumes/{name}/expand", params(("name" = String, Path, description = "volume name")), request_body = api::ExpandVolume,
    responses((status = 200, description = "expanded; NBD clients connected now keep the old size until they reconnect", body = api::Volume),
        (status = 400, description = "malformed body, a smaller size (shrinking is not supported), or not whole sectors", body = api::ApiError),
        (status = 404, body = api::ApiError), (status = 500, body = api::ApiError), (status = 503, body = api::ApiError),
        (status = 507, description = "no space", body = api::ApiError)))]
pub async fn expand_volume(
    st: St,
    Path(name): Path<String>,
    b: Result<Json<api::ExpandVolume>, JsonRejection>,
) -> R<Json<api::Volume>> {
    let req = body(b)?;
    let o = operations::run(
        &st,
        Op::ExpandVolume {
            name,
            size: req.size,
        },
    )
    .await?;
    volume_out(&st, o).await
}

#[utoipa::path(post, path = "/v1/volumes/{name}/flatten", params(("name" = String, Path, description = "volume name")),
    responses((status = 202, description = "the flatten runs in the background: follow `operation`", body = api::Volume),
        (status = 404, body = api::ApiError), (status = 409, description = "not a linked clone", body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn flatten_volume(
    st: St,
    Path(name): Path<String>,
) -> R<(StatusCode, Json<api::Volume>)> {
    let o = operations::run(&st, Op::Flatten { name }).await?;
    Ok((StatusCode::ACCEPTED, volume_out(&st, o).await?))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AttachParams {
    /// Also serve it as a file on the daemon's host (`DATA/files/NAME`,
    /// through FUSE), for a loop device. A node that serves no files
    /// answers 503, and the call leaves nothing attached.
    #[serde(default)]
    file: bool,
    /// This node holds a replica of another node's volume, whose node is
    /// lost: take the volume over (its replica must be healthy in the
    /// shared record of replica sets), then attach it here. The old front
    /// end is refused by every replica from then on.
    #[serde(default)]
    take_over: bool,
}

#[utoipa::path(post, path = "/v1/volumes/{name}/attach", params(("name" = String, Path, description = "volume name"), AttachParams),
    responses((status = 200, description = "exported over NBD, and as a file if asked (attaching twice is harmless)", body = api::Export),
        (status = 400, body = api::ApiError),
        (status = 404, body = api::ApiError), (status = 409, description = "a full clone is still copying into it", body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, description = "the pool or store is latched, or a file was asked of a node that serves none", body = api::ApiError)))]
pub async fn attach_volume(
    st: St,
    Path(name): Path<String>,
    Query(q): Query<AttachParams>,
) -> R<Json<api::Export>> {
    Ok(Json(
        operations::exports::attach_or_take(&st, name, None, q.file, q.take_over).await?,
    ))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DetachParams {
    /// Detach even while NBD clients are connected or its file is in use
    /// (they get I/O errors from then on; what they wrote is flushed first).
    #[serde(default)]
    force: bool,
}

#[utoipa::path(post, path = "/v1/volumes/{name}/detach", params(("name" = String, Path, description = "volume name"), DetachParams),
    responses((status = 200, description = "no longer exported, or was not (`existed: false`)", body = api::Removed),
        (status = 400, body = api::ApiError),
        (status = 409, description = "NBD clients are connected, or its file is in use (and `force` was not given)", body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn detach_volume(
    st: St,
    Path(name): Path<String>,
    Query(q): Query<DetachParams>,
) -> R<Json<api::Removed>> {
    Ok(Json(
        operations::exports::detach(&st, name, None, q.force).await?,
    ))
}

#[utoipa::path(get, path = "/v1/volumes/{name}/snapshots", params(("name" = String, Path, description = "volume name")),
    responses((status = 200, description = "oldest first", body = Vec<api::Snapshot>), (status = 404, body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
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

#[utoipa::path(get, path = "/v1/snapshots", params(api::SnapshotFilter),
    responses((status = 200, description = "the snapshots of every volume that match the filters, oldest first", body = Vec<api::Snapshot>),
        (status = 400, description = "a malformed query, or an id past its maximum", body = api::ApiError),
        (status = 404, description = "no schedule of that name (`schedule`)", body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn list_all_snapshots(
    st: St,
    Query(f): Query<api::SnapshotFilter>,
) -> R<Json<Vec<api::Snapshot>>> {
    let s = st.clone();
    blocking(move || {
        let schedule = match &f.schedule {
            Some(name) => Some(s.store.schedule_id(name)?),
            None => None,
        };
        Ok(Json(
            s.pool
                .find_snapshots(f.name.as_deref(), f.id)?
                .into_iter()
                .filter(|x| {
                    schedule.as_ref().is_none_or(|id| {
                        x.labels
                            .iter()
                            .any(|(k, v)| k == api::SCHEDULE_LABEL && v == id)
                    })
                })
                .map(|x| s.snapshot(x))
                .collect(),
        ))
    })
    .await
}

#[utoipa::path(post, path = "/v1/volumes/{name}/snapshots", params(("name" = String, Path, description = "volume name")), request_body = api::CreateSnapshot,
    responses((status = 201, description = "taken", body = api::Snapshot),
        (status = 200, description = "exists already with the same labels", body = api::Snapshot),
        (status = 400, description = "malformed body, bad name or labels", body = api::ApiError),
        (status = 404, description = "no such volume", body = api::ApiError),
        (status = 409, description = "exists with other labels", body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError),
        (status = 507, description = "no space", body = api::ApiError)))]
pub async fn create_snapshot(
    st: St,
    Path(name): Path<String>,
    b: Result<Json<api::CreateSnapshot>, JsonRejection>,
) -> R<(StatusCode, Json<api::Snapshot>)> {
    let req = body(b)?;
    refuse_schedule_labels(&req.labels)?;
    let volumes = if req.freeze {
        vec![name.clone()]
    } else {
        Vec::new()
    };
    let (volume, snap) = (name.clone(), req.name.clone());
    let op = Op::CreateSnapshot {
        volume: name,
        name: req.name,
        labels: req.labels,
    };
    let taken = crate::freeze::frozen(&st, &volumes, operations::run(&st, op)).await?;
    match taken.outcome {
        Outcome::Snapshot { created: true, .. } if taken.lapsed => {
            // Not kept as a frozen snapshot it may not be.
            operations::run(&st, Op::DeleteSnapshot { volume, name: snap }).await?;
            Err(crate::freeze::lapsed())
        }
        Outcome::Snapshot { info, created: c } => Ok((created(c), Json(st.snapshot(info)))),
        _ => Err(Failure::internal("create-snapshot yielded no snapshot")),
    }
}

#[utoipa::path(get, path = "/v1/volumes/{name}/snapshots/{snap}",
    params(("name" = String, Path, description = "volume name"), ("snap" = String, Path, description = "snapshot name")),
    responses((status = 200, body = api::Snapshot), (status = 404, body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
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

#[utoipa::path(delete, path = "/v1/volumes/{name}/snapshots/{snap}",
    params(("name" = String, Path, description = "volume name"), ("snap" = String, Path, description = "snapshot name")),
    responses((status = 200, description = "deleted (its linked clones keep their data), or was already absent (`existed: false`)", body = api::Removed),
        (status = 409, description = "attached, or a full clone is copying from it", body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn delete_snapshot(
    st: St,
    Path((name, snap)): Path<(String, String)>,
) -> R<Json<api::Removed>> {
    let what = format!("snapshot {name}/{snap}");
    let op = Op::DeleteSnapshot {
        volume: name,
        name: snap,
    };
    removed(what, operations::run(&st, op).await?)
}

#[utoipa::path(post, path = "/v1/volumes/{name}/replicas", params(("name" = String, Path, description = "volume name")),
    request_body = api::AddReplica,
    responses((status = 201, description = "added: made on its node and faulted until its rebuild (a full sparse copy) ends; `lamina replica list` shows the copy", body = api::Volume),
        (status = 200, description = "the volume has a replica on that node already", body = api::Volume),
        (status = 400, description = "malformed body, this node, no transfer identity, or 3 replicas already", body = api::ApiError),
        (status = 404, description = "no such volume, or the node is not in the node list", body = api::ApiError),
        (status = 409, description = "a volume of one replica that is attached", body = api::ApiError),
        (status = 500, body = api::ApiError),
        (status = 503, description = "the node could not make its replica", body = api::ApiError)))]
pub async fn add_replica(
    st: St,
    Path(name): Path<String>,
    b: Result<Json<api::AddReplica>, JsonRejection>,
) -> R<(StatusCode, Json<api::Volume>)> {
    let req = body(b)?;
    let o = operations::run(
        &st,
        Op::AddReplica {
            volume: name,
            node: req.node,
        },
    )
    .await?;
    let status = match &o {
        operations::Outcome::Volume { created: true, .. } => StatusCode::CREATED,
        _ => StatusCode::OK,
    };
    Ok((status, volume_out(&st, o).await?))
}

#[utoipa::path(delete, path = "/v1/volumes/{name}/replicas/{node}",
    params(("name" = String, Path, description = "volume name"), ("node" = String, Path, description = "the replica's node")),
    responses((status = 200, description = "removed, and its volume on that node deleted; or removed, and `left` says what stays on that node and why (a node that could not delete it); or the volume had no replica there (`existed: false`)", body = api::Removed),
        (status = 400, description = "this node's replica (the front end's)", body = api::ApiError),
        (status = 404, description = "no such volume", body = api::ApiError),
        (status = 409, description = "the volume's only healthy replica", body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn remove_replica(
    st: St,
    Path((name, node)): Path<(String, String)>,
) -> R<Json<api::Removed>> {
    let what = format!("replica of volume {name} on node {node}");
    let op = Op::RemoveReplica { volume: name, node };
    removed(what, operations::run(&st, op).await?)
}

#[utoipa::path(post, path = "/v1/volumes/{name}/snapshots/{snap}/revert",
    params(("name" = String, Path, description = "volume name"), ("snap" = String, Path, description = "snapshot name")),
    responses((status = 200, body = api::Volume), (status = 404, body = api::ApiError),
        (status = 409, description = "the volume is attached", body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn revert(st: St, Path((name, snap)): Path<(String, String)>) -> R<Json<api::Volume>> {
    let o = operations::run(
        &st,
        Op::Revert {
            volume: name,
            snapshot: snap,
        },
    )
    .await?;
    volume_out(&st, o).await
}

#[utoipa::path(post, path = "/v1/volumes/{name}/snapshots/{snap}/attach",
    params(("name" = String, Path, description = "volume name"), ("snap" = String, Path, description = "snapshot name"), AttachParams),
    responses((status = 200, description = "exported read-only over NBD, and as a file if asked (attaching twice is harmless)", body = api::Export),
        (status = 400, body = api::ApiError),
        (status = 404, body = api::ApiError), (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn attach_snapshot(
    st: St,
    Path((name, snap)): Path<(String, String)>,
    Query(q): Query<AttachParams>,
) -> R<Json<api::Export>> {
    // Under the volume's lock: a snapshot being deleted cannot be attached.
    Ok(Json(
        operations::exports::attach(&st, name, Some(snap), q.file).await?,
    ))
}

#[utoipa::path(post, path = "/v1/volumes/{name}/snapshots/{snap}/detach",
    params(("name" = String, Path, description = "volume name"), ("snap" = String, Path, description = "snapshot name"), DetachParams),
    responses((status = 200, description = "no longer exported, or was not (`existed: false`)", body = api::Removed),
        (status = 400, body = api::ApiError),
        (status = 409, description = "NBD clients are connected, or its file is in use (and `force` was not given)", body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn detach_snapshot(
    st: St,
    Path((name, snap)): Path<(String, String)>,
    Query(q): Query<DetachParams>,
) -> R<Json<api::Removed>> {
    Ok(Json(
        operations::exports::detach(&st, name, Some(snap), q.force).await?,
    ))
}

#[utoipa::path(post, path = "/v1/clones", request_body = api::CreateClone,
    responses((status = 201, description = "a linked clone, made", body = api::CloneCreated),
        (status = 200, description = "exists already, from the same source", body = api::CloneCreated),
        (status = 202, description = "a full clone (or a clone from another node): the copy runs in the background", body = api::CloneCreated),
        (status = 400, description = "malformed body or bad name; not exactly one source; from another node without a snapshot, or without a transfer identity", body = api::ApiError),
        (status = 404, description = "the source is missing (here, or on the other node)", body = api::ApiError),
        (status = 403, description = "from another node: the peers refused each other's certificates", body = api::ApiError),
        (status = 409, description = "a volume of that name exists and is not this clone", body = api::ApiError),
        (status = 500, body = api::ApiError),
        (status = 503, description = "the daemon is latched; or from another node: it is unreachable, broke the protocol, or a copy failed", body = api::ApiError),
        (status = 507, description = "no space", body = api::ApiError)))]
pub async fn create_clone(
    st: St,
    b: Result<Json<api::CreateClone>, JsonRejection>,
) -> R<(StatusCode, Json<api::CloneCreated>)> {
    let mut req = body(b)?;
    if let Some(node) = req.from_node.take() {
        let s = st.clone();
        req.from_node = Some(blocking(move || crate::nodes::resolve(&s, node)).await?);
    }
    let op = operations::clone_op(req)?;
    let Outcome::Started {
        info,
        created: c,
        running,
    } = operations::run(&st, op).await?
    else {
        return Err(Failure::internal("clone yielded no volume"));
    };
    let s = st.clone();
    let operation = match running.clone() {
        Some(id) => blocking(move || Ok(s.store.op(&id)?.map(|r| s.operation(&r)))).await?,
        None => None,
    };
    let status = match (&running, c) {
        (Some(_), true) => StatusCode::ACCEPTED,
        (_, c) => created(c),
    };
    Ok((
        status,
        Json(api::CloneCreated {
            volume: describe(&st, info).await?,
            operation,
        }),
    ))
}

#[utoipa::path(get, path = "/v1/operations", params(api::OperationFilter),
    responses((status = 200, description = "newest first", body = Vec<api::Operation>),
        (status = 400, description = "a malformed query, or a limit past its maximum", body = api::ApiError),
        (status = 500, body = api::ApiError)))]
pub async fn list_operations(
    st: St,
    Query(f): Query<api::OperationFilter>,
) -> R<Json<Vec<api::Operation>>> {
    let s = st.clone();
    blocking(move || {
        Ok(Json(
            s.operations(&f)?.iter().map(|r| s.operation(r)).collect(),
        ))
    })
    .await
}

#[utoipa::path(get, path = "/v1/operations/{id}", params(("id" = String, Path, description = "operation id")),
    responses((status = 200, body = api::Operation), (status = 404, body = api::ApiError), (status = 500, body = api::ApiError)))]
pub async fn get_operation(st: St, Path(id): Path<String>) -> R<Json<api::Operation>> {
    let s = st.clone();
    blocking(move || match s.store.op(&id)? {
        Some(r) => Ok(Json(s.operation(&r))),
        None => Err(Failure::not_found(format!("no operation {id:?}"))),
    })
    .await
}

#[utoipa::path(get, path = "/v1/changes", params(api::ChangesQuery),
    responses((status = 200, description = "the epoch and sequence now: past `after` if anything changed", body = api::Changes),
        (status = 400, description = "a malformed query, or `wait_ms` or `after` past its maximum", body = api::ApiError),
        (status = 500, body = api::ApiError)))]
pub async fn changes(st: St, Query(q): Query<api::ChangesQuery>) -> R<Json<api::Changes>> {
    Ok(Json(st.changes.wait(&q).await))
}
