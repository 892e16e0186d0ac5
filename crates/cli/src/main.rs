//! The `lamina` command: `lamina serve` runs the daemon; the other commands
//! talk to it through `lamina-client` (the unix socket in the data
//! directory, or TCP with `--endpoint` and the bearer token); `lamina pool`
//! works on a pool offline. It owns argument parsing and output only, never
//! engine or daemon logic, and writes no API path or request body itself.

mod cmd_certs;
mod cmd_clone;
#[cfg(feature = "kubernetes")]
mod cmd_controller;
#[cfg(feature = "kubernetes")]
mod cmd_csi;
#[cfg(feature = "kubernetes")]
mod cmd_node;
mod cmd_operation;
mod cmd_pool;
mod cmd_schedule;
#[cfg(feature = "kubernetes")]
mod cmd_schedule_controller;
mod cmd_snapshot;
#[cfg(not(feature = "kubernetes"))]
mod without_kubernetes;
#[cfg(not(feature = "kubernetes"))]
use without_kubernetes as cmd_controller;
#[cfg(not(feature = "kubernetes"))]
use without_kubernetes as cmd_csi;
#[cfg(not(feature = "kubernetes"))]
use without_kubernetes as cmd_node;
#[cfg(not(feature = "kubernetes"))]
use without_kubernetes as cmd_schedule_controller;
mod cmd_volume;
mod failure;
mod output;
mod tree;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use failure::Failure;
use lamina_client::Client;
use output::Format;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "lamina",
    version,
    about = "Lamina block storage: thin volumes, instant snapshots and clones"
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    cmd: Cmd,
}

/// The help heading of the options every command (that uses them) takes.
const GLOBAL: &str = "Global options";

#[derive(Args)]
struct Global {
    /// The daemon's data directory: pool, store, sockets, token [default: /var/lib/lamina for root, else $XDG_DATA_HOME/lamina or ~/.local/share/lamina].
    #[arg(long, global = true, env = "LAMINA_DATA_DIR", value_name = "DIR", help_heading = GLOBAL)]
    data_dir: Option<PathBuf>,
    /// Reach the daemon over TCP, e.g. http://127.0.0.1:7480 (needs the token).
    #[arg(long, global = true, env = "LAMINA_ENDPOINT", value_name = "URL", help_heading = GLOBAL)]
    endpoint: Option<String>,
    /// Bearer token for --endpoint (default: read from DIR/token when readable).
    #[arg(
        long,
        global = true,
        env = "LAMINA_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true,
        help_heading = GLOBAL
    )]
    token: Option<String>,
    /// Output format: one JSON or YAML document, or text for people.
    #[arg(short = 'o', long, global = true, value_enum, value_name = "FORMAT", default_value_t = Format::Table, help_heading = GLOBAL)]
    output: Format,
}

/// The same for `lamina serve`, which talks to no daemon and prints nothing.
#[derive(Args)]
struct NotForServe {
    #[arg(long, hide = true, value_parser = not_for_serve::<String>)]
    endpoint: Option<String>,
    #[arg(long, hide = true, value_parser = not_for_serve::<String>)]
    token: Option<String>,
    #[arg(short = 'o', long, hide = true, value_parser = not_for_serve::<Format>)]
    output: Option<Format>,
}

