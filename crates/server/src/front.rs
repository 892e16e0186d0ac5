//! Replicated volumes' front ends in this daemon (docs/replicas.md): a
//! replicated volume is served here as one `lamina_replica::Replicated` made
//! of its local engine volume (in process) and its replicas on other nodes
//! (replica sessions of the transfer protocol), recorded in the store's
//! replica sets. This module owns how a front end is opened (the next
//! generation taken and recorded first, faulted replicas left out, an
//! unreachable one recorded faulted before anything is served) and the
//! membership record the front end's faults go to; it must not decide how
//! I/O fans out (lamina-replica does) or speak the protocol
//! (lamina-transfer does). Its part `rebuild` brings a faulted replica
//! back.

mod rebuild;

use crate::device::Registry;
use crate::error::Failure;
use crate::store::{ReplicaSetRec, Store};
use crate::ServerError;
use lamina_api::ErrorCode;
use lamina_blockio::{BlockIo, IoError, IoErrorKind};
use lamina_replica::{Membership, Replica, Replicated, Start};
use lamina_transfer::replica::{RemoteVolume, SessionOptions};
use lamina_transfer::{Identity, Remote};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Unix seconds now.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// A front end's faults, recorded in the store's replica set (durable
/// before [`Membership::fault`] returns).
pub struct StoreMembership {
    store: Arc<Store>,
    volume: String,
    /// This node's replica: the one whose missed regions are recorded
    /// (rule 16); the others' rebuilds start from a base snapshot instead.
    here: String,
}

impl Membership for StoreMembership {
    fn fault(
        &self,
        _index: usize,
        name: &str,
        reason: &str,
        at_risk: &[u64],
    ) -> Result<(), IoError> {
        self.store
            .fault_replica(&self.volume, name, reason, now(), at_risk)
            .map(|_| ())
            .map_err(|e| {
                IoError::new(
                    IoErrorKind::Io,
                    format!("the daemon's store could not record the fault: {e}"),
                )
            })
    }

    fn dirty(&self, regions: &[u64]) -> Result<(), IoError> {
        self.regions(regions, true)
    }

    fn clean(&self, regions: &[u64]) -> Result<(), IoError> {
        self.regions(regions, false)
    }

    fn missed(&self, _index: usize, name: &str, regions: &[u64]) -> Result<(), IoError> {
        if name != self.here {
            return Ok(());
        }
        self.store
            .missed_regions(&self.volume, name, regions)
            .map_err(|e| {
                IoError::new(
                    IoErrorKind::Io,
                    format!(
                        "the daemon's store could not record what this node's replica misses: {e}"
                    ),
                )
            })
    }
}

impl StoreMembership {
    fn regions(&self, regions: &[u64], dirty: bool) -> Result<(), IoError> {
        self.store
            .mark_regions(&self.volume, regions, dirty)
            .map_err(|e| {
                IoError::new(
                    IoErrorKind::Io,
                    format!("the daemon's store could not record the write intent: {e}"),
                )
            })
    }
}

/// Volume `volume`'s replica set, if it is replicated (a record of an
/// earlier volume of that name is not its). A front end holding no
/// replica (`diskless`) has its record only while this node's pool has no
/// volume of that name.
pub fn replica_set(
    store: &Store,
    pool: &lamina_engine::Pool,
    volume: &str,
) -> Result<Option<ReplicaSetRec>, Failure> {
    let Some(rec) = store.replica_set(volume).map_err(Failure::from)? else {
        return Ok(None);
    };
    Ok(match pool.volume_info_by_name(volume) {
        Ok(v) if v.id == rec.volume_id && !rec.diskless => Some(rec),
        Err(lamina_engine::Error::VolumeNotFound(_)) if rec.diskless => Some(rec),
        _ => None,
    })
}

/// The volumes this node fronts holding no replica of them, with their
/// records (docs/replicas.md, "A front end with no replica").
pub fn diskless_sets(
    store: &Store,
    pool: &lamina_engine::Pool,
) -> Result<Vec<(String, ReplicaSetRec)>, Failure> {
    Ok(store
        .replica_sets()
        .map_err(Failure::from)?
        .into_iter()
        .filter(|(name, rec)| {
            rec.diskless
                && matches!(
                    pool.volume_info_by_name(name),
                    Err(lamina_engine::Error::VolumeNotFound(_))
                )
        })
        .collect())
}

