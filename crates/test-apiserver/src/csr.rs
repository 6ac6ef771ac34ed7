//! certificates.k8s.io/v1 CertificateSigningRequests: the registry strategy (requestor
//! fields on create, what each subresource may change, validation), the signer permission
//! checks of the CertificateApproval/CertificateSigning admission plugins, and an in-process
//! stand-in for kube-controller-manager's csrapproving and csrsigning controllers.
//!
//! The approver auto-approves `kubernetes.io/kube-apiserver-client-kubelet` requests that
//! look like a node client certificate, when the requestor may create
//! `certificatesigningrequests/nodeclient` (a bootstrapper) or, for its own name,
//! `certificatesigningrequests/selfnodeclient` (a node renewing). The signer then issues
//! approved requests of the kubelet client, kubelet serving and kube-apiserver-client
//! signers with the cluster CA; kubelet serving requests wait for someone to approve them.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;

use crate::auth;
use crate::meta;
use crate::state::State;
use crate::status::{ApiError, ApiResult, FieldError, GroupResource};
use crate::{AccessRequest, Decision, UserInfo};

pub const STORAGE: &str = "certificates.k8s.io/certificatesigningrequests";
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client";
const LEGACY_SIGNER: &str = "kubernetes.io/legacy-unknown";

/// kube-controller-manager's `--cluster-signing-duration` default (one year).
pub const DEFAULT_SIGNING_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// The key usages the API accepts (upstream's `KeyUsage` constants).
const KNOWN_USAGES: &[&str] = &[
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
];

fn gr() -> GroupResource {
    GroupResource::new("certificates.k8s.io", "certificatesigningrequests")
}

fn invalid(name: &str, errors: Vec<FieldError>) -> ApiError {
    ApiError::invalid("CertificateSigningRequest", "certificates.k8s.io", name, errors)
}

/// On create: the requestor's identity goes into the spec (whatever the client sent), the
/// status starts empty, and the request is validated.
pub fn prepare_create(user: &UserInfo, obj: &mut Value) -> ApiResult<()> {
    if !obj["spec"].is_object() {
        obj["spec"] = json!({});
    }
    obj["spec"]["username"] = json!(user.username);
    obj["spec"]["uid"] = json!(user.uid);
    obj["spec"]["groups"] = json!(user.groups);
    if user.extra.is_empty() {
        if let Some(spec) = obj["spec"].as_object_mut() {
            spec.remove("extra");
        }
    } else {
        obj["spec"]["extra"] = json!(user.extra);
    }
    obj["status"] = json!({});
    let errors = validate_spec(&obj["spec"]);
    if errors.is_empty() { Ok(()) } else { Err(invalid(meta::name(obj), errors)) }
}

/// What each write may change: the main resource only metadata (the spec is immutable), the
/// `approval` subresource the conditions, the `status` subresource the certificate and the
/// non-approval conditions. Then the status rules are validated.
pub fn prepare_update(subresource: &str, existing: &Value, new: &mut Value) -> ApiResult<()> {
    new["spec"] = existing["spec"].clone();
    match subresource {
        "approval" => new["status"]["certificate"] = existing["status"]["certificate"].clone(),
        "status" => {
            let approvals = |o: &Value| -> Vec<Value> {
                conditions(o)
                    .into_iter()
                    .filter(|c| matches!(c["type"].as_str(), Some("Approved" | "Denied")))
                    .collect()
            };
            let mut conds: Vec<Value> = conditions(new)
                .into_iter()
                .filter(|c| !matches!(c["type"].as_str(), Some("Approved" | "Denied")))
                .collect();
            conds.splice(0..0, approvals(existing));
            new["status"]["conditions"] = json!(conds);
        }
        _ => new["status"] = existing["status"].clone(),
    }
    if new["status"]["certificate"].is_null()
        && let Some(status) = new["status"].as_object_mut()
    {
        status.remove("certificate");
    }
    if new["status"]["conditions"].as_array().is_some_and(Vec::is_empty)
        && let Some(status) = new["status"].as_object_mut()
    {
        status.remove("conditions");
    }
    let errors = validate_status(existing, new);
    if errors.is_empty() { Ok(()) } else { Err(invalid(meta::name(existing), errors)) }
}

fn conditions(csr: &Value) -> Vec<Value> {
    csr.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default()
}

fn has_condition(csr: &Value, kind: &str) -> bool {
    conditions(csr).iter().any(|c| c["type"] == kind && c["status"] == "True")
}

