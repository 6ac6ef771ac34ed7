//! Watches of the API objects pods use, reference-counted by pod, as upstream's watch-based
//! manager: a watch starts when the first pod needs its objects and stops when the last one
//! is gone, so a node whose pods do not change sends no requests for them at all.
//!
//! A scope is one object (`fieldSelector=metadata.name=<name>`, all the Node authorizer lets a
//! node watch for ConfigMaps and Secrets) or a whole namespace (Services). An object marked
//! immutable is kept and its watch ends, as upstream stops the reflector of an immutable
//! object. The watches are futures run by [`run`], which the node supervises: none is
//! detached.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::{AbortHandle, Abortable, BoxFuture};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::NamespaceResourceScope;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

/// How long a lookup waits for a new watch's first list (upstream waits one second too).
pub const SYNC_WAIT: Duration = Duration::from_secs(1);

/// What one watch covers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope {
    pub namespace: String,
    /// One object, or the whole namespace.
    pub name: Option<String>,
}

impl Scope {
    pub fn object(namespace: &str, name: &str) -> Self {
        Scope { namespace: namespace.to_string(), name: Some(name.to_string()) }
    }

    pub fn namespace(namespace: &str) -> Self {
        Scope { namespace: namespace.to_string(), name: None }
    }
}

/// The objects of a scope by name; `None` until the watch's first list arrived.
type View<K> = Option<Arc<BTreeMap<String, K>>>;

struct Entry<K> {
    /// UIDs of the pods using the scope.
    pods: HashSet<String>,
    view: watch::Receiver<View<K>>,
    stop: AbortHandle,
}

/// Hands new watches to [`run`], which owns them.
pub type Spawner = mpsc::UnboundedSender<BoxFuture<'static, ()>>;

/// The watches of one kind of object.
pub struct Watched<K> {
    client: Client,
    entries: Mutex<HashMap<Scope, Entry<K>>>,
    spawner: Spawner,
    /// Whether an object can no longer change (`immutable: true`).
    immutable: fn(&K) -> bool,
}

impl<K> Watched<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    pub fn new(client: Client, spawner: Spawner, immutable: fn(&K) -> bool) -> Self {
        Watched { client, entries: Mutex::default(), spawner, immutable }
    }

    /// The objects of `scope`, which `pod` uses from now on (starting the watch if it is the
    /// first). `None` when the watch has not listed them within [`SYNC_WAIT`].
    pub async fn get(&self, pod: &str, scope: &Scope) -> Option<Arc<BTreeMap<String, K>>> {
        let mut view = self.acquire(pod, scope);
        let synced = tokio::time::timeout(SYNC_WAIT, view.wait_for(Option::is_some)).await;
        match synced {
            Ok(Ok(v)) => v.clone(),
            // The watch was stopped before it listed anything.
            Ok(Err(_)) | Err(_) => None,
        }
    }

    fn acquire(&self, pod: &str, scope: &Scope) -> watch::Receiver<View<K>> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = entries.get_mut(scope) {
            entry.pods.insert(pod.to_string());
            return entry.view.clone();
        }
        let (tx, view) = watch::channel(None);
        let api = Api::<K>::namespaced(self.client.clone(), &scope.namespace);
        let (stop, registration) = AbortHandle::new_pair();
        let follow = follow(api, scope.clone(), tx, self.immutable);
        // Without a running `run` (it has stopped with the node) lookups time out.
        let _ = self.spawner.send(Box::pin(async move {
            let _ = Abortable::new(follow, registration).await;
        }));
        tracing::debug!(kind = %K::kind(&()), namespace = %scope.namespace, name = ?scope.name, "watch started");
        entries.insert(scope.clone(), Entry { pods: HashSet::from([pod.to_string()]), view: view.clone(), stop });
        view
    }

    /// `pod` no longer uses anything: watches no other pod uses stop.
    pub fn release(&self, pod: &str) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|scope, entry| {
            entry.pods.remove(pod);
            let keep = !entry.pods.is_empty();
            if !keep {
                entry.stop.abort();
                tracing::debug!(kind = %K::kind(&()), namespace = %scope.namespace, name = ?scope.name, "watch stopped");
            }
            keep
        });
    }

    /// The scopes watched (or kept, for immutable objects) now.
    pub fn scopes(&self) -> Vec<Scope> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<Scope> = entries.keys().cloned().collect();
        out.sort();
        out
    }
}

/// Lists and watches one scope (kube's watcher: relists after 410, backs off on errors),
/// publishing every change; ends once a watched object is immutable.
async fn follow<K>(api: Api<K>, scope: Scope, tx: watch::Sender<View<K>>, immutable: fn(&K) -> bool)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let mut config = watcher::Config::default();
    if let Some(name) = &scope.name {
        config = config.fields(&format!("metadata.name={name}"));
    }
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let mut pending = BTreeMap::new();
    let mut failing = false;
    loop {
        let event = match events.try_next().await {
            Ok(Some(event)) => event,
            Ok(None) => return,
            Err(e) => {
                // The watcher backs off; log the first failure of a run of them.
                if !failing {
                    tracing::warn!(kind = %K::kind(&()), namespace = %scope.namespace, name = ?scope.name, error = %e, "watch failed; retrying");
                }
                failing = true;
                continue;
            }
        };
        failing = false;
        let name = |o: &K| o.meta().name.clone().unwrap_or_default();
        let event = event.modify(slim);
        match event {
            Event::Init => pending.clear(),
            Event::InitApply(o) => {
                pending.insert(name(&o), o);
            }
            Event::InitDone => {
                tx.send_replace(Some(Arc::new(std::mem::take(&mut pending))));
            }
            Event::Apply(o) => tx.send_modify(|v| {
                Arc::make_mut(v.get_or_insert_with(Arc::default)).insert(name(&o), o);
            }),
            Event::Delete(o) => tx.send_modify(|v| {
                Arc::make_mut(v.get_or_insert_with(Arc::default)).remove(&name(&o));
            }),
        }
        let done = scope.name.is_some() && tx.borrow().as_ref().is_some_and(|v| v.values().any(immutable));
        if done {
            tracing::debug!(kind = %K::kind(&()), namespace = %scope.namespace, name = ?scope.name, "object is immutable; watch stopped");
            return;
        }
    }
}

/// Drops what no pod reads but each kept object would carry: server-side-apply bookkeeping
/// is often larger than a small ConfigMap's data.
fn slim<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// Runs the watches handed over by every [`Watched`] sharing `spawner`'s channel, for the
/// node's lifetime (a watch that panics takes the node down with it, as any supervised task).
pub async fn run(mut watches: mpsc::UnboundedReceiver<BoxFuture<'static, ()>>) {
    let mut running = JoinSet::new();
    loop {
        tokio::select! {
            Some(watch) = watches.recv() => {
                running.spawn(watch);
            }
            Some(ended) = running.join_next() => {
                if let Err(e) = ended && e.is_panic() {
                    std::panic::resume_unwind(e.into_panic());
                }
            }
            else => std::future::pending::<()>().await,
        }
    }
}
