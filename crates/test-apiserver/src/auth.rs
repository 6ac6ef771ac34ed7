//! Authentication (bearer tokens, client certificates), authorization (system:masters, the
//! Node authorizer, then the test's hook) and the NodeRestriction admission checks.
//!
//! The Node authorizer follows upstream's rules (v1.34, AuthorizeNodeWithSelectors on): a
//! node reads its own Node, lists/watches pods only with `spec.nodeName=<itself>`, reads
//! pods, secrets, configmaps, PVCs, PVs and service account tokens only when a pod bound to
//! it references them, and manages its own Lease in kube-node-lease. NodeRestriction then
//! limits writes to the node's own objects.

use serde_json::Value;

use crate::bootstrap_tokens;
use crate::pods;
use crate::resources::ResourceType;
use crate::selectors::FieldSelector;
use crate::state::State;
use crate::status::{ApiError, GroupResource};
use crate::store::StoreInner;
use crate::tokens::API_AUDIENCE;
use crate::{AccessRequest, Decision, UserInfo};

pub const ADMIN_USER: &str = "kubernetes-admin";
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

pub fn admin_user() -> UserInfo {
    UserInfo {
        username: ADMIN_USER.into(),
        groups: vec!["system:masters".into(), "system:authenticated".into()],
        ..Default::default()
    }
}

pub fn node_user(node: &str) -> UserInfo {
    UserInfo {
        username: format!("system:node:{node}"),
        groups: vec!["system:nodes".into(), "system:authenticated".into()],
        ..Default::default()
    }
}

fn anonymous() -> UserInfo {
    UserInfo {
        username: "system:anonymous".into(),
        groups: vec!["system:unauthenticated".into()],
        ..Default::default()
    }
}

/// The node a user acts as, if it is a node identity (`system:node:<name>` in `system:nodes`).
pub fn node_name(user: &UserInfo) -> Option<&str> {
    let name = user.username.strip_prefix("system:node:")?;
    user.groups.iter().any(|g| g == "system:nodes").then_some(name)
}

/// Who sent a request: client certificate first (as kube-apiserver's union authenticator
/// does), then bearer token, else anonymous.
pub fn authenticate(
    state: &State,
    bearer: Option<&str>,
    cert: Option<&(String, Vec<String>)>,
) -> Result<UserInfo, ApiError> {
    if let Some((cn, groups)) = cert {
        let mut groups = groups.clone();
        groups.push("system:authenticated".into());
        return Ok(UserInfo { username: cn.clone(), groups, ..Default::default() });
    }
    match bearer {
        Some(token) => {
            authenticate_token(state, token, &[]).map(|(user, _)| user).map_err(|_| ApiError::unauthorized())
        }
        None => Ok(anonymous()),
    }
}

/// Authenticates a bearer token for the given audiences (empty: the API server's own).
/// Returns the user and the audiences the token is valid for.
/// Why a bearer token authenticates no one (a TokenReview's `status.error`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("invalid bearer token")]
    Invalid,
    #[error(transparent)]
    Bootstrap(#[from] bootstrap_tokens::BootstrapTokenError),
    #[error("service account token has expired")]
    Expired,
    #[error("service account token is not valid yet")]
    NotYetValid,
    #[error("token audiences don't match")]
    Audience,
    #[error("service account {namespace}/{name} has been deleted")]
    ServiceAccountDeleted { namespace: String, name: String },
    #[error("pod {namespace}/{name} has been deleted")]
    PodDeleted { namespace: String, name: String },
}

