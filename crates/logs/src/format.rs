//! The CRI log format (`<RFC3339Nano> <stdout|stderr> <P|F> <content>`), one record per line,
//! as the runtime writes it (pure). A logical line written by the container may be split into
//! several partial (`P`) records followed by a full (`F`) one.

use k8s_openapi::jiff::Timestamp;

/// Which output stream a record came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One CRI log record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub timestamp: Timestamp,
    pub stream: Stream,
    /// `P`: the logical line continues in the next record.
    pub partial: bool,
    /// The content without the record's trailing newline.
    pub content: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("timestamp is not found")]
    NoTimestamp,
    #[error("unexpected timestamp format {0:?}")]
    BadTimestamp(String),
    #[error("stream type is not found")]
    NoStream,
    #[error("unexpected stream type {0:?}")]
    BadStream(String),
    #[error("log tag is not found")]
    NoTag,
}

/// Parses one record; `line` may still end with its newline. As upstream, a missing tag with
/// content is tolerated only in the sense that every field up to the tag must be present.
pub fn parse(line: &[u8]) -> Result<Record, ParseError> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let (ts, rest) = split_field(line).ok_or(ParseError::NoTimestamp)?;
    let ts_text = String::from_utf8_lossy(ts);
    let timestamp: Timestamp = ts_text.parse().map_err(|_| ParseError::BadTimestamp(ts_text.into_owned()))?;
    let (stream, rest) = split_field(rest).ok_or(ParseError::NoStream)?;
    let stream = match stream {
        b"stdout" => Stream::Stdout,
        b"stderr" => Stream::Stderr,
        other => return Err(ParseError::BadStream(String::from_utf8_lossy(other).into_owned())),
    };
    // The tag may be the last field of an empty full line ("... stdout F").
    let (tag, content) = match split_field(rest) {
        Some((tag, content)) => (tag, content),
        None if !rest.is_empty() => (rest, &b""[..]),
        None => return Err(ParseError::NoTag),
    };
    // Tags are `:`-separated; only the first (P/F) has a meaning today.
    let partial = tag.split(|b| *b == b':').next() == Some(b"P");
    Ok(Record { timestamp, stream, partial, content: content.to_vec() })
}

fn split_field(s: &[u8]) -> Option<(&[u8], &[u8])> {
    let i = s.iter().position(|b| *b == b' ')?;
    Some((&s[..i], &s[i + 1..]))
}

/// Formats a timestamp as upstream does for `timestamps=true`: RFC 3339 in UTC with exactly nine
/// fractional digits, so the prefixes line up.
pub fn format_timestamp(ts: Timestamp) -> String {
    let nanos = ts.subsec_nanosecond().rem_euclid(1_000_000_000);
    format!("{}.{nanos:09}Z", ts.strftime("%Y-%m-%dT%H:%M:%S"))
}

/// Formats a record as the runtime writes it (for tests and fixtures).
pub fn encode(r: &Record) -> Vec<u8> {
    let stream = match r.stream {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
    };
    let tag = if r.partial { "P" } else { "F" };
    let mut out = format!("{} {stream} {tag} ", format_timestamp(r.timestamp)).into_bytes();
    out.extend_from_slice(&r.content);
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_full_and_partial_records() {
        let r = parse(b"2016-10-06T00:17:09.669794202Z stdout F hello world\n").unwrap();
        assert_eq!(r.stream, Stream::Stdout);
        assert!(!r.partial);
        assert_eq!(r.content, b"hello world");
        assert_eq!(format_timestamp(r.timestamp), "2016-10-06T00:17:09.669794202Z");

        let r = parse(b"2016-10-06T00:17:09.669794203Z stderr P part").unwrap();
        assert_eq!((r.stream, r.partial, r.content.as_slice()), (Stream::Stderr, true, &b"part"[..]));
    }

    #[test]
    fn keeps_spaces_in_content_and_accepts_empty_lines_and_offsets() {
        let r = parse(b"2016-10-06T00:17:09Z stdout F  two  spaces ").unwrap();
        assert_eq!(r.content, b" two  spaces ");
        let r = parse(b"2016-10-06T00:17:09Z stdout F").unwrap();
        assert!(r.content.is_empty() && !r.partial);
        let r = parse(b"2016-10-06T02:17:09.5+02:00 stdout F x").unwrap();
        assert_eq!(format_timestamp(r.timestamp), "2016-10-06T00:17:09.500000000Z");
    }

    #[test]
    fn rejects_malformed_records_with_the_reason() {
        assert_eq!(parse(b"nospace"), Err(ParseError::NoTimestamp));
        assert!(matches!(parse(b"yesterday stdout F x"), Err(ParseError::BadTimestamp(_))));
        assert_eq!(parse(b"2016-10-06T00:17:09Z stdin F x"), Err(ParseError::BadStream("stdin".into())));
        assert_eq!(parse(b"2016-10-06T00:17:09Z stdout"), Err(ParseError::NoStream));
    }

    #[test]
    fn encode_round_trips() {
        let r = Record {
            timestamp: "2020-01-01T00:00:00.000000001Z".parse().unwrap(),
            stream: Stream::Stderr,
            partial: true,
            content: b"a b".to_vec(),
        };
        assert_eq!(parse(&encode(&r)).unwrap(), r);
    }
}
