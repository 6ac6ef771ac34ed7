//! Whether an authenticated user may make a request: upstream's mapping of a node API request
//! to attributes on the `nodes` resource (verb from the HTTP method, subresource from the
//! path, name = the node), decided by SubjectAccessReview (`Webhook`, answers cached 5 m when
//! allowed, 30 s when denied) or `AlwaysAllow`.
//!
//! With fine-grained kubelet authorization (KEP-2862, on by default upstream since 1.33),
//! `/pods` and `/healthz` are checked as `pods`/`healthz` first and `proxy` as the fallback.

use std::time::{Duration, Instant};

use http::Method;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, PostParams};

use super::authn::UserInfo;
use super::cache::TtlCache;
use gantry_config::{AuthorizationMode, ServerSettings};

/// The attributes of one request, as upstream's `GetRequestAttributes` builds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    pub verb: &'static str,
    /// Tried in order; the request is allowed if any is.
    pub subresources: Vec<&'static str>,
}

/// The API verb of an HTTP method (upstream leaves other methods, HEAD included, empty).
pub fn verb(method: &Method) -> &'static str {
    match *method {
        Method::POST => "create",
        Method::GET => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
}

/// `path` is `prefix` or below it (`/stats` and `/stats/summary`, not `/statsx`).
fn is_subpath(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    path == prefix || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

/// The subresources to check for a path, most specific first.
pub fn subresources(path: &str) -> Vec<&'static str> {
    const TABLE: &[(&str, &str)] =
        &[("/stats", "stats"), ("/metrics", "metrics"), ("/logs", "log"), ("/checkpoint", "checkpoint")];
    // Fine-grained: these also fall back to `proxy`.
    const FINE: &[(&str, &str)] = &[
        ("/pods", "pods"),
        ("/runningpods", "pods"),
        ("/healthz", "healthz"),
        ("/configz", "configz"),
        ("/statusz", "statusz"),
    ];
    if let Some((_, sub)) = TABLE.iter().find(|(prefix, _)| is_subpath(path, prefix)) {
        return vec![sub];
    }
    match FINE.iter().find(|(prefix, _)| is_subpath(path, prefix)) {
        Some((_, sub)) => vec![sub, "proxy"],
        None => vec!["proxy"],
    }
}

pub fn attributes(method: &Method, path: &str) -> Attributes {
    Attributes { verb: verb(method), subresources: subresources(path) }
}

/// Upstream's 403 body.
pub fn forbidden_message(user: &str, attrs: &Attributes) -> String {
    format!(
        "Forbidden (user={user}, verb={}, resource=nodes, subresource(s)=[{}])",
        attrs.verb,
        attrs.subresources.join(" ")
    )
}

/// Upstream's 500 body when the authorizer could not decide.
pub fn error_message(user: &str, attrs: &Attributes) -> String {
    format!(
        "Authorization error (user={user}, verb={}, resource=nodes, subresource(s)=[{}])",
        attrs.verb,
        attrs.subresources.join(" ")
    )
}

/// How long a review's answer is reused.
pub fn cache_ttl(allowed: bool, s: &ServerSettings) -> Duration {
    if allowed { s.cache_authorized_ttl } else { s.cache_unauthorized_ttl }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny,
}

pub struct Authorizer {
    mode: AuthorizationMode,
    node: String,
    client: Option<kube::Client>,
    settings: ServerSettings,
    cache: TtlCache<(UserInfo, &'static str, &'static str), bool>,
}

impl Authorizer {
    pub fn new(s: &ServerSettings, node: &str, client: Option<kube::Client>) -> Self {
        if s.authorization_mode == AuthorizationMode::Webhook && client.is_none() {
            tracing::warn!(
                "authorization.mode is Webhook but there is no API server (standalone mode): every request is forbidden; \
                 use --authorization-mode=AlwaysAllow to open the node API"
            );
        }
        Authorizer {
            mode: s.authorization_mode,
            node: node.to_string(),
            client,
            settings: s.clone(),
            cache: TtlCache::default(),
        }
    }

    /// Allowed if any of the subresources is; an error when a review could not be made.
    pub async fn authorize(&self, user: &UserInfo, attrs: &Attributes, path: &str) -> Result<Decision, ReviewFailed> {
        if self.mode == AuthorizationMode::AlwaysAllow {
            return Ok(Decision::Allow);
        }
        let Some(client) = &self.client else { return Ok(Decision::Deny) };
        for sub in &attrs.subresources {
            let key = (user.clone(), attrs.verb, *sub);
            let allowed = match self.cache.get(&key, Instant::now()) {
                Some(allowed) => allowed,
                None => {
                    let allowed = self.review(client, user, attrs.verb, sub, path).await?;
                    self.cache.insert(key, allowed, cache_ttl(allowed, &self.settings), Instant::now());
                    allowed
                }
            };
            if allowed {
                return Ok(Decision::Allow);
            }
        }
        Ok(Decision::Deny)
    }

