//! A faulted replica brought back (docs/replicas.md, "Rebuilds"): while
//! its front end serves the volume, a thread of its own reaches each
//! faulted replica on another node every few seconds and, once it
//! answers, sends it only what it lacks, in rounds recorded in the store so
//! that a kill of either side or a cut link resumes from the last recorded
//! offset. They are sent from this node's replica, so only while it is
//! healthy; faulted, it is brought back first, from the others, through
//! the front end ([`rebuild_here`]).
//!
//! What a replica lacks is known from its *base*: a snapshot of this
//! node's replica that its volume equals outside a list of *uncertain*
//! ranges. The first base is taken after its fault, at one point of the
//! write stream, with the ranges of every change in flight at the fault
//! and sent since (lamina-replica's rule 10), and of every change it had
//! answered that no flush covered: those are dropped once it answers at
//! the instance it failed at (its daemon did not restart) and a flush
//! there made them durable. Each round then brings it
//! from its base to a later snapshot of this node's replica, sending the
//! uncertain ranges and the engine's diff between the two (metadata only:
//! unchanged data is never read), and that snapshot becomes its base:
//!
//! 1. the snapshots it missed, oldest first, each made on it once its
//!    volume holds that snapshot's data (and those deleted meanwhile
//!    deleted on it first);
//! 2. a system snapshot taken now, again while a round sends more than
//!    [`LAST_ROUND`];
//! 3. the last round: with snapshots of the volume held, the replica
//!    rejoins the write set at a system snapshot taken at one point of the
//!    write stream, what changed up to that snapshot is copied through the
//!    front end (ordered with the writes), and it is recorded healthy and
//!    made so with no change in flight.
//!
//! A replica that fails in the last round leaves the write set again; the
//! front end keeps what it misses from then, and the next base covers it.

use super::{now, Front, Parts};
use crate::device::Registry;
use crate::store::{LastRebuild, RebuildRec, ReplicaRec, RoundRec, Store};
use lamina_blockio::{wait, BlockIo, IoDone, IoError, IoOp};
use lamina_engine::{ExtentKind, Pool, Target};
use lamina_replica::{Missed, State};
use lamina_transfer::replica::{RemoteVolume, SessionOptions};
use lamina_transfer::{Identity, Pace};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How often a faulted replica is tried.
const RETRY: Duration = Duration::from_secs(2);

/// A round that sends less than this is followed by the last round.
pub const LAST_ROUND: u64 = 32 << 20;

/// Data is sent in pieces of at most this.
const PIECE: u64 = 1 << 20;

/// Zeros are sent in pieces of at most this.
const ZEROS: u64 = 1 << 30;

/// Progress is recorded at least this often (bytes sent).
const RECORD_EVERY: u64 = 16 << 20;

/// This node's replica is not tried while the pool's file system has less
/// room than this: a replica faulted by a full disk waits for room
/// instead of failing each attempt part way. Not what the copy needs,
/// which is not known before it starts (a copy over a block the replica
/// holds alone takes no room), nor the pool's own free blocks (counting
/// them scans every refcount page under the metadata mutex; the blocks a
/// delete frees are punched, and so come back to the file system): one
/// that runs out all the same fails, and is tried again.
const ROOM: u64 = 32 << 20;

/// What a rebuild needs of the daemon, owned.
struct Ctx {
    pool: Pool,
    exports: Arc<Registry>,
    store: Arc<Store>,
    identity: Option<Arc<Identity>>,
    pace: Option<Arc<dyn Pace>>,
    pool_dir: std::path::PathBuf,
    crash_at: Option<String>,
    volume: String,
}

impl Ctx {
    /// At a named point, die as kill -9 would (tests of crash recovery:
    /// `--test-crash-at`).
    fn crash_point(&self, name: &str) {
        if self.crash_at.as_deref() == Some(name) {
            eprintln!("lamina: crashing at {name}, as asked (--test-crash-at)");
            std::process::abort();
        }
    }
}

type Fail = String;

/// Start the rebuilds of `front`, a front end of `volume`: a thread that
/// lives while the front end does and serves.
pub(super) fn spawn(p: &Parts<'_>, volume: &str, front: &Arc<Front>) {
    let ctx = Ctx {
        pool: p.pool.clone(),
        exports: p.exports.clone(),
        store: p.store.clone(),
        identity: p.identity.cloned(),
        pace: p.pace.cloned(),
        pool_dir: p.pool_dir.to_path_buf(),
        crash_at: p.crash_at.map(str::to_string),
        volume: volume.to_string(),
    };
    let front = Arc::downgrade(front);
    let spawned = std::thread::Builder::new()
        .name(format!("rebuild-{volume}"))
        .spawn(move || run(ctx, front));
    if let Err(e) = spawned {
        tracing::warn!(volume, error = %e, "no thread for its rebuilds: its faulted replicas stay out");
    }
}