pub fn authenticate_token(
    state: &State,
    token: &str,
    audiences: &[String],
) -> Result<(UserInfo, Vec<String>), TokenError> {
    let wanted: Vec<String> = if audiences.is_empty() { vec![API_AUDIENCE.to_string()] } else { audiences.to_vec() };
    if token == state.tokens.admin_token {
        return Ok((admin_user(), wanted));
    }
    if let Some(node) = state.tokens.node_of_token(token) {
        return Ok((node_user(&node), wanted));
    }
    if let Some(user) = state.tokens.registered(token) {
        return Ok((user, wanted));
    }
    if bootstrap_tokens::parse(token).is_some() {
        let inner = state.store.lock();
        if let Some(result) = bootstrap_tokens::authenticate(&inner, token, jiff::Timestamp::now().as_second()) {
            return result.map(|user| (user, wanted)).map_err(TokenError::from);
        }
    }
    if let Some(claims) = state.tokens.verify_jwt(token) {
        return service_account_user(state, &claims, &wanted);
    }
    if let Some(hook) = state.hooks().token_review
        && let Some(user) = hook(token, &wanted)
    {
        return Ok((user, wanted));
    }
    Err(TokenError::Invalid)
}

/// Validates a service account JWT's time window, audience and bound objects, as the
/// service account token authenticator does.
fn service_account_user(
    state: &State,
    claims: &Value,
    wanted: &[String],
) -> Result<(UserInfo, Vec<String>), TokenError> {
    let now = jiff::Timestamp::now().as_second();
    let exp = claims.get("exp").and_then(Value::as_i64).unwrap_or(0);
    if now >= exp {
        return Err(TokenError::Expired);
    }
    if claims.get("nbf").and_then(Value::as_i64).is_some_and(|nbf| now < nbf) {
        return Err(TokenError::NotYetValid);
    }
    let token_aud: Vec<String> = claims
        .get("aud")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
        .unwrap_or_default();
    let audiences: Vec<String> = wanted.iter().filter(|a| token_aud.contains(a)).cloned().collect();
    if audiences.is_empty() {
        return Err(TokenError::Audience);
    }
    let k8s = claims.get("kubernetes.io").cloned().unwrap_or(Value::Null);
    let s = |p: &str| k8s.pointer(p).and_then(Value::as_str).unwrap_or("").to_string();
    let (ns, sa_name, sa_uid) = (s("/namespace"), s("/serviceaccount/name"), s("/serviceaccount/uid"));
    let inner = state.store.lock();
    let uid_of = |o: &Value| o.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("").to_string();
    match inner.get("serviceaccounts", &ns, &sa_name) {
        Some(sa) if uid_of(&sa) == sa_uid => {}
        _ => return Err(TokenError::ServiceAccountDeleted { namespace: ns, name: sa_name }),
    }
    let mut extra = std::collections::BTreeMap::new();
    if let Some(pod_name) = k8s.pointer("/pod/name").and_then(Value::as_str) {
        match inner.get("pods", &ns, pod_name) {
            Some(pod) if uid_of(&pod) == s("/pod/uid") => {}
            _ => return Err(TokenError::PodDeleted { namespace: ns, name: pod_name.to_string() }),
        }
        extra.insert("authentication.kubernetes.io/pod-name".to_string(), vec![pod_name.to_string()]);
        extra.insert("authentication.kubernetes.io/pod-uid".to_string(), vec![s("/pod/uid")]);
    }
    if let Some(node) = k8s.pointer("/node/name").and_then(Value::as_str) {
        extra.insert("authentication.kubernetes.io/node-name".to_string(), vec![node.to_string()]);
        extra.insert("authentication.kubernetes.io/node-uid".to_string(), vec![s("/node/uid")]);
    }
    if let Some(jti) = claims.get("jti").and_then(Value::as_str) {
        extra.insert("authentication.kubernetes.io/credential-id".to_string(), vec![format!("JTI={jti}")]);
    }
    let user = UserInfo {
        username: format!("system:serviceaccount:{ns}:{sa_name}"),
        uid: sa_uid,
        groups: vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{ns}"),
            "system:authenticated".into(),
        ],
        extra,
    };
    Ok((user, audiences))
}

const PUBLIC_PATHS: &[&str] = &["/healthz", "/livez", "/readyz", "/version", "/version/"];

fn is_discovery_path(path: &str) -> bool {
    ["/api", "/apis", "/openapi"].iter().any(|p| path == *p || path.starts_with(&format!("{p}/")))
}

