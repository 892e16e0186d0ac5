//! `lamina clone ...`

use crate::output;
use crate::Ctx;
use anyhow::Result;
use clap::{ArgGroup, Subcommand};
use lamina_api::{format_size, CloneCreated, CreateClone};

#[derive(Subcommand)]
pub enum CloneCmd {
    /// Create a volume from a snapshot or from a volume as it is now:
    /// linked (instant, shares blocks) unless --full.
    #[command(group(ArgGroup::new("source").required(true).args(["from_snapshot", "from_volume"])))]
    #[command(group(ArgGroup::new("copy").multiple(true).args(["full", "from_node"])))]
    Create {
        /// Name of the new volume.
        name: String,
        /// The snapshot to clone, as VOLUME/SNAPSHOT.
        #[arg(long, value_name = "VOLUME/SNAPSHOT")]
        from_snapshot: Option<String>,
        /// A volume to clone as it is now (through a system snapshot).
        #[arg(long, value_name = "VOLUME")]
        from_volume: Option<String>,
        /// Copy the data: an independent volume, usable when the copy ends.
        #[arg(long)]
        full: bool,
        /// The snapshot is on another node, NODE: copy it here over the network
        /// (always a full copy; needs a node certificate, and NODE's address:
        /// --from-address, or NODE in the daemon's node list, `lamina node add`).
        #[arg(long, value_name = "NODE", requires = "from_snapshot")]
        from_node: Option<String>,
        /// The other node's transfer address, HOST:PORT (its `lamina serve --transfer-listen`) [default: the node list's].
        #[arg(long, value_name = "HOST:PORT", requires = "from_node")]
        from_address: Option<String>,
        /// Return as soon as a copy (--full or --from-node) has started, without waiting for it.
        #[arg(long, requires = "copy")]
        no_wait: bool,
    },
}

pub async fn run(ctx: &Ctx, cmd: CloneCmd) -> Result<()> {
    let CloneCmd::Create {
        name,
        from_snapshot,
        from_volume,
        full,
        from_node,
        from_address,
        no_wait,
    } = cmd;
    let source = match (&from_snapshot, &from_volume) {
        (Some(s), _) if from_node.is_some() => {
            format!("{}:{s}", from_node.as_deref().unwrap_or_default())
        }
        (Some(s), _) => s.clone(),
        (None, Some(v)) => format!("volume {v}"),
        (None, None) => unreachable!("clap requires one source"),
    };
    let req = CreateClone {
        name: name.clone(),
        from_snapshot,
        from_volume,
        full,
        from_node: from_node.map(|name| lamina_api::PeerNode {
            name,
            address: from_address.unwrap_or_default(),
        }),
    };
    let created = ctx.client.create_clone(&req).await?.value;
    let Some(op) = created.operation.clone() else {
        return output::show(ctx.fmt, &created, |c| {
            format!(
                "created linked clone {} of {source} ({})",
                c.volume.name,
                format_size(c.volume.size)
            )
        });
    };
    if no_wait {
        return output::show(ctx.fmt, &created, |c| {
            format!(
                "created volume {}; copying {source} into it in the background as operation {} (follow it with `lamina operation wait {}`)",
                c.volume.name, op.id, op.id
            )
        });
    }
    let done = CloneCreated {
        operation: Some(crate::cmd_operation::wait(ctx, &op.id).await?),
        volume: ctx.client.get_volume(&name).await?,
    };
    output::show(ctx.fmt, &done, |c| {
        format!(
            "created full clone {name} of {source} ({} copied)",
            format_size(c.operation.as_ref().map_or(0, |o| o.done_bytes))
        )
    })
}
