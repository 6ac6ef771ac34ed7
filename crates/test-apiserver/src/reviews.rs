//! Objects answered on the spot: TokenReview, SubjectAccessReview (plus the self and local
//! variants) and the serviceaccounts/token subresource (TokenRequest).

use serde_json::{Value, json};

use crate::auth::{self, Admission, Operation};
use crate::meta;
use crate::resources::ResourceType;
use crate::selectors::FieldSelector;
use crate::state::State;
use crate::status::{ApiError, ApiResult, FieldError, GroupResource};
use crate::store::StoreInner;
use crate::tokens::{API_AUDIENCE, Tokens};
use crate::{AccessRequest, Decision, UserInfo};

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

fn user_json(user: &UserInfo) -> Value {
    let mut u = json!({"username": user.username, "groups": user.groups});
    if !user.uid.is_empty() {
        u["uid"] = json!(user.uid);
    }
    if !user.extra.is_empty() {
        u["extra"] = json!(user.extra);
    }
    u
}

fn with_status(body: &Value, api_version: &str, kind: &str, status: Value) -> Value {
    let mut out = json!({"kind": kind, "apiVersion": api_version, "metadata": {"creationTimestamp": null}});
    out["spec"] = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    out["status"] = status;
    out
}

/// TokenReview: authenticates `spec.token` for `spec.audiences` with the same
/// authenticators API requests use (including the test's token review hook).
pub fn token_review(state: &State, body: &Value) -> ApiResult<Value> {
    let token = meta::str_at(body, "/spec/token");
    let audiences = strings(body.pointer("/spec/audiences"));
    let status = match auth::authenticate_token(state, token, &audiences) {
        Ok((user, audiences)) => json!({"authenticated": true, "user": user_json(&user), "audiences": audiences}),
        Err(e) => json!({"authenticated": false, "user": {}, "error": e.to_string()}),
    };
    Ok(with_status(body, "authentication.k8s.io/v1", "TokenReview", status))
}

/// SubjectAccessReview and its variants: the authorizer chain's answer for the described
/// request. `requester` is set for SelfSubjectAccessReview; `namespace` for local reviews.
pub fn access_review(
    state: &State,
    rt: &ResourceType,
    body: &Value,
    requester: Option<&UserInfo>,
    namespace: &str,
) -> ApiResult<Value> {
    let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    let invalid = |e: FieldError| ApiError::invalid(&rt.kind, &rt.group, "", vec![e]);
    let user = match requester {
        Some(u) => u.clone(),
        None => {
            let user = UserInfo {
                username: meta::str_at(&spec, "/user").to_string(),
                uid: meta::str_at(&spec, "/uid").to_string(),
                groups: strings(spec.get("groups")),
                extra: spec
                    .get("extra")
                    .and_then(Value::as_object)
                    .map(|m| m.iter().map(|(k, v)| (k.clone(), strings(Some(v)))).collect())
                    .unwrap_or_default(),
            };
            if user.username.is_empty() && user.groups.is_empty() {
                return Err(invalid(FieldError::invalid(
                    "spec.user",
                    &json!(""),
                    "at least one of user or group must be specified",
                )));
            }
            user
        }
    };
    let (resource, non_resource) = (spec.get("resourceAttributes"), spec.get("nonResourceAttributes"));
    let s = |v: Option<&Value>, f: &str| v.and_then(|v| v.get(f)).and_then(Value::as_str).unwrap_or("").to_string();
    let req = match (resource, non_resource) {
        (Some(r), None) => {
            let ns = s(Some(r), "namespace");
            if !namespace.is_empty() && ns != namespace {
                return Err(invalid(FieldError::invalid(
                    "spec.resourceAttributes.namespace",
                    &json!(ns),
                    "must match metadata.namespace",
                )));
            }
            AccessRequest {
                user,
                verb: s(Some(r), "verb"),
                namespace: ns,
                api_group: s(Some(r), "group"),
                api_version: s(Some(r), "version"),
                resource: s(Some(r), "resource"),
                subresource: s(Some(r), "subresource"),
                name: s(Some(r), "name"),
                path: None,
            }
        }
        (None, Some(n)) => {
            AccessRequest { user, verb: s(Some(n), "verb"), path: Some(s(Some(n), "path")), ..Default::default() }
        }
        _ => {
            return Err(invalid(FieldError::invalid(
                "spec.resourceAttributes",
                &Value::Null,
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )));
        }
    };
    let fields = resource
        .and_then(|r| r.pointer("/fieldSelector/rawSelector"))
        .and_then(Value::as_str)
        .and_then(|raw| FieldSelector::parse(raw).ok());
    let status = match auth::authorize(state, &req, fields.as_ref()) {
        Decision::Allow => json!({"allowed": true}),
        Decision::Deny(reason) => json!({"allowed": false, "denied": true, "reason": reason}),
        Decision::NoOpinion(reason) if reason.is_empty() => json!({"allowed": false}),
        Decision::NoOpinion(reason) => json!({"allowed": false, "reason": reason}),
    };
    let mut out = with_status(body, &rt.api_version(), &rt.kind, status);
    if !namespace.is_empty() {
        out["metadata"]["namespace"] = json!(namespace);
    }
    Ok(out)
}

