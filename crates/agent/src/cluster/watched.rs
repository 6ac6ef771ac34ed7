//! Watches of the API objects pods use, reference-counted by pod, as upstream's watch-based
//! manager: a watch starts when the first pod needs its objects and stops when the last one
//! is gone, so a node whose pods do not change sends no requests for them at all.
//!
//! A scope is one object (`fieldSelector=metadata.name=<name>`, all the Node authorizer lets a
//! node watch for ConfigMaps and Secrets) or a whole namespace (Services). An object marked
//! immutable is kept and its watch ends, as upstream stops the reflector of an immutable
//! object. The watches are futures run by [`run`], which the node supervises: none is
//! detached.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{AbortHandle, AbortRegistration, Abortable, BoxFuture};
use http_body_util::BodyExt;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{ListParams, ObjectList, WatchEvent, WatchParams};
use kube::core::Status;
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use super::retry::{Failure, WatchRetry};

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
type View<K> = Option<Arc<Objects<K>>>;

/// The objects of a scope, sorted by name. A list rather than a `BTreeMap`: most scopes hold
/// one object, and a map's first node has room for eleven (about 5 KB for a Secret, more than
/// the watch itself).
#[derive(Debug, Clone)]
pub struct Objects<K>(Vec<(String, K)>);

impl<K> Default for Objects<K> {
    fn default() -> Self {
        Objects(Vec::new())
    }
}

impl<K> Objects<K> {
    pub fn get(&self, name: &str) -> Option<&K> {
        self.position(name).ok().map(|i| &self.0[i].1)
    }

    pub fn values(&self) -> impl Iterator<Item = &K> {
        self.0.iter().map(|(_, object)| object)
    }

    fn insert(&mut self, name: String, object: K) {
        match self.position(&name) {
            Ok(i) => self.0[i].1 = object,
            Err(i) => self.0.insert(i, (name, object)),
        }
    }

    fn remove(&mut self, name: &str) {
        if let Ok(i) = self.position(name) {
            self.0.remove(i);
        }
    }

    fn position(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(n, _)| n.as_str().cmp(name))
    }
}

