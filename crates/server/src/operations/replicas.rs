//! A replicated volume's replicas added and removed after its creation
//! (`lamina replica add|remove`, docs/replicas.md "Adding and removing a
//! replica"). A new replica is recorded faulted, with nothing known of its
//! data, so its rebuild is a full sparse copy, resumable as every rebuild
//! is; the front end that serves the volume (one opened for it when the
//! volume is detached) runs that rebuild.

use super::Outcome;
use crate::error::Failure;
use crate::front::now;
use crate::state::{blocking, State};
use crate::store::{ReplicaRec, ReplicaSetRec, MAX_REPLICAS};
use lamina_api::ErrorCode;
use lamina_transfer::replica::{RemoteVolume, SessionOptions};
use lamina_transfer::wire::Code;
use lamina_transfer::TransferError;
use std::sync::Arc;

/// Why a new replica is out of the healthy set until its rebuild ends.
pub const NEW: &str = "new replica: its data is being copied";

/// Add a replica of volume `volume` on node `node` (in the node list): made
/// there empty, recorded, and copied to by the volume's front end. Asked
/// again for a replica it has, it changes nothing, but opens the front end
/// of a detached volume whose replicas are not all healthy (so that their
/// rebuilds go on).
pub(super) async fn add(st: &Arc<State>, volume: String, node: String) -> Result<Outcome, Failure> {
    let st2 = st.clone();
    blocking(move || {
        crate::state::nodes::check_name(&node)?;
        let identity = st2.identity.clone().ok_or_else(|| {
            Failure::invalid(
                "a replica on another node needs this daemon's transfer identity: start it with --transfer-tls DIR",
            )
        })?;
        if node == identity.node() {
            return Err(Failure::invalid(format!(
                "node {node:?} is this node: it holds the volume's first replica already"
            )));
        }
        let info = st2.pool.volume_info_by_name(&volume)?;
        let set = crate::front::replica_set(&st2.store, &st2.pool, &volume)?;
        let has = set
            .as_ref()
            .is_some_and(|s| s.replicas.iter().any(|r| r.node == node));
        if !has {
            let address = crate::state::nodes::address_of(&st2, &node)?;
            let count = set.as_ref().map_or(1, |s| s.replicas.len());
            if count >= MAX_REPLICAS {
                return Err(Failure::invalid(format!(
                    "volume {volume:?} has {count} replicas: at most {MAX_REPLICAS}; remove one first (lamina replica remove)"
                )));
            }
            if set.is_none() && st2.is_attached(&volume) {
                return Err(Failure::conflict(
                    format!("volume {volume:?} is attached as a volume of one replica"),
                    &format!("its first other replica is added while it is detached: lamina volume detach {volume}"),
                ));
            }
            // Made there first (or found, made for this node and of this
            // size): a node that cannot make it leaves nothing recorded
            // here.
            let remote = lamina_transfer::Remote {
                address: address.clone(),
                node: node.clone(),
            };
            RemoteVolume::create(&identity, &remote, &volume, info.size, SessionOptions::default())
                .map_err(|e| {
                    Failure::new(
                        ErrorCode::Unavailable,
                        format!("volume {volume:?}: node {node} could not make its replica: {e}"),
                        Some("check that the node runs with --transfer-listen and --transfer-tls, and ask again"),
                    )
                })?;
            if set.is_none() {
                st2.store
                    .put_replica_set(
                        &volume,
                        &ReplicaSetRec {
                            volume_id: info.id,
                            generation: 0,
                            replicas: vec![ReplicaRec {
                                node: identity.node().to_string(),
                                address: String::new(),
                                since: now(),
                                ..Default::default()
                            }],
                            dirty: Vec::new(),
                            diskless: false,
                            size: 0,
                        },
                    )
                    .map_err(Failure::from)?;
            }
            // It gets the volume's snapshots too, oldest first, each
            // with its data: the first is a full copy, each next one
            // what changed since the one before.
            let snapshots = st2
                .pool
                .list_snapshots(&format!("{volume}@{}", info.id))
                .map(|l| {
                    l.into_iter()
                        .filter(|s| !s.system)
                        .map(|s| s.name)
                        .collect::<Vec<String>>()
                });
            let added = snapshots.map_err(Failure::from).and_then(|snapshots| {
                st2.store
                .add_replica(
                    &volume,
                    ReplicaRec {
                        node: node.clone(),
                        address,
                        faulted: Some(NEW.to_string()),
                        since: now(),
                        missed_snapshots: snapshots,
                        ..Default::default()
                    },
                )
                .map_err(Failure::from)
            });
            if let Err(f) = added {
                // Nothing of this call stays: a replica set it made goes.
                if set.is_none() {
                    let _ = st2.store.remove_replica_set(&volume);
                }
                return Err(f);
            }
            tracing::info!(volume = %volume, replica = %node, "replica added: its rebuild copies it the volume");
            if let Some(f) = st2.fronts.get(&volume) {
                f.add_replica(&node, NEW).map_err(|e| {
                    Failure::internal(format!(
                        "replica {node} of volume {volume} is recorded, and its front end could not take it in ({e}): detach and attach the volume"
                    ))
                })?;
            }
        }
        // A detached volume with a replica to rebuild gets a front end of
        // its own for the rebuild (an attach serves that one).
        let rebuilding = crate::front::replica_set(&st2.store, &st2.pool, &volume)?
            .is_some_and(|s| s.replicas.iter().any(|r| r.faulted.is_some()));
        if rebuilding && st2.fronts.get(&volume).is_none() {
            let open = crate::front::open(&st2.front_parts(), &volume)?;
            st2.fronts.insert(&volume, open);
        }
        Ok(Outcome::Volume {
            info,
            created: !has,
        })
    })
    .await
}

