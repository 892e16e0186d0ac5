//! How CSI's names and ids map to Lamina's (docs/csi.md).
//!
//! - A CSI name (the CO's `pvc-...` or `snapshot-...`) becomes the Lamina
//!   name unchanged when it follows Lamina's naming rule; otherwise (upper
//!   case, other characters, too long) it becomes `csi-` and 32 hex digits
//!   of its SHA-256. The mapping is a function of the name alone, so a
//!   retried call finds what the first one made without any stored table.
//! - A CSI volume id is `NAME@ID` and a snapshot id `VOLUME/SNAPSHOT@ID`,
//!   where ID is the pool's id of the object. Ids are never reused, so an id
//!   names one object even after it is deleted and another is made under
//!   the same name: a stale id is simply not found.
//! - When the controller drives several nodes, ids carry the node first:
//!   `NODE:NAME@ID`, `NODE:VOLUME/SNAPSHOT@ID`, and a group snapshot
//!   `NODE:GROUP`. Neither Lamina names nor Kubernetes node names hold a
//!   `:`, so the first one ends the node. An id without a node names the
//!   default node (the single node of a one-node driver, whose ids never
//!   carry one), so the ids of volumes made before stay valid.
//! - CSI allows ids of at most [`MAX_ID_LEN`] bytes. A node-qualified id
//!   that could pass it (counting the pool id at its widest, 20 digits) is
//!   refused before anything is made: see [`fits_csi_limit`].

use sha2::{Digest, Sha256};

/// Lamina's naming rule (the engine's `check_name`, restated here because
/// this crate must not depend on the engine): 1-255 bytes of `a-z`, `0-9`,
/// `-`, `_`, `.`, starting with a letter or digit.
pub fn is_lamina_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"-_.".contains(&c))
        && s.as_bytes()[0].is_ascii_alphanumeric()
}

/// The Lamina name for a CSI name (which must not be empty).
pub fn lamina_name(csi: &str) -> String {
    if is_lamina_name(csi) {
        return csi.to_string();
    }
    let d = Sha256::digest(csi.as_bytes());
    let hex: String = d.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("csi-{hex}")
}

/// The most bytes a CSI id may have (the spec's limit).
pub const MAX_ID_LEN: usize = 128;
/// The widest pool id, in decimal digits.
const MAX_ID_DIGITS: usize = 20;

/// A Kubernetes node name (a DNS subdomain): 1-253 bytes of `a-z`, `0-9`,
/// `-`, `.`, starting and ending with a letter or digit.
pub fn is_node_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
}

/// Whether an id naming `node` and the Lamina path `path` (`NAME` or
/// `VOLUME/SNAPSHOT`) keeps within CSI's limit whatever pool id it gets.
/// Ids without a node are not checked (the one-node driver's ids are as
/// they always were).
pub fn fits_csi_limit(node: Option<&str>, path: &str) -> bool {
    match node {
        None => true,
        Some(n) => n.len() + 1 + path.len() + 1 + MAX_ID_DIGITS <= MAX_ID_LEN,
    }
}

/// `NODE:REST` → (Some(NODE), REST); without a `:`, (None, the text).
fn split_node(s: &str) -> Option<(Option<String>, &str)> {
    match s.split_once(':') {
        Some((n, rest)) => is_node_name(n).then(|| (Some(n.to_string()), rest)),
        None => Some((None, s)),
    }
}

fn node_prefix(f: &mut std::fmt::Formatter<'_>, node: &Option<String>) -> std::fmt::Result {
    match node {
        Some(n) => write!(f, "{n}:"),
        None => Ok(()),
    }
}

/// A parsed CSI volume id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeId {
    /// The node, when the id names one.
    pub node: Option<String>,
    pub name: String,
    pub id: u64,
}

impl VolumeId {
    pub fn parse(s: &str) -> Option<VolumeId> {
        let (node, s) = split_node(s)?;
        let (name, id) = s.rsplit_once('@')?;
        let id = parse_id(id)?;
        is_lamina_name(name).then(|| VolumeId {
            node,
            name: name.to_string(),
            id,
        })
    }
}

