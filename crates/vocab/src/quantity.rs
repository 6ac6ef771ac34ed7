//! Resource quantities (`"100Mi"`, `"500m"`, `"1.5"`, `"1e3"`) as the API's
//! `resource.Quantity` parses them, and the canonical forms the Go kubelet
//! prints for node capacity and allocatable.
//!
//! Values are kept in milli-units (`i128`), rounded up as upstream's
//! `MilliValue` does, which is exact for everything a node reports.

/// Why a quantity or percentage did not parse; each names the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("{0:?} is not a valid quantity (expected a number with an optional suffix, e.g. 500m, 100Mi, 1Gi, 2)")]
    Invalid(String),
    #[error("{0:?} is too large")]
    TooLarge(String),
    #[error("{0:?} is out of range")]
    OutOfRange(String),
    #[error("{0:?} is not a percentage")]
    NotPercentage(String),
    #[error("{0:?} is not a valid percentage")]
    InvalidPercentage(String),
}

/// Parses a quantity into milli-units.
pub fn parse_milli(s: &str) -> Result<i128, QuantityError> {
    let bad = || QuantityError::Invalid(s.to_string());
    let t = s.trim();
    if t.is_empty() || t != s {
        return Err(bad());
    }
    let (negative, rest) = match t.as_bytes()[0] {
        b'-' => (true, &t[1..]),
        b'+' => (false, &t[1..]),
        _ => (false, t),
    };
    let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(num_end);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
        return Err(bad());
    }
    if int_part.len() + frac_part.len() > 30 {
        return Err(QuantityError::TooLarge(s.to_string()));
    }
    let digits = format!("{int_part}{frac_part}");
    let mantissa: i128 = digits.parse().map_err(|_| bad())?;
    // value = mantissa * 10^-frac * multiplier * 1000 (milli)
    let (numerator_mult, mut exp10): (i128, i32) = match suffix {
        "" => (1, 0),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().map_err(|_| bad())?;
            if !(-30..=30).contains(&exp) {
                return Err(QuantityError::OutOfRange(s.to_string()));
            }
            (1, exp)
        }
        _ => return Err(bad()),
    };
    exp10 += 3; // milli
    exp10 -= frac_part.len() as i32;
    let too_large = || QuantityError::TooLarge(s.to_string());
    let mut value = mantissa.checked_mul(numerator_mult).ok_or_else(too_large)?;
    if exp10 >= 0 {
        let scale = 10i128.checked_pow(exp10 as u32).ok_or_else(too_large)?;
        value = value.checked_mul(scale).ok_or_else(too_large)?;
    } else {
        let scale = 10i128.checked_pow((-exp10) as u32).ok_or_else(too_large)?;
        // Round up (away from zero for positive values), as MilliValue does.
        value = (value + scale - 1) / scale;
    }
    if value > i64::MAX as i128 * 1000 {
        return Err(too_large());
    }
    Ok(if negative { -value } else { value })
}

/// Parses a quantity into whole units, rounded up (memory, storage, pods).
pub fn parse_units(s: &str) -> Result<i128, QuantityError> {
    let milli = parse_milli(s)?;
    Ok(ceil_div(milli, 1000))
}

fn ceil_div(a: i128, b: i128) -> i128 {
    if a >= 0 { (a + b - 1) / b } else { a / b }
}

/// Canonical `DecimalSI` form of a milli-unit value: `2`, `1900m`, `5k`.
pub fn format_decimal_milli(milli: i128) -> String {
    if milli % 1000 != 0 {
        return format!("{milli}m");
    }
    format_decimal_units(milli / 1000)
}

/// Canonical `DecimalSI` form of a whole number: `110`, `5k`, `0`.
pub fn format_decimal_units(n: i128) -> String {
    if n == 0 {
        return "0".to_string();
    }
    const SUFFIXES: [&str; 6] = ["k", "M", "G", "T", "P", "E"];
    let mut best = (n, "");
    let mut scale = 1i128;
    for suffix in SUFFIXES {
        scale *= 1000;
        if n % scale == 0 {
            best = (n / scale, suffix);
        } else {
            break;
        }
    }
    format!("{}{}", best.0, best.1)
}

