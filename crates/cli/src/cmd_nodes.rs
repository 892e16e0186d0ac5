//! `lamina node add|list|remove`: the daemon's node list, the other Lamina
//! nodes it reaches by name (`/v1/nodes`). `lamina node register` (the
//! Kubernetes registration, `cmd_node`) is parsed apart and only named here,
//! so that `lamina node --help` lists it.

use crate::output::{self, Table};
use crate::Ctx;
use anyhow::Result;
use clap::Subcommand;
use lamina_api::AddNode;

#[derive(Subcommand)]
pub enum NodeCmd {
    /// Add another Lamina node to this daemon's node list, so that requests name it alone (e.g. `lamina clone create --from-node NAME`).
    Add {
        /// The node's name, as its transfer certificate names it (`lamina certs issue`).
        name: String,
        /// Where its transfer listener answers (its `lamina serve --transfer-listen`), HOST:PORT.
        #[arg(value_name = "HOST:PORT")]
        address: String,
    },
    /// The node list.
    List,
    /// Remove a node from the list (volumes copied from it stay).
    Remove {
        /// The node's name.
        name: String,
    },
    /// Register this storage node with Lamina's controllers in Kubernetes (its own flags: `lamina node register --help`).
    Register {
        /// Its flags, e.g. --node NAME --endpoint URL --token-file PATH.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The cluster's transfer CA from its Secret in Kubernetes, made there first if there is none (its own flags: `lamina node ensure-ca --help`).
    EnsureCa {
        /// Its flags, e.g. --secret NAME DIR.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// This node's transfer certificate issued by cert-manager (its own flags: `lamina node certificate --help`).
    Certificate {
        /// Its flags, e.g. --node NAME --issuer NAME DIR.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

pub async fn run(ctx: &Ctx, cmd: NodeCmd) -> Result<()> {
    let c = &ctx.client;
    match cmd {
        NodeCmd::Add { name, address } => {
            let r = c.add_node(&AddNode { name, address }).await?;
            output::show(ctx.fmt, &r.value, |n| {
                if r.created {
                    format!("added node {} at {}", n.name, n.address)
                } else {
                    format!("node {} is in the list already at {}", n.name, n.address)
                }
            })
        }
        NodeCmd::List => {
            let all = c.list_nodes().await?;
            output::show(ctx.fmt, &all, |all| {
                let mut t = Table::new(&["NAME", "ADDRESS", "ADDED"]);
                for n in all {
                    t.row(vec![n.name.clone(), n.address.clone(), n.added.clone()]);
                }
                t.render()
            })
        }
        NodeCmd::Remove { name } => {
            let r = c.remove_node(&name).await?;
            output::show(ctx.fmt, &r, |r| {
                if r.existed {
                    format!("removed node {name} from the list")
                } else {
                    format!("node {name} is not in the list: nothing to remove")
                }
            })
        }
        // main parses `node register`, `node ensure-ca` and `node
        // certificate` apart, before the client is made.
        NodeCmd::Register { .. } | NodeCmd::EnsureCa { .. } | NodeCmd::Certificate { .. } => {
            anyhow::bail!(crate::failure::Failure::new(
                "`lamina node register`, `lamina node ensure-ca` and `lamina node certificate` take their own options after their words"
                    .to_string(),
                Some("see `lamina node register --help`, `lamina node ensure-ca --help`, `lamina node certificate --help`".into()),
            ))
        }
    }
}
