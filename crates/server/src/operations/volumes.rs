//! The operations on a volume: create, label, expand, delete.

use super::{labels_vec, Outcome};
use crate::error::Failure;
use crate::state::{blocking, snapshot_export, State};
use lamina_engine::VolumeInfo;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Volume `name` if it exists as asked (none: there is none); another
/// volume of that name is `already_exists`.
pub(super) fn existing(
    p: &lamina_engine::Pool,
    name: &str,
    size: u64,
    labels: &[(String, String)],
) -> Result<Option<VolumeInfo>, Failure> {
    match p.volume_info_by_name(name) {
        Ok(v) if v.size == size && v.origin.is_none() && v.labels == labels => Ok(Some(v)),
        Ok(v) if v.size == size && v.origin.is_none() => Err(Failure::exists(
            format!("volume {name:?} already exists with other labels"),
            &format!("change its labels with `lamina volume label {name}`, or pick another name"),
        )),
        Ok(v) => Err(Failure::exists(
            format!("volume {name:?} already exists with size {}", v.size),
            &format!("pick another name, or delete it first: lamina volume delete {name}"),
        )),
        Err(_) => Ok(None),
    }
}

/// A volume's labels: the engine's limits, and the `lamina.io/` prefix left
/// to the system.
pub(super) fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), Failure> {
    if let Some(k) = labels.keys().find(|k| k.starts_with("lamina.io/")) {
        return Err(Failure::invalid(format!(
            "volume label {k:?}: the lamina.io/ prefix is the system's"
        )));
    }
    lamina_engine::check_labels(&labels_vec(labels))?;
    Ok(())
}

/// A volume has 1 to 3 replicas: at most 2 on other nodes, each named
/// once, by a node name.
pub(super) fn check_replicas(replicas: &[String]) -> Result<(), Failure> {
    if replicas.len() > 2 {
        return Err(Failure::invalid(format!(
            "a volume has at most 3 replicas: this node's and 2 on other nodes, not {}",
            replicas.len()
        )));
    }
    for (i, n) in replicas.iter().enumerate() {
        crate::state::nodes::check_name(n)?;
        if replicas[..i].contains(n) {
            return Err(Failure::invalid(format!(
                "node {n:?} is named twice: each replica is on a node of its own"
            )));
        }
    }
    Ok(())
}

/// Whether volume `name`'s replicas on other nodes are `replicas` (none
/// recorded: whether none are asked).
pub(super) fn same_replicas(st: &State, name: &str, replicas: &[String]) -> bool {
    let recorded = crate::front::replica_set(&st.store, &st.pool, name)
        .ok()
        .flatten();
    let others: Vec<&str> = recorded
        .iter()
        .flat_map(|r| r.replicas.iter().skip(1).map(|x| x.node.as_str()))
        .collect();
    others == replicas.iter().map(String::as_str).collect::<Vec<_>>()
}

pub(super) async fn create(
    st: &Arc<State>,
    name: String,
    size: u64,
    labels: BTreeMap<String, String>,
    replicas: Vec<String>,
) -> Result<Outcome, Failure> {
    let (p, st2) = (st.pool.clone(), st.clone());
    let labels = labels_vec(&labels);
    blocking(move || {
        // Everything that can be checked here is, before anything is made.
        let plan = match replicas.is_empty() {
            true => None,
            false => Some(plan_replicas(&st2, &replicas)?),
        };
        let (info, created) = match existing(&p, &name, size, &labels)? {
            Some(info) => (info, false),
            None => (p.create_volume_labelled(&name, size, &labels)?, true),
        };
        match plan {
            Some(plan) => {
                // Every step is idempotent: a create asked again, or
                // finished after a restart, makes what is missing.
                if let Err(f) = make_replicas(&st2, &info, &replicas, plan) {
                    if created {
                        // This node's volume goes with the failure; the
                        // replicas made on other nodes are used again by
                        // the next ask.
                        if let Err(e) = p.delete_volume(&name, true) {
                            tracing::warn!(volume = %name, error = %e, "the volume made for a failed create stays");
                        }
                    }
                    return Err(f);
                }
            }
            None if !same_replicas(&st2, &name, &replicas) => return Err(other_replicas(&name)),
            None => {}
        }
        Ok(Outcome::Volume { info, created })
    })
    .await
}

fn other_replicas(name: &str) -> Failure {
    Failure::exists(
        format!("volume {name:?} already exists with other replicas"),
        &format!("see them with `lamina volume get {name}`, or pick another name"),
    )
}

/// Where a volume's replicas go: this daemon's transfer identity, and the
/// address of each other node (from the node list). Checked before anything
/// is made.
struct Plan<'a> {
    identity: &'a lamina_transfer::Identity,
    here: String,
    addresses: Vec<String>,
}

fn plan_replicas<'a>(st: &'a State, replicas: &[String]) -> Result<Plan<'a>, Failure> {
    let identity = st.identity.as_deref().ok_or_else(|| {
        Failure::invalid(
            "a volume with replicas on other nodes needs this daemon's transfer identity: start it with --transfer-tls DIR",
        )
    })?;
    let here = identity.node().to_string();
    let mut addresses = Vec::new();
    for node in replicas {
        if *node == here {
            return Err(Failure::invalid(format!(
                "node {node:?} is this node: it holds the volume's first replica already"
            )));
        }
        addresses.push(crate::state::nodes::address_of(st, node)?);
    }
    Ok(Plan {
        identity,
        here,
        addresses,
    })
}

