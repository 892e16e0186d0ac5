//! Activation generations: how a volume fences a writer that was taken over.
//!
//! A front end opens a volume for writing at a generation `g` (a number its
//! orchestrator raises on every takeover). The volume keeps the highest
//! generation any holder has activated it at, durably, and refuses every
//! request from a holder of a lower one with [`IoErrorKind::Fenced`]. So a
//! front end that was failed over, and does not know it yet, cannot write
//! over its successor, even across a restart of the volume's process.
//!
//! The pieces: a [`Fence`] per volume (the highest generation, the requests
//! in flight by generation, and where the highest is saved, a
//! [`GenerationStore`]); a [`Holder`] per handle (its own generation, 0
//! until it is activated); an [`Admitted`] guard per request, held until the
//! request completes. A volume implementation asks its holder to admit each
//! request before it starts it and keeps the guard until it completes.
//!
//! Rules (docs/volume-io.md states them for readers of the contract):
//! - `activate(g)` with `g` below the highest is refused and changes nothing.
//! - With `g` above it, `g` is saved (durable when the store returns) before
//!   anything else sees it; a failed save changes nothing.
//! - `g` equal to the highest is accepted: it is the same holder coming back
//!   (its own restart). Generations are the orchestrator's to keep unique.
//! - `activate(g)` returns only once every request admitted under a lower
//!   generation has completed, so nothing of the old holder lands after it.
//!   Requests admitted after the new highest is set are checked against it.

use crate::{IoError, IoErrorKind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};

/// Where a volume keeps the highest generation it has seen.
pub trait GenerationStore: Send + Sync + 'static {
    /// The highest generation saved; 0 if none ever was.
    fn load(&self) -> Result<u64, IoError>;
    /// Save `generation` (higher than any saved before); return only once it
    /// survives a crash.
    fn save(&self, generation: u64) -> Result<(), IoError>;
}

/// A generation store that forgets at a restart: for volumes that do not
/// outlive their process (in-memory test volumes).
#[derive(Debug, Default)]
pub struct InMemory(AtomicU64);

impl GenerationStore for InMemory {
    fn load(&self) -> Result<u64, IoError> {
        Ok(self.0.load(Ordering::SeqCst))
    }
    fn save(&self, generation: u64) -> Result<(), IoError> {
        self.0.store(generation, Ordering::SeqCst);
        Ok(())
    }
}

/// One handle's share of the fence: its generation and its requests in
/// flight.
#[derive(Default)]
struct Place {
    generation: AtomicU64,
    in_flight: AtomicU64,
}

/// One volume's generation fence, shared by all its handles.
///
/// Admitting a request takes no lock (it is on every request's path): the
/// request counts itself in flight, then reads the highest generation; an
/// activation sets the highest, then reads the counts. All of it sequentially
/// consistent, so at least one of the two sees the other: the request is
/// refused, or the activation waits for it.
pub struct Fence {
    /// The volume's name, for errors.
    name: String,
    highest: AtomicU64,
    /// Every holder's place (dead ones are dropped as new ones come), and
    /// the lock activations take, one at a time.
    places: Mutex<Vec<Weak<Place>>>,
    /// Activations waiting for requests to drain.
    waiting: AtomicUsize,
    drained: Condvar,
    store: Box<dyn GenerationStore>,
}