/// Canonical `BinarySI` form of a byte count: `16265572Ki`, `1Gi`, or a plain
/// number when no power of 1024 divides it (values below 1024 print in
/// `DecimalSI`, as upstream does).
pub fn format_binary_bytes(bytes: i128) -> String {
    if bytes > -1024 && bytes < 1024 {
        return format_decimal_units(bytes);
    }
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let mut best = (bytes, "");
    let mut scale = 1i128;
    for suffix in SUFFIXES {
        scale *= 1024;
        if bytes % scale == 0 {
            best = (bytes / scale, suffix);
        } else {
            break;
        }
    }
    format!("{}{}", best.0, best.1)
}

/// A percentage as upstream's eviction thresholds parse it: a float32
/// fraction (`"10%"` → 0.1f32).
pub fn parse_percentage(s: &str) -> Result<f32, QuantityError> {
    let number = s.strip_suffix('%').ok_or_else(|| QuantityError::NotPercentage(s.to_string()))?;
    let invalid = || QuantityError::InvalidPercentage(s.to_string());
    let value: f32 = number.trim().parse().map_err(|_| invalid())?;
    if !value.is_finite() {
        return Err(invalid());
    }
    Ok(value / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_forms() {
        assert_eq!(parse_milli("100m").unwrap(), 100);
        assert_eq!(parse_milli("2").unwrap(), 2000);
        assert_eq!(parse_milli("1.5").unwrap(), 1500);
        assert_eq!(parse_milli(".5").unwrap(), 500);
        assert_eq!(parse_milli("5.").unwrap(), 5000);
        assert_eq!(parse_units("100Mi").unwrap(), 100 * 1024 * 1024);
        assert_eq!(parse_units("1Gi").unwrap(), 1 << 30);
        assert_eq!(parse_units("1.5Gi").unwrap(), 3 << 29);
        assert_eq!(parse_units("1G").unwrap(), 1_000_000_000);
        assert_eq!(parse_units("1e3").unwrap(), 1000);
        assert_eq!(parse_units("1E-3").unwrap(), 1, "rounded up");
        assert_eq!(parse_milli("0.0001").unwrap(), 1, "rounded up to a milli");
        assert_eq!(parse_milli("-1").unwrap(), -1000);
        assert_eq!(parse_milli("+1k").unwrap(), 1_000_000);
        assert_eq!(parse_units("0").unwrap(), 0);
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", " 1", "1 ", "abc", "1Zi", "1.2.3", ".", "1e", "1ee3", "--1", "1e999", "1Ki2"] {
            assert!(parse_milli(bad).is_err(), "{bad:?}");
        }
        assert!(parse_milli("99999999999999999999999999999999").is_err());
    }

    #[test]
    fn canonical_forms_match_upstream() {
        assert_eq!(format_decimal_milli(2000), "2");
        assert_eq!(format_decimal_milli(1900), "1900m");
        assert_eq!(format_decimal_milli(0), "0");
        assert_eq!(format_decimal_units(110), "110");
        assert_eq!(format_decimal_units(5000), "5k");
        assert_eq!(format_binary_bytes(16_656_146_432), "16265768Ki");
        assert_eq!(format_binary_bytes(1 << 30), "1Gi");
        assert_eq!(format_binary_bytes(93_478_772_582), "93478772582");
        assert_eq!(format_binary_bytes(0), "0");
        assert_eq!(format_binary_bytes(1000), "1k");
        assert_eq!(format_binary_bytes(1024), "1Ki");
    }

    #[test]
    fn percentages_are_float32_fractions() {
        assert_eq!(parse_percentage("10%").unwrap(), 0.1f32);
        assert_eq!(parse_percentage("7.5%").unwrap(), 0.075f32);
        assert!(parse_percentage("10").is_err());
        assert!(parse_percentage("x%").is_err());
    }
}
