//! The change feed (`GET /v1/changes`, served by `handlers.rs`): a
//! sequence number that moves on every change visible in the volume and
//! snapshot lists (a replicated volume's record included: the store tells,
//! `Store::on_replica_set_change`), and an epoch new at every start.
//! Watchers (the Kubernetes controller) long-poll it and list only when it
//! moved, so an idle pool costs them no engine calls.

use lamina_api as api;
use std::time::Duration;
use tokio::sync::watch;

/// The sequence and whether the daemon is stopping (which ends every wait).
#[derive(Clone, Copy, Debug, Default)]
struct Now {
    seq: u64,
    stopping: bool,
}

pub struct Changes {
    epoch: String,
    tx: watch::Sender<Now>,
}

impl Default for Changes {
    fn default() -> Self {
        Self::new()
    }
}

impl Changes {
    /// A feed at sequence 1 with a fresh epoch (start time and process id:
    /// two starts never share one).
    pub fn new() -> Changes {
        let ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        Changes {
            epoch: format!("{ns:x}-{:x}", std::process::id()),
            tx: watch::Sender::new(Now {
                seq: 1,
                stopping: false,
            }),
        }
    }

    /// Something visible changed.
    pub fn bump(&self) {
        self.tx.send_modify(|n| n.seq += 1);
    }

    /// The daemon is stopping: waiting callers are answered now.
    pub fn stop(&self) {
        self.tx.send_modify(|n| n.stopping = true);
    }

    pub fn current(&self) -> api::Changes {
        api::Changes {
            epoch: self.epoch.clone(),
            seq: self.tx.borrow().seq,
        }
    }

    /// Answer at once if the sequence is past `after` or the epoch differs,
    /// else when it moves or `wait` ends, whichever is first.
    pub async fn wait(&self, q: &api::ChangesQuery) -> api::Changes {
        let (Some(after), false) = (q.after, q.epoch.as_deref().is_some_and(|e| e != self.epoch))
        else {
            return self.current();
        };
        let wait = Duration::from_millis(q.wait_ms.unwrap_or(0).min(api::MAX_CHANGES_WAIT_MS));
        let mut rx = self.tx.subscribe();
        let _ = tokio::time::timeout(wait, rx.wait_for(|n| n.seq > after || n.stopping)).await;
        self.current()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(after: Option<u64>, epoch: Option<&str>, wait_ms: u64) -> api::ChangesQuery {
        api::ChangesQuery {
            after,
            epoch: epoch.map(Into::into),
            wait_ms: Some(wait_ms),
        }
    }

    #[tokio::test]
    async fn answers_at_once_when_past_or_another_epoch() {
        let c = Changes::new();
        assert_eq!(c.wait(&q(None, None, 300_000)).await.seq, 1);
        assert_eq!(c.wait(&q(Some(0), None, 300_000)).await.seq, 1);
        assert_eq!(c.wait(&q(Some(1), Some("other"), 300_000)).await.seq, 1);
    }

    #[tokio::test]
    async fn a_waiter_wakes_on_a_bump_and_on_stop() {
        let c = std::sync::Arc::new(Changes::new());
        let epoch = c.current().epoch;
        let c2 = c.clone();
        let e2 = epoch.clone();
        let waiter = tokio::spawn(async move { c2.wait(&q(Some(1), Some(&e2), 300_000)).await });
        // The waiter may or may not have subscribed yet: either way it sees 2.
        c.bump();
        assert_eq!(waiter.await.unwrap().seq, 2);
        let c3 = c.clone();
        let waiter = tokio::spawn(async move { c3.wait(&q(Some(2), Some(&epoch), 300_000)).await });
        c.stop();
        assert_eq!(waiter.await.unwrap().seq, 2);
    }

    #[tokio::test]
    async fn no_change_answers_the_same_sequence_after_the_wait() {
        let c = Changes::new();
        assert_eq!(c.wait(&q(Some(1), None, 1)).await.seq, 1);
    }
}
