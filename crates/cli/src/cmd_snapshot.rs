//! `lamina snapshot ...`

use crate::cmd_volume::done;
use crate::output::{self, fields, or_dash, Format, Table};
use crate::Ctx;
use anyhow::Result;
use clap::Subcommand;
use hyper::StatusCode;
use lamina_api::{format_size, Export, Snapshot, Volume};
use lamina_cli::client::seg;
use serde_json::json;
use std::collections::BTreeMap;

#[derive(Subcommand)]
pub enum SnapshotCmd {
    /// Take a snapshot of a volume (succeeds if it exists already).
    Create {
        volume: String,
        name: String,
        /// A label KEY=VALUE (repeat for more).
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = label_arg)]
        labels: Vec<(String, String)>,
    },
    /// List a volume's snapshots, or every snapshot when no volume is given.
    List { volume: Option<String> },
    /// Show a snapshot.
    Get { volume: String, name: String },
    /// Delete a snapshot.
    Delete { volume: String, name: String },
    /// Roll a volume back to a snapshot.
    Revert { volume: String, name: String },
    /// Draw a volume's snapshot tree, with the live volume under its parent.
    Tree { volume: String },
    /// Export a snapshot read-only over NBD and print its URI.
    Attach { volume: String, name: String },
    /// Stop exporting a snapshot.
    Detach { volume: String, name: String },
}

fn label_arg(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

pub async fn run(ctx: &Ctx, cmd: SnapshotCmd) -> Result<()> {
    let c = &ctx.client;
    let path = |v: &str, s: &str| format!("/v1/volumes/{}/snapshots/{}", seg(v), seg(s));
    match cmd {
        SnapshotCmd::Create {
            volume,
            name,
            labels,
        } => {
            let labels: BTreeMap<String, String> = labels.into_iter().collect();
            let url = format!("/v1/volumes/{}/snapshots", seg(&volume));
            let a = c
                .post(&url, Some(json!({"name": name, "labels": labels})))
                .await?;
            output::show(ctx.fmt, &a.body, |s: &Snapshot| {
                if a.status == StatusCode::CREATED {
                    format!("created snapshot {}/{}", s.volume, s.name)
                } else {
                    format!("snapshot {}/{} exists already", s.volume, s.name)
                }
            })
        }
        SnapshotCmd::List { volume } => {
            let url = match &volume {
                Some(v) => format!("/v1/volumes/{}/snapshots", seg(v)),
                None => "/v1/snapshots".to_string(),
            };
            let v = c.get(&url).await?;
            output::show(ctx.fmt, &v, |s: &Vec<Snapshot>| list_table(s))
        }
        SnapshotCmd::Get { volume, name } => {
            let v = c.get(&path(&volume, &name)).await?;
            output::show(ctx.fmt, &v, details)
        }
        SnapshotCmd::Delete { volume, name } => {
            let a = c.delete(&path(&volume, &name)).await?;
            done(ctx.fmt, &a.body, || {
                format!("deleted snapshot {volume}/{name}")
            })
        }
        SnapshotCmd::Revert { volume, name } => {
            let a = c
                .post(&format!("{}/revert", path(&volume, &name)), None)
                .await?;
            output::show(ctx.fmt, &a.body, |v: &Volume| {
                format!(
                    "reverted volume {} to snapshot {name} ({})",
                    v.name,
                    format_size(v.size)
                )
            })
        }
        SnapshotCmd::Tree { volume } => {
            let vol = c.get(&format!("/v1/volumes/{}", seg(&volume))).await?;
            let snaps = c
                .get(&format!("/v1/volumes/{}/snapshots", seg(&volume)))
                .await?;
            match ctx.fmt {
                Format::Table => {
                    let (v, s): (Volume, Vec<Snapshot>) =
                        (output::parse(&vol)?, output::parse(&snaps)?);
                    print!("{}", crate::tree::render(&v, &s));
                    Ok(())
                }
                f => output::print_raw(f, &json!({"volume": vol, "snapshots": snaps})),
            }
        }
        SnapshotCmd::Attach { volume, name } => {
            let a = c
                .post(&format!("{}/attach", path(&volume, &name)), None)
                .await?;
            output::show(ctx.fmt, &a.body, |e: &Export| e.uri.clone())
        }
        SnapshotCmd::Detach { volume, name } => {
            let a = c
                .post(&format!("{}/detach", path(&volume, &name)), None)
                .await?;
            done(ctx.fmt, &a.body, || {
                format!("detached snapshot {volume}/{name}")
            })
        }
    }
}

fn labels(s: &Snapshot) -> String {
    let l: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if l.is_empty() {
        "-".into()
    } else {
        l.join(",")
    }
}

fn list_table(snaps: &[Snapshot]) -> String {
    let mut t = Table::new(&[
        "VOLUME",
        "NAME",
        "CREATED",
        "PARENT",
        "RESTORE SIZE",
        "EXCLUSIVE",
        "LABELS",
        "FLAGS",
    ]);
    for s in snaps {
        let mut flags = vec![];
        if s.system {
            flags.push("system");
        }
        if s.export.is_some() {
            flags.push("attached");
        }
        t.row(vec![
            s.volume.clone(),
            s.name.clone(),
            s.created.clone(),
            or_dash(s.parent.as_deref()),
            format_size(s.restore_size),
            format_size(s.exclusive_bytes),
            labels(s),
            if flags.is_empty() {
                "-".into()
            } else {
                flags.join(",")
            },
        ]);
    }
    t.render()
}

fn details(s: &Snapshot) -> String {
    fields(&[
        ("Volume", s.volume.clone()),
        ("Name", s.name.clone()),
        ("Created", s.created.clone()),
        ("Parent", or_dash(s.parent.as_deref())),
        (
            "Children",
            if s.children.is_empty() {
                "-".into()
            } else {
                s.children.join(", ")
            },
        ),
        ("System", if s.system { "yes" } else { "no" }.into()),
        ("Labels", labels(s)),
        ("Restore size", format_size(s.restore_size)),
        ("Allocated", format_size(s.allocated_bytes)),
        ("Exclusive", format_size(s.exclusive_bytes)),
        (
            "Attached",
            or_dash(s.export.as_ref().map(|e| e.uri.as_str())),
        ),
    ])
}