fn not_for_serve<T>(_: &str) -> Result<T, String> {
    Err("`lamina serve` runs the daemon: it takes no --endpoint, --token or --output (see `lamina serve --help`)".into())
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the daemon: the API on DIR/api.sock, NBD on DIR/nbd.sock (SIGTERM or Ctrl-C stops it).
    Serve {
        /// Also serve the API on TCP at ADDR (e.g. 127.0.0.1:7480); requests need the token in DIR/token.
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// Also serve NBD on TCP at ADDR (e.g. 127.0.0.1:10809).
        #[arg(long, value_name = "ADDR")]
        nbd_listen: Option<SocketAddr>,
        /// Prune finished operation records older than this (e.g. 7d, 12h, 30min).
        #[arg(long, value_name = "DURATION", default_value_t = lamina_server::DEFAULT_OPERATION_RETENTION.into())]
        operation_retention: humantime::Duration,
        /// Serve this node's snapshots to other nodes on TCP at ADDR (needs --transfer-tls).
        #[arg(long, value_name = "ADDR")]
        transfer_listen: Option<SocketAddr>,
        /// This node's transfer certificate: a directory with ca.crt, tls.crt, tls.key (see `lamina certs`).
        #[arg(long, value_name = "DIR")]
        transfer_tls: Option<PathBuf>,
        /// How long a clone from another node keeps retrying a source it lost before it fails (seconds, or e.g. 2min).
        #[arg(long, value_name = "DURATION", value_parser = seconds_or_duration, default_value = "60")]
        transfer_retry_window: std::time::Duration,
        /// While this node's volumes have I/O, its transfers to other nodes send at most this many bytes a second, together (e.g. 192M); off: always full speed.
        #[arg(long, value_name = "RATE|off", value_parser = rate_or_off, default_value = "192M")]
        transfer_busy_rate: RateOrOff,
        /// Connections to the transfer listener still in their TLS handshake, in all; more are closed at once.
        #[arg(long, value_name = "N", value_parser = at_least_one, default_value_t = lamina_transfer::Limits::HANDSHAKES)]
        transfer_max_handshakes: usize,
        /// The same from one IP address.
        #[arg(long, value_name = "N", value_parser = at_least_one, default_value_t = lamina_transfer::Limits::HANDSHAKES_PER_ADDRESS)]
        transfer_max_handshakes_per_address: usize,
        /// Transfer sessions of authenticated peers, in all; more are refused as busy (their pulls retry).
        #[arg(long, value_name = "N", value_parser = at_least_one, default_value_t = lamina_transfer::Limits::SESSIONS)]
        transfer_max_sessions: usize,
        /// Transfer sessions of one peer node.
        #[arg(long, value_name = "N", value_parser = at_least_one, default_value_t = lamina_transfer::Limits::SESSIONS_PER_PEER)]
        transfer_max_sessions_per_peer: usize,
        /// A peer that takes nothing from this node's transfer listener for this long is cut off and its connection closed (seconds, or e.g. 1min).
        #[arg(long, value_name = "DURATION", value_parser = positive_duration, default_value = "30")]
        transfer_stall_timeout: std::time::Duration,
        /// Past this the pool warns in `status` and scheduled snapshots pause: a share of what it can hold (90%) or used bytes (500G).
        #[arg(long, value_name = "MARK", default_value = "90%")]
        high_water: lamina_server::HighWater,
        /// Count each attached volume's and snapshot's I/O in /metrics (operations, errors, bytes, latency histograms).
        #[arg(long, value_name = "ON|OFF", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
        volume_io_metrics: bool,
        /// Tests only: read the schedules' clock (Unix seconds) from FILE.
        #[arg(long, value_name = "FILE", hide = true)]
        test_clock: Option<PathBuf>,
        /// Tests only: abort, as kill -9 would, at this named point.
        #[arg(long, value_name = "POINT", hide = true)]
        test_crash_at: Option<String>,
        #[command(flatten)]
        _not: NotForServe,
    },
    /// Certificates for copies between nodes: a cluster CA and one certificate per node.
    Certs {
        #[command(subcommand)]
        cmd: cmd_certs::CertsCmd,
    },
    /// The daemon's version, data directory and pool usage.
    Status,
    /// Thin volumes.
    Volume {
        #[command(subcommand)]
        cmd: cmd_volume::VolumeCmd,
    },
    /// Snapshots of volumes.
    Snapshot {
        #[command(subcommand)]
        cmd: cmd_snapshot::SnapshotCmd,
    },
    /// The daemon's Prometheus metrics (what GET /metrics serves), as text.
    Metrics,
    /// Schedules: snapshots of volumes on a cron expression, with retention.
    Schedule {
        #[command(subcommand)]
        cmd: cmd_schedule::ScheduleCmd,
    },
    /// Clones: new volumes from snapshots or volumes.
    Clone {
        #[command(subcommand)]
        cmd: cmd_clone::CloneCmd,
    },
    /// Long-running operations (full clones, flattens) and the record of every change.
    Operation {
        #[command(subcommand)]
        cmd: cmd_operation::OperationCmd,
    },
    /// Run the CSI driver for Kubernetes (its own flags: `lamina csi --help`).
    Csi {
        /// The driver's flags, e.g. --mode node --endpoint unix:///csi/csi.sock.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run the Kubernetes controllers (their own flags: `lamina controller --help`).
    Controller {
        /// The controllers' flags, e.g. --namespace lamina-system.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Register this storage node with Lamina's controllers (its own flags: `lamina node register --help`).
    Node {
        /// The command and its flags, e.g. register --node NAME --endpoint URL --token-file PATH.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Print the CustomResourceDefinitions of Lamina's Kubernetes resources (YAML).
    Crds,
    /// Run SnapshotSchedules (recurring VolumeSnapshots with retention) in a Kubernetes cluster.
    ScheduleController {
        /// Its flags, e.g. --interval 10s.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The pool's space from the daemon (`pool stats`), or a pool directory offline (`create`, `check`, `stats DIR`: the daemon must not be running on it).
    Pool {
        #[command(subcommand)]
        cmd: cmd_pool::PoolCmd,
    },
}

/// What every API command gets: the client and the output format.
pub struct Ctx {
    pub client: Client,
    pub fmt: Format,
}

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "csi") {
        init_tracing("info");
        if let Err(e) = cmd_csi::main(args) {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    if args.get(1).is_some_and(|a| a == "schedule-controller") {
        init_tracing("info");
        if let Err(e) = cmd_schedule_controller::main(args) {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    if args.get(1).is_some_and(|a| a == "controller") {
        init_tracing("info");
        if let Err(e) = cmd_controller::main(args) {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    if args.get(1).is_some_and(|a| a == "node") {
        init_tracing("warn");
        if let Err(e) = cmd_node::main(args) {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let cli =
        <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Options typed on the command line (not from the environment): the
    // offline pool tools refuse them rather than ignore them.
    let typed: Vec<&str> = ["data-dir", "endpoint", "token"]
        .into_iter()
        .filter(|id| {
            matches.value_source(&id.replace('-', "_"))
                == Some(clap::parser::ValueSource::CommandLine)
        })
        .collect();
    let serving = matches!(cli.cmd, Cmd::Serve { .. });
    init_tracing(if serving { "info" } else { "warn" });
    let data_dir = data_dir(cli.global.data_dir.clone());
    let mut client = None;
    let result = run(cli, &data_dir, &typed, &mut client);
    // Whatever was printed reaches the reader, or ends the command as a
    // closed pipe does (output.rs).
    output::flush_stdout();
    if let Err(e) = result {
        let f = failure::explain(&e, &data_dir, client.as_ref());
        eprintln!("error: {}", f.message);
        if let Some(h) = &f.hint {
            eprintln!("hint: {h}");
        }
        std::process::exit(f.exit_code);
    }
}

/// Logs to stderr, filtered by LAMINA_LOG (default: `default`).
fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LAMINA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
}

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{s:?}: on or off")),
    }
}

/// The data directory given, or the default, made absolute.
fn data_dir(given: Option<PathBuf>) -> PathBuf {
    let d = given.unwrap_or_else(lamina_server::default_data_dir);
    std::path::absolute(&d).unwrap_or(d)
}

/// Run the command; `client` is left with the client it used, if any, for
/// the error message.
fn run(
    cli: Cli,
    data_dir: &std::path::Path,
    typed: &[&str],
    client: &mut Option<Client>,
) -> Result<()> {
    let g = cli.global;
    match cli.cmd {
        Cmd::Pool { cmd } if cmd_pool::offline(&cmd) => {
            if let Some(o) = typed.first() {
                let mut f = Failure::new(
                    format!("--{o}: `lamina pool create`, `check` and `stats DIR` work offline on the pool directory they are given: they take no --data-dir, --endpoint or --token"),
                    Some("`lamina pool stats` without a directory asks the daemon".into()),
                );
                f.exit_code = 2; // a usage error, as clap's
                anyhow::bail!(f);
            }
            cmd_pool::run(cmd, g.output)
        }
        // Reached only with global options before `csi`, which it does not take.
        Cmd::Csi { .. } => anyhow::bail!(Failure::new(
            "`lamina csi` takes its own options after the word csi".to_string(),
            Some("run it as `lamina csi --mode ... --endpoint unix:///...` (see `lamina csi --help`)".into()),
        )),
        Cmd::Crds => cmd_controller::crds(),
        Cmd::Node { .. } => anyhow::bail!(Failure::new(
            "`lamina node` takes its own options after the word node".to_string(),
            Some("run it as `lamina node register --node NAME ...` (see `lamina node --help`)".into()),
        )),
        Cmd::ScheduleController { .. } => anyhow::bail!(Failure::new(
            "`lamina schedule-controller` takes its own options after its name".to_string(),
            Some("see `lamina schedule-controller --help`".into()),
        )),
        Cmd::Controller { .. } => anyhow::bail!(Failure::new(
            "`lamina controller` takes its own options after the word controller".to_string(),
            Some("run it as `lamina controller --namespace ...` (see `lamina controller --help`)".into()),
        )),
        Cmd::Serve {
            listen,
            nbd_listen,
            operation_retention,
            transfer_listen,
            transfer_tls,
            transfer_retry_window,
            transfer_busy_rate,
            transfer_max_handshakes,
            transfer_max_handshakes_per_address,
            transfer_max_sessions,
            transfer_max_sessions_per_peer,
            transfer_stall_timeout,
            test_clock,
            test_crash_at,
            high_water,
            volume_io_metrics,
            ..
        } => serve(lamina_server::Config {
            data_dir: data_dir.to_path_buf(),
            listen,
            nbd_listen,
            operation_retention: operation_retention.into(),
            transfer: lamina_server::TransferConfig {
                listen: transfer_listen,
                tls_dir: transfer_tls,
                retry_window: transfer_retry_window,
                busy_rate: transfer_busy_rate.0,
                limits: lamina_transfer::Limits {
                    handshakes: transfer_max_handshakes,
                    handshakes_per_address: transfer_max_handshakes_per_address,
                    sessions: transfer_max_sessions,
                    sessions_per_peer: transfer_max_sessions_per_peer,
                    stall_timeout: transfer_stall_timeout,
                    ..lamina_transfer::Limits::default()
                },
            },
            high_water,
            volume_io_metrics,
            testing: lamina_server::Testing {
                clock_file: test_clock,
                crash_at: test_crash_at,
                hold_operations: None,
            },
        }),
        Cmd::Certs { cmd } => cmd_certs::run(cmd),
        cmd => {
            let c = make_client(data_dir, g.endpoint.as_deref(), g.token.as_deref())?;
            let ctx = Ctx {
                client: client.insert(c).clone(),
                fmt: g.output,
            };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            rt.block_on(async move {
                match cmd {
                    Cmd::Status => status(&ctx).await,
                    Cmd::Volume { cmd } => cmd_volume::run(&ctx, cmd).await,
                    Cmd::Snapshot { cmd } => cmd_snapshot::run(&ctx, cmd).await,
                    Cmd::Clone { cmd } => cmd_clone::run(&ctx, cmd).await,
                    Cmd::Schedule { cmd } => cmd_schedule::run(&ctx, cmd).await,
                    Cmd::Metrics => {
                        output::out!("{}", ctx.client.metrics().await?);
                        Ok(())
                    }
                    Cmd::Operation { cmd } => cmd_operation::run(&ctx, cmd).await,
                    Cmd::Pool { .. } => cmd_pool::daemon_stats(&ctx).await,
                    Cmd::Serve { .. }
                    | Cmd::Certs { .. }
                    | Cmd::Csi { .. }
                    | Cmd::Controller { .. }
                    | Cmd::ScheduleController { .. }
                    | Cmd::Node { .. }
                    | Cmd::Crds => {
                        unreachable!("handled above")
                    }
                }
            })
        }
    }
}

/// The client for the global options: the unix socket of the data
/// directory unless an endpoint is given; then TCP with the token given,
/// or the one in the data directory when that is readable.
fn make_client(
    data_dir: &std::path::Path,
    endpoint: Option<&str>,
    token: Option<&str>,
) -> Result<Client> {
    let layout = lamina_server::Layout::new(data_dir);
    Ok(match endpoint {
        None => Client::unix(layout.api_socket),
        Some(ep) => {
            let from_file = std::fs::read_to_string(&layout.token).ok();
            Client::tcp(ep, token.or(from_file.as_deref()))?
        }
    })
}

async fn status(ctx: &Ctx) -> Result<()> {
    let h = ctx.client.health().await?;
    output::show(ctx.fmt, &h, |h| {
        output::fields(&[
            ("Version", h.version.clone()),
            ("Data directory", h.data_dir.clone()),
            ("NBD socket", h.nbd_socket.clone()),
            ("Volumes", h.volumes.to_string()),
            ("Snapshots", h.snapshots.to_string()),
            ("Pool used", lamina_api::format_size(h.pool_used_bytes)),
            (
                "Capacity",
                format!(
                    "{} more can be written",
                    lamina_api::format_size(h.capacity_bytes)
                ),
            ),
        ]) + &h
            .warnings
            .iter()
            .map(|w| format!("warning: {w}\n"))
            .collect::<String>()
    })
}

/// Completes at the first SIGTERM or SIGINT; the handlers are installed
/// when it is called (inside the runtime), before anything is served.
pub(crate) fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    })
}

/// A rate in bytes a second, or none (`off`).
#[derive(Clone, Copy, Debug)]
struct RateOrOff(Option<u64>);

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

/// A duration as plain seconds (`30`) or with a unit (`2min`).
fn seconds_or_duration(s: &str) -> Result<std::time::Duration, String> {
    if let Ok(n) = s.parse::<u64>() {
        return Ok(std::time::Duration::from_secs(n));
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?}: {e} (give seconds, or e.g. 90s, 2min)"))
}

/// A count of 1 or more.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s:?}: a whole number, 1 or more")),
    }
}

/// [`seconds_or_duration`], not zero.
fn positive_duration(s: &str) -> Result<std::time::Duration, String> {
    match seconds_or_duration(s)? {
        d if d.is_zero() => Err(format!("{s:?}: more than zero")),
        d => Ok(d),
    }
}

/// Raise this process's soft limit on open files to its hard limit. The
/// daemon's descriptors are its connections (API, NBD, transfer peers),
/// its pool's files and its store's, and the common soft limit of 1,024 is
/// a default for programs that do not ask; the transfer listener bounds
/// what peers hold, this leaves room for everything else.
fn raise_open_files_limit() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct it is given,
    // which lives on this stack frame.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!(error = %e, "cannot read the limit on open files");
        return;
    }
    if r.rlim_cur >= r.rlim_max {
        return;
    }
    let raised = libc::rlimit {
        rlim_cur: r.rlim_max,
        rlim_max: r.rlim_max,
    };
    // SAFETY: setrlimit reads the rlimit it is given, a valid local.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!(error = %e, soft = r.rlim_cur, hard = r.rlim_max, "cannot raise the limit on open files");
        return;
    }
    tracing::info!(
        from = r.rlim_cur,
        to = r.rlim_max,
        "raised the limit on open files to its hard limit"
    );
}

