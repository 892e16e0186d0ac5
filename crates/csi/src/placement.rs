//! Where a new volume goes: a pure choice among the known nodes, from the
//! CO's topology requirements and each node's free space.

use crate::nodes::topology_of;
use crate::proto::{Topology, TopologyRequirement};

/// A node that could take a volume, the bytes it can still take, and its
/// zone (its Node's `topology.kubernetes.io/zone`), if it has one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    pub free: u64,
    pub zone: Option<String>,
}

/// Whether a volume's replicas must be in distinct zones
/// (StorageClass parameter `replicaZones`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Spread {
    /// Where nodes carry zones, every replica in a zone of its own, or the
    /// volume is not made (the default).
    #[default]
    Required,
    /// Distinct zones first, then distinct nodes of zones already used.
    Preferred,
}

/// Why [`choose_replicas`] could not place replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Short {
    /// Nodes that could hold one: neither the front end's nor holding one.
    pub nodes: usize,
    /// Of them, those in a zone no replica is in (counted when zones are
    /// in use).
    pub new_zones: Option<usize>,
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

/// The nodes for `n` more replicas of a volume whose front end is `front`
/// (name, zone), besides the replicas on `taken` (name, zone): among
/// `nodes`, those that are neither the front end's nor taken, the roomiest
/// first (ties to the first name; replicas are thin too, so room only
/// orders them). When any of these nodes carries a zone, each replica goes
/// to a zone none of the others is in; a node without a zone then counts
/// as in none, and is used only as [`Spread::Preferred`] falls back to
/// distinct nodes. Err: what there was, when not enough.
pub fn choose_replicas(
    front: (&str, Option<&str>),
    taken: &[(String, Option<String>)],
    nodes: &[Candidate],
    n: usize,
    spread: Spread,
) -> Result<Vec<String>, Short> {
    let mut others: Vec<&Candidate> = nodes
        .iter()
        .filter(|c| c.name != front.0 && !taken.iter().any(|t| t.0 == c.name))
        .collect();
    others.sort_by(|a, b| b.free.cmp(&a.free).then_with(|| a.name.cmp(&b.name)));
    let zoned = front.1.is_some()
        || taken.iter().any(|t| t.1.is_some())
        || nodes.iter().any(|c| c.zone.is_some());
    if !zoned {
        if others.len() < n {
            return Err(Short {
                nodes: others.len(),
                new_zones: None,
            });
        }
        return Ok(others.into_iter().take(n).map(|c| c.name.clone()).collect());
    }
    let mut used: Vec<&str> = front
        .1
        .into_iter()
        .chain(taken.iter().filter_map(|t| t.1.as_deref()))
        .collect();
    let mut chosen: Vec<&Candidate> = Vec::new();
    for c in &others {
        if chosen.len() == n {
            break;
        }
        if let Some(z) = c.zone.as_deref().filter(|z| !used.contains(z)) {
            used.push(z);
            chosen.push(c);
        }
    }
    let new_zones = chosen.len();
    if chosen.len() < n && spread == Spread::Preferred {
        for c in &others {
            if chosen.len() == n {
                break;
            }
            if !chosen.iter().any(|x| x.name == c.name) {
                chosen.push(c);
            }
        }
    }
    if chosen.len() < n {
        return Err(Short {
            nodes: others.len(),
            new_zones: Some(new_zones),
        });
    }
    Ok(chosen.into_iter().map(|c| c.name.clone()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str, free: u64) -> Candidate {
        Candidate {
            name: name.into(),
            free,
            zone: None,
        }
    }

    fn z(name: &str, free: u64, zone: &str) -> Candidate {
        Candidate {
            zone: Some(zone.into()),
            ..c(name, free)
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

    fn taken(names: &[&str]) -> Vec<(String, Option<String>)> {
        names.iter().map(|n| (n.to_string(), None)).collect()
    }

    #[test]
    fn replicas_go_to_the_roomiest_other_nodes_never_the_front_ends_nor_a_taken_one() {
        let nodes = [c("a", 100), c("b", 50), c("c", 50), c("d", 80)];
        let r = Spread::Required;
        let pick = |front, t: &[&str], n| choose_replicas((front, None), &taken(t), &nodes, n, r);
        assert_eq!(pick("a", &[], 2), Ok(vec!["d".into(), "b".into()]));
        assert_eq!(pick("d", &["a"], 2), Ok(vec!["b".into(), "c".into()]));
        assert_eq!(pick("a", &[], 0), Ok(vec![]));
        assert_eq!(
            pick("a", &["d"], 3),
            Err(Short {
                nodes: 2,
                new_zones: None
            })
        );
        assert_eq!(
            choose_replicas(("z", None), &[], &[], 1, r),
            Err(Short {
                nodes: 0,
                new_zones: None
            })
        );
    }

    #[test]
    fn with_zones_each_replica_takes_a_zone_of_its_own_or_none_is_placed_unless_preferred() {
        // The front end in zone 1; b (roomiest) shares it.
        let nodes = [
            z("a", 10, "1"),
            z("b", 100, "1"),
            z("c", 50, "2"),
            z("d", 60, "2"),
            c("e", 90),
        ];
        let pick = |n, spread| choose_replicas(("a", Some("1")), &[], &nodes, n, spread);
        assert_eq!(pick(1, Spread::Required), Ok(vec!["d".into()]));
        // Zones 1 and 2 are all there are (e has none): no third zone.
        assert_eq!(
            pick(2, Spread::Required),
            Err(Short {
                nodes: 4,
                new_zones: Some(1)
            })
        );
        // Preferred: zone 2's roomiest, then the roomiest of the rest.
        assert_eq!(pick(2, Spread::Preferred), Ok(vec!["d".into(), "b".into()]));
        // A replica in zone 2 already: none left for another.
        let t = vec![("d".to_string(), Some("2".to_string()))];
        assert_eq!(
            choose_replicas(("a", Some("1")), &t, &nodes, 1, Spread::Required),
            Err(Short {
                nodes: 3,
                new_zones: Some(0)
            })
        );
    }

    proptest::proptest! {
        #[test]
        fn chosen_replicas_are_distinct_other_nodes_in_distinct_zones_when_required(
            nodes in proptest::collection::vec((0u64..4, proptest::option::of(0u8..3)), 0..7),
            front_zone in proptest::option::of(0u8..3),
            taken in proptest::collection::vec(0usize..7, 0..3),
            n in 0usize..4,
            preferred in proptest::bool::ANY,
        ) {
            let nodes: Vec<Candidate> = nodes
                .iter()
                .enumerate()
                .map(|(i, (f, zone))| Candidate {
                    name: format!("n{i}"),
                    free: *f,
                    zone: zone.map(|z| z.to_string()),
                })
                .collect();
            let zone_of = |name: &str| nodes.iter().find(|c| c.name == name).and_then(|c| c.zone.clone());
            let taken: Vec<(String, Option<String>)> =
                taken.iter().map(|i| (format!("n{i}"), zone_of(&format!("n{i}")))).collect();
            let front_zone = front_zone.map(|z| z.to_string());
            let spread = if preferred { Spread::Preferred } else { Spread::Required };
            let eligible: Vec<&Candidate> = nodes
                .iter()
                .filter(|x| x.name != "n0" && !taken.iter().any(|t| t.0 == x.name))
                .collect();
            let zoned = front_zone.is_some() || taken.iter().any(|t| t.1.is_some()) || nodes.iter().any(|c| c.zone.is_some());
            match choose_replicas(("n0", front_zone.as_deref()), &taken, &nodes, n, spread) {
                Ok(chosen) => {
                    proptest::prop_assert_eq!(chosen.len(), n);
                    let mut d = chosen.clone();
                    d.sort();
                    d.dedup();
                    proptest::prop_assert_eq!(d.len(), n);
                    for x in &chosen {
                        proptest::prop_assert!(eligible.iter().any(|c| &c.name == x));
                    }
                    if zoned && !preferred {
                        // Each new replica in a zone of its own: none
                        // the front end's or a taken replica's is in.
                        let mut zones: Vec<Option<String>> = chosen.iter().map(|x| zone_of(x)).collect();
                        proptest::prop_assert!(zones.iter().all(|z| z.is_some()));
                        for z in &zones {
                            proptest::prop_assert!(z != &front_zone);
                            proptest::prop_assert!(!taken.iter().any(|t| &t.1 == z));
                        }
                        let all = zones.len();
                        zones.sort();
                        zones.dedup();
                        proptest::prop_assert_eq!(zones.len(), all);
                    }
                }
                Err(short) => {
                    proptest::prop_assert_eq!(short.nodes, eligible.len());
                    proptest::prop_assert!(short.nodes < n || (zoned && !preferred));
                }
            }
        }
    }
}
