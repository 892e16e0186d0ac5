//! The daemon's shared state: the pool, the store, the export registry, the
//! per-volume operation locks, the operations' records as they move
//! (`ledger`), and conversions to API types.

mod ledger;

pub use ledger::{new_record, Live, Step};

use crate::device::Registry;
use crate::error::{Failure, ServerError};
use crate::paths::Layout;
use crate::store::{ExportRec, Store};
use crate::Config;
use lamina_api as api;
use lamina_engine::Pool;
use ledger::Running;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tracing::Instrument;

pub struct State {
    pub layout: Layout,
    pub pool: Pool,
    pub store: Arc<Store>,
    pub exports: Arc<Registry>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    pub token: Option<String>,
    pub nbd_tcp: Option<SocketAddr>,
    /// Live progress of running copy jobs, by operation id.
    pub progress: Mutex<HashMap<String, Live>>,
    /// Set at shutdown: background jobs stop at their next step and leave
    /// their operation running, to be resumed at the next start.
    pub stopping: std::sync::atomic::AtomicBool,
    /// Running operations by volume (mirrors the store's records in state
    /// `running`), so describing a volume needs no scan of the store. A
    /// volume can have several: a background one (a full clone's copy, a
    /// flatten) and the request running now.
    running: Mutex<HashMap<String, Vec<Running>>>,
    /// Background jobs (full clones, flatten watchers), joined at shutdown.
    pub jobs: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// The change feed: bumped by every operation record and export change.
    pub changes: crate::changes::Changes,
    /// This node's transfer identity (to pull from peers and serve them).
    pub identity: Option<Arc<lamina_transfer::Identity>>,
    /// Serves this node's snapshots to peers, when asked to listen.
    pub transfer_source: Option<Arc<lamina_transfer::Source>>,
    /// See [`crate::TransferConfig::retry_window`].
    pub transfer_retry_window: std::time::Duration,
    /// The schedules' clock, wake-up and lock.
    pub schedules: crate::schedules::Runtime,
    pub high_water: crate::HighWater,
    pub metrics: crate::metrics::Metrics,
    /// Count each export's I/O (`--volume-io-metrics`).
    volume_io_metrics: bool,
    /// Every export's client I/O, counted for the transfer's pace.
    activity: Arc<crate::pacing::Activity>,
    /// Held (shared) by every task [`State::to_end`] runs; `close` takes it
    /// whole, so the pool closes after the last of them ended.
    in_flight: Arc<tokio::sync::RwLock<()>>,
    /// See `Testing::hold_operations` (config.rs): always `None` without
    /// the `testing` feature.
    pub(crate) hold_operations: Option<std::path::PathBuf>,
}

/// How long a detach waits for NBD clients that are disconnecting before it
/// refuses (without `force`).
const DETACH_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

pub fn rfc3339(ns: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns);
    humantime::format_rfc3339_seconds(t).to_string()
}

pub fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// Export name of a snapshot: `VOLUME@SNAPSHOT` ('@' is never in a name).
pub fn snapshot_export(volume: &str, snapshot: &str) -> String {
    format!("{volume}@{snapshot}")
}

