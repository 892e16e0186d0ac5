//! A replicated volume's front end: one [`BlockIo`] made of the volume's
//! replicas, each itself a [`BlockIo`] (the local engine volume in
//! process, a remote one over the network), so that the NBD server and the
//! CSI node path serve a replicated volume exactly as a local one. This
//! crate owns how each operation is fanned out and when it completes, and
//! the healthy set as the front end sees it; it must not know where a
//! replica lives or how it is reached (its [`BlockIo`] does), nor where the
//! healthy set is recorded (its [`Membership`] does: the daemon's store
//! today, the Kubernetes API next).
//!
//! # Rules (docs/volume-io.md, "Replicated volumes")
//!
//! 1. **Writes, trims, write-zeroes and flushes go to every healthy replica**
//!    and complete when all of them have answered: successfully if at least
//!    one replica succeeded and every replica that failed is faulted.
//! 2. **A replica that fails a change is faulted before the change
//!    completes**: taken out of the healthy set in memory (nothing is sent
//!    to it or read from it after that), then recorded through
//!    [`Membership::fault`], which returns once the record is durable. Only
//!    then does the change complete, so no acknowledged write is missing
//!    from a replica the record still calls healthy; for the same reason
//!    no change completes while a fault's record is on its way, not even
//!    one sent only to the healthy replicas. If the record fails, the change
//!    fails ([`IoErrorKind::Io`]), and the record is tried again before the
//!    next change completes.
//! 3. **A change every replica failed fails**, and faults none of them: no
//!    replica holds it, so none is behind the others.
//! 4. **Reads and block status go to the first healthy replica** (the
//!    local one, put first); one that fails is faulted, as for a change, and
//!    the read is asked of the next.
//! 5. **Fenced is final**: a replica answering [`IoErrorKind::Fenced`] says
//!    another front end took the volume over at a higher generation. The
//!    operation fails with it, no replica is faulted for it, and every later
//!    operation fails the same way.
//! 6. **No healthy replica left**: every operation fails with
//!    [`IoErrorKind::Io`] naming the volume.
//! 7. **Activation** ([`BlockIo::activate`]) activates every healthy
//!    replica at the generation; one refusing with Fenced fails it, one
//!    failing otherwise is faulted. An activation that succeeds ends rule
//!    5's refusal: the front end holds the volume again, at a generation
//!    every healthy replica accepted.
//! 8. **Overlapping changes in one order**: a change that overlaps one in
//!    flight (or one waiting) waits until that one has completed, and is
//!    then sent to every replica; so all replicas apply overlapping
//!    changes in the order they were submitted, and read alike. Changes
//!    that do not overlap, and flushes, are not held.
//! 9. **Quiesced**: [`Replicated::quiesced`] holds every change submitted
//!    from its call on (they wait, in order, as in rule 8), waits for every
//!    change in flight to complete, and only then runs its work (a
//!    snapshot of every replica at one point of the write stream); the
//!    held changes are sent once it returns.
//! 10. **What a faulted replica may have missed is kept**: from its fault
//!     (or from the front end's start, for one given as [`Start::Faulted`]
//!     with `keep_missed`) the range of every change in flight then and of
//!     every change sent since; and, apart, of every change it answered
//!     that no flush had covered at its fault (a replica that crashed may
//!     have lost those: they were not durable; past [`MISSED_LIMIT`] of
//!     them, the regions rule 14 recorded dirty instead). For a rebuilding
//!     replica that leaves the write set, those count with the first: they
//!     may predate its rejoin, and never have reached it. Both are kept
//!     until [`Replicated::take_missed`] hands them over (inside
//!     [`Replicated::quiesced`], with the snapshot that becomes the
//!     replica's rebuild base) as [`Kept`]: the caller sends the second
//!     part again unless it knows the replica lost nothing (its node still
//!     the instance it failed at, and a flush there since). Past
//!     [`MISSED_LIMIT`] ranges only [`Missed::TooMany`] is kept.
//! 11. **A rebuilding replica gets every change, and answers no read**:
//!     [`Replicated::rejoin`] puts a faulted replica back in the write set
//!     (a new `BlockIo` for it) without making it healthy. A change
//!     completes when it answered too, but its answer counts for nothing
//!     (rule 1 and 3 count the healthy ones); one it fails drops it out of
//!     the write set again, with no record (the record already says it is
//!     not healthy).
//! 12. **A copy to a rebuilding replica is a change**: [`Replicated::copy`]
//!     reads a range from the first healthy replica and writes it to the
//!     rebuilding one (as write-zeroes when it reads as zeros), ordered
//!     with overlapping changes as rule 8 orders them, so a copy never
//!     puts older data over a newer change.
//! 13. **Promotion inside a quiesced call**: [`Replicated::promote`] makes a
//!     rebuilding replica healthy; the caller records it healthy first,
//!     both with no change in flight, so no change the replica failed can
//!     be acknowledged between the record and the promotion.
//! 14. **Write intent**: before a change to a region (of [`REGION`] bytes)
//!     not yet recorded dirty is sent, the region is recorded dirty
//!     through [`Membership::dirty`], durably; a region is recorded clean
//!     again (at a flush, at most every [`CLEAN_AFTER`], or at
//!     [`Replicated::close`]) only when no change there is in flight or
//!     uncovered by a flush. So after a crash of the front end, the regions
//!     where healthy replicas may differ (writes no flush covered, which
//!     each may have kept or lost) are all recorded dirty, and the next
//!     front end makes them alike before it serves.
//! 15. **Places for replicas added later**: a place given as
//!     [`Start::Vacant`] is no replica: it is neither written nor read nor
//!     listed. [`Replicated::add`] puts a new replica there, faulted and
//!     recorded so by the caller, with nothing kept of what it misses (its
//!     rebuild copies everything); [`Replicated::remove`] takes a faulted
//!     one out, and its place is vacant again. Both run inside
//!     [`Replicated::quiesced`], so no change in flight was sent to a place
//!     that changed hands.
//! 16. **What a replica out of the healthy set may lack, recorded by
//!     region**: when its fault is recorded, the regions of what rule 10
//!     keeps for it then (the changes in flight, and those no flush
//!     covered; past [`MISSED_LIMIT`], every region recorded dirty) go in
//!     the record of its fault ([`Membership::fault`]); and while it is out
//!     of the healthy set (faulted or rebuilding), before a change to a
//!     region not yet recorded so for it is sent, that region is
//!     ([`Membership::missed`]). A record that fails fails the change, as
//!     in rule 14. So once its fault is recorded, those regions hold every
//!     change it may lack, through any crash of the front end: for a
//!     replica whose rebuild has no snapshot to start from (the front
//!     end's own), they are what it copies.
//!
//! A replica on another node is a `lamina_transfer::replica::RemoteVolume`
//! (a session of the transfer protocol); whatever fails that session fails
//! its calls with [`IoErrorKind::Io`], and rule 2 faults it.

use lamina_blockio::{BlockIo, Caps, Completion, IoDone, IoError, IoErrorKind, IoOp};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// At most this many ranges are kept of what a faulted replica missed
/// (rule 10); past it, [`Missed::TooMany`].
pub const MISSED_LIMIT: usize = 1 << 16;

