//! `lamina volume ...`

use crate::output::{self, fields, or_dash, Format, Table};
use crate::Ctx;
use anyhow::Result;
use clap::Subcommand;
use hyper::StatusCode;
use lamina_api::{format_size, CloneState, Export, Volume};
use lamina_cli::client::seg;
use serde_json::json;

#[derive(Subcommand)]
pub enum VolumeCmd {
    /// Create a thin volume (succeeds if one exists with the same name and size).
    Create {
        name: String,
        /// Size, e.g. 10GiB, 512MiB, 1TB, 4096.
        #[arg(long, value_parser = crate::size_arg)]
        size: u64,
    },
    /// List the volumes.
    List,
    /// Show a volume, with its clone origin and state.
    Get { name: String },
    /// Grow a volume (shrinking is refused).
    Expand {
        name: String,
        /// The new size, e.g. 20GiB.
        #[arg(long, value_parser = crate::size_arg)]
        size: u64,
    },
    /// Delete a volume.
    Delete {
        name: String,
        /// Delete its snapshots with it.
        #[arg(long)]
        with_snapshots: bool,
    },
    /// Export a volume over NBD and print its URI.
    Attach { name: String },
    /// Stop exporting a volume.
    Detach { name: String },
    /// Make a linked clone independent of its origin (copies the shared blocks in the background).
    Flatten {
        name: String,
        /// Wait until the clone is independent.
        #[arg(long)]
        wait: bool,
    },
}

pub async fn run(ctx: &Ctx, cmd: VolumeCmd) -> Result<()> {
    let c = &ctx.client;
    match cmd {
        VolumeCmd::Create { name, size } => {
            let a = c
                .post("/v1/volumes", Some(json!({"name": name, "size": size})))
                .await?;
            output::show(ctx.fmt, &a.body, |v: &Volume| {
                if a.status == StatusCode::CREATED {
                    format!("created volume {} ({})", v.name, format_size(v.size))
                } else {
                    format!(
                        "volume {} exists already with that size ({})",
                        v.name,
                        format_size(v.size)
                    )
                }
            })
        }
        VolumeCmd::List => {
            let v = c.get("/v1/volumes").await?;
            output::show(ctx.fmt, &v, |vols: &Vec<Volume>| list_table(vols))
        }
        VolumeCmd::Get { name } => {
            let v = c.get(&format!("/v1/volumes/{}", seg(&name))).await?;
            output::show(ctx.fmt, &v, details)
        }
        VolumeCmd::Expand { name, size } => {
            let a = c
                .post(
                    &format!("/v1/volumes/{}/expand", seg(&name)),
                    Some(json!({"size": size})),
                )
                .await?;
            output::show(ctx.fmt, &a.body, |v: &Volume| {
                format!("volume {} is now {}", v.name, format_size(v.size))
            })
        }
        VolumeCmd::Delete {
            name,
            with_snapshots,
        } => {
            let q = if with_snapshots {
                "?with_snapshots=true"
            } else {
                ""
            };
            let a = c.delete(&format!("/v1/volumes/{}{q}", seg(&name))).await?;
            done(ctx.fmt, &a.body, || {
                if with_snapshots {
                    format!("deleted volume {name} and its snapshots")
                } else {
                    format!("deleted volume {name}")
                }
            })
        }
        VolumeCmd::Attach { name } => {
            let a = c
                .post(&format!("/v1/volumes/{}/attach", seg(&name)), None)
                .await?;
            output::show(ctx.fmt, &a.body, |e: &Export| e.uri.clone())
        }
        VolumeCmd::Detach { name } => {
            let a = c
                .post(&format!("/v1/volumes/{}/detach", seg(&name)), None)
                .await?;
            done(ctx.fmt, &a.body, || format!("detached volume {name}"))
        }
        VolumeCmd::Flatten { name, wait } => {
            let a = c
                .post(&format!("/v1/volumes/{}/flatten", seg(&name)), None)
                .await?;
            let mut body = a.body;
            if wait {
                body = crate::cmd_operation::wait_flatten(ctx, &name).await?;
            }
            output::show(ctx.fmt, &body, |v: &Volume| {
                match v.clone_state {
                CloneState::Flattening => format!(
                    "flattening volume {}: its shared blocks are being copied in the background (`lamina volume get {}` shows when it is independent)",
                    v.name, v.name
                ),
                _ => format!("volume {} is {}", v.name, state_name(&v.clone_state)),
            }
            })
        }
    }
}

/// For answers without a body (204): a line in table mode, and in JSON or
/// YAML mode the body if there was one, else nothing.
pub fn done(fmt: Format, body: &serde_json::Value, line: impl FnOnce() -> String) -> Result<()> {
    match fmt {
        Format::Table => println!("{}", line()),
        _ if body.is_null() => {}
        _ => output::print_raw(fmt, body)?,
    }
    Ok(())
}

pub fn state_name(s: &CloneState) -> &'static str {
    match s {
        CloneState::None => "none",
        CloneState::Linked => "linked",
        CloneState::Flattening => "flattening",
        CloneState::Independent => "independent",
        CloneState::Copying => "copying",
    }
}

fn origin(v: &Volume) -> String {
    match &v.origin {
        None => "-".into(),
        Some(o) => format!(
            "{}/{}",
            o.volume.as_deref().unwrap_or("(deleted)"),
            o.snapshot.as_deref().unwrap_or("(deleted)")
        ),
    }
}

fn list_table(vols: &[Volume]) -> String {
    let mut t = Table::new(&[
        "NAME",
        "SIZE",
        "ALLOCATED",
        "CREATED",
        "CLONE",
        "ORIGIN",
        "ATTACHED",
    ]);
    for v in vols {
        t.row(vec![
            v.name.clone(),
            format_size(v.size),
            format_size(v.allocated_bytes),
            v.created.clone(),
            state_name(&v.clone_state).into(),
            origin(v),
            or_dash(v.export.as_ref().map(|e| e.uri.as_str())),
        ]);
    }
    t.render()
}

fn details(v: &Volume) -> String {
    fields(&[
        ("Name", v.name.clone()),
        (
            "Size",
            format!("{} ({} bytes)", format_size(v.size), v.size),
        ),
        ("Allocated", format_size(v.allocated_bytes)),
        ("Created", v.created.clone()),
        ("Parent snapshot", or_dash(v.parent_snapshot.as_deref())),
        ("Clone state", state_name(&v.clone_state).into()),
        ("Origin", origin(v)),
        (
            "Attached",
            or_dash(v.export.as_ref().map(|e| e.uri.as_str())),
        ),
        ("Operation", or_dash(v.operation.as_deref())),
    ])
}
