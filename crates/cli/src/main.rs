//! The `lamina` command: `lamina serve` runs the daemon; the other commands
//! talk to it over its API (the unix socket in the data directory, or TCP
//! with `--endpoint` and the bearer token); `lamina pool` works on a pool
//! offline. It owns argument parsing and output only, never engine or
//! daemon logic.

use lamina_cli::client;
mod cmd_clone;
mod cmd_operation;
mod cmd_pool;
mod cmd_snapshot;
mod cmd_volume;
mod output;
mod tree;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use client::{Client, Failure};
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

#[derive(Args)]
struct Global {
    /// The daemon's data directory: pool, store, sockets, token [default: /var/lib/lamina for root, else $XDG_DATA_HOME/lamina or ~/.local/share/lamina].
    #[arg(long, global = true, env = "LAMINA_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Reach the daemon over TCP, e.g. http://127.0.0.1:7480 (needs the token).
    #[arg(long, global = true, env = "LAMINA_ENDPOINT", value_name = "URL")]
    endpoint: Option<String>,
    /// Bearer token for --endpoint (default: read from DIR/token when readable).
    #[arg(
        long,
        global = true,
        env = "LAMINA_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, value_name = "FORMAT", default_value_t = Format::Table)]
    output: Format,
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
    /// Clones: new volumes from snapshots or volumes.
    Clone {
        #[command(subcommand)]
        cmd: cmd_clone::CloneCmd,
    },
    /// Long-running operations (full clones, flattens).
    Operation {
        #[command(subcommand)]
        cmd: cmd_operation::OperationCmd,
    },
    /// Manage a pool directory directly (the daemon must not be running on it).
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

/// A size argument (`10GiB`, `512MiB`, `4096`).
pub fn size_arg(s: &str) -> Result<u64, String> {
    lamina_api::parse_size(s)
}

fn main() {
    let cli = Cli::parse();
    let serving = matches!(cli.cmd, Cmd::Serve { .. });
    let filter = tracing_subscriber::EnvFilter::try_from_env("LAMINA_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(if serving { "info" } else { "warn" })
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        if let Some(h) = e.downcast_ref::<Failure>().and_then(|f| f.hint.as_deref()) {
            eprintln!("hint: {h}");
        }
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    let g = cli.global;
    let data_dir = g.data_dir.unwrap_or_else(lamina_server::default_data_dir);
    let data_dir = std::path::absolute(&data_dir).unwrap_or(data_dir);
    match cli.cmd {
        Cmd::Pool { cmd } => cmd_pool::run(cmd),
        Cmd::Serve { listen, nbd_listen } => serve(lamina_server::Config {
            data_dir,
            listen,
            nbd_listen,
            operation_retention: lamina_server::DEFAULT_OPERATION_RETENTION,
        }),
        cmd => {
            let client = Client::new(&data_dir, g.endpoint.as_deref(), g.token.as_deref())?;
            let ctx = Ctx {
                client,
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
                    Cmd::Operation { cmd } => cmd_operation::run(&ctx, cmd).await,
                    Cmd::Pool { .. } | Cmd::Serve { .. } => unreachable!("handled above"),
                }
            })
        }
    }
}

async fn status(ctx: &Ctx) -> Result<()> {
    let v = ctx.client.get("/v1/health").await?;
    output::show(ctx.fmt, &v, |h: &lamina_api::Health| {
        output::fields(&[
            ("Version", h.version.clone()),
            ("Data directory", h.data_dir.clone()),
            ("NBD socket", h.nbd_socket.clone()),
            ("Volumes", h.volumes.to_string()),
            ("Snapshots", h.snapshots.to_string()),
            ("Pool used", lamina_api::format_size(h.pool_used_bytes)),
        ])
    })
}

/// `lamina serve`: the daemon until SIGTERM or SIGINT.
fn serve(config: lamina_server::Config) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
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
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received"),
                _ = int.recv() => tracing::info!("SIGINT received"),
            }
        };
        lamina_server::run(config, shutdown)
            .await
            .with_context(|| format!("serving {}", dir.display()))
    })
}
