//! The replica sessions this node serves (`lamina_transfer::replica`): a
//! front end on another node attaches to one of this node's engine volumes
//! over the transfer listener and runs its I/O here. This module owns how
//! a session's handle is opened (at the volume's generation fence, as an
//! export's is, so a front end of an older generation is refused here
//! exactly as an NBD client would be) and where its calls run (the
//! daemon's blocking threads, at the priority of volume I/O, not the
//! listener's background priority). It must not decide which volumes are
//! replicas of what: the front end's records do.

use crate::device::Registry;
use lamina_blockio::{BlockIo, IoError, IoErrorKind};
use lamina_engine::ErrorKind;
use std::sync::Arc;

/// This node's volumes, served to front ends.
pub struct Served {
    pool: lamina_engine::Pool,
    exports: Arc<Registry>,
    runtime: tokio::runtime::Handle,
    /// Drawn once, with the pool open for the daemon's life: what its
    /// volumes' instances are made from (none if it could not be drawn).
    drawn: Option<u64>,
    /// The daemon's store, with the replica sets' shared record, if it keeps
    /// one: a front end that took a volume over is recognised there
    /// (docs/replicas.md, "Taking a volume over"), and this node's own
    /// volume taken over by another node is made its replica ([`demote`]).
    store: Option<Arc<crate::store::Store>>,
}

impl Served {
    /// Calls run on `runtime`'s blocking threads. `pool` stays open as
    /// long as this lives: what it acknowledged is lost only with it.
    pub fn new(
        pool: lamina_engine::Pool,
        exports: Arc<Registry>,
        runtime: tokio::runtime::Handle,
    ) -> Served {
        let drawn = {
            use std::io::Read;
            let mut b = [0u8; 8];
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut b))
                .map(|()| u64::from_be_bytes(b))
                .map_err(|e| tracing::warn!(error = %e, "no instance drawn: front ends resend what no flush covered"))
                .ok()
        };
        Served {
            pool,
            exports,
            runtime,
            drawn,
            store: None,
        }
    }

    /// With the daemon's store (and its shared record).
    pub fn sharing(mut self, store: &Arc<crate::store::Store>) -> Served {
        self.store = Some(store.clone());
        self
    }

    /// A replica of node `front`'s asked for by node `peer`: served to it
    /// if the shared record names `peer`'s front end (its first replica)
    /// and this node among the replicas (`peer` took the volume over: docs/replicas.md), and
    /// relabelled `peer`'s from then on.
    fn adopt(&self, volume: &str, front: &str, peer: &str) -> Result<bool, IoError> {
        let Some((shared, me)) = self.store.as_ref().and_then(|st| st.shared()) else {
            return Ok(false);
        };
        let rec = match shared.read(volume) {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(false),
            Err(e) => {
                return Err(IoError::new(
                    IoErrorKind::Io,
                    format!("volume {volume} here is node {front}'s replica, and whether node {peer} took it over cannot be read: {e}"),
                ))
            }
        };
        if rec.front_end != peer || !rec.took_over_from(&me) {
            return Ok(false);
        }
        relabel(&self.pool, volume, Some(peer)).map_err(engine_error)?;
        tracing::warn!(
            volume,
            from = front,
            to = peer,
            generation = rec.generation,
            "replica taken over by another front end, as the shared record says"
        );
        Ok(true)
    }
}

/// The label a volume made for a front end carries: that front end's node.
pub const REPLICA_OF: &str = lamina_api::REPLICA_OF_LABEL;

/// The front end's node whose replica `v` is, if it is one.
pub fn replica_of(v: &lamina_engine::VolumeInfo) -> Option<&str> {
    v.labels
        .iter()
        .find(|(k, _)| k == REPLICA_OF)
        .map(|(_, front)| front.as_str())
}

/// Volume `volume` made node `front`'s replica (labelled so), or with
/// None, one of this node's own: its other labels kept.
pub fn relabel(
    pool: &lamina_engine::Pool,
    volume: &str,
    front: Option<&str>,
) -> Result<(), lamina_engine::Error> {
    let v = pool.volume_info_by_name(volume)?;
    let mut labels: Vec<(String, String)> = v
        .labels
        .into_iter()
        .filter(|(k, _)| k != REPLICA_OF)
        .collect();
    if let Some(f) = front {
        labels.push((REPLICA_OF.to_string(), f.to_string()));
    }
    pool.set_volume_labels(volume, &labels).map(drop)
}

