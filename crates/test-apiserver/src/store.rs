//! The object store: every object as JSON, one global resourceVersion counter, and a bounded
//! history of change events that watches resume from.
//!
//! All reads-modify-writes happen under one mutex ([`Store::lock`]), so each write and its
//! watch event get the next resourceVersion in the order they happen. Watchers are woken
//! through a `tokio::sync::watch` channel of their own resource (storage) carrying the latest
//! resourceVersion, as kube-apiserver keeps a watch cache per resource: a write of an Event
//! does not wake the watches of ConfigMaps.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::watch;

use crate::pods::NodeRefs;
use crate::resources::Registry;

/// The storage of pods, whose references the store indexes by node.
const PODS: &str = "pods";

/// (namespace, name); the namespace is empty for cluster-scoped objects.
pub type ObjKey = (String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One change, as kept in the history.
#[derive(Debug, Clone)]
pub struct Change {
    pub rv: u64,
    pub storage: String,
    pub kind: EventType,
    /// The object after the change (for deletions: its last state, at the deletion's RV).
    pub object: Arc<Value>,
    /// The object before the change (None for additions).
    pub prev: Option<Arc<Value>>,
}

/// How many changes the history keeps before older resourceVersions expire.
pub const DEFAULT_HISTORY: usize = 10_000;

pub struct StoreInner {
    rv: u64,
    /// Watches may resume from any RV >= this; older ones are "too old" (410).
    oldest: u64,
    objects: HashMap<String, BTreeMap<ObjKey, Arc<Value>>>,
    history: VecDeque<Change>,
    history_limit: usize,
    /// By storage, the resourceVersion of its newest change the history no longer has: a
    /// running watch of that storage from an older one has missed it.
    dropped: HashMap<String, u64>,
    /// What the pods bound to each node reference, kept as pods are written.
    pub node_refs: NodeRefs,
    pub registry: Registry,
    /// The cluster CA, published in every namespace as kube-root-ca.crt.
    pub ca_pem: String,
    /// Every eviction request, in order (see `TestApiServer::evictions`).
    pub evictions: Vec<crate::EvictionRecord>,
}

impl StoreInner {
    pub fn new(registry: Registry, history_limit: usize) -> StoreInner {
        StoreInner {
            rv: 1,
            oldest: 1,
            objects: HashMap::new(),
            history: VecDeque::new(),
            history_limit,
            dropped: HashMap::new(),
            node_refs: NodeRefs::default(),
            registry,
            ca_pem: String::new(),
            evictions: Vec::new(),
        }
    }

    pub fn current_rv(&self) -> u64 {
        self.rv
    }

    pub fn get(&self, storage: &str, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.objects.get(storage)?.get(&(ns.to_string(), name.to_string())).cloned()
    }

    /// Objects of one storage, optionally in one namespace, in (namespace, name) order.
    pub fn list(&self, storage: &str, ns: Option<&str>) -> Vec<Arc<Value>> {
        let Some(objects) = self.objects.get(storage) else { return Vec::new() };
        match ns {
            Some(ns) => objects
                .range((ns.to_string(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, v)| v.clone())
                .collect(),
            None => objects.values().cloned().collect(),
        }
    }

    /// Whether any object of any storage lives in namespace `ns`.
    pub fn namespace_has_objects(&self, ns: &str) -> bool {
        self.objects
            .values()
            .any(|m| m.range((ns.to_string(), String::new())..).next().is_some_and(|((n, _), _)| n == ns))
    }

    /// Storages that have objects in namespace `ns`.
    pub fn storages_in_namespace(&self, ns: &str) -> Vec<String> {
        self.objects
            .iter()
            .filter(|(_, m)| m.range((ns.to_string(), String::new())..).next().is_some_and(|((n, _), _)| n == ns))
            .map(|(s, _)| s.clone())
            .collect()
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn key_of(obj: &Value) -> ObjKey {
        let s = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or("").to_string();
        (s("/metadata/namespace"), s("/metadata/name"))
    }

    /// Stores `obj` (new or replacing), stamping the next resourceVersion.
    pub fn put(&mut self, storage: &str, mut obj: Value) -> Arc<Value> {
        let rv = self.next_rv();
        obj["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let obj = Arc::new(obj);
        let key = Self::key_of(&obj);
        let prev = self.objects.entry(storage.to_string()).or_default().insert(key, obj.clone());
        if storage == PODS {
            self.node_refs.replace(prev.as_deref(), Some(&obj));
        }
        let kind = if prev.is_some() { EventType::Modified } else { EventType::Added };
        self.record(Change { rv, storage: storage.to_string(), kind, object: obj.clone(), prev });
        obj
    }

    /// Removes an object; the DELETED event carries its last state at a new resourceVersion.
    pub fn remove(&mut self, storage: &str, ns: &str, name: &str) -> Option<Arc<Value>> {
        let prev = self.objects.get_mut(storage)?.remove(&(ns.to_string(), name.to_string()))?;
        if storage == PODS {
            self.node_refs.replace(Some(&prev), None);
        }
        let rv = self.next_rv();
        let mut last = (*prev).clone();
        last["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let last = Arc::new(last);
        self.record(Change {
            rv,
            storage: storage.to_string(),
            kind: EventType::Deleted,
            object: last.clone(),
            prev: Some(prev),
        });
        Some(last)
    }

    fn record(&mut self, change: Change) {
        self.history.push_back(change);
        while self.history.len() > self.history_limit {
            if let Some(dropped) = self.history.pop_front() {
                self.oldest = dropped.rv;
                self.dropped.insert(dropped.storage, dropped.rv);
            }
        }
    }

    /// Forgets all history: only the current resourceVersion can be resumed from.
    pub fn compact(&mut self) {
        for change in self.history.drain(..) {
            self.dropped.insert(change.storage, change.rv);
        }
        self.oldest = self.rv;
    }

    /// Changes after `rv`, or Err(oldest) when `rv` is older than the history.
    pub fn changes_since(&self, rv: u64) -> Result<impl Iterator<Item = &Change>, u64> {
        if rv < self.oldest {
            return Err(self.oldest);
        }
        let start = self.history.partition_point(|c| c.rv <= rv);
        Ok(self.history.range(start..))
    }

    /// The changes of `storage` after `rv`, for a running watch: Err(oldest) only when the
    /// history dropped one of them. Changes of other storages may have gone meanwhile: such a
    /// watch is not woken for them, so its `rv` can be older than the history.
    pub fn changes_of_since(&self, storage: &str, rv: u64) -> Result<impl Iterator<Item = &Change>, u64> {
        if self.dropped.get(storage).is_some_and(|&dropped| dropped > rv) {
            return Err(self.oldest);
        }
        let start = self.history.partition_point(|c| c.rv <= rv);
        Ok(self.history.range(start..).filter(move |c| c.storage == storage))
    }

    /// The storages changed after `rv`.
    fn storages_changed_since(&self, rv: u64) -> Vec<&str> {
        let mut storages: Vec<&str> = Vec::new();
        for change in self.history.iter().rev().take_while(|c| c.rv > rv) {
            if !storages.contains(&change.storage.as_str()) {
                storages.push(&change.storage);
            }
        }
        storages
    }

    /// The objects of `storage` as they were at `rv`, rebuilt by undoing later changes.
    pub fn snapshot_at(&self, storage: &str, rv: u64) -> Result<BTreeMap<ObjKey, Arc<Value>>, u64> {
        if rv < self.oldest {
            return Err(self.oldest);
        }
        let mut objects = self.objects.get(storage).cloned().unwrap_or_default();
        for change in self.history.iter().rev().take_while(|c| c.rv > rv) {
            if change.storage != storage {
                continue;
            }
            let key = Self::key_of(&change.object);
            match &change.prev {
                Some(prev) => objects.insert(key, prev.clone()),
                None => objects.remove(&key),
            };
        }
        Ok(objects)
    }
}

/// The shared store.
pub struct Store {
    inner: Mutex<StoreInner>,
    latest: watch::Sender<u64>,
    /// The latest resourceVersion that changed each watched storage.
    by_storage: Mutex<HashMap<String, watch::Sender<u64>>>,
}

impl Store {
    pub fn new(inner: StoreInner) -> Store {
        let (latest, _) = watch::channel(inner.rv);
        Store { inner: Mutex::new(inner), latest, by_storage: Mutex::default() }
    }

    /// Locks the store; when the guard drops after writes, watchers are woken.
    pub fn lock(&self) -> Txn<'_> {
        let guard = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let start_rv = guard.rv;
        Txn { guard, store: self, start_rv }
    }

    /// A receiver that sees every new latest resourceVersion.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.latest.subscribe()
    }

    /// A receiver that sees every write of `storage`.
    pub fn subscribe_to(&self, storage: &str) -> watch::Receiver<u64> {
        let mut by_storage = self.by_storage.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        by_storage.entry(storage.to_string()).or_insert_with(|| watch::channel(0).0).subscribe()
    }
}

pub struct Txn<'a> {
    guard: MutexGuard<'a, StoreInner>,
    store: &'a Store,
    start_rv: u64,
}

impl Deref for Txn<'_> {
    type Target = StoreInner;
    fn deref(&self) -> &StoreInner {
        &self.guard
    }
}

impl DerefMut for Txn<'_> {
    fn deref_mut(&mut self) -> &mut StoreInner {
        &mut self.guard
    }
}

