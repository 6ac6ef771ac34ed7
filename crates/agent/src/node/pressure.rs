//! Memory and disk pressure from the hard eviction thresholds
//! (`evictionHard`): `memory.available` against `MemAvailable`,
//! `nodefs.available`/`nodefs.inodesFree` against the root dir's file
//! system. As upstream's eviction manager, a condition stays true for
//! `evictionPressureTransitionPeriod` (5m) after pressure was last seen, so
//! it does not flap. Gantry does not evict pods: it only reports.

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::machine::{MachineFacts, Usage};
use super::status::{Pressure, threshold_amount};
use gantry_config::Settings;

/// Upstream's default `evictionPressureTransitionPeriod`.
pub const PRESSURE_TRANSITION_PERIOD: SignedDuration = SignedDuration::from_secs(300);

/// Pressure as observed right now.
pub fn observe(settings: &Settings, facts: &MachineFacts, usage: &Usage) -> Pressure {
    let below = |signal: &str, observed: Option<u64>, capacity: u64| -> bool {
        match (settings.eviction_hard.get(signal), observed) {
            (Some(threshold), Some(value)) => {
                let amount = threshold_amount(threshold, i128::from(capacity));
                amount > 0 && i128::from(value) < amount
            }
            _ => false,
        }
    };
    Pressure {
        memory: below("memory.available", usage.memory_available_bytes, facts.memory_bytes),
        disk: below("nodefs.available", usage.nodefs_available_bytes, facts.ephemeral_storage_bytes)
            || below("nodefs.inodesFree", usage.nodefs_inodes_free, usage.nodefs_inodes.unwrap_or(0)),
        pid: false,
    }
}

/// Holds pressure for the transition period after it was last observed.
#[derive(Clone, Debug, Default)]
pub struct PressureTracker {
    memory_seen: Option<Timestamp>,
    disk_seen: Option<Timestamp>,
    pid_seen: Option<Timestamp>,
}

impl PressureTracker {
    pub fn update(&mut self, observed: Pressure, now: Timestamp) -> Pressure {
        let hold = |seen: &mut Option<Timestamp>, now_under: bool| {
            if now_under {
                *seen = Some(now);
            }
            seen.is_some_and(|t| now.duration_since(t) < PRESSURE_TRANSITION_PERIOD)
        };
        Pressure {
            memory: hold(&mut self.memory_seen, observed.memory),
            disk: hold(&mut self.disk_seen, observed.disk),
            pid: hold(&mut self.pid_seen, observed.pid),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> MachineFacts {
        MachineFacts { memory_bytes: 1 << 30, ephemeral_storage_bytes: 1000 * 1024 * 1024, ..Default::default() }
    }

    #[test]
    fn thresholds_from_eviction_hard() {
        let s = Settings::default(); // memory.available<100Mi, nodefs.available<10%, nodefs.inodesFree<5%
        let plenty = Usage {
            memory_available_bytes: Some(500 << 20),
            nodefs_available_bytes: Some(500 << 20),
            nodefs_inodes_free: Some(900),
            nodefs_inodes: Some(1000),
        };
        assert_eq!(observe(&s, &facts(), &plenty), Pressure::default());
        let low_memory = Usage { memory_available_bytes: Some(99 << 20), ..plenty };
        assert!(observe(&s, &facts(), &low_memory).memory);
        let low_disk = Usage { nodefs_available_bytes: Some(99 << 20), ..plenty };
        assert!(observe(&s, &facts(), &low_disk).disk);
        let few_inodes = Usage { nodefs_inodes_free: Some(49), ..plenty };
        assert!(observe(&s, &facts(), &few_inodes).disk);
        // Unknown usage is no pressure; no threshold is no pressure.
        assert_eq!(observe(&s, &facts(), &Usage::default()), Pressure::default());
        let none = Settings { eviction_hard: Default::default(), ..Settings::default() };
        assert_eq!(observe(&none, &facts(), &low_memory), Pressure::default());
    }

    #[test]
    fn pressure_is_held_for_the_transition_period() {
        let t = |s: i64| Timestamp::from_second(1_700_000_000 + s).unwrap();
        let mut tracker = PressureTracker::default();
        let on = Pressure { memory: true, ..Default::default() };
        assert!(tracker.update(on, t(0)).memory);
        assert!(tracker.update(Pressure::default(), t(299)).memory);
        assert!(!tracker.update(Pressure::default(), t(300)).memory);
        assert!(!tracker.update(Pressure::default(), t(301)).disk);
    }
}
