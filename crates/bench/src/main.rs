//! `lamina-bench`: measurement, and nothing else. `suite` runs Lamina side
//! by side with the tools a user would pick instead (qemu-nbd serving raw
//! and qcow2 files, nbdkit's file plugin, qemu-storage-daemon, fio straight
//! on a file) in one run, interleaved, and writes a JSON file of every raw
//! figure, a markdown report of ratios and a plot. `engine` measures the
//! engine in process. It starts the real `lamina` binary and the real
//! anchors; it must not reach into the daemon's or engine's internals
//! beyond building a pool before a daemon opens it.

mod engine;
mod suite;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Lamina's benchmarks: the side-by-side suite and the in-process engine bench")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Lamina against qemu-nbd (raw, qcow2), nbdkit, qemu-storage-daemon
    /// and the bare file, through NBD, with a report of ratios.
    Suite(suite::SuiteArgs),
    /// The engine in process: snapshot, clone, delete cost, I/O at depth.
    Engine(engine::EngineArgs),
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Suite(a) => suite::run(a),
        Cmd::Engine(a) => engine::run(a),
    }
}