/// Remove volume `volume`'s replica on node `node`: faulted, taken out of
/// the front end, forgotten, then its volume on that node deleted (a
/// Retire). Not this node's (the front end's), and not the last healthy
/// one. A node that cannot delete it (down, say: the reason to remove a
/// replica) does not hold the removal back: the answer says what was left
/// there, and so does a warning. Gone already: nothing changes, but a
/// removal finished after a restart (`recovering`) deletes its volume
/// there still.
pub(super) async fn remove(
    st: &Arc<State>,
    volume: String,
    node: String,
    recovering: bool,
) -> Result<Outcome, Failure> {
    let st2 = st.clone();
    blocking(move || {
        let set = crate::front::replica_set(&st2.store, &st2.pool, &volume)?;
        let at = set
            .as_ref()
            .and_then(|s| s.replicas.iter().position(|r| r.node == node));
        let (Some(set), Some(i)) = (set.as_ref(), at) else {
            if recovering {
                // Killed between its record's change and the Retire.
                return Ok(retire_removed(&st2, &volume, &node, None));
            }
            if set.is_none() {
                st2.pool.volume_info_by_name(&volume)?;
            }
            return Ok(Outcome::Removed(false));
        };
        if i == 0 {
            return Err(Failure::invalid(format!(
                "the replica on {node} is this node's: the volume's front end runs on it, and it is not removed"
            )));
        }
        let healthy_left = set
            .replicas
            .iter()
            .enumerate()
            .any(|(j, r)| j != i && r.faulted.is_none());
        if !healthy_left {
            return Err(Failure::conflict(
                format!("the replica on {node} is volume {volume:?}'s only healthy one"),
                "let another replica be rebuilt first (lamina replica list)",
            ));
        }
        if let Some(f) = st2.fronts.get(&volume) {
            f.remove_replica(&node).map_err(|e| {
                Failure::new(
                    ErrorCode::Unavailable,
                    format!("replica {node} of volume {volume}: {e}"),
                    None,
                )
            })?;
        }
        let gone = st2
            .store
            .remove_replica(&volume, &node)
            .map_err(Failure::from)?;
        let gone_address = set.replicas[i].address.clone();
        // The system snapshots its rebuild kept.
        if let Some(rb) = gone.and_then(|r| r.rebuild) {
            for s in std::iter::once(rb.base).chain(rb.round.map(|t| t.target)) {
                if lamina_engine::is_system_name(&s) {
                    if let Err(e) = st2.pool.delete_system_snapshot(&volume, &s) {
                        tracing::warn!(volume = %volume, snapshot = %s, error = %e, "a removed replica's rebuild snapshot stays");
                    }
                }
            }
        }
        tracing::info!(volume = %volume, replica = %node, "replica removed");
        let address = gone_address;
        Ok(retire_removed(&st2, &volume, &node, Some(address)))
    })
    .await
}

