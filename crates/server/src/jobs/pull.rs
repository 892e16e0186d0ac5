//! A pull from another node: a job that runs lamina-transfer's pull into
//! the volume made for it, records each durable offset, and retries a lost
//! source or a cut link from there instead of from zero, within the retry
//! window: from the same source, or from another node holding the same
//! snapshot (the other replicas of its volume, as the sources named them),
//! each asked for the recorded snapshot identity, so that data of two
//! snapshots is never mixed. A failed pull deletes what it had copied: a
//! partial volume never passes for a clone. The wire protocol and its
//! credentials are lamina-transfer's; the copying into the volume is the
//! engine's.

use crate::error::Failure;
use crate::state::{Live, State, Step};
use crate::store::{CloneSource, CopyRec, Op, OpRec, PeerRec};
use lamina_api::FailureReason;
use lamina_engine::{CopyControl, CopyEnd, CopyProgress};
use lamina_transfer::{Holder, Pull, Pulled, Reason, Remote};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A pull is made durable and recorded every this many bytes of data.
const CHECKPOINT_BYTES: u64 = 64 << 20;
/// Received-byte counts are recorded in the store at most this far apart
/// between checkpoints.
const RECORD_EVERY: Duration = Duration::from_secs(1);

/// The counts of data bytes a pull received and received more than once,
/// kept in a small file of their own (`DATA/transfers/OP.received`, two
/// u64 little-endian) rewritten with every piece, without a sync: a kill -9
/// of the daemon keeps it (the page cache outlives the process), so a
/// resumed pull knows what it receives a second time. A power cut may lose
/// the last of it, which only makes `resent_bytes` smaller; the data is
/// never involved.
struct ReceivedFile {
    file: Option<std::fs::File>,
    path: std::path::PathBuf,
}