const MIN_EXPIRATION_SECONDS: i64 = 600;
const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;

/// POST serviceaccounts/<name>/token: a signed token for the account, optionally bound to
/// a pod, secret or node that must exist (with a matching uid).
pub fn token_request(
    inner: &StoreInner,
    tokens: &Tokens,
    user: &UserInfo,
    sa_rt: &ResourceType,
    ns: &str,
    sa_name: &str,
    body: &Value,
) -> ApiResult<Value> {
    if let Some(kind) = body.get("kind").and_then(Value::as_str)
        && kind != "TokenRequest"
    {
        return Err(ApiError::bad_request(format!("not a TokenRequest object: {kind}")));
    }
    let invalid = |e: FieldError| ApiError::invalid("TokenRequest", "authentication.k8s.io", sa_name, vec![e]);
    let expiration = body.pointer("/spec/expirationSeconds").and_then(Value::as_i64).unwrap_or(3600);
    if expiration < MIN_EXPIRATION_SECONDS {
        return Err(invalid(FieldError::invalid(
            "spec.expirationSeconds",
            &json!(expiration),
            "may not specify a duration less than 10 minutes",
        )));
    }
    if expiration > MAX_EXPIRATION_SECONDS {
        return Err(invalid(FieldError::invalid(
            "spec.expirationSeconds",
            &json!(expiration),
            "may not specify a duration larger than 2^32 seconds",
        )));
    }
    let mut audiences = strings(body.pointer("/spec/audiences"));
    if audiences.is_empty() {
        audiences.push(API_AUDIENCE.to_string());
    }
    let sa = inner
        .get("serviceaccounts", ns, sa_name)
        .ok_or_else(|| ApiError::not_found(&GroupResource::new("", "serviceaccounts"), sa_name))?;
    auth::admit(
        inner,
        &Admission {
            user,
            rt: sa_rt,
            subresource: "token",
            op: Operation::Create,
            namespace: ns,
            name: sa_name,
            old: Some(&sa),
            new: Some(body),
        },
    )?;
    let now = jiff::Timestamp::now().as_second();
    let mut k8s = json!({"namespace": ns, "serviceaccount": {"name": sa_name, "uid": meta::uid(&sa)}});
    let bound = body.pointer("/spec/boundObjectRef").cloned().filter(|v| v.is_object());
    if let Some(r) = &bound {
        bind_object(inner, ns, r, &mut k8s)?;
    }
    let claims = json!({
        "aud": audiences,
        "exp": now + expiration,
        "iat": now,
        "nbf": now,
        "iss": API_AUDIENCE,
        "jti": meta::new_uid(),
        "sub": format!("system:serviceaccount:{ns}:{sa_name}"),
        "kubernetes.io": k8s,
    });
    let mut spec = json!({"audiences": audiences, "expirationSeconds": expiration});
    if let Some(r) = bound {
        spec["boundObjectRef"] = r;
    }
    Ok(json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": sa_name, "namespace": ns, "creationTimestamp": meta::format_time(now)},
        "spec": spec,
        "status": {"token": tokens.sign_jwt(&claims), "expirationTimestamp": meta::format_time(now + expiration)},
    }))
}

fn bind_object(inner: &StoreInner, ns: &str, r: &Value, k8s: &mut Value) -> ApiResult<()> {
    let (kind, name, uid) = (meta::str_at(r, "/kind"), meta::str_at(r, "/name"), meta::str_at(r, "/uid"));
    let (storage, plural, obj_ns, claim) = match kind {
        "Pod" => ("pods", "pods", ns, "pod"),
        "Secret" => ("secrets", "secrets", ns, "secret"),
        "Node" => ("nodes", "nodes", "", "node"),
        other => return Err(ApiError::bad_request(format!("cannot bind token for object of kind {other:?}"))),
    };
    let gr = GroupResource::new("", plural);
    let obj = inner.get(storage, obj_ns, name).ok_or_else(|| ApiError::not_found(&gr, name))?;
    if !uid.is_empty() && uid != meta::uid(&obj) {
        return Err(ApiError::conflict(
            &gr,
            name,
            &format!(
                "the UID in the bound object reference ({uid}) does not match the UID in record. The object might have been deleted and then recreated"
            ),
        ));
    }
    k8s[claim] = json!({"name": name, "uid": meta::uid(&obj)});
    if kind == "Pod" {
        let node = meta::str_at(&obj, "/spec/nodeName");
        if let Some(n) = inner.get("nodes", "", node) {
            k8s["node"] = json!({"name": node, "uid": meta::uid(&n)});
        }
    }
    Ok(())
}
