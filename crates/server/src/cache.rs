//! A small TTL cache for TokenReview and SubjectAccessReview answers. Time is passed in, so
//! the expiry rules are tested without waiting.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Entries beyond this many make an insert drop the expired ones first (and, if still full,
/// everything): the cache bounds memory, it does not have to be clever.
const MAX_ENTRIES: usize = 4096;

pub struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (Instant, V)>>,
}

impl<K, V> Default for TtlCache<K, V> {
    fn default() -> Self {
        TtlCache { entries: Mutex::new(HashMap::new()) }
    }
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    /// The value stored for `key` if it has not expired at `now`.
    pub fn get(&self, key: &K, now: Instant) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.get(key).filter(|(expires, _)| now < *expires).map(|(_, v)| v.clone())
    }

    /// Stores `value` until `now + ttl`; a zero TTL stores nothing.
    pub fn insert(&self, key: K, value: V, ttl: Duration, now: Instant) {
        if ttl.is_zero() {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= MAX_ENTRIES {
            entries.retain(|_, (expires, _)| now < *expires);
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(key, (now + ttl, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_after_their_ttl() {
        let cache = TtlCache::default();
        let t0 = Instant::now();
        cache.insert("a", 1, Duration::from_secs(30), t0);
        assert_eq!(cache.get(&"a", t0 + Duration::from_secs(29)), Some(1));
        assert_eq!(cache.get(&"a", t0 + Duration::from_secs(30)), None);
        cache.insert("b", 2, Duration::ZERO, t0);
        assert_eq!(cache.get(&"b", t0), None);
    }

    #[test]
    fn a_full_cache_drops_expired_entries_first() {
        let cache = TtlCache::default();
        let t0 = Instant::now();
        for i in 0..MAX_ENTRIES {
            cache.insert(i, i, Duration::from_secs(1), t0);
        }
        let later = t0 + Duration::from_secs(2);
        cache.insert(usize::MAX, 7, Duration::from_secs(60), later);
        assert_eq!(cache.get(&usize::MAX, later), Some(7));
        assert_eq!(cache.entries.lock().unwrap().len(), 1);
    }
}
