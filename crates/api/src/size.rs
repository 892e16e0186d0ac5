//! Sizes as people write them, with one rule, the one qemu-img uses: a
//! number of bytes, or a number and a unit where every unit is a power of
//! 1024. The units are `K`, `M`, `G`, `T`, `P` and `E` (2^10 to 2^60), in
//! any case, each optionally followed by `i` and by `B`: `10G`, `10g`,
//! `10GiB` and `10gb` are all 10 × 2^30 bytes; `B` alone means bytes. A
//! decimal number is accepted when it comes to whole bytes (`1.5G`).
//! Spaces around the number and the unit are ignored.

/// What a size looks like, for messages and help texts.
const SIZE_SYNTAX: &str =
    "a number of bytes, or a number with a unit K, M, G, T, P or E (powers of 1024, any case, optional i and B: 10G = 10GiB = 10gb)";

/// Parse a size in bytes by the module's rule. Refuses empty and negative
/// sizes, unknown units, fractions of a byte and overflow, with a message
/// that says what a size looks like.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("{s:?}: a size cannot be negative"));
    }
    let t = t.strip_prefix('+').unwrap_or(t);
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult = unit_multiplier(unit.trim()).ok_or_else(|| {
        format!(
            "unknown size unit {:?} in {s:?}: a size is {SIZE_SYNTAX}",
            unit.trim()
        )
    })?;
    if num.is_empty() {
        return Err(format!("{s:?} is not a size: a size is {SIZE_SYNTAX}"));
    }
    let not_a_size = || format!("{s:?} is not a size: a size is {SIZE_SYNTAX}");
    let too_large = || format!("{s:?} is too large (the largest size is 16 EiB less one byte)");
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if frac.contains('.') || (num.contains('.') && frac.is_empty()) || frac.len() > 18 {
        return Err(not_a_size());
    }
    let i: u64 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| too_large())?
    };
    let whole = i.checked_mul(mult).ok_or_else(too_large)?;
    if frac.is_empty() {
        return Ok(whole);
    }
    let f: u128 = frac.parse().map_err(|_| not_a_size())?;
    let scale = 10u128.pow(frac.len() as u32);
    let scaled = f * mult as u128;
    if !scaled.is_multiple_of(scale) {
        return Err(format!("{s:?} is not a whole number of bytes"));
    }
    whole
        .checked_add((scaled / scale) as u64)
        .ok_or_else(too_large)
}

/// The multiplier of a unit: a letter of `KMGTPE` (any case), then an
/// optional `i`, then an optional `B`; or `B` or nothing for bytes.
fn unit_multiplier(unit: &str) -> Option<u64> {
    let u = unit.to_ascii_lowercase();
    let rest = match u.strip_suffix('b') {
        Some(r) => r,
        None => u.as_str(),
    };
    if rest.is_empty() {
        return Some(1);
    }
    let rest = rest.strip_suffix('i').unwrap_or(rest);
    let shift = match rest {
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        "p" => 50,
        "e" => 60,
        _ => return None,
    };
    Some(1u64 << shift)
}

/// Bytes in the largest binary unit that keeps one decimal: `10.0 GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_is_binary_in_any_case() {
        for ok in [
            "10G", "10g", "10GiB", "10gib", "10GB", "10gb", "10Gi", "10gI", " 10 GiB ",
        ] {
            assert_eq!(parse_size(ok), Ok(10 << 30), "{ok:?}");
        }
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4096b"), Ok(4096));
        assert_eq!(parse_size("4096B"), Ok(4096));
        assert_eq!(parse_size("1k"), Ok(1024));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1TB"), Ok(1 << 40));
        assert_eq!(parse_size("1tb"), Ok(1 << 40));
        assert_eq!(parse_size("2P"), Ok(2 << 50));
        assert_eq!(parse_size("15E"), Ok(15 << 60));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size(".5k"), Ok(512));
        assert_eq!(parse_size("+1M"), Ok(1 << 20));
        assert_eq!(parse_size("0"), Ok(0));
    }

    #[test]
    fn bad_sizes_say_why() {
        let e = parse_size("-1").unwrap_err();
        assert!(e.contains("cannot be negative"), "{e}");
        let e = parse_size("10 parsecs").unwrap_err();
        assert!(
            e.contains("unknown size unit \"parsecs\"") && e.contains("powers of 1024"),
            "{e}"
        );
        let e = parse_size("99999999999PiB").unwrap_err();
        assert!(e.contains("too large"), "{e}");
        let e = parse_size("16E").unwrap_err();
        assert!(e.contains("too large"), "{e}");
        let e = parse_size("0.1B").unwrap_err();
        assert!(e.contains("whole number of bytes"), "{e}");
        for bad in ["", "GiB", "1.2.3G", "1.G", ".", "10iB", "10KK", "1e3"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(10 << 30), "10.0 GiB");
        assert_eq!(format_size(1 << 56), "64.0 PiB");
        assert_eq!(format_size(100), "100 B");
    }
}