impl Served {
    /// Make `volume` (`size` bytes, labelled with the front end's node) if
    /// this node has none of that name. One there already must be one made
    /// so for the same front end, of that size, and never written (no data,
    /// no snapshot): a volume of this node's own is never taken over as a
    /// replica, nor one left from an earlier volume as a new one's.
    fn create(&self, volume: &str, peer: &str, size: u64) -> Result<(), IoError> {
        let invalid = |m: String| IoError::new(IoErrorKind::Invalid, m);
        let check = |v: lamina_engine::VolumeInfo| {
            let of = v.labels.iter().find(|(k, _)| k == REPLICA_OF);
            if of.is_none_or(|(_, front)| front != peer) {
                return Err(invalid(format!(
                    "this node holds a volume {volume} that is not a replica of node {peer}'s"
                )));
            }
            if v.size != size {
                return Err(invalid(format!(
                    "this node holds a volume {volume} of {} bytes, not {size}",
                    v.size
                )));
            }
            // One made by an earlier ask of this same create (or add) was
            // never written: as good as a new one. One with data or
            // snapshots is left from an earlier volume of that name (its
            // replica removed, or the volume deleted, while this node was
            // away), and would be taken for a copy of the new one.
            let snapshots = self
                .pool
                .list_snapshots(volume)
                .map_err(|e| IoError::new(IoErrorKind::Io, e.to_string()))?;
            if v.allocated_bytes > 0 || !snapshots.is_empty() {
                return Err(invalid(format!(
                    "this node holds a volume {volume} of node {peer}'s with {} bytes of data and {} snapshots, left from an earlier volume of that name (a replica removed, or the volume deleted, while this node was away): delete it here first (lamina volume delete {volume} --with-snapshots, on this node)",
                    v.allocated_bytes,
                    snapshots.len()
                )));
            }
            Ok(())
        };
        if let Ok(v) = self.pool.volume_info_by_name(volume) {
            return check(v);
        }
        let labels = [(REPLICA_OF.to_string(), peer.to_string())];
        match self.pool.create_volume_labelled(volume, size, &labels) {
            Ok(_) => {
                tracing::info!(volume, peer, size, "replica session: volume made");
                Ok(())
            }
            // Made meanwhile by another caller: as good, if of this size.
            Err(e) if e.kind() == ErrorKind::AlreadyExists => self
                .pool
                .volume_info_by_name(volume)
                .map_err(|e| IoError::new(IoErrorKind::Io, e.to_string()))
                .and_then(check),
            Err(e) if e.kind() == ErrorKind::NoSpace => {
                Err(IoError::new(IoErrorKind::NoSpace, e.to_string()))
            }
            Err(e) if e.kind() == ErrorKind::Invalid => Err(invalid(e.to_string())),
            Err(e) => Err(IoError::new(IoErrorKind::Io, e.to_string())),
        }
    }
}

/// A snapshot there already is as good as the one asked for if it is a
/// copy of the same origin (or either origin is unsaid: a front end or a
/// snapshot of version 2); one of another origin is another snapshot of
/// that name, which this node does not take for the one asked.
fn same_origin(
    s: &lamina_engine::SnapshotInfo,
    origin: u64,
    volume: &str,
    name: &str,
) -> Result<(), IoError> {
    let had = s
        .labels
        .iter()
        .find(|(k, _)| k == lamina_transfer::identity::ORIGIN_LABEL)
        .and_then(|(_, v)| lamina_transfer::identity::parse(v));
    match had {
        Some(h) if origin != 0 && h != origin => Err(IoError::new(
            IoErrorKind::Invalid,
            format!(
                "snapshot {volume}/{name} here is a copy of {h:016x}, not of {origin:016x}: another snapshot of that name"
            ),
        )),
        _ => Ok(()),
    }
}

/// The data path's error for an engine error met serving a session.
fn engine_error(e: lamina_engine::Error) -> IoError {
    let kind = match e.kind() {
        ErrorKind::NotFound => IoErrorKind::Gone,
        ErrorKind::NoSpace => IoErrorKind::NoSpace,
        ErrorKind::Invalid => IoErrorKind::Invalid,
        ErrorKind::ReadOnly => IoErrorKind::ReadOnly,
        ErrorKind::AlreadyExists
        | ErrorKind::Conflict
        | ErrorKind::Unavailable
        | ErrorKind::Internal => IoErrorKind::Io,
    };
    IoError::new(kind, e.to_string())
}

