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
mod cmd_nodes;
mod cmd_operation;
mod cmd_pool;
mod cmd_replica;
mod cmd_schedule;
#[cfg(feature = "kubernetes")]
mod cmd_schedule_controller;
mod cmd_serve;
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
mod test_flags;
mod tree;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use failure::Failure;
use lamina_client::Client;
use output::Format;
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
    Serve(Box<cmd_serve::ServeArgs>),
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
    /// Replicated volumes' replicas.
    Replica {
        #[command(subcommand)]
        cmd: cmd_replica::ReplicaCmd,
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
    /// Other Lamina nodes this daemon reaches by name; and `register`, this storage node's registration with Lamina's controllers, `ensure-ca`, the cluster's transfer CA from its Secret, and `certificate`, its transfer certificate from cert-manager.
    Node {
        #[command(subcommand)]
        cmd: cmd_nodes::NodeCmd,
    },
    /// Print the CustomResourceDefinitions of Lamina's Kubernetes resources (YAML).
    Crds,
    /// Hold the daemon's files' FUSE connections while it restarts (`lamina serve --keeper SOCKET`): their I/O waits for the next daemon instead of failing.
    Keeper {
        /// Where to listen (default: DIR/keeper.sock).
        #[arg(long, value_name = "PATH")]
        socket: Option<PathBuf>,
        /// Let go of a connection no daemon took back within this long: its I/O then fails instead of waiting (e.g. 5min, 1h).
        #[arg(long, value_name = "DURATION", default_value_t = lamina_keeper::DEFAULT_HOLD.into())]
        hold: humantime::Duration,
    },
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
    if args.get(1).is_some_and(|a| a == "node")
        && args
            .get(2)
            .is_some_and(|a| a == "register" || a == "ensure-ca" || a == "certificate")
    {
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
    let serving = matches!(cli.cmd, Cmd::Serve { .. } | Cmd::Keeper { .. });
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
        Cmd::Node {
            cmd:
                cmd_nodes::NodeCmd::Register { .. }
                | cmd_nodes::NodeCmd::EnsureCa { .. }
                | cmd_nodes::NodeCmd::Certificate { .. },
        } => anyhow::bail!(Failure::new(
            "`lamina node register`, `lamina node ensure-ca` and `lamina node certificate` take their own options after their words".to_string(),
            Some("run them as `lamina node register --node NAME ...`, `lamina node ensure-ca --secret NAME DIR` or `lamina node certificate --node NAME --issuer NAME DIR` (see their --help)".into()),
        )),
        Cmd::ScheduleController { .. } => anyhow::bail!(Failure::new(
            "`lamina schedule-controller` takes its own options after its name".to_string(),
            Some("see `lamina schedule-controller --help`".into()),
        )),
        Cmd::Controller { .. } => anyhow::bail!(Failure::new(
            "`lamina controller` takes its own options after the word controller".to_string(),
            Some("run it as `lamina controller --namespace ...` (see `lamina controller --help`)".into()),
        )),
        Cmd::Serve(args) => {
            let shared = args.shared_record()?;
            let mut config = args.config(data_dir);
            if let Some(s) = shared {
                config = config.shared_record(s);
            }
            serve(config)
        }
        Cmd::Keeper { socket, hold } => {
            let socket = socket.unwrap_or_else(|| data_dir.join("keeper.sock"));
            let keeper = lamina_keeper::Keeper::bind(&socket, hold.into())?;
            tracing::info!(socket = %socket.display(), "holding the daemon's file connections across its restarts");
            keeper.run();
            Ok(())
        }
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
                    Cmd::Node { cmd } => cmd_nodes::run(&ctx, cmd).await,
                    Cmd::Replica { cmd } => cmd_replica::run(&ctx, cmd).await,
                    Cmd::Pool { .. } => cmd_pool::daemon_stats(&ctx).await,
                    Cmd::Serve { .. }
                    | Cmd::Keeper { .. }
                    | Cmd::Certs { .. }
                    | Cmd::Csi { .. }
                    | Cmd::Controller { .. }
                    | Cmd::ScheduleController { .. }
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
}
