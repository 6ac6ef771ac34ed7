//! Bootstrap token authentication, as kube-apiserver's `--enable-bootstrap-token-auth`: a
//! bearer token `<id>.<secret>` is valid while the Secret `bootstrap-token-<id>` in
//! kube-system, of type `bootstrap.kubernetes.io/token`, holds that id and secret, allows
//! `usage-bootstrap-authentication` and has not expired. The user is `system:bootstrap:<id>`
//! in `system:bootstrappers` plus the Secret's `auth-extra-groups`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;

use crate::UserInfo;
use crate::meta;
use crate::store::StoreInner;

pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
pub const SECRET_PREFIX: &str = "bootstrap-token-";
pub const BOOTSTRAPPERS: &str = "system:bootstrappers";

/// `(id, secret)` when `token` has the bootstrap token shape.
pub fn parse(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.split_once('.')?;
    let ok = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    (ok(id, 6) && ok(secret, 16)).then_some((id, secret))
}

fn data(secret: &Value, key: &str) -> String {
    secret
        .pointer(&format!("/data/{key}"))
        .and_then(Value::as_str)
        .and_then(|b| STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_default()
}

/// Why a bootstrap token does not authenticate (`secret` is the secret's name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BootstrapTokenError {
    #[error("no secret kube-system/{0}")]
    NoSecret(String),
    #[error("secret kube-system/{0} is not of type {SECRET_TYPE}")]
    WrongType(String),
    #[error("secret kube-system/{0} is being deleted")]
    Deleting(String),
    #[error("token {id} does not match secret kube-system/{secret}")]
    Mismatch { id: String, secret: String },
    #[error("token {id} has expired ({expiration})")]
    Expired { id: String, expiration: String },
    #[error("token {0} is not marked for authentication")]
    NotForAuthentication(String),
    #[error("token {id} has an invalid auth-extra-groups entry {group:?}")]
    BadExtraGroup { id: String, group: String },
}

/// The user of a bootstrap token, or why it is not valid. `now` is in Unix seconds.
pub fn authenticate(inner: &StoreInner, token: &str, now: i64) -> Option<Result<UserInfo, BootstrapTokenError>> {
    let (id, secret) = parse(token)?;
    let name = format!("{SECRET_PREFIX}{id}");
    let Some(obj) = inner.get("secrets", "kube-system", &name) else {
        return Some(Err(BootstrapTokenError::NoSecret(name)));
    };
    Some(check(&obj, id, secret, now))
}

fn check(obj: &Value, id: &str, secret: &str, now: i64) -> Result<UserInfo, BootstrapTokenError> {
    let name = meta::name(obj).to_string();
    if meta::str_at(obj, "/type") != SECRET_TYPE {
        return Err(BootstrapTokenError::WrongType(name));
    }
    if meta::is_deleting(obj) {
        return Err(BootstrapTokenError::Deleting(name));
    }
    if data(obj, "token-id") != id || data(obj, "token-secret") != secret {
        return Err(BootstrapTokenError::Mismatch { id: id.to_string(), secret: name });
    }
    let expiration = data(obj, "expiration");
    if !expiration.is_empty() && meta::parse_time(&expiration).is_none_or(|t| t <= now) {
        return Err(BootstrapTokenError::Expired { id: id.to_string(), expiration });
    }
    if data(obj, "usage-bootstrap-authentication") != "true" {
        return Err(BootstrapTokenError::NotForAuthentication(id.to_string()));
    }
    let mut groups = vec![BOOTSTRAPPERS.to_string()];
    for g in data(obj, "auth-extra-groups").split(',').map(str::trim).filter(|g| !g.is_empty()) {
        if !g.starts_with("system:bootstrappers:") {
            return Err(BootstrapTokenError::BadExtraGroup { id: id.to_string(), group: g.to_string() });
        }
        groups.push(g.to_string());
    }
    groups.push("system:authenticated".into());
    Ok(UserInfo { username: format!("system:bootstrap:{id}"), groups, ..Default::default() })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn secret(extra: &[(&str, &str)]) -> Value {
        let mut data = serde_json::Map::new();
        for (k, v) in
            [("token-id", "abcdef"), ("token-secret", "0123456789abcdef"), ("usage-bootstrap-authentication", "true")]
                .iter()
                .chain(extra)
        {
            data.insert(k.to_string(), json!(STANDARD.encode(v)));
        }
        json!({"metadata": {"name": "bootstrap-token-abcdef", "namespace": "kube-system"}, "type": SECRET_TYPE, "data": data})
    }

    #[test]
    fn token_shape() {
        assert_eq!(parse("abcdef.0123456789abcdef"), Some(("abcdef", "0123456789abcdef")));
        assert_eq!(parse("ABCDEF.0123456789abcdef"), None);
        assert_eq!(parse("abcdef.0123"), None);
        assert_eq!(parse("no-dot"), None);
    }

    #[test]
    fn valid_token_names_the_bootstrapper() {
        let s = secret(&[("auth-extra-groups", "system:bootstrappers:kubeadm:default-node-token")]);
        let user = check(&s, "abcdef", "0123456789abcdef", 0).unwrap();
        assert_eq!(user.username, "system:bootstrap:abcdef");
        assert_eq!(
            user.groups,
            ["system:bootstrappers", "system:bootstrappers:kubeadm:default-node-token", "system:authenticated"]
        );
    }

    #[test]
    fn wrong_secret_expiry_usage_and_type_are_rejected() {
        assert!(
            check(&secret(&[]), "abcdef", "ffffffffffffffff", 0).unwrap_err().to_string().contains("does not match")
        );
        let expired = secret(&[("expiration", "2020-01-01T00:00:00Z")]);
        assert!(
            check(&expired, "abcdef", "0123456789abcdef", 1_700_000_000).unwrap_err().to_string().contains("expired")
        );
        assert!(check(&expired, "abcdef", "0123456789abcdef", 1_500_000_000).is_ok());
        let mut unusable = secret(&[]);
        unusable["data"].as_object_mut().unwrap().remove("usage-bootstrap-authentication");
        assert!(check(&unusable, "abcdef", "0123456789abcdef", 0).unwrap_err().to_string().contains("authentication"));
        let mut opaque = secret(&[]);
        opaque["type"] = json!("Opaque");
        assert!(check(&opaque, "abcdef", "0123456789abcdef", 0).is_err());
        let bad_group = secret(&[("auth-extra-groups", "system:masters")]);
        assert!(check(&bad_group, "abcdef", "0123456789abcdef", 0).is_err());
    }
}
