//! `lamina operation ...`, and waiting for long-running work with a
//! progress display that Ctrl-C leaves without stopping the work.

use crate::failure::Failure;
use crate::output::{self, fields, or_dash, Table};
use crate::Ctx;
use anyhow::{Context, Result};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use lamina_api::{
    format_size, CloneState, Operation, OperationFilter, OperationKind, OperationState, Volume,
};
use std::future::Future;
use std::time::Duration;
use tokio::signal::unix::{signal, Signal, SignalKind};

const POLL: Duration = Duration::from_millis(200);

#[derive(Subcommand)]
pub enum OperationCmd {
    /// List recorded operations, newest first: long-running ones (full clones, flattens) and past changes.
    List {
        /// Only operations on this volume.
        #[arg(long, value_name = "VOLUME")]
        volume: Option<String>,
        /// Only operations in this state.
        #[arg(long, value_parser = state_arg())]
        state: Option<OperationState>,
        /// At most this many (the newest).
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
    },
    /// Show an operation.
    Get {
        /// The operation's ID (from `lamina operation list`).
        id: String,
    },
    /// Wait for an operation to finish, with a progress bar (Ctrl-C stops waiting, not the operation).
    Wait {
        /// The operation's ID (from `lamina operation list`).
        id: String,
    },
}

fn state_arg() -> impl TypedValueParser<Value = OperationState> {
    PossibleValuesParser::new(["running", "succeeded", "failed"]).map(|s| match s.as_str() {
        "running" => OperationState::Running,
        "succeeded" => OperationState::Succeeded,
        _ => OperationState::Failed,
    })
}

