//! `lamina snapshot ...`

use crate::output::{self, fields, list_or_dash, or_dash, Format, Table};
use crate::Ctx;
use anyhow::Result;
use clap::Subcommand;
use lamina_api::{
    format_size, CreateSnapshot, CreateSnapshotGroup, PruneResult, PruneSnapshots, Snapshot,
    SnapshotGroup, Volume,
};
use serde::Serialize;

#[derive(Subcommand)]
pub enum SnapshotCmd {
    /// Take a snapshot of a volume (succeeds if it exists already).
    Create {
        /// The volume to snapshot.
        volume: String,
        /// Name of the new snapshot.
        name: String,
        /// A label KEY=VALUE (repeat for more).
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = label_arg)]
        labels: Vec<(String, String)>,
        /// Freeze the volume's filesystem where the CSI node plugin mounted it while the snapshot is taken (it then needs no journal replay).
        #[arg(long)]
        freeze: bool,
    },
    /// List a volume's snapshots, or every snapshot when no volume is given.
    List {
        /// Only this volume's snapshots.
        volume: Option<String>,
        /// Only the snapshots this schedule made (found by its id, so a renamed schedule's too).
        #[arg(long, value_name = "NAME")]
        schedule: Option<String>,
    },
    /// Show a snapshot, with the clones made from it.
    Get {
        /// The snapshot's volume.
        volume: String,
        /// The snapshot.
        name: String,
    },
    /// Delete a snapshot (succeeds if it does not exist; its clones keep their data), or, given filters instead of a name, every snapshot of the volume that matches them all, saying what goes, what stays and why, and exactly what it frees.
    Delete {
        /// The snapshot's volume.
        volume: String,
        /// The snapshot (leave it out to delete by filters).
        #[arg(required_unless_present_any = ["selector", "older_than", "schedule"])]
        name: Option<String>,
        /// Only snapshots with these labels, KEY=VALUE[,KEY=VALUE...].
        #[arg(long, value_name = "SELECTOR", conflicts_with = "name")]
        selector: Option<String>,
        /// Only snapshots older than this (7d, 12h; a scheduled snapshot's age counts from its slot).
        #[arg(long, value_name = "AGE", conflicts_with = "name")]
        older_than: Option<humantime::Duration>,
        /// Only snapshots this schedule made.
        #[arg(long, value_name = "NAME", conflicts_with = "name")]
        schedule: Option<String>,
        /// Show what would be deleted and what it would free; delete nothing.
        #[arg(long, conflicts_with = "name")]
        dry_run: bool,
    },
    /// Roll a volume back to a snapshot.
    Revert {
        /// The volume to roll back.
        volume: String,
        /// The snapshot to roll it back to.
        name: String,
    },
    /// Draw a volume's snapshot tree, with the live volume under its parent and the clones of each snapshot.
    Tree {
        /// The volume.
        volume: String,
    },
    /// Export a snapshot read-only over NBD and print its URI.
    Attach {
        /// The snapshot's volume.
        volume: String,
        /// The snapshot.
        name: String,
    },
    /// Stop exporting a snapshot (succeeds if it is not attached; refused while NBD clients are connected, unless --force).
    Detach {
        /// The snapshot's volume.
        volume: String,
        /// The snapshot.
        name: String,
        /// Detach even while NBD clients are connected: they are cut off and their I/O fails.
        #[arg(long)]
        force: bool,
    },
    /// Take a snapshot NAME of every VOLUME at one instant (crash-consistent across them); succeeds if that group exists already.
    CreateGroup {
        /// Name of the group, and of each volume's snapshot in it.
        name: String,
        /// The volumes, at least one.
        #[arg(required = true, value_name = "VOLUME")]
        volumes: Vec<String>,
        /// A label KEY=VALUE every member carries (repeat for more).
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = label_arg)]
        labels: Vec<(String, String)>,
        /// Freeze every member's filesystem where the CSI node plugin mounted it while the group is taken.
        #[arg(long)]
        freeze: bool,
    },
    /// Show a group snapshot: its members, one per volume.
    GetGroup {
        /// The group.
        name: String,
    },
    /// Delete every snapshot of a group (succeeds if there is none; refused while a member is attached).
    DeleteGroup {
        /// The group.
        name: String,
    },
}

