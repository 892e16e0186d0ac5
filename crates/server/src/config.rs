//! How to run the daemon: [`Config`], its defaults (each a named constant,
//! here or in the crate that owns the option), its chained setters and its
//! validation. `lamina serve`'s options map one to one onto the setters, and
//! take their defaults from the same constants.
//!
//! The knobs for tests ([`Testing`]) exist only with this crate's `testing`
//! feature: a build without it has no way to set them (see
//! [`crate::cfg_testing`] for how the `lamina` binary follows it).

use crate::shared::SharedRecord;
use crate::ServerError;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Default of [`Config::operation_retention`]: 7 days.
pub const DEFAULT_OPERATION_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Default of [`Config::high_water`].
pub const DEFAULT_HIGH_WATER: HighWater = HighWater::Percent(90);

/// Default of [`Config::volume_io_metrics`].
pub const DEFAULT_VOLUME_IO_METRICS: bool = true;

/// Default of [`Config::metadata_cache_bytes`]: the engine's.
pub const DEFAULT_METADATA_CACHE_BYTES: usize = lamina_engine::PoolOptions::CACHE_BYTES;

/// Default of [`TransferConfig::busy_rate`]: see `pacing.rs`.
pub const DEFAULT_TRANSFER_BUSY_RATE: u64 = 192 << 20;

/// Default of [`Config::files`]: volumes are served as files on request.
pub const DEFAULT_FILES: bool = true;

/// Default of [`TransferConfig::retry_window`]: one minute.
pub const DEFAULT_TRANSFER_RETRY_WINDOW: Duration = Duration::from_secs(60);

/// A [`SharedRecord`] in a [`Config`]: configs are equal when they hold the
/// same one.
#[derive(Clone)]
pub struct SharedRecordHandle(pub Arc<dyn SharedRecord>);

impl std::fmt::Debug for SharedRecordHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedRecord")
    }
}

impl PartialEq for SharedRecordHandle {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// How to run the daemon: `Config::new(data_dir)` (or `Config::default()`,
/// on [`crate::default_data_dir`]) and the setters for what differs from
/// the defaults. It cannot be written as a struct literal outside this
/// crate, so that a new option (and its default) is added in one place.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// Where the pool, the store, the sockets and the token live.
    pub data_dir: PathBuf,
    /// Also serve the management API on TCP (requires the bearer token).
    pub listen: Option<SocketAddr>,
    /// Where the TCP API's bearer token is read from: a file the daemon
    /// only reads (a Kubernetes Secret mounted outside the data directory).
    /// None: DATA_DIR/token, made on first use.
    pub token_file: Option<PathBuf>,
    /// Also serve NBD on TCP.
    pub nbd_listen: Option<SocketAddr>,
    /// Finished operation records older than this are pruned.
    pub operation_retention: Duration,
    /// Copies between nodes.
    pub transfer: TransferConfig,
    /// Past this, `status` warns and scheduled snapshots pause.
    pub high_water: HighWater,
    /// Count each export's I/O in `/metrics` (operations, errors, bytes,
    /// latency); off saves that cost, measured by the bench's io case.
    pub volume_io_metrics: bool,
    /// Bytes of the pool's metadata pages the engine keeps in memory
    /// (`lamina_engine::PoolOptions::cache_bytes`).
    pub metadata_cache_bytes: usize,
    /// The NBD server's limits, on the unix socket and on TCP.
    pub nbd: NbdConfig,
    /// Serve attached volumes as files on request (`attach?file=true`,
    /// through FUSE); off refuses them.
    pub files: bool,
    /// A file keeper's socket (`lamina keeper`): at a stop the files' FUSE
    /// connections are handed to it, so their I/O waits for the next
    /// daemon instead of failing, and at a start the connections it holds
    /// are taken back. None: a stop fails the files' I/O.
    pub keeper: Option<PathBuf>,
    /// Where replica sets are recorded first (under Kubernetes, the Volume
    /// resources' status: docs/replicas.md, "The shared record"). None:
    /// this daemon's store alone is their record.
    pub shared_record: Option<SharedRecordHandle>,
    /// Knobs for tests only.
    #[cfg(feature = "testing")]
    pub testing: Testing,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: crate::default_data_dir(),
            listen: None,
            token_file: None,
            nbd_listen: None,
            operation_retention: DEFAULT_OPERATION_RETENTION,
            transfer: TransferConfig::default(),
            high_water: DEFAULT_HIGH_WATER,
            volume_io_metrics: DEFAULT_VOLUME_IO_METRICS,
            metadata_cache_bytes: DEFAULT_METADATA_CACHE_BYTES,
            nbd: NbdConfig::default(),
            files: DEFAULT_FILES,
            keeper: None,
            shared_record: None,
            #[cfg(feature = "testing")]
            testing: Testing::default(),
        }
    }
}

