//! `lamina schedule ...`: snapshots of volumes on a cron expression, with
//! retention.

use crate::output::{self, fields, list_or_dash, or_dash, Table};
use crate::Ctx;
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use lamina_api::{LabelSelector, Schedule, ScheduleRun, ScheduleSpec, SnapshotsAction};
use std::collections::BTreeMap;

#[derive(Subcommand)]
pub enum ScheduleCmd {
    /// Create a schedule (succeeds if it exists with the same spec).
    Create {
        /// Its name (its snapshots are named NAME-YYYYMMDD-HHMM, the slot in UTC).
        name: String,
        #[command(flatten)]
        spec: SpecArgs,
    },
    /// List schedules with their next run and retention.
    List,
    /// Show a schedule: next runs, each volume's state and last run, recent runs.
    Get {
        /// The schedule.
        name: String,
    },
    /// Change a schedule: the options given replace what they name (its snapshots stay its own, also when renamed).
    Update {
        /// The schedule.
        name: String,
        /// Rename it.
        #[arg(long = "rename", value_name = "NEW")]
        rename: Option<String>,
        #[command(flatten)]
        spec: SpecArgs,
        /// Drop the keep-last rule.
        #[arg(long, conflicts_with = "keep")]
        no_keep: bool,
        /// Drop the keep-for rule.
        #[arg(long, conflicts_with = "keep_for")]
        no_keep_for: bool,
    },
    /// Delete a schedule, saying what happens to its snapshots.
    Delete {
        /// The schedule.
        name: String,
        /// Keep its snapshots (as manual ones: no retention applies to them any more).
        #[arg(long, conflicts_with = "delete_snapshots")]
        keep_snapshots: bool,
        /// Delete its snapshots (those a clone depends on, or attached, stay and are listed).
        #[arg(long)]
        delete_snapshots: bool,
    },
}

/// The parts of a schedule's spec, as options.
#[derive(Args)]
pub struct SpecArgs {
    /// Cron expression, five fields: minute hour day-of-month month day-of-week (e.g. "0 * * * *": hourly).
    #[arg(long, value_name = "EXPR")]
    cron: Option<String>,
    /// IANA time zone the expression is read in [default: UTC].
    #[arg(long, value_name = "ZONE")]
    time_zone: Option<String>,
    /// Keep the newest N of its snapshots of each volume.
    #[arg(long, value_name = "N")]
    keep: Option<u32>,
    /// Keep its snapshots younger than this (e.g. 7d, 12h). With --keep, a snapshot stays if either keeps it.
    #[arg(long, value_name = "DURATION")]
    keep_for: Option<humantime::Duration>,
    /// A volume it covers (repeat for more).
    #[arg(long = "volume", value_name = "VOLUME")]
    volumes: Vec<String>,
    /// Volumes it covers by label: KEY=VALUE[,KEY=VALUE...], all of which must hold.
    #[arg(long, value_name = "SELECTOR")]
    selector: Option<LabelSelector>,
    /// A label its snapshots carry, KEY=VALUE (repeat for more).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = crate::cmd_snapshot::label_arg)]
    labels: Vec<(String, String)>,
    /// How long after its slot a failed run is retried [default: 10min].
    #[arg(long, value_name = "DURATION")]
    retry_window: Option<humantime::Duration>,
}

impl SpecArgs {
    fn into_new(self, name: String) -> Result<ScheduleSpec> {
        let Some(cron) = self.cron else {
            bail!("a schedule needs --cron (e.g. --cron '0 * * * *' for every hour)");
        };
        Ok(ScheduleSpec {
            name,
            cron,
            time_zone: self.time_zone.unwrap_or_else(|| "UTC".into()),
            keep_last: self.keep,
            keep_for_seconds: self.keep_for.map(|d| d.as_secs()),
            labels: self.labels.into_iter().collect(),
            volumes: self.volumes,
            selector: self.selector,
            retry_window_seconds: self.retry_window.map(|d| d.as_secs()),
        })
    }

    fn apply_to(self, s: &mut ScheduleSpec) {
        if let Some(c) = self.cron {
            s.cron = c;
        }
        if let Some(z) = self.time_zone {
            s.time_zone = z;
        }
        if let Some(k) = self.keep {
            s.keep_last = Some(k);
        }
        if let Some(d) = self.keep_for {
            s.keep_for_seconds = Some(d.as_secs());
        }
        if !self.volumes.is_empty() {
            s.volumes = self.volumes;
        }
        if let Some(sel) = self.selector {
            s.selector = Some(sel).filter(|x| !x.is_empty());
        }
        if !self.labels.is_empty() {
            s.labels = self.labels.into_iter().collect::<BTreeMap<_, _>>();
        }
        if let Some(d) = self.retry_window {
            s.retry_window_seconds = Some(d.as_secs());
        }
    }
}

