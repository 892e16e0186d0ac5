//! `lamina operation ...`, and waiting for long-running work with a
//! progress bar.

use crate::output::{self, fields, or_dash, Table};
use crate::Ctx;
use anyhow::{bail, Context, Result};
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use lamina_api::{format_size, CloneState, Operation, OperationState, Volume};
use lamina_cli::client::{seg, Failure};
use serde_json::Value;
use std::time::Duration;

const POLL: Duration = Duration::from_millis(200);

#[derive(Subcommand)]
pub enum OperationCmd {
    /// List the long-running operations (full clones, flattens) and past changes.
    List,
    /// Show an operation.
    Get { id: String },
    /// Wait for an operation to finish, with a progress bar.
    Wait { id: String },
}

pub async fn run(ctx: &Ctx, cmd: OperationCmd) -> Result<()> {
    match cmd {
        OperationCmd::List => {
            let v = ctx.client.get("/v1/operations").await?;
            output::show(ctx.fmt, &v, |ops: &Vec<Operation>| list_table(ops))
        }
        OperationCmd::Get { id } => {
            let v = ctx
                .client
                .get(&format!("/v1/operations/{}", seg(&id)))
                .await?;
            output::show(ctx.fmt, &v, details)
        }
        OperationCmd::Wait { id } => {
            let v = wait(ctx, &id).await?;
            output::show(ctx.fmt, &v, details)
        }
    }
}

pub fn state_name(s: &OperationState) -> &'static str {
    match s {
        OperationState::Running => "running",
        OperationState::Succeeded => "succeeded",
        OperationState::Failed => "failed",
    }
}

fn progress(op: &Operation) -> String {
    if op.total_bytes == 0 {
        return format_size(op.done_bytes);
    }
    let pct = op.done_bytes as f64 * 100.0 / op.total_bytes as f64;
    format!(
        "{} / {} ({pct:.0}%)",
        format_size(op.done_bytes),
        format_size(op.total_bytes)
    )
}

fn list_table(ops: &[Operation]) -> String {
    let mut t = Table::new(&[
        "ID", "KIND", "VOLUME", "STATE", "PROGRESS", "STARTED", "ERROR",
    ]);
    for o in ops {
        t.row(vec![
            o.id.clone(),
            o.kind.to_string(),
            output::clip(&o.volume, 64),
            state_name(&o.state).into(),
            progress(o),
            o.started.clone(),
            output::clip(&or_dash(o.error.as_deref()), 100),
        ]);
    }
    t.render()
}

fn details(o: &Operation) -> String {
    fields(&[
        ("ID", o.id.clone()),
        ("Kind", o.kind.to_string()),
        ("Volume", o.volume.clone()),
        ("State", state_name(&o.state).into()),
        ("Progress", progress(o)),
        ("Started", o.started.clone()),
        ("Error", or_dash(o.error.as_deref())),
    ])
}

fn bar() -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} [{elapsed_precise}] [{wide_bar}] {bytes}/{total_bytes} ({binary_bytes_per_sec}, ETA {eta})",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    pb
}

/// Poll an operation until it ends, drawing a progress bar on stderr (only
/// when it is a terminal). Returns the final record; a failed operation is
/// an error.
pub async fn wait(ctx: &Ctx, id: &str) -> Result<Value> {
    let pb = bar();
    let url = format!("/v1/operations/{}", seg(id));
    loop {
        let v = ctx.client.get(&url).await.with_context(|| {
            format!("waiting for operation {id} (it goes on in the daemon: `lamina operation wait {id}`)")
        })?;
        let op: Operation = output::parse(&v)?;
        if pb.message().is_empty() {
            let what = match op.kind {
                lamina_api::OperationKind::Clone | lamina_api::OperationKind::FullClone => {
                    "full clone"
                }
                k => k.as_str(),
            };
            pb.set_message(format!("{what} {}", op.volume));
        }
        if op.total_bytes > 0 {
            pb.set_length(op.total_bytes);
        }
        pb.set_position(op.done_bytes);
        match op.state {
            OperationState::Running => tokio::time::sleep(POLL).await,
            OperationState::Succeeded => {
                pb.finish_and_clear();
                return Ok(v);
            }
            OperationState::Failed => {
                pb.abandon();
                bail!(Failure::new(
                    format!(
                        "{} of volume {} failed: {}",
                        op.kind,
                        op.volume,
                        op.error.as_deref().unwrap_or("no reason recorded")
                    ),
                    Some(format!(
                        "see `lamina operation get {}` and the daemon's log",
                        op.id
                    )),
                ));
            }
        }
    }
}

/// Poll a volume until it is no longer flattening, with a spinner.
pub async fn wait_flatten(ctx: &Ctx, name: &str) -> Result<Value> {
    let pb = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    pb.set_message(format!("flattening {name}"));
    let url = format!("/v1/volumes/{}", seg(name));
    loop {
        let v = ctx.client.get(&url).await?;
        let vol: Volume = output::parse(&v)?;
        if vol.clone_state != CloneState::Flattening {
            pb.finish_and_clear();
            return Ok(v);
        }
        pb.tick();
        tokio::time::sleep(POLL).await;
    }
}