impl std::fmt::Display for VolumeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        node_prefix(f, &self.node)?;
        write!(f, "{}@{}", self.name, self.id)
    }
}

/// Whether daemon volume `v` is another node's volume's replica (part of
/// that volume, not one of its own: label [`lamina_api::REPLICA_OF_LABEL`]).
pub fn is_replica(v: &lamina_api::Volume) -> bool {
    v.labels.contains_key(lamina_api::REPLICA_OF_LABEL)
}

/// Whether daemon volume `v` (of the name `id` names) is the volume `id`
/// names, found on the node the id names (`on_named`) or on another: a
/// volume of its own (not a replica), with the id's pool id on the named
/// node, or on any node labelled with the id
/// ([`lamina_api::CSI_VOLUME_ID_LABEL`]: a replicated volume taken over
/// by that node since). Pool ids are each pool's own: one equal to the
/// id's on another node says nothing.
pub fn names(id: &VolumeId, v: &lamina_api::Volume, on_named: bool) -> bool {
    !is_replica(v)
        && ((on_named && v.id == id.id)
            || v.labels
                .get(lamina_api::CSI_VOLUME_ID_LABEL)
                .is_some_and(|l| *l == id.to_string()))
}

/// Whether daemon volume `v` (of the name `id` names) is served by a front
/// end that holds no replica of it, one of whose replicas is on the node
/// the id names (docs/replicas.md, "A front end with no replica"): the
/// volume the id names, taken over by a node that holds no replica. Such
/// a front end knows no pool id nor label of the volume's: its replica
/// list is what ties it to the id.
pub fn diskless_front_of(id: &VolumeId, v: &lamina_api::Volume) -> bool {
    v.replication.as_ref().is_some_and(|r| {
        r.diskless
            && id
                .node
                .as_ref()
                .is_some_and(|n| r.replicas.iter().any(|x| x.node == *n))
    })
}

/// A parsed CSI snapshot id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotId {
    /// The node, when the id names one.
    pub node: Option<String>,
    pub volume: String,
    pub name: String,
    pub id: u64,
}

impl SnapshotId {
    pub fn parse(s: &str) -> Option<SnapshotId> {
        let (node, s) = split_node(s)?;
        let (path, id) = s.rsplit_once('@')?;
        let (volume, name) = path.split_once('/')?;
        let id = parse_id(id)?;
        (is_lamina_name(volume) && is_lamina_name(name)).then(|| SnapshotId {
            node,
            volume: volume.to_string(),
            name: name.to_string(),
            id,
        })
    }

    /// The snapshot as the daemon's clone source names it.
    pub fn source(&self) -> String {
        format!("{}/{}", self.volume, self.name)
    }
}

impl std::fmt::Display for SnapshotId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        node_prefix(f, &self.node)?;
        write!(f, "{}/{}@{}", self.volume, self.name, self.id)
    }
}

/// A parsed group snapshot id: `[NODE:]GROUP`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupId {
    pub node: Option<String>,
    pub name: String,
}

impl GroupId {
    pub fn parse(s: &str) -> Option<GroupId> {
        let (node, name) = split_node(s)?;
        is_lamina_name(name).then(|| GroupId {
            node,
            name: name.to_string(),
        })
    }
}

impl std::fmt::Display for GroupId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        node_prefix(f, &self.node)?;
        f.write_str(&self.name)
    }
}

/// The most bytes of a caller's text a message or log line shows whole.
pub const SHOWN_MAX: usize = MAX_ID_LEN;
/// How much of a longer text is shown, before its length.
const SHOWN_HEAD: usize = 64;

/// A text a caller sent (an id, a name, a parameter, a page token) as
/// messages and logs show it: quoted, and beyond [`SHOWN_MAX`] bytes cut to
/// its first [`SHOWN_HEAD`] with its length, so that what a caller sends
/// cannot make an answer or a log line as large as itself.
pub fn shown(s: &str) -> Shown<'_> {
    Shown(s)
}

/// See [`shown`].
pub struct Shown<'a>(&'a str);

