//! The downward API: pod fields and container resources as strings, shared by env
//! (`fieldRef`, `resourceFieldRef`) and `downwardAPI` volume files. Pure.

use k8s_openapi::api::core::v1::{Container, Pod, ResourceFieldSelector};

use gantry_vocab::quantity::{self, QuantityError};
use gantry_vocab::spec;

/// Values that are not in the pod object itself.
#[derive(Debug, Default, Clone)]
pub struct Fields {
    pub node: String,
    pub pod_ip: Option<String>,
    pub host_ip: Option<String>,
    /// Node allocatable, the default for a missing limit (as upstream).
    pub node_cpu_milli: i128,
    pub node_memory_bytes: i128,
}

/// Why a `fieldRef` or `resourceFieldRef` has no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DownwardError {
    #[error("fieldRef {0:?} is not supported")]
    UnsupportedField(String),
    #[error("resourceFieldRef: container {0:?} not found in the pod")]
    ContainerNotFound(String),
    #[error("resourceFieldRef: containerName is required")]
    ContainerNameRequired,
    #[error(transparent)]
    Quantity(#[from] QuantityError),
    #[error("resourceFieldRef: divisor {0:?} must be positive")]
    NonPositiveDivisor(String),
    #[error("resourceFieldRef: unsupported resource {0:?}")]
    UnsupportedResource(String),
}

/// A `fieldRef` path's value.
pub fn field(pod: &Pod, path: &str, f: &Fields) -> Result<String, DownwardError> {
    let meta = &pod.metadata;
    let subscript = |prefix: &str| path.strip_prefix(prefix)?.strip_suffix("']").map(str::to_string);
    if let Some(key) = subscript("metadata.labels['") {
        return Ok(meta.labels.as_ref().and_then(|l| l.get(&key)).cloned().unwrap_or_default());
    }
    if let Some(key) = subscript("metadata.annotations['") {
        return Ok(meta.annotations.as_ref().and_then(|a| a.get(&key)).cloned().unwrap_or_default());
    }
    let s = pod.spec.as_ref();
    Ok(match path {
        "metadata.name" => spec::name(pod).to_string(),
        "metadata.namespace" => spec::namespace(pod).to_string(),
        "metadata.uid" => spec::uid(pod).to_string(),
        "metadata.labels" => format_map(meta.labels.iter().flatten()),
        "metadata.annotations" => format_map(meta.annotations.iter().flatten()),
        "spec.nodeName" => f.node.clone(),
        "spec.serviceAccountName" => s.and_then(|s| s.service_account_name.clone()).unwrap_or_default(),
        "status.podIP" | "status.podIPs" => f.pod_ip.clone().unwrap_or_default(),
        "status.hostIP" | "status.hostIPs" => f.host_ip.clone().unwrap_or_default(),
        other => return Err(DownwardError::UnsupportedField(other.to_string())),
    })
}

/// Upstream's map format for labels and annotations: sorted `key="value"` lines.
fn format_map<'a>(m: impl Iterator<Item = (&'a String, &'a String)>) -> String {
    let mut pairs: Vec<_> = m.map(|(k, v)| format!("{k}={v:?}")).collect();
    pairs.sort();
    pairs.join("\n")
}

/// A `resourceFieldRef`'s value, rounded up to whole divisors; a missing limit is the node's
/// allocatable. `c` is the container it is evaluated in (env) or `None` (volume files, which
/// must name the container).
pub fn resource(
    pod: &Pod,
    c: Option<&Container>,
    r: &ResourceFieldSelector,
    f: &Fields,
) -> Result<String, DownwardError> {
    let c = match (r.container_name.as_deref().filter(|n| !n.is_empty()), c) {
        (Some(name), _) => spec::containers(pod)
            .iter()
            .chain(spec::init_containers(pod))
            .find(|c| c.name == name)
            .ok_or_else(|| DownwardError::ContainerNotFound(name.to_string()))?,
        (None, Some(c)) => c,
        (None, None) => return Err(DownwardError::ContainerNameRequired),
    };
    let res = c.resources.as_ref();
    let get = |limits: bool, name: &str| {
        let m = res.and_then(|r| if limits { r.limits.as_ref() } else { r.requests.as_ref() });
        m.and_then(|m| m.get(name)).map(|q| quantity::parse_milli(&q.0)).transpose()
    };
    let divisor = r.divisor.as_ref().map_or(Ok(1000), |d| quantity::parse_milli(&d.0))?;
    if divisor <= 0 {
        return Err(DownwardError::NonPositiveDivisor(r.divisor.as_ref().map(|d| d.0.clone()).unwrap_or_default()));
    }
    let milli = match r.resource.as_str() {
        "limits.cpu" => get(true, "cpu")?.unwrap_or(f.node_cpu_milli),
        "requests.cpu" => get(false, "cpu")?.unwrap_or(0),
        "limits.memory" => get(true, "memory")?.unwrap_or(f.node_memory_bytes * 1000),
        "requests.memory" => get(false, "memory")?.unwrap_or(0),
        "limits.ephemeral-storage" => get(true, "ephemeral-storage")?.unwrap_or(0),
        "requests.ephemeral-storage" => get(false, "ephemeral-storage")?.unwrap_or(0),
        other => return Err(DownwardError::UnsupportedResource(other.to_string())),
    };
    Ok(((milli + divisor - 1) / divisor).to_string())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod() -> Pod {
        let resources = ResourceRequirements {
            limits: Some([("cpu".to_string(), Quantity("1500m".into()))].into()),
            requests: Some([("memory".to_string(), Quantity("64Mi".into()))].into()),
            ..Default::default()
        };
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                labels: Some([("b".to_string(), "2".to_string()), ("a".to_string(), "x\"y".to_string())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container { name: "c".into(), resources: Some(resources), ..Default::default() }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn fields_and_label_formatting() {
        let f = Fields { node: "n1".into(), ..Default::default() };
        assert_eq!(field(&pod(), "metadata.labels", &f).unwrap(), "a=\"x\\\"y\"\nb=\"2\"");
        assert_eq!(field(&pod(), "metadata.labels['b']", &f).unwrap(), "2");
        assert_eq!(field(&pod(), "spec.nodeName", &f).unwrap(), "n1");
        assert_eq!(field(&pod(), "spec.bogus", &f).unwrap_err(), DownwardError::UnsupportedField("spec.bogus".into()));
    }

    #[test]
    fn resources_round_up_by_divisor_and_default_to_node() {
        let sel = |res: &str, div: Option<&str>| ResourceFieldSelector {
            container_name: Some("c".into()),
            resource: res.into(),
            divisor: div.map(|d| Quantity(d.into())),
        };
        let f = Fields { node_memory_bytes: 1 << 30, ..Default::default() };
        let p = pod();
        assert_eq!(resource(&p, None, &sel("limits.cpu", None), &f).unwrap(), "2");
        assert_eq!(resource(&p, None, &sel("limits.cpu", Some("1m")), &f).unwrap(), "1500");
        assert_eq!(resource(&p, None, &sel("requests.memory", Some("1Mi")), &f).unwrap(), "64");
        assert_eq!(resource(&p, None, &sel("limits.memory", Some("1Mi")), &f).unwrap(), "1024");
    }
}