fn run(ctx: Ctx, front: Weak<Front>) {
    let span = tracing::info_span!("rebuild", volume = %ctx.volume);
    let _e = span.enter();
    loop {
        // Sleep in short steps: a closed front end ends this soon.
        for _ in 0..(RETRY.as_millis() / 100) {
            match front.upgrade() {
                Some(f) if !f.is_closed() => {}
                _ => return,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let Some(f) = front.upgrade() else { return };
        let set = match ctx.store.replica_set(&ctx.volume) {
            Ok(Some(s)) => s,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "the replica set could not be read");
                continue;
            }
        };
        // A session that failed while the volume was idle (its pings
        // unanswered) faults its replica now, not at the next change.
        for (node, v) in f.remotes() {
            let healthy = set
                .replicas
                .iter()
                .any(|r| r.node == node && r.faulted.is_none());
            if let (true, false, Some(why)) = (healthy, f.is_closed(), v.failed()) {
                let reason = format!("its session failed: {why}");
                tracing::warn!(replica = %node, %reason, "replica faulted");
                if let Err(e) = f.replicated.fault(&node, &reason) {
                    tracing::warn!(replica = %node, error = %e, "the fault could not be recorded");
                }
            }
        }
        // A front end holding no replica brings each back through itself.
        if set.diskless {
            for r in set.replicas.iter().filter(|r| r.faulted.is_some()) {
                if f.is_closed() {
                    break;
                }
                if let Err(e) = rebuild_remote(&ctx, &f, r, set.generation) {
                    tracing::debug!(replica = %r.node, error = %e, "not rebuilt yet");
                }
            }
            continue;
        }
        // This node's replica is the source of every other's rebuild: it
        // is rebuilt first, and the others wait for it.
        let Some(here) = set.replicas.first().filter(|r| r.address.is_empty()) else {
            continue;
        };
        if here.faulted.is_some() {
            if !f.is_closed() {
                if let Err(e) = rebuild_here(&ctx, &f, here, set.generation) {
                    tracing::debug!(replica = %here.node, error = %e, "this node's replica not rebuilt yet");
                }
            }
            continue;
        }
        for r in set.replicas.iter().skip(1) {
            if r.faulted.is_none() || f.is_closed() {
                continue;
            }
            if let Err(e) = rebuild(&ctx, &f, &here.node, r, set.generation) {
                tracing::debug!(replica = %r.node, error = %e, "not rebuilt yet");
            }
        }
    }
}

/// The store's error as a rebuild's.
fn stored<T>(r: Result<T, crate::error::ServerError>) -> Result<T, Fail> {
    r.map_err(|e| format!("the daemon's store: {e}"))
}

fn engine<T>(r: Result<T, lamina_engine::Error>) -> Result<T, Fail> {
    r.map_err(|e| e.to_string())
}

fn io<T>(r: Result<T, IoError>) -> Result<T, Fail> {
    r.map_err(|e| e.to_string())
}

/// This replica's record now.
fn current(ctx: &Ctx, node: &str) -> Result<ReplicaRec, Fail> {
    stored(ctx.store.replica_set(&ctx.volume))?
        .and_then(|s| s.replicas.into_iter().find(|r| r.node == node))
        .ok_or_else(|| format!("volume {} has no replica on {node} any more", ctx.volume))
}

/// Whether this node's replica (`here`) is healthy now. Its snapshots are
/// what every other replica is rebuilt from, so a snapshot a rebuild takes
/// of it counts only if it was healthy when the snapshot was made: a
/// replica faulted is not healthy again until its own rebuild (this
/// thread's) ends, so healthy after the snapshot means healthy through it.
fn here_healthy(front: &Front, here: &str) -> bool {
    front
        .replicated
        .states()
        .iter()
        .any(|(n, s)| n == here && *s == State::Healthy)
}

/// The error of a rebuild that finds this node's replica faulted.
fn here_faulted(here: &str) -> Fail {
    format!("this node's replica ({here}) is faulted: it is rebuilt first")
}

