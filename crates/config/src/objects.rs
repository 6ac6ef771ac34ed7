//! How the agent learns about changes to the ConfigMaps and Secrets pods use
//! (`configMapAndSecretChangeDetectionStrategy`).

/// Upstream's `ResourceChangeDetectionStrategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChangeDetection {
    /// `Get`: read the object from the API server on every use.
    Get,
    /// `Cache`: keep what was read for a TTL (the node's `node.alpha.kubernetes.io/ttl`
    /// annotation, else one minute).
    Cache,
    /// `Watch` (default): one watch per referenced object while a pod uses it.
    #[default]
    Watch,
}

impl ChangeDetection {
    /// The config file's spelling; None for anything else.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "Get" => Some(ChangeDetection::Get),
            "Cache" => Some(ChangeDetection::Cache),
            "Watch" => Some(ChangeDetection::Watch),
            _ => None,
        }
    }
}