/// `lamina serve`: the daemon until SIGTERM or SIGINT.
fn serve(config: lamina_server::Config) -> Result<()> {
    raise_open_files_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("lamina")
        .build()
        .context("starting the async runtime")?;
    let dir = config.data_dir.clone();
    // The daemon notices another one only after opening the pool; do not
    // let a second daemon touch a pool that one is serving.
    let sock = lamina_server::Layout::new(&dir).api_socket;
    if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
        anyhow::bail!(Failure::new(
            format!(
                "another Lamina daemon is already serving {} (its API answers at {})",
                dir.display(),
                sock.display()
            ),
            Some("stop it first (SIGTERM), or give this one another --data-dir".into()),
        ));
    }
    rt.block_on(async move {
        // Installed before the daemon starts, so that a signal sent as soon
        // as the socket answers stops it cleanly instead of killing it.
        let shutdown = shutdown_signal()?;
        lamina_server::run(config, shutdown)
            .await
            .with_context(|| format!("serving {}", dir.display()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use std::time::Duration;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Every positional argument of every command says what it is.
    #[test]
    fn every_positional_argument_has_a_description() {
        fn walk(c: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in c.get_positionals() {
                if a.get_help().is_none() {
                    missing.push(format!("{path} <{}>", a.get_id()));
                }
            }
            for s in c.get_subcommands() {
                walk(s, &format!("{path} {}", s.get_name()), missing);
            }
        }
        let mut c = Cli::command();
        c.build();
        let mut missing = vec![];
        walk(&c, "lamina", &mut missing);
        assert!(missing.is_empty(), "no description: {missing:?}");
    }

    #[test]
    fn serve_takes_the_operation_retention() {
        let retention = |args: &[&str]| match Cli::try_parse_from(args).unwrap().cmd {
            Cmd::Serve {
                operation_retention,
                ..
            } => Duration::from(operation_retention),
            _ => unreachable!(),
        };
        assert_eq!(
            retention(&["lamina", "serve"]),
            lamina_server::DEFAULT_OPERATION_RETENTION
        );
        assert_eq!(
            retention(&["lamina", "serve", "--operation-retention", "90min"]),
            Duration::from_secs(5400)
        );
        assert!(Cli::try_parse_from(["lamina", "serve", "--operation-retention", "soon"]).is_err());
    }
}
