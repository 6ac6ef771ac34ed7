//! Well-known annotation keys and the version Gantry reports, defined once for every crate.

use k8s_openapi::api::core::v1::Pod;

/// Which source a pod came from (`file`, `http`, `api`).
pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
/// A static pod's content hash; its mirror pod carries it in [`MIRROR`].
pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
/// When the node agent first saw a static pod.
pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";
/// Marks a mirror pod: the API server's copy of a static pod.
pub const MIRROR: &str = "kubernetes.io/config.mirror";

/// The version Gantry reports as `nodeInfo.kubeletVersion`: the Kubernetes
/// version whose kubelet it stands in for, plus Gantry's own version.
pub const KUBELET_VERSION: &str = concat!("v1.34.0-gantry.", env!("CARGO_PKG_VERSION"));

/// Whether a pod came from the API server (as opposed to a static pod source).
pub fn is_api_pod(pod: &Pod) -> bool {
    let source = pod.metadata.annotations.as_ref().and_then(|a| a.get(CONFIG_SOURCE));
    source.is_none_or(|s| s == "api")
}

/// Whether a pod is a mirror pod.
pub fn is_mirror(pod: &Pod) -> bool {
    pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(MIRROR))
}