impl std::fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.0;
        if s.len() <= SHOWN_MAX {
            return write!(f, "{s:?}");
        }
        let mut end = SHOWN_HEAD;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        write!(f, "{:?}… ({} bytes)", &s[..end], s.len())
    }
}

impl std::fmt::Debug for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Decimal digits only, no sign, no leading zero (one spelling per id).
fn parse_id(s: &str) -> Option<u64> {
    if s.is_empty() || (s.len() > 1 && s.starts_with('0')) || !s.bytes().all(|c| c.is_ascii_digit())
    {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_names_its_nodes_volume_of_its_own_or_one_taken_over_with_its_label() {
        let id = VolumeId::parse("n1:pvc-a@7").unwrap();
        let vol = |id: u64, labels: &[(&str, &str)]| lamina_api::Volume {
            id,
            name: "pvc-a".into(),
            size: 1 << 20,
            created: "2026-12-07T10:00:00Z".into(),
            allocated_bytes: 0,
            exclusive_bytes: 0,
            shared_bytes: 0,
            parent_snapshot: None,
            origin: None,
            clone_state: lamina_api::CloneState::None,
            export: None,
            operation: None,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            replication: None,
        };
        // On the named node: its pool id; elsewhere an equal id says nothing.
        assert!(names(&id, &vol(7, &[]), true));
        assert!(!names(&id, &vol(7, &[]), false));
        assert!(!names(&id, &vol(8, &[]), true));
        // Taken over: the label, on any node.
        let taken = vol(3, &[(lamina_api::CSI_VOLUME_ID_LABEL, "n1:pvc-a@7")]);
        assert!(names(&id, &taken, false) && names(&id, &taken, true));
        let other = vol(3, &[(lamina_api::CSI_VOLUME_ID_LABEL, "n1:pvc-a@8")]);
        assert!(!names(&id, &other, false));
        // A replica is never the volume, whatever its id or labels.
        let replica = vol(
            7,
            &[
                (lamina_api::REPLICA_OF_LABEL, "n2"),
                (lamina_api::CSI_VOLUME_ID_LABEL, "n1:pvc-a@7"),
            ],
        );
        assert!(is_replica(&replica) && !names(&id, &replica, true));
    }

    #[test]
    fn names_that_follow_the_rule_are_kept_and_others_hashed_stably() {
        assert_eq!(lamina_name("pvc-1234-abcd"), "pvc-1234-abcd");
        let a = lamina_name("CreateSnapshot-snapshot-maxlen");
        assert!(
            a.starts_with("csi-") && a.len() == 36 && is_lamina_name(&a),
            "{a}"
        );
        assert_eq!(a, lamina_name("CreateSnapshot-snapshot-maxlen"));
        assert_ne!(a, lamina_name("createSnapshot-snapshot-maxlen"));
        let long = "a".repeat(300);
        assert!(is_lamina_name(&lamina_name(&long)));
        assert!(is_lamina_name(&lamina_name("a/b")));
        assert!(is_lamina_name(&lamina_name(".hidden")));
    }

    #[test]
    fn ids_round_trip_and_malformed_ones_are_refused() {
        let v = VolumeId {
            node: None,
            name: "pvc-1".into(),
            id: 42,
        };
        assert_eq!(v.to_string(), "pvc-1@42");
        assert_eq!(VolumeId::parse("pvc-1@42"), Some(v));
        let s = SnapshotId {
            node: None,
            volume: "pvc-1".into(),
            name: "snap.2".into(),
            id: 7,
        };
        assert_eq!(s.to_string(), "pvc-1/snap.2@7");
        assert_eq!(SnapshotId::parse("pvc-1/snap.2@7"), Some(s));
        for bad in [
            "",
            "pvc",
            "pvc@",
            "@1",
            "pvc@01",
            "pvc@-1",
            "pvc@1x",
            "Pvc@1",
            "a/b@1",
            "pvc@99999999999999999999",
        ] {
            assert_eq!(VolumeId::parse(bad), None, "{bad}");
        }
        for bad in [
            "", "v@1", "v/@1", "/s@1", "v/s", "v/s@", "v/s/t@1", "V/s@1", "v/s@007",
        ] {
            assert_eq!(SnapshotId::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn ids_name_their_node_before_a_colon() {
        let v = VolumeId::parse("node-2.example:pvc-1@42").unwrap();
        assert_eq!(v.node.as_deref(), Some("node-2.example"));
        assert_eq!((v.name.as_str(), v.id), ("pvc-1", 42));
        assert_eq!(v.to_string(), "node-2.example:pvc-1@42");
        let s = SnapshotId::parse("n1:pvc-1/snap@7").unwrap();
        assert_eq!(s.node.as_deref(), Some("n1"));
        assert_eq!(s.source(), "pvc-1/snap");
        assert_eq!(GroupId::parse("n1:g").unwrap().to_string(), "n1:g");
        assert_eq!(GroupId::parse("g").unwrap().node, None);
        for bad in [
            ":pvc@1",
            "N1:pvc@1",
            "-n:pvc@1",
            "n-:pvc@1",
            "a:b:pvc@1",
            "n1:@1",
        ] {
            assert_eq!(VolumeId::parse(bad), None, "{bad}");
        }
        assert_eq!(SnapshotId::parse("a:b:v/s@1"), None);
        assert_eq!(GroupId::parse("n1:"), None);
    }

    #[test]
    fn node_qualified_ids_must_fit_csi_limit_at_any_pool_id() {
        let node = "n".repeat(20);
        let fits = "v".repeat(MAX_ID_LEN - 20 - 1 - 1 - MAX_ID_DIGITS);
        assert!(fits_csi_limit(Some(&node), &fits));
        let id = VolumeId {
            node: Some(node.clone()),
            name: fits.clone(),
            id: u64::MAX,
        };
        assert_eq!(id.to_string().len(), MAX_ID_LEN);
        assert!(!fits_csi_limit(Some(&node), &format!("{fits}x")));
        assert!(fits_csi_limit(None, &"v".repeat(255)));
    }

    #[test]
    fn long_texts_are_shown_cut_with_their_length() {
        assert_eq!(shown("pvc-1@2").to_string(), "\"pvc-1@2\"");
        let max = "x".repeat(SHOWN_MAX);
        assert_eq!(shown(&max).to_string(), format!("{max:?}"));
        let long = "é".repeat(5000);
        let s = shown(&long).to_string();
        assert!(s.ends_with("… (10000 bytes)"), "{s}");
        assert!(s.len() < SHOWN_MAX + 40, "{s}");
        assert!(s.starts_with(&format!("\"{}", "é".repeat(SHOWN_HEAD / 2))));
    }

    proptest::proptest! {
        /// Whatever a CO sends, parsing answers and never panics, and a
        /// mapped name is always a valid one.
        #[test]
        fn any_text_parses_or_is_refused_without_panic(s in ".{0,300}") {
            let _ = VolumeId::parse(&s);
            let _ = SnapshotId::parse(&s);
            let n = lamina_name(&s);
            proptest::prop_assert!(is_lamina_name(&n));
            proptest::prop_assert_eq!(n, lamina_name(&s));
        }

        #[test]
        fn ids_of_valid_names_round_trip(
            node in proptest::option::of("[a-z0-9]([a-z0-9.-]{0,30}[a-z0-9])?"),
            v in "[a-z0-9][a-z0-9._-]{0,60}",
            n in "[a-z0-9][a-z0-9._-]{0,60}",
            id in proptest::prelude::any::<u64>(),
        ) {
            let vid = VolumeId { node: node.clone(), name: v.clone(), id };
            proptest::prop_assert_eq!(VolumeId::parse(&vid.to_string()), Some(vid));
            let gid = GroupId { node: node.clone(), name: n.clone() };
            proptest::prop_assert_eq!(GroupId::parse(&gid.to_string()), Some(gid));
            let sid = SnapshotId { node, volume: v.clone(), name: n.clone(), id };
            proptest::prop_assert_eq!(SnapshotId::parse(&sid.to_string()), Some(sid));
            proptest::prop_assert_eq!(lamina_name(&v), v);
        }
    }
}
