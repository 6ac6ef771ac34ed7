//! The Go kubelet's event correlator (client-go `record`), pure: time is passed in and the
//! caller does the API calls. In upstream's order, each event is
//! 1. aggregated: the 10th distinct message with the same source, object, type and reason
//!    within 10 minutes becomes one event "(combined from similar events): <message>";
//! 2. de-duplicated: an event seen before (same key, message included) becomes a patch of the
//!    first one's `count` (+1), `lastTimestamp` and `message`, keeping its `firstTimestamp`;
//! 3. spam-filtered: 25 events per source and object, then one more every 5 minutes.
//!
//! All three caches are LRUs of 4096 entries, as upstream's. Upstream keys them by the
//! joined strings; these keep a 64-bit hash of the same parts instead (and of each message in
//! an aggregate): the strings took about 3 KB for each pod's few events (heaptrack, 250 pods),
//! and two distinct keys share a hash with odds of one in 2^64.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::num::NonZeroUsize;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use lru::LruCache;

const CACHE_ENTRIES: NonZeroUsize = NonZeroUsize::new(4096).unwrap();
const AGGREGATE_MAX_EVENTS: usize = 10;
const AGGREGATE_INTERVAL: SignedDuration = SignedDuration::from_secs(600);
const SPAM_BURST: f64 = 25.0;
const SPAM_QPS: f64 = 1.0 / 300.0;
const COMBINED_PREFIX: &str = "(combined from similar events): ";

/// What to do with an event after correlation.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A new Event object to create.
    Create(Event),
    /// The event repeats one already written under `event.metadata.name`: patch its `count`,
    /// `lastTimestamp` and `message` (create `event` if it is gone from the server).
    Patch(Event),
    /// Over the spam budget of its source and object: dropped.
    Skip,
}

/// A cache key: the hash of the parts that make two events the same (see the module's doc).
type Key = u64;

struct Aggregate {
    /// Hashes of the distinct messages seen.
    messages: Vec<u64>,
    last: Timestamp,
}

struct Seen {
    count: i32,
    first: Option<Time>,
    name: String,
}

struct Bucket {
    tokens: f64,
    at: Timestamp,
}

pub struct Correlator {
    aggregates: LruCache<Key, Aggregate>,
    seen: LruCache<Key, Seen>,
    spam: LruCache<Key, Bucket>,
}

impl Default for Correlator {
    fn default() -> Self {
        Correlator { aggregates: bounded(), seen: bounded(), spam: bounded() }
    }
}

/// A cache of at most `CACHE_ENTRIES` that grows as entries come: `LruCache::new` sizes its
/// map for all of them at once (about 136 KiB each, held by every idle node).
fn bounded<V>() -> LruCache<Key, V> {
    let mut cache = LruCache::unbounded();
    cache.resize(CACHE_ENTRIES);
    cache
}

/// Source and involved object: the parts every key starts with.
fn object_key(e: &Event) -> Vec<&str> {
    let source = e.source.as_ref();
    let o = &e.involved_object;
    vec![
        source.and_then(|s| s.component.as_deref()).unwrap_or_default(),
        source.and_then(|s| s.host.as_deref()).unwrap_or_default(),
        o.kind.as_deref().unwrap_or_default(),
        o.namespace.as_deref().unwrap_or_default(),
        o.name.as_deref().unwrap_or_default(),
        o.uid.as_deref().unwrap_or_default(),
        o.api_version.as_deref().unwrap_or_default(),
    ]
}

/// The key of a list of parts. `str`'s `Hash` ends each part with a marker, so `["ab", "c"]`
/// and `["a", "bc"]` differ as upstream's joined strings do.
fn key(parts: &[&str]) -> Key {
    let mut hasher = DefaultHasher::new();
    parts.hash(&mut hasher);
    hasher.finish()
}

