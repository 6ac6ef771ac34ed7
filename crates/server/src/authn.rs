//! Who is asking: a verified client certificate (CN = user, O = groups), else a bearer
//! token checked with the API server's TokenReview (answers cached for `cacheTTL`), else
//! `system:anonymous` when anonymous requests are enabled. As upstream, a token that is
//! presented and rejected is a 401 even when anonymous requests are allowed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use rustls::pki_types::CertificateDer;
use sha2::{Digest, Sha256};

use super::cache::TtlCache;
use gantry_config::ServerSettings;

pub const ANONYMOUS_USER: &str = "system:anonymous";
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct UserInfo {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    pub fn anonymous() -> Self {
        UserInfo { username: ANONYMOUS_USER.into(), groups: vec![UNAUTHENTICATED_GROUP.into()], ..Default::default() }
    }

    /// Upstream adds `system:authenticated` to every authenticated (non-anonymous) user.
    fn with_authenticated_group(mut self) -> Self {
        if !self.groups.iter().any(|g| g == AUTHENTICATED_GROUP || g == UNAUTHENTICATED_GROUP) {
            self.groups.push(AUTHENTICATED_GROUP.into());
        }
        self
    }
}

/// What a request carries, in the order upstream's authenticators look at it.
#[derive(Debug, PartialEq, Eq)]
pub enum Credentials<'a> {
    Certificate(&'a CertificateDer<'static>),
    Token(&'a str),
    None,
}

/// Picks the credentials: a verified client certificate wins over an `Authorization: Bearer`
/// header (upstream's union authenticator tries x509 first).
pub fn credentials<'a>(cert: Option<&'a CertificateDer<'static>>, authorization: Option<&'a str>) -> Credentials<'a> {
    if let Some(c) = cert {
        return Credentials::Certificate(c);
    }
    match authorization.and_then(bearer_token) {
        Some(t) => Credentials::Token(t),
        None => Credentials::None,
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive).
pub fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Why a verified client certificate names no user.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CertificateError {
    #[error("bad client certificate: {0}")]
    Unparsable(#[source] x509_parser::nom::Err<x509_parser::error::X509Error>),
    #[error("the client certificate has no common name")]
    NoCommonName,
}

/// Why a TokenReview answer authenticates no one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("the TokenReview has no status")]
    NoStatus,
    /// The API server's reason, when it gave one.
    #[error("{}", .0.as_deref().unwrap_or("not authenticated"))]
    NotAuthenticated(Option<String>),
    #[error("the TokenReview has no user")]
    NoUser,
}

/// The user a (verified) client certificate names: CN is the user, each O a group.
pub fn user_from_certificate(der: &[u8]) -> Result<UserInfo, CertificateError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(CertificateError::Unparsable)?;
    let subject = cert.subject();
    let cn = subject.iter_common_name().next().and_then(|c| c.as_str().ok()).unwrap_or_default();
    if cn.is_empty() {
        return Err(CertificateError::NoCommonName);
    }
    let groups = subject.iter_organization().filter_map(|o| o.as_str().ok().map(String::from)).collect();
    Ok(UserInfo { username: cn.to_string(), groups, ..Default::default() })
}

/// Why a request is not authenticated (logged; the client only sees 401 Unauthorized).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unauthenticated {
    #[error("no credentials and anonymous requests are disabled")]
    NoCredentials,
    #[error("bearer token presented but token authentication (authentication.webhook) is disabled")]
    TokenAuthDisabled,
    #[error("token rejected: {0}")]
    TokenRejected(Rejected),
    #[error(transparent)]
    Certificate(CertificateError),
    #[error("TokenReview failed: {0}")]
    ReviewFailed(String),
}

pub struct Authenticator {
    anonymous: bool,
    webhook: Option<TokenWebhook>,
}

struct TokenWebhook {
    client: kube::Client,
    ttl: Duration,
    /// SHA-256 of the token → the review's answer (both outcomes, as upstream's cache).
    cache: TtlCache<[u8; 32], Result<UserInfo, Rejected>>,
}

impl Authenticator {
    pub fn new(s: &ServerSettings, client: Option<kube::Client>) -> Self {
        let webhook = match (s.webhook_authentication, client) {
            (true, Some(client)) => Some(TokenWebhook { client, ttl: s.webhook_cache_ttl, cache: TtlCache::default() }),
            (true, None) => {
                tracing::warn!(
                    "authentication.webhook is enabled but there is no API server (standalone mode): bearer tokens are refused"
                );
                None
            }
            (false, _) => None,
        };
        Authenticator { anonymous: s.anonymous, webhook }
    }