impl Served {
    /// Only a volume made for `peer`'s front end is served to it: a node's
    /// own volumes, and another front end's replicas, are not.
    fn check_replica_of(&self, volume: &str, peer: &str) -> Result<(), IoError> {
        let v = self.pool.volume_info_by_name(volume).map_err(|e| {
            IoError::new(
                IoErrorKind::Gone,
                format!("this node holds no volume {volume}: {e}"),
            )
        })?;
        match replica_of(&v) {
            Some(front) if front == peer => Ok(()),
            Some(front) if self.adopt(volume, front, peer)? => Ok(()),
            Some(front) => Err(IoError::new(
                IoErrorKind::Invalid,
                format!(
                    "volume {volume} here is a replica of node {front}'s, not of node {peer}'s"
                ),
            )),
            // This node's front end, taken over by `peer` while its daemon
            // lived (a pod moved with both nodes up): made `peer`'s replica
            // now, rather than at its next open, unless a client still has
            // it attached (its writes are refused: the generation).
            None if !self.exports.contains(volume)
                && self
                    .store
                    .as_ref()
                    .and_then(|st| demote(&self.pool, st, volume))
                    .is_some_and(|front| front == peer) =>
            {
                Ok(())
            }
            None => Err(IoError::new(
                IoErrorKind::Invalid,
                format!("volume {volume} is this node's own, not a replica of node {peer}'s"),
            )),
        }
    }
}

/// This node's front end of `volume` was taken over: one that held no
/// replica forgets the volume once the shared record names another
/// node's front end. Otherwise, if the shared record
/// names another node's front end, as its first replica, and this node
/// among its replicas ([`crate::store::SharedSet::took_over_from`]), this
/// node's volume becomes that front end's replica (labelled so, as are the
/// snapshots it made as the front end; its replica set and export
/// forgotten here), which the new front end rebuilds. The
/// new front end's node when done; None when the record says otherwise, or
/// cannot be read or acted on (logged: the next open, or the new front
/// end's next session, tries again).
pub fn demote(
    pool: &lamina_engine::Pool,
    store: &crate::store::Store,
    volume: &str,
) -> Option<String> {
    let (shared, me) = store.shared()?;
    let diskless = store
        .replica_set(volume)
        .ok()
        .flatten()
        .is_some_and(|r| r.diskless);
    let rec = match shared.read(volume) {
        Ok(Some(r)) => r,
        // A volume deleted: one fronted here with no replica is forgotten.
        Ok(None) if diskless => crate::store::SharedSet::default(),
        Ok(None) => return None,
        // One fronted here with no replica is looked at every 5 s while
        // detached (`forget_taken_diskless`): not a warning each time the
        // API server is out of reach.
        Err(e) if diskless => {
            tracing::debug!(volume, error = %e, "the shared record of a volume fronted here with no replica cannot be read");
            return None;
        }
        Err(e) => {
            tracing::warn!(volume, error = %e, "the shared record of a volume taken over cannot be read");
            return None;
        }
    };
    // A front end here that held no replica: another node's front end
    // holds the volume now (or none: it was deleted), and nothing here is
    // the volume's.
    if diskless && rec.front_end != me {
        let forgot = store
            .remove_export(volume)
            .and_then(|_| store.forget_replica_set(volume));
        return match forgot {
            Ok(_) => {
                tracing::warn!(volume, front_end = %rec.front_end, generation = rec.generation,
                    "this node's front end, holding no replica, was taken over: the volume is forgotten here");
                Some(rec.front_end)
            }
            Err(e) => {
                tracing::warn!(volume, error = %e, "a volume taken over from this node's front end could not be forgotten here");
                None
            }
        };
    }
    if !rec.took_over_from(&me) {
        return None;
    }
    let done = (|| -> Result<(), crate::ServerError> {
        // Its snapshots, made while it was the front end, are the volume's:
        // the new front end's to delete from now on (as those made for it
        // are), labelled first, the volume last, so a demotion cut off is
        // done again whole.
        let live = format!("{volume}@{}", pool.volume_info_by_name(volume)?.id);
        for s in pool.list_snapshots(&live)? {
            if s.system || s.labels.iter().any(|(k, _)| k == REPLICA_OF) {
                continue;
            }
            let mut labels = s.labels.clone();
            labels.push((REPLICA_OF.to_string(), rec.front_end.clone()));
            pool.set_snapshot_labels(&live, &s.name, &labels)?;
        }
        relabel(pool, volume, Some(&rec.front_end))?;
        store.remove_export(volume)?;
        store.forget_replica_set(volume)?;
        Ok(())
    })();
    match done {
        Ok(()) => {
            tracing::warn!(volume, front_end = %rec.front_end, generation = rec.generation, "this node's front end was taken over: its volume is now that front end's replica");
            Some(rec.front_end)
        }
        Err(e) => {
            tracing::warn!(volume, error = %e, "a volume taken over could not be made the new front end's replica");
            None
        }
    }
}

