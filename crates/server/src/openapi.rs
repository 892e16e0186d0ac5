//! The OpenAPI document the daemon serves at `/openapi.json`, generated from
//! the handlers' annotations and the API types so that it cannot drift. The
//! rules the daemon checks (names, sizes, labels, query bounds) are written
//! into it here from the constants the checks themselves use.

use crate::groups::*;
use crate::handlers::*;
use crate::nodes::*;
use crate::schedules::api::*;
use crate::space::*;
use lamina_api as api;
use lamina_engine as engine;
use utoipa::openapi::path::Parameter;
use utoipa::openapi::schema::{AdditionalProperties, ArrayItems, Object};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    modifiers(&Rules),
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
        add_replica,
        remove_replica,
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
        delete_schedule,
        list_nodes,
        add_node,
        get_node,
        remove_node
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
        api::Node,
        api::AddNode,
        api::AddReplica,
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

/// Writes the daemon's input rules into the document.
struct Rules;

impl Modify for Rules {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        // What is not found is reported by a test, never at serve time.
        let _ = apply_rules(doc);
    }
}

/// A name as [`engine::check_name`] takes it, at most `max` bytes.
fn name_rule(o: &mut Object, max: usize) {
    o.pattern = Some(engine::NAME_PATTERN.into());
    o.min_length = Some(1);
    o.max_length = Some(max);
}

/// A volume size as the engine takes it: whole sectors, at most
/// [`engine::MAX_VOLUME_SIZE`].
fn size_rule(o: &mut Object) {
    o.minimum = Some(engine::SECTOR.into());
    o.maximum = Some(engine::MAX_VOLUME_SIZE.into());
    o.multiple_of = Some(engine::SECTOR.into());
}

/// Labels as [`engine::check_labels`] takes them (lengths in UTF-8 bytes:
/// JSON Schema counts characters, so a non-ASCII key or value can be
/// refused below its declared length).
fn labels_rule(o: &mut Object) {
    let mut key = Object::with_type(utoipa::openapi::schema::Type::String);
    key.min_length = Some(1);
    key.max_length = Some(engine::LABEL_KEY_MAX_LEN);
    key.pattern = Some(engine::LABEL_PATTERN.into());
    let mut value = Object::with_type(utoipa::openapi::schema::Type::String);
    value.max_length = Some(engine::LABEL_VALUE_MAX_LEN);
    value.pattern = Some(engine::LABEL_PATTERN.into());
    o.property_names = Some(Box::new(Schema::Object(key)));
    o.additional_properties = Some(Box::new(AdditionalProperties::RefOr(RefOr::T(
        Schema::Object(value),
    ))));
    // The fewest bytes a label takes: a one-byte key and an empty value.
    o.max_properties = Some(engine::LABELS_MAX_BYTES / (1 + engine::LABEL_OVERHEAD));
    o.description = Some(format!(
        "Labels: keys 1-{} bytes, values up to {} bytes (UTF-8), no control characters, \
         at most {} bytes in all (each key and value plus {}); the `lamina.io/` prefix is the system's.",
        engine::LABEL_KEY_MAX_LEN,
        engine::LABEL_VALUE_MAX_LEN,
        engine::LABELS_MAX_BYTES,
        engine::LABEL_OVERHEAD
    ));
}

