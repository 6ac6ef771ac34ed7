//! `Status` errors. Every failure the server reports is an [`ApiError`], rendered as the
//! `kind: Status` JSON a real kube-apiserver sends, with the same `code`, `reason` and a
//! message worded like upstream's, because clients (kube-rs, kubectl, Gantry) branch on them.

use serde_json::{Value, json};

/// A failed request, as a Kubernetes `Status`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

/// A resource as named in error messages: `pods`, or `leases.coordination.k8s.io`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupResource {
    pub group: String,
    pub resource: String,
}

impl GroupResource {
    pub fn new(group: &str, resource: &str) -> Self {
        GroupResource { group: group.to_string(), resource: resource.to_string() }
    }

    pub fn qualified(&self) -> String {
        if self.group.is_empty() { self.resource.clone() } else { format!("{}.{}", self.resource, self.group) }
    }

    fn details(&self, name: &str) -> Value {
        let mut d = json!({"name": name, "kind": self.resource});
        if !self.group.is_empty() {
            d["group"] = json!(self.group);
        }
        d
    }
}

/// One field-level validation failure (a `StatusCause` of a 422 Invalid).
#[derive(Debug, Clone)]
pub struct FieldError {
    pub field: String,
    pub reason: &'static str,
    /// The text after the field path, e.g. `Required value: name is required`.
    pub detail: String,
}

impl FieldError {
    pub fn required(field: &str, detail: &str) -> Self {
        let detail = if detail.is_empty() { "Required value".to_string() } else { format!("Required value: {detail}") };
        FieldError { field: field.into(), reason: "FieldValueRequired", detail }
    }

    pub fn invalid(field: &str, value: &Value, detail: &str) -> Self {
        let shown = match value {
            Value::String(s) => format!("{s:?}"),
            other => other.to_string(),
        };
        FieldError {
            field: field.into(),
            reason: "FieldValueInvalid",
            detail: format!("Invalid value: {shown}: {detail}"),
        }
    }

    pub fn forbidden(field: &str, detail: &str) -> Self {
        FieldError { field: field.into(), reason: "FieldValueForbidden", detail: format!("Forbidden: {detail}") }
    }

    pub fn duplicate(field: &str, value: &Value) -> Self {
        FieldError { field: field.into(), reason: "FieldValueDuplicate", detail: format!("Duplicate value: {value}") }
    }

    pub fn not_found(field: &str, value: &Value) -> Self {
        FieldError { field: field.into(), reason: "FieldValueNotFound", detail: format!("Not found: {value}") }
    }

    pub fn not_supported(field: &str, value: &Value, supported: &[&str]) -> Self {
        let quoted: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        FieldError {
            field: field.into(),
            reason: "FieldValueNotSupported",
            detail: format!("Unsupported value: {value}: supported values: {}", quoted.join(", ")),
        }
    }

    fn message(&self) -> String {
        format!("{}: {}", self.field, self.detail)
    }
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError { code, reason, message: message.into(), details: None }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    pub fn not_found(gr: &GroupResource, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{} \"{name}\" not found", gr.qualified())).with_details(gr.details(name))
    }

    /// A path that names no resource this server knows.
    pub fn no_route() -> Self {
        Self::new(404, "NotFound", "the server could not find the requested resource").with_details(json!({}))
    }

    pub fn already_exists(gr: &GroupResource, name: &str) -> Self {
        Self::new(409, "AlreadyExists", format!("{} \"{name}\" already exists", gr.qualified()))
            .with_details(gr.details(name))
    }

    pub fn conflict(gr: &GroupResource, name: &str, why: &str) -> Self {
        Self::new(409, "Conflict", format!("Operation cannot be fulfilled on {} \"{name}\": {why}", gr.qualified()))
            .with_details(gr.details(name))
    }

    /// The optimistic-concurrency failure of an update with a stale resourceVersion.
    pub fn modified(gr: &GroupResource, name: &str) -> Self {
        Self::conflict(
            gr,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 Invalid; `kind` is the object's kind (`Pod`) and `group` its API group.
    pub fn invalid(kind: &str, group: &str, name: &str, errors: Vec<FieldError>) -> Self {
        let qualified_kind = if group.is_empty() { kind.to_string() } else { format!("{kind}.{group}") };
        let summary = match errors.as_slice() {
            [one] => one.message(),
            many => format!("[{}]", many.iter().map(FieldError::message).collect::<Vec<_>>().join(", ")),
        };
        let causes: Vec<Value> =
            errors.iter().map(|e| json!({"reason": e.reason, "message": e.detail, "field": e.field})).collect();
        let mut details = json!({"name": name, "kind": kind, "causes": causes});
        if !group.is_empty() {
            details["group"] = json!(group);
        }
        Self::new(422, "Invalid", format!("{qualified_kind} \"{name}\" is invalid: {summary}")).with_details(details)
    }

    pub fn forbidden(gr: &GroupResource, name: &str, why: &str) -> Self {
        let message = if name.is_empty() {
            format!("{} is forbidden: {why}", gr.qualified())
        } else {
            format!("{} \"{name}\" is forbidden: {why}", gr.qualified())
        };
        Self::new(403, "Forbidden", message).with_details(gr.details(name))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message).with_details(json!({}))
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    pub fn too_many_requests(message: &str, retry_after_seconds: u64, causes: Vec<Value>) -> Self {
        let mut details = json!({"causes": causes});
        if retry_after_seconds > 0 {
            details["retryAfterSeconds"] = json!(retry_after_seconds);
        }
        Self::new(429, "TooManyRequests", message).with_details(details)
    }

    /// 410 for a resourceVersion that fell out of the watch history.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The `Status` object for this error.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

/// A `Status` reporting success, as returned by deletes and evictions.
pub fn success_status(code: u16, details: Option<Value>) -> Value {
    let mut status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"});
    if code != 0 {
        status["code"] = json!(code);
    }
    if let Some(details) = details {
        status["details"] = details;
    }
    status
}

pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflict_message_matches_upstream() {
        let e = ApiError::modified(&GroupResource::new("", "pods"), "x");
        assert_eq!(
            e.message,
            "Operation cannot be fulfilled on pods \"x\": the object has been modified; please apply your changes to the latest version and try again"
        );
        assert_eq!(e.to_status()["reason"], "Conflict");
    }

    #[test]
    fn grouped_not_found() {
        let e = ApiError::not_found(&GroupResource::new("coordination.k8s.io", "leases"), "n1");
        assert_eq!(e.message, "leases.coordination.k8s.io \"n1\" not found");
        assert_eq!(e.to_status()["details"]["group"], "coordination.k8s.io");
    }

    #[test]
    fn invalid_formats_causes() {
        let e = ApiError::invalid(
            "Pod",
            "",
            "",
            vec![FieldError::required("metadata.name", "name or generateName is required")],
        );
        assert_eq!(e.message, "Pod \"\" is invalid: metadata.name: Required value: name or generateName is required");
        assert_eq!(e.code, 422);
    }
}