impl Fence {
    /// The fence of volume `name`, at the highest generation `store` holds.
    pub fn open(name: &str, store: Box<dyn GenerationStore>) -> Result<Arc<Fence>, IoError> {
        let highest = store.load()?;
        Ok(Arc::new(Fence {
            name: name.to_string(),
            highest: AtomicU64::new(highest),
            places: Mutex::new(Vec::new()),
            waiting: AtomicUsize::new(0),
            drained: Condvar::new(),
            store,
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Weak<Place>>> {
        self.places.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The highest generation activated so far.
    pub fn highest(&self) -> u64 {
        self.highest.load(Ordering::SeqCst)
    }

    fn fenced(&self, generation: u64, highest: u64) -> IoError {
        IoError::new(
            IoErrorKind::Fenced,
            format!(
                "{} is held at generation {highest}; this holder's generation {generation} was superseded",
                self.name
            ),
        )
    }

    /// Raise the highest generation to `generation` (see the module's
    /// rules). Blocks until every request of a lower generation completed.
    fn raise(&self, generation: u64) -> Result<(), IoError> {
        let mut places = self.lock();
        let highest = self.highest();
        if generation < highest {
            return Err(self.fenced(generation, highest));
        }
        if generation > highest {
            self.store.save(generation)?;
            self.highest.store(generation, Ordering::SeqCst);
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        loop {
            let busy = places.iter().filter_map(Weak::upgrade).any(|p| {
                p.generation.load(Ordering::SeqCst) < generation
                    && p.in_flight.load(Ordering::SeqCst) > 0
            });
            if !busy {
                break;
            }
            places = self.drained.wait(places).unwrap_or_else(|p| p.into_inner());
        }
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A request let through the fence; drop it when the request completes.
#[must_use = "the request counts as in flight until this is dropped"]
pub struct Admitted<'a> {
    holder: &'a Holder,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let h = self.holder;
        h.place.in_flight.fetch_sub(1, Ordering::SeqCst);
        if h.fence.waiting.load(Ordering::SeqCst) > 0 {
            // Under the lock, so an activation between its check and its
            // wait cannot miss this.
            let _places = h.fence.lock();
            h.fence.drained.notify_all();
        }
    }
}

/// One handle's place at a volume's fence: its generation (0 until it is
/// activated) and its requests in flight.
pub struct Holder {
    fence: Arc<Fence>,
    place: Arc<Place>,
}

impl Holder {
    pub fn new(fence: Arc<Fence>) -> Holder {
        let place = Arc::new(Place::default());
        {
            let mut places = fence.lock();
            places.retain(|p| p.strong_count() > 0);
            places.push(Arc::downgrade(&place));
        }
        Holder { fence, place }
    }

    /// Hold `generation` from now on (see the module's rules). Must not be
    /// called while this thread holds an [`Admitted`] of a lower generation.
    pub fn activate(&self, generation: u64) -> Result<(), IoError> {
        self.fence.raise(generation)?;
        self.place.generation.store(generation, Ordering::SeqCst);
        Ok(())
    }

    /// This handle's generation.
    pub fn generation(&self) -> u64 {
        self.place.generation.load(Ordering::SeqCst)
    }

    /// Let one request through, or refuse it as fenced. Keep what it
    /// returns until the request has completed.
    pub fn admit(&self) -> Result<Admitted<'_>, IoError> {
        self.place.in_flight.fetch_add(1, Ordering::SeqCst);
        let admitted = Admitted { holder: self };
        let (generation, highest) = (self.generation(), self.fence.highest());
        if generation < highest {
            drop(admitted);
            return Err(self.fence.fenced(generation, highest));
        }
        Ok(admitted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn a_lower_generation_is_refused_and_an_activation_waits_for_the_old_holders_requests() {
        let fence = Fence::open("vol", Box::new(InMemory::default())).unwrap();
        let old = Holder::new(fence.clone());
        old.activate(3).unwrap();
        let in_flight = old.admit().unwrap();

        let new = Arc::new(Holder::new(fence.clone()));
        let (tx, rx) = mpsc::channel();
        let n = new.clone();
        let t = std::thread::spawn(move || tx.send(n.activate(5)).unwrap());
        // Wait for the new generation to be set (a request of the old one is
        // refused from then on); the activation must still be waiting for the
        // old holder's request in flight.
        while fence.highest() < 5 {
            std::thread::yield_now();
        }
        let e = old.admit().err().unwrap();
        assert_eq!(e.kind, IoErrorKind::Fenced);
        assert_eq!(
            e.message,
            "vol is held at generation 5; this holder's generation 3 was superseded"
        );
        assert!(
            rx.try_recv().is_err(),
            "activate returned while a request of generation 3 was in flight"
        );
        drop(in_flight);
        t.join().unwrap();
        rx.recv().unwrap().unwrap();
        assert_eq!(new.generation(), 5);
        drop(new.admit().unwrap());

        // Below the highest: refused, and the holder keeps its generation.
        let e = old.activate(4).unwrap_err();
        assert_eq!(e.kind, IoErrorKind::Fenced);
        assert_eq!(old.generation(), 3);
        // Equal: the same holder coming back.
        Holder::new(fence.clone()).activate(5).unwrap();
        assert_eq!(fence.highest(), 5);
    }

    /// Saves fail on demand.
    struct Failing(Mutex<bool>, AtomicU64);

    impl GenerationStore for Failing {
        fn load(&self) -> Result<u64, IoError> {
            Ok(self.1.load(Ordering::SeqCst))
        }
        fn save(&self, g: u64) -> Result<(), IoError> {
            if *self.0.lock().unwrap() {
                return Err(IoError::new(IoErrorKind::Io, "disk gone"));
            }
            self.1.store(g, Ordering::SeqCst);
            Ok(())
        }
    }

    #[test]
    fn a_generation_that_could_not_be_saved_is_not_held() {
        let fence = Fence::open(
            "vol",
            Box::new(Failing(Mutex::new(true), AtomicU64::new(2))),
        )
        .unwrap();
        assert_eq!(fence.highest(), 2, "loaded from the store");
        let h = Holder::new(fence.clone());
        let e = h.activate(7).unwrap_err();
        assert_eq!(e.kind, IoErrorKind::Io);
        assert_eq!((fence.highest(), h.generation()), (2, 0));
        let old = Holder::new(fence.clone());
        assert_eq!(
            old.admit().err().map(|e| e.kind),
            Some(IoErrorKind::Fenced),
            "generation 0 is below 2"
        );
    }
}