/// Make volume `info`'s replicas on the nodes `replicas` as `plan` says,
/// and record its replica set: this node's first, all healthy.
fn make_replicas(
    st: &State,
    info: &VolumeInfo,
    replicas: &[String],
    plan: Plan<'_>,
) -> Result<(), Failure> {
    let name = &info.name;
    if crate::front::replica_set(&st.store, &st.pool, name)?.is_some() {
        return if same_replicas(st, name, replicas) {
            Ok(())
        } else {
            Err(other_replicas(name))
        };
    }
    let now = crate::front::now();
    let mut set = vec![crate::store::ReplicaRec {
        node: plan.here.clone(),
        address: String::new(),
        since: now,
        ..Default::default()
    }];
    for (node, address) in replicas.iter().zip(plan.addresses) {
        let remote = lamina_transfer::Remote {
            address: address.clone(),
            node: node.clone(),
        };
        let made = lamina_transfer::replica::RemoteVolume::create(
            plan.identity,
            &remote,
            name,
            info.size,
            lamina_transfer::replica::SessionOptions::default(),
        );
        if let Err(e) = made {
            return Err(Failure::new(
                lamina_api::ErrorCode::Unavailable,
                format!("volume {name:?}: node {node} could not make its replica: {e}"),
                Some("check that the node runs with --transfer-listen and --transfer-tls, and ask again"),
            ));
        }
        set.push(crate::store::ReplicaRec {
            node: node.clone(),
            address,
            since: now,
            ..Default::default()
        });
    }
    let rec = crate::store::ReplicaSetRec {
        volume_id: info.id,
        generation: 0,
        replicas: set,
        dirty: Vec::new(),
        diskless: false,
        size: 0,
    };
    st.store
        .put_replica_set(name, &rec)
        .map_err(Failure::from)?;
    Ok(())
}

pub(super) async fn set_labels(
    st: &Arc<State>,
    name: String,
    labels: BTreeMap<String, String>,
) -> Result<Outcome, Failure> {
    let p = st.pool.clone();
    blocking(move || {
        // The system's labels stay (a replica's `lamina.io/replica-of`
        // among them: without it, it would pass for a volume of its own
        // and take writes its front end never sent). The volume's lock,
        // held by the operation, keeps them as read.
        let mut all = labels;
        for (k, v) in p.volume_info_by_name(&name)?.labels {
            if k.starts_with("lamina.io/") {
                all.insert(k, v);
            }
        }
        Ok(Outcome::Volume {
            info: p.set_volume_labels(&name, &labels_vec(&all))?,
            created: false,
        })
    })
    .await
}

pub(super) async fn expand(st: &Arc<State>, name: String, size: u64) -> Result<Outcome, Failure> {
    let p = st.pool.clone();
    blocking(move || {
        Ok(Outcome::Volume {
            info: p.expand_volume(&name, size)?,
            created: false,
        })
    })
    .await
}

pub(super) async fn delete(
    st: &Arc<State>,
    name: String,
    with_snapshots: bool,
    recovering: bool,
) -> Result<Outcome, Failure> {
    if st.is_attached(&name) {
        return Err(Failure::conflict(
            format!("volume {name:?} is attached"),
            &format!("detach it first: lamina volume detach {name}"),
        ));
    }
    let (p, st2) = (st.pool.clone(), st.clone());
    blocking(move || {
        // Fronted here holding no replica: its replicas are all there is.
        if let Some(set) =
            crate::front::replica_set(&st2.store, &st2.pool, &name)?.filter(|s| s.diskless)
        {
            super::replicas::retire_others(&st2, &name, &set)?;
            st2.fronts.remove(&name);
            st2.store.remove_replica_set(&name).map_err(Failure::from)?;
            return Ok(Outcome::Removed(true));
        }
        if recovering && p.volume_info_by_name(&name).is_err() {
            return Ok(Outcome::Removed(true));
        }
        // The live volume's own snapshots (`NAME@ID`: deleted
        // volumes of the same name keep theirs apart).
        let id = p.volume_info_by_name(&name)?.id;
        for s in p.list_snapshots(&format!("{name}@{id}"))? {
            if st2.is_attached(&snapshot_export(&name, &s.name)) {
                return Err(Failure::conflict(
                    format!("snapshot {name}/{} is attached", s.name),
                    &format!("detach it first: lamina snapshot detach {name} {}", s.name),
                ));
            }
            st2.refuse_if_copying_from(&name, &s.name)?;
        }
        // Its replicas on other nodes go first (each node asked first
        // whether it can), so that this volume, and the operation's
        // record, stay until none is left (docs/replicas.md, "Deleting").
        let set = crate::front::replica_set(&st2.store, &st2.pool, &name)?;
        if let Some(set) = &set {
            super::replicas::retire_others(&st2, &name, set)?;
        }
        // A front end open for a rebuild (the volume detached) stops.
        st2.fronts.remove(&name);
        p.delete_volume(&name, with_snapshots)?;
        if let Ok(Some(_)) = st2.store.replica_set(&name) {
            st2.store.remove_replica_set(&name).map_err(Failure::from)?;
        }
        Ok(Outcome::Removed(true))
    })
    .await
}