/// What the other replicas' copies of this node's snapshot `name` of
/// `volume` are made with, in one look-up: its identity
/// (`lamina_transfer::identity`) as their origin, so that a pull may go on
/// from any of them (0, none, if it is not there); and whether it is a
/// member of the group snapshot of that name, as they are made too.
pub fn copy_of(pool: &lamina_engine::Pool, volume: &str, name: &str) -> (u64, bool) {
    pool.snapshot_info_by_name(volume, name)
        .map(|s| {
            let group = s
                .labels
                .iter()
                .any(|(k, v)| k == lamina_engine::GROUP_LABEL && v == name);
            (
                lamina_transfer::identity::of_snapshot(pool.pool_id(), s.id, &s.labels),
                group,
            )
        })
        .unwrap_or((0, false))
}

/// A replicated volume's front end, open: the volume it serves, and its
/// replicas on other nodes by node name (for what is not I/O: snapshots).
pub struct Front {
    pub replicated: Arc<Replicated>,
    remotes: Mutex<Vec<(String, Arc<RemoteVolume>)>>,
    /// Held by a snapshot of the volume, and by a rebuild's last round
    /// (whose replica is in the write set but could not take a snapshot).
    snapshots: Mutex<()>,
    /// Set when it stops serving: its rebuilds stop.
    closed: AtomicBool,
}

