//! The Lamina daemon (`lamina serve`): it owns one engine pool, an embedded
//! transactional store (redb) for what is not the engine's (exports,
//! operation records), the HTTP/JSON management API on a unix socket (and on
//! TCP with a bearer token when asked), and the NBD exports. It must not
//! implement storage (the engine's) or the NBD wire protocol (lamina-nbd's).

mod background;
mod changes;
mod config;
mod device;
mod error;
mod extract;
mod files;
mod freeze;
mod front;
mod groups;
mod handlers;
mod holders;
mod jobs;
#[cfg(test)]
mod layers;
pub mod metrics;
mod migrate;
mod nodes;
mod openapi;
mod operations;
pub mod pacing;
mod paths;
mod prune;
mod replicas;
mod router;
mod schedules;
mod shared;
mod space;
mod state;
mod store;

#[cfg(feature = "testing")]
pub use config::Testing;
pub use config::{
    Config, HighWater, NbdConfig, TransferConfig, DEFAULT_FILES, DEFAULT_HIGH_WATER,
    DEFAULT_METADATA_CACHE_BYTES, DEFAULT_OPERATION_RETENTION, DEFAULT_TRANSFER_BUSY_RATE,
    DEFAULT_TRANSFER_RETRY_WINDOW, DEFAULT_VOLUME_IO_METRICS,
};
pub use error::ServerError;
pub use paths::{default_data_dir, Layout};
pub use shared::{SharedRecord, SharedRecordError, SharedSet};
pub use store::{ReplicaRec, ReplicaSetRec};

use std::sync::Arc;

/// Expands to the first group of items in a build of this crate with its
/// `testing` feature, to the second without it. The `lamina` binary defines
/// its hidden test flags (`lamina serve --test-clock ...`) through it, so
/// that they exist exactly when the server has its test knobs. A package
/// turns on a feature of its own for its tests through a dev-dependency on
/// itself, which Cargo ignores (with a warning) for a package without a
/// library, as lamina-cli is; its dev-dependency on this crate with
/// `testing` does turn the feature on here. Cargo builds a package's binary with the union of the
/// features the whole build asks for, dev-dependencies included when tests
/// are built (resolver 2), so `cargo test -p lamina-cli` and
/// `cargo test --workspace` run a `lamina` with the flags, and a plain build
/// (`cargo build -p lamina-cli`, bench/run's `--profile measure
/// --no-default-features`, the images) has none.
#[cfg(feature = "testing")]
#[macro_export]
macro_rules! cfg_testing {
    ({ $($with:item)* } else { $($without:item)* }) => { $($with)* };
}

/// See the other definition: this is the one without the `testing` feature.
#[cfg(not(feature = "testing"))]
#[macro_export]
macro_rules! cfg_testing {
    ({ $($with:item)* } else { $($without:item)* }) => { $($without)* };
}

/// How often the transfer identity's files are read again.
const IDENTITY_RELOAD: std::time::Duration = std::time::Duration::from_secs(30);

