//! `lamina volume ...`

use crate::output::{self, fields, or_dash, Table};
use crate::Ctx;
use anyhow::Result;
use clap::Subcommand;
use lamina_api::{format_size, CloneState, CreateVolume, ExpandVolume, Removed, Volume};

#[derive(Subcommand)]
pub enum VolumeCmd {
    /// Create a thin volume (succeeds if one exists with the same name and size).
    Create {
        /// Name of the new volume.
        name: String,
        /// Size: bytes, or a number with K, M, G, T, P or E; every unit is a power of 1024, in any case, with an optional i and B (10G = 10g = 10GiB = 10gb).
        #[arg(long, value_parser = volume_size, allow_negative_numbers = true)]
        size: u64,
        /// A label KEY=VALUE (repeat for more); schedules select volumes by them.
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = crate::cmd_snapshot::label_arg)]
        labels: Vec<(String, String)>,
        /// Replicas, each on a node of its own: this node's and N-1 on other nodes (1 to 3). The others are the --replica-node ones, or else the first N-1 of the node list (`lamina node list`).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..=3), default_value_t = 1)]
        replicas: u8,
        /// A node (by name in the node list) to hold one of the other replicas (repeat for each).
        #[arg(long = "replica-node", value_name = "NODE")]
        replica_nodes: Vec<String>,
    },
    /// List the volumes.
    List {
        /// Only those whose labels match KEY=VALUE[,KEY=VALUE...] (all must hold).
        #[arg(long, value_name = "SELECTOR")]
        selector: Option<lamina_api::LabelSelector>,
    },
    /// Set or remove a volume's labels: KEY=VALUE sets, KEY- removes; the others stay.
    Label {
        /// The volume.
        name: String,
        /// KEY=VALUE to set, KEY- to remove.
        #[arg(required = true, value_name = "KEY=VALUE|KEY-")]
        changes: Vec<String>,
    },
    /// Show a volume: size, space, clone origin and state, NBD clients.
    Get {
        /// The volume.
        name: String,
    },
    /// Grow a volume (shrinking is not supported).
    Expand {
        /// The volume.
        name: String,
        /// The new size, e.g. 20G (units as for `volume create`).
        #[arg(long, value_parser = volume_size, allow_negative_numbers = true)]
        size: u64,
    },
    /// Delete a volume (succeeds if it does not exist). Its snapshots stay,
    /// usable, under the volume's old name and id (`NAME@ID` names them
    /// once the name is taken again), and clones made from them keep their
    /// data; its name is free at once. A replicated volume's replicas on
    /// other nodes are deleted first, each node asked first whether it can:
    /// one that cannot (down, say) fails the delete, and nothing is deleted.
    Delete {
        /// The volume.
        name: String,
        /// Delete its snapshots with it.
        #[arg(long)]
        with_snapshots: bool,
    },
    /// Export a volume over NBD and print its URI (with --file, the file).
    Attach {
        /// The volume.
        name: String,
        /// Also serve it as a file on the daemon's host (for a loop device), and print the file's path.
        #[arg(long)]
        file: bool,
        /// This node holds a healthy replica of a replicated volume whose front end's node is lost: take the volume over (its front end here, at the next generation; the old one refused by every replica), then attach it.
        #[arg(long, conflicts_with = "file")]
        take_over: bool,
    },
    /// Stop exporting a volume (refused while NBD clients are connected, unless --force).
    Detach {
        /// The volume.
        name: String,
        /// Detach even while NBD clients are connected: they are cut off and their I/O fails.
        #[arg(long)]
        force: bool,
    },
    /// Make a linked clone independent of its origin (copies the shared blocks in the background).
    Flatten {
        /// The linked clone.
        name: String,
        /// Wait until the clone is independent.
        #[arg(long)]
        wait: bool,
    },
}

/// A `--size`: the size syntax, then the range a volume may have, said
/// in sizes people read.
pub fn volume_size(s: &str) -> Result<u64, String> {
    let n = lamina_api::parse_size(s)?;
    let max = lamina_engine::MAX_VOLUME_SIZE;
    if n == 0 {
        return Err(format!(
            "a volume size must be between 1 byte and {}",
            format_size(max)
        ));
    }
    if n > max {
        return Err(format!(
            "a volume size must be between 1 byte and {} ({s:?} is {})",
            format_size(max),
            format_size(n)
        ));
    }
    Ok(n)
}

