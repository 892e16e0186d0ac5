//! The pool's lock order, checked in debug builds. Every lock of the pool
//! is taken through [`hold`] with its [`Rank`] (the order is written out on
//! `Inner` in `pool.rs`); in a debug build each thread keeps the ranks it
//! holds, and taking a lock whose place in the order is not after every
//! lock the thread already holds panics, naming both, before it waits. So
//! every test that runs in debug checks the order on the paths it takes,
//! where a wrong order would otherwise show only as a rare deadlock. A
//! release build keeps nothing and checks nothing.
//!
//! This file owns the ranks and the check; it must not take a lock itself.

use std::ops::{Deref, DerefMut};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A lock's place in the pool's lock order, outermost first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Rank {
    /// A volume's or snapshot's gate; several only in ascending id.
    Gate,
    /// A block stripe; several only in ascending stripe index.
    Stripe,
    /// The page log (`Inner::wal`), the commit lock.
    Wal,
    /// The journal of index changes (`Inner::journal`).
    Journal,
    /// Copies home against a checkpoint (`Inner::homing`).
    Homing,
    /// The read barrier (`Inner::read_barrier`).
    ReadBarrier,
    /// The metadata mutex (`Inner::meta`).
    Meta,
    /// The table of flattens (`Inner::flatten`).
    Flatten,
    /// A flatten's error (`FlattenProgress::error`).
    FlattenError,
    /// A lock under which no other is taken.
    Leaf,
}

/// A guard taken in order: the lock's own guard, and in a debug build the
/// rank it holds for as long as it lives.
#[must_use = "a lock taken and let go at once orders nothing"]
pub(crate) struct Held<G> {
    guard: G,
    #[cfg(debug_assertions)]
    place: (Rank, u64),
}

/// Take a lock of rank `rank` (and, for a rank held several at once, key
/// `key`: a gate's id, a stripe's index; 0 otherwise) by running `take`.
/// In a debug build, first check that `(rank, key)` comes after every lock
/// this thread holds.
#[inline]
pub(crate) fn hold<G>(rank: Rank, key: u64, take: impl FnOnce() -> G) -> Held<G> {
    #[cfg(debug_assertions)]
    debug::enter(rank, key);
    #[cfg(not(debug_assertions))]
    let _ = (rank, key);
    Held {
        guard: take(),
        #[cfg(debug_assertions)]
        place: (rank, key),
    }
}

/// A gate (`Pool::gate`) of volume or snapshot `id`, shared (I/O).
pub(crate) fn gate_shared(gate: &RwLock<()>, id: u64) -> Held<RwLockReadGuard<'_, ()>> {
    hold(Rank::Gate, id, || {
        gate.read().unwrap_or_else(|p| p.into_inner())
    })
}

/// A gate of volume or snapshot `id`, exclusive (snapshot, revert,
/// expand, delete, a flatten's end).
pub(crate) fn gate_exclusive(gate: &RwLock<()>, id: u64) -> Held<RwLockWriteGuard<'_, ()>> {
    hold(Rank::Gate, id, || {
        gate.write().unwrap_or_else(|p| p.into_inner())
    })
}

impl<G> Deref for Held<G> {
    type Target = G;
    fn deref(&self) -> &G {
        &self.guard
    }
}

impl<G> DerefMut for Held<G> {
    fn deref_mut(&mut self) -> &mut G {
        &mut self.guard
    }
}

#[cfg(debug_assertions)]
impl<G> Drop for Held<G> {
    fn drop(&mut self) {
        debug::leave(self.place);
    }
}

#[cfg(debug_assertions)]
mod debug {
    use super::Rank;
    use std::cell::RefCell;

    thread_local! {
        /// What this thread holds, in the order taken.
        static HELD: RefCell<Vec<(Rank, u64)>> = const { RefCell::new(Vec::new()) };
    }

    /// Panics if `(rank, key)` is not after every place held; then records
    /// it (before the caller waits for the lock, so that a wrong order is
    /// reported even where it would deadlock).
    pub(super) fn enter(rank: Rank, key: u64) {
        let wrong = HELD.with(|h| {
            let mut h = h.borrow_mut();
            let last = h.iter().max().copied();
            h.push((rank, key));
            last.filter(|&l| l >= (rank, key))
        });
        if let Some(held) = wrong {
            // Forget it again, so that the guards dropped while unwinding
            // find what they expect.
            leave((rank, key));
            panic!(
                "lock order: {rank:?} (key {key}) taken while holding {:?} (key {}); \
                 the order is on `Inner` in crates/engine/src/pool.rs",
                held.0, held.1
            );
        }
    }

    /// Forget the last place equal to `place` (guards may be dropped in
    /// any order).
    pub(super) fn leave(place: (Rank, u64)) {
        // A guard dropped while the thread's locals are torn down has
        // nothing left to update.
        let _ = HELD.try_with(|h| {
            let mut h = h.borrow_mut();
            if let Some(i) = h.iter().rposition(|&p| p == place) {
                h.remove(i);
            }
        });
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn locks_taken_in_order_pass_and_are_let_go_in_any_order() {
        let (a, b, c) = (Mutex::new(()), Mutex::new(()), Mutex::new(()));
        let g1 = hold(Rank::Gate, 1, || a.lock().unwrap());
        let g2 = hold(Rank::Gate, 2, || b.lock().unwrap());
        let m = hold(Rank::Meta, 0, || c.lock().unwrap());
        drop(g1);
        drop(m);
        // Gate 2 is still held: a stripe may come after it.
        let s = hold(Rank::Stripe, 7, || a.lock().unwrap());
        drop((s, g2));
        // Nothing held: anything goes.
        let _g = hold(Rank::Gate, 0, || a.lock().unwrap());
    }

    #[test]
    #[should_panic(expected = "lock order: Wal (key 0) taken while holding Meta (key 0)")]
    fn an_outer_lock_under_an_inner_one_panics() {
        let (a, b) = (Mutex::new(()), Mutex::new(()));
        let _m = hold(Rank::Meta, 0, || a.lock().unwrap());
        let _w = hold(Rank::Wal, 0, || b.lock().unwrap());
    }

    #[test]
    #[should_panic(expected = "lock order: Gate (key 3) taken while holding Gate (key 5)")]
    fn gates_in_descending_id_panic() {
        let (a, b) = (Mutex::new(()), Mutex::new(()));
        let _g5 = hold(Rank::Gate, 5, || a.lock().unwrap());
        let _g3 = hold(Rank::Gate, 3, || b.lock().unwrap());
    }

    #[test]
    #[should_panic(expected = "lock order: Leaf (key 0) taken while holding Leaf (key 0)")]
    fn two_leaves_panic() {
        let (a, b) = (Mutex::new(()), Mutex::new(()));
        let _x = hold(Rank::Leaf, 0, || a.lock().unwrap());
        let _y = hold(Rank::Leaf, 0, || b.lock().unwrap());
    }
}
