//! Where a new volume goes: a pure choice among the known nodes, from the
//! CO's topology requirements and each node's free space.

use crate::nodes::topology_of;
use crate::proto::{Topology, TopologyRequirement};

/// A node that could take a volume, and the bytes it can still take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    pub free: u64,
}

/// Whether `want` (a CO's topology) holds for `ours`: every key it names.
pub fn fits(want: &Topology, ours: &Topology) -> bool {
    want.segments
        .iter()
        .all(|(k, v)| ours.segments.get(k) == Some(v))
}

/// Whether the requirements allow a volume on `node` (no requirements, or
/// empty ones, allow every node).
pub fn allowed(req: Option<&TopologyRequirement>, node: &str) -> bool {
    let Some(r) = req else { return true };
    let ours = topology_of(node);
    let mut all = r.requisite.iter().chain(&r.preferred).peekable();
    all.peek().is_none() || all.any(|t| fits(t, &ours))
}

/// The node for a volume of `size` bytes: the first preferred topology
/// that a node with room fits (the roomiest such node), else the roomiest
/// node with room that fits a requisite topology; with no requirements,
/// the roomiest node with room. Volumes are thin, so when no allowed node
/// has room for the whole size, the same choice is made ignoring room (the
/// volume's writes meet `no space` only if it really fills the pool). Ties
/// go to the first name. None: no known node is allowed.
pub fn choose(req: Option<&TopologyRequirement>, nodes: &[Candidate], size: u64) -> Option<String> {
    pick(req, nodes, size).or_else(|| pick(req, nodes, 0))
}

fn pick(req: Option<&TopologyRequirement>, nodes: &[Candidate], size: u64) -> Option<String> {
    let roomy = |want: &dyn Fn(&str) -> bool| {
        nodes
            .iter()
            .filter(|c| c.free >= size && want(&c.name))
            .min_by(|a, b| b.free.cmp(&a.free).then_with(|| a.name.cmp(&b.name)))
            .map(|c| c.name.clone())
    };
    let Some(r) = req.filter(|r| !r.requisite.is_empty() || !r.preferred.is_empty()) else {
        return roomy(&|_| true);
    };
    for t in &r.preferred {
        if let Some(n) = roomy(&|n| fits(t, &topology_of(n))) {
            return Some(n);
        }
    }
    roomy(&|n| r.requisite.iter().any(|t| fits(t, &topology_of(n))))
}