impl Front {
    /// Its replicas on other nodes that it reaches, by node.
    pub fn remotes(&self) -> Vec<(String, Arc<RemoteVolume>)> {
        self.remotes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_remote(&self, node: &str, v: Arc<RemoteVolume>) {
        let mut r = self.remotes.lock().unwrap_or_else(|p| p.into_inner());
        r.retain(|(n, _)| n != node);
        r.push((node.to_string(), v));
    }

    fn hold_snapshots(&self) -> std::sync::MutexGuard<'_, ()> {
        self.snapshots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// It serves no more: its rebuilds stop at their next step.
    pub fn close(&self) {
        if !self.closed.swap(true, Ordering::SeqCst) {
            // What a flush covered is alike everywhere: recorded so.
            self.replicated.close();
        }
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Take in replica `node`, recorded already as a new one (faulted for
    /// `reason`): its rebuild copies it everything.
    pub fn add_replica(&self, node: &str, reason: &str) -> Result<(), IoError> {
        self.replicated
            .quiesced(|_| self.replicated.add(node, reason))
    }

    /// Let replica `node` go: faulted (recorded so) and out of the volume,
    /// its session closed. Held against a rebuild's last round, which
    /// could otherwise make it healthy meanwhile.
    pub fn remove_replica(&self, node: &str) -> Result<(), IoError> {
        let _held = self.hold_snapshots();
        self.replicated.fault(node, "removed from the volume")?;
        self.replicated.quiesced(|_| self.replicated.remove(node))?;
        self.remotes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(n, _)| n != node);
        Ok(())
    }
}

/// The front ends open in this daemon, by volume (an attached replicated
/// volume's).
#[derive(Default)]
pub struct Fronts(Mutex<HashMap<String, Arc<Front>>>);

impl Fronts {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Front>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    // The map is let go before a front end closes: closing records its
    // clean regions in the store.
    pub fn insert(&self, volume: &str, front: Arc<Front>) {
        let old = self.map().insert(volume.to_string(), front);
        if let Some(old) = old {
            old.close();
        }
    }

    pub fn remove(&self, volume: &str) {
        let old = self.map().remove(volume);
        if let Some(old) = old {
            old.close();
        }
    }

    /// Every front end stops (the daemon's shutdown).
    pub fn close_all(&self) {
        let all: Vec<Arc<Front>> = self.map().values().cloned().collect();
        for f in all {
            f.close();
        }
    }

    pub fn get(&self, volume: &str) -> Option<Arc<Front>> {
        self.map().get(volume).cloned()
    }
}

/// What a front end needs of the daemon.
pub struct Parts<'a> {
    pub pool: &'a lamina_engine::Pool,
    pub exports: &'a Arc<Registry>,
    pub store: &'a Arc<Store>,
    pub identity: Option<&'a Arc<Identity>>,
    /// How rebuilds yield to the volumes' I/O.
    pub pace: Option<&'a Arc<dyn lamina_transfer::Pace>>,
    /// Where the pool's files are: the room a rebuild of this node's
    /// replica needs is looked for there.
    pub pool_dir: &'a std::path::Path,
    /// The point a test asked the daemon to die at (`--test-crash-at`).
    pub crash_at: Option<&'a str>,
}

/// Where replica `r` (another node's) is reached: its node's address in
/// this node's node list, which an operator (or the CSI controller, for a
/// node pod that came back with a new IP) keeps current; the address
/// recorded with the replica when the node is not listed (or the list
/// cannot be read).
pub(crate) fn remote_of(store: &Store, r: &crate::store::ReplicaRec) -> Remote {
    let listed = store
        .node(&r.node)
        .map_err(|e| tracing::warn!(node = %r.node, error = %e, "the node list could not be read; using the replica's recorded address"))
        .ok()
        .flatten();
    Remote {
        address: listed
            .map(|n| n.address)
            .unwrap_or_else(|| r.address.clone()),
        node: r.node.clone(),
    }
}

/// An export's volume, and its front end when it is a replicated volume's.
pub type Opened = (Arc<dyn BlockIo>, Option<Arc<Front>>);

/// What an export of `volume` (or its `snapshot`) serves: a replicated
/// volume's front end ([`open`]), or the engine's volume or snapshot.
/// Blocking.
pub fn open_device(p: &Parts<'_>, volume: &str, snapshot: Option<&str>) -> Result<Opened, Failure> {
    if snapshot.is_none() && replica_set(p.store, p.pool, volume)?.is_some() {
        let front = open(p, volume)?;
        return Ok((front.replicated.clone(), Some(front)));
    }
    if snapshot.is_none() {
        // Another node's replica: written here, it would differ from the
        // others without its front end knowing.
        let info = p.pool.volume_info_by_name(volume)?;
        if let Some(front) = crate::replicas::replica_of(&info) {
            return Err(Failure::conflict(
                format!("volume {volume:?} here is a replica of node {front}'s volume: its front end there serves it"),
                "attach it on that node, or, if that node is lost, take it over here: lamina volume attach --take-over",
            ));
        }
    }
    Ok((
        Arc::new(p.exports.open_engine(p.pool, volume, snapshot)?),
        None,
    ))
}

/// Open replicated volume `volume`'s front end: take the next generation
/// (recorded first), open every healthy replica (this node's in process,
/// the others over replica sessions), record faulted any that cannot be
/// reached, and activate the rest at the generation. Blocking.
pub fn open(p: &Parts<'_>, volume: &str) -> Result<Arc<Front>, Failure> {
    let unavailable = |m: String| {
        Failure::new(
            ErrorCode::Unavailable,
            m,
            Some("see `lamina volume get` for its replicas"),
        )
    };
    let (set, held_all) = match p.store.next_replica_generation(volume) {
        Ok(x) => x,
        Err(e) => {
            if matches!(
                &e,
                ServerError::Shared {
                    source: crate::store::SharedRecordError::Fenced(_),
                    ..
                }
            ) {
                crate::replicas::demote(p.pool, p.store, volume);
            }
            return Err(Failure::from(e));
        }
    };
    let g = set.generation;
    let mut replicas = Vec::new();
    let mut remotes = Vec::new();
    let mut unopened: Vec<(String, String)> = Vec::new();
    for r in &set.replicas {
        if let Some(reason) = &r.faulted {
            // Out until it is rebuilt; what it misses from now on is kept
            // (its rebuild's base).
            replicas.push((
                Replica::absent(&r.node),
                Start::Faulted {
                    reason: reason.clone(),
                    keep_missed: true,
                },
            ));
            continue;
        }
        let io: Result<Arc<dyn BlockIo>, String> = if r.address.is_empty() {
            p.exports
                .open_engine(p.pool, volume, None)
                .map(|d| Arc::new(d) as Arc<dyn BlockIo>)
                .map_err(|e| e.to_string())
        } else {
            let Some(identity) = p.identity else {
                return Err(unavailable(format!(
                    "volume {volume} has replicas on other nodes, and this daemon has no transfer identity (--transfer-tls)"
                )));
            };
            let remote = remote_of(p.store, r);
            RemoteVolume::connect(identity, &remote, volume, SessionOptions::default())
                .map(|v| {
                    let v = Arc::new(v);
                    remotes.push((r.node.clone(), v.clone()));
                    v as Arc<dyn BlockIo>
                })
                .map_err(|e| e.to_string())
        };
        match io {
            Ok(io) => replicas.push((
                Replica {
                    name: r.node.clone(),
                    io,
                },
                Start::Healthy,
            )),
            Err(e) if set.diskless => {
                // Recorded once another one opened (below): a front end
                // holding no replica that reaches none must not fault the
                // replicas for its own isolation.
                unopened.push((r.node.clone(), e));
                replicas.push((Replica::absent(&r.node), Start::Vacant));
            }
            Err(e) => {
                let reason = format!("could not be opened at generation {g}: {e}");
                tracing::warn!(volume, replica = %r.node, %reason, "replica faulted");
                // What an earlier front end left dirty it may lack (a
                // crash here lost what it had not made durable).
                p.store
                    .fault_replica(volume, &r.node, &reason, now(), &set.dirty)
                    .map_err(Failure::from)?;
                // It held everything until now: it misses only what is
                // written from here on.
                replicas.push((
                    Replica::absent(&r.node),
                    Start::Faulted {
                        reason,
                        keep_missed: true,
                    },
                ));
            }
        }
    }
    if !unopened.is_empty() {
        if !replicas.iter().any(|(_, s)| *s == Start::Healthy) {
            let all: Vec<String> = unopened.iter().map(|(n, e)| format!("{n}: {e}")).collect();
            return Err(unavailable(format!(
                "volume {volume}: this node holds no replica of it and reaches none at generation {g} ({}); nothing was recorded faulted",
                all.join("; ")
            )));
        }
        for (node, e) in unopened {
            let reason = format!("could not be opened at generation {g}: {e}");
            tracing::warn!(volume, replica = %node, %reason, "replica faulted");
            p.store
                .fault_replica(volume, &node, &reason, now(), &set.dirty)
                .map_err(Failure::from)?;
            if let Some(x) = replicas.iter_mut().find(|(r, _)| r.name == node) {
                x.1 = Start::Faulted {
                    reason,
                    keep_missed: true,
                };
            }
        }
    }
    // Room for the replicas added while it serves (`lamina replica add`).
    while replicas.len() < crate::store::MAX_REPLICAS {
        replicas.push((Replica::vacant(), Start::Vacant));
    }
    if !replicas.iter().any(|(_, s)| *s == Start::Healthy) {
        return Err(unavailable(format!(
            "volume {volume} has no healthy replica it can reach"
        )));
    }
    let fenced = |e: IoError| match e.kind {
        IoErrorKind::Fenced => Failure::new(
            ErrorCode::Conflict,
            format!("volume {volume}: {e}"),
            Some("another front end holds the volume at a higher generation"),
        ),
        _ => unavailable(format!("volume {volume}: {e}")),
    };
    // An earlier front end stopped with writes no flush covered: the
    // healthy replicas may differ there. Made alike, from the first, before
    // anything is served (lamina-replica's rule 14).
    if !set.dirty.is_empty() {
        reconcile(p, volume, g, &set.dirty, &mut replicas).map_err(fenced)?;
    }
    let membership = Arc::new(StoreMembership {
        store: p.store.clone(),
        volume: volume.to_string(),
        here: set
            .replicas
            .iter()
            .find(|x| x.address.is_empty())
            .map(|x| x.node.clone())
            .unwrap_or_default(),
    });
    // Faulted at this start, or while no front end served (a snapshot's
    // failure while detached).
    let faulted_now: Vec<String> = replicas
        .iter()
        .filter(|(r, s)| {
            *s != Start::Healthy
                && (held_all.contains(&r.name)
                    || set
                        .replicas
                        .iter()
                        .any(|x| x.node == r.name && x.faulted.is_none()))
        })
        .map(|(r, _)| r.name.clone())
        .collect();
    let front = Replicated::with_states(volume, replicas, membership)
        .map_err(|e| unavailable(e.to_string()))?;
    front.activate(g).map_err(fenced)?;
    if set.diskless {
        // No local volume says its size: its replicas do.
        let size = front.size().map_err(fenced)?;
        if size != set.size {
            p.store
                .set_replica_set_size(volume, size)
                .map_err(Failure::from)?;
        }
    }
    // One faulted at this start held what the others did, but for the
    // regions an earlier front end left dirty.
    let dirty: Vec<(u64, u64)> = set
        .dirty
        .iter()
        .map(|x| (x * lamina_replica::REGION, (x + 1) * lamina_replica::REGION))
        .collect();
    for name in &faulted_now {
        front.seed_missed(name, &dirty);
    }
    // This node's replica, faulted under an earlier front end: what it
    // lacks is in its missed regions (lamina-replica's rule 16: those at
    // risk when it was faulted, recorded with its fault, and each one a
    // change went to since).
    for x in set.replicas.iter().filter(|x| x.faulted.is_some()) {
        if let (Some(m), false) = (&x.missed_regions, faulted_now.contains(&x.node)) {
            let lacks: Vec<(u64, u64)> = m
                .iter()
                .map(|x| (x * lamina_replica::REGION, (x + 1) * lamina_replica::REGION))
                .collect();
            tracing::info!(volume, replica = %x.node, regions = ?m,
                "this node's replica, faulted under an earlier front end: it may lack what is in these regions");
            front.seed_missed(&x.node, &lacks);
        }
    }
    tracing::info!(
        volume,
        generation = g,
        "replicated volume's front end opened"
    );
    let front = Arc::new(Front {
        replicated: Arc::new(front),
        remotes: Mutex::new(remotes),
        snapshots: Mutex::new(()),
        closed: AtomicBool::new(false),
    });
    rebuild::spawn(p, volume, &front);
    Ok(front)
}

/// Make the healthy replicas of `replicas` alike in regions `dirty`: each
/// piece read from the first and written to the others (zeros as
/// write-zeroes), all activated at generation `g` first. One that fails is
/// recorded faulted and left out; then the regions are recorded clean.
/// Blocking.
fn reconcile(
    p: &Parts<'_>,
    volume: &str,
    g: u64,
    dirty: &[u64],
    replicas: &mut [(Replica, Start)],
) -> Result<(), IoError> {
    use lamina_blockio::{wait, IoDone, IoOp};
    let healthy: Vec<usize> = (0..replicas.len())
        .filter(|&i| replicas[i].1 == Start::Healthy)
        .collect();
    if healthy.len() < 2 {
        // Nothing to make alike (a faulted replica's rebuild covers it).
        return p
            .store
            .mark_regions(volume, dirty, false)
            .map_err(|e| IoError::new(IoErrorKind::Io, e.to_string()));
    }
    for &i in &healthy {
        replicas[i].0.io.activate(g)?;
    }
    let source = replicas[healthy[0]].0.io.clone();
    let size = source.size()?;
    let fail = |i: usize, e: IoError, replicas: &mut [(Replica, Start)]| {
        let reason = format!("could not be made alike at generation {g}: {e}");
        tracing::warn!(volume, replica = %replicas[i].0.name, %reason, "replica faulted");
        p.store
            .fault_replica(volume, &replicas[i].0.name, &reason, now(), dirty)
            .map_err(|e| IoError::new(IoErrorKind::Io, e.to_string()))?;
        replicas[i] = (
            Replica::absent(&replicas[i].0.name),
            Start::Faulted {
                reason,
                keep_missed: false,
            },
        );
        Ok::<(), IoError>(())
    };
    let mut copied = 0u64;
    for &x in dirty {
        let (start, end) = (
            x * lamina_replica::REGION,
            ((x + 1) * lamina_replica::REGION).min(size),
        );
        let mut at = start;
        while at < end {
            let len = (1u64 << 20).min(end - at);
            let data = match wait(
                &*source,
                IoOp::Read {
                    offset: at,
                    buf: vec![0; len as usize],
                },
            )? {
                IoDone::Read(b) => b,
                _ => {
                    return Err(IoError::new(
                        IoErrorKind::Io,
                        "a read answered with something else",
                    ))
                }
            };
            let zero = data.iter().all(|&b| b == 0);
            for &i in healthy.iter().skip(1) {
                if replicas[i].1 != Start::Healthy {
                    continue;
                }
                let op = if zero {
                    IoOp::WriteZeroes {
                        offset: at,
                        len,
                        may_trim: true,
                    }
                } else {
                    IoOp::Write {
                        offset: at,
                        data: data.clone(),
                        fua: false,
                    }
                };
                if let Err(e) = wait(&*replicas[i].0.io, op) {
                    fail(i, e, replicas)?;
                }
            }
            copied += len;
            at += len;
        }
    }
    for &i in healthy.iter().skip(1) {
        if replicas[i].1 == Start::Healthy {
            if let Err(e) = wait(&*replicas[i].0.io, IoOp::Flush) {
                fail(i, e, replicas)?;
            }
        }
    }
    p.store
        .mark_regions(volume, dirty, false)
        .map_err(|e| IoError::new(IoErrorKind::Io, e.to_string()))?;
    tracing::info!(
        volume,
        regions = dirty.len(),
        bytes = copied,
        "replicas made alike where an earlier front end left writes no flush covered"
    );
    Ok(())
}

/// Delete snapshot `name` of replicated volume `volume` on its healthy
/// replicas on other nodes (this node's is the caller's): through the open
/// front end's sessions, or sessions of their own. A replica that cannot
/// is left as it is and logged: it keeps the snapshot's space, never loses
/// data. Blocking.
pub fn delete_snapshot(p: &Parts<'_>, front: Option<&Front>, volume: &str, name: &str) {
    let Ok(Some(set)) = replica_set(p.store, p.pool, volume) else {
        return;
    };
    // The faulted replicas delete it when they return.
    if let Err(e) = p.store.snapshot_deleted(volume, name) {
        tracing::warn!(volume, snapshot = name, error = %e,
            "the faulted replicas were not told of the snapshot's deletion: they keep it");
    }
    let remotes = front.map(|f| f.remotes()).unwrap_or_default();
    for r in set.replicas.iter().skip(1).filter(|r| r.faulted.is_none()) {
        let open = remotes.iter().find(|(n, _)| *n == r.node);
        let done = match (open, p.identity) {
            (Some((_, v)), _) => v.delete_snapshot(name).map_err(|e| e.to_string()),
            (None, Some(id)) => {
                let remote = remote_of(p.store, r);
                RemoteVolume::connect(id, &remote, volume, SessionOptions::default())
                    .map_err(|e| e.to_string())
                    .and_then(|v| v.delete_snapshot(name).map_err(|e| e.to_string()))
            }
            (None, None) => Err("this daemon has no transfer identity (--transfer-tls)".into()),
        };
        if let Err(e) = done {
            tracing::warn!(volume, snapshot = name, replica = %r.node, error = %e,
                "the snapshot was not deleted on this replica: it keeps its space there");
        }
    }
}

/// Snapshot replicated volume `volume` as `name` on every healthy replica
/// at one point of its write stream ([`snapshot_together`] of one volume).
/// Blocking.
pub fn snapshot<T>(
    p: &Parts<'_>,
    front: Option<&Front>,
    volume: &str,
    name: &str,
    local: impl FnOnce() -> Result<T, Failure> + Send,
) -> Result<T, Failure>
where
    T: Send,
{
    snapshot_together(p, &[(volume, front)], name, local)
}

/// One replicated volume of a snapshot: its record, and how its replicas
/// on other nodes are reached.
struct Member<'a> {
    volume: &'a str,
    front: Option<&'a Front>,
    set: ReplicaSetRec,
    /// Its replicas on other nodes that are to take the snapshot, by node
    /// (a detached volume's: sessions opened for it).
    targets: Vec<(String, Arc<RemoteVolume>)>,
    /// Those that will not have it: they get it when they are rebuilt.
    without: Vec<String>,
}

