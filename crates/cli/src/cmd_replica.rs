//! `lamina replica ...`: a replicated volume's replicas (docs/replicas.md).

use crate::output;
use crate::Ctx;
use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum ReplicaCmd {
    /// A replicated volume's replicas: node, address, state, since when, and why one is faulted.
    List {
        /// The volume.
        volume: String,
    },
}

pub async fn run(ctx: &Ctx, cmd: ReplicaCmd) -> Result<()> {
    match cmd {
        ReplicaCmd::List { volume } => {
            let v = ctx.client.get_volume(&volume).await?;
            let Some(r) = &v.replication else {
                anyhow::bail!(
                    "volume {volume} has one replica, on this node: it was not created with --replicas"
                );
            };
            output::show(ctx.fmt, r, |_| crate::cmd_volume::replication(&v))
        }
    }
}