impl<K> FromIterator<(String, K)> for Objects<K> {
    fn from_iter<I: IntoIterator<Item = (String, K)>>(objects: I) -> Self {
        let mut list: Vec<(String, K)> = objects.into_iter().collect();
        list.sort_by(|a, b| a.0.cmp(&b.0));
        list.dedup_by(|a, b| a.0 == b.0);
        list.shrink_to_fit();
        Objects(list)
    }
}

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
    pub async fn get(&self, pod: &str, scope: &Scope) -> Option<Arc<Objects<K>>> {
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
        let (stop, registration) = AbortHandle::new_pair();
        let follow = follow(self.client.clone(), scope.clone(), tx, self.immutable);
        // Without a running `run` (it has stopped with the node) lookups time out.
        let _ = self.spawner.send(Box::pin(stoppable(follow, registration)));
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

/// `watch`, ending when its registration's handle aborts it. Mapped rather than awaited in an
/// `async` block, which holds the future it awaits twice over (once captured, once awaited):
/// that doubled each watch's task to 2.1 KB (heaptrack, 250 pods with a ConfigMap and Secret).
fn stoppable(watch: impl Future<Output = ()>, registration: AbortRegistration) -> impl Future<Output = ()> {
    Abortable::new(watch, registration).map(drop)
}

/// How long the server keeps one watch request open; kube's watcher asks for the same.
const WATCH_TIMEOUT_SECS: u32 = 290;

/// How one list-and-watch run of a scope ended.
enum Ended {
    /// A watched object is immutable: there is nothing more to follow.
    Immutable,
    /// The resourceVersion the watch resumes from is gone (410): list again at once.
    Expired,
}

#[derive(Debug, thiserror::Error)]
enum WatchError {
    #[error(transparent)]
    Client(#[from] kube::Error),
    #[error("watch request: {0}")]
    Request(#[from] kube::core::request::Error),
    #[error("watch answered {code}: {message}")]
    Answer { code: u16, message: String },
    #[error("watch event: {0}")]
    Event(#[from] serde_json::Error),
}

/// Lists and watches one scope, publishing every change, until a watched object is
/// immutable. Its own loop rather than kube's `watcher`: a node keeps one of these for each
/// ConfigMap and Secret its pods use, and each of kube's held an 8 KiB line buffer and a 5 KiB
/// stream for as long as it ran (heaptrack, 110 pods with one of each); this one holds a line
/// buffer only while a line arrives. Failures are retried from the last resourceVersion seen,
/// backing off as [`WatchRetry`] says; a version gone (410) means a new list.
async fn follow<K>(client: Client, scope: Scope, tx: watch::Sender<View<K>>, immutable: fn(&K) -> bool)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let mut retry = WatchRetry::default();
    let mut version = None;
    loop {
        let failure = match run_once(&client, &scope, &tx, immutable, &mut version, &mut retry).await {
            Ok(Ended::Immutable) => {
                tracing::debug!(kind = %K::kind(&()), namespace = %scope.namespace, name = ?scope.name, "object is immutable; watch stopped");
                return;
            }
            Ok(Ended::Expired) => {
                tracing::debug!(kind = %K::kind(&()), namespace = %scope.namespace, name = ?scope.name, "watch version gone; listing again");
                version = None;
                continue;
            }
            Err(e) => e,
        };
        let Failure { log, retry_in } = retry.failed(&failure.to_string());
        if log {
            tracing::warn!(kind = %K::kind(&()), namespace = %scope.namespace, name = ?scope.name, error = %failure, "watch failed; retrying");
        }
        tokio::time::sleep(retry_in).await;
    }
}

/// Lists the scope when `version` is `None`, then watches it from `version` until the server
/// ends the watch, and again, keeping `version` at the last one seen.
async fn run_once<K>(
    client: &Client,
    scope: &Scope,
    tx: &watch::Sender<View<K>>,
    immutable: fn(&K) -> bool,
    version: &mut Option<String>,
    retry: &mut WatchRetry,
) -> Result<Ended, WatchError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let request = kube::core::Request::new(K::url_path(&(), Some(&scope.namespace)));
    // Boxed, as every request below: a watch spends its life waiting for the next line, and
    // an inline request future would make that wait as large as the request.
    if version.is_none() {
        if Box::pin(list(client, &request, scope, tx, immutable, version)).await? {
            return Ok(Ended::Immutable);
        }
        retry.recovered();
    }
    let mut params = WatchParams::default().timeout(WATCH_TIMEOUT_SECS);
    if let Some(name) = &scope.name {
        params = params.fields(&format!("metadata.name={name}"));
    }
    loop {
        let mut watch = request.watch(&params, version.as_deref().unwrap_or_default())?;
        // As kube's own watches: servers from 1.37 gzip each event as its own gzip member.
        watch.headers_mut().insert(http::header::ACCEPT_ENCODING, http::HeaderValue::from_static("identity"));
        let response = Box::pin(client.send(watch.map(kube::client::Body::from))).await?;
        if !response.status().is_success() {
            return Box::pin(refused(response)).await;
        }
        let mut body = response.into_body();
        let mut line = Vec::new();
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame?.into_data() else { continue };
            line.extend_from_slice(&data);
            while let Some(end) = line.iter().position(|&b| b == b'\n') {
                let event = serde_json::from_slice::<WatchEvent<K>>(&line[..end]);
                line.drain(..=end);
                if let Some(ended) = apply(event?, scope, tx, immutable, version, retry)? {
                    return Ok(ended);
                }
            }
            if line.is_empty() {
                line = Vec::new();
            }
        }
        tracing::debug!(kind = %K::kind(&()), namespace = %scope.namespace, name = ?scope.name, version = ?version, "watch ended by the server; watching again");
    }
}

/// Lists the scope and publishes what it holds, setting `version` to the list's; true when the
/// one object the scope follows is immutable.
async fn list<K>(
    client: &Client,
    request: &kube::core::Request,
    scope: &Scope,
    tx: &watch::Sender<View<K>>,
    immutable: fn(&K) -> bool,
    version: &mut Option<String>,
) -> Result<bool, WatchError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let mut params = ListParams::default();
    if let Some(name) = &scope.name {
        params = params.fields(&format!("metadata.name={name}"));
    }
    let list: ObjectList<K> = client.request(request.list(&params)?).await?;
    let objects = list.items.into_iter().map(|mut o| (slim(&mut o), o)).collect();
    tx.send_replace(Some(Arc::new(objects)));
    *version = list.metadata.resource_version;
    Ok(is_immutable(scope, tx, immutable))
}

