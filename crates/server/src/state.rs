//! The daemon's shared state: the pool, the store, the export registry, the
//! per-volume operation locks, the operations' records as they move
//! (`ledger`), and conversions to API types.

mod exports;
mod ledger;
pub mod nodes;
mod views;

pub use exports::snapshot_export;
pub use views::{now, rfc3339};

pub use ledger::{new_record, Live, Step};

use crate::device::Registry;
use crate::error::{Failure, ServerError};
use crate::paths::Layout;
use crate::store::Store;
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
    /// Attached replicated volumes' front ends.
    pub fronts: crate::front::Fronts,
    /// Exports also served as files.
    pub files: crate::files::Files,
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
    pub changes: Arc<crate::changes::Changes>,
    /// This node's transfer identity (to pull from peers and serve them).
    pub identity: Option<Arc<lamina_transfer::Identity>>,
    /// Serves this node's snapshots to peers, when asked to listen.
    pub transfer_source: Option<Arc<lamina_transfer::Source>>,
    /// How this node's transfer streams and rebuilds yield to its volumes'
    /// I/O (`pacing.rs`): one pace for all of them.
    pub pace: Option<Arc<dyn lamina_transfer::Pace>>,
    /// See [`crate::TransferConfig::retry_window`].
    pub transfer_retry_window: std::time::Duration,
    /// How long a pull waits on a silent source before it takes it for
    /// lost: the limit this node's own source puts on its peers
    /// ([`lamina_transfer::Limits::stall_timeout`]).
    pub transfer_stall_timeout: std::time::Duration,
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
        // A replica set's record that changes what `volume get` shows moves
        // the change feed, so the Kubernetes controllers mirror it.
        let changes = Arc::new(crate::changes::Changes::new());
        let feed = changes.clone();
        store.on_replica_set_change(Box::new(move || feed.bump()));
        let token = match (config.listen, &config.token_file) {
            (Some(_), Some(file)) => Some(crate::paths::read_token_file(file)?),
            (Some(_), None) => Some(layout.token()?),
            (None, _) => None,
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
        if let Some(shared) = &config.shared_record {
            let Some(id) = &identity else {
                return Err(ServerError::Config(
                    "a shared record of replica sets needs --transfer-tls DIR (the node's identity names the front end in it)".into(),
                ));
            };
            store.share_replica_sets(shared.0.clone(), id.node().to_string());
        }
        let activity = Arc::new(crate::pacing::Activity::default());
        let metrics = crate::metrics::Metrics::new();
        let pace = config.transfer.busy_rate.map(|rate| {
            Arc::new(crate::pacing::BusyPace::new(
                activity.clone(),
                rate,
                metrics.transfer_paced.clone(),
            )) as Arc<dyn lamina_transfer::Pace>
        });
        let transfer_source = match (&identity, config.transfer.listen) {
            (Some(id), Some(_)) => Some(lamina_transfer::Source::limited(
                Arc::new(pool.clone()),
                id.clone(),
                pace.clone(),
                config.transfer.limits,
            )),
            _ => None,
        };
        let exports = Arc::new(Registry::new(store.clone()));
        if let Some(source) = &transfer_source {
            // Front ends of other nodes reach this node's volumes on the
            // same listener.
            source.serve_volumes(Arc::new(
                crate::replicas::Served::new(
                    pool.clone(),
                    exports.clone(),
                    tokio::runtime::Handle::current(),
                )
                .sharing(&store),
            ));
            // A pull's Answer names the other replicas holding a snapshot.
            source.serve_holders(Arc::new(crate::holders::Known::new(
                pool.clone(),
                store.clone(),
            )));
        }
        let state = State {
            layout: layout.clone(),
            pool,
            store,
            exports,
            fronts: Default::default(),
            files: crate::files::Files::new(
                layout.files.clone(),
                config.files,
                config.keeper.clone(),
            ),
            locks: Mutex::new(HashMap::new()),
            token,
            nbd_tcp: config.nbd_listen,
            progress: Mutex::new(HashMap::new()),
            stopping: std::sync::atomic::AtomicBool::new(false),
            jobs: Mutex::new(Vec::new()),
            running: Mutex::new(HashMap::new()),
            changes,
            identity,
            transfer_source,
            pace,
            transfer_retry_window: config.transfer.retry_window,
            transfer_stall_timeout: config.transfer.limits.stall_timeout,
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
            let replicated = rec.snapshot.is_none()
                && crate::front::replica_set(&state.store, &state.pool, &rec.volume)
                    .ok()
                    .flatten()
                    .is_some();
            if replicated {
                // Its front end reaches other nodes: off the reactor, and
                // not fatal to the start (attaching again retries).
                let (pool, exports, store, identity, pace, pool_dir) = (
                    state.pool.clone(),
                    state.exports.clone(),
                    state.store.clone(),
                    state.identity.clone(),
                    state.pace.clone(),
                    state.layout.pool.clone(),
                );
                let crash_at = state.schedules.crash_at().map(str::to_string);
                let volume = rec.volume.clone();
                let opened = tokio::task::spawn_blocking(move || {
                    let parts = crate::front::Parts {
                        pool: &pool,
                        exports: &exports,
                        store: &store,
                        identity: identity.as_ref(),
                        pace: pace.as_ref(),
                        pool_dir: &pool_dir,
                        crash_at: crash_at.as_deref(),
                    };
                    crate::front::open(&parts, &volume)
                })
                .await;
                match opened {
                    Ok(Ok(front)) => {
                        state.exports.insert(
                            &name,
                            front.replicated.clone(),
                            state.volume_io(&name),
                            state.activity.clone(),
                        );
                        state.fronts.insert(&rec.volume, front);
                    }
                    Ok(Err(f)) => {
                        tracing::warn!(export = %name, error = %f.1.message, "a replicated volume's export is not served: attach it again")
                    }
                    Err(e) => {
                        tracing::warn!(export = %name, error = %e, "a replicated volume's export is not served: attach it again")
                    }
                }
                continue;
            }
            match state
                .exports
                .open_engine(&state.pool, &rec.volume, rec.snapshot.as_deref())
            {
                Ok(dev) => {
                    state.exports.insert(
                        &name,
                        Arc::new(dev),
                        state.volume_io(&name),
                        state.activity.clone(),
                    );
                    if rec.file {
                        // Served again, so that a loop device set up on it
                        // can be pointed at it again; a node that no longer
                        // serves files keeps the NBD export only.
                        if let Err(e) = state.serve_file(&name) {
                            tracing::warn!(export = %name, error = %e.1.message, "the export's file is not served");
                        }
                    }
                }
                Err(ServerError::Engine(e)) => {
                    tracing::warn!(export = %name, error = %e, "dropping export of a volume that is gone");
                    state.store.remove_export(&name)?;
                }
                Err(e) => return Err(e),
            }
        }
        // Connections the keeper held for files no export has now.
        state.files.forget_unclaimed();
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
        // Rebuilds stop at their next piece.
        self.fronts.close_all();
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
        self.files.stop_all();
        let pool = self.pool.clone();
        tokio::task::spawn_blocking(move || pool.close())
            .await
            .expect("close task")?;
        Ok(())
    }
}

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