/// Everything that makes two events the same one (message and field path included).
fn event_key(e: &Event) -> Key {
    let mut parts = object_key(e);
    parts.push(e.involved_object.field_path.as_deref().unwrap_or_default());
    parts.extend([e.type_.as_deref(), e.reason.as_deref(), e.message.as_deref()].map(Option::unwrap_or_default));
    key(&parts)
}

/// Events that differ only by message (and field path) aggregate together.
fn aggregate_key(e: &Event) -> Key {
    let mut parts = object_key(e);
    parts.extend(
        [e.type_.as_deref(), e.reason.as_deref(), e.reporting_component.as_deref(), e.reporting_instance.as_deref()]
            .map(Option::unwrap_or_default),
    );
    key(&parts)
}

/// `<object name>.<now in nanoseconds, hex>`, as upstream names events.
pub fn event_name(object: &str, now: Timestamp) -> String {
    format!("{object}.{:x}", now.as_nanosecond())
}

impl Correlator {
    /// Correlates `event` (as the recorder made it: count 1, both timestamps now) at `now`.
    pub fn correlate(&mut self, event: Event, now: Timestamp) -> Outcome {
        let (event, key) = self.aggregate(event, now);
        let event = self.observe(event, key);
        if !self.allow(&event, now) {
            return Outcome::Skip;
        }
        if event.count.unwrap_or(1) > 1 { Outcome::Patch(event) } else { Outcome::Create(event) }
    }