/// Where the healthy set is recorded.
pub trait Membership: Send + Sync + 'static {
    /// Record, durably, that replica `index` (in the order given to
    /// [`Replicated::new`]) is faulted: it may miss acknowledged writes,
    /// there in regions `at_risk` (rule 16: the regions of the changes in
    /// flight at its fault, and of those no flush covered), and in those
    /// [`Membership::missed`] records from then on. Returns once the record
    /// survives a crash; an error if it could not be made. Called at most
    /// once per replica by one front end (again after an error), from the
    /// thread of the operation that found the fault (it may block).
    fn fault(&self, index: usize, name: &str, reason: &str, at_risk: &[u64])
        -> Result<(), IoError>;

    /// Record, durably, that regions `regions` (indices of [`REGION`]-byte
    /// ranges) may differ between the healthy replicas until a flush covers
    /// what is written there (rule 14). The default records nothing.
    fn dirty(&self, _regions: &[u64]) -> Result<(), IoError> {
        Ok(())
    }

    /// Record that regions `regions` are alike on every healthy replica
    /// again (their writes flushed).
    fn clean(&self, _regions: &[u64]) -> Result<(), IoError> {
        Ok(())
    }

    /// Record, durably, that replica `index` (`name`), out of the healthy
    /// set, may lack changes in regions `regions` too (rule 16). The
    /// default records nothing.
    fn missed(&self, _index: usize, _name: &str, _regions: &[u64]) -> Result<(), IoError> {
        Ok(())
    }
}

/// The size of a region of the write-intent record (rule 14).
pub const REGION: u64 = 64 << 20;

/// A region marked dirty stays so at least this long after it is
/// flushed, so that a busy region is not marked and cleared on every flush.
pub const CLEAN_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// One replica: a name for errors and records, and its volume.
pub struct Replica {
    pub name: String,
    pub io: Arc<dyn BlockIo>,
}

impl Replica {
    /// A replica that is not connected (one faulted before the front end
    /// started): every operation sent to it fails. [`Replicated::rejoin`]
    /// gives it a volume.
    pub fn absent(name: &str) -> Replica {
        Replica {
            name: name.to_string(),
            io: Arc::new(Absent(name.to_string())),
        }
    }

    /// A place for a replica added later ([`Replicated::add`]), started as
    /// [`Start::Vacant`].
    pub fn vacant() -> Replica {
        Replica::absent("")
    }
}

/// A replica with no connection ([`Replica::absent`]).
struct Absent(String);

impl BlockIo for Absent {
    fn size(&self) -> Result<u64, IoError> {
        Err(self.error())
    }
    fn read_only(&self) -> bool {
        false
    }
    fn caps(&self) -> Caps {
        Caps::ALL
    }
    fn activate(&self, _generation: u64) -> Result<(), IoError> {
        Err(self.error())
    }
    fn submit(&self, op: IoOp, done: Completion) {
        done(Err(self.error().at(op.describe())))
    }
}

impl Absent {
    fn error(&self) -> IoError {
        IoError::new(
            IoErrorKind::Io,
            format!("replica {} is not connected", self.0),
        )
    }
}

/// How a replica starts when the front end does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    Healthy,
    /// Faulted, and recorded so already: out of the healthy set from the
    /// start. With `keep_missed`, what it misses from now on is kept (rule
    /// 10): the front end knows it held everything until now.
    Faulted {
        reason: String,
        keep_missed: bool,
    },
    /// No replica: a place [`Replicated::add`] fills (give it
    /// [`Replica::vacant`]). Neither written nor read, and not listed.
    Vacant,
}

/// What a faulted replica may have missed (rule 10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missed {
    /// Not kept (a healthy replica, or one whose ranges were taken).
    NotKept,
    /// The ranges `[start, end)` of changes it may not hold, in the order
    /// sent, adjacent ones merged.
    Ranges(Vec<(u64, u64)>),
    /// More than [`MISSED_LIMIT`] ranges: any byte may differ.
    TooMany,
}

impl Missed {
    fn add(&mut self, r: (u64, u64)) {
        let Missed::Ranges(v) = self else { return };
        if let Some(last) = v.last_mut() {
            if r.0 <= last.1 && last.0 <= r.1 {
                *last = (last.0.min(r.0), last.1.max(r.1));
                return;
            }
        }
        if v.len() >= MISSED_LIMIT {
            *self = Missed::TooMany;
        } else {
            v.push(r);
        }
    }
}

/// What [`Replicated::take_missed`] hands over of what a faulted replica
/// may lack (rule 10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// Changes it may never have applied: in flight at its fault, sent
    /// since, or added by [`Replicated::seed_missed`].
    pub missed: Missed,
    /// Changes it answered that no flush had covered at its fault: it
    /// holds them unless its node lost what it had not made durable (a
    /// restart, a crash).
    pub unflushed: Missed,
}

impl Kept {
    /// Nothing kept.
    pub const NONE: Kept = Kept {
        missed: Missed::NotKept,
        unflushed: Missed::NotKept,
    };

    /// Both parts as one: what the replica may lack if its node lost what
    /// it had not made durable. Not kept if neither was; ranges sorted and
    /// merged. (The tests' view: the daemon records the parts apart.)
    #[cfg(test)]
    pub(crate) fn all(self) -> Missed {
        match (self.missed, self.unflushed) {
            (Missed::TooMany, _) | (_, Missed::TooMany) => Missed::TooMany,
            (Missed::NotKept, Missed::NotKept) => Missed::NotKept,
            (a, b) => {
                let mut v: Vec<(u64, u64)> = [a, b]
                    .into_iter()
                    .flat_map(|m| match m {
                        Missed::Ranges(v) => v,
                        _ => Vec::new(),
                    })
                    .collect();
                v.sort_unstable();
                let mut out = Missed::Ranges(Vec::with_capacity(v.len()));
                for r in v {
                    out.add(r);
                }
                out
            }
        }
    }
}

/// Changes sent since the last flush that covers them (a flush covers
/// the changes completed before it was sent).
#[derive(Default)]
struct Unflushed {
    /// By change id: its range, and whether it completed.
    changes: BTreeMap<u64, (u64, u64, bool)>,
    /// More than [`MISSED_LIMIT`] were: any range may be unflushed, until a
    /// flush sent with no change in flight completes.
    overflow: bool,
}

/// A flush on its way: the changes it covers, and whether it ends an
/// overflow.
struct Covers {
    ids: Vec<u64>,
    all: bool,
}

/// A replica as the front end holds it: its volume can be replaced when
/// it rejoins.
struct Slot {
    /// Empty while vacant; changed only with no change in flight.
    name: RwLock<String>,
    io: RwLock<Arc<dyn BlockIo>>,
}

impl Slot {
    fn name(&self) -> String {
        self.name.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn is(&self, name: &str) -> bool {
        !name.is_empty() && *self.name.read().unwrap_or_else(|p| p.into_inner()) == name
    }
}

/// A replica's state as the front end sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Healthy,
    /// Out of the healthy set: why.
    Faulted(String),
    /// Back in the write set, not healthy yet (rule 11).
    Rebuilding,
}

