//! Server-side request accounting, as kube-apiserver's `apiserver_request_total` (by verb and
//! resource) and its count of open watches, so tests and benchmarks can measure what a client
//! costs the API server without trusting the client's own view.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// One kind of request: the API verb (get, list, watch, create, update, patch, delete, …), the
/// resource with its subresource (`pods`, `pods/status`), and the object it names (the path's
/// name, or a list/watch's `metadata.name` field selector; empty otherwise).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKey {
    pub verb: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
}

/// Requests received so far, by [`RequestKey`] (a snapshot).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestCounts(pub BTreeMap<RequestKey, u64>);

impl RequestCounts {
    /// Requests with this verb on this resource (`configmaps`, `pods/status`), any object.
    pub fn total(&self, verb: &str, resource: &str) -> u64 {
        self.0.iter().filter(|(k, _)| k.verb == verb && k.resource == resource).map(|(_, n)| n).sum()
    }

    /// Requests with this verb on one object.
    pub fn of(&self, verb: &str, resource: &str, namespace: &str, name: &str) -> u64 {
        let key =
            RequestKey { verb: verb.into(), resource: resource.into(), namespace: namespace.into(), name: name.into() };
        self.0.get(&key).copied().unwrap_or(0)
    }

    /// Totals by (verb, resource).
    pub fn by_verb_and_resource(&self) -> BTreeMap<(String, String), u64> {
        let mut out = BTreeMap::new();
        for (k, n) in &self.0 {
            *out.entry((k.verb.clone(), k.resource.clone())).or_insert(0) += n;
        }
        out
    }

    /// The requests received after `earlier` was taken.
    pub fn since(&self, earlier: &RequestCounts) -> RequestCounts {
        let diff = self.0.iter().filter_map(|(k, n)| {
            let d = n - earlier.0.get(k).copied().unwrap_or(0);
            (d > 0).then(|| (k.clone(), d))
        });
        RequestCounts(diff.collect())
    }
}

/// A watch the server is serving now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenWatch {
    /// The resource's plural (`configmaps`).
    pub resource: String,
    /// None for a watch across all namespaces.
    pub namespace: Option<String>,
    /// The `metadata.name` the watch is limited to, if any.
    pub name: Option<String>,
}

#[derive(Default)]
pub struct Accounting {
    requests: Mutex<HashMap<RequestKey, u64>>,
    watches: Mutex<HashMap<u64, OpenWatch>>,
    next_watch: AtomicU64,
}

impl Accounting {
    pub fn count(&self, key: RequestKey) {
        *self.requests.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_insert(0) += 1;
    }

    pub fn requests(&self) -> RequestCounts {
        let map = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        RequestCounts(map.iter().map(|(k, n)| (k.clone(), *n)).collect())
    }

    /// Records an open watch until the returned guard is dropped (when the stream ends).
    pub fn open(&self, watch: OpenWatch) -> WatchGuard<'_> {
        let id = self.next_watch.fetch_add(1, Ordering::Relaxed);
        self.watches.lock().unwrap_or_else(|p| p.into_inner()).insert(id, watch);
        WatchGuard { accounting: self, id }
    }

    pub fn open_watches(&self) -> Vec<OpenWatch> {
        self.watches.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }
}

pub struct WatchGuard<'a> {
    accounting: &'a Accounting,
    id: u64,
}

impl Drop for WatchGuard<'_> {
    fn drop(&mut self) {
        self.accounting.watches.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(verb: &str, resource: &str, name: &str) -> RequestKey {
        RequestKey { verb: verb.into(), resource: resource.into(), namespace: "ns".into(), name: name.into() }
    }

    #[test]
    fn counts_totals_and_differences() {
        let a = Accounting::default();
        a.count(key("get", "configmaps", "a"));
        let before = a.requests();
        a.count(key("get", "configmaps", "a"));
        a.count(key("get", "configmaps", "b"));
        a.count(key("watch", "configmaps", "a"));
        let now = a.requests();
        assert_eq!(now.total("get", "configmaps"), 3);
        assert_eq!(now.of("get", "configmaps", "ns", "a"), 2);
        let diff = now.since(&before);
        assert_eq!((diff.total("get", "configmaps"), diff.total("watch", "configmaps")), (2, 1));
        assert_eq!(diff.by_verb_and_resource()[&("get".to_string(), "configmaps".to_string())], 2);
    }

    #[test]
    fn open_watches_end_with_their_guard() {
        let a = Accounting::default();
        let w = OpenWatch { resource: "secrets".into(), namespace: Some("ns".into()), name: Some("s".into()) };
        let guard = a.open(w.clone());
        assert_eq!(a.open_watches(), vec![w]);
        drop(guard);
        assert!(a.open_watches().is_empty());
    }
}
