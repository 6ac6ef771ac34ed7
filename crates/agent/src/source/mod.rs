//! Where the pods a node should run come from. Each source sends the complete set of pods it
//! currently wants (a SET, in upstream terms); [`merge`] turns all sources into one desired set.

pub mod file;
pub mod http;
pub mod manifest;
pub mod merge;
pub mod static_pod;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

/// Which source a pod came from; the value of the `kubernetes.io/config.source` annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SourceKind {
    File,
    Http,
    /// Pods bound to this node in the API server.
    Api,
}

impl SourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::File => "file",
            SourceKind::Http => "http",
            SourceKind::Api => "api",
        }
    }
}

/// Everything one source wants right now. The pods are shared: a source that sends its whole
/// SET on every change (the API source, on every pod event) hands over pointers, not copies.
#[derive(Debug, Clone)]
pub struct SourceUpdate {
    pub source: SourceKind,
    pub pods: Vec<Arc<Pod>>,
}

impl SourceUpdate {
    /// An update of pods the source does not keep.
    pub fn owned(source: SourceKind, pods: Vec<Pod>) -> Self {
        SourceUpdate { source, pods: pods.into_iter().map(Arc::new).collect() }
    }
}