fn validate_spec(spec: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    match spec["request"].as_str() {
        None | Some("") => errors.push(FieldError::required("spec.request", "")),
        Some(b64) => {
            if let Err(e) = STANDARD.decode(b64).map_err(RequestError::from).and_then(|pem| parse_request(&pem)) {
                errors.push(FieldError::invalid("spec.request", &json!("<request data>"), &e.to_string()));
            }
        }
    }
    let signer = spec["signerName"].as_str().unwrap_or("");
    if signer.is_empty() {
        errors.push(FieldError::required("spec.signerName", ""));
    } else if signer == LEGACY_SIGNER {
        errors.push(FieldError::invalid(
            "spec.signerName",
            &json!(signer),
            "the legacy signerName is not allowed via this API version",
        ));
    } else if !valid_signer_name(signer) {
        errors.push(FieldError::invalid(
            "spec.signerName",
            &json!(signer),
            "must be a fully qualified domain and path of the form 'example.com/signer-name'",
        ));
    }
    let usages: Vec<&str> =
        spec["usages"].as_array().map(|u| u.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    if usages.is_empty() {
        errors.push(FieldError::required("spec.usages", ""));
    }
    let mut seen = BTreeSet::new();
    for (i, u) in usages.iter().enumerate() {
        if !KNOWN_USAGES.contains(u) {
            errors.push(FieldError {
                field: format!("spec.usages[{i}]"),
                reason: "FieldValueNotSupported",
                detail: format!("Unsupported value: {u:?}"),
            });
        } else if !seen.insert(*u) {
            errors.push(FieldError {
                field: format!("spec.usages[{i}]"),
                reason: "FieldValueDuplicate",
                detail: format!("Duplicate value: {u:?}"),
            });
        }
    }
    if let Some(secs) = spec.get("expirationSeconds").filter(|v| !v.is_null())
        && secs.as_i64().is_none_or(|s| s < 600)
    {
        errors.push(FieldError::invalid(
            "spec.expirationSeconds",
            secs,
            "may not specify a duration less than 600 seconds (10 minutes)",
        ));
    }
    errors
}

fn valid_signer_name(signer: &str) -> bool {
    let Some((domain, path)) = signer.split_once('/') else { return false };
    domain.contains('.')
        && domain
            .split('.')
            .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
        && !path.is_empty()
        && !path.starts_with('/')
}

fn validate_status(existing: &Value, new: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let conds = conditions(new);
    let mut seen = BTreeSet::new();
    for (i, c) in conds.iter().enumerate() {
        let kind = c["type"].as_str().unwrap_or("");
        let field = format!("status.conditions[{i}]");
        if kind.is_empty() {
            errors.push(FieldError::required(&format!("{field}.type"), ""));
            continue;
        }
        if matches!(kind, "Approved" | "Denied" | "Failed") && !seen.insert(kind.to_string()) {
            errors.push(FieldError {
                field: format!("{field}.type"),
                reason: "FieldValueDuplicate",
                detail: format!("Duplicate value: {kind:?}"),
            });
        }
        let status = c["status"].as_str().unwrap_or("");
        if matches!(kind, "Approved" | "Denied" | "Failed") && status != "True" {
            errors.push(FieldError {
                field: format!("{field}.status"),
                reason: "FieldValueNotSupported",
                detail: format!("Unsupported value: {status:?}: supported values: \"True\""),
            });
        }
    }
    if has_condition(new, "Approved") && has_condition(new, "Denied") {
        errors.push(FieldError::invalid(
            "status.conditions",
            &json!(conds),
            "Approved and Denied conditions are mutually exclusive",
        ));
    }
    for kind in ["Approved", "Denied"] {
        if has_condition(existing, kind) && !has_condition(new, kind) {
            errors.push(FieldError::forbidden(
                "status.conditions",
                &format!("updates may not remove a condition of type {kind:?}"),
            ));
        }
    }
    let old_cert = existing.pointer("/status/certificate").and_then(Value::as_str).unwrap_or("");
    let new_cert = new.pointer("/status/certificate").and_then(Value::as_str).unwrap_or("");
    if !old_cert.is_empty() && old_cert != new_cert {
        errors.push(FieldError::invalid("status.certificate", &json!("<certificate data>"), "field is immutable"));
    } else if old_cert.is_empty() && !new_cert.is_empty() {
        if !has_condition(new, "Approved") || has_condition(new, "Denied") {
            errors.push(FieldError::invalid(
                "status.certificate",
                &json!("<certificate data>"),
                "certificate can only be set once the request is approved",
            ));
        }
        let pem = STANDARD.decode(new_cert).ok().and_then(|b| String::from_utf8(b).ok()).unwrap_or_default();
        if !pem.contains("-----BEGIN CERTIFICATE-----") {
            errors.push(FieldError::invalid(
                "status.certificate",
                &json!("<certificate data>"),
                "must contain at least one CERTIFICATE PEM block",
            ));
        }
    }
    errors
}

/// What a certificate request asks for, as the approver and signer check it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestInfo {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<String>,
    pub emails: Vec<String>,
    pub uris: Vec<String>,
}