/// Delete the volume of volume `volume`'s removed replica on `node` (at
/// the node list's address, else at `address`), once it is out of the replica set:
/// `Removed`, or, when the node could not, `RemovedLeaving` saying what
/// stays there and why (logged too).
fn retire_removed(st: &State, volume: &str, node: &str, address: Option<String>) -> Outcome {
    let left = |why: String| {
        let left = format!(
            "its volume {volume} on node {node} stays: {why}; delete it there (lamina volume delete {volume}, on {node})"
        );
        tracing::warn!(
            volume,
            replica = node,
            "a removed replica's volume stays on its node: {why}"
        );
        Outcome::RemovedLeaving(left)
    };
    let Some(identity) = st.identity.clone() else {
        return left("this daemon has no transfer identity (--transfer-tls)".into());
    };
    // The node list's address first: it is kept current (a node that
    // came back at a new address), the recorded one may not be.
    let address = match (crate::state::nodes::address_of(st, node), address) {
        (Ok(a), _) | (Err(_), Some(a)) => a,
        (Err(f), None) => return left(f.1.message),
    };
    match retire(&identity, node, &address, volume, false) {
        Ok(existed) => {
            tracing::info!(
                volume,
                replica = node,
                existed,
                "a removed replica's volume deleted on its node"
            );
            Outcome::Removed(true)
        }
        Err(e) => left(why(&e)),
    }
}

/// Ask node `node` (at `address`) to delete its replica of volume `volume`
/// (with `check`, only whether it holds one to delete): whether it was
/// there.
fn retire(
    identity: &lamina_transfer::Identity,
    node: &str,
    address: &str,
    volume: &str,
    check: bool,
) -> Result<bool, TransferError> {
    let remote = lamina_transfer::Remote {
        address: address.to_string(),
        node: node.to_string(),
    };
    lamina_transfer::replica::retire(
        identity,
        &remote,
        volume,
        check,
        SessionOptions::default().connect_timeout,
    )
}

/// Whether a Retire's error says the volume there is not this front end's
/// (its node's own, or another's): nothing of ours to delete.
fn not_ours(e: &TransferError) -> bool {
    matches!(
        e,
        TransferError::Remote {
            code: Code::NotReplica,
            ..
        }
    )
}

/// A Retire's error in words: the node's own for a refusal.
fn why(e: &TransferError) -> String {
    match e {
        TransferError::Remote { message, code, .. } => {
            format!("the node refused ({code:?}): {message}")
        }
        e => e.to_string(),
    }
}