    pub async fn authenticate(&self, creds: Credentials<'_>) -> Result<UserInfo, Unauthenticated> {
        match creds {
            Credentials::Certificate(der) => {
                user_from_certificate(der).map(UserInfo::with_authenticated_group).map_err(Unauthenticated::Certificate)
            }
            Credentials::Token(token) => match &self.webhook {
                Some(w) => w.review(token).await.map(UserInfo::with_authenticated_group),
                None if self.anonymous => Ok(UserInfo::anonymous()),
                None => Err(Unauthenticated::TokenAuthDisabled),
            },
            Credentials::None if self.anonymous => Ok(UserInfo::anonymous()),
            Credentials::None => Err(Unauthenticated::NoCredentials),
        }
    }
}

impl TokenWebhook {
    async fn review(&self, token: &str) -> Result<UserInfo, Unauthenticated> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(answer) = self.cache.get(&key, Instant::now()) {
            return answer.map_err(Unauthenticated::TokenRejected);
        }
        let review = TokenReview {
            spec: TokenReviewSpec { token: Some(token.to_string()), audiences: None },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        // Errors reaching the API server are not cached: the next request asks again.
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| Unauthenticated::ReviewFailed(e.to_string()))?;
        let answer = review_answer(&answer);
        self.cache.insert(key, answer.clone(), self.ttl, Instant::now());
        answer.map_err(Unauthenticated::TokenRejected)
    }
}

/// The user a TokenReview answer authenticates, or why not.
pub fn review_answer(review: &TokenReview) -> Result<UserInfo, Rejected> {
    let status = review.status.as_ref().ok_or(Rejected::NoStatus)?;
    if status.authenticated != Some(true) {
        return Err(Rejected::NotAuthenticated(status.error.clone().filter(|e| !e.is_empty())));
    }
    let user = status.user.as_ref().ok_or(Rejected::NoUser)?;
    Ok(UserInfo {
        username: user.username.clone().unwrap_or_default(),
        uid: user.uid.clone().unwrap_or_default(),
        groups: user.groups.clone().unwrap_or_default(),
        extra: user.extra.clone().unwrap_or_default().into_iter().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::{TokenReviewStatus, UserInfo as ApiUser};

    fn cert(cn: &str, orgs: &[&str]) -> CertificateDer<'static> {
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        for o in orgs {
            params.distinguished_name.push(rcgen::DnType::OrganizationName, *o);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn certificate_names_the_user_and_groups() {
        let der = cert("system:node:n1", &["system:nodes"]);
        let user = user_from_certificate(&der).unwrap();
        assert_eq!(user.username, "system:node:n1");
        assert_eq!(user.groups, vec!["system:nodes"]);
        assert_eq!(user.with_authenticated_group().groups, vec!["system:nodes", "system:authenticated"]);
    }

    #[test]
    fn certificate_wins_over_a_bearer_token() {
        let der = cert("a", &[]);
        assert_eq!(credentials(Some(&der), Some("Bearer t")), Credentials::Certificate(&der));
        assert_eq!(credentials(None, Some("Bearer t")), Credentials::Token("t"));
        assert_eq!(credentials(None, Some("bearer  t2 ")), Credentials::Token("t2"));
        assert_eq!(credentials(None, Some("Basic abc")), Credentials::None);
        assert_eq!(credentials(None, Some("Bearer ")), Credentials::None);
        assert_eq!(credentials(None, None), Credentials::None);
    }

    #[tokio::test]
    async fn anonymous_only_when_enabled() {
        let closed = ServerSettings { anonymous: false, webhook_authentication: false, ..Default::default() };
        let a = Authenticator::new(&closed, None);
        assert_eq!(a.authenticate(Credentials::None).await, Err(Unauthenticated::NoCredentials));
        assert_eq!(a.authenticate(Credentials::Token("x")).await, Err(Unauthenticated::TokenAuthDisabled));
        let open = ServerSettings { anonymous: true, ..closed };
        let user = Authenticator::new(&open, None).authenticate(Credentials::None).await.unwrap();
        assert_eq!(
            (user.username.as_str(), user.groups.as_slice()),
            (ANONYMOUS_USER, &[UNAUTHENTICATED_GROUP.to_string()][..])
        );
    }

    #[test]
    fn token_review_answers() {
        let review = |authenticated, error: Option<&str>| TokenReview {
            status: Some(TokenReviewStatus {
                authenticated: Some(authenticated),
                error: error.map(String::from),
                user: Some(ApiUser {
                    username: Some("alice".into()),
                    groups: Some(vec!["dev".into()]),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let user = review_answer(&review(true, None)).unwrap();
        assert_eq!((user.username.as_str(), user.groups.len()), ("alice", 1));
        assert_eq!(review_answer(&review(false, Some("token expired"))).unwrap_err().to_string(), "token expired");
        assert_eq!(review_answer(&review(false, None)).unwrap_err().to_string(), "not authenticated");
    }
}
