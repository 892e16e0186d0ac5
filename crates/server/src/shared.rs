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
    /// Each replica's node and, if faulted, why; the front end's first,
    /// unless it holds none.
    pub replicas: Vec<(String, Option<String>)>,
    /// The front end's node holds no replica of the volume: it reaches
    /// every one over the network (docs/replicas.md, "A front end with no
    /// replica"). Said, never guessed from the list: a record naming a
    /// node the list leaves out is otherwise no front end any replica
    /// yields to.
    pub diskless: bool,
}

impl SharedSet {
    /// Whether this is the record of a front end that took the volume over
    /// from `node`'s: another node's, listed first (as every takeover lists
    /// it) or said to hold no replica and not listed, with `node` among the
    /// replicas. `node`'s volume is then that front end's replica.
    pub fn took_over_from(&self, node: &str) -> bool {
        let listed = |x: &str| self.replicas.iter().any(|(n, _)| n == x);
        let front_first = self
            .replicas
            .first()
            .is_some_and(|(n, _)| *n == self.front_end);
        self.front_end != node
            && (front_first || (self.diskless && !listed(&self.front_end)))
            && listed(node)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_is_yielded_only_to_a_front_end_listed_first_or_holding_none_that_lists_this_node() {
        let set = |front: &str, nodes: &[&str]| SharedSet {
            front_end: front.into(),
            generation: 4,
            replicas: nodes.iter().map(|n| (n.to_string(), None)).collect(),
            diskless: false,
        };
        let diskless = |front: &str, nodes: &[&str]| SharedSet {
            diskless: true,
            ..set(front, nodes)
        };
        assert!(set("b", &["b", "a"]).took_over_from("a"));
        assert!(!set("a", &["a", "b"]).took_over_from("a"), "its own");
        assert!(
            !set("c", &["a", "b"]).took_over_from("a"),
            "a front end holding no replica"
        );
        assert!(
            !set("b", &["a", "b"]).took_over_from("a"),
            "a front end not listed first"
        );
        assert!(!set("b", &["b", "c"]).took_over_from("a"), "not listed");
        assert!(
            diskless("c", &["a", "b"]).took_over_from("a"),
            "a front end said to hold no replica"
        );
        assert!(
            !diskless("c", &["b", "c"]).took_over_from("b"),
            "said to hold none, but listed"
        );
        assert!(!diskless("c", &["b"]).took_over_from("a"), "not listed");
    }
}