struct Shared {
    name: String,
    replicas: Vec<Slot>,
    /// Per replica; changed under `faulting`, read without it.
    healthy: Vec<AtomicBool>,
    /// Per replica: in the write set while not healthy (rule 11); changed
    /// under `faulting`.
    rebuilding: Vec<AtomicBool>,
    /// Per replica: what it may have missed (rule 10), and whether that is
    /// kept (read without the lock on every change).
    missed: Vec<Mutex<Missed>>,
    /// Per replica: what it had answered unflushed at its fault (rule 10).
    unflushed_at_fault: Vec<Mutex<Missed>>,
    keeping: Vec<AtomicBool>,
    /// Changes no flush has covered yet (rule 10).
    unflushed: Mutex<Unflushed>,
    /// Regions recorded dirty (rule 14), and when they were last cleaned.
    marked: Mutex<(std::collections::BTreeSet<u64>, std::time::Instant)>,
    /// Per replica: regions recorded as ones it may lack (rule 16) since it
    /// last left the healthy set.
    missed_regions: Vec<Mutex<std::collections::BTreeSet<u64>>>,
    /// Held while a fault is recorded: each replica is recorded once.
    faulting: Mutex<()>,
    /// Why each replica left the healthy set (a short lock, never held
    /// while a record is made).
    reasons: Mutex<Vec<Option<String>>>,
    /// Whether each one's fault is durable.
    recorded: Vec<AtomicBool>,
    fenced: AtomicBool,
    /// The Fenced answer that set `fenced` (it names the new holder's
    /// generation).
    fenced_by: Mutex<String>,
    /// Rule 8 and 9.
    order: Mutex<Order>,
    /// Signalled when the last change in flight completes (rule 9).
    drained: std::sync::Condvar,
    /// Replicas out of the healthy set whose fault is not durable yet (a
    /// record in progress, or one that failed).
    unrecorded: AtomicUsize,
    membership: Arc<dyn Membership>,
}

/// A volume made of replicas (see the crate's rules).
pub struct Replicated {
    shared: Arc<Shared>,
    caps: Caps,
    read_only: bool,
}

impl Replicated {
    /// The volume `name` of `replicas`, all healthy, of one size; reads go
    /// to the first healthy one in this order.
    pub fn new(
        name: &str,
        replicas: Vec<Replica>,
        membership: Arc<dyn Membership>,
    ) -> Result<Replicated, IoError> {
        let replicas = replicas.into_iter().map(|r| (r, Start::Healthy)).collect();
        Replicated::with_states(name, replicas, membership)
    }

    /// The volume `name` of `replicas`, each starting as said; reads go to
    /// the first healthy one in this order. A faulted one is usually
    /// [`Replica::absent`].
    pub fn with_states(
        name: &str,
        replicas: Vec<(Replica, Start)>,
        membership: Arc<dyn Membership>,
    ) -> Result<Replicated, IoError> {
        if !replicas.iter().any(|(_, s)| *s == Start::Healthy) {
            return Err(IoError::new(
                IoErrorKind::Invalid,
                format!("volume {name} needs at least one replica"),
            ));
        }
        let caps = replicas
            .iter()
            .filter(|(_, s)| *s == Start::Healthy)
            .map(|(r, _)| r.io.caps())
            .reduce(Caps::and)
            .unwrap_or(Caps::ALL);
        let read_only = replicas
            .iter()
            .filter(|(_, s)| *s == Start::Healthy)
            .any(|(r, _)| r.io.read_only());
        let n = replicas.len();
        let healthy = replicas
            .iter()
            .map(|(_, s)| AtomicBool::new(*s == Start::Healthy))
            .collect();
        let reasons = replicas
            .iter()
            .map(|(_, s)| match s {
                Start::Healthy => None,
                Start::Faulted { reason, .. } => Some(reason.clone()),
                Start::Vacant => Some("vacant".to_string()),
            })
            .collect();
        let keep: Vec<bool> = replicas
            .iter()
            .map(|(_, s)| {
                matches!(
                    s,
                    Start::Faulted {
                        keep_missed: true,
                        ..
                    }
                )
            })
            .collect();
        let kept = || -> Vec<Mutex<Missed>> {
            keep.iter()
                .map(|&k| {
                    Mutex::new(if k {
                        Missed::Ranges(Vec::new())
                    } else {
                        Missed::NotKept
                    })
                })
                .collect()
        };
        let (missed, unflushed_at_fault) = (kept(), kept());
        let recorded = replicas
            .iter()
            .map(|(_, s)| AtomicBool::new(*s != Start::Healthy))
            .collect();
        let replicas = replicas
            .into_iter()
            .map(|(r, st)| Slot {
                name: RwLock::new(if st == Start::Vacant {
                    String::new()
                } else {
                    r.name
                }),
                io: RwLock::new(r.io),
            })
            .collect();
        Ok(Replicated {
            shared: Arc::new(Shared {
                name: name.to_string(),
                replicas,
                healthy,
                rebuilding: (0..n).map(|_| AtomicBool::new(false)).collect(),
                missed,
                unflushed_at_fault,
                keeping: keep.into_iter().map(AtomicBool::new).collect(),
                unflushed: Mutex::new(Unflushed::default()),
                marked: Mutex::new((Default::default(), std::time::Instant::now())),
                missed_regions: (0..n).map(|_| Mutex::default()).collect(),
                faulting: Mutex::new(()),
                reasons: Mutex::new(reasons),
                recorded,
                fenced: AtomicBool::new(false),
                fenced_by: Mutex::new(String::new()),
                order: Mutex::new(Order::default()),
                drained: std::sync::Condvar::new(),
                unrecorded: AtomicUsize::new(0),
                membership,
            }),
            caps,
            read_only,
        })
    }

    /// Run `work` with no change in flight (rule 9): changes submitted from
    /// now on wait, those in flight complete first, then `work` runs with
    /// the names of the healthy replicas, and the held changes are sent
    /// once it returns. Blocks; must not be called from a completion of
    /// this volume.
    pub fn quiesced<T>(&self, work: impl FnOnce(&[String]) -> T) -> T {
        let s = &self.shared;
        {
            let mut o = s.order.lock().unwrap_or_else(|p| p.into_inner());
            o.paused += 1;
            while !o.running.is_empty() {
                o = s.drained.wait(o).unwrap_or_else(|p| p.into_inner());
            }
        }
        let healthy: Vec<String> = s
            .healthy()
            .into_iter()
            .map(|i| s.replicas[i].name())
            .collect();
        let out = work(&healthy);
        let ready = {
            let mut o = s.order.lock().unwrap_or_else(|p| p.into_inner());
            o.paused -= 1;
            o.ready()
        };
        for w in ready {
            run(s, w.id, w.change, w.done);
        }
        out
    }

    /// Take replica `name` out of the healthy set for `reason` and record
    /// it (rule 2), as a failed change would: for work done outside the
    /// data path that the replica failed (a snapshot).
    pub fn fault(&self, name: &str, reason: &str) -> Result<(), IoError> {
        let s = &self.shared;
        match s.replicas.iter().position(|r| r.is(name)) {
            Some(i) => s.fault(i, reason),
            None => Err(IoError::new(
                IoErrorKind::Invalid,
                format!("volume {} has no replica {name}", s.name),
            )),
        }
    }

