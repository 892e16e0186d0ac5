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

/// A parsed CSI volume id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeId {
    pub name: String,
    pub id: u64,
}

impl VolumeId {
    pub fn parse(s: &str) -> Option<VolumeId> {
        let (name, id) = s.rsplit_once('@')?;
        let id = parse_id(id)?;
        is_lamina_name(name).then(|| VolumeId {
            name: name.to_string(),
            id,
        })
    }
}

impl std::fmt::Display for VolumeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.name, self.id)
    }
}

/// A parsed CSI snapshot id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotId {
    pub volume: String,
    pub name: String,
    pub id: u64,
}

impl SnapshotId {
    pub fn parse(s: &str) -> Option<SnapshotId> {
        let (path, id) = s.rsplit_once('@')?;
        let (volume, name) = path.split_once('/')?;
        let id = parse_id(id)?;
        (is_lamina_name(volume) && is_lamina_name(name)).then(|| SnapshotId {
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
        write!(f, "{}/{}@{}", self.volume, self.name, self.id)
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
            name: "pvc-1".into(),
            id: 42,
        };
        assert_eq!(v.to_string(), "pvc-1@42");
        assert_eq!(VolumeId::parse("pvc-1@42"), Some(v));
        let s = SnapshotId {
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
            v in "[a-z0-9][a-z0-9._-]{0,60}",
            n in "[a-z0-9][a-z0-9._-]{0,60}",
            id in proptest::prelude::any::<u64>(),
        ) {
            let vid = VolumeId { name: v.clone(), id };
            proptest::prop_assert_eq!(VolumeId::parse(&vid.to_string()), Some(vid));
            let sid = SnapshotId { volume: v.clone(), name: n.clone(), id };
            proptest::prop_assert_eq!(SnapshotId::parse(&sid.to_string()), Some(sid));
            proptest::prop_assert_eq!(lamina_name(&v), v);
        }
    }
}
