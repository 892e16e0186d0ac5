//! The seam between the daemon and where the whole cluster agrees on
//! replicated volumes' replica sets (docs/replicas.md, "The shared record"):
//! under Kubernetes, the Volume resources' status in the API server
//! (`lamina-kube-record`). This module owns the seam's types only; the
//! store decides when a change is shared, and nothing here knows how it is
//! kept.

/// Where the whole cluster agrees on each replicated volume's replica set:
/// which front end holds it, at which generation, and which replicas are
/// healthy (docs/replicas.md, "The shared record"). Called with a
/// volume's changes in order, one at a time.
pub trait SharedRecord: Send + Sync {
    /// Record that volume `volume`'s replica set, whose front end runs on
    /// node `node`, is now `after` (None: removed). Ok once it is
    /// recorded; an error recorded nothing.
    fn record(
        &self,
        node: &str,
        volume: &str,
        after: Option<&SharedSet>,
    ) -> Result<(), SharedRecordError>;

    /// Volume `volume`'s replica set as recorded there (None: none).
    fn read(&self, volume: &str) -> Result<Option<SharedSet>, SharedRecordError>;

    /// Node `node` takes volume `volume` over: its record becomes `to`
    /// only if it is still `from` (read before), else nothing changes and
    /// the answer is `Fenced`.
    fn take(
        &self,
        node: &str,
        volume: &str,
        from: &SharedSet,
        to: &SharedSet,
    ) -> Result<(), SharedRecordError>;
}

/// A replica set as the shared record holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SharedSet {
    /// The node whose daemon holds the front end.
    pub front_end: String,
    pub generation: u64,
    /// Each replica's node and, if faulted, why; the front end's first.
    pub replicas: Vec<(String, Option<String>)>,
}

/// Why the shared record did not take a change.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SharedRecordError {
    /// Another front end holds the volume there: this one must not change
    /// its record, nor serve it.
    #[error("fenced: {0}")]
    Fenced(String),
    /// It could not be reached or did not answer in time.
    #[error("the shared record cannot be written: {0}")]
    Unavailable(String),
}