pub async fn run(ctx: &Ctx, cmd: OperationCmd) -> Result<()> {
    match cmd {
        OperationCmd::List {
            volume,
            state,
            limit,
        } => {
            let filter = OperationFilter {
                volume,
                state,
                limit,
            };
            let ops = ctx.client.list_operations(&filter).await?;
            output::show(ctx.fmt, &ops, |ops| list_table(ops))
        }
        OperationCmd::Get { id } => {
            let op = ctx.client.get_operation(&id).await?;
            output::show(ctx.fmt, &op, details)
        }
        OperationCmd::Wait { id } => {
            let op = wait(ctx, &id).await?;
            output::show(ctx.fmt, &op, details)
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
    let mut f = vec![
        ("ID", o.id.clone()),
        ("Kind", o.kind.to_string()),
        ("Volume", o.volume.clone()),
        ("Source", or_dash(o.source.as_deref())),
        ("State", state_name(&o.state).into()),
        ("Progress", progress(o)),
    ];
    if let Some(r) = o.rate_bytes_per_sec {
        f.push(("Rate", format!("{}/s", format_size(r))));
    }
    if let Some(s) = o.eta_seconds {
        f.push((
            "ETA",
            humantime::format_duration(std::time::Duration::from_secs(s)).to_string(),
        ));
    }
    if o.kind == OperationKind::RemoteClone {
        f.push(("Received on the wire", format_size(o.wire_bytes)));
        f.push(("Re-sent after interruptions", format_size(o.resent_bytes)));
    }
    f.push(("Started", o.started.clone()));
    f.push(("Reason", or_dash(o.reason.map(|r| r.as_str()))));
    f.push(("Error", or_dash(o.error.as_deref())));
    fields(&f)
}

/// What an operation does, in words: `full clone`, `flatten`...
fn doing(kind: OperationKind) -> String {
    match kind {
        OperationKind::FullClone => "full clone".into(),
        OperationKind::RemoteClone => "copy from another node into".into(),
        k => k.as_str().replace('-', " "),
    }
}

/// The progress display on stderr (drawn only on a terminal): a spinner
/// with the bytes done while the total is unknown, a bar once it is.
struct Progress {
    pb: ProgressBar,
}

impl Progress {
    fn new(target: ProgressDrawTarget) -> Progress {
        let pb = ProgressBar::with_draw_target(None, target);
        pb.set_style(
            ProgressStyle::with_template("{spinner} {msg} [{elapsed_precise}] {bytes} copied")
                .expect("a valid template"),
        );
        Progress { pb }
    }

    fn update(&self, op: &Operation) {
        if self.pb.message().is_empty() {
            self.pb
                .set_message(format!("{} {}", doing(op.kind), op.volume));
        }
        if op.total_bytes > 0 && self.pb.length().is_none() {
            self.pb.set_style(
                ProgressStyle::with_template(
                    "{msg} [{elapsed_precise}] [{wide_bar}] {bytes}/{total_bytes} ({binary_bytes_per_sec}, ETA {eta})",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            self.pb.set_length(op.total_bytes);
        }
        self.pb.set_position(op.done_bytes);
        self.pb.tick();
    }
}

/// The error for Ctrl-C while waiting: the work goes on in the daemon.
fn interrupted(what: &str, follow: &str) -> anyhow::Error {
    let mut f = Failure::new(
        format!("stopped waiting: the {what} goes on in the daemon"),
        Some(format!("follow it with `{follow}`")),
    );
    f.exit_code = 130;
    f.into()
}

/// Waiting that Ctrl-C ends: what is waited for (`what`, in words) and
/// the command that follows it again (`follow`), both refined as answers
/// come in.
struct Waiting {
    int: Signal,
    pb: ProgressBar,
    what: String,
    follow: String,
}

impl Waiting {
    fn new(pb: ProgressBar, what: String, follow: String) -> Result<Waiting> {
        Ok(Waiting {
            int: signal(SignalKind::interrupt()).context("installing the Ctrl-C handler")?,
            pb,
            what,
            follow,
        })
    }

    /// `fut`'s output, unless Ctrl-C comes first: then the display stays
    /// as it is and the error says that the work goes on.
    async fn until<T>(&mut self, fut: impl Future<Output = T>) -> Result<T> {
        tokio::select! {
            v = fut => Ok(v),
            _ = self.int.recv() => {
                self.pb.abandon();
                Err(interrupted(&self.what, &self.follow))
            }
        }
    }
}

/// Poll an operation until it ends, drawing its progress. Returns the
/// final record; a failed operation is an error. Ctrl-C stops waiting
/// (exit 130) and says how to follow the operation.
pub async fn wait(ctx: &Ctx, id: &str) -> Result<Operation> {
    let progress = Progress::new(ProgressDrawTarget::stderr());
    let mut w = Waiting::new(
        progress.pb.clone(),
        format!("operation {id}"),
        format!("lamina operation wait {id}"),
    )?;
    let mut seen = w
        .until(ctx.client.changes(None, None, Duration::ZERO))
        .await?
        .ok();
    loop {
        let op = w.until(ctx.client.get_operation(id)).await??;
        w.what = format!("{} of {} (operation {id})", doing(op.kind), op.volume);
        progress.update(&op);
        match op.state {
            OperationState::Running => seen = next_change(ctx, &mut w, seen).await?,
            OperationState::Succeeded => {
                progress.pb.finish_and_clear();
                return Ok(op);
            }
            OperationState::Failed => {
                progress.pb.abandon();
                anyhow::bail!(Failure::new(
                    format!(
                        "{} of volume {} failed: {}",
                        doing(op.kind),
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

/// Poll a volume until it is no longer flattening, with a spinner; Ctrl-C
/// stops waiting as for [`wait`].
///
/// `op` is the flatten's operation, as the flatten request answered it.
/// The volume turns independent a moment before the daemon records that
/// operation as ended (a small flatten may be over before the answer
/// arrives): with it, this waits for the record, so that what `--wait`
/// returns and `lamina operation list` agree.
pub async fn wait_flatten(ctx: &Ctx, name: &str, op: Option<&str>) -> Result<Volume> {
    if let Some(op) = op {
        wait(ctx, op).await?;
        return Ok(ctx.client.get_volume(name).await?);
    }
    let pb = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    pb.set_message(format!("flattening {name}"));
    let mut w = Waiting::new(
        pb.clone(),
        format!("flatten of {name}"),
        format!("lamina volume get {name}"),
    )?;
    let mut seen = w
        .until(ctx.client.changes(None, None, Duration::ZERO))
        .await?
        .ok();
    loop {
        let vol = w.until(ctx.client.get_volume(name)).await??;
        if vol.clone_state != CloneState::Flattening {
            pb.finish_and_clear();
            return Ok(vol);
        }
        if let Some(op) = &vol.operation {
            w.follow = format!("lamina operation wait {op}");
        }
        pb.tick();
        seen = next_change(ctx, &mut w, seen).await?;
    }
}

/// Wait for the daemon's next change after `seen` (every operation record,
/// its end included, is one), or `POLL` at most: a waiter wakes as soon as
/// the operation ends rather than up to a poll later. The sequence is read
/// before the state it guards, so no change falls between the two. Without
/// a sequence (the feed failed) it sleeps `POLL`.
async fn next_change(
    ctx: &Ctx,
    w: &mut Waiting,
    seen: Option<lamina_api::Changes>,
) -> Result<Option<lamina_api::Changes>> {
    let Some(c) = seen else {
        w.until(tokio::time::sleep(POLL)).await?;
        return Ok(w
            .until(ctx.client.changes(None, None, Duration::ZERO))
            .await?
            .ok());
    };
    let next = ctx.client.changes(Some(c.seq), Some(&c.epoch), POLL);
    Ok(w.until(next).await?.ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(done: u64, total: u64) -> Operation {
        Operation {
            id: "op-1".into(),
            kind: OperationKind::FullClone,
            volume: "c".into(),
            state: OperationState::Running,
            done_bytes: done,
            total_bytes: total,
            started: "2025-01-01T00:00:00Z".into(),
            error: None,
            source: Some("a/s".into()),
            reason: None,
            resent_bytes: 0,
            wire_bytes: 0,
            rate_bytes_per_sec: None,
            eta_seconds: None,
        }
    }

    #[test]
    fn no_bar_before_the_total_is_known() {
        let p = Progress::new(ProgressDrawTarget::hidden());
        p.update(&op(0, 0));
        assert_eq!(p.pb.length(), None, "a spinner, not a full bar");
        assert_eq!(p.pb.message(), "full clone c");
        p.update(&op(4096, 0));
        assert_eq!(p.pb.length(), None);
        assert_eq!(p.pb.position(), 4096);
        p.update(&op(8192, 1 << 20));
        assert_eq!(p.pb.length(), Some(1 << 20));
        assert_eq!(p.pb.position(), 8192);
    }

    #[test]
    fn ctrl_c_says_the_work_goes_on_and_how_to_follow_it() {
        let e = interrupted(
            "full clone of c (operation op-1)",
            "lamina operation wait op-1",
        );
        let f = e.downcast_ref::<Failure>().unwrap();
        assert_eq!(
            f.message,
            "stopped waiting: the full clone of c (operation op-1) goes on in the daemon"
        );
        assert_eq!(
            f.hint.as_deref(),
            Some("follow it with `lamina operation wait op-1`")
        );
        assert_eq!(f.exit_code, 130);
    }

    #[test]
    fn kinds_in_words() {
        assert_eq!(doing(OperationKind::FullClone), "full clone");
        assert_eq!(doing(OperationKind::Flatten), "flatten");
        assert_eq!(doing(OperationKind::CreateVolume), "create volume");
    }
}
