//! Streams a container's log (all its files, oldest first) to a sink, and with `follow` keeps
//! reading the current file as it grows, across rotations: when the path names a new file
//! (the log manager renamed the old one and the runtime reopened it), the old handle is
//! drained first, then reading continues at the start of the new file, so no line is lost
//! or repeated. Blocking I/O: run it on a blocking thread.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use super::files;
use super::format;
use super::options::LogOptions;
use super::render::{Assembler, Flow, Line, Renderer, Tail};

/// Where the output goes; `write` returns false once the client is gone.
pub trait Sink {
    fn write(&mut self, bytes: &[u8]) -> bool;
    /// The client went away (checked while idle in follow mode).
    fn closed(&self) -> bool;
}

/// How follow mode learns that the container stopped (then the stream ends, as upstream).
pub trait Liveness {
    fn running(&mut self) -> bool;
}

/// How often follow mode looks for new data and how often it asks whether the container runs.
#[derive(Debug, Clone, Copy)]
pub struct FollowTiming {
    pub poll: Duration,
    pub liveness_every: Duration,
}

impl Default for FollowTiming {
    fn default() -> Self {
        FollowTiming { poll: Duration::from_millis(100), liveness_every: Duration::from_secs(1) }
    }
}

/// Why streaming ended.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    /// Everything was sent (or the container stopped while following).
    Done,
    LimitReached,
    ClientGone,
}

struct Output<'a> {
    sink: &'a mut dyn Sink,
    renderer: Renderer,
    buf: Vec<u8>,
}

impl Output<'_> {
    /// Renders and sends one line.
    fn line(&mut self, line: &Line) -> Option<End> {
        self.buf.clear();
        let flow = self.renderer.render(line, &mut self.buf);
        if !self.buf.is_empty() && !self.sink.write(&self.buf) {
            return Some(End::ClientGone);
        }
        (flow == Flow::LimitReached).then_some(End::LimitReached)
    }
}