impl lamina_transfer::replica::Volumes for Served {
    fn open(
        &self,
        volume: &str,
        peer: &str,
        create: Option<u64>,
    ) -> Result<Arc<dyn BlockIo>, IoError> {
        if let Some(size) = create {
            self.create(volume, peer, size)?;
        }
        self.check_replica_of(volume, peer)?;
        match self.exports.open_engine(&self.pool, volume, None) {
            Ok(d) => {
                tracing::info!(volume, peer, "replica session: volume opened");
                Ok(Arc::new(d))
            }
            Err(crate::error::ServerError::Engine(e)) if e.kind() == ErrorKind::NotFound => {
                Err(IoError::new(
                    IoErrorKind::Gone,
                    format!("this node holds no volume {volume}: {e}"),
                ))
            }
            Err(e) => Err(IoError::new(IoErrorKind::Io, e.to_string())),
        }
    }

    /// The drawn number, the pool's identity and the volume's (a volume
    /// deleted and made again is another), hashed.
    fn instance(&self, volume: &str) -> Option<u64> {
        use std::hash::{Hash, Hasher};
        let drawn = self.drawn?;
        let id = self.pool.volume_info_by_name(volume).ok()?.id;
        let mut h = std::hash::DefaultHasher::new();
        (drawn, self.pool.pool_id(), id).hash(&mut h);
        Some(h.finish())
    }

