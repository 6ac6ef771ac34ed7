//! Static pods: the defaults upstream applies to pods from files and URLs, and the checks that
//! keep a bad manifest from turning into a half-working pod.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{Pod, PodStatus, Toleration};
use md5::{Digest, Md5};

use super::SourceKind;
use super::manifest::ManifestError;

pub use gantry_vocab::keys::{CONFIG_HASH, CONFIG_SEEN, CONFIG_SOURCE};

/// Where a static pod came from: the file path or the URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin<'a> {
    File(&'a str),
    Url(&'a str),
}

impl Origin<'_> {
    fn kind(&self) -> SourceKind {
        match self {
            Origin::File(_) => SourceKind::File,
            Origin::Url(_) => SourceKind::Http,
        }
    }

    fn name(&self) -> &str {
        match self {
            Origin::File(p) | Origin::Url(p) => p,
        }
    }
}

/// Applies the static-pod defaults: UID derived from content and origin, name suffixed with
/// the node name, namespace, node name, config annotations, and (for files) a NoExecute
/// toleration so taints never evict it. Then validates.
pub fn prepare(mut pod: Pod, origin: &Origin, node_name: &str) -> Result<Pod, ManifestError> {
    let node = node_name.to_lowercase();
    if pod.metadata.uid.as_deref().unwrap_or_default().is_empty() {
        pod.metadata.uid = Some(derive_uid(&pod, origin, &node));
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    validate(&pod, origin.name())?;
    pod.metadata.name = Some(format!("{name}-{node}"));
    if pod.metadata.namespace.as_deref().unwrap_or_default().is_empty() {
        pod.metadata.namespace = Some("default".to_string());
    }
    let annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(CONFIG_HASH.to_string(), uid);
    annotations.insert(CONFIG_SOURCE.to_string(), origin.kind().as_str().to_string());
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.node_name = Some(node);
    if matches!(origin, Origin::File(_)) {
        add_no_execute_toleration(spec.tolerations.get_or_insert_with(Vec::new));
    }
    pod.status = Some(PodStatus { phase: Some("Pending".to_string()), ..Default::default() });
    Ok(pod)
}

/// The UID is a digest of the manifest and where it came from, so the same manifest always
/// yields the same pod and any edit yields a new one.
fn derive_uid(pod: &Pod, origin: &Origin, node: &str) -> String {
    let mut hasher = Md5::new();
    hasher.update(serde_json::to_vec(pod).unwrap_or_default());
    match origin {
        Origin::File(path) => {
            hasher.update(format!("host:{node}"));
            hasher.update(format!("file:{path}"));
        }
        Origin::Url(url) => hasher.update(format!("url:{url}")),
    }
    hex::encode(hasher.finalize())
}

fn add_no_execute_toleration(tolerations: &mut Vec<Toleration>) {
    let wanted = Toleration { operator: Some("Exists".into()), effect: Some("NoExecute".into()), ..Default::default() };
    if !tolerations.contains(&wanted) {
        tolerations.push(wanted);
    }
}

/// The subset of API validation that matters on the node, plus what Gantry cannot run yet.
pub fn validate(pod: &Pod, origin: &str) -> Result<(), ManifestError> {
    let err = |field: &str, reason: String| Err(ManifestError::new(origin, field, reason));
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if name.is_empty() {
        return err("metadata.name", "is required".into());
    }
    if !is_dns_subdomain(name) {
        return err("metadata.name", format!("{name:?} must be a lowercase RFC 1123 subdomain"));
    }
    let Some(spec) = &pod.spec else { return err("spec", "is required".into()) };
    if spec.containers.is_empty() {
        return err("spec.containers", "must have at least one container".into());
    }
    if let Some(policy) = spec.restart_policy.as_deref()
        && !["Always", "OnFailure", "Never"].contains(&policy)
    {
        return err("spec.restartPolicy", format!("{policy:?} must be Always, OnFailure or Never"));
    }
    if spec.service_account_name.as_deref().is_some_and(|s| !s.is_empty()) {
        return err("spec.serviceAccountName", forbidden(name, "ServiceAccount"));
    }
    validate_containers(pod, origin)?;
    validate_volumes(pod, origin)
}

fn validate_containers(pod: &Pod, origin: &str) -> Result<(), ManifestError> {
    let spec = pod.spec.as_ref().expect("checked by validate");
    let mut names = HashSet::new();
    let inits = spec.init_containers.iter().flatten().map(|c| ("spec.initContainers", c));
    for (i, (list, c)) in inits.chain(spec.containers.iter().map(|c| ("spec.containers", c))).enumerate() {
        let index = if list == "spec.containers" { i - spec.init_containers.as_ref().map_or(0, Vec::len) } else { i };
        let field = |f: &str| format!("{list}[{index}]{f}");
        if !is_dns_label(&c.name) {
            return Err(ManifestError::new(
                origin,
                field(".name"),
                format!("{:?} must be a lowercase RFC 1123 label", c.name),
            ));
        }
        if !names.insert(c.name.as_str()) {
            return Err(ManifestError::new(origin, field(".name"), format!("duplicate container name {:?}", c.name)));
        }
        if c.image.as_deref().unwrap_or_default().trim().is_empty() {
            return Err(ManifestError::new(origin, field(".image"), "is required"));
        }
        for (j, e) in c.env.iter().flatten().enumerate() {
            let from = e.value_from.as_ref();
            if from.is_some_and(|f| f.config_map_key_ref.is_some() || f.secret_key_ref.is_some()) {
                return Err(ManifestError::new(
                    origin,
                    field(&format!(".env[{j}].valueFrom")),
                    forbidden(pod_name(pod), "ConfigMap or Secret"),
                ));
            }
        }
        if c.env_from.as_ref().is_some_and(|e| !e.is_empty()) {
            return Err(ManifestError::new(origin, field(".envFrom"), forbidden(pod_name(pod), "ConfigMap or Secret")));
        }
    }
    Ok(())
}

fn validate_volumes(pod: &Pod, origin: &str) -> Result<(), ManifestError> {
    let spec = pod.spec.as_ref().expect("checked by validate");
    let volumes = spec.volumes.as_deref().unwrap_or_default();
    for (i, v) in volumes.iter().enumerate() {
        let field = format!("spec.volumes[{i}]");
        if v.host_path.is_some() || v.empty_dir.is_some() {
            continue;
        }
        let api_kind = if v.config_map.is_some() {
            Some("ConfigMap")
        } else if v.secret.is_some() {
            Some("Secret")
        } else if v.persistent_volume_claim.is_some() {
            Some("PersistentVolumeClaim")
        } else if v.projected.is_some() {
            Some("projected ConfigMap, Secret or ServiceAccountToken")
        } else {
            None
        };
        let reason = match api_kind {
            Some(kind) => forbidden(pod_name(pod), kind),
            None => format!("volume {:?}: only hostPath and emptyDir volumes are supported yet", v.name),
        };
        return Err(ManifestError::new(origin, field, reason));
    }
    let all = spec.init_containers.iter().flatten().chain(&spec.containers);
    for c in all {
        for m in c.volume_mounts.iter().flatten() {
            if !volumes.iter().any(|v| v.name == m.name) {
                return Err(ManifestError::new(
                    origin,
                    format!("container {:?} volumeMounts", c.name),
                    format!("{:?} names no volume in spec.volumes", m.name),
                ));
            }
        }
    }
    Ok(())
}

fn pod_name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

fn forbidden(pod: &str, what: &str) -> String {
    format!("pod {pod:?} has forbidden references to API objects ({what}); static pods cannot reference API objects")
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

#[cfg(test)]
mod tests;
