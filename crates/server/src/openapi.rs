//! The OpenAPI document the daemon serves at `/openapi.json`, generated from
//! the handlers' annotations and the API types so that it cannot drift.

use crate::changes::*;
use crate::groups::*;
use crate::handlers::*;
use crate::schedules::api::*;
use crate::space::*;
use lamina_api as api;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Lamina",
        description = "Thin volumes, instant snapshots and clones, exported over NBD."
    ),
    paths(
        health,
        pool_space,
        prune_snapshots,
        list_volumes,
        create_volume,
        get_volume,
        delete_volume,
        expand_volume,
        set_volume_labels,
        flatten_volume,
        attach_volume,
        detach_volume,
        list_snapshots,
        list_all_snapshots,
        create_snapshot,
        get_snapshot,
        delete_snapshot,
        revert,
        attach_snapshot,
        detach_snapshot,
        create_clone,
        create_snapshot_group,
        get_snapshot_group,
        delete_snapshot_group,
        list_operations,
        get_operation,
        changes,
        metrics,
        list_schedules,
        create_schedule,
        get_schedule,
        update_schedule,
        delete_schedule
    ),
    components(schemas(
        api::Volume,
        api::Snapshot,
        api::CreateVolume,
        api::ExpandVolume,
        api::SetLabels,
        api::VolumeFilter,
        api::CreateSnapshot,
        api::CreateSnapshotGroup,
        api::SnapshotGroup,
        api::CreateClone,
        api::CloneCreated,
        api::Operation,
        api::OperationState,
        api::OperationKind,
        api::Removed,
        api::ApiError,
        api::Export,
        api::Origin,
        api::CloneState,
        api::Health,
        api::PoolSpace,
        api::PruneSnapshots,
        api::PrunedSnapshot,
        api::PruneResult,
        api::Changes,
        api::PeerNode,
        api::FailureReason,
        api::ScheduleSpec,
        api::Schedule,
        api::ScheduleVolume,
        api::ScheduleRun,
        api::RunOutcome,
        api::KeptSnapshot,
        api::SnapshotsAction,
        api::ScheduleDeleted,
        api::LabelSelector
    ))
)]
struct Doc;

pub fn document() -> utoipa::openapi::OpenApi {
    Doc::openapi()
}
