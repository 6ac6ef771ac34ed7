//! Go `time.Duration` syntax: parsing (`time.ParseDuration`), printing
//! (`Duration.String`) and serde support for `metav1.Duration` fields of the
//! KubeletConfiguration file.
//!
//! Go durations are signed 64-bit nanosecond counts, so the parser keeps the
//! sign and the exact range; callers turn the value into a
//! [`std::time::Duration`] once they have checked that it is not negative.

use std::fmt;
use std::time::Duration;

/// A Go `time.Duration`: a signed number of nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GoDuration(i64);

const NANOS_PER_MICRO: u128 = 1_000;
const NANOS_PER_MILLI: u128 = 1_000_000;
const NANOS_PER_SECOND: u128 = 1_000_000_000;
const NANOS_PER_MINUTE: u128 = 60 * NANOS_PER_SECOND;
const NANOS_PER_HOUR: u128 = 60 * NANOS_PER_MINUTE;

/// Why a duration string was rejected; the message mirrors Go's wording so
/// that people who know the Go kubelet recognise it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("invalid duration {0:?}: expected a Go duration such as \"20s\", \"1m30s\", \"500ms\" or \"1h\"")]
    Invalid(String),
    #[error("missing unit in duration {0:?}: add one of ns, us, ms, s, m, h (for example \"{0}s\")")]
    MissingUnit(String),
    #[error("unknown unit {unit:?} in duration {input:?}: valid units are ns, us (or µs), ms, s, m, h")]
    UnknownUnit { unit: String, input: String },
    #[error("duration {0:?} is out of range (at most about 292 years)")]
    Overflow(String),
}

impl GoDuration {
    pub const ZERO: GoDuration = GoDuration(0);

    pub const fn from_nanos(nanos: i64) -> Self {
        GoDuration(nanos)
    }

    pub const fn from_secs(secs: i64) -> Self {
        GoDuration(secs * 1_000_000_000)
    }

    pub const fn as_nanos(self) -> i64 {
        self.0
    }

    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    pub const fn is_negative(self) -> bool {
        self.0 < 0
    }

    /// The duration as a `std` duration, or `None` when it is negative.
    pub fn to_std(self) -> Option<Duration> {
        u64::try_from(self.0).ok().map(Duration::from_nanos)
    }

    /// Converts a `std` duration, saturating at Go's maximum.
    pub fn from_std(d: Duration) -> Self {
        GoDuration(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
    }

    /// Parses Go duration syntax exactly as `time.ParseDuration` does: an
    /// optional sign, then one or more decimal numbers (with optional
    /// fraction) each followed by a unit (`ns`, `us`, `µs`, `μs`, `ms`, `s`,
    /// `m`, `h`), e.g. `"300ms"`, `"-1.5h"`, `"2h45m"`. The lone string `"0"`
    /// needs no unit.
    pub fn parse(input: &str) -> Result<Self, DurationError> {
        let invalid = || DurationError::Invalid(input.to_string());
        let mut s = input;
        let mut negative = false;
        if let Some(rest) = s.strip_prefix('-') {
            negative = true;
            s = rest;
        } else if let Some(rest) = s.strip_prefix('+') {
            s = rest;
        }
        if s == "0" {
            return Ok(GoDuration(0));
        }
        if s.is_empty() {
            return Err(invalid());
        }

        let mut total: u128 = 0;
        while !s.is_empty() {
            // The next character must be a digit or a '.'.
            let first = s.as_bytes()[0];
            if !(first == b'.' || first.is_ascii_digit()) {
                return Err(invalid());
            }

            // Integer part.
            let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
            let int_digits = &s[..int_len];
            s = &s[int_len..];
            let mut int_value: u128 = 0;
            for b in int_digits.bytes() {
                int_value = int_value
                    .checked_mul(10)
                    .and_then(|v| v.checked_add(u128::from(b - b'0')))
                    .filter(|v| *v <= i64::MAX as u128 + 1)
                    .ok_or_else(|| DurationError::Overflow(input.to_string()))?;
            }

            // Fraction part: like Go, digits past the precision we can carry
            // are ignored rather than rejected.
            let mut frac_value: u128 = 0;
            let mut frac_scale: u128 = 1;
            let mut has_fraction_digits = false;
            if let Some(rest) = s.strip_prefix('.') {
                s = rest;
                let frac_len = s.bytes().take_while(u8::is_ascii_digit).count();
                for b in s[..frac_len].bytes() {
                    has_fraction_digits = true;
                    if frac_scale < 10u128.pow(30) {
                        frac_value = frac_value * 10 + u128::from(b - b'0');
                        frac_scale *= 10;
                    }
                }
                s = &s[frac_len..];
            }
            if int_digits.is_empty() && !has_fraction_digits {
                // "." or ".s"
                return Err(invalid());
            }

            // Unit.
            let unit_len = s.char_indices().find(|(_, c)| *c == '.' || c.is_ascii_digit()).map_or(s.len(), |(i, _)| i);
            if unit_len == 0 {
                return Err(DurationError::MissingUnit(input.to_string()));
            }
            let unit = &s[..unit_len];
            s = &s[unit_len..];
            let unit_nanos = match unit {
                "ns" => 1,
                "us" | "µs" | "μs" => NANOS_PER_MICRO,
                "ms" => NANOS_PER_MILLI,
                "s" => NANOS_PER_SECOND,
                "m" => NANOS_PER_MINUTE,
                "h" => NANOS_PER_HOUR,
                _ => {
                    return Err(DurationError::UnknownUnit { unit: unit.to_string(), input: input.to_string() });
                }
            };

            let overflow = || DurationError::Overflow(input.to_string());
            let whole = int_value.checked_mul(unit_nanos).ok_or_else(overflow)?;
            let frac = frac_value * unit_nanos / frac_scale;
            total = total.checked_add(whole).and_then(|t| t.checked_add(frac)).ok_or_else(overflow)?;
            if total > i64::MAX as u128 + 1 {
                return Err(overflow());
            }
        }

        if negative {
            if total > i64::MAX as u128 + 1 {
                return Err(DurationError::Overflow(input.to_string()));
            }
            // total <= 2^63 here, so the negation fits.
            Ok(GoDuration((-(total as i128)) as i64))
        } else {
            i64::try_from(total).map(GoDuration).map_err(|_| DurationError::Overflow(input.to_string()))
        }
    }
}

impl std::str::FromStr for GoDuration {
    type Err = DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GoDuration::parse(s)
    }
}

