//! CRI records → the plain text a client sees (pure): partial records joined into logical
//! lines, then `tailLines`, `sinceSeconds`/`sinceTime`, `timestamps` and `limitBytes` applied
//! as upstream does (tail first, then since, then the byte limit, which may cut a line).

use std::collections::VecDeque;

use k8s_openapi::jiff::Timestamp;

use super::format::{Record, Stream, format_timestamp};

/// One logical line as the container wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The timestamp of its first record.
    pub timestamp: Timestamp,
    pub stream: Stream,
    /// Without the newline.
    pub content: Vec<u8>,
}

/// Joins partial records; stdout and stderr are joined separately since they interleave.
#[derive(Debug, Default)]
pub struct Assembler {
    pending: [Option<Line>; 2],
}

impl Assembler {
    /// Feeds one record; returns the logical line it completes, if any.
    pub fn push(&mut self, r: Record) -> Option<Line> {
        let slot = &mut self.pending[r.stream as usize];
        let line = match slot.take() {
            Some(mut line) => {
                line.content.extend_from_slice(&r.content);
                line
            }
            None => Line { timestamp: r.timestamp, stream: r.stream, content: r.content },
        };
        if r.partial {
            *slot = Some(line);
            None
        } else {
            Some(line)
        }
    }
}

/// Keeps the last `n` lines of what it is fed.
#[derive(Debug)]
pub struct Tail {
    n: usize,
    lines: VecDeque<Line>,
}

impl Tail {
    pub fn new(n: u64) -> Self {
        Tail { n: usize::try_from(n).unwrap_or(usize::MAX), lines: VecDeque::new() }
    }
    pub fn push(&mut self, line: Line) {
        if self.n == 0 {
            return;
        }
        if self.lines.len() == self.n {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }
    pub fn into_lines(self) -> VecDeque<Line> {
        self.lines
    }
}

/// Whether output may continue after a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// `limitBytes` reached: the response ends here.
    LimitReached,
}

/// Formats lines for the response, applying `since`, `timestamps` and `limitBytes`.
#[derive(Debug)]
pub struct Renderer {
    since: Option<Timestamp>,
    timestamps: bool,
    remaining: Option<u64>,
}

impl Renderer {
    pub fn new(since: Option<Timestamp>, timestamps: bool, limit_bytes: Option<u64>) -> Self {
        Renderer { since, timestamps, remaining: limit_bytes }
    }

    /// Appends `line` (if shown) to `out`.
    pub fn render(&mut self, line: &Line, out: &mut Vec<u8>) -> Flow {
        if self.remaining == Some(0) {
            return Flow::LimitReached;
        }
        if self.since.is_some_and(|since| line.timestamp < since) {
            return Flow::Continue;
        }
        let start = out.len();
        if self.timestamps {
            out.extend_from_slice(format_timestamp(line.timestamp).as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(&line.content);
        out.push(b'\n');
        let Some(remaining) = self.remaining.as_mut() else { return Flow::Continue };
        let written = (out.len() - start) as u64;
        if written >= *remaining {
            out.truncate(start + *remaining as usize);
            *remaining = 0;
            return Flow::LimitReached;
        }
        *remaining -= written;
        Flow::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::parse;

    fn lines(records: &[&str]) -> Vec<Line> {
        let mut a = Assembler::default();
        records.iter().filter_map(|r| a.push(parse(r.as_bytes()).unwrap())).collect()
    }

    fn render(lines: &[Line], r: &mut Renderer) -> String {
        let mut out = Vec::new();
        for l in lines {
            if r.render(l, &mut out) == Flow::LimitReached {
                break;
            }
        }
        String::from_utf8(out).unwrap()
    }

    const LOG: &[&str] = &[
        "2024-01-01T00:00:01Z stdout F one",
        "2024-01-01T00:00:02Z stdout P tw",
        "2024-01-01T00:00:02.5Z stderr F err",
        "2024-01-01T00:00:03Z stdout F o",
        "2024-01-01T00:00:04Z stdout F three",
    ];

    #[test]
    fn joins_partial_records_per_stream() {
        let l = lines(LOG);
        let text: Vec<_> = l.iter().map(|l| String::from_utf8_lossy(&l.content).into_owned()).collect();
        assert_eq!(text, ["one", "err", "two", "three"]);
        assert_eq!(l[2].timestamp, "2024-01-01T00:00:02Z".parse().unwrap());
    }

    #[test]
    fn timestamps_since_and_limit() {
        let l = lines(LOG);
        assert_eq!(render(&l, &mut Renderer::new(None, false, None)), "one\nerr\ntwo\nthree\n");
        let since = Some("2024-01-01T00:00:02.5Z".parse().unwrap());
        assert_eq!(render(&l, &mut Renderer::new(since, false, None)), "err\nthree\n");
        assert_eq!(render(&l[..1], &mut Renderer::new(None, true, None)), "2024-01-01T00:00:01.000000000Z one\n");
        assert_eq!(render(&l, &mut Renderer::new(None, false, Some(6))), "one\ner");
        assert_eq!(render(&l, &mut Renderer::new(None, false, Some(4))), "one\n");
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        let mut t = Tail::new(2);
        lines(LOG).into_iter().for_each(|l| t.push(l));
        let kept: Vec<_> = t.into_lines().into_iter().map(|l| l.content).collect();
        assert_eq!(kept, [b"two".to_vec(), b"three".to_vec()]);
        let mut t = Tail::new(0);
        lines(LOG).into_iter().for_each(|l| t.push(l));
        assert!(t.into_lines().is_empty());
    }
}