/// Decides a request through the chain system:masters → public/discovery paths → Node
/// authorizer → the test's hook. No opinion from anyone is a denial.
pub fn authorize(state: &State, req: &AccessRequest, fields: Option<&FieldSelector>) -> Decision {
    let user = &req.user;
    if user.groups.iter().any(|g| g == "system:masters") {
        return Decision::Allow;
    }
    let authenticated = user.groups.iter().any(|g| g == "system:authenticated");
    if let Some(path) = req.path.as_deref() {
        if req.verb == "get" && (PUBLIC_PATHS.contains(&path) || (authenticated && is_discovery_path(path))) {
            return Decision::Allow;
        }
    } else if authenticated
        && req.verb == "create"
        && req.api_group == "authorization.k8s.io"
        && req.resource == "selfsubjectaccessreviews"
    {
        // system:basic-user, bound to every authenticated user.
        return Decision::Allow;
    }
    let mut reason = String::new();
    if let Some(node) = node_name(user) {
        let inner = state.store.lock();
        match node_authorize(&inner, node, req, fields) {
            Decision::Allow => return Decision::Allow,
            Decision::Deny(r) | Decision::NoOpinion(r) => reason = r,
        }
    }
    if kubeadm_bindings_allow(req) {
        return Decision::Allow;
    }
    if let Some(hook) = state.hooks().authorizer {
        match hook(req) {
            Decision::Allow => return Decision::Allow,
            Decision::Deny(r) => return Decision::Deny(r),
            Decision::NoOpinion(r) if reason.is_empty() => reason = r,
            Decision::NoOpinion(_) => {}
        }
    }
    Decision::NoOpinion(reason)
}

/// The group `kubeadm token create` puts bootstrap tokens in.
pub const KUBEADM_NODE_TOKEN_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";

/// The ClusterRoleBindings `kubeadm init` creates for joining nodes: its bootstrap token
/// group may create and read CSRs (system:node-bootstrapper) and have node client CSRs
/// auto-approved (`certificatesigningrequests/nodeclient`); nodes may have their own renewals
/// auto-approved (`certificatesigningrequests/selfnodeclient`).
fn kubeadm_bindings_allow(req: &AccessRequest) -> bool {
    if req.path.is_some() || req.api_group != "certificates.k8s.io" || req.resource != "certificatesigningrequests" {
        return false;
    }
    let in_group = |g: &str| req.user.groups.iter().any(|x| x == g);
    match (req.subresource.as_str(), req.verb.as_str()) {
        ("", "create" | "get" | "list" | "watch") => in_group(KUBEADM_NODE_TOKEN_GROUP),
        ("nodeclient", "create") => in_group(KUBEADM_NODE_TOKEN_GROUP),
        ("selfnodeclient", "create") => in_group("system:nodes"),
        _ => false,
    }
}

/// Upstream's forbidden message for a denied request.
pub fn forbidden(req: &AccessRequest, reason: &str) -> ApiError {
    let user = &req.user.username;
    let msg = match &req.path {
        Some(path) => format!("User {user:?} cannot {} path {path:?}", req.verb),
        None => {
            let resource = if req.subresource.is_empty() {
                req.resource.clone()
            } else {
                format!("{}/{}", req.resource, req.subresource)
            };
            if req.namespace.is_empty() {
                format!(
                    "User {user:?} cannot {} resource {resource:?} in API group {:?} at the cluster scope",
                    req.verb, req.api_group
                )
            } else {
                format!(
                    "User {user:?} cannot {} resource {resource:?} in API group {:?} in the namespace {:?}",
                    req.verb, req.api_group, req.namespace
                )
            }
        }
    };
    let msg = if reason.is_empty() { msg } else { format!("{msg}: {reason}") };
    if req.path.is_some() {
        return ApiError::new(403, "Forbidden", format!("forbidden: {msg}")).with_details(serde_json::json!({}));
    }
    ApiError::forbidden(&GroupResource::new(&req.api_group, &req.resource), &req.name, &msg)
}

fn no(reason: impl Into<String>) -> Decision {
    Decision::NoOpinion(reason.into())
}