/// Apply every rule; what it could not find in the document (a renamed
/// type or field), for the test that keeps this list honest.
fn apply_rules(doc: &mut utoipa::openapi::OpenApi) -> Vec<String> {
    let mut missing = Vec::new();
    let names: [(&str, &str, usize); 6] = [
        ("CreateVolume", "name", engine::NAME_MAX_LEN),
        ("CreateSnapshot", "name", engine::NAME_MAX_LEN),
        ("CreateSnapshotGroup", "name", engine::NAME_MAX_LEN),
        ("CreateClone", "name", engine::NAME_MAX_LEN),
        ("CreateClone", "from_volume", engine::NAME_MAX_LEN),
        (
            "ScheduleSpec",
            "name",
            crate::schedules::api::MAX_NAME.min(engine::NAME_MAX_LEN),
        ),
    ];
    for (schema, field, max) in names {
        match object(doc, schema, field) {
            Some(o) => name_rule(o, max),
            None => missing.push(format!("{schema}.{field}")),
        }
    }
    for (schema, field) in [
        ("CreateSnapshotGroup", "volumes"),
        ("ScheduleSpec", "volumes"),
    ] {
        match items(doc, schema, field) {
            Some(o) => name_rule(o, engine::NAME_MAX_LEN),
            None => missing.push(format!("{schema}.{field}[]")),
        }
    }
    for (schema, field) in [("CreateVolume", "size"), ("ExpandVolume", "size")] {
        match object(doc, schema, field) {
            Some(o) => size_rule(o),
            None => missing.push(format!("{schema}.{field}")),
        }
    }
    for schema in [
        "CreateVolume",
        "SetLabels",
        "CreateSnapshot",
        "CreateSnapshotGroup",
        "ScheduleSpec",
    ] {
        match object(doc, schema, "labels") {
            Some(o) => labels_rule(o),
            None => missing.push(format!("{schema}.labels")),
        }
    }
    // A node's name (the node list's rule, not the engine's).
    match object(doc, "AddNode", "name") {
        Some(o) => node_rule(o),
        None => missing.push("AddNode.name".into()),
    }
    match items(doc, "CreateVolume", "replicas") {
        Some(o) => node_rule(o),
        None => missing.push("CreateVolume.replicas[]".into()),
    }
    // At most 2 replicas on other nodes, each named once.
    match property(doc, "CreateVolume", "replicas") {
        Some(RefOr::T(Schema::Array(a))) => {
            a.max_items = Some(2);
            a.unique_items = true;
        }
        _ => missing.push("CreateVolume.replicas".into()),
    }
    // A snapshot's path names its volume by name, or by NAME@ID once the
    // volume was deleted (its snapshots outlive it).
    let mut references = 0;
    for (path, item) in doc.paths.paths.iter_mut() {
        if !path.starts_with("/v1/volumes/{name}/snapshots") {
            continue;
        }
        let ops = [
            &mut item.get,
            &mut item.post,
            &mut item.put,
            &mut item.delete,
        ];
        for op in ops.into_iter().flatten() {
            let named = op
                .parameters
                .iter_mut()
                .flatten()
                .find(|p| p.name == "name");
            if let Some(p) = named {
                p.description = Some(
                    "volume name; NAME@ID (the pool's id of the volume) names a deleted volume's snapshots, \
                     or a live volume by its id"
                        .into(),
                );
                if let Some(RefOr::T(Schema::Object(o))) = p.schema.as_mut() {
                    o.pattern = Some(engine::VOLUME_REFERENCE_PATTERN.into());
                    o.min_length = Some(1);
                    references += 1;
                }
            }
        }
    }
    if references == 0 {
        missing.push("the volume of /v1/volumes/{name}/snapshots...".into());
    }
    let bounds: [(&str, &str, u64); 4] = [
        ("/v1/operations", "limit", api::MAX_OPERATIONS_LIMIT as u64),
        ("/v1/changes", "wait_ms", api::MAX_CHANGES_WAIT_MS),
        ("/v1/changes", "after", api::MAX_QUERY_ID),
        ("/v1/snapshots", "id", api::MAX_QUERY_ID),
    ];
    for (path, name, max) in bounds {
        match query(doc, path, name) {
            Some(o) => o.maximum = Some(max.into()),
            None => missing.push(format!("GET {path} ?{name}")),
        }
    }
    missing
}

/// The inline schema of `schema.field` in the components.
fn object<'a>(
    doc: &'a mut utoipa::openapi::OpenApi,
    schema: &str,
    field: &str,
) -> Option<&'a mut Object> {
    match property(doc, schema, field)? {
        RefOr::T(Schema::Object(f)) => Some(f),
        _ => None,
    }
}

/// The schema of the property `schema.field`, as the document has it.
fn property<'a>(
    doc: &'a mut utoipa::openapi::OpenApi,
    schema: &str,
    field: &str,
) -> Option<&'a mut RefOr<Schema>> {
    let comps = doc.components.as_mut()?;
    let RefOr::T(Schema::Object(o)) = comps.schemas.get_mut(schema)? else {
        return None;
    };
    o.properties.get_mut(field)
}

/// The inline schema of the items of the array `schema.field`.
/// A node name's rule (the node list's, not the engine's).
fn node_rule(o: &mut Object) {
    o.pattern = Some(crate::nodes::NAME_PATTERN.into());
    o.min_length = Some(1);
    o.max_length = Some(crate::nodes::MAX_NAME);
}

fn items<'a>(
    doc: &'a mut utoipa::openapi::OpenApi,
    schema: &str,
    field: &str,
) -> Option<&'a mut Object> {
    let RefOr::T(Schema::Array(a)) = property(doc, schema, field)? else {
        return None;
    };
    match &mut a.items {
        ArrayItems::RefOrSchema(b) => match b.as_mut() {
            RefOr::T(Schema::Object(i)) => Some(i),
            _ => None,
        },
        _ => None,
    }
}

/// The schema of query parameter `name` of `GET path`.
fn query<'a>(
    doc: &'a mut utoipa::openapi::OpenApi,
    path: &str,
    name: &str,
) -> Option<&'a mut Object> {
    let item = doc.paths.paths.get_mut(path)?;
    let op = item.get.as_mut()?;
    let p: &mut Parameter = op
        .parameters
        .as_mut()?
        .iter_mut()
        .find(|p| p.name == name)?;
    match p.schema.as_mut()? {
        RefOr::T(Schema::Object(o)) => Some(o),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use utoipa::OpenApi;

    #[test]
    fn every_rule_finds_its_place_in_the_document() {
        let mut doc = super::Doc::openapi();
        assert_eq!(super::apply_rules(&mut doc), Vec::<String>::new());
    }
}