impl Drop for Txn<'_> {
    fn drop(&mut self) {
        if self.guard.rv == self.start_rv {
            return;
        }
        self.store.latest.send_replace(self.guard.rv);
        let by_storage = self.store.by_storage.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for storage in self.guard.storages_changed_since(self.start_rv) {
            if let Some(sender) = by_storage.get(storage) {
                sender.send_replace(self.guard.rv);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn obj(ns: &str, name: &str, v: i64) -> Value {
        json!({"metadata": {"namespace": ns, "name": name}, "v": v})
    }

    #[test]
    fn rv_increases_and_history_resumes() {
        let mut s = StoreInner::new(Registry::default(), 100);
        let start = s.current_rv();
        s.put("pods", obj("a", "x", 1));
        s.put("pods", obj("a", "x", 2));
        s.remove("pods", "a", "x");
        let kinds: Vec<_> = s.changes_since(start).unwrap().map(|c| c.kind).collect();
        assert_eq!(kinds, vec![EventType::Added, EventType::Modified, EventType::Deleted]);
        assert_eq!(s.current_rv(), start + 3);
        assert_eq!(s.changes_since(start + 2).unwrap().count(), 1);
    }

    #[test]
    fn compaction_expires_old_versions() {
        let mut s = StoreInner::new(Registry::default(), 100);
        s.put("pods", obj("a", "x", 1));
        let before = s.current_rv();
        s.put("pods", obj("a", "x", 2));
        s.compact();
        assert_eq!(s.changes_since(before).err(), Some(s.current_rv()));
        assert!(s.changes_since(s.current_rv()).is_ok());
    }

    #[test]
    fn bounded_history() {
        let mut s = StoreInner::new(Registry::default(), 2);
        let start = s.current_rv();
        for i in 0..5 {
            s.put("pods", obj("a", "x", i));
        }
        assert!(s.changes_since(start).is_err());
        assert_eq!(s.changes_since(s.current_rv() - 2).unwrap().count(), 2);
    }

    #[test]
    fn a_running_watch_loses_only_the_changes_of_its_own_storage() {
        let mut s = StoreInner::new(Registry::default(), 2);
        s.put("configmaps", obj("a", "c", 1));
        let cursor = s.current_rv();
        for i in 0..5 {
            s.put("events", obj("a", "e", i));
        }
        // Only events left the history since: a ConfigMap watch at `cursor` missed nothing.
        assert!(s.changes_since(cursor).is_err());
        assert_eq!(s.changes_of_since("configmaps", cursor).unwrap().count(), 0);
        s.put("configmaps", obj("a", "c", 2));
        assert_eq!(s.changes_of_since("configmaps", cursor).unwrap().count(), 1);
        s.put("events", obj("a", "e", 9));
        s.put("events", obj("a", "e", 10));
        // Now the ConfigMap's change is gone too.
        assert!(s.changes_of_since("configmaps", cursor).is_err());
        s.compact();
        assert!(s.changes_of_since("events", s.current_rv() - 1).is_err());
    }

    #[tokio::test]
    async fn a_write_wakes_the_watchers_of_its_storage_only() {
        let store = Store::new(StoreInner::new(Registry::default(), 100));
        let (mut configmaps, mut events) = (store.subscribe_to("configmaps"), store.subscribe_to("events"));
        store.lock().put("events", obj("a", "e", 1));
        assert!(events.has_changed().unwrap());
        assert!(!configmaps.has_changed().unwrap());
        let rv = {
            let mut txn = store.lock();
            txn.put("events", obj("a", "e", 2));
            txn.put("configmaps", obj("a", "c", 1)).clone()
        };
        assert!(configmaps.has_changed().unwrap());
        assert_eq!(*configmaps.borrow_and_update(), rv_of(&rv));
        assert_eq!(*events.borrow_and_update(), rv_of(&rv));
    }

    fn rv_of(obj: &Value) -> u64 {
        obj["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap()
    }

    #[test]
    fn snapshots_undo_later_changes() {
        let mut s = StoreInner::new(Registry::default(), 100);
        s.put("pods", obj("a", "x", 1));
        s.put("pods", obj("a", "y", 1));
        let at = s.current_rv();
        s.put("pods", obj("a", "x", 2));
        s.remove("pods", "a", "y");
        s.put("pods", obj("a", "z", 1));
        let snap = s.snapshot_at("pods", at).unwrap();
        let names: Vec<_> = snap.keys().map(|(_, n)| n.as_str()).collect();
        assert_eq!(names, vec!["x", "y"]);
        assert_eq!(snap[&("a".into(), "x".into())]["v"], 1);
    }

    #[test]
    fn list_by_namespace() {
        let mut s = StoreInner::new(Registry::default(), 100);
        s.put("pods", obj("a", "x", 1));
        s.put("pods", obj("b", "y", 1));
        s.put("pods", obj("ab", "z", 1));
        assert_eq!(s.list("pods", Some("a")).len(), 1);
        assert_eq!(s.list("pods", None).len(), 3);
        assert!(s.namespace_has_objects("b"));
        assert!(!s.namespace_has_objects("c"));
    }
}