pub async fn run(ctx: &Ctx, cmd: ScheduleCmd) -> Result<()> {
    let c = &ctx.client;
    match cmd {
        ScheduleCmd::Create { name, spec } => {
            let spec = spec.into_new(name)?;
            let r = c.create_schedule(&spec).await?;
            output::show(ctx.fmt, &r.value, |s| {
                let head = if r.created {
                    format!("created schedule {} ({})", s.spec.name, s.id)
                } else {
                    format!("schedule {} exists already ({})", s.spec.name, s.id)
                };
                format!("{head}\nnext runs: {}", list_or_dash(&s.next_runs))
            })
        }
        ScheduleCmd::List => {
            let all = c.list_schedules().await?;
            output::show(ctx.fmt, &all, |all| {
                let mut t = Table::new(&[
                    "NAME",
                    "ID",
                    "CRON",
                    "ZONE",
                    "RETENTION",
                    "VOLUMES",
                    "NEXT RUN",
                ]);
                for s in all {
                    t.row(vec![
                        s.spec.name.clone(),
                        s.id.clone(),
                        s.spec.cron.clone(),
                        s.spec.time_zone.clone(),
                        retention(&s.spec),
                        s.volumes.len().to_string(),
                        or_dash(s.next_runs.first().map(String::as_str)),
                    ]);
                }
                t.render()
            })
        }
        ScheduleCmd::Get { name } => {
            let s = c.get_schedule(&name).await?;
            output::show(ctx.fmt, &s, details)
        }
        ScheduleCmd::Update {
            name,
            rename,
            spec,
            no_keep,
            no_keep_for,
        } => {
            let mut s = c.get_schedule(&name).await?.spec;
            spec.apply_to(&mut s);
            if no_keep {
                s.keep_last = None;
            }
            if no_keep_for {
                s.keep_for_seconds = None;
            }
            if let Some(n) = rename {
                s.name = n;
            }
            let s = c.update_schedule(&name, &s).await?;
            output::show(ctx.fmt, &s, |s| {
                format!(
                    "updated schedule {} ({}): {} {}, {}",
                    s.spec.name,
                    s.id,
                    s.spec.cron,
                    s.spec.time_zone,
                    retention(&s.spec)
                )
            })
        }
        ScheduleCmd::Delete {
            name,
            keep_snapshots,
            delete_snapshots,
        } => {
            if !keep_snapshots && !delete_snapshots {
                // The daemon refuses too; asking here first says how many.
                let count: u64 = match c.get_schedule(&name).await {
                    Ok(s) => s.volumes.iter().map(|v| v.snapshots).sum(),
                    Err(_) => 0,
                };
                bail!(
                    "say what happens to schedule {name}'s snapshots ({count} on the volumes it covers now): --keep-snapshots or --delete-snapshots"
                );
            }
            let action = if keep_snapshots {
                SnapshotsAction::Keep
            } else {
                SnapshotsAction::Delete
            };
            let r = c.delete_schedule(&name, action).await?;
            output::show(ctx.fmt, &r, |r| {
                if !r.existed {
                    return format!("schedule {name} does not exist: nothing to delete");
                }
                let mut out = format!(
                    "deleted schedule {name}: {} snapshots deleted, {} kept",
                    r.deleted.len(),
                    r.kept.len()
                );
                if action == SnapshotsAction::Delete {
                    for k in &r.kept {
                        out.push_str(&format!("\n  kept {}: {}", k.snapshot, k.reason));
                    }
                }
                out
            })
        }
    }
}

fn retention(s: &ScheduleSpec) -> String {
    let secs = |n: u64| humantime::format_duration(std::time::Duration::from_secs(n)).to_string();
    match (s.keep_last, s.keep_for_seconds) {
        (Some(n), Some(d)) => format!("keep {n} or {}", secs(d)),
        (Some(n), None) => format!("keep {n}"),
        (None, Some(d)) => format!("keep {}", secs(d)),
        (None, None) => "-".into(),
    }
}

fn run_line(r: &ScheduleRun) -> Vec<String> {
    let mut what = format!("{:?}", r.outcome).to_lowercase();
    if r.catch_up {
        what.push_str(" (catch-up)");
    }
    let mut note = r.error.clone().unwrap_or_default();
    if !r.deleted.is_empty() {
        note = format!("retention deleted {}", r.deleted.join(", "));
    }
    for k in &r.kept {
        note.push_str(&format!("; kept {}: {}", k.snapshot, k.reason));
    }
    vec![
        r.time.clone(),
        r.volume.clone(),
        or_dash(r.snapshot.as_deref()),
        what,
        or_dash(Some(note.trim_start_matches("; "))),
    ]
}

fn details(s: &Schedule) -> String {
    let sel = s.spec.selector.as_ref().map(|x| x.to_string());
    let mut out = fields(&[
        ("Name", s.spec.name.clone()),
        ("Id", s.id.clone()),
        ("Cron", format!("{} ({})", s.spec.cron, s.spec.time_zone)),
        ("Retention", retention(&s.spec)),
        ("Volumes", list_or_dash(&s.spec.volumes)),
        ("Selector", or_dash(sel.as_deref())),
        (
            "Labels",
            list_or_dash(
                &s.spec
                    .labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>(),
            ),
        ),
        ("Created", s.created.clone()),
        ("Next runs", list_or_dash(&s.next_runs)),
    ]);
    let mut t = Table::new(&["VOLUME", "STATE", "LAST SLOT", "SNAPSHOTS", "LAST OUTCOME"]);
    for v in &s.volumes {
        t.row(vec![
            v.volume.clone(),
            v.state.clone(),
            or_dash(v.last_slot.as_deref()),
            v.snapshots.to_string(),
            v.last_run
                .as_ref()
                .map(|r| run_line(r)[3].clone())
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    out.push('\n');
    out.push_str(&t.render());
    if !s.runs.is_empty() {
        let mut t = Table::new(&["TIME", "VOLUME", "SNAPSHOT", "OUTCOME", "NOTE"]);
        for r in s.runs.iter().take(10) {
            t.row(run_line(r));
        }
        out.push_str("\nRecent runs:\n");
        out.push_str(&t.render());
    }
    out
}
