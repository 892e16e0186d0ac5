//! Background work yields to volume I/O.
//!
//! Copies (full clones, pulls from another node, serving a snapshot to a
//! peer) move gigabytes; the volumes' own reads and writes are what a user
//! waits on. So every thread doing such work runs at the lowest CPU priority
//! (nice [`BACKGROUND_NICE`]): alone it copies at full speed; when a volume
//! needs the cores, the scheduler gives them to the volume first. Nice is
//! per thread on Linux, and a thread's children inherit it, so lowering it
//! where a job starts covers the threads the job makes.
//!
//! The transfer listener serves peers from a runtime of its own for the
//! same reason: on the daemon's main runtime its encryption and checksums
//! would share worker threads with the NBD connections.

use std::net::TcpListener;
use std::sync::Arc;

/// The nice value of background work: the lowest priority. Alone it runs
/// at full speed; next to volume I/O it gets a sliver of the cores (in the
/// bench a cross-node copy left the source volume 0.69x of its writes at
/// nice 10, 0.91x at 19).
pub const BACKGROUND_NICE: i32 = 19;

/// Lower the calling thread's CPU priority to [`BACKGROUND_NICE`]. A failure
/// is logged and the work goes on at normal priority.
pub fn lower_priority() {
    // SAFETY: gettid has no preconditions and returns the calling thread's
    // id; setpriority only reads its arguments. On Linux PRIO_PROCESS with
    // a thread id sets that one thread's nice value.
    let rc = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, BACKGROUND_NICE)
    };
    if rc != 0 {
        tracing::warn!(
            error = %std::io::Error::last_os_error(),
            "could not lower a background thread's priority"
        );
    }
}

/// Serve peers' pulls on `listener` from a runtime of low-priority threads,
/// until `stop` resolves. Returns when the listener has stopped.
pub async fn serve_transfer(
    source: Arc<lamina_transfer::Source>,
    listener: TcpListener,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("lamina-transfer".into())
        .spawn(move || {
            lower_priority();
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("lamina-transfer-rt")
                .on_thread_start(lower_priority)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "could not start the transfer runtime");
                    let _ = done_tx.send(());
                    return;
                }
            };
            rt.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => {
                        if let Err(e) = source.serve(l, stop).await {
                            tracing::error!(error = %e, "the transfer listener stopped");
                        }
                    }
                    Err(e) => tracing::error!(error = %e, "the transfer listener"),
                }
            });
            // Sessions still running are dropped with the runtime.
            rt.shutdown_timeout(std::time::Duration::from_secs(1));
            let _ = done_tx.send(());
        });
    match spawned {
        Ok(_) => {
            let _ = done_rx.await;
        }
        Err(e) => tracing::error!(error = %e, "could not start the transfer thread"),
    }
}