/// Applies one watch event to the published objects.
fn apply<K>(
    event: WatchEvent<K>,
    scope: &Scope,
    tx: &watch::Sender<View<K>>,
    immutable: fn(&K) -> bool,
    version: &mut Option<String>,
    retry: &mut WatchRetry,
) -> Result<Option<Ended>, WatchError>
where
    K: Resource<DynamicType = ()> + Clone,
{
    let (mut object, deleted) = match event {
        WatchEvent::Added(o) | WatchEvent::Modified(o) => (o, false),
        WatchEvent::Deleted(o) => (o, true),
        WatchEvent::Bookmark(b) => {
            *version = Some(b.metadata.resource_version);
            return Ok(None);
        }
        WatchEvent::Error(status) if status.code == 410 => return Ok(Some(Ended::Expired)),
        WatchEvent::Error(status) => return Err(WatchError::Answer { code: status.code, message: status.message }),
    };
    *version = object.meta().resource_version.clone();
    retry.recovered();
    let name = slim(&mut object);
    tx.send_modify(|v| {
        let objects = Arc::make_mut(v.get_or_insert_with(Arc::default));
        if deleted {
            objects.remove(&name);
        } else {
            objects.insert(name, object);
        }
    });
    Ok(is_immutable(scope, tx, immutable).then_some(Ended::Immutable))
}

/// A watch request the server refused: 410 means list again, anything else is a failure.
async fn refused(response: http::Response<kube::client::Body>) -> Result<Ended, WatchError> {
    let code = response.status().as_u16();
    if code == 410 {
        return Ok(Ended::Expired);
    }
    let body = response.into_body().collect().await?.to_bytes();
    let message = serde_json::from_slice::<Status>(&body)
        .map(|s| s.message)
        .unwrap_or_else(|_| String::from_utf8_lossy(&body).into_owned());
    Err(WatchError::Answer { code, message })
}

/// Whether the one object a scope follows is immutable.
fn is_immutable<K>(scope: &Scope, tx: &watch::Sender<View<K>>, immutable: fn(&K) -> bool) -> bool {
    scope.name.is_some() && tx.borrow().as_ref().is_some_and(|v| v.values().any(immutable))
}

/// Drops what no pod reads but each kept object would carry (server-side-apply bookkeeping
/// is often larger than a small ConfigMap's data); returns the object's name.
fn slim<K: Resource>(object: &mut K) -> String {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    meta.name.clone().unwrap_or_default()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watch_task_holds_its_loop_once() {
        let svc = tower::service_fn(|_: http::Request<kube::client::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(kube::client::Body::empty()))
        });
        let client = Client::new(svc, "default");
        let (tx, _view) = watch::channel(None);
        let watch = follow::<k8s_openapi::api::core::v1::ConfigMap>(client, Scope::object("ns", "cm"), tx, |_| false);
        let loop_size = std::mem::size_of_val(&watch);
        let (_stop, registration) = AbortHandle::new_pair();
        let task = stoppable(watch, registration);
        assert!(
            std::mem::size_of_val(&task) < loop_size + 64,
            "task {} bytes for a {loop_size}-byte loop",
            std::mem::size_of_val(&task)
        );
    }

    #[test]
    fn objects_are_found_by_name_replaced_and_removed() {
        let mut objects: Objects<u32> = [("b".to_string(), 2), ("a".to_string(), 1)].into_iter().collect();
        assert_eq!(objects.values().copied().collect::<Vec<_>>(), [1, 2], "sorted by name");
        objects.insert("c".into(), 3);
        objects.insert("a".into(), 10);
        assert_eq!((objects.get("a"), objects.get("c"), objects.get("d")), (Some(&10), Some(&3), None));
        objects.remove("b");
        objects.remove("missing");
        assert_eq!(objects.values().copied().collect::<Vec<_>>(), [10, 3]);
    }
}
