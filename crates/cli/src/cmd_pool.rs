//! `lamina pool ...`: pool tools that use the engine directly, offline
//! (the daemon must not be running on the pool).

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use lamina_engine::{Pool, PoolOptions};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum PoolCmd {
    /// Create an empty pool in DIR.
    Create {
        dir: PathBuf,
        /// Capacity limit in bytes (default: the disk's).
        #[arg(long, default_value_t = 0)]
        max_bytes: u64,
    },
    /// Verify a pool offline: refcounts, reachability, checksums.
    Check {
        dir: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Space, volumes and snapshots of a pool.
    Stats { dir: PathBuf },
}

pub fn run(cmd: PoolCmd) -> Result<()> {
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
            println!("created pool in {}", dir.display());
        }
        PoolCmd::Check { dir, json } => {
            let opts = PoolOptions {
                background: false,
                ..PoolOptions::default()
            };
            let pool =
                Pool::open_dir(&dir, opts).with_context(|| format!("opening {}", dir.display()))?;
            let r = pool.check()?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "ok": r.is_ok(), "total_blocks": r.total_blocks, "tree_nodes": r.tree_nodes,
                        "data_blocks": r.data_blocks, "volumes": r.volumes, "snapshots": r.snapshots,
                        "dead_nodes": r.dead_nodes, "leaked_blocks": r.leaked,
                        "problem_count": r.problem_count, "problems": r.problems,
                    })
                );
            } else {
                println!(
                        "{}: {} blocks, {} volumes, {} snapshots, {} tree nodes, {} data blocks, {} awaiting reclaim",
                        dir.display(), r.total_blocks, r.volumes, r.snapshots, r.tree_nodes, r.data_blocks, r.dead_nodes
                    );
                for p in &r.problems {
                    println!("problem: {p}");
                }
            }
            pool.abandon();
            if !r.is_ok() {
                bail!("{} problem(s) found in {}", r.problem_count, dir.display());
            }
            if !json {
                println!("ok");
            }
        }
        PoolCmd::Stats { dir } => {
            let opts = PoolOptions {
                background: false,
                ..PoolOptions::default()
            };
            let pool =
                Pool::open_dir(&dir, opts).with_context(|| format!("opening {}", dir.display()))?;
            let s = pool.stats()?;
            println!(
                "{}: {} bytes in the pool file, {} used, {} free; {} volumes, {} snapshots",
                dir.display(),
                s.total_bytes,
                s.used_bytes,
                s.free_bytes,
                s.volumes,
                s.snapshots
            );
            for v in pool.list_volumes() {
                println!(
                    "volume {} size {} allocated {} snapshots {}",
                    v.name,
                    v.size,
                    v.allocated_bytes,
                    pool.list_snapshots(&v.name)?.len()
                );
            }
            pool.close()?;
        }
    }
    Ok(())
}
