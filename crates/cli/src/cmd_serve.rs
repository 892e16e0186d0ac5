//! `lamina serve`'s options: one flag per setter of `lamina_server::Config`,
//! each default shown in `--help` taken from the constant the daemon uses
//! (`Config::default()`'s), and each value checked as it is parsed, so
//! that a bad one is a usage error before anything is opened.

use clap::Args;
use lamina_nbd::ServerOptions as Nbd;
use lamina_server::Config;
use lamina_transfer::Limits;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The help headings of `lamina serve`'s groups of options.
const ENGINE: &str = "Engine and NBD";
const TRANSFER: &str = "Copies between nodes";

#[derive(Args)]
pub struct ServeArgs {
    /// Also serve the API on TCP at ADDR (e.g. 127.0.0.1:7480); requests need the token in DIR/token.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Read the TCP API's token from FILE instead of DIR/token (e.g. a Kubernetes Secret mounted outside the data directory); the daemon never writes it.
    #[arg(long, value_name = "FILE", requires = "listen")]
    token_file: Option<PathBuf>,
    /// Also serve NBD on TCP at ADDR (e.g. 127.0.0.1:10809).
    #[arg(long, value_name = "ADDR")]
    nbd_listen: Option<SocketAddr>,
    /// Prune finished operation records older than this (e.g. 7d, 12h, 30min).
    #[arg(long, value_name = "DURATION", default_value_t = lamina_server::DEFAULT_OPERATION_RETENTION.into())]
    operation_retention: humantime::Duration,
    /// Past this the pool warns in `status` and scheduled snapshots pause: a share of what it can hold (90%) or used bytes (500G).
    #[arg(long, value_name = "MARK", default_value_t = lamina_server::DEFAULT_HIGH_WATER)]
    high_water: lamina_server::HighWater,
    /// Count each attached volume's and snapshot's I/O in /metrics (operations, errors, bytes, latency histograms).
    #[arg(long, value_name = "ON|OFF", default_value_t = OnOff(lamina_server::DEFAULT_VOLUME_IO_METRICS), value_parser = on_off)]
    volume_io_metrics: OnOff,
    /// Serve attached volumes as files on this host when asked (`volume attach --file`, the CSI node plugin), through FUSE; off refuses them.
    #[arg(long, value_name = "ON|OFF", default_value_t = OnOff(lamina_server::DEFAULT_FILES), value_parser = on_off)]
    files: OnOff,
    /// Hand the files' FUSE connections to the keeper at this socket when stopping (`lamina keeper`), and take them back when starting: the files' I/O waits across a restart instead of failing.
    #[arg(long, value_name = "SOCKET")]
    keeper: Option<PathBuf>,
    /// How much of the pool's metadata (volume maps, reference counts) the engine keeps in memory; more saves reads of the pool file on large pools.
    #[arg(long, value_name = "SIZE", help_heading = ENGINE, default_value_t = Size(lamina_server::DEFAULT_METADATA_CACHE_BYTES as u64), value_parser = metadata_cache)]
    metadata_cache: Size,
    /// Largest NBD read or write, advertised to clients as the maximum block size (at least 4K, below 4G).
    #[arg(long, value_name = "SIZE", help_heading = ENGINE, default_value_t = Size(Nbd::MAX_PAYLOAD.into()), value_parser = nbd_max_payload)]
    nbd_max_payload: Size,
    /// NBD requests one connection may have in flight; more wait for one to end.
    #[arg(long, value_name = "N", help_heading = ENGINE, default_value_t = Nbd::MAX_IN_FLIGHT, value_parser = at_least_one)]
    nbd_max_in_flight: usize,
    /// Bytes of NBD reads and writes one connection may hold in buffers at once (one request may always take it all).
    #[arg(long, value_name = "SIZE", help_heading = ENGINE, default_value_t = Size(Nbd::MAX_BUFFER_BYTES), value_parser = positive_size)]
    nbd_max_buffer: Size,
    /// At shutdown, how long an NBD connection's replies may take to be written before it is closed (seconds, or e.g. 1min).
    #[arg(long, value_name = "DURATION", help_heading = ENGINE, default_value_t = Secs(Nbd::DRAIN_TIMEOUT), value_parser = positive_duration)]
    nbd_drain_timeout: Secs,
    /// Serve this node's snapshots to other nodes on TCP at ADDR (needs --transfer-tls).
    #[arg(long, value_name = "ADDR", help_heading = TRANSFER)]
    transfer_listen: Option<SocketAddr>,
    /// This node's transfer certificate: a directory with ca.crt, tls.crt, tls.key (see `lamina certs`).
    #[arg(long, value_name = "DIR", help_heading = TRANSFER)]
    transfer_tls: Option<PathBuf>,
    /// How long a clone from another node keeps retrying a source it lost before it fails (seconds, or e.g. 2min).
    #[arg(long, value_name = "DURATION", help_heading = TRANSFER, default_value_t = Secs(lamina_server::DEFAULT_TRANSFER_RETRY_WINDOW), value_parser = seconds_or_duration)]
    transfer_retry_window: Secs,
    /// While this node's volumes have I/O, its transfers to other nodes and its replicas' rebuilds send at most this many bytes a second, together (e.g. 192M); off: always full speed.
    #[arg(long, value_name = "RATE|off", help_heading = TRANSFER, default_value_t = RateOrOff(Some(lamina_server::DEFAULT_TRANSFER_BUSY_RATE)), value_parser = rate_or_off)]
    transfer_busy_rate: RateOrOff,
    /// Connections to the transfer listener still in their TLS handshake, in all; more are closed at once.
    #[arg(long, value_name = "N", help_heading = TRANSFER, value_parser = at_least_one, default_value_t = Limits::HANDSHAKES)]
    transfer_max_handshakes: usize,
    /// The same from one IP address.
    #[arg(long, value_name = "N", help_heading = TRANSFER, value_parser = at_least_one, default_value_t = Limits::HANDSHAKES_PER_ADDRESS)]
    transfer_max_handshakes_per_address: usize,
    /// Transfer sessions of authenticated peers, in all; more are refused as busy (their pulls retry).
    #[arg(long, value_name = "N", help_heading = TRANSFER, value_parser = at_least_one, default_value_t = Limits::SESSIONS)]
    transfer_max_sessions: usize,
    /// Transfer sessions of one peer node.
    #[arg(long, value_name = "N", help_heading = TRANSFER, value_parser = at_least_one, default_value_t = Limits::SESSIONS_PER_PEER)]
    transfer_max_sessions_per_peer: usize,
    /// Replica sessions (front ends of other nodes attached to this node's volumes), in all; more are refused as busy.
    #[arg(long, value_name = "N", help_heading = TRANSFER, value_parser = at_least_one, default_value_t = Limits::REPLICA_SESSIONS)]
    transfer_max_replica_sessions: usize,
    /// A peer that takes nothing from this node's transfer listener for this long is cut off and its connection closed; a source this node pulls from that sends nothing this long is taken for lost (seconds, or e.g. 1min).
    #[arg(long, value_name = "DURATION", help_heading = TRANSFER, value_parser = positive_duration, default_value_t = Secs(Limits::STALL_TIMEOUT))]
    transfer_stall_timeout: Secs,
    /// Record each replicated volume's replica set (front end, generation, healthy replicas) in its Volume resource in this namespace of the Kubernetes API server, before acting on it (found as kubectl finds it: KUBECONFIG, or the pod's ServiceAccount); without it, this daemon's store is the only record.
    #[cfg(feature = "kubernetes")]
    #[arg(long, value_name = "NAMESPACE", help_heading = TRANSFER)]
    kube_namespace: Option<String>,
    #[command(flatten)]
    testing: crate::test_flags::TestFlags,
    #[command(flatten)]
    _not: crate::NotForServe,
}