    async fn review(
        &self,
        client: &kube::Client,
        user: &UserInfo,
        verb: &str,
        sub: &str,
        path: &str,
    ) -> Result<bool, ReviewFailed> {
        let review = SubjectAccessReview { spec: sar_spec(user, verb, sub, &self.node), ..Default::default() };
        let api: Api<SubjectAccessReview> = Api::all(client.clone());
        let answer = api.create(&PostParams::default(), &review).await.map_err(ReviewFailed)?;
        let status = answer.status.unwrap_or_default();
        tracing::debug!(user = %user.username, verb, subresource = sub, path, allowed = status.allowed, reason = ?status.reason, "SubjectAccessReview");
        Ok(status.allowed && status.denied != Some(true))
    }
}

/// A SubjectAccessReview the API server did not answer (the request gets 500).
#[derive(Debug, thiserror::Error)]
#[error("SubjectAccessReview failed: {0}")]
pub struct ReviewFailed(#[source] kube::Error);

/// The SubjectAccessReview for one subresource.
pub fn sar_spec(user: &UserInfo, verb: &str, sub: &str, node: &str) -> SubjectAccessReviewSpec {
    SubjectAccessReviewSpec {
        user: Some(user.username.clone()),
        uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
        groups: Some(user.groups.clone()),
        extra: (!user.extra.is_empty()).then(|| user.extra.clone().into_iter().collect()),
        resource_attributes: Some(ResourceAttributes {
            verb: Some(verb.to_string()),
            version: Some("v1".into()),
            resource: Some("nodes".into()),
            subresource: Some(sub.to_string()),
            name: Some(node.to_string()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_follow_the_http_method() {
        let cases = [
            (Method::GET, "get"),
            (Method::POST, "create"),
            (Method::PUT, "update"),
            (Method::PATCH, "patch"),
            (Method::DELETE, "delete"),
            (Method::HEAD, ""),
        ];
        for (m, v) in cases {
            assert_eq!(verb(&m), v, "{m}");
        }
    }

    #[test]
    fn subresources_follow_the_path() {
        assert_eq!(subresources("/stats/summary"), vec!["stats"]);
        assert_eq!(subresources("/stats"), vec!["stats"]);
        assert_eq!(subresources("/metrics/resource"), vec!["metrics"]);
        assert_eq!(subresources("/metrics"), vec!["metrics"]);
        assert_eq!(subresources("/logs/syslog"), vec!["log"]);
        assert_eq!(subresources("/checkpoint/ns/p/c"), vec!["checkpoint"]);
        assert_eq!(subresources("/pods"), vec!["pods", "proxy"]);
        assert_eq!(subresources("/healthz"), vec!["healthz", "proxy"]);
        for p in [
            "/exec/ns/p/c",
            "/attach/ns/p/c",
            "/portForward/ns/p",
            "/run/ns/p/c",
            "/containerLogs/ns/p/c",
            "/statsx",
            "/",
        ] {
            assert_eq!(subresources(p), vec!["proxy"], "{p}");
        }
    }

    #[test]
    fn forbidden_message_is_upstreams() {
        let attrs = attributes(&Method::POST, "/exec/default/p/c");
        assert_eq!(
            forbidden_message("bob", &attrs),
            "Forbidden (user=bob, verb=create, resource=nodes, subresource(s)=[proxy])"
        );
        let attrs = attributes(&Method::GET, "/pods");
        assert_eq!(
            forbidden_message("bob", &attrs),
            "Forbidden (user=bob, verb=get, resource=nodes, subresource(s)=[pods proxy])"
        );
    }

    #[test]
    fn allowed_answers_are_kept_longer_than_denials() {
        let s = ServerSettings::default();
        assert_eq!(cache_ttl(true, &s), Duration::from_secs(300));
        assert_eq!(cache_ttl(false, &s), Duration::from_secs(30));
    }

    #[test]
    fn review_names_the_node_and_subresource() {
        let user = UserInfo { username: "u".into(), groups: vec!["g".into()], ..Default::default() };
        let spec = sar_spec(&user, "get", "stats", "n1");
        let r = spec.resource_attributes.unwrap();
        assert_eq!(
            (r.verb.as_deref(), r.resource.as_deref(), r.subresource.as_deref(), r.name.as_deref()),
            (Some("get"), Some("nodes"), Some("stats"), Some("n1"))
        );
        assert_eq!(spec.user.as_deref(), Some("u"));
    }

    #[tokio::test]
    async fn always_allow_and_webhook_without_api() {
        let user = UserInfo::anonymous();
        let attrs = attributes(&Method::GET, "/pods");
        let open = ServerSettings { authorization_mode: AuthorizationMode::AlwaysAllow, ..Default::default() };
        assert_eq!(Authorizer::new(&open, "n", None).authorize(&user, &attrs, "/pods").await.unwrap(), Decision::Allow);
        let webhook = ServerSettings::default();
        assert_eq!(
            Authorizer::new(&webhook, "n", None).authorize(&user, &attrs, "/pods").await.unwrap(),
            Decision::Deny
        );
    }
}