/// Why `spec.request` is not a valid certificate request (kube-apiserver's messages).
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("{0}")]
    Base64(#[from] base64::DecodeError),
    #[error("PEM block type must be CERTIFICATE REQUEST")]
    NotARequest,
    #[error("asn1: structure error: {0}")]
    Structure(#[source] x509_parser::nom::Err<x509_parser::error::X509Error>),
    #[error("x509: signature verification failure")]
    Signature,
}

/// Why a request does not meet its signer's rules (upstream's `ValidateKubelet…CSR`); the
/// signing controller reports it in the `Failed` condition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignerRuleError {
    #[error("subject organization is not system:nodes")]
    Organization,
    #[error("subject common name does not begin with system:node:")]
    CommonName,
    /// `what` is upstream's name of the subjectAltName kind (`dnsNames`, `Email`, ...).
    #[error("{what} subjectAltName content is not allowed")]
    SanNotAllowed { what: &'static str },
    #[error("{what} subjectAltNames are not allowed")]
    ServingSanNotAllowed { what: &'static str },
    #[error("DNS or IP subjectAltName is required")]
    SanRequired,
    #[error(
        "usages did not match [digital signature {auth}] or [key encipherment digital signature {auth}]: {usages:?}"
    )]
    Usages { auth: &'static str, usages: BTreeSet<String> },
    #[error("usages must contain client auth and not server auth")]
    ClientUsages,
}

/// Parses and verifies a PEM `CERTIFICATE REQUEST` (the decoded `spec.request`).
pub fn parse_request(pem_bytes: &[u8]) -> Result<RequestInfo, RequestError> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem_bytes).map_err(|_| RequestError::NotARequest)?;
    if pem.label != "CERTIFICATE REQUEST" {
        return Err(RequestError::NotARequest);
    }
    let (_, req) = x509_parser::certification_request::X509CertificationRequest::from_der(&pem.contents)
        .map_err(RequestError::Structure)?;
    req.verify_signature().map_err(|_| RequestError::Signature)?;
    let subject = &req.certification_request_info.subject;
    let text = |a: &x509_parser::x509::AttributeTypeAndValue<'_>| a.as_str().unwrap_or("").to_string();
    let mut info = RequestInfo {
        common_name: subject.iter_common_name().next().map(text).unwrap_or_default(),
        organizations: subject.iter_organization().map(text).collect(),
        ..Default::default()
    };
    for ext in req.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            for name in &san.general_names {
                match name {
                    GeneralName::DNSName(d) => info.dns_names.push(d.to_string()),
                    GeneralName::RFC822Name(e) => info.emails.push(e.to_string()),
                    GeneralName::URI(u) => info.uris.push(u.to_string()),
                    GeneralName::IPAddress(b) => info.ip_addresses.push(ip_text(b)),
                    _ => {}
                }
            }
        }
    }
    Ok(info)
}

fn ip_text(bytes: &[u8]) -> String {
    match bytes.len() {
        4 => std::net::Ipv4Addr::from(<[u8; 4]>::try_from(bytes).expect("4 bytes")).to_string(),
        16 => std::net::Ipv6Addr::from(<[u8; 16]>::try_from(bytes).expect("16 bytes")).to_string(),
        _ => format!("{bytes:?}"),
    }
}

