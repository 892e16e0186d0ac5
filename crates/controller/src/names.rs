//! Resource names for engine objects. Engine names allow what Kubernetes
//! names do not ('_', 255 characters, system snapshots starting with '.'),
//! and snapshot names are per volume while resource names are per namespace.
//! The mapping is deterministic (a retry or a second controller picks the
//! same name) and keeps the engine's name readable in the resource's.

use sha2::{Digest, Sha256};

/// Longest Kubernetes object name (a DNS subdomain).
pub const MAX_NAME: usize = 253;

/// Whether `s` is a valid Kubernetes object name (DNS-1123 subdomain).
pub fn is_valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
        && s.split('.').all(|l| !l.is_empty())
}

fn hash8(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.len().to_le_bytes());
        h.update(p.as_bytes());
    }
    h.finalize()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `s` with what a resource name cannot hold turned into '-', runs of '-'
/// and '.' squeezed, and no '-' or '.' at either end.
fn sanitize(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let c = match c {
            'a'..='z' | '0'..='9' => c,
            _ => '-',
        };
        if c == '-' && (out.is_empty() || out.ends_with('-')) {
            continue;
        }
        out.push(c);
    }
    out.trim_end_matches('-').to_string()
}

/// `readable-HASH`, cut so the whole fits [`MAX_NAME`].
fn with_hash(readable: &str, hash: &str) -> String {
    let room = MAX_NAME - hash.len() - 1;
    let mut r: String = readable.chars().take(room).collect();
    while r.ends_with('-') {
        r.pop();
    }
    if r.is_empty() {
        hash.to_string()
    } else {
        format!("{r}-{hash}")
    }
}

/// The Volume resource's name for engine volume `volume`: the engine's own
/// name when it is a valid resource name, else a readable form with a hash of
/// the engine name.
pub fn volume_resource(volume: &str) -> String {
    if is_valid_name(volume) && !volume.contains('.') {
        volume.to_string()
    } else {
        with_hash(&sanitize(volume), &hash8(&[volume]))
    }
}

/// The Snapshot resource's name for engine snapshot `snapshot` of
/// `volume`: `VOLUME-SNAPSHOT-HASH` (the hash of both engine names keeps
/// `a`+`b-c` apart from `a-b`+`c`).
pub fn snapshot_resource(volume: &str, snapshot: &str) -> String {
    with_hash(
        &sanitize(&format!("{volume}-{snapshot}")),
        &hash8(&[volume, snapshot]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn examples() {
        assert_eq!(volume_resource("data"), "data");
        assert!(volume_resource("my_vol").starts_with("my-vol-"));
        let s = snapshot_resource("data", ".clone-7-copy");
        assert!(s.starts_with("data-clone-7-copy-"), "{s}");
        assert_ne!(snapshot_resource("a", "b-c"), snapshot_resource("a-b", "c"));
        assert_eq!(snapshot_resource("a", "b"), snapshot_resource("a", "b"));
        assert!(is_valid_name(&snapshot_resource(
            &"v".repeat(255),
            &"s".repeat(255)
        )));
        assert!(!is_valid_name("a..b"));
        assert!(!is_valid_name("-a"));
        assert!(!is_valid_name("a_b"));
    }

    fn engine_name() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9][a-z0-9._-]{0,40}",
            "\\.[a-z0-9._-]{1,40}",
            "[a-z0-9][a-z0-9._-]{240,254}",
        ]
    }

    proptest! {
        #[test]
        fn every_mapped_name_is_valid_and_stable(v in engine_name(), s in engine_name()) {
            let n = snapshot_resource(&v, &s);
            prop_assert!(is_valid_name(&n), "{n}");
            prop_assert_eq!(&n, &snapshot_resource(&v, &s));
            let vn = volume_resource(&v);
            prop_assert!(is_valid_name(&vn), "{vn}");
        }

        #[test]
        fn distinct_engine_pairs_get_distinct_names(
            v1 in engine_name(), s1 in engine_name(), v2 in engine_name(), s2 in engine_name()
        ) {
            prop_assume!((&v1, &s1) != (&v2, &s2));
            prop_assert_ne!(snapshot_resource(&v1, &s1), snapshot_resource(&v2, &s2));
        }
    }
}
