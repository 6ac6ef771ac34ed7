//! The four PATCH flavours, chosen by `Content-Type` as kube-apiserver does.

pub mod json;
pub mod merge;
pub mod strategic;

use serde_json::Value;

use crate::status::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    /// Server-side apply. Implemented as "create if missing, else merge the applied
    /// configuration": field ownership and conflicts are not tracked.
    Apply,
}

impl PatchType {
    pub fn from_content_type(content_type: &str) -> Option<PatchType> {
        let media = content_type.split(';').next().unwrap_or("").trim();
        match media {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Some(PatchType::Apply),
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The patch document itself is not well formed (400).
    #[error("{0}")]
    Malformed(String),
    /// The patch is well formed but cannot be applied to this object (422).
    #[error("{0}")]
    Failed(String),
}

impl From<PatchError> for ApiError {
    fn from(e: PatchError) -> ApiError {
        match e {
            PatchError::Malformed(m) => ApiError::bad_request(m),
            PatchError::Failed(m) => ApiError::new(422, "Invalid", m),
        }
    }
}

/// Parses a patch body: JSON for every type, YAML (a superset) for apply.
pub fn parse_body(kind: PatchType, body: &[u8]) -> Result<Value, ApiError> {
    let parsed = match kind {
        PatchType::Apply => serde_yaml_ng::from_slice::<Value>(body).map_err(|e| e.to_string()),
        _ => serde_json::from_slice::<Value>(body).map_err(|e| e.to_string()),
    };
    parsed.map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
}

/// Applies a patch of `kind` to `original`, an object of Kubernetes kind `object_kind`.
/// `builtin` tells whether the type has Go struct tags upstream: custom resources have none,
/// so a strategic merge patch on them is refused with 415 like the real server does.
pub fn apply(
    kind: PatchType,
    object_kind: &str,
    builtin: bool,
    original: &Value,
    patch: &Value,
) -> Result<Value, ApiError> {
    match kind {
        PatchType::Json => Ok(json::apply(original, patch)?),
        PatchType::Merge => {
            if !patch.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            let mut out = original.clone();
            merge::apply(&mut out, patch);
            Ok(out)
        }
        PatchType::Strategic if !builtin => Err(ApiError::unsupported_media_type(
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        )),
        PatchType::Strategic => Ok(strategic::apply(object_kind, original, patch)?),
        PatchType::Apply if builtin => Ok(strategic::apply(object_kind, original, patch)?),
        PatchType::Apply => {
            let mut out = original.clone();
            merge::apply(&mut out, patch);
            Ok(out)
        }
    }
}
