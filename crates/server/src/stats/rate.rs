//! `usageNanoCores` needs two samples of a cumulative CPU counter: a small cache of the last
//! sample per key (node, container ID, pod UID) turns each new sample into a rate (pure).

use std::collections::HashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample {
    at_nanos: i128,
    usage_nanos: u64,
}

#[derive(Debug, Default)]
pub struct CpuRates {
    last: HashMap<String, Sample>,
}

impl CpuRates {
    /// Records `usage_nanos` (cumulative CPU time) at `at_nanos` (wall clock) and returns the
    /// rate since the previous sample of `key` in nanocores; None for the first sample, after a
    /// counter reset (a restarted container) or when no time passed.
    pub fn sample(&mut self, key: &str, at_nanos: i128, usage_nanos: u64) -> Option<u64> {
        let new = Sample { at_nanos, usage_nanos };
        let previous = self.last.insert(key.to_string(), new)?;
        let elapsed = at_nanos - previous.at_nanos;
        if elapsed <= 0 || usage_nanos < previous.usage_nanos {
            // Keep the older sample when time did not advance, so the next scrape has a base.
            if elapsed <= 0 {
                self.last.insert(key.to_string(), previous);
            }
            return None;
        }
        let used = (usage_nanos - previous.usage_nanos) as i128;
        u64::try_from(used * 1_000_000_000 / elapsed).ok()
    }

    /// [`Self::sample`] for a counter that may be missing.
    pub fn sample_opt(&mut self, key: &str, at_nanos: i128, usage_nanos: Option<u64>) -> Option<u64> {
        self.sample(key, at_nanos, usage_nanos?)
    }

    /// Forgets keys not in `alive` (containers and pods that are gone).
    pub fn retain(&mut self, alive: impl Fn(&str) -> bool) {
        self.last.retain(|k, _| alive(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_from_two_samples() {
        let mut r = CpuRates::default();
        assert_eq!(r.sample("c", 0, 1_000), None);
        // Half a core for two seconds.
        assert_eq!(r.sample("c", 2_000_000_000, 1_000 + 1_000_000_000), Some(500_000_000));
        // Counter reset: no rate, but the new sample becomes the base.
        assert_eq!(r.sample("c", 3_000_000_000, 10), None);
        assert_eq!(r.sample("c", 4_000_000_000, 10 + 250_000_000), Some(250_000_000));
        // Same instant: no rate, the base stays.
        assert_eq!(r.sample("c", 4_000_000_000, 10 + 300_000_000), None);
        assert_eq!(r.sample("c", 5_000_000_000, 10 + 250_000_000 + 100_000_000), Some(100_000_000));
        r.retain(|k| k != "c");
        assert_eq!(r.sample("c", 6_000_000_000, 0), None);
    }
}
