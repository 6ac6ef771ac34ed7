//! The edge to the API server for what pods refer to, behind one seam ([`ObjectSource`]):
//! ConfigMaps and Secrets as `configMapAndSecretChangeDetectionStrategy` says (`Watch`: one
//! watch per object while a pod uses it; `Cache`: read again once the node's object TTL has
//! passed; `Get`: read on every use), Services for the service environment variables (one
//! watch of each namespace whose pods want service links, and of `default/kubernetes`), and
//! service-account tokens (TokenRequest bound to the pod, cached and renewed after 80% of
//! their lifetime). Volume contents follow changes on each pod sync, which reads from here.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::ClusterResourceScope;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::api::PostParams;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};

use super::watched::{self, Scope, Watched};
use gantry_config::ChangeDetection;
use gantry_vocab::spec;

/// A service-account token a projected volume needs, by audience and lifetime.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenKey {
    pub audience: String,
    pub expiration_seconds: i64,
}

/// Unix seconds.
type Secs = i64;

/// By pod UID and token key: the token and when it was issued and expires.
type TokenCache = HashMap<(String, TokenKey), (String, Secs, Secs)>;

/// Upstream's TTL when the node has no `node.alpha.kubernetes.io/ttl` annotation.
pub const DEFAULT_OBJECT_TTL: Duration = Duration::from_secs(60);

/// The service every pod gets variables for, whatever its namespace.
const MASTER: (&str, &str) = ("default", "kubernetes");

#[derive(Clone)]
pub struct ObjectSource {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    strategy: ChangeDetection,
    config_maps: Watched<ConfigMap>,
    secrets: Watched<Secret>,
    services: Watched<Service>,
    cached_config_maps: Mutex<TtlCache<ConfigMap>>,
    cached_secrets: Mutex<TtlCache<Secret>>,
    /// The node's object TTL annotation, as the node status loop last read it.
    node_ttl: watch::Receiver<Option<Duration>>,
    tokens: Mutex<TokenCache>,
}

/// Upstream renews a token once 80% of its lifetime has passed (or after a day).
pub fn needs_renewal(issued: Secs, expires: Secs, now: Secs) -> bool {
    let lifetime = expires - issued;
    now >= issued + lifetime * 8 / 10 || now >= issued + 24 * 3600
}

/// Objects read for the `Cache` strategy, with when, and the pods that use each.
struct TtlCache<K> {
    entries: HashMap<(String, String), CacheEntry<K>>,
}

struct CacheEntry<K> {
    pods: HashSet<String>,
    /// When it was read and what was read (None: it does not exist).
    read: Option<(Instant, Option<K>)>,
}

impl<K> Default for TtlCache<K> {
    fn default() -> Self {
        TtlCache { entries: HashMap::new() }
    }
}

impl<K: Clone> TtlCache<K> {
    /// The cached object when still fresh. A pod using the object for the first time reads
    /// it again, as upstream's `AddReference` invalidates, so a new pod never starts on stale
    /// data.
    fn fresh(&mut self, pod: &str, key: (String, String), now: Instant, ttl: Duration) -> Option<Option<K>> {
        let entry = self.entries.entry(key).or_insert_with(|| CacheEntry { pods: HashSet::new(), read: None });
        if entry.pods.insert(pod.to_string()) {
            entry.read = None;
        }
        let (at, value) = entry.read.as_ref()?;
        (now.duration_since(*at) < ttl).then(|| value.clone())
    }

    fn store(&mut self, key: (String, String), now: Instant, value: Option<K>) {
        if let Some(entry) = self.entries.get_mut(&key) {
            entry.read = Some((now, value));
        }
    }

    fn release(&mut self, pod: &str) {
        self.entries.retain(|_, e| {
            e.pods.remove(pod);
            !e.pods.is_empty()
        });
    }
}

fn config_map_immutable(cm: &ConfigMap) -> bool {
    cm.immutable == Some(true)
}

fn secret_immutable(s: &Secret) -> bool {
    s.immutable == Some(true)
}

