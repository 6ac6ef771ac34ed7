//! When a failing watch is retried and when its failure is worth a log line: the first
//! failure and each change of cause are logged, repeats are not; retries back off from
//! 800 ms, doubling, up to 5 minutes, and start over only once the watch works again.

use std::time::Duration;

const FIRST_DELAY: Duration = Duration::from_millis(800);
const MAX_DELAY: Duration = Duration::from_secs(300);

#[derive(Debug, Default)]
pub struct WatchRetry {
    /// The cause of the current run of failures, `None` while the watch works.
    cause: Option<String>,
    delay: Duration,
}

/// What to do about one failure.
#[derive(Debug, PartialEq, Eq)]
pub struct Failure {
    /// The failure starts a run or has a new cause: log it.
    pub log: bool,
    /// Wait this long before the next attempt.
    pub retry_in: Duration,
}

impl WatchRetry {
    pub fn failed(&mut self, cause: &str) -> Failure {
        let log = self.cause.as_deref() != Some(cause);
        self.cause = Some(cause.to_string());
        self.delay = if self.delay.is_zero() { FIRST_DELAY } else { (self.delay * 2).min(MAX_DELAY) };
        Failure { log, retry_in: self.delay }
    }

    /// The watch works (a complete list or a change arrived); true when it had been failing,
    /// which is worth a log line too.
    pub fn recovered(&mut self) -> bool {
        self.delay = Duration::ZERO;
        self.cause.take().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_once_per_cause_and_backs_off_to_five_minutes() {
        let mut retry = WatchRetry::default();
        let first = retry.failed("403 forbidden");
        assert_eq!(first, Failure { log: true, retry_in: Duration::from_millis(800) });
        let delays: Vec<Duration> = (0..12)
            .map(|_| retry.failed("403 forbidden"))
            .map(|f| {
                assert!(!f.log, "a repeat is not logged");
                f.retry_in
            })
            .collect();
        assert_eq!(delays[0], Duration::from_millis(1600));
        assert_eq!(*delays.last().unwrap(), MAX_DELAY);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
        // A new cause is logged; the backoff goes on.
        let changed = retry.failed("404 not found");
        assert_eq!(changed, Failure { log: true, retry_in: MAX_DELAY });
    }

    #[test]
    fn recovery_is_reported_once_and_starts_over() {
        let mut retry = WatchRetry::default();
        assert!(!retry.recovered(), "nothing to report while working");
        retry.failed("403 forbidden");
        retry.failed("403 forbidden");
        assert!(retry.recovered());
        assert!(!retry.recovered());
        assert_eq!(retry.failed("403 forbidden"), Failure { log: true, retry_in: FIRST_DELAY });
    }
}