/// Before volume `volume` is deleted here: each of its replicas on other
/// nodes in `set` deleted there, first every node asked whether it can
/// (each answering, of a version that can delete, its volume not
/// attached there), so that a node that cannot fails the delete with
/// `unavailable` naming it before anything changed; then each deleted,
/// and taken out of the replica set once it is gone. A volume there that
/// is not this front end's (made anew by hand, say) is left as it is. Run
/// again (asked again, or after a restart), it deletes what is left.
pub(super) fn retire_others(st: &State, volume: &str, set: &ReplicaSetRec) -> Result<(), Failure> {
    // Every replica reached over the network: all but this node's (none
    // when its front end holds no replica).
    let others: Vec<&ReplicaRec> = set
        .replicas
        .iter()
        .filter(|r| !r.address.is_empty())
        .collect();
    if others.is_empty() {
        return Ok(());
    }
    let identity = st.identity.clone().ok_or_else(|| {
        Failure::invalid(format!(
            "volume {volume:?} has replicas on other nodes, and this daemon has no transfer identity to delete them with: start it with --transfer-tls DIR"
        ))
    })?;
    let hint = format!(
        "ask again once the node answers; or take its replica out first (lamina replica remove {volume} NODE), which leaves its volume there to delete by hand"
    );
    for r in &others {
        let address = crate::front::remote_of(&st.store, r).address;
        match retire(&identity, &r.node, &address, volume, true) {
            Ok(_) => {}
            Err(e) if not_ours(&e) => {
                tracing::warn!(volume, replica = %r.node, "the volume there is not this front end's replica: left as it is ({})", why(&e));
            }
            Err(e) => {
                return Err(Failure::new(
                    ErrorCode::Unavailable,
                    format!(
                    "volume {volume:?}: node {} cannot delete its replica: {}; nothing was deleted",
                    r.node,
                    why(&e)
                ),
                    Some(&hint),
                ))
            }
        }
    }
    // Their front end (one open for a rebuild) stops before they go.
    st.fronts.remove(volume);
    let mut deleted = Vec::new();
    for r in &others {
        let address = crate::front::remote_of(&st.store, r).address;
        match retire(&identity, &r.node, &address, volume, false) {
            Ok(existed) => {
                tracing::info!(volume, replica = %r.node, existed, "replica's volume deleted on its node");
            }
            Err(e) if not_ours(&e) => {}
            Err(e) => {
                return Err(Failure::new(
                    ErrorCode::Unavailable,
                    format!(
                        "volume {volume:?}: node {} could not delete its replica: {}; the volume here stays{}",
                        r.node,
                        why(&e),
                        match deleted.is_empty() {
                            true => String::new(),
                            false => format!(
                                ", without its replicas on {} (deleted, and out of its replica set)",
                                deleted.join(", ")
                            ),
                        }
                    ),
                    Some(&hint),
                ))
            }
        }
        st.store
            .remove_replica(volume, &r.node)
            .map_err(Failure::from)?;
        deleted.push(r.node.clone());
    }
    Ok(())
}

/// A shared record's refusal or failure for volume `volume`, as the API
/// answers it.
fn shared_error(volume: &str, e: crate::store::SharedRecordError) -> Failure {
    Failure::from(crate::ServerError::Shared {
        volume: volume.to_string(),
        source: e,
    })
}

/// Where a takeover records node `node`'s replica: its node-list address;
/// `unlisted:0` stands for a node not listed here yet (`lamina node add`,
/// or Lamina's controllers from its node Secret), which a front end
/// reaches once it is listed.
fn listed_address(st: &State, node: &str) -> String {
    st.store
        .node(node)
        .ok()
        .flatten()
        .map(|r| r.address)
        .unwrap_or_else(|| "unlisted:0".to_string())
}

/// Why the other replicas are out once a node took a volume over, until
/// its rebuilds copy them again.
pub const MOVED: &str = "the front end moved to another node: its data is copied again";