/// One attempt at bringing faulted replica `r` (on another node) back,
/// from this node's replica, `here`.
fn rebuild(
    ctx: &Ctx,
    front: &Front,
    here: &str,
    r: &ReplicaRec,
    generation: u64,
) -> Result<(), Fail> {
    let node = &r.node;
    if front.replicated.is_keeping(node) || r.rebuild.is_none() {
        take_base(ctx, front, here, r, generation)?;
    }
    let v = reach(ctx, r, generation)?;
    let v = Arc::new(v);
    tracing::info!(replica = %node, "faulted replica answers: rebuilding");
    settle_unflushed(ctx, node, &v)?;
    loop {
        if front.is_closed() {
            return Ok(());
        }
        let rec = current(ctx, node)?;
        if rec.faulted.is_none() {
            return Ok(());
        }
        delete_pending(ctx, node, &v, &rec.pending_deletes)?;
        let rb = rec.rebuild.clone().ok_or("no base")?;
        if let Some(s) = rec.missed_snapshots.first() {
            if ctx.pool.snapshot_info_by_name(&ctx.volume, s).is_err() {
                // Deleted meanwhile: not its to get.
                let s = s.clone();
                stored(ctx.store.change_replica(&ctx.volume, node, |x| {
                    x.missed_snapshots.retain(|m| *m != s)
                }))?;
                continue;
            }
            round(ctx, front, node, &v, &rb, s)?;
            let (origin, group) = super::copy_of(&ctx.pool, &ctx.volume, s);
            io(v.snapshot(s, origin, group))?;
            let s = s.clone();
            rebase(ctx, node, &rb, &s, |x| {
                x.missed_snapshots.retain(|m| *m != s)
            })?;
            tracing::info!(replica = %node, snapshot = %s, "missed snapshot made on the replica");
            continue;
        }
        // A round towards a snapshot of now: the one a killed rebuild was
        // in, else a new one.
        let target = match &rb.round {
            Some(t)
                if ctx
                    .pool
                    .snapshot_info_by_name(&ctx.volume, &t.target)
                    .is_ok() =>
            {
                t.target.clone()
            }
            _ => {
                let t = system_snapshot(ctx, node)?;
                if !here_healthy(front, here) {
                    drop_system(ctx, &t, &rb.base);
                    return Err(here_faulted(here));
                }
                t
            }
        };
        let sent = round(ctx, front, node, &v, &rb, &target)?;
        rebase(ctx, node, &rb, &target, |_| {})?;
        if sent < LAST_ROUND {
            break;
        }
    }
    last_round(ctx, front, here, node, v)
}

/// A session to faulted replica `r`, activated at `generation`.
fn reach(ctx: &Ctx, r: &ReplicaRec, generation: u64) -> Result<RemoteVolume, Fail> {
    let identity = ctx
        .identity
        .as_ref()
        .ok_or("this daemon has no transfer identity (--transfer-tls)")?;
    let remote = super::remote_of(&ctx.store, r);
    let v = RemoteVolume::connect(identity, &remote, &ctx.volume, SessionOptions::default())
        .map_err(|e| e.to_string())?;
    io(v.activate(generation))?;
    Ok(v)
}

/// Delete on the replica on `node` (session `v`) the snapshots deleted
/// while it was out (`pending`), then take them out of its record.
fn delete_pending(ctx: &Ctx, node: &str, v: &RemoteVolume, pending: &[String]) -> Result<(), Fail> {
    if pending.is_empty() {
        return Ok(());
    }
    for name in pending {
        io(v.delete_snapshot(name))?;
    }
    stored(ctx.store.change_replica(&ctx.volume, node, |x| {
        x.pending_deletes.retain(|s| !pending.contains(s))
    }))
    .map(|_| ())
}

/// Settle what the replica on `node` (session `v`) had answered unflushed
/// at its fault: at the instance it failed at, its node lost none of it,
/// and a flush there makes it durable, so it is not sent again; at
/// another, or none, it may have been lost, and joins the uncertain ranges
/// the next round sends.
fn settle_unflushed(ctx: &Ctx, node: &str, v: &Arc<RemoteVolume>) -> Result<(), Fail> {
    let Some(rb) = current(ctx, node)?.rebuild else {
        return Ok(());
    };
    if rb.unflushed.is_empty() {
        return Ok(());
    }
    let held = rb.instance.is_some() && rb.instance == v.instance();
    if held {
        io(wait(&**v, IoOp::Flush))?;
    }
    let bytes: u64 = rb.unflushed.iter().map(|(a, b)| b - a).sum();
    stored(ctx.store.change_replica(&ctx.volume, node, |x| {
        if let Some(b) = x.rebuild.as_mut() {
            if !held {
                let mut u = std::mem::take(&mut b.uncertain);
                u.extend(b.unflushed.iter().copied());
                b.uncertain = merge(u);
                // A round's cursor holds for the ranges it had.
                b.round = None;
            }
            b.unflushed.clear();
            b.instance = None;
        }
    }))?;
    if held {
        tracing::info!(replica = %node, bytes, "the replica kept what it answered unflushed: flushed there, not sent");
    } else {
        tracing::info!(replica = %node, bytes, "the replica is at another instance: what it answered unflushed is sent again");
    }
    Ok(())
}

