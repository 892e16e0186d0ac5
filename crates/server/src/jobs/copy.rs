//! A full clone's copy: a job that drives the engine's resumable copy
//! (`Pool::copy_into`) and records each durable offset in the operation
//! record, so that a restart resumes where it stopped instead of starting
//! over. The rules of system snapshots are the engine's.

use crate::error::Failure;
use crate::state::{Live, State, Step};
use crate::store::{CopyRec, OpRec};
use lamina_engine::{CopyControl, CopyEnd, CopyProgress, Target};
use std::sync::Arc;

/// A full clone's progress is made durable and recorded every this many
/// bytes of data.
const CHECKPOINT_BYTES: u64 = 64 << 20;

/// Start the copy of recorded operation `rec` into volume `name` (made
/// already, at the size of what it copies).
pub fn start(st: &Arc<State>, rec: &OpRec, name: &str) -> Result<(), Failure> {
    let (st2, rec2, name) = (st.clone(), rec.clone(), name.to_string());
    st.spawn_job("lamina-full-clone", move || run_copy(&st2, rec2, &name))
        .map_err(|e| Failure::internal(format!("cannot start the copy: {e}")))
}

/// The copy job: runs the engine's copy, records its durable progress, and
/// at the end marks the operation and releases the system snapshot. A copy
/// that fails removes the half-made volume: a partial copy must never pass
/// for a volume.
fn run_copy(st: &Arc<State>, mut rec: OpRec, name: &str) {
    let copy = rec
        .copy
        .clone()
        .expect("a full clone's copy is recorded before it runs");
    let span = tracing::info_span!("full-clone", op = %rec.id, volume = %name);
    let _e = span.enter();
    struct Ctl<'a> {
        st: &'a State,
        rec: &'a mut OpRec,
        failed: Option<String>,
        live: Option<Live>,
    }
    impl CopyControl for Ctl<'_> {
        fn progress(&mut self, p: &CopyProgress) {
            let l = self
                .live
                .get_or_insert_with(|| Live::start(p.done_bytes, p.total_bytes));
            (l.done, l.total) = (p.done_bytes, p.total_bytes);
            self.st
                .progress
                .lock()
                .unwrap()
                .insert(self.rec.id.clone(), *l);
        }
        fn durable(&mut self, p: &CopyProgress) -> bool {
            self.rec.done_bytes = p.done_bytes;
            self.rec.total_bytes = p.total_bytes;
            if let Some(c) = self.rec.copy.as_mut() {
                c.resume_offset = p.resume_offset;
            }
            match self.st.transition(self.rec, Step::Progress) {
                Ok(()) => true,
                Err(e) => {
                    self.failed = Some(format!("cannot record progress: {e}"));
                    false
                }
            }
        }
        fn stop(&self) -> bool {
            self.st.is_stopping()
        }
    }
    let src = Target::snapshot(&copy.volume, &copy.snapshot);
    let mut ctl = Ctl {
        st,
        rec: &mut rec,
        failed: None,
        live: None,
    };
    let end = st
        .pool
        .copy_into(&src, name, copy.resume_offset, CHECKPOINT_BYTES, &mut ctl);
    let failed = ctl.failed.take();
    let error = match (end, failed) {
        (Ok(CopyEnd::Stopped(_)), None) => {
            st.progress.lock().unwrap().remove(&rec.id);
            tracing::info!("daemon stopping: the copy resumes at the next start");
            return;
        }
        (Ok(CopyEnd::Done(p)), None) => {
            rec.done_bytes = p.done_bytes;
            rec.total_bytes = p.total_bytes;
            None
        }
        (_, Some(e)) => Some(e),
        (Err(e), None) => Some(e.to_string()),
    };
    if let Some(e) = &error {
        tracing::error!(error = %e, "full clone failed; removing the partial volume");
        if let Err(d) = st.pool.delete_volume(name, true) {
            tracing::error!(error = %d, "could not remove the partial volume");
        }
    }
    release(st, &copy, &rec.id);
    let _ = st.transition(&mut rec, Step::End(error));
}

/// Delete the system snapshot a copy took (a user's snapshot is never
/// touched: the engine refuses to delete one through this path).
pub fn release(st: &State, copy: &CopyRec, op: &str) {
    if copy.system {
        match st.pool.delete_system_snapshot(&copy.volume, &copy.snapshot) {
            Ok(()) | Err(lamina_engine::Error::SnapshotNotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(op, error = %e, "could not delete a full clone's system snapshot; it goes at the next start")
            }
        }
    }
}