fn usages(csr: &Value) -> BTreeSet<String> {
    csr.pointer("/spec/usages")
        .and_then(Value::as_array)
        .map(|u| u.iter().filter_map(|v| v.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

fn is_node_subject(info: &RequestInfo) -> Result<(), SignerRuleError> {
    if info.organizations != ["system:nodes"] {
        return Err(SignerRuleError::Organization);
    }
    if !info.common_name.starts_with("system:node:") {
        return Err(SignerRuleError::CommonName);
    }
    Ok(())
}

/// Upstream's `ValidateKubeletClientCSR`.
pub fn check_kubelet_client(info: &RequestInfo, usages: &BTreeSet<String>) -> Result<(), SignerRuleError> {
    is_node_subject(info)?;
    for (what, present) in [
        ("dnsNames", !info.dns_names.is_empty()),
        ("emailAddresses", !info.emails.is_empty()),
        ("ipAddresses", !info.ip_addresses.is_empty()),
        ("uris", !info.uris.is_empty()),
    ] {
        if present {
            return Err(SignerRuleError::SanNotAllowed { what });
        }
    }
    let allowed = [
        BTreeSet::from(["digital signature".to_string(), "client auth".to_string()]),
        BTreeSet::from(["key encipherment".to_string(), "digital signature".to_string(), "client auth".to_string()]),
    ];
    if !allowed.contains(usages) {
        return Err(SignerRuleError::Usages { auth: "client auth", usages: usages.clone() });
    }
    Ok(())
}

/// Upstream's `ValidateKubeletServingCSR`.
pub fn check_kubelet_serving(info: &RequestInfo, usages: &BTreeSet<String>) -> Result<(), SignerRuleError> {
    is_node_subject(info)?;
    if info.dns_names.is_empty() && info.ip_addresses.is_empty() {
        return Err(SignerRuleError::SanRequired);
    }
    if !info.emails.is_empty() {
        return Err(SignerRuleError::ServingSanNotAllowed { what: "Email" });
    }
    if !info.uris.is_empty() {
        return Err(SignerRuleError::ServingSanNotAllowed { what: "URI" });
    }
    let allowed = [
        BTreeSet::from(["digital signature".to_string(), "server auth".to_string()]),
        BTreeSet::from(["key encipherment".to_string(), "digital signature".to_string(), "server auth".to_string()]),
    ];
    if !allowed.contains(usages) {
        return Err(SignerRuleError::Usages { auth: "server auth", usages: usages.clone() });
    }
    Ok(())
}

/// The CertificateApproval / CertificateSigning admission check: `verb` (approve or sign) on
/// `signers/<signerName>` (or the signer's domain wildcard).
pub fn authorize_signer(state: &State, user: &UserInfo, verb: &str, signer: &str) -> ApiResult<()> {
    let wildcard = signer.split_once('/').map(|(d, _)| format!("{d}/*")).unwrap_or_default();
    for name in [signer.to_string(), wildcard] {
        let req = AccessRequest {
            user: user.clone(),
            verb: verb.into(),
            api_group: "certificates.k8s.io".into(),
            api_version: "v1".into(),
            resource: "signers".into(),
            name,
            ..Default::default()
        };
        if auth::authorize(state, &req, None) == Decision::Allow {
            return Ok(());
        }
    }
    Err(ApiError::forbidden(&gr(), "", &format!("user not permitted to {verb} requests with signerName {signer:?}")))
}

/// Which auto-approval rule matched a pending request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recognized {
    /// A node renewing its own client certificate.
    SelfNodeClient,
    /// A bootstrapper asking for a node client certificate.
    NodeClient,
}

impl Recognized {
    fn subresource(self) -> &'static str {
        match self {
            Recognized::SelfNodeClient => "selfnodeclient",
            Recognized::NodeClient => "nodeclient",
        }
    }

    fn message(self) -> &'static str {
        match self {
            Recognized::SelfNodeClient => "Auto approving self kubelet client certificate after SubjectAccessReview.",
            Recognized::NodeClient => "Auto approving kubelet client certificate after SubjectAccessReview.",
        }
    }
}

/// The rules a pending request could be auto-approved by, most specific first (pure).
pub fn recognize(csr: &Value) -> Vec<Recognized> {
    if csr.pointer("/spec/signerName").and_then(Value::as_str) != Some(KUBELET_CLIENT_SIGNER) {
        return vec![];
    }
    let Some(info) = request_info(csr) else { return vec![] };
    if check_kubelet_client(&info, &usages(csr)).is_err() {
        return vec![];
    }
    let requestor = csr.pointer("/spec/username").and_then(Value::as_str).unwrap_or("");
    if requestor == info.common_name {
        vec![Recognized::SelfNodeClient, Recognized::NodeClient]
    } else {
        vec![Recognized::NodeClient]
    }
}

fn request_info(csr: &Value) -> Option<RequestInfo> {
    let pem = STANDARD.decode(csr.pointer("/spec/request")?.as_str()?).ok()?;
    parse_request(&pem).ok()
}

fn requestor(csr: &Value) -> UserInfo {
    let spec = &csr["spec"];
    UserInfo {
        username: spec["username"].as_str().unwrap_or("").into(),
        uid: spec["uid"].as_str().unwrap_or("").into(),
        groups: spec["groups"]
            .as_array()
            .map(|g| g.iter().filter_map(|v| v.as_str().map(String::from)).collect())
            .unwrap_or_default(),
        extra: serde_json::from_value(spec["extra"].clone()).unwrap_or_default(),
    }
}

fn is_pending(csr: &Value) -> bool {
    !has_condition(csr, "Approved") && !has_condition(csr, "Denied")
}

