//! The Volume reconciler. A Volume an operator creates makes the engine
//! volume on its node (plain, or a linked or full clone of its dataSource);
//! its status is then the mirror's. Deleting a Volume deletes the engine
//! volume and releases the finalizer, whatever snapshots and linked clones
//! it has: the daemon retires it (docs/daemon.md, "Deleted volumes' snapshots"), so
//! its snapshots stay usable and their Snapshot resources stay, and its
//! linked clones keep their data. Only a volume a client has open holds the
//! finalizer, until the client lets go.

use crate::crd::{parse_quantity, DataSource, SourceKind, Volume, VolumeStatus};
use crate::ctx::Ctx;
use crate::error::backoff;
use crate::plan::{set_ready, Write};
use crate::{Error, FINALIZER};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{finalizer, Event};
use kube::ResourceExt;
use lamina_api as api;
use std::sync::Arc;

fn key(v: &Volume) -> String {
    format!("Volume/{}", v.name_any())
}

pub async fn reconcile(v: Arc<Volume>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let k = key(&v);
    if !v.finalizers().iter().any(|f| f == FINALIZER) && v.metadata.deletion_timestamp.is_none() {
        ctx.metrics.api_write("Volume", "finalizer");
    }
    let api = ctx.volume_api();
    let c = ctx.clone();
    let r = finalizer(&api, FINALIZER, v, |ev| async move {
        match ev {
            Event::Apply(v) => ensure(&v, &c).await,
            Event::Cleanup(v) => {
                let r = remove(&v, &c).await;
                if matches!(&r, Ok(a) if *a == Action::await_change()) {
                    c.metrics.api_write("Volume", "release");
                }
                r
            }
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    if r.is_ok() {
        ctx.succeeded(&k);
    }
    r
}

pub fn error_policy(v: Arc<Volume>, e: &Error, ctx: Arc<Ctx>) -> Action {
    let n = ctx.failed(&key(&v));
    tracing::debug!(volume = %v.name_any(), error = %e, failures = n, "retrying");
    Action::requeue(backoff(n))
}

/// How soon a Volume whose engine volume the last listing showed, and its
/// status does not, is looked at again.
const LISTING_AGAIN: std::time::Duration = std::time::Duration::from_secs(2);

/// Make the engine volume if it was never made; grow it if its spec grew.
async fn ensure(v: &Volume, ctx: &Ctx) -> Result<Action, Error> {
    let node = &v.spec.node;
    if !ctx.nodes_known() {
        return Err(Error::NotYet(
            "the node Secrets have not been read yet".into(),
        ));
    }
    let Some(engine) = ctx.engine(node) else {
        let e = Error::Refused(format!(
            "no daemon is known for node {node} (no Secret labelled lamina.io/node={node})"
        ));
        fail(v, ctx, &e, "NodeUnknown").await;
        return Err(e);
    };
    let Some(view) = ctx.view(node) else {
        return Err(Error::NotYet(format!(
            "node {node} has not been listed yet"
        )));
    };
    let name = v.engine_name();
    let want = parse_quantity(&v.spec.size);
    let status = v.status.clone().unwrap_or_default();
    if let Some(have) = view.volumes.iter().find(|x| x.name == name) {
        if status.id.is_none() {
            // Listed but not yet recorded as this resource's: either the
            // mirror is about to write its status, or the listing is older
            // than a delete of a volume of this name (names are free again
            // at once). Look again once the next listing is in.
            return Ok(Action::requeue(LISTING_AGAIN));
        }
        if let Some(want) = want.filter(|w| *w > have.size) {
            if let Err(e) = engine.expand_volume(name, want).await {
                fail(v, ctx, &e, e.reason()).await;
                return Err(e);
            }
        }
        return Ok(Action::await_change());
    }
    if status.id.is_some() {
        return Ok(Action::await_change()); // made once and gone: the mirror says so
    }
    let Some(size) = want else {
        let e = Error::Refused(format!("size {:?} is not a size", v.spec.size));
        fail(v, ctx, &e, "InvalidSize").await;
        return Err(e);
    };
    let made = match &v.spec.data_source {
        None => {
            let req = api::CreateVolume {
                name: name.into(),
                size,
                ..Default::default()
            };
            engine.create_volume(&req).await.map(|_| ())
        }
        Some(src) => match clone_request(name, src, ctx) {
            Ok(req) => engine.create_clone(&req).await.map(|_| ()),
            Err(e) => Err(e),
        },
    };
    match made {
        Ok(()) => {
            ctx.event(
                &kube::Resource::object_ref(v, &()),
                false,
                "Created",
                "CreateVolume",
                format!("volume {name} made on node {node}"),
            )
            .await;
            Ok(Action::await_change())
        }
        Err(e) => {
            fail(v, ctx, &e, e.reason()).await;
            Err(e)
        }
    }
}

fn clone_request(name: &str, src: &DataSource, ctx: &Ctx) -> Result<api::CreateClone, Error> {
    let full = src.mode == crate::crd::CloneMode::Full;
    Ok(match src.kind {
        SourceKind::Volume => api::CreateClone {
            name: name.into(),
            from_snapshot: None,
            from_volume: Some(src.name.clone()),
            full,
            from_node: None,
        },
        SourceKind::Snapshot => {
            let s = ctx
                .snapshots
                .state()
                .into_iter()
                .find(|s| s.metadata.name.as_deref() == Some(src.name.as_str()))
                .ok_or_else(|| {
                    Error::Refused(format!(
                        "dataSource: no Snapshot {} in this namespace",
                        src.name
                    ))
                })?;
            api::CreateClone {
                name: name.into(),
                from_snapshot: Some(format!("{}/{}", s.spec.volume, s.engine_name())),
                from_volume: None,
                full,
                from_node: None,
            }
        }
    })
}

/// An event, and state Failed with the reason in the Ready condition.
async fn fail(v: &Volume, ctx: &Ctx, e: &Error, reason: &str) {
    ctx.event(
        &kube::Resource::object_ref(v, &()),
        true,
        reason,
        "CreateVolume",
        e.to_string(),
    )
    .await;
    let old = v.status.clone().unwrap_or_default();
    if old.id.is_some() {
        return; // it exists: its state is the mirror's
    }
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let mut status = VolumeStatus {
        state: Some("Failed".into()),
        node: Some(v.spec.node.clone()),
        ..old.clone()
    };
    set_ready(&mut status, false, reason, &e.to_string(), &now);
    let same = old.state == status.state
        && old
            .conditions
            .iter()
            .map(|c| (&c.reason, &c.message))
            .eq(status.conditions.iter().map(|c| (&c.reason, &c.message)));
    if !same {
        let w = Write::VolumeStatus {
            name: v.name_any(),
            status,
        };
        if let Err(e) = ctx.write(&w).await {
            tracing::warn!(error = %e, "could not record a volume's failure");
        }
    }
}

/// Delete (retire) the engine volume; its snapshots and clones stay.
async fn remove(v: &Volume, ctx: &Ctx) -> Result<Action, Error> {
    let node = &v.spec.node;
    let name = v.engine_name();
    if !ctx.nodes_known() {
        return Err(Error::NotYet(
            "the node Secrets have not been read yet".into(),
        ));
    }
    let (Some(engine), Some(view)) = (ctx.engine(node), ctx.view(node)) else {
        if ctx.engine(node).is_none() && v.status.as_ref().and_then(|s| s.id).is_none() {
            return Ok(Action::await_change()); // never made, and no node to make it on
        }
        return Err(Error::NotYet(format!(
            "node {node} has not been listed yet"
        )));
    };
    if !view.volumes.iter().any(|x| x.name == name) {
        return Ok(Action::await_change());
    }
    match engine.delete_volume(name).await {
        Ok(_) => Ok(Action::await_change()),
        Err(e) => {
            ctx.warn(v, "DeleteVolume", &e).await;
            Err(e)
        }
    }
}
