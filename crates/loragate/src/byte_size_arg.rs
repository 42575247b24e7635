//! Sizes in bytes on the command line: `4GiB`, `512MiB`, `4GB`, `4G`, `1.5GiB`, or a bare number of bytes.
//! Binary units (`KiB`, `MiB`, `GiB`, `TiB`, and `K`, `M`, `G`, `T` as vLLM reads them) are powers of 1024; decimal
//! ones (`KB`, `MB`, `GB`, `TB`) powers of 1000; case does not matter.

/// Parses a command-line size in bytes.
pub fn parse_byte_size(raw: &str) -> Result<u64, String> {
    let trimmed = raw.trim();
    let split = trimmed.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("{raw:?} is not a size (try 4GiB, 512MiB or 1073741824)"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => return Err(format!("unknown unit {other:?} in {raw:?} (use KiB, MiB, GiB, TiB, or KB, MB, GB, TB)")),
    };
    let bytes = value * scale as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(format!("{raw:?} is not a size of at least one byte"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_and_decimal_units_and_bare_bytes_parse() {
        assert_eq!(parse_byte_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_byte_size("4G"), Ok(4 << 30), "vLLM's G is GiB");
        assert_eq!(parse_byte_size("4GB"), Ok(4_000_000_000));
        assert_eq!(parse_byte_size("512mib"), Ok(512 << 20));
        assert_eq!(parse_byte_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_byte_size(" 1073741824 "), Ok(1 << 30));
        for bad in ["", "GiB", "four", "4 parsecs", "0", "-1GiB", "0.1"] {
            assert!(parse_byte_size(bad).is_err(), "{bad:?}");
        }
    }
}
