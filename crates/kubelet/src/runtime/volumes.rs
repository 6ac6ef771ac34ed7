//! The volume types that need nothing from an API server: `hostPath` and `emptyDir` (on disk).
//! Other types are refused when the pod is admitted (see `source::validate`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use gantry_cri::api;
use k8s_openapi::api::core::v1::{Container, Pod};

use crate::pod::spec;

/// `<root-dir>/pods/<uid>`: everything Gantry keeps on disk for one pod.
pub fn pod_dir(root_dir: &Path, uid: &str) -> PathBuf {
    root_dir.join("pods").join(uid)
}

/// Creates what the pod's volumes need on the host and returns each volume's host path.
pub async fn prepare(root_dir: &Path, pod: &Pod) -> Result<HashMap<String, PathBuf>, String> {
    let mut paths = HashMap::new();
    for v in pod.spec.as_ref().and_then(|s| s.volumes.as_deref()).unwrap_or_default() {
        let path = if let Some(host) = &v.host_path {
            let path = PathBuf::from(&host.path);
            if matches!(host.type_.as_deref(), Some("DirectoryOrCreate")) {
                create_dir(&path).await?;
            }
            path
        } else if v.empty_dir.is_some() {
            let path = pod_dir(root_dir, spec::uid(pod)).join("volumes/kubernetes.io~empty-dir").join(&v.name);
            create_dir(&path).await?;
            path
        } else {
            return Err(format!("volume {:?}: only hostPath and emptyDir volumes are supported yet", v.name));
        };
        paths.insert(v.name.clone(), path);
    }
    Ok(paths)
}

async fn create_dir(path: &Path) -> Result<(), String> {
    tokio::fs::create_dir_all(path).await.map_err(|e| format!("cannot create {}: {e}", path.display()))
}

/// The CRI mounts for a container's `volumeMounts`.
pub fn mounts(c: &Container, volumes: &HashMap<String, PathBuf>) -> Result<Vec<api::Mount>, String> {
    c.volume_mounts
        .iter()
        .flatten()
        .map(|m| {
            let host = volumes.get(&m.name).ok_or_else(|| {
                format!("container {:?}: volumeMount {:?} names no volume of the pod", c.name, m.name)
            })?;
            let host = match m.sub_path.as_deref() {
                Some(sub) if !sub.is_empty() => host.join(sub),
                _ => host.clone(),
            };
            Ok(api::Mount {
                container_path: m.mount_path.clone(),
                host_path: host.to_string_lossy().into_owned(),
                readonly: m.read_only.unwrap_or(false),
                ..Default::default()
            })
        })
        .collect()
}

/// Removes the pod's directory (emptyDir contents) once the pod is gone.
pub async fn cleanup(root_dir: &Path, uid: &str) {
    let dir = pod_dir(root_dir, uid);
    if let Err(e) = tokio::fs::remove_dir_all(&dir).await
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(pod_uid = uid, dir = %dir.display(), error = %e, "cannot remove pod directory");
    }
}