impl ServeArgs {
    /// The replica sets' shared record these options ask for, started.
    pub fn shared_record(
        &self,
    ) -> anyhow::Result<Option<std::sync::Arc<dyn lamina_server::SharedRecord>>> {
        #[cfg(feature = "kubernetes")]
        if let Some(ns) = &self.kube_namespace {
            let r = lamina_kube_record::KubeRecord::start(
                ns.clone(),
                lamina_kube_record::DEFAULT_DEADLINE,
            )
            .map_err(|e| {
                anyhow::anyhow!("starting the replica sets' record in the API server: {e}")
            })?;
            return Ok(Some(std::sync::Arc::new(r)));
        }
        Ok(None)
    }

    /// The daemon's configuration: these options on `data_dir`.
    pub fn config(self, data_dir: &std::path::Path) -> Config {
        let config = Config::new(data_dir)
            .listen(self.listen)
            .nbd_listen(self.nbd_listen)
            .operation_retention(self.operation_retention.into())
            .high_water(self.high_water)
            .volume_io_metrics(self.volume_io_metrics.0)
            .files(self.files.0)
            .keeper(self.keeper)
            .token_file(self.token_file)
            .metadata_cache_bytes(self.metadata_cache.0 as usize)
            .nbd(lamina_server::NbdConfig {
                max_payload: self.nbd_max_payload.0 as u32,
                max_in_flight: self.nbd_max_in_flight,
                max_buffer_bytes: self.nbd_max_buffer.0,
                drain_timeout: self.nbd_drain_timeout.0,
            })
            .transfer_listen(self.transfer_listen)
            .transfer_tls(self.transfer_tls)
            .transfer_retry_window(self.transfer_retry_window.0)
            .transfer_busy_rate(self.transfer_busy_rate.0)
            .transfer_limits(Limits {
                handshakes: self.transfer_max_handshakes,
                handshakes_per_address: self.transfer_max_handshakes_per_address,
                sessions: self.transfer_max_sessions,
                sessions_per_peer: self.transfer_max_sessions_per_peer,
                replica_sessions: self.transfer_max_replica_sessions,
                stall_timeout: self.transfer_stall_timeout.0,
                ..Limits::default()
            });
        self.testing.apply(config)
    }
}