/// Why an object a pod refers to could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// The API server's answer to a read, in its own words.
    #[error("{0}")]
    Read(#[source] kube::Error),
    #[error("services have not yet been read at least once, cannot construct envvars")]
    ServicesNotRead,
    #[error("failed to fetch token: {0}")]
    Token(#[source] kube::Error),
    #[error("failed to fetch token: the TokenRequest has no status")]
    TokenWithoutStatus,
}

impl ObjectSource {
    /// The source, and the task that runs its watches (for the node's supervisor).
    /// `node_ttl`: the node's `node.alpha.kubernetes.io/ttl`, for the `Cache` strategy.
    pub fn new(
        client: Client,
        strategy: ChangeDetection,
        node_ttl: watch::Receiver<Option<Duration>>,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (spawner, watches) = mpsc::unbounded_channel();
        let inner = Inner {
            config_maps: Watched::new(client.clone(), spawner.clone(), config_map_immutable),
            secrets: Watched::new(client.clone(), spawner.clone(), secret_immutable),
            services: Watched::new(client.clone(), spawner, |_| false),
            client,
            strategy,
            cached_config_maps: Mutex::default(),
            cached_secrets: Mutex::default(),
            node_ttl,
            tokens: Mutex::default(),
        };
        (ObjectSource { inner: Arc::new(inner) }, watched::run(watches))
    }

    /// A ConfigMap in the pod's namespace; `None` when it does not exist; other errors use
    /// the API server's message.
    pub async fn config_map(&self, pod: &Pod, name: &str) -> Result<Option<ConfigMap>, ObjectError> {
        let i = &self.inner;
        self.lookup(&i.config_maps, &i.cached_config_maps, pod, name).await
    }

    pub async fn secret(&self, pod: &Pod, name: &str) -> Result<Option<Secret>, ObjectError> {
        let i = &self.inner;
        self.lookup(&i.secrets, &i.cached_secrets, pod, name).await
    }

    async fn lookup<K>(
        &self,
        watched: &Watched<K>,
        cache: &Mutex<TtlCache<K>>,
        pod: &Pod,
        name: &str,
    ) -> Result<Option<K>, ObjectError>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        let (uid, ns) = (spec::uid(pod), spec::namespace(pod));
        match self.inner.strategy {
            ChangeDetection::Get => self.read(ns, name).await,
            ChangeDetection::Cache => {
                let key = (ns.to_string(), name.to_string());
                let ttl = self.inner.node_ttl.borrow().unwrap_or(DEFAULT_OBJECT_TTL);
                let fresh =
                    cache.lock().unwrap_or_else(|p| p.into_inner()).fresh(uid, key.clone(), Instant::now(), ttl);
                if let Some(value) = fresh {
                    return Ok(value);
                }
                let value = self.read(ns, name).await?;
                cache.lock().unwrap_or_else(|p| p.into_inner()).store(key, Instant::now(), value.clone());
                Ok(value)
            }
            ChangeDetection::Watch => match watched.get(uid, &Scope::object(ns, name)).await {
                Some(view) => Ok(view.get(name).cloned()),
                // A watch that has not listed yet must not hold the pod up: read it once.
                None => self.read(ns, name).await,
            },
        }
    }

    async fn read<K>(&self, ns: &str, name: &str) -> Result<Option<K>, ObjectError>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    {
        Api::<K>::namespaced(self.inner.client.clone(), ns).get_opt(name).await.map_err(ObjectError::Read)
    }

    /// A Secret a PersistentVolume names for its CSI driver (`nodeStageSecretRef`,
    /// `nodePublishSecretRef`), read on every use as upstream's CSI plugin reads it.
    pub async fn volume_secret(&self, ns: &str, name: &str) -> Result<Option<Secret>, ObjectError> {
        self.read(ns, name).await
    }

    /// A PersistentVolumeClaim, read on every use (as upstream's volume manager reads claims).
    pub async fn claim(&self, ns: &str, name: &str) -> Result<Option<PersistentVolumeClaim>, ObjectError> {
        self.read(ns, name).await
    }

    /// A PersistentVolume, read on every use.
    pub async fn persistent_volume(&self, name: &str) -> Result<Option<PersistentVolume>, ObjectError> {
        self.read_cluster(name).await
    }

    /// A CSIDriver object (`storage.k8s.io/v1`), read on every use.
    pub async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>, ObjectError> {
        self.read_cluster(name).await
    }

    /// A VolumeAttachment (`storage.k8s.io/v1`), read on every use.
    pub async fn volume_attachment(&self, name: &str) -> Result<Option<VolumeAttachment>, ObjectError> {
        self.read_cluster(name).await
    }

    async fn read_cluster<K>(&self, name: &str) -> Result<Option<K>, ObjectError>
    where
        K: Resource<Scope = ClusterResourceScope, DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    {
        Api::<K>::all(self.inner.client.clone()).get_opt(name).await.map_err(ObjectError::Read)
    }

    /// The services whose variables the pod may get: those of its namespace (when it wants
    /// service links) and the API server's own `default/kubernetes`, from watches the pod
    /// holds from now on.
    pub async fn services(&self, pod: &Pod) -> Result<Vec<Service>, ObjectError> {
        let (uid, ns) = (spec::uid(pod), spec::namespace(pod));
        let links = pod.spec.as_ref().and_then(|s| s.enable_service_links).unwrap_or(true);
        let mut scopes = Vec::new();
        if links {
            scopes.push(Scope::namespace(ns));
        }
        // The namespace watch of `default` already has it.
        if !(links && ns == MASTER.0) {
            scopes.push(Scope::object(MASTER.0, MASTER.1));
        }
        let mut services = Vec::new();
        for scope in scopes {
            let Some(view) = self.inner.services.get(uid, &scope).await else {
                return Err(ObjectError::ServicesNotRead);
            };
            services.extend(view.values().cloned());
        }
        Ok(services)
    }

    /// A token for the pod's service account, bound to the pod.
    pub async fn token(&self, pod: &Pod, key: &TokenKey) -> Result<String, ObjectError> {
        let cache_key = (spec::uid(pod).to_string(), key.clone());
        let now = jiff::Timestamp::now().as_second();
        if let Some((token, issued, expires)) =
            self.inner.tokens.lock().unwrap_or_else(|p| p.into_inner()).get(&cache_key)
            && !needs_renewal(*issued, *expires, now)
        {
            return Ok(token.clone());
        }
        let sa = pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).unwrap_or_else(|| "default".into());
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: if key.audience.is_empty() { vec![] } else { vec![key.audience.clone()] },
                expiration_seconds: Some(key.expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(spec::name(pod).to_string()),
                    uid: Some(spec::uid(pod).to_string()),
                }),
            },
            ..Default::default()
        };
        let api = Api::<ServiceAccount>::namespaced(self.inner.client.clone(), spec::namespace(pod));
        let response =
            api.create_token_request(&sa, &PostParams::default(), &request).await.map_err(ObjectError::Token)?;
        let status = response.status.ok_or(ObjectError::TokenWithoutStatus)?;
        let expires = status.expiration_timestamp.0.as_second();
        self.inner
            .tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(cache_key, (status.token.clone(), now, expires));
        Ok(status.token)
    }

    /// Forgets a pod that is gone: its tokens, and its uses of objects (watches no other pod
    /// uses stop).
    pub fn forget(&self, uid: &str) {
        let i = &self.inner;
        i.tokens.lock().unwrap_or_else(|p| p.into_inner()).retain(|(u, _), _| u != uid);
        i.config_maps.release(uid);
        i.secrets.release(uid);
        i.services.release(uid);
        i.cached_config_maps.lock().unwrap_or_else(|p| p.into_inner()).release(uid);
        i.cached_secrets.lock().unwrap_or_else(|p| p.into_inner()).release(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_after_80_percent_or_a_day() {
        assert!(!needs_renewal(0, 3600, 2879));
        assert!(needs_renewal(0, 3600, 2880));
        assert!(!needs_renewal(0, 200_000, 86_399));
        assert!(needs_renewal(0, 200_000, 86_400));
    }

    fn key(name: &str) -> (String, String) {
        ("ns".to_string(), name.to_string())
    }

    #[test]
    fn ttl_cache_reads_again_after_the_ttl_and_for_a_new_pod() {
        let mut cache = TtlCache::<u32>::default();
        let t0 = Instant::now();
        let ttl = Duration::from_secs(60);
        assert_eq!(cache.fresh("p1", key("a"), t0, ttl), None, "never read");
        cache.store(key("a"), t0, Some(1));
        assert_eq!(cache.fresh("p1", key("a"), t0 + Duration::from_secs(59), ttl), Some(Some(1)));
        assert_eq!(cache.fresh("p1", key("a"), t0 + ttl, ttl), None, "expired");
        cache.store(key("a"), t0 + ttl, Some(2));
        assert_eq!(cache.fresh("p2", key("a"), t0 + ttl, ttl), None, "a new pod reads it again");
        cache.store(key("a"), t0 + ttl, None);
        assert_eq!(cache.fresh("p1", key("a"), t0 + ttl, ttl), Some(None), "absence is cached too");
        cache.release("p1");
        assert_eq!(cache.entries.len(), 1, "p2 still uses it");
        cache.release("p2");
        assert!(cache.entries.is_empty());
    }
}