impl fmt::Display for GoDuration {
    /// Prints like Go's `Duration.String`: `"0s"`, `"500ms"`, `"1.5µs"`,
    /// `"1m30s"`, `"2h0m0s"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let negative = self.0 < 0;
        let u = self.0.unsigned_abs();
        let sign = if negative { "-" } else { "" };
        if u == 0 {
            return f.write_str("0s");
        }
        if u < NANOS_PER_SECOND as u64 {
            let (unit, scale) = if u < NANOS_PER_MICRO as u64 {
                ("ns", 1u64)
            } else if u < NANOS_PER_MILLI as u64 {
                ("µs", NANOS_PER_MICRO as u64)
            } else {
                ("ms", NANOS_PER_MILLI as u64)
            };
            return write!(f, "{sign}{}{unit}", fraction(u, scale));
        }
        let hours = u / NANOS_PER_HOUR as u64;
        let rem = u % NANOS_PER_HOUR as u64;
        let minutes = rem / NANOS_PER_MINUTE as u64;
        let rem = rem % NANOS_PER_MINUTE as u64;
        let secs = fraction(rem, NANOS_PER_SECOND as u64);
        if hours > 0 {
            write!(f, "{sign}{hours}h{minutes}m{secs}s")
        } else if minutes > 0 {
            write!(f, "{sign}{minutes}m{secs}s")
        } else {
            write!(f, "{sign}{secs}s")
        }
    }
}