fn related(inner: &StoreInner, node: &str, kind: pods::RefKind, ns: &str, name: &str) -> Decision {
    if name.is_empty() {
        return no("No Object name found");
    }
    if pods::node_references(inner, node, kind, ns, name) {
        Decision::Allow
    } else {
        no(format!("no relationship found between node '{node}' and this object"))
    }
}

/// Static rules for resources the Node authorizer does not subdivide (bootstrap NodeRules).
fn node_rules_allow(req: &AccessRequest) -> bool {
    let read = matches!(req.verb.as_str(), "get" | "list" | "watch");
    let (g, r, s, v) = (req.api_group.as_str(), req.resource.as_str(), req.subresource.as_str(), req.verb.as_str());
    match (g, r, s) {
        ("authentication.k8s.io", "tokenreviews", "") => v == "create",
        ("authorization.k8s.io", "subjectaccessreviews" | "localsubjectaccessreviews", "") => v == "create",
        ("", "services", "") => read,
        ("", "events", "") | ("events.k8s.io", "events", "") => matches!(v, "create" | "update" | "patch"),
        ("", "endpoints", "") => v == "get",
        ("certificates.k8s.io", "certificatesigningrequests", "") => matches!(v, "create" | "get" | "list" | "watch"),
        ("storage.k8s.io", "csidrivers", "") | ("node.k8s.io", "runtimeclasses", "") => read,
        ("storage.k8s.io", "csinodes", "") => matches!(v, "get" | "create" | "update" | "patch" | "delete"),
        _ => false,
    }
}

fn node_authorize(inner: &StoreInner, node: &str, req: &AccessRequest, fields: Option<&FieldSelector>) -> Decision {
    use pods::RefKind;
    if req.path.is_some() {
        return no("");
    }
    let (verb, sub, ns, name) =
        (req.verb.as_str(), req.subresource.as_str(), req.namespace.as_str(), req.name.as_str());
    match (req.api_group.as_str(), req.resource.as_str()) {
        ("", kind @ ("secrets" | "configmaps")) => {
            if !matches!(verb, "get" | "list" | "watch") {
                return no("can only read resources of this type");
            }
            if !sub.is_empty() {
                return no("cannot read subresource");
            }
            if ns.is_empty() {
                return no("can only read namespaced object of this type");
            }
            let k = if kind == "secrets" { RefKind::Secret } else { RefKind::ConfigMap };
            related(inner, node, k, ns, name)
        }
        ("", "persistentvolumeclaims") => {
            if sub == "status" {
                if !matches!(verb, "update" | "patch") {
                    return no("can only get/update/patch this type");
                }
                return related(inner, node, RefKind::Pvc, ns, name);
            }
            node_get_only(inner, node, RefKind::Pvc, req)
        }
        ("", "persistentvolumes") => node_get_only(inner, node, RefKind::Pv, req),
        // node <- volumeattachment: only attachments to this node.
        ("storage.k8s.io", "volumeattachments") => {
            if verb != "get" || !sub.is_empty() {
                return no("can only get individual resources of this type");
            }
            let attachment = inner.get("storage.k8s.io/volumeattachments", "", name);
            if attachment.is_some_and(|va| va.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node)) {
                Decision::Allow
            } else {
                no(format!("no relationship found between node '{node}' and this object"))
            }
        }
        ("", "serviceaccounts") => {
            if verb != "create" || name.is_empty() {
                return no("can only create tokens for individual service accounts");
            }
            if sub != "token" {
                return no("can only create token subresource of serviceaccount");
            }
            related(inner, node, RefKind::ServiceAccount, ns, name)
        }
        ("coordination.k8s.io", "leases") => {
            if !matches!(verb, "get" | "create" | "update" | "patch" | "delete") {
                return no("can only get, create, update, patch, or delete a node lease");
            }
            if ns != NODE_LEASE_NAMESPACE {
                return no(format!("can only access leases in the {NODE_LEASE_NAMESPACE:?} system namespace"));
            }
            if verb != "create" && name != node {
                return no("can only access node lease with the same name as the requesting node");
            }
            Decision::Allow
        }
        ("", "nodes") => match (sub, verb) {
            ("", "create" | "update" | "patch") | ("status", "update" | "patch") => Decision::Allow,
            ("", "get" | "list" | "watch") if name == node => Decision::Allow,
            ("", "get" | "list" | "watch") if name.is_empty() => {
                no(format!("node '{node}' cannot read all nodes, only its own Node object"))
            }
            ("", "get" | "list" | "watch") => {
                no(format!("node '{node}' cannot read '{name}', only its own Node object"))
            }
            _ => no(""),
        },
        ("", "pods") => match (sub, verb) {
            ("", "get") => related(inner, node, RefKind::Pod, ns, name),
            ("", "list" | "watch") => {
                if fields.and_then(|f| f.equal_value("spec.nodeName")) == Some(node) {
                    Decision::Allow
                } else if !name.is_empty() {
                    related(inner, node, RefKind::Pod, ns, name)
                } else {
                    no("can only list/watch pods with spec.nodeName field selector")
                }
            }
            ("", "create" | "delete") | ("status", "update" | "patch") | ("eviction", "create") => Decision::Allow,
            _ => no(""),
        },
        _ if node_rules_allow(req) => Decision::Allow,
        _ => no(""),
    }
}