/// Snapshot `volumes` (with their front ends when open, in the order
/// given: callers sort them) as `name` at one point of all their write
/// streams: every open front end's changes held and those in flight
/// completed (each front end in turn, so each is held until all are),
/// then `local` makes this node's snapshots (an engine snapshot, or a
/// group's one transaction), then every healthy replica on another node
/// of each replicated volume takes its own, side by side, given the
/// identity of this node's as its origin; then the changes go on. A
/// detached volume's replicas are reached over sessions opened before
/// anything is held (nothing writes to it meanwhile). A replica on another
/// node that fails its snapshot is recorded faulted (it gets the snapshot
/// with its data when it is rebuilt); this node's failing, or a replicated
/// volume whose replica here is faulted, fails the whole snapshot before
/// any replica on another node is asked. Volumes that are not replicated
/// are `local`'s alone. Blocking.
pub fn snapshot_together<T>(
    p: &Parts<'_>,
    volumes: &[(&str, Option<&Front>)],
    name: &str,
    local: impl FnOnce() -> Result<T, Failure> + Send,
) -> Result<T, Failure>
where
    T: Send,
{
    let mut members = Vec::new();
    for &(volume, front) in volumes {
        let Some(set) = replica_set(p.store, p.pool, volume)? else {
            continue;
        };
        if set.replicas[0].faulted.is_some() {
            return Err(Failure::new(
                ErrorCode::Unavailable,
                format!("volume {volume}: this node's replica is faulted, and its snapshot would not hold the volume's data"),
                Some("wait until it is rebuilt"),
            ));
        }
        let without = set
            .replicas
            .iter()
            .skip(1)
            .filter(|r| r.faulted.is_some())
            .map(|r| r.node.clone())
            .collect();
        members.push(Member {
            volume,
            front,
            set,
            targets: Vec::new(),
            without,
        });
    }
    if members.is_empty() {
        return local();
    }
    // A detached volume's sessions, opened before anything is held; one
    // that cannot open is faulted once this node's snapshot is made.
    let mut unreached: Vec<(usize, String, String)> = Vec::new();
    for (i, m) in members.iter_mut().enumerate() {
        if m.front.is_some() {
            continue;
        }
        for r in m
            .set
            .replicas
            .iter()
            .skip(1)
            .filter(|r| r.faulted.is_none())
        {
            let remote = remote_of(p.store, r);
            let opened = match p.identity {
                Some(id) => RemoteVolume::connect(id, &remote, m.volume, SessionOptions::default())
                    .map_err(|e| e.to_string()),
                None => Err("this daemon has no transfer identity (--transfer-tls)".into()),
            };
            match opened {
                Ok(v) => m.targets.push((r.node.clone(), Arc::new(v))),
                Err(e) => unreached.push((i, r.node.clone(), e)),
            }
        }
    }
    // Held against a rebuild's last round, in the volumes' order.
    let _held: Vec<_> = members
        .iter()
        .filter_map(|m| m.front.map(Front::hold_snapshots))
        .collect();
    let fronts: Vec<&Front> = members.iter().filter_map(|m| m.front).collect();
    let mut local = Some(local);
    let asked = std::time::Instant::now();
    let made = all_quiesced(&fronts, Vec::new(), &mut |healthy: &[Vec<String>]| {
        let held = asked.elapsed();
        let mut open = healthy.iter();
        for m in members.iter_mut() {
            let Some(f) = m.front else { continue };
            let healthy = open.next().map(Vec::as_slice).unwrap_or_default();
            // Faulted since it was looked at, with its record durable
            // before the change that failed it completed: its snapshot
            // would miss that change.
            if !healthy.contains(&m.set.replicas[0].node) {
                return Err(Failure::new(
                    ErrorCode::Unavailable,
                    format!("volume {}: this node's replica is faulted, and its snapshot would not hold the volume's data", m.volume),
                    Some("wait until it is rebuilt"),
                ));
            }
            m.without = m
                .set
                .replicas
                .iter()
                .skip(1)
                .filter(|r| !healthy.contains(&r.node))
                .map(|r| r.node.clone())
                .collect();
            m.targets = f
                .remotes()
                .into_iter()
                .filter(|(n, _)| healthy.contains(n))
                .collect();
        }
        // This node's first: the others are copies of it, given its
        // identity as their origin.
        let Some(local) = local.take() else {
            return Err(Failure::internal("a snapshot's own part ran twice"));
        };
        let t = std::time::Instant::now();
        let mine = local()?;
        let here = t.elapsed();
        let t = std::time::Instant::now();
        let asks: Vec<(usize, String, Arc<RemoteVolume>, u64, bool)> = members
            .iter()
            .enumerate()
            .flat_map(|(i, m)| {
                let (from, group) = copy_of(p.pool, m.volume, name);
                m.targets
                    .iter()
                    .map(move |(n, v)| (i, n.clone(), v.clone(), from, group))
            })
            .collect();
        let answers = std::thread::scope(|sc| {
            let running: Vec<_> = asks
                .iter()
                .map(|(i, n, v, from, group)| {
                    (*i, n, sc.spawn(move || v.snapshot(name, *from, *group)))
                })
                .collect();
            running
                .into_iter()
                .map(|(i, n, h)| {
                    let r = h.join().unwrap_or_else(|_| {
                        Err(IoError::new(
                            IoErrorKind::Io,
                            "the snapshot's thread failed",
                        ))
                    });
                    (i, n.clone(), r.map_err(|e| e.to_string()))
                })
                .collect::<Vec<_>>()
        });
        tracing::debug!(
            snapshot = name,
            held_us = held.as_micros() as u64,
            here_us = here.as_micros() as u64,
            others_us = t.elapsed().as_micros() as u64,
            "snapshot: writes held, this node's made, the other replicas' made"
        );
        for (i, node, e) in answers
            .into_iter()
            .filter_map(|(i, n, r)| r.err().map(|e| (i, n, e)))
            .chain(std::mem::take(&mut unreached))
        {
            let m = &mut members[i];
            let reason = format!("its snapshot {name} failed: {e}");
            tracing::warn!(volume = m.volume, replica = %node, %reason, "replica faulted");
            m.without.push(node.clone());
            match m.front {
                Some(f) => f
                    .replicated
                    .fault(&node, &reason)
                    .map_err(|e| Failure::internal(e.to_string()))?,
                // It held every write until now: the next front end tracks
                // what it misses from its start.
                None => {
                    p.store
                        .fault_detached_replica(m.volume, &node, &reason, now())
                        .map_err(Failure::from)?;
                }
            }
        }
        Ok::<T, Failure>(mine)
    })?;
    for m in &members {
        p.store
            .snapshot_missed(m.volume, name, &m.without)
            .map_err(Failure::from)?;
    }
    Ok(made)
}

