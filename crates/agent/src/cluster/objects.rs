//! The edge to the API server for what pods refer to: ConfigMaps and Secrets (read fresh on
//! each pod sync, so changes show up within the sync period) and service-account tokens
//! (TokenRequest bound to the pod, cached and renewed after 80% of their lifetime).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service, ServiceAccount};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};

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

#[derive(Clone)]
pub struct ObjectSource {
    client: Client,
    tokens: Arc<Mutex<TokenCache>>,
}

/// Upstream renews a token once 80% of its lifetime has passed (or after a day).
pub fn needs_renewal(issued: Secs, expires: Secs, now: Secs) -> bool {
    let lifetime = expires - issued;
    now >= issued + lifetime * 8 / 10 || now >= issued + 24 * 3600
}

impl ObjectSource {
    pub fn new(client: Client) -> Self {
        ObjectSource { client, tokens: Arc::default() }
    }

    /// `None` when it does not exist; other errors use the API server's message.
    pub async fn config_map(&self, ns: &str, name: &str) -> Result<Option<ConfigMap>, String> {
        Api::<ConfigMap>::namespaced(self.client.clone(), ns).get_opt(name).await.map_err(|e| e.to_string())
    }

    pub async fn secret(&self, ns: &str, name: &str) -> Result<Option<Secret>, String> {
        Api::<Secret>::namespaced(self.client.clone(), ns).get_opt(name).await.map_err(|e| e.to_string())
    }

    /// The services whose variables a pod in `ns` may get: those of `ns` (when `links`) and the
    /// API server's own `default/kubernetes`. Read fresh per container start (no watch cache).
    pub async fn services(&self, ns: &str, links: bool) -> Result<Vec<Service>, String> {
        let mut services = match Api::<Service>::namespaced(self.client.clone(), "default").get_opt("kubernetes").await
        {
            Ok(master) => master.into_iter().collect::<Vec<_>>(),
            Err(e) => return Err(format!("cannot read the kubernetes service: {e}")),
        };
        if links {
            let list = Api::<Service>::namespaced(self.client.clone(), ns).list(&ListParams::default()).await;
            services.extend(list.map_err(|e| format!("cannot list services in {ns}: {e}"))?.items);
        }
        Ok(services)
    }

    /// A token for the pod's service account, bound to the pod.
    pub async fn token(&self, pod: &Pod, key: &TokenKey) -> Result<String, String> {
        let cache_key = (spec::uid(pod).to_string(), key.clone());
        let now = jiff::Timestamp::now().as_second();
        if let Some((token, issued, expires)) = self.tokens.lock().unwrap().get(&cache_key)
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
        let api = Api::<ServiceAccount>::namespaced(self.client.clone(), spec::namespace(pod));
        let response = api
            .create_token_request(&sa, &PostParams::default(), &request)
            .await
            .map_err(|e| format!("failed to fetch token: {e}"))?;
        let status = response.status.ok_or("failed to fetch token: the TokenRequest has no status")?;
        let expires = status.expiration_timestamp.0.as_second();
        self.tokens.lock().unwrap().insert(cache_key, (status.token.clone(), now, expires));
        Ok(status.token)
    }

    /// Forgets the tokens of a pod that is gone.
    pub fn forget(&self, uid: &str) {
        self.tokens.lock().unwrap().retain(|(u, _), _| u != uid);
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
}