/// Make this node the front end of volume `volume`, whose replica it holds
/// (docs/replicas.md, "Taking a volume over"), before an attach opens it:
/// the shared record must name this node's replica healthy; it is changed
/// there first (this node's front end at the next generation, every other
/// replica faulted, to be copied again), then here (the volume no longer
/// labelled a replica, its replica set recorded). A volume of this node's
/// own, or one it took over already, changes nothing. Blocking; the caller
/// holds the volume's lock.
pub fn take_over(st: &State, volume: &str) -> Result<(), Failure> {
    let info = match st.pool.volume_info_by_name(volume) {
        Ok(info) => info,
        Err(lamina_engine::Error::VolumeNotFound(_)) => return take_over_diskless(st, volume),
        Err(e) => return Err(e.into()),
    };
    let Some(old) = crate::replicas::replica_of(&info).map(str::to_string) else {
        return Ok(());
    };
    let identity = st.identity.clone().ok_or_else(|| {
        Failure::invalid(
            "taking a replicated volume over needs this daemon's transfer identity: start it with --transfer-tls DIR",
        )
    })?;
    let me = identity.node().to_string();
    let Some((shared, _)) = st.store.shared() else {
        return Err(Failure::invalid(format!(
            "volume {volume:?} here is node {old}'s replica, and this daemon keeps no shared record of replica sets (lamina serve --kube-namespace): without one, no node can know that this replica holds every acknowledged write"
        )));
    };
    let shared_failure = |e| shared_error(volume, e);
    let rec = shared
        .read(volume)
        .map_err(shared_failure)?
        .ok_or_else(|| {
            Failure::conflict(
                format!("volume {volume:?} has no replica set in the shared record"),
                "its front end records one when the volume is made or attached",
            )
        })?;
    let taken = if rec.front_end == me {
        // Taken already (a call cut off after the shared record's change).
        rec
    } else {
        match rec.replicas.iter().find(|(n, _)| *n == me) {
            Some((_, None)) => {}
            Some((_, Some(reason))) => {
                let healthy: Vec<&str> = rec
                    .replicas
                    .iter()
                    .filter(|(_, f)| f.is_none())
                    .map(|(n, _)| n.as_str())
                    .collect();
                return Err(Failure::conflict(
                    format!("volume {volume:?}: this node's replica is faulted in the shared record ({reason}): it may lack acknowledged writes"),
                    &format!("take it over on a node whose replica is healthy: {}", healthy.join(", ")),
                ));
            }
            None => {
                return Err(Failure::conflict(
                    format!(
                        "volume {volume:?}: the shared record has no replica of it on this node"
                    ),
                    "take it over on one of its replicas' nodes",
                ))
            }
        }
        let mut replicas = vec![(me.clone(), None)];
        for (n, faulted) in rec.replicas.iter().filter(|(n, _)| *n != me) {
            replicas.push((
                n.clone(),
                Some(faulted.clone().unwrap_or_else(|| MOVED.to_string())),
            ));
        }
        let to = crate::store::SharedSet {
            front_end: me.clone(),
            generation: rec.generation + 1,
            replicas,
            diskless: false,
        };
        shared
            .take(&me, volume, &rec, &to)
            .map_err(shared_failure)?;
        tracing::warn!(volume, from = %rec.front_end, generation = to.generation, "volume taken over: this node's front end serves it");
        to
    };
    let snapshots: Vec<String> = st
        .pool
        .list_snapshots(&format!("{volume}@{}", info.id))?
        .into_iter()
        .filter(|s| !s.system)
        .map(|s| s.name)
        .collect();
    let mut replicas = vec![ReplicaRec {
        node: me.clone(),
        address: String::new(),
        since: now(),
        ..Default::default()
    }];
    for (n, faulted) in taken.replicas.iter().filter(|(n, _)| *n != me) {
        let address = listed_address(st, n);
        replicas.push(ReplicaRec {
            node: n.clone(),
            address,
            faulted: Some(faulted.clone().unwrap_or_else(|| MOVED.to_string())),
            since: now(),
            missed_snapshots: snapshots.clone(),
            ..Default::default()
        });
    }
    // The record first, then the label: a call cut off between the two
    // finds the label and does both again, where the other order would
    // leave a volume of this node's own with no replica set, served
    // unreplicated. One generation below the one taken: the attach's open
    // takes that one.
    st.store
        .put_replica_set(
            volume,
            &ReplicaSetRec {
                volume_id: info.id,
                generation: taken.generation.saturating_sub(1),
                replicas,
                dirty: Vec::new(),
                diskless: false,
                size: 0,
            },
        )
        .map_err(Failure::from)?;
    crate::replicas::relabel(&st.pool, volume, None)?;
    Ok(())
}