/// Run `work` with every one of `fronts` quiesced, held in their order,
/// with each one's healthy replicas.
fn all_quiesced<T>(
    fronts: &[&Front],
    mut healthy: Vec<Vec<String>>,
    work: &mut dyn FnMut(&[Vec<String>]) -> T,
) -> T {
    match fronts.split_first() {
        None => work(&healthy),
        Some((f, rest)) => f.replicated.quiesced(|h| {
            healthy.push(h.to_vec());
            all_quiesced(rest, healthy, work)
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{NodeRec, ReplicaRec};

    #[test]
    fn a_replica_is_reached_at_its_nodes_listed_address_else_at_the_recorded_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store.redb")).unwrap();
        let r = ReplicaRec {
            node: "n1".into(),
            address: "10.0.0.1:7481".into(),
            ..Default::default()
        };
        // Not listed: where it was when the replica was made.
        assert_eq!(remote_of(&store, &r).address, "10.0.0.1:7481");
        // Listed at a new address (its node came back elsewhere): there.
        store
            .add_node(&NodeRec {
                name: "n1".into(),
                address: "10.0.0.9:7481".into(),
                added: 0,
            })
            .unwrap();
        let to = remote_of(&store, &r);
        assert_eq!(
            (to.node.as_str(), to.address.as_str()),
            ("n1", "10.0.0.9:7481")
        );
    }
}
