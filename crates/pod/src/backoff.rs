//! Crash-loop backoff, with the Go kubelet's numbers: the first restart is immediate, then
//! 10 s doubling to 300 s, and the delay resets once a container stayed up (or quiet) for
//! 10 minutes.

use std::collections::HashMap;

use super::{Nanos, SECOND};

pub const INITIAL: Nanos = 10 * SECOND;
pub const MAX: Nanos = 300 * SECOND;
/// After this long without a restart the delay starts over.
pub const RESET_AFTER: Nanos = 600 * SECOND;

#[derive(Debug, Clone, Copy, PartialEq)]
struct Entry {
    delay: Nanos,
    last_restart: Nanos,
}

/// Backoff state per key (pod UID + container name).
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Nanos,
    max: Nanos,
    entries: HashMap<String, Entry>,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(INITIAL, MAX)
    }
}

impl Backoff {
    pub fn new(initial: Nanos, max: Nanos) -> Self {
        Backoff { initial, max, entries: HashMap::new() }
    }

    /// How long the container that finished at `finished_at` must still wait before it may be
    /// restarted, or `None` if it may be restarted now.
    pub fn remaining(&self, key: &str, finished_at: Nanos, now: Nanos) -> Option<Nanos> {
        let entry = self.entries.get(key)?;
        if expired(entry, finished_at) {
            return None;
        }
        let waited = now - finished_at;
        (waited < entry.delay).then(|| entry.delay - waited)
    }

    /// The delay currently applied to `key` (the initial delay if it never restarted).
    pub fn delay(&self, key: &str) -> Nanos {
        self.entries.get(key).map_or(self.initial, |e| e.delay)
    }

    /// Records a restart at `now` of a container that finished at `finished_at`.
    pub fn record_restart(&mut self, key: &str, finished_at: Nanos, now: Nanos) {
        let (initial, max) = (self.initial, self.max);
        let entry = self.entries.entry(key.to_string()).or_insert(Entry { delay: 0, last_restart: now });
        entry.delay =
            if entry.delay == 0 || expired(entry, finished_at) { initial } else { (entry.delay * 2).min(max) };
        entry.last_restart = now;
    }

    /// Drops the state of every key that starts with `prefix` (a pod that went away).
    pub fn forget_prefix(&mut self, prefix: &str) {
        self.entries.retain(|k, _| !k.starts_with(prefix));
    }
}

/// The key for one container of one pod.
pub fn key(pod_uid: &str, container: &str) -> String {
    format!("{pod_uid}/{container}")
}

fn expired(entry: &Entry, event_time: Nanos) -> bool {
    event_time - entry.last_restart > RESET_AFTER
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Nanos = 1_000 * SECOND;

    #[test]
    fn first_restart_is_immediate() {
        let b = Backoff::default();
        assert_eq!(b.remaining("p/c", T0, T0), None);
    }

    #[test]
    fn delay_doubles_from_ten_seconds_to_five_minutes() {
        let mut b = Backoff::default();
        let mut now = T0;
        let mut seen = vec![];
        for _ in 0..8 {
            // The container crashes right away each time.
            let finished = now;
            if let Some(wait) = b.remaining("p/c", finished, now) {
                seen.push(wait / SECOND);
                now += wait;
            } else {
                seen.push(0);
            }
            b.record_restart("p/c", finished, now);
        }
        assert_eq!(seen, vec![0, 10, 20, 40, 80, 160, 300, 300]);
    }

    #[test]
    fn partial_wait_is_subtracted() {
        let mut b = Backoff::default();
        b.record_restart("p/c", T0, T0);
        let finished = T0 + SECOND;
        assert_eq!(b.remaining("p/c", finished, finished + 4 * SECOND), Some(6 * SECOND));
        assert_eq!(b.remaining("p/c", finished, finished + 10 * SECOND), None);
    }

    #[test]
    fn resets_after_ten_quiet_minutes() {
        let mut b = Backoff::default();
        b.record_restart("p/c", T0, T0);
        b.record_restart("p/c", T0, T0);
        b.record_restart("p/c", T0, T0); // delay now 40 s
        let finished = T0 + RESET_AFTER + SECOND;
        assert_eq!(b.remaining("p/c", finished, finished), None);
        b.record_restart("p/c", finished, finished);
        assert_eq!(b.remaining("p/c", finished, finished + SECOND), Some(9 * SECOND));
    }

    #[test]
    fn keys_are_independent_and_forgettable() {
        let mut b = Backoff::default();
        b.record_restart(&key("u1", "a"), T0, T0);
        b.record_restart(&key("u1", "a"), T0, T0);
        assert!(b.remaining(&key("u1", "a"), T0, T0).is_some());
        assert_eq!(b.remaining(&key("u2", "a"), T0, T0), None);
        b.forget_prefix("u1/");
        assert_eq!(b.remaining(&key("u1", "a"), T0, T0), None);
    }
}
