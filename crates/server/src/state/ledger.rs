//! An operation's record as it moves: made running ([`new_record`]), then
//! written by one function, [`State::transition`], the only writer of an
//! operation's record: its start, its durable progress, and its end, which
//! it counts in the metrics and logs. It keeps the index of running
//! operations and the live progress of jobs in step with what it writes,
//! and shows a record as the API does ([`State::operation`]).

use super::State;
use crate::error::{Failure, ServerError};
use crate::store::{Op, OpRec};
use lamina_api as api;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A running job's progress as it goes (the record holds only what is
/// durable).
#[derive(Clone, Copy, Debug)]
pub struct Live {
    pub done: u64,
    pub total: u64,
    /// When this run of the job began, and how much was done then: the rate
    /// counts only what this run did.
    pub since: std::time::Instant,
    pub done_at_start: u64,
    /// A remote clone: bytes received on the wire, all runs and attempts.
    pub wire: u64,
    /// A remote clone: data bytes received more than once, all runs.
    pub resent: u64,
}

impl Live {
    pub fn start(done: u64, total: u64) -> Live {
        Live {
            done,
            total,
            since: std::time::Instant::now(),
            done_at_start: done,
            wire: 0,
            resent: 0,
        }
    }

    /// Bytes per second since this run began (none in its first 100 ms).
    pub fn rate(&self) -> Option<u64> {
        let secs = self.since.elapsed().as_secs_f64();
        (secs >= 0.1).then(|| (self.done.saturating_sub(self.done_at_start) as f64 / secs) as u64)
    }

    /// Seconds left at that rate.
    pub fn eta(&self) -> Option<u64> {
        let r = self.rate().filter(|&r| r > 0)?;
        Some(self.total.saturating_sub(self.done).div_ceil(r))
    }
}

/// A running operation, as the in-memory index keeps it.
#[derive(Clone, Debug)]
pub(super) struct Running {
    pub(super) id: String,
    pub(super) kind: api::OperationKind,
    /// For a full clone: the snapshot it reads (volume, snapshot).
    pub(super) copies_from: Option<(String, String)>,
}

impl Running {
    pub(super) fn of(op: &OpRec) -> Running {
        Running {
            id: op.id.clone(),
            kind: op.op.kind(),
            // A remote clone reads another node's snapshot, not this one's.
            copies_from: op
                .copy
                .as_ref()
                .filter(|_| op.op.kind() == api::OperationKind::FullClone)
                .map(|c| (c.volume.clone(), c.snapshot.clone())),
        }
    }
}

/// What happens to an operation's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// It starts: its record is written, running.
    Start,
    /// It runs on: what it has made durable (what a copy reads, how far
    /// it is), written to its running record.
    Progress,
    /// It ends: succeeded (`None`), or failed with this error (a failure's
    /// `reason`, if it has one, set on the record by the caller).
    End(Option<String>),
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// Operation ids sort in start order: nanoseconds, then a sequence number.
fn new_id() -> String {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "op-{ns:016x}-{:04}",
        SEQ.fetch_add(1, Ordering::SeqCst) % 10_000
    )
}

/// A new operation's record, running from now, not written yet
/// ([`Step::Start`] writes it).
pub fn new_record(op: Op) -> OpRec {
    OpRec {
        id: new_id(),
        op,
        state: api::OperationState::Running,
        started: super::now(),
        error: None,
        done_bytes: 0,
        total_bytes: 0,
        copy: None,
        reason: None,
    }
}