fn node_get_only(inner: &StoreInner, node: &str, kind: pods::RefKind, req: &AccessRequest) -> Decision {
    if req.verb != "get" {
        return no("can only get individual resources of this type");
    }
    if !req.subresource.is_empty() {
        return no("cannot get subresource");
    }
    related(inner, node, kind, &req.namespace, &req.name)
}

/// The operation an admission check sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

/// What NodeRestriction needs to know about a write.
pub struct Admission<'a> {
    pub user: &'a UserInfo,
    pub rt: &'a ResourceType,
    pub subresource: &'a str,
    pub op: Operation,
    pub namespace: &'a str,
    pub name: &'a str,
    pub old: Option<&'a Value>,
    pub new: Option<&'a Value>,
}

/// The NodeRestriction admission plugin: a node may only write objects that are its own.
pub fn admit(inner: &StoreInner, a: &Admission<'_>) -> Result<(), ApiError> {
    let Some(node) = node_name(a.user) else { return Ok(()) };
    let gr = a.rt.group_resource();
    let deny = |why: String| Err(ApiError::forbidden(&gr, a.name, &why));
    match (a.rt.group.as_str(), a.rt.plural.as_str()) {
        ("", "pods") => admit_pod(inner, node, a, &deny),
        ("", "nodes") => admit_node(node, a, &deny),
        ("", "serviceaccounts") if a.subresource == "token" => admit_token(inner, node, a, &deny),
        ("", "persistentvolumeclaims") if a.subresource != "status" => deny("may only update PVC status".into()),
        ("storage.k8s.io", "csinodes") if a.name != node => {
            deny("can only access CSINode with the same name as the requesting node".into())
        }
        ("coordination.k8s.io", "leases") => {
            if a.namespace != NODE_LEASE_NAMESPACE {
                return deny(format!("can only access leases in the {NODE_LEASE_NAMESPACE:?} system namespace"));
            }
            if a.name != node {
                return deny("can only access node lease with the same name as the requesting node".into());
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

type Deny<'a> = dyn Fn(String) -> Result<(), ApiError> + 'a;

fn spec_node(pod: Option<&Value>) -> &str {
    pod.and_then(|p| p.pointer("/spec/nodeName")).and_then(Value::as_str).unwrap_or("")
}

fn admit_pod(inner: &StoreInner, node: &str, a: &Admission<'_>, deny: &Deny<'_>) -> Result<(), ApiError> {
    match (a.subresource, a.op) {
        ("", Operation::Create) => admit_mirror_pod(inner, node, a.new.unwrap_or(&Value::Null), deny),
        ("", Operation::Delete) | ("eviction", Operation::Create) if spec_node(a.old) != node => {
            if a.subresource == "eviction" {
                deny(format!("node {node} can only evict pods with spec.nodeName set to itself"))
            } else {
                deny(format!("node {node:?} can only delete pods with spec.nodeName set to itself"))
            }
        }
        ("", Operation::Delete) | ("eviction", Operation::Create) => Ok(()),
        ("status", Operation::Update) => {
            if spec_node(a.old) != node {
                return deny(format!(
                    "node {node:?} can only update pod status for pods with spec.nodeName set to itself"
                ));
            }
            let labels = |o: Option<&Value>| o.and_then(|o| o.pointer("/metadata/labels")).cloned();
            if labels(a.old) != labels(a.new) {
                return deny(format!("node {node:?} cannot update labels through pod status"));
            }
            Ok(())
        }
        ("", op) => deny(format!("unexpected operation {op:?}, node {node:?} can only create and delete mirror pods")),
        (sub, _) => deny(format!("unexpected pod subresource {sub:?}, only 'status' and 'eviction' are allowed")),
    }
}

fn admit_mirror_pod(inner: &StoreInner, node: &str, pod: &Value, deny: &Deny<'_>) -> Result<(), ApiError> {
    if pod.pointer(&format!("/metadata/annotations/{}", pods::MIRROR_ANNOTATION.replace('/', "~1"))).is_none() {
        return deny(format!(
            "pod does not have {:?} annotation, node {node:?} can only create mirror pods",
            pods::MIRROR_ANNOTATION
        ));
    }
    if spec_node(Some(pod)) != node {
        return deny(format!("node {node:?} can only create pods with spec.nodeName set to itself"));
    }
    let owners = pod.pointer("/metadata/ownerReferences").and_then(Value::as_array).cloned().unwrap_or_default();
    let [owner] = owners.as_slice() else {
        return if owners.is_empty() {
            deny(format!("node {node:?} can only create pods with an owner reference set to itself"))
        } else {
            deny(format!("node {node:?} can only create pods with a single owner reference set to itself"))
        };
    };
    let s = |k: &str| owner.get(k).and_then(Value::as_str).unwrap_or("");
    if s("apiVersion") != "v1" || s("kind") != "Node" || s("name") != node {
        return deny(format!("node {node:?} can only create pods with an owner reference set to itself"));
    }
    if owner.get("controller").and_then(Value::as_bool) != Some(true) {
        return deny(format!("node {node:?} can only create pods with a controller owner reference set to itself"));
    }
    if owner.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true) {
        return deny(format!("node {node:?} must not set blockOwnerDeletion on an owner reference"));
    }
    let Some(node_obj) = inner.get("nodes", "", node) else {
        return Err(ApiError::not_found(&GroupResource::new("", "nodes"), node));
    };
    let node_uid = node_obj.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("");
    if s("uid") != node_uid {
        return deny(format!("node {node} UID mismatch: expected {} got {node_uid}", s("uid")));
    }
    if pod.pointer("/spec/serviceAccountName").and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
        return deny(format!("node {node:?} can not create pods that reference a service account"));
    }
    let refs = pods::references(pod);
    if !refs.secrets.is_empty() {
        return deny(format!("node {node:?} can not create pods that reference secrets"));
    }
    if !refs.configmaps.is_empty() {
        return deny(format!("node {node:?} can not create pods that reference configmaps"));
    }
    if !refs.pvcs.is_empty() {
        return deny(format!("node {node:?} can not create pods that reference persistentvolumeclaims"));
    }
    Ok(())
}

/// Labels a kubelet may set on its own Node (kubelet.kubernetes.io/ and node.kubernetes.io/
/// prefixes, and the well-known topology labels).
fn is_kubelet_label(key: &str) -> bool {
    const LABELS: &[&str] = &[
        "kubernetes.io/hostname",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
    ];
    let ns = key.split_once('/').map(|(n, _)| n).unwrap_or("");
    LABELS.contains(&key)
        || ns == "kubelet.kubernetes.io"
        || ns.ends_with(".kubelet.kubernetes.io")
        || ns == "node.kubernetes.io"
        || ns.ends_with(".node.kubernetes.io")
}

fn forbidden_labels(new: Option<&Value>, old: Option<&Value>) -> Vec<String> {
    let labels = |o: Option<&Value>| {
        o.and_then(|o| o.pointer("/metadata/labels")).and_then(Value::as_object).cloned().unwrap_or_default()
    };
    let (a, b) = (labels(new), labels(old));
    let mut modified: Vec<String> = a
        .iter()
        .filter(|(k, v)| b.get(*k) != Some(v))
        .chain(b.iter().filter(|(k, v)| a.get(*k) != Some(v)))
        .map(|(k, _)| k.clone())
        .collect();
    modified.sort();
    modified.dedup();
    modified
        .into_iter()
        .filter(|k| {
            let ns = k.split_once('/').map(|(n, _)| n).unwrap_or("");
            let restricted = ns == "node-restriction.kubernetes.io" || ns.ends_with(".node-restriction.kubernetes.io");
            let k8s =
                ns == "kubernetes.io" || ns.ends_with(".kubernetes.io") || ns == "k8s.io" || ns.ends_with(".k8s.io");
            restricted || (k8s && !is_kubelet_label(k))
        })
        .collect()
}

fn admit_node(node: &str, a: &Admission<'_>, deny: &Deny<'_>) -> Result<(), ApiError> {
    if a.name != node {
        return deny(format!("node {node:?} is not allowed to modify node {:?}", a.name));
    }
    match a.op {
        Operation::Create => {
            let bad = forbidden_labels(a.new, None);
            if !bad.is_empty() {
                return deny(format!("node {node:?} is not allowed to set the following labels: {}", bad.join(", ")));
            }
        }
        Operation::Update => {
            let taints = |o: Option<&Value>| o.and_then(|o| o.pointer("/spec/taints")).cloned();
            if taints(a.new) != taints(a.old) {
                return deny(format!("node {node:?} is not allowed to modify taints"));
            }
            let bad = forbidden_labels(a.new, a.old);
            if !bad.is_empty() {
                return deny(format!("is not allowed to modify labels: {}", bad.join(", ")));
            }
        }
        Operation::Delete => {}
    }
    Ok(())
}

fn admit_token(inner: &StoreInner, node: &str, a: &Admission<'_>, deny: &Deny<'_>) -> Result<(), ApiError> {
    let r = a.new.and_then(|tr| tr.pointer("/spec/boundObjectRef")).cloned().unwrap_or(Value::Null);
    let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    if s("apiVersion") != "v1" || s("kind") != "Pod" || s("name").is_empty() {
        return deny("node requested token not bound to a pod".into());
    }
    if s("uid").is_empty() {
        return deny("node requested token with a pod binding without a uid".into());
    }
    let Some(pod) = inner.get("pods", a.namespace, &s("name")) else {
        return Err(ApiError::not_found(&GroupResource::new("", "pods"), &s("name")));
    };
    if pod.pointer("/metadata/uid").and_then(Value::as_str) != Some(s("uid").as_str()) {
        return deny(format!(
            "the UID in the bound object reference ({}) does not match the UID in record. The object might have been deleted and then recreated",
            s("uid")
        ));
    }
    if spec_node(Some(&pod)) != node {
        return deny("node requested token bound to a pod scheduled on a different node".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn node_identity() {
        assert_eq!(node_name(&node_user("n1")), Some("n1"));
        let mut u = node_user("n1");
        u.groups.clear();
        assert_eq!(node_name(&u), None);
        assert_eq!(node_name(&admin_user()), None);
    }

    #[test]
    fn kubelet_labels() {
        let old = json!({"metadata": {"labels": {"kubernetes.io/hostname": "a"}}});
        let new = json!({"metadata": {"labels": {"kubernetes.io/hostname": "b", "node.kubernetes.io/foo": "x", "custom": "y"}}});
        assert!(forbidden_labels(Some(&new), Some(&old)).is_empty());
        let bad = json!({"metadata": {"labels": {"node-role.kubernetes.io/master": "", "node-restriction.kubernetes.io/x": "1"}}});
        assert_eq!(forbidden_labels(Some(&bad), None).len(), 2);
    }
}