impl Config {
    /// The defaults, on `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Config {
        Config {
            data_dir: data_dir.into(),
            ..Config::default()
        }
    }

    /// See [`Config::listen`].
    pub fn listen(mut self, addr: impl Into<Option<SocketAddr>>) -> Config {
        self.listen = addr.into();
        self
    }

    /// See [`Config::token_file`].
    pub fn token_file(mut self, file: impl Into<Option<PathBuf>>) -> Config {
        self.token_file = file.into();
        self
    }

    /// See [`Config::nbd_listen`].
    pub fn nbd_listen(mut self, addr: impl Into<Option<SocketAddr>>) -> Config {
        self.nbd_listen = addr.into();
        self
    }

    /// See [`Config::operation_retention`].
    pub fn operation_retention(mut self, age: Duration) -> Config {
        self.operation_retention = age;
        self
    }

    /// See [`Config::high_water`].
    pub fn high_water(mut self, mark: HighWater) -> Config {
        self.high_water = mark;
        self
    }

    /// See [`Config::volume_io_metrics`].
    pub fn volume_io_metrics(mut self, on: bool) -> Config {
        self.volume_io_metrics = on;
        self
    }

    /// See [`Config::files`].
    pub fn files(mut self, on: bool) -> Config {
        self.files = on;
        self
    }

    /// See [`Config::shared_record`].
    pub fn shared_record(mut self, shared: Arc<dyn SharedRecord>) -> Config {
        self.shared_record = Some(SharedRecordHandle(shared));
        self
    }

    /// See [`Config::keeper`].
    pub fn keeper(mut self, socket: impl Into<Option<PathBuf>>) -> Config {
        self.keeper = socket.into();
        self
    }

    /// See [`Config::metadata_cache_bytes`].
    pub fn metadata_cache_bytes(mut self, bytes: usize) -> Config {
        self.metadata_cache_bytes = bytes;
        self
    }

    /// All of [`Config::transfer`] at once.
    pub fn transfer(mut self, transfer: TransferConfig) -> Config {
        self.transfer = transfer;
        self
    }

    /// See [`TransferConfig::listen`].
    pub fn transfer_listen(mut self, addr: impl Into<Option<SocketAddr>>) -> Config {
        self.transfer.listen = addr.into();
        self
    }

    /// See [`TransferConfig::tls_dir`].
    pub fn transfer_tls(mut self, dir: impl Into<Option<PathBuf>>) -> Config {
        self.transfer.tls_dir = dir.into();
        self
    }

    /// See [`TransferConfig::retry_window`].
    pub fn transfer_retry_window(mut self, window: Duration) -> Config {
        self.transfer.retry_window = window;
        self
    }

    /// See [`TransferConfig::busy_rate`].
    pub fn transfer_busy_rate(mut self, rate: Option<u64>) -> Config {
        self.transfer.busy_rate = rate;
        self
    }

    /// See [`TransferConfig::limits`].
    pub fn transfer_limits(mut self, limits: lamina_transfer::Limits) -> Config {
        self.transfer.limits = limits;
        self
    }

    /// All of [`Config::nbd`] at once.
    pub fn nbd(mut self, nbd: NbdConfig) -> Config {
        self.nbd = nbd;
        self
    }

    /// The knobs for tests.
    #[cfg(feature = "testing")]
    pub fn testing(mut self, testing: Testing) -> Config {
        self.testing = testing;
        self
    }

    /// Refuse a value no daemon can run with, before anything is opened.
    /// `lamina serve` refuses the same values as it parses them; this is for
    /// every other caller.
    pub fn check(&self) -> Result<(), ServerError> {
        let min_cache = lamina_engine::PoolOptions::MIN_CACHE_BYTES;
        if self.metadata_cache_bytes < min_cache {
            return Err(ServerError::Config(format!(
                "the metadata cache must be at least {min_cache} bytes, not {}",
                self.metadata_cache_bytes
            )));
        }
        self.nbd.check()?;
        self.transfer.check()
    }

    /// The engine's options for the pool.
    pub(crate) fn pool_options(&self) -> lamina_engine::PoolOptions {
        lamina_engine::PoolOptions {
            cache_bytes: self.metadata_cache_bytes,
            ..lamina_engine::PoolOptions::default()
        }
    }

    /// The test knobs: the default ones in a build without the `testing`
    /// feature, where nothing can set them.
    pub(crate) fn test_knobs(&self) -> Testing {
        #[cfg(feature = "testing")]
        let knobs = self.testing.clone();
        #[cfg(not(feature = "testing"))]
        let knobs = Testing::default();
        knobs
    }
}