impl State {
    /// Move operation `rec` by `step` and write its record: the only
    /// writer of an operation's record, whether a request, a recovery or a
    /// background job (a full clone's copy, a pull, a flatten) moves it.
    ///
    /// A start or a progress is written running (durable on return, but
    /// see `Store::put_op`); an error there is the caller's to answer.
    ///
    /// An end sets the record's state and error, counts it in
    /// `lamina_operations_total` and its duration, logs it, writes it, and
    /// only then drops the live progress, so that no reader sees the last
    /// running record in between (its counts behind the live ones it was
    /// shown). Its change is made (or it failed and changed nothing), so a
    /// store that cannot write the record now keeps it and writes it when
    /// it reopens (`Store::put_op_end`): the operation ends here either
    /// way, and the end fails only on a record that cannot be encoded.
    ///
    /// Blocking: from async code use [`State::transition_async`].
    pub fn transition(&self, rec: &mut OpRec, step: Step) -> Result<(), ServerError> {
        let error = match step {
            Step::Start => {
                rec.state = api::OperationState::Running;
                tracing::debug!(op = %rec.id, kind = %rec.op.kind(), volume = %rec.volume(), "operation started");
                self.store.put_op(rec)?;
                self.recorded(rec);
                return Ok(());
            }
            Step::Progress => {
                debug_assert_eq!(rec.state, api::OperationState::Running, "{rec:?}");
                self.store.put_op(rec)?;
                self.recorded(rec);
                return Ok(());
            }
            Step::End(error) => error,
        };
        rec.state = match error {
            None => api::OperationState::Succeeded,
            Some(_) => api::OperationState::Failed,
        };
        // The id starts with the start in nanoseconds (`new_id`):
        // `started` has whole seconds only.
        let seconds = rec
            .id
            .get(3..19)
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
            .map(|ns| std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns))
            .and_then(|t| t.elapsed().ok())
            .map(|d| d.as_secs_f64());
        let kind = rec.op.kind();
        self.metrics
            .operation(kind.as_str(), error.is_none(), seconds);
        match &error {
            None => {
                tracing::info!(op = %rec.id, kind = %kind, volume = %rec.volume(), "operation succeeded")
            }
            Some(e) => {
                tracing::warn!(op = %rec.id, kind = %kind, volume = %rec.volume(), error = %e, "operation failed")
            }
        }
        rec.error = error;
        let recorded = self.store.put_op_end(rec).map(|_| self.recorded(rec));
        if let Err(e) = &recorded {
            tracing::error!(op = %rec.id, error = %e, "could not record the end of an operation");
        }
        self.progress.lock().unwrap().remove(&rec.id);
        recorded
    }

    /// [`State::transition`] from async code: the record as written.
    pub async fn transition_async(
        self: &Arc<Self>,
        mut rec: OpRec,
        step: Step,
    ) -> Result<OpRec, Failure> {
        let st = self.clone();
        super::blocking(move || {
            st.transition(&mut rec, step).map_err(Failure::from)?;
            Ok(rec)
        })
        .await
    }

    /// Keep the index of running operations in step with a record written.
    fn recorded(&self, op: &OpRec) {
        let mut running = self.running.lock().unwrap();
        for v in op.op.volumes() {
            let list = running.entry(v.to_string()).or_default();
            list.retain(|r| r.id != op.id);
            if op.state == api::OperationState::Running {
                list.push(Running::of(op));
            }
            if list.is_empty() {
                running.remove(v);
            }
        }
        drop(running);
        // Every change to a volume is recorded (started, progressed, ended).
        self.changes.bump();
    }

    /// Operation records, filtered, newest first.
    pub fn operations(&self, f: &api::OperationFilter) -> Result<Vec<OpRec>, ServerError> {
        let mut ops: Vec<OpRec> = self
            .store
            .ops()?
            .into_iter()
            .filter(|o| {
                f.volume
                    .as_deref()
                    .is_none_or(|v| o.op.volumes().contains(&v))
            })
            .filter(|o| f.state.is_none_or(|s| o.state == s))
            .collect();
        ops.sort_by(|a, b| b.started.cmp(&a.started).then_with(|| b.id.cmp(&a.id)));
        if let Some(n) = f.limit {
            ops.truncate(n as usize);
        }
        Ok(ops)
    }

    /// Delete the records of operations that ended (succeeded or failed)
    /// and started more than `age` ago. Returns how many went.
    pub fn prune_operations(&self, age: std::time::Duration) -> Result<usize, ServerError> {
        let cutoff = std::time::SystemTime::now()
            .checked_sub(age)
            .unwrap_or(std::time::UNIX_EPOCH);
        let old: Vec<String> = self
            .store
            .ops()?
            .into_iter()
            .filter(|o| o.state != api::OperationState::Running)
            .filter(|o| humantime::parse_rfc3339(&o.started).is_ok_and(|t| t < cutoff))
            .map(|o| o.id)
            .collect();
        let ids: Vec<&str> = old.iter().map(String::as_str).collect();
        self.store.remove_ops(&ids)?;
        if !ids.is_empty() {
            tracing::info!(pruned = ids.len(), "finished operation records pruned");
        }
        Ok(ids.len())
    }

    /// An operation record as the API shows it, with live progress if a job is
    /// working for it.
    pub fn operation(&self, rec: &OpRec) -> api::Operation {
        let live = self.progress.lock().unwrap().get(&rec.id).copied();
        // A job records its end before it drops its live progress, so a running
        // record read before this look at the progress, with none there now, may
        // be one the job has since ended: read it again, or the counts shown
        // would go back to the last running record's.
        let again;
        let rec = match (live, rec.state) {
            (None, api::OperationState::Running) => match self.store.op(&rec.id) {
                Ok(Some(r)) => {
                    again = r;
                    &again
                }
                _ => rec,
            },
            _ => rec,
        };
        let live = live.filter(|_| rec.state == api::OperationState::Running);
        let (done_bytes, total_bytes) =
            live.map_or((rec.done_bytes, rec.total_bytes), |l| (l.done, l.total));
        let copy = rec.copy.as_ref();
        // The pull's own count while it runs (jobs/pull.rs), else the recorded
        // one; records from before it was kept had only what was received.
        let resent = match (live, copy) {
            (Some(l), _) => l.resent,
            (None, Some(c)) => c
                .resent_bytes
                .unwrap_or_else(|| c.received_bytes.saturating_sub(done_bytes)),
            (None, None) => 0,
        };
        let remote = rec.op.kind() == api::OperationKind::RemoteClone;
        api::Operation {
            id: rec.id.clone(),
            kind: rec.op.kind(),
            volume: rec.volume().to_string(),
            state: rec.state,
            done_bytes,
            total_bytes,
            started: rec.started.clone(),
            error: rec.error.clone(),
            source: match &rec.op {
                Op::Clone { source, .. } => Some(source.api_form()),
                _ => None,
            },
            reason: rec.reason,
            resent_bytes: if remote { resent } else { 0 },
            wire_bytes: live.map_or(copy.map_or(0, |c| c.wire_bytes), |l| l.wire),
            rate_bytes_per_sec: live.and_then(|l| l.rate()),
            eta_seconds: live.and_then(|l| l.eta()),
        }
    }
}