    fn snapshot(
        &self,
        volume: &str,
        name: &str,
        origin: u64,
        group: bool,
        peer: &str,
    ) -> Result<(), IoError> {
        self.check_replica_of(volume, peer)?;
        lamina_engine::check_name(name)
            .map_err(|e| IoError::new(IoErrorKind::Invalid, e.to_string()))?;
        let same = |s: &lamina_engine::SnapshotInfo| same_origin(s, origin, volume, name);
        if let Ok(s) = self.pool.snapshot_info_by_name(volume, name) {
            return same(&s);
        }
        let mut labels = vec![(REPLICA_OF.to_string(), peer.to_string())];
        if origin != 0 {
            let o = lamina_transfer::identity::format(origin);
            labels.push((lamina_transfer::identity::ORIGIN_LABEL.to_string(), o));
        }
        if group {
            // A member of the group snapshot of its name: `snapshot
            // get-group` finds it here too.
            labels.push((lamina_engine::GROUP_LABEL.to_string(), name.to_string()));
        }
        let t = std::time::Instant::now();
        match self.pool.create_snapshot(volume, name, &labels) {
            Ok(_) => {
                tracing::info!(
                    volume,
                    snapshot = name,
                    peer,
                    took_us = t.elapsed().as_micros() as u64,
                    "replica session: snapshot made"
                );
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => self
                .pool
                .snapshot_info_by_name(volume, name)
                .map_err(engine_error)
                .and_then(|s| same(&s)),
            Err(e) => Err(engine_error(e)),
        }
    }

    fn delete_snapshot(&self, volume: &str, name: &str, peer: &str) -> Result<(), IoError> {
        self.check_replica_of(volume, peer)?;
        lamina_engine::check_name(name)
            .map_err(|e| IoError::new(IoErrorKind::Invalid, e.to_string()))?;
        match self.pool.snapshot_info_by_name(volume, name) {
            Err(_) => return Ok(()),
            // Made for a front end of this volume: `peer`'s, or one it took
            // the volume over from (the volume is `peer`'s replica: checked).
            Ok(s) if !s.labels.iter().any(|(k, _)| k == REPLICA_OF) => {
                return Err(IoError::new(
                    IoErrorKind::Invalid,
                    format!(
                        "snapshot {volume}/{name} here was not made for node {peer}'s front end"
                    ),
                ))
            }
            Ok(_) => {}
        }
        match self.pool.delete_snapshot(volume, name) {
            Ok(_) => {
                tracing::info!(
                    volume,
                    snapshot = name,
                    peer,
                    "replica session: snapshot deleted"
                );
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(engine_error(e)),
        }
    }

    /// Only a volume made for `peer` (labelled so) goes, as `lamina volume
    /// delete` would delete it here: refused while it or one of its
    /// snapshots is attached; its snapshots made for `peer` go with it, and
    /// any other (the node's own) stays with the deleted volume, as a
    /// delete without `--with-snapshots` keeps them; a snapshot a linked
    /// clone here shares leaves the clone its data (the engine's rule).
    fn retire(&self, volume: &str, peer: &str, check: bool) -> Result<bool, IoError> {
        match self.check_replica_of(volume, peer) {
            Err(e) if e.kind == IoErrorKind::Gone => return Ok(false),
            r => r?,
        }
        let snapshots = self
            .pool
            .list_snapshots(volume)
            .map_err(engine_error)
            .or_else(|e| match e.kind {
                IoErrorKind::Gone => Ok(Vec::new()),
                _ => Err(e),
            })?;
        let attached = |export: &str| {
            self.exports.contains(export).then(|| {
                IoError::new(
                    IoErrorKind::Io,
                    format!("{export} is attached on this node: detach it there first (lamina volume detach / snapshot detach)"),
                )
            })
        };
        if let Some(e) = attached(volume) {
            return Err(e);
        }
        for s in &snapshots {
            if let Some(e) = attached(&format!("{volume}@{}", s.name)) {
                return Err(e);
            }
        }
        if check {
            return Ok(true);
        }
        // Made for a front end of this volume (`peer`'s, or one it took
        // the volume over from).
        let mine = |s: &lamina_engine::SnapshotInfo| {
            !s.system && s.labels.iter().any(|(k, _)| k == REPLICA_OF)
        };
        for s in snapshots.iter().filter(|s| mine(s)) {
            match self.pool.delete_snapshot(volume, &s.name) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(engine_error(e)),
            }
        }
        match self.pool.delete_volume(volume, false) {
            Ok(()) => {
                tracing::info!(volume, peer, "replica session: volume deleted");
                Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(engine_error(e)),
        }
    }

    fn runtime(&self) -> tokio::runtime::Handle {
        self.runtime.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::tests::Faults;
    use crate::store::Store;
    use lamina_blockio::testing::contract;
    use lamina_blockio::{wait, IoDone, IoOp};
    use lamina_engine::{Pool, PoolOptions};
    use lamina_transfer::replica::{RemoteVolume, SessionOptions};
    use lamina_transfer::{certs, Identity, Remote, Source};

    /// One node's pool and store with volumes "a", "b" and "c" of 8 MiB, served to front
    /// ends on a real TLS listener; a restart abandons the pool, as a
    /// killed daemon would, and serves it again on a new port.
    struct Node {
        dir: tempfile::TempDir,
        rt: tokio::runtime::Runtime,
        pool: Option<Pool>,
        source: Option<(
            Arc<Source>,
            std::net::SocketAddr,
            tokio::sync::oneshot::Sender<()>,
        )>,
        front: Identity,
        /// The registry the node's sessions open handles from.
        exports: Option<Arc<Registry>>,
        /// The listener's task, and the store it serves from.
        serving: Option<(tokio::task::JoinHandle<()>, Arc<Store>)>,
        /// Opened as a replicated volume: "a" in process (its handle from
        /// the registry, as a local export's) and "b" and "c" over replica
        /// sessions, its faults recorded here.
        replicated: Option<Arc<Faults>>,
    }

    impl Node {
        fn new() -> Node {
            let dir = tempfile::tempdir().unwrap();
            certs::create_ca(&dir.path().join("ca")).unwrap();
            for n in ["replica", "front"] {
                certs::issue(&dir.path().join("ca"), n, &dir.path().join(n)).unwrap();
            }
            let pool = Pool::create_dir(dir.path().join("pool"), PoolOptions::default()).unwrap();
            // Made for the front end's node, as its sessions make them.
            let made_for = [(REPLICA_OF.to_string(), "front".to_string())];
            for v in ["a", "b", "c"] {
                pool.create_volume_labelled(v, 8 << 20, &made_for).unwrap();
            }
            pool.create_volume("own", 8 << 20).unwrap();
            let front = Identity::load(&dir.path().join("front")).unwrap();
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let mut n = Node {
                dir,
                rt,
                pool: Some(pool),
                source: None,
                front,
                exports: None,
                serving: None,
                replicated: None,
            };
            n.serve();
            n
        }

        fn serve(&mut self) {
            let store = Arc::new(Store::open(&self.dir.path().join("store.redb")).unwrap());
            let store_of = store.clone();
            let exports = Arc::new(Registry::new(store));
            self.exports = Some(exports.clone());
            let pool = self.pool.clone().unwrap();
            let id = Arc::new(Identity::load(&self.dir.path().join("replica")).unwrap());
            let source = Source::new(Arc::new(pool.clone()), id);
            source.serve_volumes(Arc::new(Served::new(
                pool,
                exports,
                self.rt.handle().clone(),
            )));
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.set_nonblocking(true).unwrap();
            let addr = l.local_addr().unwrap();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let s = source.clone();
            let task = self.rt.spawn(async move {
                let l = tokio::net::TcpListener::from_std(l).unwrap();
                let _ = s
                    .serve(l, async {
                        let _ = stopped.await;
                    })
                    .await;
            });
            self.source = Some((source, addr, stop));
            self.serving = Some((task, store_of));
        }

        /// Stop serving: the listener and every session end.
        fn stop_sessions(&mut self) {
            let (source, _, stop) = self.source.take().unwrap();
            let _ = stop.send(());
            self.exports = None;
            // The sessions end with the listener's task; their handles
            // with them.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while source.replica_sessions() > 0 {
                assert!(std::time::Instant::now() < deadline, "sessions never ended");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }

        fn connect(&self, volume: &str) -> Result<RemoteVolume, lamina_transfer::TransferError> {
            let (_, addr, _) = self.source.as_ref().unwrap();
            let remote = Remote {
                address: addr.to_string(),
                node: "replica".into(),
            };
            RemoteVolume::connect(&self.front, &remote, volume, SessionOptions::default())
        }

        /// Volume `a` in process, `b` and `c` over sessions, as one.
        fn replicated(&self) -> lamina_replica::Replicated {
            let faults = self.replicated.as_ref().unwrap();
            let local = self
                .exports
                .as_ref()
                .unwrap()
                .open_engine(self.pool.as_ref().unwrap(), "a", None)
                .unwrap();
            let mut replicas = vec![lamina_replica::Replica {
                name: "a".into(),
                io: Arc::new(local),
            }];
            for v in ["b", "c"] {
                replicas.push(lamina_replica::Replica {
                    name: v.into(),
                    io: Arc::new(self.connect(v).unwrap()),
                });
            }
            lamina_replica::Replicated::new("r", replicas, faults.clone()).unwrap()
        }

        /// What each of `volumes` holds at 0, read over a session of a
        /// holder of generation `g`.
        fn first_block(&self, volumes: &[&str], g: u64) -> Vec<Vec<u8>> {
            volumes
                .iter()
                .map(|v| {
                    let v = self.connect(v).unwrap();
                    v.activate(g).unwrap();
                    first_block(&v)
                })
                .collect()
        }
    }

    /// What `v` holds in its first 4 KiB.
    fn first_block(v: &dyn BlockIo) -> Vec<u8> {
        match wait(
            v,
            IoOp::Read {
                offset: 0,
                buf: vec![0; 4096],
            },
        ) {
            Ok(IoDone::Read(b)) => b,
            r => panic!("{r:?}"),
        }
    }

    impl contract::Subject for Node {
        fn open(&mut self) -> Arc<dyn BlockIo> {
            if self.replicated.is_some() {
                return Arc::new(self.replicated());
            }
            Arc::new(self.connect("a").unwrap())
        }

        fn restart(&mut self) {
            self.stop_sessions();
            // The store is opened again once the last handle on it (calls
            // still finishing on the runtime's blocking threads) is gone.
            let (task, store) = self.serving.take().unwrap();
            self.rt.block_on(task).unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while Arc::strong_count(&store) > 1 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the store is still held"
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            drop(store);
            self.pool.take().unwrap().abandon();
            let pool =
                Pool::open_dir(self.dir.path().join("pool"), PoolOptions::default()).unwrap();
            self.pool = Some(pool);
            self.serve();
        }
    }

    #[test]
    fn an_engine_volume_served_over_a_replica_session_keeps_the_contract() {
        let mut n = Node::new();
        contract::run(&mut n);
        // The replica holds what the suite wrote last, through the session
        // as in its pool.
        assert_eq!(n.first_block(&["a"], 4), vec![vec![4u8; 4096]]);
    }

    #[test]
    fn a_replicated_volume_of_a_local_and_two_remote_replicas_keeps_the_contract() {
        let mut n = Node::new();
        n.replicated = Some(Arc::default());
        contract::run(&mut n);
        let faults = n.replicated.clone().unwrap();
        assert_eq!(*faults.0.lock().unwrap(), Vec::<String>::new());
        assert_eq!(n.first_block(&["a", "b", "c"], 4), vec![vec![4u8; 4096]; 3]);
    }

    #[test]
    fn a_replicated_volume_goes_on_when_a_remote_replica_is_lost() {
        let mut n = Node::new();
        let faults = Arc::new(Faults::default());
        n.replicated = Some(faults.clone());
        let r = n.replicated();
        r.activate(1).unwrap();
        let write = |seed: u8| {
            wait(
                &r,
                IoOp::Write {
                    offset: 0,
                    data: vec![seed; 4096],
                    fua: true,
                },
            )
        };
        write(1).unwrap();
        // The remote replicas' sessions are cut under the volume (their
        // node lost, as far as the front end can tell): the next write
        // faults them, records it, and succeeds on the local one.
        assert!(r
            .states()
            .iter()
            .all(|(_, s)| *s == lamina_replica::State::Healthy));
        n.stop_sessions();
        write(2).unwrap();
        let states = r.states();
        assert_eq!(
            states[0].1,
            lamina_replica::State::Healthy,
            "the local replica"
        );
        for (name, s) in &states[1..] {
            match s {
                lamina_replica::State::Faulted(why) => {
                    assert!(
                        why.contains(&format!("replica volume {name} on replica (")),
                        "{name}: {why}"
                    )
                }
                s => panic!("{name}: {s:?}"),
            }
        }
        assert_eq!(
            faults.0.lock().unwrap().len(),
            2,
            "both remote replicas recorded"
        );
        // Reads come from the replica that holds every write.
        assert_eq!(first_block(&r), vec![2; 4096]);
    }

    #[test]
    fn a_front_end_makes_its_replica_once_and_of_one_size() {
        let n = Node::new();
        let (_, addr, _) = n.source.as_ref().unwrap();
        let remote = Remote {
            address: addr.to_string(),
            node: "replica".into(),
        };
        let o = SessionOptions::default();
        let v = RemoteVolume::create(&n.front, &remote, "new", 4 << 20, o).unwrap();
        assert_eq!(v.size().unwrap(), 4 << 20);
        let info = n.pool.as_ref().unwrap().volume_info_by_name("new").unwrap();
        assert_eq!(
            info.labels,
            vec![(REPLICA_OF.to_string(), "front".to_string())]
        );
        // Again, of the same size: the same volume, while it was never
        // written.
        drop(RemoteVolume::create(&n.front, &remote, "new", 4 << 20, o).unwrap());
        // Written (or with a snapshot): left from an earlier volume, it is
        // never taken for a new one's replica.
        let pool = n.pool.as_ref().unwrap();
        pool.create_volume_labelled("old", 4 << 20, &info.labels)
            .unwrap();
        pool.create_snapshot("old", "s", &[]).unwrap();
        pool.create_volume_labelled("used", 4 << 20, &info.labels)
            .unwrap();
        let used = RemoteVolume::connect(&n.front, &remote, "used", o).unwrap();
        used.activate(1).unwrap();
        lamina_blockio::wait(
            &used,
            lamina_blockio::IoOp::Write {
                offset: 0,
                data: vec![1; 4096],
                fua: true,
            },
        )
        .unwrap();
        for (v, what) in [
            ("old", "0 bytes of data and 1 snapshots"),
            ("used", "4096 bytes of data and 0 snapshots"),
        ] {
            let e = RemoteVolume::create(&n.front, &remote, v, 4 << 20, o)
                .err()
                .unwrap();
            assert!(
                e.to_string().contains(&format!(
                    "holds a volume {v} of node front's with {what}, left from an earlier volume"
                )) && e
                    .to_string()
                    .contains(&format!("lamina volume delete {v} --with-snapshots")),
                "{e}"
            );
        }
        let e = RemoteVolume::create(&n.front, &remote, "new", 8 << 20, o)
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .contains("this node holds a volume new of 4194304 bytes, not 8388608"),
            "{e}"
        );
        // A volume of the node's own is never taken over, nor served.
        let e = RemoteVolume::create(&n.front, &remote, "own", 8 << 20, o)
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .contains("holds a volume own that is not a replica of node front's"),
            "{e}"
        );
        let e = RemoteVolume::connect(&n.front, &remote, "own", o)
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .contains("volume own is this node's own, not a replica of node front's"),
            "{e}"
        );
        assert!(n
            .pool
            .as_ref()
            .unwrap()
            .volume_info_by_name("own")
            .unwrap()
            .labels
            .is_empty());
    }