pub fn label_arg(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

/// `snapshot tree` as a document: the volume and its snapshots.
#[derive(Serialize)]
struct TreeDoc {
    volume: Volume,
    snapshots: Vec<Snapshot>,
}

pub async fn run(ctx: &Ctx, cmd: SnapshotCmd) -> Result<()> {
    let c = &ctx.client;
    match cmd {
        SnapshotCmd::Create {
            volume,
            name,
            labels,
            freeze,
        } => {
            let req = CreateSnapshot {
                name,
                labels: labels.into_iter().collect(),
                freeze,
            };
            let r = c.create_snapshot(&volume, &req).await?;
            output::show(ctx.fmt, &r.value, |s| {
                if r.created {
                    format!("created snapshot {}/{}", s.volume, s.name)
                } else {
                    format!("snapshot {}/{} exists already", s.volume, s.name)
                }
            })
        }
        SnapshotCmd::List { volume, schedule } => {
            let snaps = match (&volume, schedule) {
                (v, Some(schedule)) => {
                    let filter = lamina_api::SnapshotFilter {
                        schedule: Some(schedule),
                        ..Default::default()
                    };
                    let all = c.find_snapshots(&filter).await?;
                    all.into_iter()
                        .filter(|s| v.as_ref().is_none_or(|v| *v == s.volume))
                        .collect()
                }
                (Some(v), None) => c.list_snapshots(v).await?,
                (None, None) => c.list_all_snapshots().await?,
            };
            output::show(ctx.fmt, &snaps, |s| list_table(s))
        }
        SnapshotCmd::Get { volume, name } => {
            let s = c.get_snapshot(&volume, &name).await?;
            output::show(ctx.fmt, &s, details)
        }
        SnapshotCmd::Delete {
            volume,
            name: None,
            selector,
            older_than,
            schedule,
            dry_run,
        } => {
            let req = PruneSnapshots {
                selector,
                older_than_seconds: older_than.map(|d| d.as_secs()),
                schedule,
                dry_run,
            };
            let r = c.prune_snapshots(&volume, &req).await?;
            output::show(ctx.fmt, &r, pruned)
        }
        SnapshotCmd::Delete {
            volume,
            name: Some(name),
            ..
        } => {
            // Which clones came from it, to say that they keep their data
            // (none known if it cannot be read: the delete says why).
            let clones = match c.get_snapshot(&volume, &name).await {
                Ok(s) => s.clones,
                Err(_) => vec![],
            };
            let r = c.delete_snapshot(&volume, &name).await?;
            output::show(ctx.fmt, &r, |r| {
                if r.existed {
                    format!("deleted snapshot {volume}/{name}")
                } else {
                    format!("snapshot {volume}/{name} does not exist: nothing to delete")
                }
            })?;
            if r.existed && !clones.is_empty() {
                output::note(
                    ctx.fmt,
                    &format!("its clones keep their data: {}", clones.join(", ")),
                );
            }
            Ok(())
        }
        SnapshotCmd::Revert { volume, name } => {
            let v = c.revert_snapshot(&volume, &name).await?;
            output::show(ctx.fmt, &v, |v| {
                format!(
                    "reverted volume {} to snapshot {name} ({})",
                    v.name,
                    format_size(v.size)
                )
            })
        }
        SnapshotCmd::Tree { volume } => {
            let doc = TreeDoc {
                volume: c.get_volume(&volume).await?,
                snapshots: c.list_snapshots(&volume).await?,
            };
            match ctx.fmt {
                Format::Table => {
                    crate::output::out!("{}", crate::tree::render(&doc.volume, &doc.snapshots));
                    Ok(())
                }
                f => output::document(f, &doc),
            }
        }
        SnapshotCmd::Attach { volume, name } => {
            let e = c.attach_snapshot(&volume, &name).await?;
            output::show(ctx.fmt, &e, |e| e.uri.clone())
        }
        SnapshotCmd::CreateGroup {
            name,
            volumes,
            labels,
            freeze,
        } => {
            let req = CreateSnapshotGroup {
                name,
                volumes,
                labels: labels.into_iter().collect(),
                freeze,
            };
            let r = c.create_snapshot_group(&req).await?;
            output::show(ctx.fmt, &r.value, |g| {
                let head = if r.created {
                    format!("created group snapshot {} of {}", g.name, members(g))
                } else {
                    format!("group snapshot {} of {} exists already", g.name, members(g))
                };
                format!("{head}\n{}", list_table(&g.snapshots))
            })
        }
        SnapshotCmd::GetGroup { name } => {
            let g = c.get_snapshot_group(&name).await?;
            output::show(ctx.fmt, &g, |g| {
                format!(
                    "{}{}",
                    fields(&[
                        ("Group", g.name.clone()),
                        ("Created", g.created.clone()),
                        ("Volumes", members(g)),
                    ]),
                    list_table(&g.snapshots)
                )
            })
        }
        SnapshotCmd::DeleteGroup { name } => {
            let r = c.delete_snapshot_group(&name).await?;
            output::show(ctx.fmt, &r, |r| {
                if r.existed {
                    format!("deleted group snapshot {name}")
                } else {
                    format!("group snapshot {name} does not exist: nothing to delete")
                }
            })
        }
        SnapshotCmd::Detach {
            volume,
            name,
            force,
        } => {
            let r = c.detach_snapshot(&volume, &name, force).await?;
            output::show(ctx.fmt, &r, |r| {
                if r.existed {
                    format!("detached snapshot {volume}/{name}")
                } else {
                    format!("snapshot {volume}/{name} was not attached: nothing to detach")
                }
            })
        }
    }
}

/// What a prune did or would do.
fn pruned(r: &PruneResult) -> String {
    let n = r.deleted.len();
    let mut out = match (r.dry_run, n) {
        (true, 0) => format!("no snapshot of {} would be deleted\n", r.volume),
        (false, 0) => format!("no snapshot of {} deleted\n", r.volume),
        (true, _) => format!(
            "would delete {n} snapshot(s) of {}, freeing {} (dry run: nothing deleted)\n",
            r.volume,
            format_size(r.freed_bytes)
        ),
        (false, _) => format!(
            "deleted {n} snapshot(s) of {}, freeing {}\n",
            r.volume,
            format_size(r.freed_bytes)
        ),
    };
    if n > 0 {
        let mut t = Table::new(&["NAME", "CREATED", "EXCLUSIVE"]);
        for s in &r.deleted {
            t.row(vec![
                s.name.clone(),
                s.created.clone(),
                format_size(s.exclusive_bytes),
            ]);
        }
        out.push_str(&t.render());
    }
    if !r.kept.is_empty() {
        out.push_str(&format!("kept {} that matched:\n", r.kept.len()));
        for k in &r.kept {
            out.push_str(&format!("  {}: {}\n", k.snapshot, k.reason));
        }
    }
    out
}

/// A group's volumes, comma-separated.
fn members(g: &SnapshotGroup) -> String {
    let v: Vec<&str> = g.snapshots.iter().map(|s| s.volume.as_str()).collect();
    v.join(", ")
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
        "SHARED",
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
        if !s.clones.is_empty() {
            flags.push("cloned");
        }
        t.row(vec![
            s.volume.clone(),
            s.name.clone(),
            s.created.clone(),
            or_dash(s.parent.as_deref()),
            format_size(s.restore_size),
            format_size(s.exclusive_bytes),
            format_size(s.shared_bytes),
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
        ("Children", list_or_dash(&s.children)),
        ("Clones", list_or_dash(&s.clones)),
        ("System", if s.system { "yes" } else { "no" }.into()),
        ("Labels", labels(s)),
        ("Restore size", format_size(s.restore_size)),
        ("Allocated", format_size(s.allocated_bytes)),
        (
            "Exclusive",
            format!(
                "{} (what deleting it frees)",
                format_size(s.exclusive_bytes)
            ),
        ),
        ("Shared", format_size(s.shared_bytes)),
        (
            "Attached",
            or_dash(s.export.as_ref().map(|e| e.uri.as_str())),
        ),
    ])
}
