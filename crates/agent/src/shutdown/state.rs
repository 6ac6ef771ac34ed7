//! `<root-dir>/graceful_node_shutdown_state`: when the last graceful node shutdown started and
//! ended, as upstream's node shutdown manager keeps it (Go's JSON of two `time.Time`s, the zero
//! time `0001-01-01T00:00:00Z` for one not reached), written atomically.

use std::io;
use std::path::Path;

use jiff::Timestamp;

/// The file's name under the root directory.
pub const FILE: &str = "graceful_node_shutdown_state";

/// Go's zero `time.Time` in JSON.
const GO_ZERO_TIME: &str = "0001-01-01T00:00:00Z";

#[derive(Debug, Clone, Default, PartialEq)]
pub struct State {
    pub start: Option<Timestamp>,
    pub end: Option<Timestamp>,
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct OnDisk {
    start_time: String,
    end_time: String,
}

fn go_time(t: Option<Timestamp>) -> String {
    t.map_or_else(|| GO_ZERO_TIME.to_string(), |t| t.to_string())
}

fn from_go_time(text: &str) -> Option<Timestamp> {
    text.parse().ok().filter(|_| text != GO_ZERO_TIME)
}

/// The file's content (pure).
fn render(state: &State) -> String {
    let on_disk = OnDisk { start_time: go_time(state.start), end_time: go_time(state.end) };
    serde_json::to_string(&on_disk).expect("two strings serialize")
}

/// The state in a file's content; a missing or unreadable one is no shutdown yet (pure).
fn parse(text: &str) -> State {
    match serde_json::from_str::<OnDisk>(text) {
        Ok(d) => State { start: from_go_time(&d.start_time), end: from_go_time(&d.end_time) },
        Err(_) => State::default(),
    }
}

pub fn load(file: &Path) -> State {
    std::fs::read_to_string(file).map(|t| parse(&t)).unwrap_or_default()
}

/// Writes the file through a temporary file and a rename, so a reader never sees half of it.
pub fn store(file: &Path, state: &State) -> io::Result<()> {
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, render(state))?;
    std::fs::rename(&tmp, file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_json_with_the_zero_time_for_an_unfinished_shutdown() {
        let start: Timestamp = "2026-11-24T13:00:00.5Z".parse().unwrap();
        let running = State { start: Some(start), end: None };
        assert_eq!(render(&running), r#"{"startTime":"2026-11-24T13:00:00.5Z","endTime":"0001-01-01T00:00:00Z"}"#);
        assert_eq!(parse(&render(&running)), running);
        assert_eq!(parse("not json"), State::default());
    }

    #[test]
    fn stored_and_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(FILE);
        assert_eq!(load(&file), State::default(), "no file: no shutdown yet");
        let t: Timestamp = "2026-11-24T13:00:00Z".parse().unwrap();
        let done = State { start: Some(t), end: Some(t) };
        store(&file, &done).unwrap();
        assert_eq!(load(&file), done);
        assert!(!file.with_extension("tmp").exists());
    }
}
