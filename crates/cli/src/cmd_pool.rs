//! `lamina pool ...`: the pool's space as the daemon reports it (`stats`),
//! and tools that use the engine directly, offline, on a pool directory
//! (`create`, `check`, `stats DIR`: the daemon must not be running on it).
//! `check` only reads: it opens the pool read-only and changes no byte of
//! it, whatever state a crash or a full disk left it in.

use crate::failure::Failure;
use crate::output::{self, Format};
use anyhow::{Context, Result};
use clap::Subcommand;
use lamina_api::format_size;
use lamina_engine::{Pool, PoolOptions};
use serde::Serialize;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum PoolCmd {
    /// Create an empty pool in DIR.
    Create {
        /// The directory to create the pool in.
        dir: PathBuf,
        /// Capacity limit in bytes (default: the disk's).
        #[arg(long, default_value_t = 0)]
        max_bytes: u64,
    },
    /// Verify a pool offline, read-only: refcounts, reachability, checksums (exit 1 on any problem). Writes nothing to the pool.
    Check {
        /// The pool's directory (DATA_DIR/pool for a daemon's).
        dir: PathBuf,
        /// The same as `-o json`.
        #[arg(long, hide = true)]
        json: bool,
    },
    /// The pool's space: capacity, used, free, and what only snapshots hold (what deleting them all would free). Asks the daemon; given a DIR, reads that pool offline instead, read-only (it writes nothing to it).
    Stats {
        /// A pool directory to read offline (DATA_DIR/pool for a daemon's), with the daemon stopped.
        dir: Option<PathBuf>,
    },
}

#[derive(Serialize)]
struct Created {
    pool: String,
    max_bytes: u64,
}

#[derive(Serialize)]
struct Check {
    pool: String,
    ok: bool,
    total_blocks: u64,
    tree_nodes: u64,
    data_blocks: u64,
    volumes: u64,
    /// Deleted volumes whose records stay for their snapshots or clones.
    retired_volumes: u64,
    snapshots: u64,
    dead_nodes: u64,
    leaked_blocks: u64,
    problem_count: u64,
    problems: Vec<String>,
    /// Page-log transactions not yet copied home, read where they are.
    log_transactions: u64,
    /// Journal records a crash left, applied in memory for the check (the
    /// next open applies them to the pool).
    journal_records: u64,
}

#[derive(Serialize)]
struct Stats {
    pool: String,
    total_bytes: u64,
    used_bytes: u64,
    free_bytes: u64,
    volume_count: u64,
    snapshot_count: u64,
    /// What deleting every snapshot would free (data and index).
    snapshot_only_bytes: u64,
    volumes: Vec<VolumeStats>,
}

#[derive(Serialize)]
struct VolumeStats {
    name: String,
    size: u64,
    allocated_bytes: u64,
    snapshots: usize,
}

/// Whether the command works on a pool directory offline (else it asks the
/// daemon).
pub fn offline(cmd: &PoolCmd) -> bool {
    !matches!(cmd, PoolCmd::Stats { dir: None })
}

/// `lamina pool stats`: the daemon's `GET /v1/pool`.
pub async fn daemon_stats(ctx: &crate::Ctx) -> Result<()> {
    let s = ctx.client.pool_space().await?;
    output::show(ctx.fmt, &s, |s| {
        let pct = |n: u64| {
            if s.capacity_bytes == 0 {
                "-".to_string()
            } else {
                format!("{:.1}%", n as f64 * 100.0 / s.capacity_bytes as f64)
            }
        };
        let mut out = output::fields(&[
            ("Capacity", format_size(s.capacity_bytes)),
            (
                "Used",
                format!("{} ({})", format_size(s.used_bytes), pct(s.used_bytes)),
            ),
            ("Free", format_size(s.free_bytes)),
            (
                "Held only by snapshots",
                format!(
                    "{} (what deleting every snapshot would free; {} of it index)",
                    format_size(s.snapshot_only_bytes),
                    format_size(s.snapshot_only_metadata_bytes)
                ),
            ),
            (
                "Held by volumes and the catalog",
                format_size(s.used_bytes.saturating_sub(s.snapshot_only_bytes)),
            ),
            ("Volumes", s.volumes.to_string()),
            ("Snapshots", s.snapshots.to_string()),
            (
                "High-water mark",
                format!(
                    "{} ({} used)",
                    s.high_water,
                    format_size(s.high_water_bytes)
                ),
            ),
        ]);
        if s.reclaim_pending {
            out.push_str("Deleted index nodes are still being reclaimed: used space will drop a little more.\n");
        }
        for w in &s.warnings {
            out.push_str(&format!("warning: {w}\n"));
        }
        out
    })
}