/// The NBD server's limits (`lamina_nbd::ServerOptions`; its constants are
/// the defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NbdConfig {
    /// Largest READ or WRITE, advertised to clients as the maximum block
    /// size.
    pub max_payload: u32,
    /// Requests one connection may have in flight.
    pub max_in_flight: usize,
    /// READ/WRITE bytes one connection may hold in buffers at once.
    pub max_buffer_bytes: u64,
    /// At shutdown, how long a connection's replies still in flight may
    /// take to be written before the connection is closed.
    pub drain_timeout: Duration,
}

impl Default for NbdConfig {
    fn default() -> Self {
        use lamina_nbd::ServerOptions as O;
        NbdConfig {
            max_payload: O::MAX_PAYLOAD,
            max_in_flight: O::MAX_IN_FLIGHT,
            max_buffer_bytes: O::MAX_BUFFER_BYTES,
            drain_timeout: O::DRAIN_TIMEOUT,
        }
    }
}

impl NbdConfig {
    fn check(&self) -> Result<(), ServerError> {
        let min_payload = lamina_nbd::ServerOptions::MIN_MAX_PAYLOAD;
        let bad = |what: String| Err(ServerError::Config(what));
        if self.max_payload < min_payload {
            return bad(format!(
                "the NBD maximum payload must be at least {min_payload} bytes, not {}",
                self.max_payload
            ));
        }
        if self.max_in_flight == 0 {
            return bad("NBD requests in flight per connection: at least 1".into());
        }
        if self.max_buffer_bytes == 0 {
            return bad("NBD buffer bytes per connection: more than 0".into());
        }
        if self.drain_timeout.is_zero() {
            return bad("the NBD drain timeout must be more than zero".into());
        }
        Ok(())
    }

