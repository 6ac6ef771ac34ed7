//! `/containerLogs` query parameters → [`LogOptions`], decoded and validated as upstream's
//! `PodLogOptions` (pure). Errors name the parameter.

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// A query that cannot be served; the HTTP layer answers 400 with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{param}: {message}")]
pub struct InvalidParam {
    pub param: &'static str,
    pub message: String,
}

/// The validated options of one log request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    pub container: Option<String>,
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    /// Only the last N logical lines (`tailLines`).
    pub tail_lines: Option<u64>,
    /// Stop after this many bytes of output (`limitBytes`).
    pub limit_bytes: Option<u64>,
    pub since: Option<Since>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Since {
    Seconds(i64),
    Time(Timestamp),
}

impl LogOptions {
    /// Decodes `pairs` (the URL query, in order; the first value of a repeated key counts).
    pub fn from_query<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Self, InvalidParam> {
        let mut opts = LogOptions::default();
        let mut since_seconds = None;
        let mut since_time = None;
        let mut seen = std::collections::HashSet::new();
        for (key, value) in pairs {
            if !seen.insert(key) {
                continue;
            }
            match key {
                "container" => opts.container = (!value.is_empty()).then(|| value.to_string()),
                "follow" => opts.follow = go_query_bool(value),
                "previous" => opts.previous = go_query_bool(value),
                "timestamps" => opts.timestamps = go_query_bool(value),
                // `tail` is the old name; `all` means no limit.
                "tailLines" | "tail" if value == "all" => {}
                "tailLines" | "tail" => {
                    let n = int("tailLines", value)?;
                    if n < 0 {
                        return Err(invalid("tailLines", n, "must be greater than or equal to 0"));
                    }
                    opts.tail_lines = Some(n as u64);
                }
                "limitBytes" => {
                    let n = int("limitBytes", value)?;
                    if n < 1 {
                        return Err(invalid("limitBytes", n, "must be greater than 0"));
                    }
                    opts.limit_bytes = Some(n as u64);
                }
                "sinceSeconds" => {
                    let n = int("sinceSeconds", value)?;
                    if n < 1 {
                        return Err(invalid("sinceSeconds", n, "must be greater than 0"));
                    }
                    since_seconds = Some(n);
                }
                "sinceTime" => {
                    let t: Timestamp = value.parse().map_err(|e| InvalidParam {
                        param: "sinceTime",
                        message: format!("Invalid value: {value:?}: must be an RFC 3339 time ({e})"),
                    })?;
                    since_time = Some(t);
                }
                _ => {}
            }
        }
        opts.since = match (since_seconds, since_time) {
            (Some(_), Some(_)) => {
                return Err(InvalidParam {
                    param: "sinceSeconds",
                    message: "Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified".into(),
                });
            }
            (Some(s), None) => Some(Since::Seconds(s)),
            (None, Some(t)) => Some(Since::Time(t)),
            (None, None) => None,
        };
        Ok(opts)
    }

    /// The earliest record timestamp to show, given the request time.
    pub fn since_timestamp(&self, now: Timestamp) -> Option<Timestamp> {
        match self.since? {
            Since::Time(t) => Some(t),
            Since::Seconds(s) => now.checked_sub(SignedDuration::from_secs(s)).ok(),
        }
    }
}

/// Upstream's query decoding of booleans: absent or a "false" spelling is false, anything
/// else (including an empty value, `?follow`) is true.
fn go_query_bool(value: &str) -> bool {
    !matches!(value.to_ascii_lowercase().as_str(), "0" | "f" | "false" | "n" | "no")
}

fn int(param: &'static str, value: &str) -> Result<i64, InvalidParam> {
    value
        .trim()
        .parse::<i64>()
        .map_err(|_| InvalidParam { param, message: format!("Invalid value: {value:?}: must be an integer") })
}

fn invalid(param: &'static str, value: i64, why: &str) -> InvalidParam {
    InvalidParam { param, message: format!("Invalid value: {value}: {why}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(q: &[(&'static str, &'static str)]) -> Result<LogOptions, InvalidParam> {
        LogOptions::from_query(q.iter().copied())
    }

    #[test]
    fn decodes_every_parameter() {
        let o = parse(&[
            ("follow", "true"),
            ("previous", "1"),
            ("timestamps", ""),
            ("tailLines", "3"),
            ("limitBytes", "100"),
            ("sinceSeconds", "60"),
            ("container", "app"),
        ])
        .unwrap();
        assert!(o.follow && o.previous && o.timestamps);
        assert_eq!((o.tail_lines, o.limit_bytes), (Some(3), Some(100)));
        assert_eq!(o.since, Some(Since::Seconds(60)));
        assert_eq!(o.container.as_deref(), Some("app"));
        let now: Timestamp = "2024-01-01T00:01:00Z".parse().unwrap();
        assert_eq!(o.since_timestamp(now), Some("2024-01-01T00:00:00Z".parse().unwrap()));
        assert_eq!(parse(&[("follow", "false"), ("timestamps", "no")]).unwrap(), LogOptions::default());
        assert_eq!(parse(&[("tail", "all")]).unwrap().tail_lines, None);
        assert_eq!(parse(&[("tail", "2")]).unwrap().tail_lines, Some(2));
    }

    #[test]
    fn rejects_bad_values_naming_the_parameter() {
        let e = parse(&[("tailLines", "-1")]).unwrap_err();
        assert_eq!(e.to_string(), "tailLines: Invalid value: -1: must be greater than or equal to 0");
        assert_eq!(parse(&[("tailLines", "x")]).unwrap_err().param, "tailLines");
        assert_eq!(parse(&[("limitBytes", "0")]).unwrap_err().param, "limitBytes");
        assert_eq!(parse(&[("sinceSeconds", "0")]).unwrap_err().param, "sinceSeconds");
        let e = parse(&[("sinceTime", "garbage")]).unwrap_err();
        assert_eq!(e.param, "sinceTime");
        assert!(e.to_string().starts_with("sinceTime: Invalid value: \"garbage\""), "{e}");
        let e = parse(&[("sinceTime", "2024-01-01T00:00:00Z"), ("sinceSeconds", "5")]).unwrap_err();
        assert!(e.message.contains("at most one of `sinceTime` or `sinceSeconds`"), "{e}");
        assert_eq!(
            parse(&[("sinceTime", "2024-01-01T00:00:00Z")]).unwrap().since,
            Some(Since::Time("2024-01-01T00:00:00Z".parse().unwrap()))
        );
    }
}
