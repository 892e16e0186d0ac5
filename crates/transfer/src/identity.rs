//! A snapshot's identity in the transfer protocol: what a resumed pull
//! checks, so that it never mixes two snapshots, even when it resumes from
//! another node.
//!
//! An engine's snapshot id is unique within its pool only, and each
//! replica of a replicated volume is a volume of another node's pool: the
//! same snapshot (taken at one point of the volume's write stream, under
//! one name) has a different id on each replica. So the identity a source
//! reports (`Answer.id`) and checks (`Request.expect_id`) is:
//!
//! - for a snapshot labelled [`ORIGIN_LABEL`]: the label's value, the
//!   identity of the snapshot it was made as (a replica's snapshot carries
//!   its front end's node's snapshot's identity);
//! - for any other: [`identity`] of its pool's id and its own id.
//!
//! Pools' ids are random and snapshot ids are never reused within a pool,
//! so two different snapshots share an identity only by a 64-bit
//! collision of the mix below.

/// The label a replica's snapshot carries: the identity (16 lowercase hex
/// digits) of its front end's node's snapshot, which it is a copy of.
pub const ORIGIN_LABEL: &str = "lamina.io/origin";

/// The identity of snapshot `id` of the pool whose id is `pool_id`: never 0
/// (0 means "any" in a Request).
pub fn identity(pool_id: [u8; 16], id: u64) -> u64 {
    let hi = u64::from_be_bytes(pool_id[..8].try_into().expect("8 bytes"));
    let lo = u64::from_be_bytes(pool_id[8..].try_into().expect("8 bytes"));
    let h = mix(hi ^ mix(lo ^ mix(id)));
    h.max(1)
}

/// The identity a snapshot is known by: its origin label's, else its own.
/// A label that does not parse is ignored (the snapshot is then its own).
pub fn of_snapshot(pool_id: [u8; 16], id: u64, labels: &[(String, String)]) -> u64 {
    labels
        .iter()
        .find(|(k, _)| k == ORIGIN_LABEL)
        .and_then(|(_, v)| parse(v))
        .unwrap_or_else(|| identity(pool_id, id))
}

/// The label's value for `identity`.
pub fn format(identity: u64) -> String {
    format!("{identity:016x}")
}

/// An identity from its label's value: exactly 16 lowercase hex digits,
/// not all zero.
pub fn parse(v: &str) -> Option<u64> {
    if v.len() != 16
        || !v
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    u64::from_str_radix(v, 16).ok().filter(|&n| n != 0)
}

/// SplitMix64's finaliser: a bijection of u64 that spreads every input bit
/// over the output, fixed here so identities never change between builds.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_depends_on_the_pool_and_the_id_and_is_never_zero() {
        let (a, b) = ([1u8; 16], [2u8; 16]);
        assert_ne!(identity(a, 7), identity(b, 7));
        assert_ne!(identity(a, 7), identity(a, 8));
        assert_eq!(identity(a, 7), identity(a, 7));
        for id in 0..10_000 {
            assert_ne!(identity([0; 16], id), 0);
        }
        // Fixed across builds and versions: a recorded identity must still
        // match (docs/transfer.md gives the mix).
        assert_eq!(identity([0; 16], 1), 0xb18a02f46d8d86c3);
        let pool: [u8; 16] = std::array::from_fn(|i| i as u8);
        assert_eq!(identity(pool, 42), 0x049beb966baa30d2);
    }

    #[test]
    fn a_snapshot_with_an_origin_is_known_by_it_and_a_bad_label_is_ignored() {
        let pool = [9u8; 16];
        let own = identity(pool, 3);
        let origin = identity([4u8; 16], 11);
        let labelled = vec![(ORIGIN_LABEL.to_string(), format(origin))];
        assert_eq!(of_snapshot(pool, 3, &labelled), origin);
        assert_eq!(of_snapshot(pool, 3, &[]), own);
        for bad in [
            "",
            "0000000000000000",
            "ABCDEF0123456789",
            "12345",
            "x234567890123456",
        ] {
            let l = vec![(ORIGIN_LABEL.to_string(), bad.to_string())];
            assert_eq!(of_snapshot(pool, 3, &l), own, "{bad:?}");
        }
        assert_eq!(parse(&format(origin)), Some(origin));
    }
}