    /// Each replica's name and state, in order: faulted from the moment it
    /// is out of the healthy set (its record may still be on its way).
    pub fn states(&self) -> Vec<(String, State)> {
        let s = &self.shared;
        let reasons = s.reasons().clone();
        s.replicas
            .iter()
            .zip(reasons.iter())
            .enumerate()
            .filter_map(|(i, (r, why))| {
                let name = r.name();
                if name.is_empty() {
                    return None;
                }
                let state = match why {
                    None => State::Healthy,
                    Some(_) if s.rebuilding[i].load(Ordering::SeqCst) => State::Rebuilding,
                    Some(w) => State::Faulted(w.clone()),
                };
                Some((name, state))
            })
            .collect()
    }

    fn index(&self, name: &str) -> Result<usize, IoError> {
        let s = &self.shared;
        s.replicas.iter().position(|r| r.is(name)).ok_or_else(|| {
            IoError::new(
                IoErrorKind::Invalid,
                format!("volume {} has no replica {name}", s.name),
            )
        })
    }

    /// Hand over what replica `name` may have missed since its fault, and
    /// stop keeping it (rule 10). Call it inside [`Replicated::quiesced`],
    /// with the snapshot those ranges are read from.
    pub fn take_missed(&self, name: &str) -> Result<Kept, IoError> {
        let i = self.index(name)?;
        let s = &self.shared;
        let mut m = s.missed[i].lock().unwrap_or_else(|p| p.into_inner());
        s.keeping[i].store(false, Ordering::SeqCst);
        let missed = std::mem::replace(&mut *m, Missed::NotKept);
        Ok(Kept {
            missed,
            unflushed: s.take_unflushed_at_fault(i),
        })
    }

    /// The front end stops serving: every region whose writes a flush
    /// covered is recorded clean now (rule 14). Call it after the last
    /// flush.
    pub fn close(&self) {
        self.shared.clean(true);
    }

    /// Add `ranges` to what faulted replica `name` missed, if that is kept
    /// (rule 10): ranges it may lack that the front end learnt of
    /// elsewhere (regions an earlier front end left dirty).
    pub fn seed_missed(&self, name: &str, ranges: &[(u64, u64)]) {
        if let Ok(i) = self.index(name) {
            let mut m = self.shared.missed[i]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            for r in ranges {
                m.add(*r);
            }
        }
    }

    /// Whether what replica `name` misses is being kept (rule 10): it left
    /// the write set since its ranges were last taken.
    pub fn is_keeping(&self, name: &str) -> bool {
        self.index(name)
            .is_ok_and(|i| self.shared.keeping[i].load(Ordering::SeqCst))
    }

    /// Put faulted replica `name` back in the write set with volume `io`,
    /// rebuilding (rule 11): every change from now on goes to it too. Call
    /// it inside [`Replicated::quiesced`], with the snapshot its rebuild
    /// copies up to.
    pub fn rejoin(&self, name: &str, io: Arc<dyn BlockIo>) -> Result<(), IoError> {
        let i = self.index(name)?;
        let s = &self.shared;
        let _serial = s.serial();
        s.faulted_and_recorded(i, name)?;
        *s.replicas[i].io.write().unwrap_or_else(|p| p.into_inner()) = io;
        s.rebuilding[i].store(true, Ordering::SeqCst);
        tracing::info!(volume = %s.name, replica = name, "replica rejoined, rebuilding");
        Ok(())
    }

    /// Whether replica `name` is rebuilding: in the write set, and no
    /// change it failed since it rejoined.
    pub fn is_rebuilding(&self, name: &str) -> bool {
        self.index(name)
            .is_ok_and(|i| self.shared.rebuilding[i].load(Ordering::SeqCst))
    }

    /// Take rebuilding replica `name` out of the write set (its rebuild
    /// stopped); it stays faulted.
    pub fn drop_rebuild(&self, name: &str) {
        if let Ok(i) = self.index(name) {
            let e = IoError::new(IoErrorKind::Io, "its rebuild stopped");
            self.shared.drop_rebuilding(i, &e);
        }
    }

    /// Make rebuilding replica `name` healthy (rule 13): call it inside
    /// [`Replicated::quiesced`], after recording it healthy.
    pub fn promote(&self, name: &str) -> Result<(), IoError> {
        let i = self.index(name)?;
        let s = &self.shared;
        let _serial = s.serial();
        if !s.rebuilding[i].load(Ordering::SeqCst) {
            return Err(IoError::new(
                IoErrorKind::Io,
                format!(
                    "replica {name} of volume {} failed a change while rebuilding",
                    s.name
                ),
            ));
        }
        s.reasons()[i] = None;
        s.recorded[i].store(false, Ordering::SeqCst);
        s.rebuilding[i].store(false, Ordering::SeqCst);
        s.missed_regions(i).clear();
        s.healthy[i].store(true, Ordering::SeqCst);
        tracing::info!(volume = %s.name, replica = name, "replica rebuilt, healthy");
        Ok(())
    }

    /// Copy `[offset, offset + len)` from the first healthy replica to
    /// rebuilding replica `name` (rule 12). Ordered with overlapping
    /// changes; blocks until done. At most [`COPY_MAX`] bytes. Whether it
    /// sent data (false: zeros, as write-zeroes).
    pub fn copy(&self, name: &str, offset: u64, len: u64) -> Result<bool, IoError> {
        let to = self.index(name)?;
        if len == 0 || len > COPY_MAX {
            return Err(IoError::new(
                IoErrorKind::Invalid,
                format!("a copy of {len} bytes (1 to {COPY_MAX})"),
            ));
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let done: Completion = Box::new(move |r| {
            let _ = tx.send(r);
        });
        let change = Change::Copy { to, offset, len };
        let s = &self.shared;
        let admitted = s
            .order
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .admit(change, done);
        if let Some((id, change, done)) = admitted {
            run(s, id, change, done);
        }
        rx.recv()
            .unwrap_or_else(|_| Err(IoError::new(IoErrorKind::Io, "the copy was dropped")))
            .map(|d| matches!(d, IoDone::Write(_)))
    }
}

impl Replicated {
    /// Put new replica `name` in a vacant place ([`Start::Vacant`]),
    /// faulted for `reason` and recorded so (the caller recorded it): out
    /// of the write set until it is rebuilt, what it misses not kept (it
    /// holds nothing yet: its rebuild copies everything). Call it inside
    /// [`Replicated::quiesced`].
    pub fn add(&self, name: &str, reason: &str) -> Result<(), IoError> {
        let s = &self.shared;
        let _serial = s.serial();
        if name.is_empty() || self.index(name).is_ok() {
            return Err(IoError::new(
                IoErrorKind::Invalid,
                format!("volume {} has a replica {name:?} already", s.name),
            ));
        }
        let Some(i) = s.replicas.iter().position(|r| r.name().is_empty()) else {
            return Err(IoError::new(
                IoErrorKind::Invalid,
                format!("volume {} has no room for another replica", s.name),
            ));
        };
        *s.replicas[i].io.write().unwrap_or_else(|p| p.into_inner()) =
            Arc::new(Absent(name.to_string()));
        *s.missed[i].lock().unwrap_or_else(|p| p.into_inner()) = Missed::NotKept;
        s.take_unflushed_at_fault(i);
        s.missed_regions(i).clear();
        s.keeping[i].store(false, Ordering::SeqCst);
        s.rebuilding[i].store(false, Ordering::SeqCst);
        s.recorded[i].store(true, Ordering::SeqCst);
        s.reasons()[i] = Some(reason.to_string());
        *s.replicas[i]
            .name
            .write()
            .unwrap_or_else(|p| p.into_inner()) = name.to_string();
        tracing::info!(volume = %s.name, replica = name, "replica added, faulted until rebuilt");
        Ok(())
    }

