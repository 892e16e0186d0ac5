//! `lamina clone ...`

use crate::output::{self, Format};
use crate::Ctx;
use anyhow::Result;
use clap::{ArgGroup, Subcommand};
use lamina_api::{format_size, CloneCreated, Operation};
use serde_json::json;

#[derive(Subcommand)]
pub enum CloneCmd {
    /// Create a volume from a snapshot or from a volume as it is now:
    /// linked (instant, shares blocks) unless --full.
    #[command(group(ArgGroup::new("source").required(true).args(["from_snapshot", "from_volume"])))]
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
        /// Return as soon as a full clone has started, without waiting for the copy.
        #[arg(long)]
        no_wait: bool,
    },
}

pub async fn run(ctx: &Ctx, cmd: CloneCmd) -> Result<()> {
    let CloneCmd::Create {
        name,
        from_snapshot,
        from_volume,
        full,
        no_wait,
    } = cmd;
    let source = match (&from_snapshot, &from_volume) {
        (Some(s), _) => s.clone(),
        (None, Some(v)) => format!("volume {v}"),
        (None, None) => unreachable!("clap requires one source"),
    };
    let req = json!({"name": name, "from_snapshot": from_snapshot, "from_volume": from_volume, "full": full});
    let a = ctx.client.post("/v1/clones", Some(req)).await?;
    let created: CloneCreated = output::parse(&a.body)?;
    let Some(op) = created.operation else {
        return output::show(ctx.fmt, &a.body, |c: &CloneCreated| {
            format!(
                "created linked clone {} of {source} ({})",
                c.volume.name,
                format_size(c.volume.size)
            )
        });
    };
    if no_wait {
        return output::show(ctx.fmt, &a.body, |c: &CloneCreated| {
            format!(
                "created volume {}; copying {source} into it in the background as operation {} (follow it with `lamina operation wait {}`)",
                c.volume.name, op.id, op.id
            )
        });
    }
    let final_op = crate::cmd_operation::wait(ctx, &op.id).await?;
    let volume = ctx
        .client
        .get(&format!("/v1/volumes/{}", lamina_cli::client::seg(&name)))
        .await?;
    let body = json!({"volume": volume, "operation": final_op});
    match ctx.fmt {
        Format::Table => {
            let op: Operation = output::parse(&final_op)?;
            println!(
                "created full clone {name} of {source} ({} copied)",
                format_size(op.done_bytes)
            );
            Ok(())
        }
        f => output::print_raw(f, &body),
    }
}