/// `on` or `off`.
#[derive(Clone, Copy, Debug)]
struct OnOff(bool);

impl std::fmt::Display for OnOff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0 { "on" } else { "off" })
    }
}

fn on_off(s: &str) -> Result<OnOff, String> {
    match s {
        "on" => Ok(OnOff(true)),
        "off" => Ok(OnOff(false)),
        _ => Err(format!("{s:?}: on or off")),
    }
}

/// A number of bytes, shown in the largest unit that holds it exactly
/// (`64M`), as a size is written on the command line.
#[derive(Clone, Copy, Debug)]
struct Size(u64);

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0;
        for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
            if n != 0 && n.is_multiple_of(1 << shift) {
                return write!(f, "{}{unit}", n >> shift);
            }
        }
        write!(f, "{n}")
    }
}

/// A size (`lamina_api::parse_size`) from `min` to `max` bytes.
fn size_within(s: &str, min: u64, max: u64) -> Result<Size, String> {
    let n = lamina_api::parse_size(s)?;
    if n < min {
        return Err(format!("{s:?}: at least {}", Size(min)));
    }
    if n > max {
        return Err(format!("{s:?}: at most {} bytes", max));
    }
    Ok(Size(n))
}

/// The engine keeps at least its minimum whatever it is given: less is
/// refused rather than silently raised.
fn metadata_cache(s: &str) -> Result<Size, String> {
    let min = lamina_engine::PoolOptions::MIN_CACHE_BYTES as u64;
    size_within(s, min, usize::MAX as u64)
}

fn nbd_max_payload(s: &str) -> Result<Size, String> {
    size_within(s, Nbd::MIN_MAX_PAYLOAD.into(), u32::MAX.into())
}

fn positive_size(s: &str) -> Result<Size, String> {
    size_within(s, 1, u64::MAX)
}