/// The nodes for `n` more replicas of a volume whose front end is on
/// `front`: the roomiest of `nodes` (most free bytes first, ties to the
/// first name) that are neither `front` nor in `taken` (nodes holding a
/// replica already). Replicas are thin too, so room only orders them.
/// Err: how many such nodes there are, when fewer than `n`.
pub fn choose_replicas(
    front: &str,
    taken: &[String],
    nodes: &[Candidate],
    n: usize,
) -> Result<Vec<String>, usize> {
    let mut others: Vec<&Candidate> = nodes
        .iter()
        .filter(|c| c.name != front && !taken.contains(&c.name))
        .collect();
    if others.len() < n {
        return Err(others.len());
    }
    others.sort_by(|a, b| b.free.cmp(&a.free).then_with(|| a.name.cmp(&b.name)));
    Ok(others.into_iter().take(n).map(|c| c.name.clone()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str, free: u64) -> Candidate {
        Candidate {
            name: name.into(),
            free,
        }
    }

    fn req(requisite: &[&str], preferred: &[&str]) -> TopologyRequirement {
        TopologyRequirement {
            requisite: requisite.iter().map(|n| topology_of(n)).collect(),
            preferred: preferred.iter().map(|n| topology_of(n)).collect(),
        }
    }

    #[test]
    fn preferred_first_then_requisite_then_most_room() {
        let nodes = [c("a", 100), c("b", 50), c("c", 10)];
        assert_eq!(choose(None, &nodes, 1).as_deref(), Some("a"));
        // Thin: no room anywhere still picks the roomiest allowed node.
        assert_eq!(choose(None, &nodes, 101).as_deref(), Some("a"));
        let r = req(&["b", "c"], &["c", "b"]);
        assert_eq!(choose(Some(&r), &nodes, 5).as_deref(), Some("c"));
        // The preferred node has no room: the next preferred one.
        assert_eq!(choose(Some(&r), &nodes, 20).as_deref(), Some("b"));
        let r = req(&["b", "c"], &[]);
        assert_eq!(choose(Some(&r), &nodes, 5).as_deref(), Some("b"));
        assert_eq!(choose(Some(&r), &nodes, 60).as_deref(), Some("b"));
        // A node the requirements name but the set does not know.
        assert_eq!(choose(Some(&req(&["z"], &[])), &nodes, 1), None);
        assert_eq!(
            choose(Some(&req(&[], &[])), &nodes, 1).as_deref(),
            Some("a")
        );
        // Another key entirely fits no node.
        let other = TopologyRequirement {
            requisite: vec![Topology {
                segments: [("zone".to_string(), "z1".to_string())].into(),
            }],
            preferred: vec![],
        };
        assert_eq!(choose(Some(&other), &nodes, 1), None);
        assert!(!allowed(Some(&other), "a"));
        assert!(allowed(Some(&req(&["a"], &[])), "a"));
        assert!(!allowed(Some(&req(&["a"], &["b"])), "c"));
        assert!(allowed(None, "c"));
    }

    proptest::proptest! {
        /// The chosen node is known and allowed, and has room whenever an
        /// allowed node has; none is chosen only when no known node is
        /// allowed.
        #[test]
        fn the_choice_is_allowed_and_has_room(
            frees in proptest::collection::vec(0u64..100, 1..6),
            requisite in proptest::collection::vec(0usize..8, 0..4),
            preferred in proptest::collection::vec(0usize..8, 0..3),
            size in 0u64..120,
        ) {
            let nodes: Vec<Candidate> =
                frees.iter().enumerate().map(|(i, f)| c(&format!("n{i}"), *f)).collect();
            let names = |v: &[usize]| v.iter().map(|i| format!("n{i}")).collect::<Vec<_>>();
            let (rq, pf) = (names(&requisite), names(&preferred));
            let r = TopologyRequirement {
                requisite: rq.iter().map(|n| topology_of(n)).collect(),
                preferred: pf.iter().map(|n| topology_of(n)).collect(),
            };
            let ok = |x: &Candidate| x.free >= size && allowed(Some(&r), &x.name);
            let any_ok = nodes.iter().any(ok);
            match choose(Some(&r), &nodes, size) {
                Some(n) => {
                    let x = nodes.iter().find(|x| x.name == n).unwrap();
                    proptest::prop_assert!(allowed(Some(&r), &x.name));
                    proptest::prop_assert!(ok(x) || !any_ok);
                    if let Some(first) = pf.iter().find(|p| nodes.iter().any(|x| &x.name == *p && ok(x))) {
                        proptest::prop_assert_eq!(&n, first);
                    }
                }
                None => proptest::prop_assert!(!nodes.iter().any(|x| allowed(Some(&r), &x.name))),
            }
        }
    }

    #[test]
    fn replicas_go_to_the_roomiest_other_nodes_never_the_front_ends_nor_a_taken_one() {
        let nodes = [c("a", 100), c("b", 50), c("c", 50), c("d", 80)];
        assert_eq!(
            choose_replicas("a", &[], &nodes, 2),
            Ok(vec!["d".into(), "b".into()])
        );
        assert_eq!(
            choose_replicas("d", &["a".into()], &nodes, 2),
            Ok(vec!["b".into(), "c".into()])
        );
        assert_eq!(choose_replicas("a", &[], &nodes, 0), Ok(vec![]));
        assert_eq!(choose_replicas("a", &["d".into()], &nodes, 3), Err(2));
        assert_eq!(choose_replicas("z", &[], &[], 1), Err(0));
    }

    proptest::proptest! {
        #[test]
        fn chosen_replicas_are_distinct_other_nodes(
            free in proptest::collection::vec(0u64..4, 0..6),
            taken in proptest::collection::vec(0usize..6, 0..3),
            n in 0usize..4,
        ) {
            let nodes: Vec<Candidate> = free
                .iter()
                .enumerate()
                .map(|(i, f)| c(&format!("n{i}"), *f))
                .collect();
            let taken: Vec<String> = taken.iter().map(|i| format!("n{i}")).collect();
            let eligible = nodes
                .iter()
                .filter(|x| x.name != "n0" && !taken.contains(&x.name))
                .count();
            match choose_replicas("n0", &taken, &nodes, n) {
                Ok(chosen) => {
                    proptest::prop_assert_eq!(chosen.len(), n);
                    let mut d = chosen.clone();
                    d.sort();
                    d.dedup();
                    proptest::prop_assert_eq!(d.len(), n);
                    for x in &chosen {
                        proptest::prop_assert!(x != "n0" && !taken.contains(x));
                    }
                }
                Err(k) => {
                    proptest::prop_assert!(eligible < n);
                    proptest::prop_assert_eq!(k, eligible);
                }
            }
        }
    }
}