    #[test]
    fn a_front_end_snapshots_its_replica_by_name() {
        let n = Node::new();
        let v = n.connect("b").unwrap();
        v.snapshot("s1", 0x5eed, false).unwrap();
        // Again: the same snapshot, as good; another origin is not.
        v.snapshot("s1", 0x5eed, false).unwrap();
        let e = v.snapshot("s1", 0x5eee, false).unwrap_err();
        assert_eq!((e.kind, e.op), (IoErrorKind::Invalid, "snapshot"), "{e}");
        assert!(e.message.contains("another snapshot of that name"), "{e}");
        let p = n.pool.as_ref().unwrap();
        let s = p.snapshot_info_by_name("b", "s1").unwrap();
        let mut labels = s.labels.clone();
        labels.sort();
        assert_eq!(
            labels,
            vec![
                (
                    lamina_transfer::identity::ORIGIN_LABEL.to_string(),
                    "0000000000005eed".to_string()
                ),
                (REPLICA_OF.to_string(), "front".to_string()),
            ]
        );
        // Its identity in the transfer protocol is its origin's.
        assert_eq!(
            lamina_transfer::identity::of_snapshot(p.pool_id(), s.id, &s.labels),
            0x5eed
        );
        assert_eq!(p.list_snapshots("b").unwrap().len(), 1);
        let e = v.snapshot("a/b", 0, false).unwrap_err();
        assert_eq!((e.kind, e.op), (IoErrorKind::Invalid, "snapshot"), "{e}");
        // The session goes on after a refused snapshot.
        assert_eq!(v.size().unwrap(), 8 << 20);
        v.delete_snapshot("s1").unwrap();
        v.delete_snapshot("s1").unwrap();
        assert!(p.list_snapshots("b").unwrap().is_empty());
        // A snapshot the node made itself is not the front end's to delete.
        p.create_snapshot("b", "own", &[]).unwrap();
        let e = v.delete_snapshot("own").unwrap_err();
        assert!(e.message.contains("was not made for node front's"), "{e}");
        // A group snapshot's member carries the group's label too.
        v.snapshot("g1", 0x77, true).unwrap();
        let g = p.snapshot_info_by_name("b", "g1").unwrap();
        assert!(
            g.labels
                .contains(&(lamina_engine::GROUP_LABEL.to_string(), "g1".to_string())),
            "{:?}",
            g.labels
        );
    }