/// A rate in bytes a second, or none (`off`).
#[derive(Clone, Copy, Debug)]
struct RateOrOff(Option<u64>);

impl std::fmt::Display for RateOrOff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(n) => Size(n).fmt(f),
            None => f.write_str("off"),
        }
    }
}

/// A rate in bytes a second (a size: 192M), or `off`.
fn rate_or_off(s: &str) -> Result<RateOrOff, String> {
    if s == "off" {
        return Ok(RateOrOff(None));
    }
    match lamina_api::parse_size(s)? {
        0 => Err(format!("{s:?}: a rate must be more than 0 (or off)")),
        n => Ok(RateOrOff(Some(n))),
    }
}

/// A duration, shown as humantime writes it (`1m`, `30s`).
#[derive(Clone, Copy, Debug)]
struct Secs(Duration);

impl std::fmt::Display for Secs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        humantime::format_duration(self.0).fmt(f)
    }
}

/// A duration as plain seconds (`30`) or with a unit (`2min`).
fn seconds_or_duration(s: &str) -> Result<Secs, String> {
    if let Ok(n) = s.parse::<u64>() {
        return Ok(Secs(Duration::from_secs(n)));
    }
    humantime::parse_duration(s)
        .map(Secs)
        .map_err(|e| format!("{s:?}: {e} (give seconds, or e.g. 90s, 2min)"))
}

/// [`seconds_or_duration`], not zero.
fn positive_duration(s: &str) -> Result<Secs, String> {
    match seconds_or_duration(s)? {
        d if d.0.is_zero() => Err(format!("{s:?}: more than zero")),
        d => Ok(d),
    }
}

