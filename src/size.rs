//! Human byte sizes: parsing `512MiB`-style flags and printing sizes in summaries.

/// Parses a byte size: a plain number of bytes, or a number with a unit `B`, `K`/`KB` (1000),
/// `KiB` (1024), `M`/`MB`, `MiB`, `G`/`GB`, `GiB`, `T`/`TB`, `TiB`. Units are case-insensitive and
/// the number may have a fraction (`1.5GiB`).
///
/// # Errors
/// A message saying what was expected when the text is not such a size or overflows `u64`.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        "t" | "tb" => 1_000_000_000_000,
        "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "unknown unit {unit:?}: expected B, KB, KiB, MB, MiB, GB, GiB, TB or TiB"
            ))
        }
    };
    if num.is_empty() {
        return Err("expected a number such as 512MiB".into());
    }
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(mult)
            .ok_or_else(|| "size too large".to_string());
    }
    let f: f64 = num
        .parse()
        .map_err(|_| format!("{num:?} is not a number"))?;
    let v = f * mult as f64;
    if !v.is_finite() || v >= u64::MAX as f64 {
        return Err("size too large".into());
    }
    Ok(v.round() as u64)
}

/// Formats bytes with a binary unit, e.g. `1.50 GiB`.
pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("123").unwrap(), 123);
        assert_eq!(parse_size("1KiB").unwrap(), 1024);
        assert_eq!(parse_size("1kb").unwrap(), 1000);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size(" 2 GB ").unwrap(), 2_000_000_000);
        assert!(parse_size("12XB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("99999999999TiB").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(human_bytes(10), "10 B");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(3 << 30), "3.00 GiB");
    }
}