/// A system snapshot of this node's replica, for a rebuild of the one on
/// `node`.
fn system_snapshot(ctx: &Ctx, node: &str) -> Result<String, Fail> {
    Ok(engine(
        ctx.pool
            .create_system_snapshot(&ctx.volume, &format!("rebuild-{node}")),
    )?
    .name)
}

/// Delete system snapshot `name` of the volume, unless it is `keep`.
fn drop_system(ctx: &Ctx, name: &str, keep: &str) {
    if name != keep && lamina_engine::is_system_name(name) {
        if let Err(e) = ctx.pool.delete_system_snapshot(&ctx.volume, name) {
            tracing::warn!(snapshot = name, error = %e, "a rebuild's snapshot was not deleted");
        }
    }
}

/// The replica on `node` now equals snapshot `to`: its new base, with
/// nothing uncertain (and `also` changed in the same record).
fn rebase(
    ctx: &Ctx,
    node: &str,
    old: &RebuildRec,
    to: &str,
    also: impl FnOnce(&mut ReplicaRec),
) -> Result<(), Fail> {
    stored(ctx.store.change_replica(&ctx.volume, node, |x| {
        if let Some(rb) = x.rebuild.as_mut() {
            rb.base = to.to_string();
            rb.uncertain.clear();
            rb.round = None;
        }
        also(x)
    }))?;
    drop_system(ctx, &old.base, to);
    Ok(())
}

/// Sorted, merged ranges.
fn merge(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for r in v.into_iter().filter(|r| r.0 < r.1) {
        match out.last_mut() {
            Some(l) if r.0 <= l.1 => l.1 = l.1.max(r.1),
            _ => out.push(r),
        }
    }
    out
}

/// What differs between snapshots `from` and `to` of the volume.
fn changed(ctx: &Ctx, from: &str, to: &str) -> Result<Vec<(u64, u64)>, Fail> {
    let d = engine(ctx.pool.diff(
        Some(&Target::snapshot(&ctx.volume, from)),
        &Target::snapshot(&ctx.volume, to),
    ))?;
    Ok(d.into_iter()
        .map(|e| (e.offset, e.offset + e.len))
        .collect())
}

/// Take replica `r`'s base: with no change in flight, what the front end
/// kept of what it missed, and a system snapshot of this node's replica.
fn take_base(
    ctx: &Ctx,
    front: &Front,
    here: &str,
    r: &ReplicaRec,
    generation: u64,
) -> Result<(), Fail> {
    let node = &r.node;
    let (kept, base) = front.replicated.quiesced(|healthy| {
        if !healthy.iter().any(|n| n == here) {
            return Err(here_faulted(here));
        }
        let m = io(front.replicated.take_missed(node))?;
        let b = system_snapshot(ctx, node)?;
        Ok::<_, Fail>((m, b))
    })?;
    // The instance of the replica's volume in the session that failed (the
    // one in the write set until it rejoins).
    let instance = front
        .remotes()
        .into_iter()
        .find(|(n, _)| n == node)
        .and_then(|(_, v)| v.instance());
    let size = engine(ctx.pool.volume_info_by_name(&ctx.volume))?.size;
    let all = vec![(0, size)];
    let ranges = |m: Missed| match m {
        Missed::Ranges(v) => v,
        _ => Vec::new(),
    };
    let too_many = kept.missed == Missed::TooMany || kept.unflushed == Missed::TooMany;
    let (uncertain, mut unflushed) = match (&r.rebuild, kept) {
        _ if too_many => (all, Vec::new()),
        // Rebuilt before, and out of the write set again (or its front end
        // restarted): what it may lack since its base, and what changed
        // since.
        (Some(old), k) => match since(ctx, old, &base) {
            Ok(mut d) => {
                d.extend(ranges(k.missed));
                let mut u = ranges(k.unflushed);
                // Still unsettled from before: held at the same instance
                // only.
                if old.instance.is_some() && old.instance == instance {
                    u.extend(old.unflushed.iter().copied());
                } else {
                    d.extend(old.unflushed.iter().copied());
                }
                (d, u)
            }
            Err(_) => (all, Vec::new()),
        },
        // Kept since its fault by this front end.
        (None, k) if r.tracked == generation && k.missed != Missed::NotKept => {
            (ranges(k.missed), ranges(k.unflushed))
        }
        // Faulted under an earlier front end that took no base: anything
        // may differ.
        (None, _) => (all, Vec::new()),
    };
    let mut uncertain = merge(uncertain);
    // Without an instance to find it at again, lost for all it knows.
    if instance.is_none() {
        uncertain = merge(uncertain.into_iter().chain(unflushed.drain(..)).collect());
    }
    let unflushed = merge(unflushed);
    tracing::info!(replica = %node, base = %base, uncertain = uncertain.len(),
        unflushed = unflushed.len(), "rebuild base taken");
    let old = r.rebuild.clone();
    stored(ctx.store.change_replica(&ctx.volume, node, |x| {
        let (sent, started) = x
            .rebuild
            .as_ref()
            .map(|b| (b.sent, b.started))
            .unwrap_or((0, now()));
        x.rebuild = Some(RebuildRec {
            base: base.clone(),
            uncertain,
            unflushed,
            instance,
            round: None,
            sent,
            started,
        });
    }))?;
    if let Some(old) = old {
        drop_system(ctx, &old.base, &base);
        if let Some(t) = old.round {
            drop_system(ctx, &t.target, &base);
        }
    }
    Ok(())
}