    fn aggregate(&mut self, event: Event, now: Timestamp) -> (Event, Key) {
        let group = aggregate_key(&event);
        let message = event.message.as_deref().unwrap_or_default();
        let message_key = key(&[message]);
        let fresh = || Aggregate { messages: Vec::new(), last: now };
        let record = self.aggregates.get_or_insert_mut(group, fresh);
        if now.duration_since(record.last) > AGGREGATE_INTERVAL {
            record.messages.clear();
        }
        record.last = now;
        if !record.messages.contains(&message_key) {
            record.messages.push(message_key);
        }
        if record.messages.len() < AGGREGATE_MAX_EVENTS {
            let key = event_key(&event);
            return (event, key);
        }
        // Keep the set at its bound, as upstream pops one.
        record.messages.remove(0);
        let seconds = Time(Timestamp::from_second(now.as_second()).unwrap_or(now));
        let name = event_name(event.involved_object.name.as_deref().unwrap_or_default(), now);
        let message = format!("{COMBINED_PREFIX}{message}");
        let combined = Event {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name),
                namespace: event.metadata.namespace.clone(),
                ..Default::default()
            },
            count: Some(1),
            first_timestamp: Some(seconds.clone()),
            last_timestamp: Some(seconds),
            message: Some(message),
            ..event
        };
        (combined, group)
    }

    fn observe(&mut self, mut event: Event, key: Key) -> Event {
        if let Some(last) = self.seen.get(&key) {
            event.metadata.name = Some(last.name.clone());
            event.first_timestamp = last.first.clone();
            event.count = Some(last.count + 1);
        }
        let seen = Seen {
            count: event.count.unwrap_or(1),
            first: event.first_timestamp.clone(),
            name: event.metadata.name.clone().unwrap_or_default(),
        };
        self.seen.put(key, seen);
        event
    }

    /// The token bucket of the event's source and object.
    fn allow(&mut self, event: &Event, now: Timestamp) -> bool {
        let bucket = self.spam.get_or_insert_mut(key(&object_key(event)), || Bucket { tokens: SPAM_BURST, at: now });
        let elapsed = now.duration_since(bucket.at).as_secs_f64().max(0.0);
        bucket.tokens = (bucket.tokens + elapsed * SPAM_QPS).min(SPAM_BURST);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return false;
        }
        bucket.tokens -= 1.0;
        true
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{EventSource, ObjectReference};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + second).unwrap()
    }

    fn event(object: &str, reason: &str, message: &str, now: Timestamp) -> Event {
        let time = Time(Timestamp::from_second(now.as_second()).unwrap());
        Event {
            metadata: ObjectMeta {
                name: Some(event_name(object, now)),
                namespace: Some("default".into()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                kind: Some("Pod".into()),
                name: Some(object.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{object}")),
                ..Default::default()
            },
            source: Some(EventSource { component: Some("kubelet".into()), host: Some("n1".into()) }),
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some("Normal".into()),
            count: Some(1),
            first_timestamp: Some(time.clone()),
            last_timestamp: Some(time),
            ..Default::default()
        }
    }

    #[test]
    fn caches_grow_as_needed_and_stay_bounded() {
        let mut cache = bounded::<()>();
        assert!(cache.is_empty());
        for i in 0..CACHE_ENTRIES.get() + 10 {
            cache.put(i as Key, ());
        }
        assert_eq!(cache.len(), CACHE_ENTRIES.get());
        assert!(!cache.contains(&0), "the least recently used went first");
    }

    #[test]
    fn keys_tell_parts_apart_where_they_split() {
        assert_ne!(key(&["ab", "c"]), key(&["a", "bc"]));
        assert_ne!(key(&["a", ""]), key(&["a"]));
        assert_eq!(key(&["a", "b"]), key(&["a", "b"]));
    }

    #[test]
    fn a_repeat_patches_the_first_event_with_count_and_last_timestamp() {
        let mut c = Correlator::default();
        let first = c.correlate(event("web", "BackOff", "Back-off", at(0)), at(0));
        let Outcome::Create(first) = first else { panic!("{first:?}") };
        let again = c.correlate(event("web", "BackOff", "Back-off", at(30)), at(30));
        let Outcome::Patch(again) = again else { panic!("{again:?}") };
        assert_eq!(again.metadata.name, first.metadata.name);
        assert_eq!(again.count, Some(2));
        assert_eq!(again.first_timestamp, first.first_timestamp);
        assert_eq!(again.last_timestamp, Some(Time(at(30))));
        // Another message is another event.
        let other = c.correlate(event("web", "BackOff", "Back-off restarting", at(31)), at(31));
        assert!(matches!(other, Outcome::Create(_)), "{other:?}");
    }

    #[test]
    fn the_tenth_distinct_message_is_combined_and_then_counted() {
        let mut c = Correlator::default();
        for i in 0..9 {
            let outcome = c.correlate(event("web", "Failed", &format!("error {i}"), at(i)), at(i));
            assert!(matches!(outcome, Outcome::Create(_)), "{i}: {outcome:?}");
        }
        let Outcome::Create(combined) = c.correlate(event("web", "Failed", "error 9", at(9)), at(9)) else { panic!() };
        assert_eq!(combined.message.as_deref(), Some("(combined from similar events): error 9"));
        let Outcome::Patch(next) = c.correlate(event("web", "Failed", "error 10", at(10)), at(10)) else { panic!() };
        assert_eq!((next.count, next.metadata.name.clone()), (Some(2), combined.metadata.name.clone()));
        assert_eq!(next.message.as_deref(), Some("(combined from similar events): error 10"));
        // Ten minutes of quiet start a new group.
        let later = at(10 + 601);
        let Outcome::Create(fresh) = c.correlate(event("web", "Failed", "error 11", later), later) else { panic!() };
        assert_eq!(fresh.message.as_deref(), Some("error 11"));
    }

    #[test]
    fn an_object_gets_25_events_then_one_every_5_minutes() {
        let mut c = Correlator::default();
        let kept =
            (0..30).filter(|i| c.correlate(event("web", "R", &format!("m{}", i % 3), at(0)), at(0)) != Outcome::Skip);
        assert_eq!(kept.count(), 25);
        assert_eq!(c.correlate(event("web", "R", "m0", at(299)), at(299)), Outcome::Skip);
        assert_ne!(c.correlate(event("web", "R", "m0", at(300)), at(300)), Outcome::Skip);
        assert_ne!(c.correlate(event("db", "R", "m0", at(300)), at(300)), Outcome::Skip, "per object");
    }
}