fn condition(kind: &str, reason: &str, message: &str) -> Value {
    let now = meta::now();
    json!({"type": kind, "status": "True", "reason": reason, "message": message,
           "lastUpdateTime": now, "lastTransitionTime": now})
}

/// What the signer does with an approved request (pure but for the signature).
#[derive(Debug)]
pub enum Signed {
    /// The PEM certificate.
    Issued(String),
    /// Not ours to sign (another signer's request).
    NotOurs,
    /// The request breaks the signer's rules: the reason for the Failed condition.
    Failed(String),
}

/// Signs an approved request whose signer the cluster CA serves, for `ttl` (capped by
/// `spec.expirationSeconds`).
pub fn sign(csr: &Value, pki: &crate::pki::Pki, ttl: Duration) -> Signed {
    let signer = csr.pointer("/spec/signerName").and_then(Value::as_str).unwrap_or("");
    let Some(info) = request_info(csr) else { return Signed::Failed("invalid certificate request".into()) };
    let usages = usages(csr);
    let checked = match signer {
        KUBELET_CLIENT_SIGNER => check_kubelet_client(&info, &usages),
        KUBELET_SERVING_SIGNER => check_kubelet_serving(&info, &usages),
        CLIENT_SIGNER if usages.contains("client auth") && !usages.contains("server auth") => Ok(()),
        CLIENT_SIGNER => Err(SignerRuleError::ClientUsages),
        _ => return Signed::NotOurs,
    };
    if let Err(why) = checked {
        return Signed::Failed(why.to_string());
    }
    let ttl = match csr.pointer("/spec/expirationSeconds").and_then(Value::as_u64) {
        Some(secs) => ttl.min(Duration::from_secs(secs)),
        None => ttl,
    };
    let Some(pem) =
        STANDARD.decode(csr["spec"]["request"].as_str().unwrap_or("")).ok().and_then(|b| String::from_utf8(b).ok())
    else {
        return Signed::Failed("invalid certificate request".into());
    };
    match pki.sign_request(&pem, &usages, ttl) {
        Ok(cert) => Signed::Issued(cert),
        Err(e) => Signed::Failed(format!("signing failed: {e}")),
    }
}

/// One pass of the approving and signing controllers over every request.
pub fn reconcile(state: &State) {
    let csrs = state.store.lock().list(STORAGE, None);
    for csr in csrs {
        if is_pending(&csr) {
            approve_if_recognized(state, &csr);
        } else if has_condition(&csr, "Approved")
            && !has_condition(&csr, "Failed")
            && csr.pointer("/status/certificate").is_none()
        {
            sign_approved(state, &csr);
        }
    }
}

fn approve_if_recognized(state: &State, csr: &Arc<Value>) {
    let user = requestor(csr);
    let approved = recognize(csr).into_iter().find(|r| {
        let req = AccessRequest {
            user: user.clone(),
            verb: "create".into(),
            api_group: "certificates.k8s.io".into(),
            api_version: "v1".into(),
            resource: "certificatesigningrequests".into(),
            subresource: r.subresource().into(),
            ..Default::default()
        };
        auth::authorize(state, &req, None) == Decision::Allow
    });
    if let Some(r) = approved {
        let mut updated = (**csr).clone();
        let mut conds = conditions(&updated);
        conds.push(condition("Approved", "AutoApproved", r.message()));
        updated["status"]["conditions"] = json!(conds);
        write_if_unchanged(state, csr, updated);
        tracing::info!(csr = meta::name(csr), "auto-approved");
    }
}

fn sign_approved(state: &State, csr: &Arc<Value>) {
    let ttl = state.signing_duration();
    let mut updated = (**csr).clone();
    match sign(csr, &state.pki, ttl) {
        Signed::NotOurs => return,
        Signed::Issued(pem) => updated["status"]["certificate"] = json!(STANDARD.encode(pem)),
        Signed::Failed(why) => {
            let mut conds = conditions(&updated);
            conds.push(condition("Failed", "SignerValidationFailure", &why));
            updated["status"]["conditions"] = json!(conds);
        }
    }
    write_if_unchanged(state, csr, updated);
}

/// Writes the controller's change unless someone else changed the request meanwhile (the
/// next pass sees the new version).
fn write_if_unchanged(state: &State, seen: &Value, updated: Value) {
    let mut inner = state.store.lock();
    let current = inner.get(STORAGE, "", meta::name(seen));
    if current.as_deref().map(meta::resource_version) == Some(meta::resource_version(seen)) {
        inner.put(STORAGE, updated);
    }
}

#[cfg(test)]
mod tests;