/// Where the replica may differ from snapshot `now`, by its record `old`:
/// what a round under way had not sent yet (below its cursor it equals
/// the round's target) and what changed from there to `now`, else its
/// uncertain ranges and what changed from its base to `now`.
fn since(ctx: &Ctx, old: &RebuildRec, now: &str) -> Result<Vec<(u64, u64)>, Fail> {
    if let Some(t) = &old.round {
        if ctx
            .pool
            .snapshot_info_by_name(&ctx.volume, &t.target)
            .is_ok()
        {
            let mut rest: Vec<(u64, u64)> = changed(ctx, &old.base, &t.target)?
                .into_iter()
                .chain(old.uncertain.iter().copied())
                .filter(|r| r.1 > t.cursor)
                .map(|(a, b)| (a.max(t.cursor), b))
                .collect();
            rest.extend(changed(ctx, &t.target, now)?);
            return Ok(rest);
        }
    }
    let mut d = changed(ctx, &old.base, now)?;
    d.extend(old.uncertain.iter().copied());
    Ok(d)
}

/// One piece to send: data read from the target, or zeros.
struct Piece {
    offset: u64,
    len: u64,
    data: bool,
}

/// What a round towards snapshot `to` sends, from base `rb`, in order:
/// the uncertain ranges and the diff, split by what `to` maps there.
fn pieces(ctx: &Ctx, rb: &RebuildRec, to: &str) -> Result<Vec<Piece>, Fail> {
    let mut ranges = changed(ctx, &rb.base, to)?;
    ranges.extend(rb.uncertain.iter().copied());
    let target = engine(ctx.pool.open_snapshot(&ctx.volume, to))?;
    let mut out = Vec::new();
    for (a, b) in merge(ranges) {
        for e in engine(target.extents(a, b - a))? {
            let data = e.kind == ExtentKind::Data;
            let step = if data { PIECE } else { ZEROS };
            let mut at = e.offset;
            while at < e.offset + e.len {
                let len = step.min(e.offset + e.len - at);
                out.push(Piece {
                    offset: at,
                    len,
                    data,
                });
                at += len;
            }
        }
    }
    Ok(out)
}

