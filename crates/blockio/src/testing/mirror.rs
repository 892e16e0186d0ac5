//! A volume composed of two: every change goes to both, reads go to the
//! first. Local only, with no resync and no failover: it exists to prove
//! that a volume made of other volumes (as a replicated one will be) stands
//! in for the engine's, through the contract suite and real NBD clients.

use crate::{BlockIo, Caps, Completion, IoDone, IoError, IoErrorKind, IoOp};
use std::sync::{Arc, Mutex};

/// Two volumes of one size, kept alike.
pub struct Mirror {
    legs: [Arc<dyn BlockIo>; 2],
}

impl Mirror {
    /// `first` serves the reads.
    pub fn new(first: Arc<dyn BlockIo>, second: Arc<dyn BlockIo>) -> Mirror {
        Mirror {
            legs: [first, second],
        }
    }
}

/// The two completions of one change, joined: the caller's completion runs
/// once both legs answered, with the first leg's outcome, or the first error
/// either gave.
struct Join {
    remaining: u8,
    first: Option<Result<IoDone, IoError>>,
    error: Option<IoError>,
    done: Option<Completion>,
}

fn leg_done(join: &Arc<Mutex<Join>>, first_leg: bool, r: Result<IoDone, IoError>) {
    let finished = {
        let mut j = join.lock().unwrap_or_else(|p| p.into_inner());
        j.remaining -= 1;
        match r {
            Err(e) => {
                j.error.get_or_insert(e);
            }
            Ok(d) if first_leg => j.first = Some(Ok(d)),
            Ok(_) => {}
        }
        if j.remaining == 0 {
            let outcome = match j.error.take() {
                Some(e) => Err(e),
                None => j.first.take().unwrap_or_else(|| {
                    Err(IoError::new(
                        IoErrorKind::Io,
                        "the first leg gave no outcome",
                    ))
                }),
            };
            j.done.take().map(|d| (d, outcome))
        } else {
            None
        }
    };
    // Outside the lock: the completion may submit again.
    if let Some((done, outcome)) = finished {
        done(outcome)
    }
}

impl BlockIo for Mirror {
    fn size(&self) -> Result<u64, IoError> {
        let (a, b) = (self.legs[0].size()?, self.legs[1].size()?);
        if a != b {
            return Err(IoError::new(
                IoErrorKind::Invalid,
                format!("the mirror's legs differ in size: {a} and {b} bytes"),
            ));
        }
        Ok(a)
    }

    fn read_only(&self) -> bool {
        self.legs[0].read_only() || self.legs[1].read_only()
    }

    fn caps(&self) -> Caps {
        self.legs[0].caps().and(self.legs[1].caps())
    }

    fn activate(&self, generation: u64) -> Result<(), IoError> {
        // Both legs, in order; a refusal by either is the mirror's.
        self.legs[0].activate(generation)?;
        self.legs[1].activate(generation)
    }

    fn submit(&self, op: IoOp, done: Completion) {
        if matches!(op, IoOp::Read { .. } | IoOp::BlockStatus { .. }) {
            return self.legs[0].submit(op, done);
        }
        let second = op.again();
        let join = Arc::new(Mutex::new(Join {
            remaining: 2,
            first: None,
            error: None,
            done: Some(done),
        }));
        let j = join.clone();
        self.legs[0].submit(op, Box::new(move |r| leg_done(&j, true, r)));
        self.legs[1].submit(second, Box::new(move |r| leg_done(&join, false, r)));
    }
}