impl ReceivedFile {
    fn open(st: &State, op: &str) -> ReceivedFile {
        let dir = st.layout.root.join("transfers");
        let path = dir.join(format!("{op}.received"));
        let file = std::fs::create_dir_all(&dir)
            .and_then(|_| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&path)
            })
            .map_err(|e| tracing::warn!(path = %path.display(), error = %e, "cannot keep the received count"))
            .ok();
        ReceivedFile { file, path }
    }

    /// Received and resent bytes; resent `None` in a file of a version
    /// that kept only the first.
    fn read(&self) -> (u64, Option<u64>) {
        use std::os::unix::fs::FileExt;
        let mut b = [0u8; 16];
        let Some(f) = &self.file else {
            return (0, None);
        };
        let n = f.read_at(&mut b, 0).unwrap_or(0);
        let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        match n {
            16.. => (word(0), Some(word(8))),
            8..16 => (word(0), None),
            _ => (0, None),
        }
    }

    fn write(&self, c: &Counts) {
        use std::os::unix::fs::FileExt;
        if let Some(f) = &self.file {
            let mut b = [0u8; 16];
            b[..8].copy_from_slice(&c.received.to_le_bytes());
            b[8..].copy_from_slice(&c.resent().to_le_bytes());
            let _ = f.write_all_at(&b, 0);
        }
    }

    fn remove(self) {
        drop(self.file);
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What a pull received over all its attempts. Each attempt resumes from
/// the last durable offset, so the data between that and the furthest point
/// an earlier attempt reached comes again: `resent` is what arrived below
/// that point, counted as it arrives, so it only grows, and stays 0 while
/// nothing was cut.
#[derive(Clone, Copy, Debug)]
struct Counts {
    /// Data bytes received.
    received: u64,
    /// The furthest `done_bytes` any attempt reached.
    furthest: u64,
}

impl Counts {
    fn resent(&self) -> u64 {
        self.received.saturating_sub(self.furthest)
    }

    /// Where a pull starts counting: its record, or the side file if that
    /// is further (a kill -9 after the last record), at least the durable
    /// `done` bytes.
    fn resume(copy: &CopyRec, file: (u64, Option<u64>), done: u64) -> Counts {
        let recorded = (copy.received_bytes, copy.resent_bytes);
        let (received, resent) = if file.0 > recorded.0 { file } else { recorded };
        // Counts of a version that did not keep `resent`: what they
        // received is taken as reached once.
        let resent = resent.unwrap_or(0);
        Counts {
            received,
            furthest: received.saturating_sub(resent).max(done),
        }
    }
}

/// Remove the received counts of operations that are not running (one
/// that failed while the daemon recovered it, before a job could remove
/// it). Called at the end of recovery: a pull that runs has its operation
/// recorded as running, so its count stays.
pub fn sweep_received(st: &State, running: &[&str]) {
    let dir = st.layout.root.join("transfers");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(op) = name.to_str().and_then(|n| n.strip_suffix(".received")) else {
            continue;
        };
        if !running.contains(&op) {
            tracing::info!(
                op,
                "removing the received count of an operation that is not running"
            );
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The record's reason for a transfer's.
pub fn api_reason(r: Reason) -> FailureReason {
    match r {
        Reason::SnapshotMissing => FailureReason::SnapshotMissing,
        Reason::SourceUnreachable => FailureReason::SourceUnreachable,
        Reason::NoSpace => FailureReason::NoSpace,
        Reason::Refused => FailureReason::Refused,
        Reason::Checksum => FailureReason::Checksum,
        Reason::Protocol => FailureReason::Protocol,
        Reason::Io => FailureReason::Io,
    }
}

/// The node, volume and snapshot a remote clone pulls.
pub fn remote_of(source: &CloneSource) -> Option<(Remote, String, String)> {
    match source {
        CloneSource::Remote {
            node,
            address,
            volume,
            snapshot,
        } => Some((
            Remote {
                address: address.clone(),
                node: node.clone(),
            },
            volume.clone(),
            snapshot.clone(),
        )),
        _ => None,
    }
}

/// Most other holders a remote clone records.
const MAX_OTHERS: usize = 8;

/// A recorded peer, as the transfer protocol reaches it.
pub fn remote_of_peer(p: &PeerRec) -> Remote {
    Remote {
        address: p.address.clone(),
        node: p.node.clone(),
    }
}

/// The other holders `known`, with those a source `named` added after them
/// (in order, each node once, never `first`, the source the clone names;
/// at most [`MAX_OTHERS`]).
pub fn others(first: &Remote, known: &[PeerRec], named: &[Holder]) -> Vec<PeerRec> {
    let mut out = known.to_vec();
    for h in named {
        if h.node != first.node && !out.iter().any(|o| o.node == h.node) && out.len() < MAX_OTHERS {
            out.push(PeerRec {
                node: h.node.clone(),
                address: h.address.clone(),
            });
        }
    }
    out
}

/// The nodes a pull may go on from, and which it uses now: the source the
/// clone names first, then the others in the order they were learnt. A
/// lost one stays a candidate (it may come back within the window); one
/// that answered it holds no such snapshot (or another one of that name),
/// or broke the protocol, is dropped for this run.
#[derive(Debug)]
struct Sources {
    list: Vec<Remote>,
    /// Why each was dropped; `None` while it is a candidate.
    dropped: Vec<Option<String>>,
    at: usize,
    /// Attempts lost in a row since the copy last advanced (or since the
    /// last pause): once every candidate had its turn, the next waits.
    lost: usize,
}

impl Sources {
    fn new(first: Remote, others: &[PeerRec]) -> Sources {
        let mut s = Sources {
            list: vec![first],
            dropped: vec![None],
            at: 0,
            lost: 0,
        };
        s.learn(others);
        s
    }

    fn current(&self) -> &Remote {
        &self.list[self.at]
    }

    /// Add the nodes of `others` not listed yet.
    fn learn(&mut self, others: &[PeerRec]) {
        for o in others {
            if !self.list.iter().any(|r| r.node == o.node) {
                self.list.push(remote_of_peer(o));
                self.dropped.push(None);
            }
        }
    }

    fn candidates(&self) -> usize {
        self.dropped.iter().filter(|d| d.is_none()).count()
    }

    /// Move to the next candidate after the current one (the current one
    /// again if it is the only one). Whether there is any.
    fn advance(&mut self) -> bool {
        let n = self.list.len();
        for step in 1..=n {
            let i = (self.at + step) % n;
            if self.dropped[i].is_none() {
                self.at = i;
                return true;
            }
        }
        false
    }

    /// The current source lost (unreachable, busy, or cut off): go to the
    /// next candidate. True when every candidate has been lost once since
    /// the copy last advanced, so the next attempt should wait first.
    fn lose(&mut self) -> bool {
        self.lost += 1;
        self.advance();
        if self.lost >= self.candidates() {
            self.lost = 0;
            true
        } else {
            false
        }
    }

    /// Drop the current source for `why`; whether a candidate is left
    /// (then the current one).
    fn drop_current(&mut self, why: String) -> bool {
        self.dropped[self.at] = Some(why);
        self.advance()
    }

    /// Every dropped source and why, for a failure's message.
    fn why_dropped(&self) -> String {
        self.list
            .iter()
            .zip(&self.dropped)
            .filter_map(|(r, d)| d.as_ref().map(|d| format!("node {}: {d}", r.node)))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Start (or resume) the pull of recorded operation `rec` into volume
/// `name` (made already, at the source's size).
pub fn start(st: &Arc<State>, rec: &OpRec, name: &str) -> Result<(), Failure> {
    let (st2, rec2, name) = (st.clone(), rec.clone(), name.to_string());
    st.spawn_job("lamina-pull", move || run_pull(&st2, rec2, &name))
        .map_err(|e| Failure::internal(format!("cannot start the pull: {e}")))
}

/// What the pull hears while it runs, and what it records.
struct Ctl<'a> {
    st: &'a State,
    rec: &'a mut OpRec,
    live: Live,
    last_record: Instant,
    counts: &'a mut Counts,
    failed: Option<String>,
    /// Whether this attempt made more of the copy durable (which ends an
    /// outage: data received and lost again with the connection does not).
    advanced: bool,
    received: &'a ReceivedFile,
    /// Bytes received on the wire, every run and attempt of this copy: the
    /// recorded count when this run began, and what the pulls add as bytes
    /// arrive (so the live figure grows with them and never goes back).
    wire: &'a Arc<AtomicU64>,
}

impl Ctl<'_> {
    fn publish(&mut self) {
        self.live.resent = self.counts.resent();
        self.live.wire = self.wire.load(Ordering::Relaxed);
        self.st
            .progress
            .lock()
            .unwrap()
            .insert(self.rec.id.clone(), self.live);
    }

    /// Put the counts in the record (to be recorded).
    fn count_received(&mut self) {
        if let Some(c) = self.rec.copy.as_mut() {
            c.received_bytes = self.counts.received;
            c.resent_bytes = Some(self.counts.resent());
            c.wire_bytes = self.wire.load(Ordering::Relaxed);
        }
    }
}

impl CopyControl for Ctl<'_> {
    fn progress(&mut self, p: &CopyProgress) {
        // Data applied since the last report: received once more.
        self.counts.received += p.done_bytes.saturating_sub(self.live.done);
        self.counts.furthest = self.counts.furthest.max(p.done_bytes);
        self.live.done = p.done_bytes;
        self.live.total = p.total_bytes;
        self.publish();
        self.received.write(self.counts);
        if self.last_record.elapsed() >= RECORD_EVERY {
            self.count_received();
            self.last_record = Instant::now();
            if let Err(e) = self.st.transition(self.rec, Step::Progress) {
                self.failed = Some(format!("cannot record progress: {e}"));
            }
        }
    }
    fn durable(&mut self, p: &CopyProgress) -> bool {
        self.count_received();
        self.last_record = Instant::now();
        if p.done_bytes > self.rec.done_bytes {
            self.advanced = true;
        }
        self.rec.done_bytes = p.done_bytes;
        self.rec.total_bytes = p.total_bytes;
        if let Some(c) = self.rec.copy.as_mut() {
            c.resume_offset = p.resume_offset;
        }
        match self.st.transition(self.rec, Step::Progress) {
            Ok(()) => self.failed.is_none(),
            Err(e) => {
                self.failed = Some(format!("cannot record progress: {e}"));
                false
            }
        }
    }
    fn stop(&self) -> bool {
        self.st.is_stopping() || self.failed.is_some()
    }
}

/// The pull job: attempts until done, failed for good, or the daemon stops.
fn run_pull(st: &Arc<State>, mut rec: OpRec, name: &str) {
    let span = tracing::info_span!("remote-clone", op = %rec.id, volume = %name);
    let _e = span.enter();
    let Op::Clone { source, .. } = rec.op.clone() else {
        return;
    };
    let (Some((remote, rvol, rsnap)), Some(identity)) = (remote_of(&source), st.identity.clone())
    else {
        fail(
            st,
            &mut rec,
            name,
            FailureReason::Protocol,
            "not a remote clone, or no identity".into(),
        );
        return;
    };
    let received = ReceivedFile::open(st, &rec.id);
    // A daemon killed mid-pull left its counts there: what it received past
    // the last durable offset comes again.
    let mut counts = match &rec.copy {
        Some(c) => Counts::resume(c, received.read(), rec.done_bytes),
        None => Counts {
            received: 0,
            furthest: 0,
        },
    };
    // When the current outage was first noticed: none until an attempt
    // fails, and none again only once an attempt makes more of the copy
    // durable. An attempt that receives data and loses it with its
    // connection does not end it, or a source cutting every stream before
    // a checkpoint would be retried forever.
    let mut outage: Option<Instant> = None;
    let wire = Arc::new(AtomicU64::new(
        rec.copy.as_ref().map_or(0, |c| c.wire_bytes),
    ));
    let mut backoff = Duration::from_millis(200);
    let mut sources = Sources::new(
        remote.clone(),
        rec.copy.as_ref().map_or(&[][..], |c| &c.others[..]),
    );
    loop {
        let copy = rec
            .copy
            .clone()
            .expect("a remote clone's copy is recorded before it runs");
        let source = sources.current().clone();
        let mut ctl = Ctl {
            st,
            live: Live::start(rec.done_bytes, rec.total_bytes),
            rec: &mut rec,
            last_record: Instant::now(),
            counts: &mut counts,
            failed: None,
            advanced: false,
            received: &received,
            wire: &wire,
        };
        ctl.publish();
        let pull = Pull {
            into: name,
            remote: &source,
            volume: &rvol,
            snapshot: &rsnap,
            expect_id: copy.snapshot_id,
            resume_offset: copy.resume_offset,
            checkpoint_bytes: CHECKPOINT_BYTES,
            stall_timeout: st.transfer_stall_timeout,
        };
        let Pulled { end, holders, .. } =
            lamina_transfer::pull_into_counting(&st.pool, &identity, &pull, &mut ctl, &wire);
        // Every attempt's bytes count, a cut-off one's too.
        ctl.count_received();
        if ctl.advanced {
            outage = None;
            backoff = Duration::from_millis(200);
            sources.lost = 0;
        }
        // Holders this source named, recorded with the next record.
        if let Some(c) = ctl.rec.copy.as_mut() {
            let known = others(&remote, &c.others, &holders);
            if known != c.others {
                sources.learn(&known);
                c.others = known;
            }
        }
        let failed = ctl.failed.take();
        match (end, failed) {
            (_, Some(e)) => {
                received.remove();
                return fail(st, &mut rec, name, FailureReason::Io, e);
            }
            (Ok(e), None) => match e {
                CopyEnd::Done(p) => {
                    rec.done_bytes = p.done_bytes;
                    rec.total_bytes = p.total_bytes;
                    received.remove();
                    return succeed(st, &mut rec);
                }
                CopyEnd::Stopped(_) => {
                    let _ = st.transition(&mut rec, Step::Progress);
                    st.progress.lock().unwrap().remove(&rec.id);
                    tracing::info!("daemon stopping: the pull resumes at the next start");
                    return;
                }
            },
            (Err(e), None) => {
                let reason = e.reason();
                // This source does not hold the snapshot the copy started
                // from (none of that name, or another one), or it broke the
                // protocol or sent a damaged frame: another may serve.
                let not_this_one = matches!(
                    reason,
                    Reason::SnapshotMissing | Reason::Refused | Reason::Protocol | Reason::Checksum
                );
                if not_this_one {
                    let why = e.to_string();
                    if sources.drop_current(why.clone()) {
                        tracing::warn!(source = %source.node, error = %why, next = %sources.current().node,
                            "this source cannot serve the snapshot; going on from another holder");
                        let _ = st.transition(&mut rec, Step::Progress);
                        continue;
                    }
                    received.remove();
                    let all = if sources.list.len() > 1 {
                        format!(
                            "no node serves the snapshot the clone started from: {}",
                            sources.why_dropped()
                        )
                    } else {
                        why
                    };
                    return fail(st, &mut rec, name, api_reason(reason), all);
                }
                let retriable = matches!(reason, Reason::SourceUnreachable);
                let since = *outage.get_or_insert_with(Instant::now);
                if !retriable || since.elapsed() >= st.transfer_retry_window {
                    received.remove();
                    return fail(st, &mut rec, name, api_reason(reason), e.to_string());
                }
                let wait = sources.lose();
                let next = sources.current().node.clone();
                if !wait {
                    tracing::warn!(source = %source.node, error = %e, %next,
                        "pull interrupted; going on from another holder of the snapshot, from the last durable offset");
                    let _ = st.transition(&mut rec, Step::Progress);
                    continue;
                }
                tracing::warn!(source = %source.node, error = %e, %next, retry_in = ?backoff,
                    "pull interrupted; resuming from the last durable offset");
                let _ = st.transition(&mut rec, Step::Progress);
                let until = Instant::now() + backoff;
                while Instant::now() < until {
                    if st.is_stopping() {
                        st.progress.lock().unwrap().remove(&rec.id);
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// The end is recorded before the live progress goes: in between, a reader
/// would see the last record of the running pull, with counts behind what
/// it was already shown.
fn succeed(st: &State, rec: &mut OpRec) {
    let resent = rec.copy.as_ref().and_then(|c| c.resent_bytes).unwrap_or(0);
    tracing::info!(bytes = rec.done_bytes, resent, "remote clone completed");
    let _ = st.transition(rec, Step::End(None));
}

/// End the pull as failed: the partial volume goes first.
fn fail(st: &State, rec: &mut OpRec, name: &str, reason: FailureReason, error: String) {
    tracing::error!(reason = reason.as_str(), error = %error, "remote clone failed; removing the partial volume");
    if let Err(d) = st.pool.delete_volume(name, true) {
        if !matches!(d, lamina_engine::Error::VolumeNotFound(_)) {
            tracing::error!(error = %d, "could not remove the partial volume");
        }
    }
    rec.reason = Some(reason);
    let error = format!("{}: {error}", reason.as_str());
    let _ = st.transition(rec, Step::End(Some(error)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(n: &str) -> Remote {
        Remote {
            address: format!("{n}:7481"),
            node: n.into(),
        }
    }

    fn h(n: &str) -> Holder {
        Holder {
            node: n.into(),
            address: format!("{n}:7481"),
        }
    }

    #[test]
    fn holders_named_are_kept_once_in_order_without_the_first_source() {
        let first = r("a");
        let o = others(&first, &[], &[h("b"), h("a"), h("c"), h("b")]);
        let nodes: Vec<_> = o.iter().map(|p| p.node.as_str()).collect();
        assert_eq!(nodes, ["b", "c"]);
        // Learnt later: after those known, a known one not moved.
        let o = others(&first, &o, &[h("d"), h("c")]);
        let nodes: Vec<_> = o.iter().map(|p| p.node.as_str()).collect();
        assert_eq!(nodes, ["b", "c", "d"]);
        let many: Vec<_> = (0..20).map(|i| h(&format!("n{i}"))).collect();
        assert_eq!(others(&first, &[], &many).len(), MAX_OTHERS);
    }

    #[test]
    fn a_lost_source_hands_over_to_the_next_and_waits_only_after_a_full_turn() {
        let known = others(&r("a"), &[], &[h("b"), h("c")]);
        let mut s = Sources::new(r("a"), &known);
        assert_eq!(s.current().node, "a");
        // a lost: b at once, then c at once, then a again after a wait.
        assert!(!s.lose());
        assert_eq!(s.current().node, "b");
        assert!(!s.lose());
        assert_eq!(s.current().node, "c");
        assert!(s.lose());
        assert_eq!(s.current().node, "a");
        // A source that holds another snapshot is dropped for good; the
        // turn is then of the candidates left.
        assert!(s.drop_current("another snapshot".into()));
        assert_eq!(s.current().node, "b");
        assert!(!s.lose());
        assert_eq!(s.current().node, "c");
        assert!(s.lose());
        assert_eq!(s.current().node, "b");
        assert!(s.drop_current("missing".into()));
        assert_eq!(s.current().node, "c");
        // The last one lost: it is tried again, after a wait.
        assert!(s.lose());
        assert_eq!(s.current().node, "c");
        assert!(!s.drop_current("missing".into()));
        assert_eq!(
            s.why_dropped(),
            "node a: another snapshot; node b: missing; node c: missing"
        );
    }
}