/// Bring the replica on `node` (session `v`) from its base to snapshot
/// `to`, from where a killed round towards `to` got; the bytes sent.
fn round(
    ctx: &Ctx,
    front: &Front,
    node: &str,
    v: &Arc<RemoteVolume>,
    rb: &RebuildRec,
    to: &str,
) -> Result<u64, Fail> {
    // A round towards another target stopped part way (its target deleted
    // meanwhile): what it sent is uncertain now, recorded with this round.
    let mut rb = rb.clone();
    if let Some(t) = rb.round.as_ref().filter(|t| t.target != to && t.cursor > 0) {
        let size = engine(ctx.pool.volume_info_by_name(&ctx.volume))?.size;
        let old = t.target.clone();
        let sent = changed(ctx, &rb.base, &old).unwrap_or_else(|_| vec![(0, size)]);
        let all = rb.uncertain.iter().copied().chain(sent).collect();
        rb.uncertain = merge(all);
        rb.round = None;
        let u = rb.uncertain.clone();
        stored(ctx.store.change_replica(&ctx.volume, node, |x| {
            if let Some(b) = x.rebuild.as_mut() {
                b.uncertain = u;
                b.round = None;
            }
        }))?;
        drop_system(ctx, &old, &rb.base);
    }
    let rb = &rb;
    let pieces = pieces(ctx, rb, to)?;
    let bytes: u64 = pieces.iter().filter(|p| p.data).map(|p| p.len).sum();
    let (mut cursor, mut done) = match &rb.round {
        Some(t) if t.target == to => (t.cursor, t.done),
        _ => (0, 0),
    };
    let source = ctx
        .exports
        .open_engine(&ctx.pool, &ctx.volume, Some(to))
        .map_err(|e| e.to_string())?;
    let record = |cursor: u64, done: u64, sent: u64| {
        stored(ctx.store.change_replica(&ctx.volume, node, |x| {
            if let Some(b) = x.rebuild.as_mut() {
                b.sent += sent;
                b.round = Some(RoundRec {
                    target: to.to_string(),
                    cursor,
                    bytes,
                    done,
                });
            }
        }))
    };
    record(cursor, done, 0)?;
    let mut sent = 0u64;
    let mut unrecorded = 0u64;
    let from = cursor;
    let mut send = || -> Result<(), Fail> {
        for p in pieces.iter().filter(|p| p.offset >= from) {
            if front.is_closed() {
                return Err("the front end stopped".into());
            }
            // Yield to the volumes' I/O, as transfers do (pacing.rs).
            if let Some(pace) = &ctx.pace {
                std::thread::sleep(pace.wait(if p.data { p.len } else { 64 }));
            }
            let op = if p.data {
                let buf = match io(wait(
                    &source,
                    IoOp::Read {
                        offset: p.offset,
                        buf: vec![0; p.len as usize],
                    },
                ))? {
                    IoDone::Read(b) => b,
                    _ => return Err("a read answered with something else".into()),
                };
                IoOp::Write {
                    offset: p.offset,
                    data: buf,
                    fua: false,
                }
            } else {
                IoOp::WriteZeroes {
                    offset: p.offset,
                    len: p.len,
                    may_trim: true,
                }
            };
            io(wait(&**v, op))?;
            if p.data {
                sent += p.len;
                unrecorded += p.len;
                done += p.len;
            }
            cursor = p.offset + p.len;
            if unrecorded >= RECORD_EVERY {
                // Durable on the replica before the cursor says so.
                io(wait(&**v, IoOp::Flush))?;
                record(cursor, done, unrecorded)?;
                unrecorded = 0;
            }
        }
        io(wait(&**v, IoOp::Flush))?;
        record(cursor, done, unrecorded)?;
        unrecorded = 0;
        Ok(())
    };
    if let Err(e) = send() {
        // What was sent since the last record was sent all the same (the
        // round resumes from that record): counted.
        let _ = ctx.store.change_replica(&ctx.volume, node, |x| {
            if let Some(b) = x.rebuild.as_mut() {
                b.sent += unrecorded;
            }
        });
        return Err(e);
    }
    tracing::info!(replica = %node, target = %to, sent, "rebuild round done");
    Ok(sent)
}

/// Record the replica on `node` healthy, its rebuild (begun at `started`,
/// `sent` bytes) ended: durable when it returns.
fn healthy_again(ctx: &Ctx, node: &str, sent: u64, started: i64) -> Result<(), Fail> {
    stored(ctx.store.change_replica(&ctx.volume, node, |x| {
        let ended = now();
        x.last_rebuild = Some(LastRebuild {
            sent,
            started,
            ended,
        });
        x.faulted = None;
        x.since = ended;
        x.tracked = 0;
        x.rebuild = None;
        x.missed_regions = None;
    }))
    .map(|_| ())
}

/// The last round (step 3): the replica in the write set from a snapshot
/// taken at one point of the write stream, what changed up to it copied
/// through the front end, then healthy.
fn last_round(
    ctx: &Ctx,
    front: &Front,
    here: &str,
    node: &str,
    v: Arc<RemoteVolume>,
) -> Result<(), Fail> {
    let _held = front.hold_snapshots();
    let rec = current(ctx, node)?;
    let rb = rec.rebuild.clone().ok_or("no base")?;
    if !rec.missed_snapshots.is_empty() {
        return Err("a snapshot was taken meanwhile: another round first".into());
    }
    let io_v: Arc<dyn BlockIo> = v.clone();
    let joined = front.replicated.quiesced(|healthy| {
        if !healthy.iter().any(|n| n == here) {
            return Err(here_faulted(here));
        }
        io(front.replicated.rejoin(node, io_v))?;
        system_snapshot(ctx, node)
    });
    let last = match joined {
        Ok(l) => l,
        Err(e) => {
            front.replicated.drop_rebuild(node);
            return Err(e);
        }
    };
    let copied = (|| {
        let mut ranges = changed(ctx, &rb.base, &last)?;
        ranges.extend(rb.uncertain.iter().copied());
        let mut sent = 0;
        for (a, b) in merge(ranges) {
            let mut at = a;
            while at < b {
                if front.is_closed() {
                    return Err("the front end stopped".to_string());
                }
                let len = PIECE.min(b - at);
                if io(front.replicated.copy(node, at, len))? {
                    sent += len;
                }
                at += len;
            }
        }
        Ok(sent)
    })();
    let done = copied.and_then(|sent| {
        // The copies are durable there before it counts as healthy: once
        // healthy, only the changes no flush covered count as what a crash
        // of its node could lose (lamina-replica's rule 10), and copies are
        // not changes.
        io(wait(&*v, IoOp::Flush))?;
        front.replicated.quiesced(|_| {
            if !front.replicated.is_rebuilding(node) {
                return Err("it failed a change while rebuilding".to_string());
            }
            ctx.crash_point("rebuild-before-healthy");
            healthy_again(ctx, node, rb.sent + sent, rb.started)?;
            ctx.crash_point("rebuild-before-promote");
            io(front.replicated.promote(node))
        })?;
        Ok(sent)
    });
    match done {
        Ok(sent) => {
            front.set_remote(node, v);
            drop_system(ctx, &rb.base, "");
            drop_system(ctx, &last, "");
            tracing::info!(replica = %node, sent = rb.sent + sent, "replica rebuilt: healthy");
            Ok(())
        }
        Err(e) => {
            // Out of the write set: what it misses is kept from now, and
            // the next base covers what this round left.
            front.replicated.drop_rebuild(node);
            drop_system(ctx, &last, &rb.base);
            Err(e)
        }
    }
}