pub async fn run(ctx: &Ctx, cmd: VolumeCmd) -> Result<()> {
    let c = &ctx.client;
    match cmd {
        VolumeCmd::Create {
            name,
            size,
            labels,
            replicas,
            replica_nodes,
        } => {
            let others = usize::from(replicas) - 1;
            let replicas = match replica_nodes.len() {
                0 if others > 0 => {
                    let nodes = c.list_nodes().await?;
                    if nodes.len() < others {
                        anyhow::bail!(
                            "{} replicas need {others} other nodes, and the node list has {}: add them with `lamina node add NAME HOST:PORT`",
                            others + 1,
                            nodes.len()
                        );
                    }
                    nodes.into_iter().take(others).map(|n| n.name).collect()
                }
                n if n == others => replica_nodes,
                n => anyhow::bail!(
                    "--replicas {} is this node and {others} other, and --replica-node names {n}",
                    others + 1
                ),
            };
            let r = c
                .create_volume(&CreateVolume {
                    name,
                    size,
                    labels: labels.into_iter().collect(),
                    replicas,
                })
                .await?;
            output::show(ctx.fmt, &r.value, |v| {
                if r.created {
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
        VolumeCmd::List { selector } => {
            let vols = match selector {
                Some(s) => {
                    let filter = lamina_api::VolumeFilter {
                        selector: Some(s.to_string()),
                    };
                    c.find_volumes(&filter).await?
                }
                None => c.list_volumes().await?,
            };
            output::show(ctx.fmt, &vols, |v| list_table(v))
        }
        VolumeCmd::Label { name, changes } => {
            let mut labels = c.get_volume(&name).await?.labels;
            for ch in &changes {
                if let Some(k) = ch.strip_suffix('-').filter(|k| !k.contains('=')) {
                    labels.remove(k);
                } else {
                    let (k, v) = crate::cmd_snapshot::label_arg(ch).map_err(anyhow::Error::msg)?;
                    labels.insert(k, v);
                }
            }
            let v = c.set_volume_labels(&name, &labels).await?;
            output::show(ctx.fmt, &v, |v| {
                format!("volume {} labels: {}", v.name, label_list(v))
            })
        }
        VolumeCmd::Get { name } => {
            let v = c.get_volume(&name).await?;
            // A volume being copied into says how far the copy is.
            let copy = match (&v.clone_state, &v.operation) {
                (CloneState::Copying, Some(id)) => c.get_operation(id).await.ok(),
                _ => None,
            };
            output::show(ctx.fmt, &v, |v| {
                let mut out = details(v);
                if let Some(o) = &copy {
                    out.push_str(&copy_line(o));
                }
                out
            })
        }
        VolumeCmd::Expand { name, size } => {
            let v = c.expand_volume(&name, &ExpandVolume { size }).await?;
            output::show(ctx.fmt, &v, |v| {
                format!("volume {} is now {}", v.name, format_size(v.size))
            })?;
            if let Some(n) = v.export.as_ref().map(|e| e.connections).filter(|n| *n > 0) {
                output::note(
                    ctx.fmt,
                    &format!(
                        "{} connected to it keep the size they saw until they reconnect",
                        clients(n)
                    ),
                );
            }
            Ok(())
        }
        VolumeCmd::Delete {
            name,
            with_snapshots,
        } => {
            let r = c.delete_volume(&name, with_snapshots).await?;
            output::show(ctx.fmt, &r, |r| match (r.existed, with_snapshots) {
                (true, true) => format!("deleted volume {name} and its snapshots"),
                (true, false) => format!(
                    "deleted volume {name} (snapshots of it stay: lamina snapshot list {name})"
                ),
                (false, _) => format!("volume {name} does not exist: nothing to delete"),
            })
        }
        VolumeCmd::Attach {
            name,
            file: false,
            take_over: true,
        } => {
            let e = c.take_over_volume(&name).await?;
            output::show(ctx.fmt, &e, |e| e.uri.clone())
        }
        VolumeCmd::Attach {
            name, file: false, ..
        } => {
            let e = c.attach_volume(&name).await?;
            output::show(ctx.fmt, &e, |e| e.uri.clone())
        }
        VolumeCmd::Attach {
            name, file: true, ..
        } => {
            let e = c.attach_volume_file(&name).await?;
            output::show(ctx.fmt, &e, |e| e.file.clone().unwrap_or_default())
        }
        VolumeCmd::Detach { name, force } => {
            let r = c.detach_volume(&name, force).await?;
            output::show(ctx.fmt, &r, |r: &Removed| {
                if r.existed {
                    format!("detached volume {name}")
                } else {
                    format!("volume {name} was not attached: nothing to detach")
                }
            })
        }
        VolumeCmd::Flatten { name, wait } => {
            let mut v = c.flatten_volume(&name).await?;
            if wait {
                v = crate::cmd_operation::wait_flatten(ctx, &name, v.operation.as_deref()).await?;
            }
            output::show(ctx.fmt, &v, |v| {
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

/// The state of a copy into a volume, as the seeds name it (`initiated`),
/// with its progress, rate and time left.
fn copy_line(o: &lamina_api::Operation) -> String {
    let pct = (o.done_bytes * 100)
        .checked_div(o.total_bytes)
        .map_or(String::new(), |p| format!(" ({p}%)"));
    let mut s = format!(
        "\nCopy: initiated, {} of {}{pct}",
        format_size(o.done_bytes),
        format_size(o.total_bytes)
    );
    if let Some(r) = o.rate_bytes_per_sec {
        s.push_str(&format!(", {}/s", format_size(r)));
    }
    if let Some(e) = o.eta_seconds {
        s.push_str(&format!(", about {e} s left"));
    }
    if let Some(src) = &o.source {
        s.push_str(&format!(", from {src}"));
    }
    s.push_str(&format!(" (operation {})", o.id));
    s
}

/// `1 NBD client`, `2 NBD clients`.
fn clients(n: u32) -> String {
    if n == 1 {
        "1 NBD client".into()
    } else {
        format!("{n} NBD clients")
    }
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
        "LABELS",
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
            label_list(v),
        ]);
    }
    t.render()
}

fn label_list(v: &Volume) -> String {
    if v.labels.is_empty() {
        return "-".into();
    }
    v.labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn details(v: &Volume) -> String {
    fields(&[
        ("Name", v.name.clone()),
        (
            "Size",
            format!("{} ({} bytes)", format_size(v.size), v.size),
        ),
        ("Allocated", format_size(v.allocated_bytes)),
        (
            "Exclusive",
            format!(
                "{} (held by the live volume only)",
                format_size(v.exclusive_bytes)
            ),
        ),
        (
            "Shared",
            format!(
                "{} (with its snapshots or clone origin)",
                format_size(v.shared_bytes)
            ),
        ),
        ("Created", or_dash(Some(&v.created))),
        ("Labels", label_list(v)),
        ("Parent snapshot", or_dash(v.parent_snapshot.as_deref())),
        ("Clone state", state_name(&v.clone_state).into()),
        ("Origin", origin(v)),
        (
            "Attached",
            or_dash(v.export.as_ref().map(|e| e.uri.as_str())),
        ),
        (
            "NBD clients",
            v.export
                .as_ref()
                .map_or("-".into(), |e| format!("{} connected", e.connections)),
        ),
        (
            "File",
            or_dash(v.export.as_ref().and_then(|e| e.file.as_deref())),
        ),
        ("Operation", or_dash(v.operation.as_deref())),
    ]) + &replication(v)
}

/// A replicated volume's generation and replicas, one line each.
pub(crate) fn replication(v: &Volume) -> String {
    let Some(r) = &v.replication else {
        return String::new();
    };
    let state = match r.state {
        lamina_api::ReplicationState::Healthy => "healthy",
        lamina_api::ReplicationState::Degraded => "degraded",
        lamina_api::ReplicationState::Unavailable => "unavailable",
    };
    let front = if r.diskless {
        ", its front end here holds no replica"
    } else {
        ""
    };
    let mut out = fields(&[(
        "Replication",
        format!("{state}, generation {}{front}", r.generation),
    )]);
    let mut t = Table::new(&["REPLICA NODE", "ADDRESS", "STATE", "SINCE", "REASON"]);
    for x in &r.replicas {
        t.row(vec![
            x.node.clone(),
            x.address.clone().unwrap_or_else(|| "(this node)".into()),
            match (x.state, &x.rebuild) {
                (lamina_api::ReplicaState::Healthy, _) => "healthy".into(),
                (lamina_api::ReplicaState::Rebuilding, Some(b)) => format!(
                    "rebuilding {}/{} ({}/s{})",
                    lamina_api::format_size(b.round_sent_bytes),
                    lamina_api::format_size(b.round_bytes),
                    lamina_api::format_size(b.rate_bytes_per_second),
                    b.eta_seconds
                        .map(|s| format!(", {s} s left"))
                        .unwrap_or_default()
                ),
                (lamina_api::ReplicaState::Rebuilding, None) => "rebuilding".into(),
                (lamina_api::ReplicaState::Faulted, _) => "faulted".into(),
            },
            x.since.clone(),
            or_dash(x.reason.as_deref()),
        ]);
    }
    out.push_str(&t.render());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_out_of_range_are_said_plainly() {
        assert_eq!(volume_size("10g"), Ok(10 << 30));
        let e = volume_size("0").unwrap_err();
        assert_eq!(e, "a volume size must be between 1 byte and 64.0 PiB");
        let e = volume_size("65P").unwrap_err();
        assert!(e.contains("64.0 PiB") && e.contains("65.0 PiB"), "{e}");
        assert!(!e.contains("72057594037927936"), "{e}");
        let e = volume_size("-1").unwrap_err();
        assert!(e.contains("cannot be negative"), "{e}");
    }
}
