//! Image pull backoff per pod and image, with upstream's numbers and semantics (pure; time is
//! passed in): a failed pull starts a 10 s window doubling up to 300 s, during which the image
//! is not pulled again for that pod; an entry not updated for twice the maximum starts over.

use std::collections::HashMap;

use gantry_pod::{Nanos, SECOND};

pub const INITIAL: Nanos = 10 * SECOND;
pub const MAX: Nanos = 300 * SECOND;

#[derive(Debug, Clone)]
struct Entry {
    delay: Nanos,
    last_failure: Nanos,
    /// The error of the failed pull, for the waiting message while backing off.
    error: String,
}

#[derive(Debug, Clone, Default)]
pub struct PullBackoff {
    entries: HashMap<String, Entry>,
}

/// Upstream's key: pod UID and image as written in the spec.
pub fn key(pod_uid: &str, image: &str) -> String {
    format!("{pod_uid}_{image}")
}

fn expired(entry: &Entry, now: Nanos) -> bool {
    now - entry.last_failure > 2 * MAX
}

impl PullBackoff {
    /// How long pulls of `key` must still wait, with the error that started the wait; `None`
    /// when a pull may be tried now.
    pub fn remaining(&self, key: &str, now: Nanos) -> Option<(Nanos, &str)> {
        let entry = self.entries.get(key).filter(|e| !expired(e, now))?;
        let waited = now - entry.last_failure;
        (waited < entry.delay).then(|| (entry.delay - waited, entry.error.as_str()))
    }

    /// Records a failed pull of `key` at `now`: the first (or first in a long while) waits
    /// 10 s, each next one twice as long, up to 300 s.
    pub fn failed(&mut self, key: &str, now: Nanos, error: &str) {
        let delay = match self.entries.get(key) {
            Some(e) if !expired(e, now) => (e.delay * 2).min(MAX),
            _ => INITIAL,
        };
        self.entries.insert(key.to_string(), Entry { delay, last_failure: now, error: error.to_string() });
    }

    /// Drops entries that would start over anyway.
    pub fn collect(&mut self, now: Nanos) {
        self.entries.retain(|_, e| !expired(e, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Nanos = 1_000 * SECOND;

    #[test]
    fn no_wait_before_the_first_failure() {
        assert_eq!(PullBackoff::default().remaining("k", T0), None);
    }

    #[test]
    fn failures_wait_ten_seconds_doubling_to_five_minutes() {
        let mut b = PullBackoff::default();
        let mut now = T0;
        let mut waits = vec![];
        for _ in 0..7 {
            b.failed("k", now, "boom");
            let (wait, error) = b.remaining("k", now).unwrap();
            assert_eq!(error, "boom");
            waits.push(wait / SECOND);
            now += wait;
            assert_eq!(b.remaining("k", now), None, "the window is over once the delay has passed");
        }
        assert_eq!(waits, [10, 20, 40, 80, 160, 300, 300]);
    }

    #[test]
    fn partial_wait_is_subtracted() {
        let mut b = PullBackoff::default();
        b.failed("k", T0, "e");
        assert_eq!(b.remaining("k", T0 + 4 * SECOND).map(|r| r.0), Some(6 * SECOND));
    }

    #[test]
    fn starts_over_after_twice_the_maximum_without_failures() {
        let mut b = PullBackoff::default();
        b.failed("k", T0, "e");
        b.failed("k", T0, "e");
        let later = T0 + 2 * MAX + SECOND;
        b.failed("k", later, "e");
        assert_eq!(b.remaining("k", later).map(|r| r.0), Some(INITIAL));
    }

    #[test]
    fn keys_are_per_pod_and_image_and_collected_when_stale() {
        let mut b = PullBackoff::default();
        b.failed(&key("uid1", "img"), T0, "e");
        assert!(b.remaining(&key("uid1", "img"), T0).is_some());
        assert!(b.remaining(&key("uid2", "img"), T0).is_none());
        assert!(b.remaining(&key("uid1", "other"), T0).is_none());
        b.collect(T0 + 2 * MAX + 1);
        assert!(b.entries.is_empty());
    }
}
