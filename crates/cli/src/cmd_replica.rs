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
    /// Add a replica on another node (by name in the node list): made there empty, then sent the volume's data by a rebuild (a full sparse copy, resumable) while the volume is served; `lamina replica list` shows its progress. A volume of one replica must be detached for its first other one.
    Add {
        /// The volume.
        volume: String,
        /// The node to hold it.
        node: String,
    },
    /// Take a replica out of a volume (never this node's, nor the last healthy one), then delete its volume on that node. A node that cannot delete it (down, say) does not hold the removal back: the answer says what stays there, to delete there by hand.
    Remove {
        /// The volume.
        volume: String,
        /// The replica's node.
        node: String,
    },
}

pub async fn run(ctx: &Ctx, cmd: ReplicaCmd) -> Result<()> {
    match cmd {
        ReplicaCmd::List { volume } => {
            let v = ctx.client.get_volume(&volume).await?;
            let Some(r) = &v.replication else {
                anyhow::bail!(
                    "volume {volume} has one replica, on this node: add another with `lamina replica add {volume} NODE`"
                );
            };
            output::show(ctx.fmt, r, |_| crate::cmd_volume::replication(&v))
        }
        ReplicaCmd::Add { volume, node } => {
            let v = ctx.client.add_replica(&volume, &node).await?;
            let Some(r) = &v.replication else {
                anyhow::bail!("volume {volume} shows no replicas after the add");
            };
            output::show(ctx.fmt, r, |_| crate::cmd_volume::replication(&v))
        }
        ReplicaCmd::Remove { volume, node } => {
            let r = ctx.client.remove_replica(&volume, &node).await?;
            output::show(ctx.fmt, &r, |r| {
                if let Some(left) = &r.left {
                    format!("removed the replica of volume {volume} on {node}; {left}")
                } else if r.existed {
                    format!(
                        "removed the replica of volume {volume} on {node}, and its volume there"
                    )
                } else {
                    format!("volume {volume} has no replica on {node}: nothing to remove")
                }
            })
        }
    }
}