    #[test]
    fn a_front_end_deletes_only_its_own_replicas_volume_and_snapshots() {
        use lamina_transfer::wire::Code;
        let n = Node::new();
        let (_, addr, _) = n.source.as_ref().unwrap();
        let remote = Remote {
            address: addr.to_string(),
            node: "replica".into(),
        };
        let t = std::time::Duration::from_secs(10);
        let retire =
            |v: &str, check: bool| lamina_transfer::replica::retire(&n.front, &remote, v, check, t);
        let p = n.pool.as_ref().unwrap();
        let not_replica = |v: &str, why: &str| {
            for check in [true, false] {
                let e = retire(v, check).unwrap_err();
                assert!(
                    matches!(
                        e,
                        lamina_transfer::TransferError::Remote {
                            code: Code::NotReplica,
                            ..
                        }
                    ),
                    "{e}"
                );
                assert!(e.to_string().contains(why), "{e}");
            }
            assert!(p.volume_info_by_name(v).is_ok(), "{v} is gone");
        };
        // The node's own volume, and another front end's replica: never.
        not_replica("own", "volume own is this node's own");
        let other = [(REPLICA_OF.to_string(), "elsewhere".to_string())];
        p.create_volume_labelled("theirs", 8 << 20, &other).unwrap();
        not_replica(
            "theirs",
            "a replica of node elsewhere's, not of node front's",
        );

        // Volume b: a snapshot the front end made, one the node made
        // itself, and a linked clone here of the front end's.
        let v = n.connect("b").unwrap();
        v.snapshot("s1", 0x5eed, false).unwrap();
        drop(v);
        p.create_snapshot("b", "mine", &[]).unwrap();
        p.clone_snapshot("b", "s1", "kept").unwrap();
        // Attached here: refused, checked or not, and nothing goes.
        let exports = n.exports.as_ref().unwrap();
        let io = Arc::new(exports.open_engine(p, "b", Some("s1")).unwrap());
        let activity = Arc::new(crate::pacing::Activity::default());
        exports.insert("b@s1", io, None, activity);
        for check in [true, false] {
            let e = retire("b", check).unwrap_err();
            assert!(
                e.to_string().contains("b@s1 is attached on this node"),
                "{e}"
            );
        }
        assert_eq!(p.list_snapshots("b").unwrap().len(), 2);
        exports.remove("b@s1").unwrap();
        // Checked: there, and nothing deleted.
        assert!(retire("b", true).unwrap());
        assert_eq!(p.list_snapshots("b").unwrap().len(), 2);
        // Deleted: the volume and the front end's snapshot; the node's own
        // snapshot stays with the deleted volume, and the clone keeps its
        // data.
        assert!(retire("b", false).unwrap());
        assert!(p.volume_info_by_name("b").is_err());
        let left: Vec<String> = p
            .list_snapshots("b")
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(left, vec!["mine".to_string()]);
        assert!(p.volume_info_by_name("kept").is_ok());
        // Gone: as good, checked or not.
        assert!(!retire("b", false).unwrap());
        assert!(!retire("b", true).unwrap());
        assert!(!retire("never", false).unwrap());
    }

    #[test]
    fn a_front_end_attaching_to_a_volume_this_node_lacks_is_told_so() {
        let n = Node::new();
        let e = n.connect("nope").err().unwrap();
        assert_eq!(e.reason(), lamina_transfer::Reason::SnapshotMissing, "{e}");
        assert!(
            e.to_string().contains("this node holds no volume nope"),
            "{e}"
        );
        // A name the engine refuses never reaches the pool.
        let e = n.connect("../x").err().unwrap();
        assert!(e.to_string().contains("BadRequest"), "{e}");
    }
}