/// Run until `shutdown` resolves, then stop accepting, let in-flight NBD
/// requests finish (a connection whose client does not read its replies is
/// closed after [`NbdConfig::drain_timeout`]), and close the pool, which
/// makes every acknowledged write durable. A configuration that fails
/// [`Config::check`] is refused before anything is opened.
pub async fn run(
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    config.check()?;
    let layout = Layout::new(&config.data_dir);
    layout.prepare()?;
    let state = state::State::open(&layout, &config).await?;
    let state = Arc::new(state);
    operations::recover(&state).await?;
    schedules::api::recover(&state).await?;
    let retention = config.operation_retention;
    {
        let st = state.clone();
        tokio::task::spawn_blocking(move || st.prune_operations(retention))
            .await
            .map_err(|source| ServerError::Task {
                what: "pruning operation records",
                source,
            })??;
    }

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();

    // NBD on the unix socket (and TCP when asked).
    let nbd_unix = bind_unix(&layout.nbd_socket, 0o666)?;
    let exports: Arc<dyn lamina_nbd::Exports> = state.exports.clone();
    let opts = config.nbd.options();
    let stopped = |rx: &tokio::sync::watch::Receiver<bool>| {
        let mut rx = rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    tasks.spawn(lamina_nbd::serve_unix(
        nbd_unix,
        exports.clone(),
        opts.clone(),
        stopped(&stop_rx),
    ));
    if let Some(addr) = config.nbd_listen {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| ServerError::io("bind NBD", addr.to_string(), e))?;
        tasks.spawn(lamina_nbd::serve_tcp(
            l,
            exports.clone(),
            opts.clone(),
            stopped(&stop_rx),
        ));
    }

    // Finished operation records older than the retention go, hourly.
    {
        let (st, stop) = (state.clone(), stopped(&stop_rx));
        tasks.spawn(async move {
            tokio::pin!(stop);
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(3600));
            tick.tick().await; // the first tick is now: pruned above
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        let st = st.clone();
                        match tokio::task::spawn_blocking(move || st.prune_operations(retention)).await {
                            Ok(Err(e)) => tracing::warn!(error = %e, "could not prune operation records"),
                            Err(e) => tracing::warn!(error = %e, "pruning operation records failed"),
                            Ok(Ok(_)) => {}
                        }
                    }
                    _ = &mut stop => break,
                }
            }
        });
    }

    // The transfer identity's files read again every 30 s: a renewed
    // certificate (cert-manager's, written by `lamina node certificate
    // --renew-every`) is used from the next connection on, with no restart.
    if let Some(identity) = state.identity.clone() {
        let stop = stopped(&stop_rx);
        tasks.spawn(async move {
            tokio::pin!(stop);
            let mut tick = tokio::time::interval(IDENTITY_RELOAD);
            tick.tick().await; // loaded already
            let mut last_error = String::new();
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        let id = identity.clone();
                        match tokio::task::spawn_blocking(move || id.reload()).await {
                            Ok(Ok(true)) => {
                                last_error.clear();
                                tracing::info!(dir = %identity.dir().display(), "transfer identity reloaded: new connections use the renewed certificate");
                            }
                            Ok(Ok(false)) => last_error.clear(),
                            Ok(Err(e)) => {
                                // Once per distinct error: a renewal being
                                // written is read again at the next tick.
                                let e = e.to_string();
                                if e != last_error {
                                    tracing::warn!(error = %e, "the transfer identity's files changed but do not load: the one loaded stays");
                                    last_error = e;
                                }
                            }
                            Err(e) => tracing::warn!(error = %e, "reloading the transfer identity failed"),
                        }
                    }
                    _ = &mut stop => break,
                }
            }
        });
    }

    // Volumes fronted here holding no replica, detached, and taken over by
    // another node since: forgotten here, checked every 5 s.
    {
        let (st, stop) = (state.clone(), stopped(&stop_rx));
        tasks.spawn(async move {
            tokio::pin!(stop);
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
            loop {
                tokio::select! {
                    _ = tick.tick() => operations::forget_taken_diskless(&st).await,
                    _ = &mut stop => break,
                }
            }
        });
    }

    // Scheduled snapshots and their retention.
    tasks.spawn(schedules::runner::run(state.clone(), stopped(&stop_rx)));

    // Peers pulling this node's snapshots.
    if let (Some(addr), Some(source)) = (config.transfer.listen, state.transfer_source.clone()) {
        let l = std::net::TcpListener::bind(addr)
            .and_then(|l| l.set_nonblocking(true).map(|_| l))
            .map_err(|e| ServerError::io("bind transfer", addr.to_string(), e))?;
        tasks.spawn(background::serve_transfer(source, l, stopped(&stop_rx)));
    }

    // The management API.
    let api_unix = bind_unix(&layout.api_socket, 0o600)?;
    let app = router::router(state.clone(), false);
    let api = axum::serve(api_unix, app).with_graceful_shutdown(stopped(&stop_rx));
    tasks.spawn(async move {
        let _ = api.await;
    });
    if let Some(addr) = config.listen {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| ServerError::io("bind API", addr.to_string(), e))?;
        let api = axum::serve(l, router::router(state.clone(), true))
            .with_graceful_shutdown(stopped(&stop_rx));
        tasks.spawn(async move {
            let _ = api.await;
        });
    }
    tracing::info!(data_dir = %layout.root.display(), api = %layout.api_socket.display(), nbd = %layout.nbd_socket.display(), "lamina serving");
    eprintln!(
        "lamina: serving {} (API {}, NBD {})",
        layout.root.display(),
        layout.api_socket.display(),
        layout.nbd_socket.display()
    );

    shutdown.await;
    tracing::info!("shutting down: draining requests, flushing volumes");
    let _ = stop_tx.send(true);
    state.changes.stop();
    // Requests in flight finish; each NBD connection gets the drain time
    // to take its replies and is then closed (lamina-nbd), so this ends
    // within about that time. The bound here is a backstop for a volume
    // call that never returns.
    let backstop = opts.drain_timeout + std::time::Duration::from_secs(30);
    let drained = tokio::time::timeout(backstop, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(?backstop, "connections still open; closing the pool anyway");
        tasks.abort_all();
    }
    state.close().await?;
    let _ = std::fs::remove_file(&layout.api_socket);
    let _ = std::fs::remove_file(&layout.nbd_socket);
    tracing::info!("stopped cleanly");
    Ok(())
}

fn bind_unix(path: &std::path::Path, mode: u32) -> Result<tokio::net::UnixListener, ServerError> {
    use std::os::unix::fs::PermissionsExt;
    if path.exists() {
        // A socket left by a killed daemon; refuse if someone still answers.
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ServerError::AlreadyRunning(path.display().to_string()));
        }
        std::fs::remove_file(path)
            .map_err(|e| ServerError::io("remove stale socket", path.display().to_string(), e))?;
    }
    let l = tokio::net::UnixListener::bind(path)
        .map_err(|e| ServerError::io("bind", path.display().to_string(), e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| ServerError::io("chmod", path.display().to_string(), e))?;
    Ok(l)
}