    /// Take replica `name` out of the volume: its place becomes vacant. It
    /// must be faulted and recorded so (fault it first); a rebuilding one
    /// leaves the write set. Call it inside [`Replicated::quiesced`].
    pub fn remove(&self, name: &str) -> Result<(), IoError> {
        let i = self.index(name)?;
        let s = &self.shared;
        let _serial = s.serial();
        s.faulted_and_recorded(i, name)?;
        s.rebuilding[i].store(false, Ordering::SeqCst);
        s.keeping[i].store(false, Ordering::SeqCst);
        *s.missed[i].lock().unwrap_or_else(|p| p.into_inner()) = Missed::NotKept;
        s.take_unflushed_at_fault(i);
        s.missed_regions(i).clear();
        s.reasons()[i] = Some("vacant".to_string());
        *s.replicas[i].io.write().unwrap_or_else(|p| p.into_inner()) =
            Arc::new(Absent(String::new()));
        s.replicas[i]
            .name
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        tracing::info!(volume = %s.name, replica = name, "replica removed");
        Ok(())
    }
}

/// The largest [`Replicated::copy`].
pub const COPY_MAX: u64 = 8 << 20;

/// What the order (rules 8 and 12) holds: a caller's change, or a copy to a
/// rebuilding replica.
enum Change {
    Io(IoOp),
    Copy { to: usize, offset: u64, len: u64 },
}

impl Change {
    fn range(&self) -> Option<(u64, u64)> {
        match self {
            Change::Io(op) => range(op),
            Change::Copy { offset, len, .. } => Some((*offset, offset.saturating_add(*len))),
        }
    }
}

/// Send change `id` on its way: a caller's to the replicas, a copy to its
/// replica.
fn run(s: &Arc<Shared>, id: u64, change: Change, done: Completion) {
    match change {
        Change::Io(op) => dispatch(s, id, op, done),
        Change::Copy { to, offset, len } => copy_to(s, id, to, offset, len, done),
    }
}

/// Rule 12: read from the first healthy replica (rule 4), write to `to`.
fn copy_to(s: &Arc<Shared>, id: u64, to: usize, offset: u64, len: u64, done: Completion) {
    let s2 = s.clone();
    let write = move |s: Arc<Shared>, op: IoOp, done: Completion| {
        if !s.rebuilding[to].load(Ordering::SeqCst) {
            let e = IoError::new(
                IoErrorKind::Io,
                format!("replica {} is not rebuilding", s.replicas[to].name()),
            );
            return complete(&s, id, done, Err(e));
        }
        let s3 = s.clone();
        s.io(to).submit(
            op,
            Box::new(move |r| {
                if let Err(e) = &r {
                    s3.drop_rebuilding(to, e);
                }
                complete(&s3, id, done, r)
            }),
        )
    };
    let read = IoOp::Read {
        offset,
        buf: vec![0; len as usize],
    };
    read_from(
        s.clone(),
        read,
        Box::new(move |r| match r {
            Ok(IoDone::Read(data)) if data.iter().all(|&b| b == 0) => write(
                s2,
                IoOp::WriteZeroes {
                    offset,
                    len,
                    may_trim: true,
                },
                done,
            ),
            Ok(IoDone::Read(data)) => write(
                s2,
                IoOp::Write {
                    offset,
                    data,
                    fua: false,
                },
                done,
            ),
            Ok(_) => {
                let e = IoError::new(IoErrorKind::Io, "a read answered with something else");
                complete(&s2, id, done, Err(e))
            }
            Err(e) => complete(&s2, id, done, Err(e)),
        }),
    );
}

impl Shared {
    fn io(&self, i: usize) -> Arc<dyn BlockIo> {
        self.replicas[i]
            .io
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Rule 11: a rebuilding replica that failed a change leaves the write
    /// set.
    fn drop_rebuilding(&self, i: usize, e: &IoError) {
        let _serial = self.serial();
        if self.rebuilding[i].load(Ordering::SeqCst) {
            self.begin_keeping(i);
            self.rebuilding[i].store(false, Ordering::SeqCst);
            // Changes no flush covered may predate its rejoin, and never
            // have reached it: all count as missed.
            self.start_keeping(i, false);
            tracing::warn!(volume = %self.name, replica = %self.replicas[i].name(), error = %e,
                "rebuilding replica failed a change: out of the write set");
        }
    }

    /// Rule 10: keep, from now on, the range of every change sent (before
    /// the replica leaves a set: see [`Shared::start_keeping`]).
    fn begin_keeping(&self, i: usize) {
        let mut m = self.missed[i].lock().unwrap_or_else(|p| p.into_inner());
        if *m == Missed::NotKept {
            *m = Missed::Ranges(Vec::new());
        }
        let mut u = self.unflushed_at_fault[i]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if *u == Missed::NotKept {
            *u = Missed::Ranges(Vec::new());
        }
        self.keeping[i].store(true, Ordering::SeqCst);
    }

    /// Rule 10: from now on keep what replica `i` misses, starting with
    /// every change in flight.
    ///
    /// Call [`Shared::begin_keeping`] first, before the replica leaves the
    /// healthy set or the write set: a change that leaves it out does so
    /// after, and `dispatch` keeps its range (it reads its targets before
    /// it keeps); one sent to it before is in flight or unflushed, gathered
    /// here. Ranges kept twice do no harm. With `healthy` (it leaves the
    /// healthy set, so every change no flush covered was sent to it), those
    /// it answered are kept apart from the ones it missed.
    fn start_keeping(&self, i: usize, healthy: bool) {
        let running: Vec<(u64, u64)> = {
            let o = self.order.lock().unwrap_or_else(|p| p.into_inner());
            o.running.iter().map(|&(_, a, b)| (a, b)).collect()
        };
        // Answered by every replica: held by this one unless its node
        // lost what it had not made durable. Not answered yet: in flight.
        let (answered, in_flight, overflow) = {
            let u = self.unflushed();
            let (done, not): (Vec<&(u64, u64, bool)>, Vec<_>) =
                u.changes.values().partition(|c| c.2);
            let r = |v: Vec<&(u64, u64, bool)>| -> Vec<(u64, u64)> {
                v.into_iter().map(|&(a, b, _)| (a, b)).collect()
            };
            (r(done), r(not), u.overflow)
        };
        // Too many to keep one by one: the regions recorded dirty hold
        // every one of them (rule 14).
        let regions: Vec<(u64, u64)> = if overflow {
            self.marked()
                .0
                .iter()
                .map(|x| (x * REGION, (x + 1) * REGION))
                .collect()
        } else {
            Vec::new()
        };
        let mut sure: Vec<(u64, u64)> = running.into_iter().chain(in_flight).collect();
        let mut held: Vec<(u64, u64)> = answered.into_iter().chain(regions).collect();
        if !healthy {
            sure.append(&mut held);
        }
        sure.sort_unstable();
        let mut m = self.missed[i].lock().unwrap_or_else(|p| p.into_inner());
        for r in sure {
            m.add(r);
        }
        drop(m);
        held.sort_unstable();
        let mut u = self.unflushed_at_fault[i]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for r in held {
            u.add(r);
        }
    }

    /// Rule 10: hand over what replica `i` had answered unflushed at its
    /// fault, and keep it no more.
    fn take_unflushed_at_fault(&self, i: usize) -> Missed {
        let mut u = self.unflushed_at_fault[i]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        std::mem::replace(&mut *u, Missed::NotKept)
    }

    fn marked(
        &self,
    ) -> std::sync::MutexGuard<'_, (std::collections::BTreeSet<u64>, std::time::Instant)> {
        self.marked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rule 14: the regions of range `r` recorded dirty before a change
    /// there is sent.
    fn mark(&self, r: (u64, u64)) -> Result<(), IoError> {
        if r.1 <= r.0 {
            return Ok(());
        }
        let want: Vec<u64> = (r.0 / REGION..=(r.1 - 1) / REGION).collect();
        let new: Vec<u64> = {
            let m = self.marked();
            want.into_iter().filter(|x| !m.0.contains(x)).collect()
        };
        if new.is_empty() {
            return Ok(());
        }
        self.membership.dirty(&new).map_err(|e| {
            IoError::new(
                IoErrorKind::Io,
                format!(
                    "volume {}: the write intent could not be recorded: {}",
                    self.name, e.message
                ),
            )
        })?;
        self.marked().0.extend(new);
        Ok(())
    }

    fn missed_regions(
        &self,
        i: usize,
    ) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<u64>> {
        self.missed_regions[i]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Rule 16: the regions replica `i`, out of the healthy set, may lack
    /// as rule 10 keeps them (every region recorded dirty, if it kept too
    /// many to list).
    fn at_risk(&self, i: usize) -> Vec<u64> {
        let mut out = std::collections::BTreeSet::new();
        let mut too_many = false;
        for kept in [&self.missed[i], &self.unflushed_at_fault[i]] {
            match &*kept.lock().unwrap_or_else(|p| p.into_inner()) {
                Missed::NotKept => {}
                Missed::Ranges(v) => {
                    for &(a, b) in v.iter().filter(|(a, b)| a < b) {
                        out.extend(a / REGION..=(b - 1) / REGION);
                    }
                }
                Missed::TooMany => too_many = true,
            }
        }
        // Taken apart from the locks above.
        if too_many {
            out.extend(self.marked().0.iter().copied());
        }
        out.into_iter().collect()
    }

    /// Rule 16: `regions` recorded as ones replica `i` may lack, those not
    /// recorded yet.
    fn record_missed(&self, i: usize, regions: &[u64]) -> Result<(), IoError> {
        let new: Vec<u64> = {
            let m = self.missed_regions(i);
            regions.iter().filter(|x| !m.contains(x)).copied().collect()
        };
        if new.is_empty() {
            return Ok(());
        }
        let name = self.replicas[i].name();
        self.membership.missed(i, &name, &new).map_err(|e| {
            IoError::new(
                IoErrorKind::Io,
                format!(
                    "volume {}: what replica {name} misses could not be recorded: {}",
                    self.name, e.message
                ),
            )
        })?;
        self.missed_regions(i).extend(new);
        Ok(())
    }

    /// Rule 16: before a change to range `r` is sent, its regions recorded
    /// for every replica out of the healthy set.
    fn mark_missed(&self, r: (u64, u64)) -> Result<(), IoError> {
        if r.1 <= r.0 {
            return Ok(());
        }
        for i in 0..self.replicas.len() {
            let vacant = || {
                self.replicas[i]
                    .name
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_empty()
            };
            if self.healthy[i].load(Ordering::SeqCst) || vacant() {
                continue;
            }
            let want: Vec<u64> = (r.0 / REGION..=(r.1 - 1) / REGION).collect();
            self.record_missed(i, &want)?;
        }
        Ok(())
    }

    /// Rule 14: record clean every marked region with no change in flight
    /// or uncovered by a flush; unless `now`, at most every
    /// [`CLEAN_AFTER`].
    fn clean(&self, now: bool) {
        let mut m = self.marked();
        if m.0.is_empty() || (!now && m.1.elapsed() < CLEAN_AFTER) {
            return;
        }
        let regions = |a: u64, b: u64| a / REGION..=(b.max(a + 1) - 1) / REGION;
        let mut busy = std::collections::BTreeSet::new();
        for &(_, a, b) in &self.order.lock().unwrap_or_else(|p| p.into_inner()).running {
            busy.extend(regions(a, b));
        }
        {
            let u = self.unflushed();
            if u.overflow {
                return;
            }
            for &(a, b, _) in u.changes.values() {
                busy.extend(regions(a, b));
            }
        }
        let done: Vec<u64> = m.0.iter().filter(|x| !busy.contains(x)).copied().collect();
        m.1 = std::time::Instant::now();
        if done.is_empty() {
            return;
        }
        match self.membership.clean(&done) {
            Ok(()) => {
                for x in done {
                    m.0.remove(&x);
                }
            }
            Err(e) => {
                tracing::warn!(volume = %self.name, error = %e, "regions not recorded clean: they are made alike at the next start")
            }
        }
    }

    fn unflushed(&self) -> std::sync::MutexGuard<'_, Unflushed> {
        self.unflushed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Change `id` of range `r` is sent: unflushed until a flush covers it.
    fn sent(&self, id: u64, r: (u64, u64)) {
        let mut u = self.unflushed();
        if u.overflow {
            return;
        }
        if u.changes.len() >= MISSED_LIMIT {
            u.overflow = true;
            u.changes.clear();
            return;
        }
        u.changes.insert(id, (r.0, r.1, false));
    }

    /// A flush is sent: the changes it covers.
    fn covers(&self) -> Covers {
        let quiet = self
            .order
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .running
            .is_empty();
        let u = self.unflushed();
        Covers {
            ids: u
                .changes
                .iter()
                .filter(|(_, c)| c.2)
                .map(|(id, _)| *id)
                .collect(),
            all: u.overflow && quiet,
        }
    }

    /// A flush completed on every replica it was sent to.
    fn flushed(&self, c: Covers) {
        let mut u = self.unflushed();
        for id in c.ids {
            u.changes.remove(&id);
        }
        if c.all {
            u.overflow = false;
        }
    }

    /// Rule 10: keep change range `r` for every faulted replica that keeps
    /// what it missed.
    fn keep_missed(&self, r: (u64, u64)) {
        for (i, k) in self.keeping.iter().enumerate() {
            if k.load(Ordering::SeqCst) {
                self.missed[i]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .add(r);
            }
        }
    }

    fn serial(&self) -> std::sync::MutexGuard<'_, ()> {
        self.faulting.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn reasons(&self) -> std::sync::MutexGuard<'_, Vec<Option<String>>> {
        self.reasons.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn recorded(&self, i: usize) -> bool {
        self.recorded[i].load(Ordering::SeqCst)
    }

    /// Replica `i` (`name`) is out of the healthy set and recorded so:
    /// else an error (rejoin and remove take only such a one).
    fn faulted_and_recorded(&self, i: usize, name: &str) -> Result<(), IoError> {
        if self.healthy[i].load(Ordering::SeqCst) || !self.recorded(i) {
            return Err(IoError::new(
                IoErrorKind::Invalid,
                format!(
                    "replica {name} of volume {} is not faulted and recorded so",
                    self.name
                ),
            ));
        }
        Ok(())
    }

    /// Rule 5: every later operation fails as `e` did.
    fn fence(&self, e: &IoError) {
        *self.fenced_by.lock().unwrap_or_else(|p| p.into_inner()) = e.message.clone();
        self.fenced.store(true, Ordering::SeqCst);
    }

    fn healthy(&self) -> Vec<usize> {
        (0..self.replicas.len())
            .filter(|&i| self.healthy[i].load(Ordering::SeqCst))
            .collect()
    }

    fn unavailable(&self) -> IoError {
        if self.fenced.load(Ordering::SeqCst) {
            let by = self.fenced_by.lock().unwrap_or_else(|p| p.into_inner());
            return IoError::new(
                IoErrorKind::Fenced,
                format!(
                    "volume {} was taken over by a front end of a higher generation: {by}",
                    self.name
                ),
            );
        }
        IoError::new(
            IoErrorKind::Io,
            format!("volume {} has no healthy replica left", self.name),
        )
    }

    /// Rule 2: out of the healthy set, then recorded; Ok once recorded
    /// (now or by an earlier fault of the same replica).
    fn fault(&self, i: usize, reason: &str) -> Result<(), IoError> {
        let _serial = self.serial();
        if self.recorded(i) {
            return Ok(());
        }
        if self.healthy[i].load(Ordering::SeqCst) {
            // Rule 10: every change in flight may be missing from it, and
            // every one from now on is.
            self.begin_keeping(i);
            self.healthy[i].store(false, Ordering::SeqCst);
            self.start_keeping(i, true);
            self.unrecorded.fetch_add(1, Ordering::SeqCst);
            self.reasons()[i] = Some(reason.to_string());
            tracing::warn!(volume = %self.name, replica = %self.replicas[i].name(), %reason, "replica faulted");
        }
        self.record(i)
    }

    /// Record replica `i`'s fault (out of the healthy set, not recorded);
    /// the caller holds `serial`.
    fn record(&self, i: usize) -> Result<(), IoError> {
        let name = &self.replicas[i].name();
        let reason = self.reasons()[i].clone().unwrap_or_default();
        let at_risk = self.at_risk(i);
        match self.membership.fault(i, name, &reason, &at_risk) {
            Ok(()) => {
                self.missed_regions(i).extend(at_risk);
                self.recorded[i].store(true, Ordering::SeqCst);
                self.unrecorded.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            }
            // Stays out of the healthy set in memory; the record is tried
            // again before the next change completes.
            Err(e) => Err(IoError::new(
                IoErrorKind::Io,
                format!(
                    "volume {}: replica {name} failed ({reason}) and that could not be recorded: {}",
                    self.name, e.message
                ),
            )),
        }
    }

    /// Before a change is acknowledged: every replica out of the healthy
    /// set is recorded (a record in progress is waited for, one that failed
    /// is tried again). A change sent only to the healthy ones could
    /// otherwise be acknowledged while the record still calls a replica
    /// that never got it healthy.
    fn all_recorded(&self) -> Result<(), IoError> {
        if self.unrecorded.load(Ordering::SeqCst) == 0 {
            return Ok(());
        }
        let _serial = self.serial();
        for i in 0..self.replicas.len() {
            if !self.healthy[i].load(Ordering::SeqCst) && !self.recorded(i) {
                self.record(i)?;
            }
        }
        Ok(())
    }
}

/// Changes in flight by range, and those waiting for an overlapping one
/// (rule 8), in submission order.
#[derive(Default)]
struct Order {
    /// Quiesced calls running (rule 9): while above 0, every change waits.
    paused: usize,
    next: u64,
    /// (id, start, end) of each change sent to the replicas.
    running: Vec<(u64, u64, u64)>,
    waiting: VecDeque<Waiting>,
}

struct Waiting {
    id: u64,
    start: u64,
    end: u64,
    change: Change,
    done: Completion,
}

/// The bytes a change covers; none for a flush.
fn range(op: &IoOp) -> Option<(u64, u64)> {
    match op {
        IoOp::Write { offset, data, .. } => {
            Some((*offset, offset.saturating_add(data.len() as u64)))
        }
        IoOp::Trim { offset, len } | IoOp::WriteZeroes { offset, len, .. } => {
            Some((*offset, offset.saturating_add(*len)))
        }
        _ => None,
    }
}

fn overlap(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

impl Order {
    /// Take change `op` in: Some(id) to send it now, None if it waits.
    fn admit(&mut self, change: Change, done: Completion) -> Option<(u64, Change, Completion)> {
        let id = self.next;
        self.next += 1;
        let Some(r) = change.range() else {
            return Some((id, change, done));
        };
        let busy = self.paused > 0
            || self.running.iter().any(|&(_, a, b)| overlap(r, (a, b)))
            || self.waiting.iter().any(|w| overlap(r, (w.start, w.end)));
        if busy {
            self.waiting.push_back(Waiting {
                id,
                start: r.0,
                end: r.1,
                change,
                done,
            });
            return None;
        }
        self.running.push((id, r.0, r.1));
        Some((id, change, done))
    }

    /// Change `id` completed: the waiting changes it let go, now running.
    fn finish(&mut self, id: u64) -> Vec<Waiting> {
        self.running.retain(|r| r.0 != id);
        self.ready()
    }

    /// The waiting changes nothing holds back any more, now running.
    fn ready(&mut self) -> Vec<Waiting> {
        let mut ready = Vec::new();
        if self.paused > 0 {
            return ready;
        }
        let mut i = 0;
        while i < self.waiting.len() {
            let w = (self.waiting[i].start, self.waiting[i].end);
            let blocked = self.running.iter().any(|&(_, a, b)| overlap(w, (a, b)))
                || self
                    .waiting
                    .iter()
                    .take(i)
                    .any(|x| overlap(w, (x.start, x.end)));
            if blocked {
                i += 1;
                continue;
            }
            let Some(w) = self.waiting.remove(i) else {
                break;
            };
            self.running.push((w.id, w.start, w.end));
            ready.push(w);
        }
        ready
    }
}

/// Change `id`'s outcome to its caller, then the changes it held back sent.
fn complete(shared: &Arc<Shared>, id: u64, done: Completion, r: Result<IoDone, IoError>) {
    if let Some(c) = shared.unflushed().changes.get_mut(&id) {
        c.2 = true;
    }
    let ready = {
        let mut o = shared.order.lock().unwrap_or_else(|p| p.into_inner());
        let ready = o.finish(id);
        if o.running.is_empty() {
            shared.drained.notify_all();
        }
        ready
    };
    done(r);
    for w in ready {
        run(shared, w.id, w.change, w.done);
    }
}

/// Send change `id` to every healthy replica.
fn dispatch(s: &Arc<Shared>, id: u64, op: IoOp, done: Completion) {
    if s.fenced.load(Ordering::SeqCst) {
        let e = s.unavailable().at(op.describe());
        return complete(s, id, done, Err(e));
    }
    // Its targets are read before its range is kept (rule 10): a replica
    // that leaves a set starts keeping first, so a change that leaves it
    // out keeps its range for it.
    let mut targets = s.healthy();
    let rebuilding: Vec<usize> = (0..s.replicas.len())
        .filter(|&i| s.rebuilding[i].load(Ordering::SeqCst))
        .collect();
    if targets.is_empty() {
        let e = s.unavailable().at(op.describe());
        return complete(s, id, done, Err(e));
    }
    if let Some(r) = range(&op) {
        if let Err(e) = s.mark(r).and_then(|()| s.mark_missed(r)) {
            return complete(s, id, done, Err(e.at(op.describe())));
        }
        s.keep_missed(r);
        s.sent(id, r);
    }
    let covers = matches!(op, IoOp::Flush).then(|| s.covers());
    targets.extend(rebuilding.iter().copied());
    let fan = Arc::new(Mutex::new(Fan {
        shared: s.clone(),
        id,
        remaining: targets.len(),
        rebuilding,
        dropped: Vec::new(),
        covers,
        ok: None,
        failed: Vec::new(),
        done: Some(done),
    }));
    let last = targets.len() - 1;
    let mut op = Some(op);
    for (n, i) in targets.into_iter().enumerate() {
        // The last replica takes the caller's buffer; the others copies.
        let this = if n == last {
            op.take().expect("the operation is taken once, last")
        } else {
            op.as_ref().expect("the operation is still here").again()
        };
        let fan = fan.clone();
        s.io(i)
            .submit(this, Box::new(move |r| fan_done(&fan, i, r)));
    }
}

/// One change sent to several replicas: the caller's completion runs once
/// all answered (rules 1 to 3, 5).
struct Fan {
    shared: Arc<Shared>,
    id: u64,
    remaining: usize,
    /// Targets that are rebuilding: their answers count for nothing (rule
    /// 11).
    rebuilding: Vec<usize>,
    /// Rebuilding targets that failed it.
    dropped: Vec<(usize, IoError)>,
    /// A flush's: what it covers.
    covers: Option<Covers>,
    ok: Option<IoDone>,
    failed: Vec<(usize, IoError)>,
    done: Option<Completion>,
}

fn fan_done(fan: &Arc<Mutex<Fan>>, i: usize, r: Result<IoDone, IoError>) {
    let finished = {
        let mut f = fan.lock().unwrap_or_else(|p| p.into_inner());
        f.remaining -= 1;
        let rebuilding = f.rebuilding.contains(&i);
        match r {
            Ok(d) if !rebuilding => {
                f.ok.get_or_insert(d);
            }
            Ok(_) => {}
            // Rule 11: out of the write set, after the lock.
            Err(e) if rebuilding && e.kind != IoErrorKind::Fenced => f.dropped.push((i, e)),
            Err(e) => f.failed.push((i, e)),
        }
        if f.remaining > 0 {
            return;
        }
        for (i, e) in std::mem::take(&mut f.dropped) {
            f.shared.drop_rebuilding(i, &e);
        }
        (
            f.shared.clone(),
            f.id,
            f.ok.take(),
            std::mem::take(&mut f.failed),
            f.done.take(),
            f.covers.take(),
        )
    };
    // Outside the lock: recording a fault blocks, and the completion may
    // submit again.
    let (shared, id, ok, failed, done, covers) = finished;
    let Some(done) = done else { return };
    let r = settle(&shared, ok, failed);
    // Every replica it went to that is still in the set flushed: what it
    // covers is durable on each (those that failed it were faulted above,
    // and kept it as missed).
    if let (Ok(_), Some(c)) = (&r, covers) {
        shared.flushed(c);
        shared.clean(false);
    }
    complete(&shared, id, done, r);
}

fn settle(
    shared: &Shared,
    ok: Option<IoDone>,
    failed: Vec<(usize, IoError)>,
) -> Result<IoDone, IoError> {
    if let Some((_, e)) = failed.iter().find(|(_, e)| e.kind == IoErrorKind::Fenced) {
        shared.fence(e);
        return Err(e.clone());
    }
    let Some(ok) = ok else {
        // Rule 3: nobody holds it.
        return Err(failed
            .into_iter()
            .next()
            .map(|(_, e)| e)
            .unwrap_or_else(|| shared.unavailable()));
    };
    for (i, e) in &failed {
        shared.fault(*i, &e.to_string())?;
    }
    shared.all_recorded()?;
    Ok(ok)
}

/// Rule 4: ask the first healthy replica; on a failure, fault it and ask
/// the next.
fn read_from(shared: Arc<Shared>, op: IoOp, done: Completion) {
    if shared.fenced.load(Ordering::SeqCst) {
        return done(Err(shared.unavailable().at(op.describe())));
    }
    let Some(&i) = shared.healthy().first() else {
        return done(Err(shared.unavailable().at(op.describe())));
    };
    // What to ask the next replica if this one fails: built then, so that
    // a read allocates no spare buffer on its way.
    let is_read = matches!(op, IoOp::Read { .. });
    let (_, offset, len) = op.describe();
    let s = shared.clone();
    shared.io(i).submit(
        op,
        Box::new(move |r| match r {
            Ok(d) => done(Ok(d)),
            Err(e) if e.kind == IoErrorKind::Fenced => {
                s.fence(&e);
                done(Err(e))
            }
            // Out of range or not supported is the request's fault, the
            // same on every replica.
            Err(e) if matches!(e.kind, IoErrorKind::Invalid | IoErrorKind::NotSupported) => {
                done(Err(e))
            }
            Err(e) => match s.fault(i, &e.to_string()) {
                Ok(()) => {
                    let again = if is_read {
                        IoOp::Read {
                            offset,
                            buf: vec![0; len as usize],
                        }
                    } else {
                        IoOp::BlockStatus { offset, len }
                    };
                    read_from(s, again, done)
                }
                Err(f) => done(Err(f.at((e.op, e.offset, e.len)))),
            },
        }),
    );
}

impl BlockIo for Replicated {
    fn size(&self) -> Result<u64, IoError> {
        let s = &self.shared;
        let i = *s.healthy().first().ok_or_else(|| s.unavailable())?;
        s.io(i).size()
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn caps(&self) -> Caps {
        self.caps
    }

    fn activate(&self, generation: u64) -> Result<(), IoError> {
        let s = &self.shared;
        let mut activated = 0;
        for i in s.healthy() {
            match s.io(i).activate(generation) {
                Ok(()) => activated += 1,
                Err(e) if e.kind == IoErrorKind::Fenced => {
                    s.fence(&e);
                    return Err(e);
                }
                Err(e) if e.kind == IoErrorKind::NotSupported => return Err(e),
                Err(e) => s.fault(i, &e.to_string())?,
            }
        }
        if activated == 0 {
            return Err(s.unavailable().at(("activate", 0, 0)));
        }
        // A generation newer than ours cleared by this activation is not
        // possible: the replicas refused with Fenced above.
        s.fenced.store(false, Ordering::SeqCst);
        Ok(())
    }

    fn submit(&self, op: IoOp, done: Completion) {
        let s = &self.shared;
        if matches!(op, IoOp::Read { .. } | IoOp::BlockStatus { .. }) {
            return read_from(s.clone(), op, done);
        }
        let admitted = s
            .order
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .admit(Change::Io(op), done);
        if let Some((id, change, done)) = admitted {
            run(s, id, change, done);
        }
    }
}

#[cfg(test)]
mod tests;