pub fn run(cmd: PoolCmd, fmt: Format) -> Result<()> {
    match cmd {
        PoolCmd::Create { dir, max_bytes } => {
            let opts = PoolOptions {
                max_bytes,
                background: false,
                ..PoolOptions::default()
            };
            Pool::create_dir(&dir, opts)
                .with_context(|| format!("creating a pool in {}", dir.display()))?
                .close()?;
            let doc = Created {
                pool: dir.display().to_string(),
                max_bytes,
            };
            output::show(fmt, &doc, |c| format!("created pool in {}", c.pool))
        }
        PoolCmd::Check { dir, json } => {
            let fmt = if json { Format::Json } else { fmt };
            // Read-only: a check writes nothing, not even what a crash left
            // to apply (it applies that in memory and checks it too).
            let opts = PoolOptions {
                background: false,
                ..PoolOptions::default()
            };
            let r = Pool::check_read_only(&dir, opts)
                .with_context(|| format!("checking {}", dir.display()))?;
            let doc = Check {
                pool: dir.display().to_string(),
                ok: r.is_ok(),
                total_blocks: r.total_blocks,
                tree_nodes: r.tree_nodes,
                data_blocks: r.data_blocks,
                volumes: r.volumes,
                retired_volumes: r.retired_volumes,
                snapshots: r.snapshots,
                dead_nodes: r.dead_nodes,
                leaked_blocks: r.leaked,
                problem_count: r.problem_count,
                problems: r.problems,
                log_transactions: r.log_transactions,
                journal_records: r.journal_records,
            };
            output::show(fmt, &doc, |c| {
                let mut s = format!(
                    "{}: {} blocks, {} volumes, {} snapshots, {} tree nodes, {} data blocks, {} awaiting reclaim\n",
                    c.pool, c.total_blocks, c.volumes, c.snapshots, c.tree_nodes, c.data_blocks, c.dead_nodes
                );
                if c.retired_volumes > 0 {
                    s.push_str(&format!(
                        "{} deleted volumes kept for their snapshots or linked clones\n",
                        c.retired_volumes
                    ));
                }
                if c.journal_records > 0 || c.log_transactions > 0 {
                    s.push_str(&format!(
                        "checked with what the last run left to apply ({} log transactions, {} journal records), applied in memory: the pool's files are unchanged, and the next open applies it\n",
                        c.log_transactions, c.journal_records
                    ));
                }
                for p in &c.problems {
                    s.push_str(&format!("problem: {p}\n"));
                }
                if c.ok {
                    s.push_str("ok\n");
                }
                s
            })?;
            if !doc.ok {
                anyhow::bail!(Failure::new(
                    format!("{} problem(s) found in {}", doc.problem_count, doc.pool),
                    None,
                ));
            }
            Ok(())
        }
        PoolCmd::Stats { dir } => {
            let dir = dir.expect("offline stats have a directory");
            // Read-only, as `pool check` reads: nothing is written to a
            // pool someone only looked at.
            let opts = PoolOptions {
                background: false,
                ..PoolOptions::default()
            };
            let offline = Pool::stats_read_only(&dir, opts)
                .with_context(|| format!("reading {}", dir.display()))?;
            let (s, only) = (offline.stats, offline.snapshot_only);
            let volumes = offline
                .volumes
                .into_iter()
                .map(|v| VolumeStats {
                    snapshots: v.snapshots,
                    name: v.name,
                    size: v.size,
                    allocated_bytes: v.allocated_bytes,
                })
                .collect();
            let doc = Stats {
                pool: dir.display().to_string(),
                total_bytes: s.total_bytes,
                used_bytes: s.used_bytes,
                free_bytes: s.free_bytes,
                volume_count: s.volumes,
                snapshot_count: s.snapshots,
                snapshot_only_bytes: only.data_bytes + only.metadata_bytes,
                volumes,
            };
            output::show(fmt, &doc, |d| {
                let mut out = format!(
                    "{}: {} in the pool file, {} used, {} free, {} held only by snapshots; {} volumes, {} snapshots\n",
                    d.pool,
                    format_size(d.total_bytes),
                    format_size(d.used_bytes),
                    format_size(d.free_bytes),
                    format_size(d.snapshot_only_bytes),
                    d.volume_count,
                    d.snapshot_count
                );
                for v in &d.volumes {
                    out.push_str(&format!(
                        "volume {} size {} allocated {} snapshots {}\n",
                        v.name,
                        format_size(v.size),
                        format_size(v.allocated_bytes),
                        v.snapshots
                    ));
                }
                out
            })
        }
    }
}
