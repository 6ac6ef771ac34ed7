//! Server-side request accounting, as kube-apiserver's `apiserver_request_total` (by verb and
//! resource), its count of open watches and the client connections (with the users whose
//! requests each carried), so tests and benchmarks can measure what a client
//! costs the API server without trusting the client's own view.

use std::collections::{BTreeMap, BTreeSet, HashMap};
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

/// A client connection the server accepted (TLS handshake done).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientConnection {
    /// Whether ALPN chose HTTP/2 (else HTTP/1.1).
    pub http2: bool,
    /// The users whose requests came over it.
    pub users: BTreeSet<String>,
    /// Whether it is still open.
    pub open: bool,
}

#[derive(Default)]
pub struct Accounting {
    requests: Mutex<HashMap<RequestKey, u64>>,
    watches: Mutex<HashMap<u64, OpenWatch>>,
    next_watch: AtomicU64,
    connections: Mutex<BTreeMap<u64, ClientConnection>>,
    next_connection: AtomicU64,
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

    /// Records a new connection; it counts as open until the returned guard is dropped.
    pub fn connected(&self, http2: bool) -> ConnectionGuard<'_> {
        let id = self.next_connection.fetch_add(1, Ordering::Relaxed);
        let conn = ClientConnection { http2, users: BTreeSet::new(), open: true };
        self.connections.lock().unwrap_or_else(|p| p.into_inner()).insert(id, conn);
        ConnectionGuard { accounting: self, id }
    }

    /// `user` sent a request over connection `id`.
    pub fn used_by(&self, id: u64, user: &str) {
        let mut connections = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(conn) = connections.get_mut(&id).filter(|c| !c.users.contains(user)) {
            conn.users.insert(user.to_string());
        }
    }

    /// Every connection accepted so far, in order.
    pub fn connections(&self) -> Vec<ClientConnection> {
        self.connections.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }
}

/// Marks its connection closed when dropped; `id` names it in [`Accounting::used_by`].
pub struct ConnectionGuard<'a> {
    accounting: &'a Accounting,
    pub id: u64,
}

impl Drop for ConnectionGuard<'_> {
    fn drop(&mut self) {
        let mut connections = self.accounting.connections.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(conn) = connections.get_mut(&self.id) {
            conn.open = false;
        }
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

    #[test]
    fn connections_record_their_users_and_closing() {
        let a = Accounting::default();
        let first = a.connected(true);
        let second = a.connected(false);
        a.used_by(first.id, "system:node:n1");
        a.used_by(first.id, "system:node:n1");
        a.used_by(second.id, "kubernetes-admin");
        drop(second);
        let users = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(
            a.connections(),
            vec![
                ClientConnection { http2: true, users: users(&["system:node:n1"]), open: true },
                ClientConnection { http2: false, users: users(&["kubernetes-admin"]), open: false },
            ]
        );
        drop(first);
    }
}
