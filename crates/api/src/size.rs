//! Sizes as people write them: `10GiB`, `512MiB`, `1TB`, `4096`, `1.5G`.
//! Binary units (KiB, MiB...) and the short forms (K, M, G, T, P) are powers
//! of 1024; decimal units (kB, MB, GB, TB, PB) are powers of 1000.

/// Parse a size in bytes. Refuses empty, negative, fractional bytes and overflow.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim();
    let mult: u64 = match unit {
        "" | "B" | "b" => 1,
        "K" | "k" | "KiB" | "Ki" => 1 << 10,
        "M" | "MiB" | "Mi" => 1 << 20,
        "G" | "GiB" | "Gi" => 1 << 30,
        "T" | "TiB" | "Ti" => 1 << 40,
        "P" | "PiB" | "Pi" => 1 << 50,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "PB" => 1_000_000_000_000_000,
        _ => {
            return Err(format!(
                "unknown size unit {unit:?} in {s:?} (use e.g. 4096, 512MiB, 10GiB, 1TiB)"
            ))
        }
    };
    if num.is_empty() {
        return Err(format!(
            "{s:?} is not a size (use e.g. 4096, 512MiB, 10GiB, 1TiB)"
        ));
    }
    let bytes = if let Some((int, frac)) = num.split_once('.') {
        if frac.contains('.') || frac.is_empty() || frac.len() > 9 {
            return Err(format!("{s:?} is not a size"));
        }
        let i: u64 = int.parse().unwrap_or(0);
        let f: u64 = frac.parse().map_err(|_| format!("{s:?} is not a size"))?;
        let scale = 10u64.pow(frac.len() as u32);
        let whole = i
            .checked_mul(mult)
            .ok_or_else(|| format!("{s:?} is too large"))?;
        let part = (f as u128 * mult as u128 / scale as u128) as u64;
        if !(f as u128 * mult as u128).is_multiple_of(scale as u128) {
            return Err(format!("{s:?} is not a whole number of bytes"));
        }
        whole
            .checked_add(part)
            .ok_or_else(|| format!("{s:?} is too large"))?
    } else {
        let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a size"))?;
        n.checked_mul(mult)
            .ok_or_else(|| format!("{s:?} is too large"))?
    };
    Ok(bytes)
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
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("10GiB"), Ok(10 << 30));
        assert_eq!(parse_size("10G"), Ok(10 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("1TB"), Ok(1_000_000_000_000));
        assert_eq!(parse_size(" 512 MiB "), Ok(512 << 20));
        for bad in [
            "",
            "GiB",
            "-1",
            "1.2.3G",
            "10 parsecs",
            "99999999999PiB",
            "0.1B",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
        assert_eq!(format_size(10 << 30), "10.0 GiB");
        assert_eq!(format_size(100), "100 B");
    }
}