/// Bring this node's own replica (`r`, faulted) back: with what it may
/// lack handed over at one point of the write stream, it rejoins the write
/// set (lamina-replica's rule 11), what it lacks is copied through the
/// front end from a healthy replica on another node (rule 12: ordered with
/// the writes, so a copy never puts older data over a newer write),
/// flushed here, and it is recorded healthy and made so with no change in
/// flight (rule 13).
///
/// What it lacks: the ranges the front end kept since its fault (rule 10),
/// and those an earlier attempt of this front end left uncopied
/// (`uncertain` in its record). What it answered that no flush covered is
/// not among them: its node is this one, and nothing here lost it (a pool
/// reopened would have restarted the front end too), so a flush here makes
/// it durable. Faulted under an earlier front end, or past the ranges rule
/// 10 keeps, anything may differ, and every byte is copied. Snapshots of
/// the volume are refused while it is faulted, so it missed none.
fn rebuild_here(ctx: &Ctx, front: &Front, r: &ReplicaRec, generation: u64) -> Result<(), Fail> {
    if let Some(f) = ctx.pool.failure() {
        return Err(format!("this node's pool: {f}"));
    }
    let room = crate::paths::fs_available(&ctx.pool_dir).unwrap_or(0);
    if room < ROOM {
        return Err(format!(
            "the file system of this node's pool has {room} bytes of room: waiting for {ROOM}"
        ));
    }
    let dev = ctx
        .exports
        .open_engine(&ctx.pool, &ctx.volume, None)
        .map_err(|e| e.to_string())?;
    io(dev.activate(generation))?;
    // What it answered unflushed before its fault, durable.
    io(wait(&dev, IoOp::Flush))?;
    let dev: Arc<dyn BlockIo> = Arc::new(dev);
    let size = engine(ctx.pool.volume_info_by_name(&ctx.volume))?.size;
    copy_through(ctx, front, r, generation, dev, size, false)
}

/// Bring faulted replica `r`, on another node, back for a front end that
/// holds no replica (docs/replicas.md, "A front end with no replica"):
/// there is no local snapshot to send rounds from, so it is brought back
/// as this node's own replica is, through the front end
/// ([`copy_through`]). Its session is opened and activated at the
/// generation first, and the snapshots deleted while it was out are
/// deleted there. What it answered that no flush covered counts as
/// missed: its daemon may have restarted since. A snapshot of the volume
/// is refused while a replica is out, so it missed none.
fn rebuild_remote(ctx: &Ctx, front: &Front, r: &ReplicaRec, generation: u64) -> Result<(), Fail> {
    let node = &r.node;
    let v = reach(ctx, r, generation)?;
    delete_pending(ctx, node, &v, &r.pending_deletes)?;
    let size = io(v.size())?;
    tracing::info!(replica = %node, "faulted replica answers: copying what it lacks through this front end");
    let v = Arc::new(v);
    front.set_remote(node, v.clone());
    copy_through(ctx, front, r, generation, v, size, true)
}