    /// The server's options.
    pub(crate) fn options(&self) -> lamina_nbd::ServerOptions {
        lamina_nbd::ServerOptions {
            max_payload: self.max_payload,
            max_in_flight: self.max_in_flight,
            max_buffer_bytes: self.max_buffer_bytes,
            drain_timeout: self.drain_timeout,
            ..lamina_nbd::ServerOptions::default()
        }
    }
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
        DEFAULT_HIGH_WATER
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

/// Knobs for tests only. With the `testing` feature, `lamina serve` sets
/// the first two with its hidden `--test-clock` and `--test-crash-at`;
/// without it, the type is this crate's own and always empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
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
#[derive(Clone, Debug, PartialEq)]
pub struct TransferConfig {
    /// Serve this node's snapshots to peers on TCP at this address.
    pub listen: Option<SocketAddr>,
    /// The node's TLS identity: a directory with ca.crt, tls.crt and
    /// tls.key. Needed to serve and to pull.
    pub tls_dir: Option<PathBuf>,
    /// How long a pull keeps retrying a source it lost before it fails
    /// with `source-unreachable`, from when it found the source lost (a
    /// source silent for `limits.stall_timeout` counts as lost); only a new durable
    /// checkpoint ends the outage, not data that arrived and was lost
    /// again with the connection.
    pub retry_window: Duration,
    /// Bytes a second this node's transfer streams and rebuilds may send
    /// together while its volumes have I/O (`pacing.rs`); `None`: always
    /// full speed.
    pub busy_rate: Option<u64>,
    /// What peers of this node's transfer listener may hold: handshakes
    /// and sessions, in all and each, and how long they may keep it
    /// waiting (docs/transfer.md, Limits).
    pub limits: lamina_transfer::Limits,
}

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

impl TransferConfig {
    fn check(&self) -> Result<(), ServerError> {
        let bad = |what: &str| Err(ServerError::Config(what.into()));
        if self.busy_rate == Some(0) {
            return bad("the transfer busy rate must be more than 0 (or none: full speed)");
        }
        let l = &self.limits;
        if [
            l.handshakes,
            l.handshakes_per_address,
            l.sessions,
            l.sessions_per_peer,
            l.replica_sessions,
        ]
        .contains(&0)
        {
            return bad("every transfer limit on handshakes and sessions must be 1 or more");
        }
        if l.opening_timeout.is_zero() || l.stall_timeout.is_zero() {
            return bad("the transfer listener's timeouts must be more than zero");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_pass_the_check_and_each_bad_value_is_refused() {
        let c = Config::new("/nowhere");
        c.check().unwrap();
        let refused = |c: Config| match c.check() {
            Err(ServerError::Config(m)) => m,
            other => panic!("not refused: {other:?}"),
        };
        let min = lamina_engine::PoolOptions::MIN_CACHE_BYTES;
        assert!(refused(c.clone().metadata_cache_bytes(min - 1)).contains("metadata cache"));
        c.clone().metadata_cache_bytes(min).check().unwrap();
        let nbd = |f: fn(&mut NbdConfig)| {
            let mut n = NbdConfig::default();
            f(&mut n);
            c.clone().nbd(n)
        };
        assert!(refused(nbd(|n| n.max_payload = 4095)).contains("maximum payload"));
        assert!(refused(nbd(|n| n.max_in_flight = 0)).contains("in flight"));
        assert!(refused(nbd(|n| n.max_buffer_bytes = 0)).contains("buffer"));
        assert!(refused(nbd(|n| n.drain_timeout = Duration::ZERO)).contains("drain"));
        assert!(refused(c.clone().transfer_busy_rate(Some(0))).contains("busy rate"));
        let limits = lamina_transfer::Limits {
            sessions: 0,
            ..Default::default()
        };
        assert!(refused(c.clone().transfer_limits(limits)).contains("transfer limit"));
    }

    #[test]
    fn the_engine_and_nbd_options_follow_the_config() {
        let c = Config::new("/nowhere")
            .metadata_cache_bytes(8 << 20)
            .nbd(NbdConfig {
                max_payload: 1 << 20,
                max_in_flight: 3,
                max_buffer_bytes: 5 << 20,
                drain_timeout: Duration::from_secs(4),
            });
        assert_eq!(c.pool_options().cache_bytes, 8 << 20);
        let o = c.nbd.options();
        assert_eq!(
            (
                o.max_payload,
                o.max_in_flight,
                o.max_buffer_bytes,
                o.drain_timeout
            ),
            (1 << 20, 3, 5 << 20, Duration::from_secs(4))
        );
        // The defaults are the engine's and the NBD server's own.
        let d = Config::default();
        assert_eq!(
            d.pool_options().cache_bytes,
            lamina_engine::PoolOptions::default().cache_bytes
        );
        let (o, n) = (d.nbd.options(), lamina_nbd::ServerOptions::default());
        assert_eq!(
            (
                o.max_payload,
                o.max_in_flight,
                o.max_buffer_bytes,
                o.drain_timeout
            ),
            (
                n.max_payload,
                n.max_in_flight,
                n.max_buffer_bytes,
                n.drain_timeout
            )
        );
    }
}