/// A count of 1 or more.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s:?}: a whole number, 1 or more")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Cli, Cmd};
    use clap::Parser;

    fn config(args: &[&str]) -> Result<Config, clap::Error> {
        let argv = ["lamina", "serve"].iter().chain(args);
        match Cli::try_parse_from(argv)?.cmd {
            Cmd::Serve(a) => Ok(a.config(std::path::Path::new("/data"))),
            _ => unreachable!(),
        }
    }

    /// What `lamina serve` runs with when given nothing is
    /// `Config::default()`: every default in --help is the daemon's.
    #[test]
    fn serve_without_options_is_the_default_config() {
        assert_eq!(config(&[]).unwrap(), Config::new("/data"));
        // And --help shows them as a user writes them.
        let help = match Cli::try_parse_from(["lamina", "serve", "--help"]) {
            Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => e.to_string(),
            _ => panic!("no help"),
        };
        for shown in [
            "[default: 7days]",
            "[default: 90%]",
            "[default: on]",
            "[default: 64M]",
            "[default: 32M]",
            "[default: 256M]",
            "[default: 10s]",
            "[default: 1m]",
            "[default: 192M]",
            "[default: 30s]",
        ] {
            assert!(help.contains(shown), "no {shown} in:\n{help}");
        }
    }

    #[test]
    fn every_option_reaches_the_config() {
        let c = config(&[
            "--listen=127.0.0.1:1",
            "--token-file=/secret/token",
            "--nbd-listen=127.0.0.1:2",
            "--operation-retention=90min",
            "--high-water=500G",
            "--volume-io-metrics=off",
            "--files=off",
            "--metadata-cache=1G",
            "--nbd-max-payload=1M",
            "--nbd-max-in-flight=3",
            "--nbd-max-buffer=8M",
            "--nbd-drain-timeout=2min",
            "--transfer-listen=127.0.0.1:3",
            "--transfer-tls=/certs",
            "--transfer-retry-window=5",
            "--transfer-busy-rate=off",
            "--transfer-max-handshakes=5",
            "--transfer-max-handshakes-per-address=4",
            "--transfer-max-sessions=3",
            "--transfer-max-sessions-per-peer=2",
            "--transfer-max-replica-sessions=9",
            "--transfer-stall-timeout=7",
        ])
        .unwrap();
        let addr = |p: u16| Some(SocketAddr::from(([127, 0, 0, 1], p)));
        let want = Config::new("/data")
            .listen(addr(1))
            .token_file(PathBuf::from("/secret/token"))
            .nbd_listen(addr(2))
            .operation_retention(Duration::from_secs(5400))
            .high_water(lamina_server::HighWater::Bytes(500 << 30))
            .volume_io_metrics(false)
            .files(false)
            .metadata_cache_bytes(1 << 30)
            .nbd(lamina_server::NbdConfig {
                max_payload: 1 << 20,
                max_in_flight: 3,
                max_buffer_bytes: 8 << 20,
                drain_timeout: Duration::from_secs(120),
            })
            .transfer_listen(addr(3))
            .transfer_tls(PathBuf::from("/certs"))
            .transfer_retry_window(Duration::from_secs(5))
            .transfer_busy_rate(None)
            .transfer_limits(Limits {
                handshakes: 5,
                handshakes_per_address: 4,
                sessions: 3,
                sessions_per_peer: 2,
                replica_sessions: 9,
                stall_timeout: Duration::from_secs(7),
                ..Limits::default()
            });
        assert_eq!(c, want);
        c.check().unwrap();
    }

    #[test]
    fn bad_values_are_refused_with_what_is_allowed() {
        for (arg, says) in [
            ("--operation-retention=soon", "--operation-retention"),
            ("--metadata-cache=4K", "at least 256K"),
            ("--metadata-cache=lots", "a size is a number of bytes"),
            ("--nbd-max-payload=1K", "at least 4K"),
            ("--nbd-max-payload=4G", "at most 4294967295 bytes"),
            ("--nbd-max-in-flight=0", "1 or more"),
            ("--nbd-max-buffer=0", "at least 1"),
            ("--nbd-drain-timeout=0", "more than zero"),
            ("--transfer-busy-rate=0", "more than 0"),
            ("--transfer-stall-timeout=0s", "more than zero"),
            ("--transfer-max-sessions=0", "1 or more"),
            ("--volume-io-metrics=yes", "on or off"),
            ("--high-water=101%", "1% to 100%"),
        ] {
            let e = config(&[arg])
                .err()
                .unwrap_or_else(|| panic!("{arg} taken"));
            assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{arg}");
            assert!(e.to_string().contains(says), "{arg}: {e}");
        }
        // The least each bound allows is taken, and passes the daemon's check.
        config(&["--metadata-cache=256K", "--nbd-max-payload=4K"])
            .unwrap()
            .check()
            .unwrap();
    }

    #[test]
    fn sizes_and_durations_show_as_they_are_written() {
        assert_eq!(Size(64 << 20).to_string(), "64M");
        assert_eq!(Size(3 << 40).to_string(), "3T");
        assert_eq!(Size(1536).to_string(), "1536");
        assert_eq!(Size(0).to_string(), "0");
        assert_eq!(Secs(Duration::from_secs(60)).to_string(), "1m");
        // What is shown parses back to the same value.
        for n in [64 << 20, 3 << 40, 1536, 32 << 20] {
            assert_eq!(lamina_api::parse_size(&Size(n).to_string()), Ok(n));
        }
        for d in [60, 30, 10, 7 * 24 * 3600, 90].map(Duration::from_secs) {
            assert_eq!(seconds_or_duration(&Secs(d).to_string()).unwrap().0, d);
        }
    }

    /// The test flags exist in the builds tests run (this one) and set the
    /// test knobs; a production build has neither (`cargo check -p
    /// lamina-cli` builds it without them).
    #[test]
    fn the_test_flags_set_the_test_knobs() {
        let c = config(&["--test-clock=/clock", "--test-crash-at=point"]).unwrap();
        assert_eq!(
            c.testing,
            lamina_server::Testing {
                clock_file: Some("/clock".into()),
                crash_at: Some("point".into()),
                hold_operations: None,
            }
        );
    }
}