/// Bring faulted replica `r` back through the front end, its volume
/// reached by `dev` (activated at `generation`) of `size` bytes: it
/// rejoins the write set, what it lacks is copied, flushed there, and it
/// is recorded healthy and made so with no change in flight. With
/// `unflushed_lost`, what it answered that no flush covered before its
/// fault is copied too.
fn copy_through(
    ctx: &Ctx,
    front: &Front,
    r: &ReplicaRec,
    generation: u64,
    dev: Arc<dyn BlockIo>,
    size: u64,
    unflushed_lost: bool,
) -> Result<(), Fail> {
    let node = &r.node;
    // Snapshots are not held (they are refused while it is faulted, and
    // its promotion is quiesced): a replica removed meanwhile does not
    // wait for a copy of any length.
    let kept = front.replicated.quiesced(|healthy| {
        if healthy.is_empty() {
            return Err("no healthy replica to copy from".to_string());
        }
        // In the write set first: what it misses stops growing, and what
        // was kept is all it may lack.
        io(front.replicated.rejoin(node, dev.clone()))?;
        io(front.replicated.take_missed(node)).inspect_err(|_| front.replicated.drop_rebuild(node))
    })?;
    let old = r.rebuild.clone();
    // What it answered that no flush covered, when its node may have lost
    // it (None: more than is kept, so anything).
    let unflushed = match kept.unflushed {
        _ if !unflushed_lost => Some(Vec::new()),
        Missed::Ranges(v) => Some(v),
        Missed::NotKept => Some(Vec::new()),
        Missed::TooMany => None,
    };
    let ranges = match (kept.missed, unflushed) {
        // Faulted under this front end, or one whose missed regions this
        // front end's start put in what it keeps (`front::open`).
        (Missed::Ranges(v), Some(u)) if r.tracked == generation || r.missed_regions.is_some() => {
            let mut all = v;
            all.extend(u);
            all.extend(old.iter().flat_map(|b| b.uncertain.iter().copied()));
            // Regions end at a multiple of their size, maybe past the
            // volume's.
            merge(all)
                .into_iter()
                .map(|(a, b)| (a.min(size), b.min(size)))
                .filter(|(a, b)| a < b)
                .collect()
        }
        _ => vec![(0, size)],
    };
    let healthy_msg = if unflushed_lost {
        "replica rebuilt through this front end: healthy"
    } else {
        "this node's replica rebuilt: healthy"
    };
    let bytes: u64 = ranges.iter().map(|(a, b)| b - a).sum();
    let (sent0, started) = old
        .as_ref()
        .map(|b| (b.sent, b.started))
        .unwrap_or((0, now()));
    let record = |left: Vec<(u64, u64)>, done: u64, sent: u64| {
        stored(ctx.store.change_replica(&ctx.volume, node, |x| {
            x.rebuild = Some(RebuildRec {
                base: String::new(),
                uncertain: left,
                unflushed: Vec::new(),
                instance: None,
                round: Some(RoundRec {
                    target: String::new(),
                    cursor: 0,
                    bytes,
                    done,
                }),
                sent: sent0 + sent,
                started,
            });
        }))
    };
    tracing::info!(replica = %node, ranges = ranges.len(), bytes, "this node's replica rejoined: copying what it lacks");
    let mut sent = 0u64;
    let mut done = 0u64;
    // What is left to copy. Should this attempt stop, it goes back to what
    // the front end keeps the replica misses (the copies made stay in this
    // node's pool while the front end lives), and the record shows it.
    let mut left: std::collections::VecDeque<(u64, u64)> = ranges.iter().copied().collect();
    let copied = (|| {
        record(left.iter().copied().collect(), 0, 0)?;
        let mut unrecorded = 0u64;
        while let Some(&(at, b)) = left.front() {
            if front.is_closed() {
                return Err("the front end stopped".to_string());
            }
            let len = PIECE.min(b - at);
            let data = io(front.replicated.copy(node, at, len))?;
            if at + len == b {
                left.pop_front();
            } else {
                left[0].0 = at + len;
            }
            if data {
                sent += len;
            }
            done += len;
            unrecorded += len;
            if let Some(pace) = &ctx.pace {
                std::thread::sleep(pace.wait(if data { len } else { 64 }));
            }
            if unrecorded >= RECORD_EVERY {
                record(left.iter().copied().collect(), done, sent)?;
                unrecorded = 0;
            }
        }
        io(wait(&*dev, IoOp::Flush)).map(|_| ())
    })();
    let healthy = copied.and_then(|()| {
        front.replicated.quiesced(|_| {
            if !front.replicated.is_rebuilding(node) {
                return Err("it failed a change while rebuilding".to_string());
            }
            healthy_again(ctx, node, sent0 + sent, started)?;
            io(front.replicated.promote(node))
        })
    });
    match healthy {
        Ok(()) => {
            tracing::info!(replica = %node, sent = sent0 + sent, "{healthy_msg}");
            Ok(())
        }
        Err(e) => {
            // Out of the write set: what it misses is kept from now on,
            // with what this attempt had not copied.
            front.replicated.drop_rebuild(node);
            front.replicated.seed_missed(node, left.make_contiguous());
            Err(e)
        }
    }
}