/// `value / scale` as a decimal without trailing zeros ("1.5", "2", "0.25").
fn fraction(value: u64, scale: u64) -> String {
    let whole = value / scale;
    let rem = value % scale;
    if rem == 0 {
        return whole.to_string();
    }
    let width = scale.ilog10() as usize;
    let digits = format!("{rem:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

impl<'de> serde::Deserialize<'de> for GoDuration {
    /// `metav1.Duration` is a JSON string in Go duration syntax.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = GoDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as \"20s\", \"1m30s\" or \"500ms\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<GoDuration, E> {
                GoDuration::parse(v).map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

impl serde::Serialize for GoDuration {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Prints a `std` duration in Go syntax.
pub fn format_std(d: Duration) -> String {
    GoDuration::from_std(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> i64 {
        GoDuration::parse(s).unwrap_or_else(|e| panic!("{s}: {e}")).as_nanos()
    }

    #[test]
    fn parses_go_examples() {
        assert_eq!(p("0"), 0);
        assert_eq!(p("0s"), 0);
        assert_eq!(p("-0"), 0);
        assert_eq!(p("+0"), 0);
        assert_eq!(p("20s"), 20_000_000_000);
        assert_eq!(p("1m30s"), 90_000_000_000);
        assert_eq!(p("2m"), 120_000_000_000);
        assert_eq!(p("500ms"), 500_000_000);
        assert_eq!(p("1h"), 3_600_000_000_000);
        assert_eq!(p("2h45m"), (2 * 3600 + 45 * 60) * 1_000_000_000);
        assert_eq!(p("1.5h"), 5_400_000_000_000);
        assert_eq!(p(".5s"), 500_000_000);
        assert_eq!(p("5.s"), 5_000_000_000);
        assert_eq!(p("-1.5h"), -5_400_000_000_000);
        assert_eq!(p("+5s"), 5_000_000_000);
        assert_eq!(p("10ns"), 10);
        assert_eq!(p("10us"), 10_000);
        assert_eq!(p("10µs"), 10_000);
        assert_eq!(p("10μs"), 10_000);
        assert_eq!(p("1h1m1s1ms1us1ns"), 3_661_001_001_001);
        assert_eq!(p("0.1ns"), 0);
        assert_eq!(p("1.000000000000000000000000000000000001s"), 1_000_000_000);
        assert_eq!(p("9223372036854775807ns"), i64::MAX);
        assert_eq!(p("-9223372036854775808ns"), i64::MIN);
    }

    #[test]
    fn rejects_malformed() {
        for bad in
            ["", "-", "+", ".", ".s", "s", "1", "1.5", "1d", "1 s", " 1s", "1s ", "1sx", "1e3s", "--1s", "1m-1s", "abc"]
        {
            assert!(GoDuration::parse(bad).is_err(), "{bad:?} should be rejected");
        }
        assert!(matches!(GoDuration::parse("1"), Err(DurationError::MissingUnit(_))));
        assert!(matches!(GoDuration::parse("3d"), Err(DurationError::UnknownUnit { unit, .. }) if unit == "d"));
        assert!(matches!(GoDuration::parse("9223372036854775808ns"), Err(DurationError::Overflow(_))));
        assert!(matches!(GoDuration::parse("3000000h"), Err(DurationError::Overflow(_))));
        assert!(matches!(
            GoDuration::parse("99999999999999999999999999999999999999999h"),
            Err(DurationError::Overflow(_))
        ));
    }

    #[test]
    fn error_messages_are_actionable() {
        let msg = GoDuration::parse("20").unwrap_err().to_string();
        assert!(msg.contains("missing unit") && msg.contains("\"20s\""), "{msg}");
        let msg = GoDuration::parse("2d").unwrap_err().to_string();
        assert!(msg.contains("unknown unit \"d\""), "{msg}");
    }

    #[test]
    fn prints_like_go() {
        let cases = [
            ("0", "0s"),
            ("1ns", "1ns"),
            ("1.1us", "1.1µs"),
            ("2.2ms", "2.2ms"),
            ("500ms", "500ms"),
            ("3.3s", "3.3s"),
            ("20s", "20s"),
            ("1m30s", "1m30s"),
            ("2m", "2m0s"),
            ("4m5.001s", "4m5.001s"),
            ("1h", "1h0m0s"),
            ("5h6m7.001s", "5h6m7.001s"),
            ("-90s", "-1m30s"),
        ];
        for (input, want) in cases {
            assert_eq!(GoDuration::parse(input).unwrap().to_string(), want, "{input}");
        }
        assert_eq!(GoDuration::from_nanos(i64::MIN).to_string(), "-2562047h47m16.854775808s");
    }

    #[test]
    fn std_conversion() {
        assert_eq!(GoDuration::parse("1m").unwrap().to_std(), Some(Duration::from_secs(60)));
        assert_eq!(GoDuration::parse("-1s").unwrap().to_std(), None);
        assert_eq!(format_std(Duration::from_millis(1500)), "1.5s");
    }

    #[test]
    fn serde_round_trip() {
        let d: GoDuration = serde_json::from_str("\"1m30s\"").unwrap();
        assert_eq!(d, GoDuration::from_secs(90));
        assert_eq!(serde_json::to_string(&d).unwrap(), "\"1m30s\"");
        let err = serde_json::from_str::<GoDuration>("30").unwrap_err().to_string();
        assert!(err.contains("duration string"), "{err}");
        let err = serde_json::from_str::<GoDuration>("\"30\"").unwrap_err().to_string();
        assert!(err.contains("missing unit"), "{err}");
    }
}
