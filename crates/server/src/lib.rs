//! The Lamina daemon (`lamina serve`): it owns one engine pool, an embedded
//! transactional store (redb) for what is not the engine's (exports,
//! operation records), the HTTP/JSON management API on a unix socket (and on
//! TCP with a bearer token when asked), and the NBD exports. It must not
//! implement storage (the engine's) or the NBD wire protocol (lamina-nbd's).

mod background;
mod changes;
mod device;
mod error;
mod extract;
mod groups;
mod handlers;
mod jobs;
#[cfg(test)]
mod layers;
pub mod metrics;
mod migrate;
mod openapi;
mod operations;
pub mod pacing;
mod paths;
mod router;
mod schedules;
mod space;
mod state;
mod store;

pub use error::ServerError;
pub use paths::{default_data_dir, Layout};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// How to run the daemon.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where the pool, the store, the sockets and the token live.
    pub data_dir: PathBuf,
    /// Also serve the management API on TCP (requires the bearer token).
    pub listen: Option<SocketAddr>,
    /// Also serve NBD on TCP.
    pub nbd_listen: Option<SocketAddr>,
    /// Finished operation records older than this are pruned.
    pub operation_retention: std::time::Duration,
    /// Copies between nodes.
    pub transfer: TransferConfig,
    /// Past this, `status` warns and scheduled snapshots pause.
    pub high_water: HighWater,
    /// Count each export's I/O in `/metrics` (operations, errors, bytes,
    /// latency); off saves that cost, measured by the bench's io case.
    pub volume_io_metrics: bool,
    /// Knobs for tests only.
    pub testing: Testing,
}

/// A pool's high-water mark: a share of what it can hold (its used bytes
/// plus what new data can still take), or a number of used bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HighWater {
    Percent(u8),
    Bytes(u64),
}

impl Default for HighWater {
    fn default() -> Self {
        HighWater::Percent(90)
    }
}

impl std::str::FromStr for HighWater {
    type Err = String;
    /// `90%`, or a size (`500G`).
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().strip_suffix('%') {
            Some(p) => match p.trim().parse::<u8>() {
                Ok(n) if (1..=100).contains(&n) => Ok(HighWater::Percent(n)),
                _ => Err(format!("{s:?}: a percentage from 1% to 100%")),
            },
            None => lamina_api::parse_size(s)
                .map(HighWater::Bytes)
                .map_err(|e| format!("{s:?}: a percentage (90%) or a size (500G): {e}")),
        }
    }
}

impl HighWater {
    /// The used bytes at which a pool that can hold `total` passes the mark.
    pub fn threshold(&self, total: u64) -> u64 {
        match *self {
            HighWater::Percent(p) => ((total as u128) * (p as u128)).div_ceil(100) as u64,
            HighWater::Bytes(b) => b,
        }
    }
}

impl std::fmt::Display for HighWater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HighWater::Percent(p) => write!(f, "{p}%"),
            HighWater::Bytes(b) => f.write_str(&lamina_api::format_size(*b)),
        }
    }
}

/// Knobs for tests only (hidden flags of `lamina serve`).
#[derive(Clone, Debug, Default)]
pub struct Testing {
    /// Read the schedules' clock from this file (Unix seconds) instead of
    /// the machine's clock, so tests move time instead of waiting for it.
    pub clock_file: Option<PathBuf>,
    /// Abort the process, as kill -9 would, at this named point
    /// (`schedule-after-claim`, `schedule-after-snapshot`).
    pub crash_at: Option<String>,
    /// While this file exists, an operation whose record is written waits
    /// there (a snapshot's creation, which runs beside its record, waits
    /// before it is marked done), so that a test can give up on a request
    /// at that point and see what becomes of it.
    pub hold_operations: Option<PathBuf>,
}

/// How this node takes part in copies between nodes.
#[derive(Clone, Debug)]
pub struct TransferConfig {
    /// Serve this node's snapshots to peers on TCP at this address.
    pub listen: Option<SocketAddr>,
    /// The node's TLS identity: a directory with ca.crt, tls.crt and
    /// tls.key. Needed to serve and to pull.
    pub tls_dir: Option<PathBuf>,
    /// How long a pull keeps retrying a source it lost before it fails
    /// with `source-unreachable`, from when it found the source lost (a
    /// source silent for 30 s counts as lost); only a new durable
    /// checkpoint ends the outage, not data that arrived and was lost
    /// again with the connection.
    pub retry_window: std::time::Duration,
    /// Bytes a second this node's transfer streams may send together while
    /// its volumes have I/O (`pacing.rs`); `None`: always full speed.
    pub busy_rate: Option<u64>,
    /// What peers of this node's transfer listener may hold: handshakes
    /// and sessions, in all and each, and how long they may keep it
    /// waiting (docs/transfer.md, Limits).
    pub limits: lamina_transfer::Limits,
}

/// Default of [`TransferConfig::busy_rate`]: see `pacing.rs`.
pub const DEFAULT_TRANSFER_BUSY_RATE: u64 = 192 << 20;

/// Default of [`TransferConfig::retry_window`]: one minute.
pub const DEFAULT_TRANSFER_RETRY_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

impl Default for TransferConfig {
    fn default() -> Self {
        TransferConfig {
            listen: None,
            tls_dir: None,
            retry_window: DEFAULT_TRANSFER_RETRY_WINDOW,
            busy_rate: Some(DEFAULT_TRANSFER_BUSY_RATE),
            limits: lamina_transfer::Limits::default(),
        }
    }
}

/// Default age at which finished operation records are pruned: 7 days.
pub const DEFAULT_OPERATION_RETENTION: std::time::Duration =
    std::time::Duration::from_secs(7 * 24 * 3600);

/// Run until `shutdown` resolves, then stop accepting, let in-flight NBD
/// requests finish (a connection whose client does not read its replies is
/// closed after `lamina_nbd::ServerOptions::drain_timeout`, 10 s), and close
/// the pool, which makes every acknowledged write durable.
pub async fn run(
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
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
    let opts = lamina_nbd::ServerOptions::default();
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
