//! A flatten's watch: the engine flattens on its own thread; this job
//! shows its progress and ends its operation when it ends.

use crate::error::Failure;
use crate::state::{Live, State, Step};
use crate::store::OpRec;
use std::sync::Arc;

/// Follow an engine flatten (which runs on its own thread) and record its
/// end in the operation; at shutdown the record stays running, the engine
/// resumes the flatten when it reopens the pool, and recovery follows it again.
pub fn watch(
    st: &Arc<State>,
    rec: &OpRec,
    progress: Arc<lamina_engine::FlattenProgress>,
) -> Result<(), Failure> {
    use std::sync::atomic::Ordering;
    let (st2, mut rec) = (st.clone(), rec.clone());
    st.spawn_job("lamina-flatten-watch", move || {
        let mut live: Option<Live> = None;
        while !progress.finished.load(Ordering::SeqCst) {
            if st2.is_stopping() {
                return;
            }
            let (done, total) = (
                progress.done.load(Ordering::SeqCst),
                progress.total.load(Ordering::SeqCst),
            );
            let l = live.get_or_insert_with(|| Live::start(done, total));
            (l.done, l.total) = (done, total);
            st2.progress.lock().unwrap().insert(rec.id.clone(), *l);
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        rec.done_bytes = progress.done.load(Ordering::SeqCst);
        rec.total_bytes = progress.total.load(Ordering::SeqCst);
        let error = progress.error.lock().unwrap().clone();
        let _ = st2.transition(&mut rec, Step::End(error));
    })
    .map_err(|e| Failure::internal(format!("cannot follow the flatten: {e}")))
}