/// Streams the log whose current file is `path`.
pub fn stream(
    path: &Path,
    opts: &LogOptions,
    now: Timestamp,
    sink: &mut dyn Sink,
    liveness: &mut dyn Liveness,
    timing: FollowTiming,
) -> io::Result<End> {
    let mut out = Output {
        sink,
        renderer: Renderer::new(opts.since_timestamp(now), opts.timestamps, opts.limit_bytes),
        buf: Vec::new(),
    };
    let mut assembler = Assembler::default();
    let mut tail = opts.tail_lines.map(Tail::new);
    let mut emit = |line: Line, out: &mut Output| -> Option<End> {
        match tail.as_mut() {
            Some(t) => {
                t.push(line);
                None
            }
            None => out.line(&line),
        }
    };

    // The rotations are complete files; the current one is read to its end with a handle
    // that follow mode keeps using.
    let all = files::all_files(path)?;
    for file in all.iter().filter(|f| f.as_path() != path) {
        let mut reader = match files::open(file) {
            Ok(r) => r,
            // Removed by the log manager meanwhile: older than anything we still show.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let mut pending = Vec::new();
        while let Some(line) = next_line(&mut reader, &mut pending)? {
            if let Some(end) = feed(&line, &mut assembler).and_then(|l| emit(l, &mut out)) {
                return Ok(end);
            }
        }
    }
    let mut current = match File::open(path) {
        Ok(f) => Some(Current::new(f)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    if let Some(cur) = current.as_mut() {
        while let Some(line) = cur.next_line()? {
            if let Some(end) = feed(&line, &mut assembler).and_then(|l| emit(l, &mut out)) {
                return Ok(end);
            }
        }
    }
    if let Some(t) = tail.take() {
        for line in t.into_lines() {
            if let Some(end) = out.line(&line) {
                return Ok(end);
            }
        }
    }
    if !opts.follow {
        return Ok(End::Done);
    }
    follow(path, current, &mut assembler, &mut out, liveness, timing)
}

fn follow(
    path: &Path,
    mut current: Option<Current>,
    assembler: &mut Assembler,
    out: &mut Output,
    liveness: &mut dyn Liveness,
    timing: FollowTiming,
) -> io::Result<End> {
    let mut last_check = Instant::now();
    loop {
        if let Some(cur) = current.as_mut() {
            while let Some(line) = cur.next_line()? {
                if let Some(end) = feed(&line, assembler).and_then(|l| out.line(&l)) {
                    return Ok(end);
                }
            }
        }
        // At the end of what we have: has the path moved on to a new file?
        match std::fs::metadata(path) {
            Ok(meta) if current.as_ref().is_none_or(|c| c.ino != meta.ino() || c.dev != meta.dev()) => {
                if let Some(cur) = current.as_mut() {
                    // Lines written just before the runtime reopened its log.
                    while let Some(line) = cur.next_line()? {
                        if let Some(end) = feed(&line, assembler).and_then(|l| out.line(&l)) {
                            return Ok(end);
                        }
                    }
                }
                match File::open(path) {
                    Ok(f) => {
                        tracing::debug!(file = %path.display(), "log file rotated, following the new file");
                        current = Some(Current::new(f));
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
            // Same file, or renamed and not yet reopened: wait.
            _ => {}
        }
        if out.sink.closed() {
            return Ok(End::ClientGone);
        }
        if last_check.elapsed() >= timing.liveness_every {
            last_check = Instant::now();
            if !liveness.running() {
                // One last read: the container may have written before it exited.
                if let Some(cur) = current.as_mut() {
                    while let Some(line) = cur.next_line()? {
                        if let Some(end) = feed(&line, assembler).and_then(|l| out.line(&l)) {
                            return Ok(end);
                        }
                    }
                }
                return Ok(End::Done);
            }
        }
        std::thread::sleep(timing.poll);
    }
}

/// The current log file being followed.
struct Current {
    reader: BufReader<File>,
    ino: u64,
    dev: u64,
    /// A record whose newline has not been written yet.
    pending: Vec<u8>,
}

impl Current {
    fn new(file: File) -> Self {
        let (ino, dev) = file.metadata().map(|m| (m.ino(), m.dev())).unwrap_or_default();
        Current { reader: BufReader::new(file), ino, dev, pending: Vec::new() }
    }

    fn next_line(&mut self) -> io::Result<Option<Vec<u8>>> {
        let line = next_line(&mut self.reader, &mut self.pending)?;
        if line.is_none() && !self.pending.is_empty() {
            // Re-read the unfinished record later: rewinding keeps the file position honest.
            let back = self.pending.len() as i64;
            self.pending.clear();
            self.reader.seek(SeekFrom::Current(-back))?;
        }
        Ok(line)
    }
}

/// The next complete record (with its newline) or None at the current end of input; an
/// unfinished record stays in `pending`.
fn next_line(reader: &mut dyn BufRead, pending: &mut Vec<u8>) -> io::Result<Option<Vec<u8>>> {
    reader.read_until(b'\n', pending)?;
    if pending.last() == Some(&b'\n') { Ok(Some(std::mem::take(pending))) } else { Ok(None) }
}

/// Parses one record; malformed records are skipped with a log line, as upstream does.
fn feed(raw: &[u8], assembler: &mut Assembler) -> Option<Line> {
    match format::parse(raw) {
        Ok(record) => assembler.push(record),
        Err(e) => {
            tracing::warn!(error = %e, line = %String::from_utf8_lossy(raw).trim_end(), "skipping malformed CRI log line");
            None
        }
    }
}

/// The log file of a container instance: `<pod log dir>/<container>/<attempt>.log`.
pub fn instance_log_path(pod_log_dir: &Path, container: &str, attempt: u32) -> PathBuf {
    pod_log_dir.join(container).join(format!("{attempt}.log"))
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::mpsc;

    use super::*;

    struct VecSink(Vec<u8>);
    impl Sink for VecSink {
        fn write(&mut self, bytes: &[u8]) -> bool {
            self.0.extend_from_slice(bytes);
            true
        }
        fn closed(&self) -> bool {
            false
        }
    }

    struct Always(bool);
    impl Liveness for Always {
        fn running(&mut self) -> bool {
            self.0
        }
    }

    fn record(second: u32, text: &str) -> String {
        format!("2024-01-01T00:00:{second:02}Z stdout F {text}\n")
    }

    fn read(path: &Path, query: &[(&str, &str)]) -> String {
        let opts = LogOptions::from_query(query.iter().copied()).unwrap();
        let mut sink = VecSink(Vec::new());
        stream(path, &opts, Timestamp::now(), &mut sink, &mut Always(false), FollowTiming::default()).unwrap();
        String::from_utf8(sink.0).unwrap()
    }

    #[test]
    fn reads_rotations_then_current_with_tail() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        std::fs::write(dir.path().join("0.log.20240101-000000"), record(1, "a") + &record(2, "b")).unwrap();
        std::fs::write(&log, record(3, "c") + "2024-01-01T00:00:04Z stdout P d" + "\n" + &record(5, "e")).unwrap();
        assert_eq!(read(&log, &[]), "a\nb\nc\nde\n");
        assert_eq!(read(&log, &[("tailLines", "3")]), "b\nc\nde\n");
        assert_eq!(read(&log, &[("tailLines", "3"), ("limitBytes", "3")]), "b\nc");
        assert_eq!(read(&log, &[("sinceTime", "2024-01-01T00:00:03Z")]), "c\nde\n");
    }

    /// A client that went away ends a follow even when no new line comes.
    #[test]
    fn follow_ends_when_the_client_is_gone() {
        struct Gone;
        impl Sink for Gone {
            fn write(&mut self, _: &[u8]) -> bool {
                true
            }
            fn closed(&self) -> bool {
                true
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        std::fs::write(&log, record(1, "a")).unwrap();
        let opts = LogOptions { follow: true, ..Default::default() };
        let end = stream(&log, &opts, Timestamp::now(), &mut Gone, &mut Always(true), FollowTiming::default()).unwrap();
        assert_eq!(end, End::ClientGone);
    }

    /// Follow sees lines appended later and continues on the new file after a rename +
    /// reopen, without losing the lines written to the old file in between.
    #[test]
    fn follow_continues_across_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        std::fs::write(&log, record(1, "first")).unwrap();

        struct ChanSink(mpsc::Sender<Vec<u8>>);
        impl Sink for ChanSink {
            fn write(&mut self, bytes: &[u8]) -> bool {
                self.0.send(bytes.to_vec()).is_ok()
            }
            fn closed(&self) -> bool {
                false
            }
        }
        struct UntilFlag(std::sync::Arc<std::sync::atomic::AtomicBool>);
        impl Liveness for UntilFlag {
            fn running(&mut self) -> bool {
                !self.0.load(std::sync::atomic::Ordering::SeqCst)
            }
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let (path, flag) = (log.clone(), stop.clone());
        let timing = FollowTiming { poll: Duration::from_millis(5), liveness_every: Duration::from_millis(5) };
        let follower = std::thread::spawn(move || {
            let opts = LogOptions { follow: true, ..Default::default() };
            stream(&path, &opts, Timestamp::now(), &mut ChanSink(tx), &mut UntilFlag(flag), timing).unwrap()
        });
        let recv = || String::from_utf8(rx.recv_timeout(Duration::from_secs(10)).unwrap()).unwrap();
        assert_eq!(recv(), "first\n");

        let mut old = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        old.write_all(record(2, "second").as_bytes()).unwrap();
        assert_eq!(recv(), "second\n");
        // Rotate: rename, the runtime writes one more line to the old handle, then reopens.
        std::fs::rename(&log, dir.path().join("0.log.20240101-000002")).unwrap();
        old.write_all(record(3, "third").as_bytes()).unwrap();
        std::fs::write(&log, record(4, "fourth")).unwrap();
        assert_eq!(recv(), "third\n");
        assert_eq!(recv(), "fourth\n");
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(follower.join().unwrap(), End::Done);
        assert!(rx.try_recv().is_err(), "nothing repeated");
    }
}
