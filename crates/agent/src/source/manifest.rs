//! Decoding pod manifests (YAML or JSON) with errors that name the input and the field.

use k8s_openapi::List;
use k8s_openapi::api::core::v1::Pod;
use serde::de::DeserializeOwned;

/// A manifest that could not be turned into a pod.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {field}: {reason}")]
pub struct ManifestError {
    /// The file or URL the manifest came from.
    pub origin: String,
    /// The offending field, as a path such as `spec.containers[0].image` (or `(document)`).
    pub field: String,
    pub reason: String,
}

impl ManifestError {
    pub fn new(origin: &str, field: impl Into<String>, reason: impl Into<String>) -> Self {
        ManifestError { origin: origin.to_string(), field: field.into(), reason: reason.into() }
    }
}

/// Upstream refuses manifests larger than this.
pub const MAX_MANIFEST_BYTES: usize = 10 * 1024 * 1024;

/// Decodes one Pod.
pub fn parse_pod(data: &[u8], origin: &str) -> Result<Pod, ManifestError> {
    check_kind(data, origin, &["Pod"])?;
    decode(data, origin)
}

/// Decodes a Pod or a PodList (what a manifest URL may serve).
pub fn parse_pods(data: &[u8], origin: &str) -> Result<Vec<Pod>, ManifestError> {
    match check_kind(data, origin, &["Pod", "PodList"])?.as_str() {
        "PodList" => Ok(decode::<List<Pod>>(data, origin)?.items),
        _ => Ok(vec![decode(data, origin)?]),
    }
}

/// Checks apiVersion and kind first, so a Deployment by mistake gets a clear message rather
/// than a confusing field error.
fn check_kind(data: &[u8], origin: &str, kinds: &[&str]) -> Result<String, ManifestError> {
    if data.len() > MAX_MANIFEST_BYTES {
        return Err(ManifestError::new(origin, "(document)", format!("larger than {MAX_MANIFEST_BYTES} bytes")));
    }
    let value: serde_yaml_ng::Value = serde_yaml_ng::from_slice(data)
        .map_err(|e| ManifestError::new(origin, "(document)", format!("not valid YAML or JSON: {e}")))?;
    let field = |name: &str| value.get(name).and_then(|v| v.as_str()).map(str::to_string);
    match field("apiVersion").as_deref() {
        Some("v1") => {}
        Some(other) => return Err(ManifestError::new(origin, "apiVersion", format!("must be \"v1\", got {other:?}"))),
        None => return Err(ManifestError::new(origin, "apiVersion", "is required (apiVersion: v1)")),
    }
    match field("kind") {
        Some(kind) if kinds.contains(&kind.as_str()) => Ok(kind),
        Some(kind) => Err(ManifestError::new(origin, "kind", format!("must be {}, got {kind:?}", kinds.join(" or ")))),
        None => Err(ManifestError::new(origin, "kind", format!("is required (kind: {})", kinds[0]))),
    }
}

fn decode<T: DeserializeOwned>(data: &[u8], origin: &str) -> Result<T, ManifestError> {
    let deserializer = serde_yaml_ng::Deserializer::from_slice(data);
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { "(document)".to_string() } else { path };
        ManifestError::new(origin, field, e.into_inner().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_and_json_pods_decode() {
        let yaml = b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: busybox:1\n";
        assert_eq!(parse_pod(yaml, "web.yaml").unwrap().metadata.name.as_deref(), Some("web"));
        let json = br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j"},"spec":{"containers":[]}}"#;
        assert_eq!(parse_pod(json, "j.json").unwrap().metadata.name.as_deref(), Some("j"));
    }

    #[test]
    fn type_errors_name_the_file_and_field() {
        let yaml =
            b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    ports: nope\n";
        let err = parse_pod(yaml, "/etc/kubernetes/manifests/web.yaml").unwrap_err();
        assert_eq!(err.origin, "/etc/kubernetes/manifests/web.yaml");
        assert_eq!(err.field, "spec.containers[0].ports");
        assert!(err.to_string().contains("web.yaml: spec.containers[0].ports:"), "{err}");
    }

    #[test]
    fn wrong_kind_or_garbage_is_explained() {
        let err = parse_pod(b"apiVersion: apps/v1\nkind: Deployment\n", "d.yaml").unwrap_err();
        assert_eq!(err.field, "apiVersion");
        let err = parse_pod(b"apiVersion: v1\nkind: Service\n", "s.yaml").unwrap_err();
        assert_eq!(err.field, "kind");
        let err = parse_pod(b"{{{ not yaml", "x.yaml").unwrap_err();
        assert_eq!(err.field, "(document)");
    }

    #[test]
    fn pod_lists_decode_for_urls() {
        let list = br#"{"apiVersion":"v1","kind":"PodList","items":[
            {"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"containers":[]}},
            {"apiVersion":"v1","kind":"Pod","metadata":{"name":"b"},"spec":{"containers":[]}}]}"#;
        let pods = parse_pods(list, "http://x").unwrap();
        assert_eq!(pods.len(), 2);
    }
}