impl State {
    pub async fn open(layout: &Layout, config: &Config) -> Result<State, ServerError> {
        let l = layout.clone();
        let opts = config.pool_options();
        let pool = tokio::task::spawn_blocking(move || {
            if l.pool.join(lamina_engine::POOL_FILE).exists() {
                Pool::open_dir(&l.pool, opts)
            } else {
                Pool::create_dir(&l.pool, opts)
            }
        })
        .await
        .expect("pool open task")?;
        let store = Arc::new(Store::open(&layout.store)?);
        let token = match config.listen {
            Some(_) => Some(layout.token()?),
            None => None,
        };
        let identity = match &config.transfer.tls_dir {
            Some(dir) => Some(Arc::new(
                lamina_transfer::Identity::load(dir).map_err(ServerError::Transfer)?,
            )),
            None if config.transfer.listen.is_some() => {
                return Err(ServerError::Config(
                    "--transfer-listen needs --transfer-tls DIR (the node's certificate: ca.crt, tls.crt, tls.key)".into(),
                ))
            }
            None => None,
        };
        let activity = Arc::new(crate::pacing::Activity::default());
        let metrics = crate::metrics::Metrics::new();
        let transfer_source = match (&identity, config.transfer.listen) {
            (Some(id), Some(_)) => {
                let pace = config.transfer.busy_rate.map(|rate| {
                    Arc::new(crate::pacing::BusyPace::new(
                        activity.clone(),
                        rate,
                        metrics.transfer_paced.clone(),
                    )) as Arc<dyn lamina_transfer::Pace>
                });
                Some(lamina_transfer::Source::limited(
                    Arc::new(pool.clone()),
                    id.clone(),
                    pace,
                    config.transfer.limits,
                ))
            }
            _ => None,
        };
        let exports = Arc::new(Registry::new(store.clone()));
        let state = State {
            layout: layout.clone(),
            pool,
            store,
            exports,
            locks: Mutex::new(HashMap::new()),
            token,
            nbd_tcp: config.nbd_listen,
            progress: Mutex::new(HashMap::new()),
            stopping: std::sync::atomic::AtomicBool::new(false),
            jobs: Mutex::new(Vec::new()),
            running: Mutex::new(HashMap::new()),
            changes: crate::changes::Changes::new(),
            identity,
            transfer_source,
            transfer_retry_window: config.transfer.retry_window,
            schedules: crate::schedules::Runtime::new(&config.test_knobs()),
            high_water: config.high_water,
            metrics,
            volume_io_metrics: config.volume_io_metrics,
            activity,
            in_flight: Arc::new(tokio::sync::RwLock::new(())),
            hold_operations: config.test_knobs().hold_operations,
        };
        for op in state.store.ops()? {
            if op.state == api::OperationState::Running {
                let mut running = state.running.lock().unwrap();
                for v in op.op.volumes() {
                    running
                        .entry(v.to_string())
                        .or_default()
                        .push(Running::of(&op));
                }
            }
        }
        for (name, rec) in state.store.exports()? {
            match state
                .exports
                .open_engine(&state.pool, &rec.volume, rec.snapshot.as_deref())
            {
                Ok(dev) => state.exports.insert(
                    &name,
                    Arc::new(dev),
                    state.volume_io(&name),
                    state.activity.clone(),
                ),
                Err(ServerError::Engine(e)) => {
                    tracing::warn!(export = %name, error = %e, "dropping export of a volume that is gone");
                    state.store.remove_export(&name)?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(state)
    }

    /// Run `work` to its end in a task of its own, and answer what it
    /// answers. A request's handler is dropped when its client goes away
    /// (a timeout, a closed connection), and everything it awaits with it:
    /// a change made inside the handler would stop wherever it stood, its
    /// record left running with nothing done, or a lock let go while the
    /// blocking call it guarded went on. Inside this task the change runs
    /// to its end, and takes and lets go of its locks, whether or not
    /// anyone waits for the answer; the client that comes back finds the
    /// outcome in the operation's record. `close` waits for these tasks.
    pub async fn to_end<T: Send + 'static>(
        self: &Arc<Self>,
        work: impl std::future::Future<Output = Result<T, Failure>> + Send + 'static,
    ) -> Result<T, Failure> {
        let in_flight = self.in_flight.clone().read_owned().await;
        let task = tokio::spawn(
            async move {
                let _in_flight = in_flight;
                work.await
            }
            .in_current_span(),
        );
        task.await
            .unwrap_or_else(|e| Err(Failure::internal(format!("operation task failed: {e}"))))
    }

    /// Serialises operations on one volume (by name).
    pub fn lock(&self, volume: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.locks
            .lock()
            .unwrap()
            .entry(volume.to_string())
            .or_default()
            .clone()
    }

    pub fn uri(&self, export: &str) -> String {
        match self.nbd_tcp {
            Some(addr) => format!("nbd://{addr}/{export}"),
            None => format!(
                "nbd+unix:///{export}?socket={}",
                self.layout.nbd_socket.display()
            ),
        }
    }

    fn export_of(&self, name: &str) -> Option<api::Export> {
        let read_only = self.exports.read_only(name)?;
        Some(api::Export {
            uri: self.uri(name),
            name: name.to_string(),
            read_only,
            connections: self.exports.connections(name),
        })
    }

    /// A volume as the API shows it. Reads the volume's exclusive size from
    /// the pool: call it off the reactor.
    pub fn volume(&self, v: lamina_engine::VolumeInfo) -> api::Volume {
        use lamina_engine::CloneState as C;
        // The oldest running operation: a background one if any.
        let operation = self
            .running
            .lock()
            .unwrap()
            .get(&v.name)
            .and_then(|rs| rs.first())
            .map(|r| r.id.clone());
        let copying = self.running_copy_into(&v.name).is_some();
        let clone_state = match v.clone_state {
            _ if copying => api::CloneState::Copying,
            C::None => api::CloneState::None,
            C::Linked => api::CloneState::Linked,
            C::Flattening => api::CloneState::Flattening,
            C::Independent => api::CloneState::Independent,
        };
        // A volume deleted meanwhile shows what it had.
        let exclusive = self
            .pool
            .usage(&v.name, None)
            .map(|u| u.exclusive_bytes)
            .unwrap_or(v.allocated_bytes);
        api::Volume {
            id: v.id,
            export: self.export_of(&v.name),
            name: v.name,
            size: v.size,
            created: rfc3339(v.created),
            allocated_bytes: v.allocated_bytes,
            exclusive_bytes: exclusive,
            shared_bytes: v.allocated_bytes.saturating_sub(exclusive),
            parent_snapshot: v.parent_snapshot,
            origin: v.origin.map(|o| api::Origin {
                volume: o.volume,
                snapshot: o.snapshot,
            }),
            clone_state,
            operation,
            labels: v.labels.into_iter().collect(),
        }
    }

    /// Whether the pool is past its high-water mark, and by how much
    /// (reads every refcount page: call it once per decision).
    pub fn space_warning(&self) -> Result<Option<String>, Failure> {
        Ok(self.space_warning_of(&self.pool.stats()?))
    }

    /// [`State::space_warning`] from stats already read.
    pub fn space_warning_of(&self, stats: &lamina_engine::PoolStats) -> Option<String> {
        let used = stats.used_bytes;
        let room = crate::paths::capacity_bytes(&self.layout.root, stats);
        let total = used.saturating_add(room);
        let past = used >= self.high_water.threshold(total);
        past.then(|| {
            format!(
                "the pool is {}% full ({} used of {}: its used bytes and what new data can still take), past its high-water mark of {}",
                if total == 0 { 100 } else { (used as u128 * 100 / total as u128) as u64 },
                api::format_size(used),
                api::format_size(total),
                self.high_water
            )
        })
    }

    pub fn snapshot(&self, s: lamina_engine::SnapshotInfo) -> api::Snapshot {
        // A deleted volume's snapshot is attached under `VOLUME@ID`, the
        // name that reaches it alone.
        let reference = if s.volume_deleted {
            format!("{}@{}", s.volume, s.volume_id)
        } else {
            s.volume.clone()
        };
        api::Snapshot {
            export: self.export_of(&snapshot_export(&reference, &s.name)),
            id: s.id,
            volume_id: s.volume_id,
            volume_deleted: s.volume_deleted,
            volume: s.volume,
            name: s.name,
            created: rfc3339(s.created),
            parent: s.parent,
            children: s.children,
            system: s.system,
            labels: s.labels.into_iter().collect(),
            restore_size: s.restore_size,
            allocated_bytes: s.allocated_bytes,
            exclusive_bytes: s.exclusive_bytes,
            shared_bytes: s.allocated_bytes.saturating_sub(s.exclusive_bytes),
            clones: s.clones,
        }
    }

    /// The full clone (local or remote) copying into `volume`, if one runs.
    pub fn running_copy_into(&self, volume: &str) -> Option<String> {
        self.running
            .lock()
            .unwrap()
            .get(volume)
            .and_then(|rs| {
                rs.iter().find(|r| {
                    matches!(
                        r.kind,
                        api::OperationKind::FullClone | api::OperationKind::RemoteClone
                    )
                })
            })
            .map(|r| r.id.clone())
    }

    /// Refuse to delete a snapshot a running full clone reads, here or
    /// (through a transfer open now) on another node.
    pub fn refuse_if_copying_from(&self, volume: &str, snapshot: &str) -> Result<(), Failure> {
        if let Some(src) = &self.transfer_source {
            let peers = src.readers(volume, snapshot);
            if !peers.is_empty() {
                return Err(Failure::conflict(
                    format!(
                        "node {} is copying snapshot {volume}/{snapshot} (a clone on that node)",
                        peers.join(", ")
                    ),
                    "wait for the clone to end, or delete it on that node first",
                ));
            }
        }
        let running = self.running.lock().unwrap();
        let want = (volume.to_string(), snapshot.to_string());
        match running
            .values()
            .flatten()
            .find(|r| r.copies_from.as_ref() == Some(&want))
        {
            Some(r) => Err(Failure::conflict(
                format!(
                    "a full clone is copying from snapshot {volume}/{snapshot} (operation {})",
                    r.id
                ),
                &format!("wait for it to end: lamina operation wait {}", r.id),
            )),
            None => Ok(()),
        }
    }

    /// Export a volume or snapshot over NBD (idempotent). The caller
    /// holds the volume's operation lock, so that an attach cannot race the
    /// deletion of what it exports; blocking (engine and store calls).
    pub fn attach(&self, volume: &str, snapshot: Option<&str>) -> Result<api::Export, Failure> {
        let name = match snapshot {
            None => volume.to_string(),
            Some(s) => snapshot_export(volume, s),
        };
        if !self.exports.contains(&name) {
            let dev = self.exports.open_engine(&self.pool, volume, snapshot)?;
            self.store
                .put_export(
                    &name,
                    &ExportRec {
                        volume: volume.into(),
                        snapshot: snapshot.map(Into::into),
                    },
                )
                .map_err(Failure::from)?;
            self.exports.insert(
                &name,
                Arc::new(dev),
                self.volume_io(&name),
                self.activity.clone(),
            );
            self.changes.bump();
        }
        self.export_of(&name).ok_or_else(|| {
            Failure::internal(format!(
                "export {name:?} vanished while it was being attached"
            ))
        })
    }

    /// Stop exporting; whether it was exported. Same locking as `attach`.
    /// While NBD clients are connected it refuses unless `force`: they would
    /// get I/O errors from then on (what they wrote is flushed first).
    pub fn detach(
        &self,
        volume: &str,
        snapshot: Option<&str>,
        force: bool,
    ) -> Result<bool, Failure> {
        let name = match snapshot {
            None => volume.to_string(),
            Some(s) => snapshot_export(volume, s),
        };
        // A client that has just disconnected (sent NBD_CMD_DISC or closed
        // its socket) may not be gone yet: its session ends once its last
        // replies are written. Give it a moment before refusing.
        let deadline = std::time::Instant::now() + DETACH_GRACE;
        let mut clients = self.exports.connections(&name);
        while clients > 0 && !force && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
            clients = self.exports.connections(&name);
        }
        if clients > 0 && !force {
            let cmd = match snapshot {
                None => format!("lamina volume detach {volume} --force"),
                Some(s) => format!("lamina snapshot detach {volume} {s} --force"),
            };
            return Err(Failure::conflict(
                format!("export {name} has {clients} NBD client(s) connected: they would get I/O errors"),
                &format!("disconnect them first, or cut them off: {cmd}"),
            ));
        }
        self.store.remove_export(&name).map_err(Failure::from)?;
        let removed = self
            .exports
            .remove(&name)
            .map_err(|e| Failure::internal(format!("flushing export {name} at its detach: {e}")))?;
        if removed {
            self.metrics.forget_volume(&name);
            self.changes.bump();
        }
        Ok(removed)
    }

    /// Where an export's I/O is counted, unless that is turned off.
    fn volume_io(&self, export: &str) -> Option<Arc<dyn lamina_blockio::IoObserver>> {
        self.volume_io_metrics
            .then(|| self.metrics.volume_io(export) as Arc<dyn lamina_blockio::IoObserver>)
    }

    pub fn is_attached(&self, export: &str) -> bool {
        self.exports.contains(export)
    }

    /// Start a background job, joined at shutdown, at background priority
    /// (crate::background).
    pub fn spawn_job(&self, name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        // Jobs move data in the background: they yield to volume I/O.
        let h = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                crate::background::lower_priority();
                f()
            })?;
        let mut jobs = self.jobs.lock().unwrap();
        jobs.retain(|j| !j.is_finished());
        jobs.push(h);
        Ok(())
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub async fn close(&self) -> Result<(), ServerError> {
        // Changes still running for requests (their clients may be gone)
        // end first, and none starts after; the backstop is for one that
        // never returns.
        let backstop = std::time::Duration::from_secs(60);
        let _none_after = match tokio::time::timeout(backstop, self.in_flight.write()).await {
            Ok(all) => Some(all),
            Err(_) => {
                tracing::warn!(
                    ?backstop,
                    "operations still running; closing the pool anyway"
                );
                None
            }
        };
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let jobs = std::mem::take(&mut *self.jobs.lock().unwrap());
        tokio::task::spawn_blocking(move || {
            for j in jobs {
                let _ = j.join();
            }
        })
        .await
        .expect("join jobs");
        // A store broken by an I/O error writes what it keeps for its
        // reopen if it can reopen now; what it cannot is lost with this
        // process, and the restart runs those operations again.
        if let Err(e) = self.store.check() {
            tracing::warn!(error = %e, "stopping with the store broken: operations whose end it could not record run again at the next start");
        }
        let pool = self.pool.clone();
        tokio::task::spawn_blocking(move || pool.close())
            .await
            .expect("close task")?;
        Ok(())
    }
}

/// Run blocking engine work off the async reactor.
/// Run blocking engine or store work off the async reactor, inside the
/// caller's tracing span.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Failure> + Send + 'static,
) -> Result<T, Failure> {
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(f))
        .await
        .unwrap_or_else(|e| Err(Failure::internal(format!("task failed: {e}"))))
}