/// Make this node, which holds no replica of volume `volume`, its front end
/// (docs/replicas.md, "A front end with no replica"), before an attach
/// opens it. The shared record must name a healthy replica; it is changed
/// there first, only if it is still what was read: this node's front end,
/// said to hold no replica, at the next generation, one healthy replica
/// kept (the first not on the old front end's node, which may have had
/// changes in flight the others missed; else the old front end's own),
/// every other faulted, to be copied again. Then the replica set is
/// recorded here, with no local volume. A call cut off after the shared
/// record's change finds this node named there and records it here.
/// Blocking; the caller holds the volume's lock.
fn take_over_diskless(st: &State, volume: &str) -> Result<(), Failure> {
    let identity = st.identity.clone().ok_or_else(|| {
        Failure::invalid(
            "serving a replicated volume from a node that holds no replica of it needs this daemon's transfer identity: start it with --transfer-tls DIR",
        )
    })?;
    let me = identity.node().to_string();
    let Some((shared, _)) = st.store.shared() else {
        return Err(Failure::not_found(format!(
            "volume {volume:?} is not here, and this daemon keeps no shared record of replica sets (lamina serve --kube-namespace) to find its replicas in"
        )));
    };
    let shared_failure = |e| shared_error(volume, e);
    let rec = shared
        .read(volume)
        .map_err(shared_failure)?
        .ok_or_else(|| {
            Failure::not_found(format!(
                "volume {volume:?} is not here, and the shared record has no replica set of that name"
            ))
        })?;
    let taken = if rec.front_end == me && rec.diskless {
        // Taken already: recorded here too (this node's front end detached
        // since), or not yet (a call cut off after the shared record's
        // change).
        let here = crate::front::replica_set(&st.store, &st.pool, volume)?;
        if here.is_some_and(|r| r.diskless) {
            return Ok(());
        }
        rec
    } else if rec.replicas.iter().any(|(n, _)| *n == me) {
        return Err(Failure::conflict(
            format!("volume {volume:?}: the shared record lists a replica of it on this node, and this node's pool has no volume of that name"),
            &format!("remove that replica (lamina replica remove {volume} {me}, on its front end's node) and attach it here again"),
        ));
    } else {
        let healthy = |n: &str| rec.replicas.iter().any(|(x, f)| x == n && f.is_none());
        let kept = rec
            .replicas
            .iter()
            .map(|(n, _)| n.as_str())
            .find(|n| healthy(n) && *n != rec.front_end)
            .or_else(|| healthy(&rec.front_end).then_some(rec.front_end.as_str()))
            .ok_or_else(|| {
                Failure::new(
                    ErrorCode::Unavailable,
                    format!("volume {volume:?} has no healthy replica in the shared record: none holds every acknowledged write"),
                    Some("see its Volume resource's status.replicaSet"),
                )
            })?
            .to_string();
        let mut replicas = vec![(kept.clone(), None)];
        for (n, faulted) in rec.replicas.iter().filter(|(n, _)| *n != kept) {
            replicas.push((
                n.clone(),
                Some(faulted.clone().unwrap_or_else(|| MOVED.to_string())),
            ));
        }
        let to = crate::store::SharedSet {
            front_end: me.clone(),
            generation: rec.generation + 1,
            replicas,
            diskless: true,
        };
        shared
            .take(&me, volume, &rec, &to)
            .map_err(shared_failure)?;
        tracing::warn!(volume, from = %rec.front_end, generation = to.generation, kept = %kept,
            "volume taken over by a front end holding no replica: this node's front end serves it");
        to
    };
    let replicas = taken
        .replicas
        .iter()
        .map(|(n, faulted)| ReplicaRec {
            node: n.clone(),
            address: listed_address(st, n),
            faulted: faulted.clone(),
            since: now(),
            ..Default::default()
        })
        .collect();
    // One generation below the one taken: the attach's open takes that one.
    st.store
        .put_replica_set(
            volume,
            &ReplicaSetRec {
                volume_id: 0,
                generation: taken.generation.saturating_sub(1),
                replicas,
                dirty: Vec::new(),
                diskless: true,
                size: 0,
            },
        )
        .map_err(Failure::from)?;
    Ok(())
}

/// Forget the volumes this node fronted holding no replica of them, with
/// no front end open now, that the shared record says another node's front
/// end holds since (it took them over): nothing of them is here, and
/// listed still, they would be shown as this node's. Each under its
/// volume's lock, so that no attach runs meanwhile.
pub async fn forget_taken_diskless(st: &Arc<State>) {
    if st.store.shared().is_none() {
        return;
    }
    let s = st.clone();
    let Ok(sets) = blocking(move || crate::front::diskless_sets(&s.store, &s.pool)).await else {
        return;
    };
    for (volume, _) in sets {
        if st.fronts.get(&volume).is_some() {
            continue;
        }
        let lock = st.lock(&volume);
        let _g = lock.lock().await;
        let s = st.clone();
        let _ = blocking(move || {
            if s.fronts.get(&volume).is_none() {
                crate::replicas::demote(&s.pool, &s.store, &volume);
            }
            Ok(())
        })
        .await;
    }
}
