//! A pod's volumes on the host: `hostPath` (with its `type` checks), `emptyDir` (disk, or tmpfs
//! for `medium: Memory`), and the API-backed `configMap`, `secret`, `downwardAPI` and
//! `projected` volumes written through the atomic writer, and `persistentVolumeClaim` volumes
//! whose PV a CSI driver serves, generic ephemeral volumes (the same, through the claim the
//! ephemeral volume controller creates) and CSI ephemeral inline volumes (`super::csi`). Other types are refused with a reason naming
//! the volume.

use std::collections::HashMap;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use gantry_cri::api;
use gantry_pod::recursive_read_only::{self, RecursiveReadOnlyError};
use gantry_pod::resources;
use gantry_pod::start_failure::StartFailure;
use k8s_openapi::api::core::v1::{Container, Pod, Volume};

use super::csi::CsiVolumes;
use super::driver::StartError;
use super::projection::{self, Objects};
use super::{atomic_writer, downward};
use crate::cluster::objects::{ObjectError, ObjectSource};
use gantry_vocab::quantity::{self, QuantityError};
use gantry_vocab::{paths, spec};

/// A volume ready on the host.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub path: PathBuf,
    /// API-backed volumes are always mounted read-only, as upstream does.
    pub read_only: bool,
    /// A block device (`volumeMode: Block`), for the containers' `volumeDevices`.
    pub block: bool,
}

pub use paths::pod_dir;

fn volume_dir(root_dir: &Path, pod: &Pod, plugin: &str, name: &str) -> PathBuf {
    paths::volume_dir(root_dir, spec::uid(pod), plugin, name)
}

/// Sets up (or refreshes) every volume of the pod and returns where each one is on the host.
pub async fn prepare(
    root_dir: &Path,
    pod: &Pod,
    objects: Option<&ObjectSource>,
    csi: Option<&CsiVolumes>,
    fields: &downward::Fields,
) -> Result<HashMap<String, Prepared>, StartError> {
    let fs_group = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()).and_then(|s| s.fs_group);
    let mut out = HashMap::new();
    for v in pod.spec.as_ref().and_then(|s| s.volumes.as_deref()).unwrap_or_default() {
        let failed = |e: VolumeError| {
            StartError::new(
                StartFailure::ContainerCreating,
                format!("MountVolume.SetUp failed for volume {:?} : {e}", v.name),
            )
        };
        let prepared = if let Some(host) = &v.host_path {
            let path = PathBuf::from(&host.path);
            check_host_path(&path, host.type_.as_deref().unwrap_or_default()).await.map_err(failed)?;
            Prepared { path, read_only: false, block: false }
        } else if let Some(e) = &v.empty_dir {
            let path = volume_dir(root_dir, pod, "empty-dir", &v.name);
            let memory = e.medium.as_deref() == Some("Memory");
            let size_limit =
                e.size_limit.as_ref().map(|q| quantity::parse_units(&q.0)).transpose().map_err(|e| failed(e.into()))?;
            let size = resources::memory_volume_size(pod, size_limit, fields.node_memory_bytes);
            setup_empty_dir(&path, memory, size, fs_group.map(|g| g as u32)).map_err(failed)?;
            Prepared { path, read_only: false, block: false }
        } else if projection::is_projection(v) {
            let plugin = plugin_name(v);
            let path = volume_dir(root_dir, pod, plugin, &v.name);
            let objects = objects.ok_or_else(|| failed(VolumeError::NoApiServer(plugin)))?;
            let fetched = fetch(pod, v, objects).await.map_err(|e| failed(e.into()))?;
            let files = projection::files(pod, v, &fetched, fields).map_err(|e| failed(e.into()))?;
            let group = fs_group.map(|g| g as u32);
            let (p, f) = (path.clone(), files);
            let memory = memory_backed(v);
            // Bounded as upstream bounds the memory-backed emptyDir these volumes sit on.
            let size = resources::memory_volume_size(pod, None, fields.node_memory_bytes);
            let changed = tokio::task::spawn_blocking(move || {
                if memory {
                    mount_tmpfs(&p, size)?;
                }
                atomic_writer::write(&p, &f, group)
            })
            .await
            .expect("writer task does not panic")
            .map_err(|source| failed(VolumeError::Io { action: "write", path: path.clone(), source }))?;
            if changed {
                tracing::debug!(pod = %spec::full_name(pod), volume = %v.name, "volume contents updated");
            }
            Prepared { path, read_only: true, block: false }
        } else if let (true, Some(csi)) =
            (v.persistent_volume_claim.is_some() || v.ephemeral.is_some() || v.csi.is_some(), csi)
        {
            let published = if v.csi.is_some() {
                csi.set_up_inline(pod, v, objects).await
            } else {
                csi.set_up(pod, v, objects).await
            };
            let published = published.map_err(|e| {
                let reason = if e.is_wait() {
                    StartFailure::ContainerCreating
                } else {
                    StartFailure::CreateContainerConfigError
                };
                StartError::new(reason, e.to_string())
            })?;
            Prepared { path: published.path, read_only: published.read_only, block: published.block }
        } else {
            return Err(StartError::new(
                StartFailure::CreateContainerConfigError,
                format!("volume {:?}: {} volumes are not supported (no CSI or volume plugin)", v.name, kind(v)),
            ));
        };
        out.insert(v.name.clone(), prepared);
    }
    Ok(out)
}

/// Whether any volume of the pod follows API objects and so needs refreshing.
pub fn has_projections(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.volumes.as_deref()).unwrap_or_default().iter().any(projection::is_projection)
}

/// Upstream keeps secret, downward API and projected volumes (service account tokens) on tmpfs,
/// so their contents never reach the node's disk; configMaps go to disk.
fn memory_backed(v: &Volume) -> bool {
    v.secret.is_some() || v.downward_api.is_some() || v.projected.is_some()
}

/// Creates the directory with a tmpfs on it (once: a pod's containers start concurrently and
/// each sets up the pod's volumes).
fn mount_tmpfs(path: &Path, size: i128) -> std::io::Result<()> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    std::fs::create_dir_all(path)?;
    if is_tmpfs(path) {
        return Ok(());
    }
    let options = (size > 0).then(|| format!("size={size}"));
    nix::mount::mount(Some("tmpfs"), path, Some("tmpfs"), nix::mount::MsFlags::empty(), options.as_deref())
        .map_err(std::io::Error::from)
}

fn plugin_name(v: &Volume) -> &'static str {
    paths::volume_plugin(v).unwrap_or("projected")
}

/// The volume's type as named in the pod spec, for the unsupported-type message.
fn kind(v: &Volume) -> String {
    let value = serde_json::to_value(v).unwrap_or_default();
    let mut names = value.as_object().into_iter().flat_map(|o| o.keys()).filter(|k| *k != "name");
    names.next().cloned().unwrap_or_else(|| "unknown".into())
}

/// Why a volume cannot be set up (upstream: "MountVolume.SetUp failed for volume …").
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("{0} volumes need an API server")]
    NoApiServer(&'static str),
    #[error(transparent)]
    Objects(#[from] ObjectError),
    #[error(transparent)]
    Projection(#[from] projection::ProjectionError),
    #[error(transparent)]
    SizeLimit(#[from] QuantityError),
    #[error("hostPath type check failed: {} is not a {what}", path.display())]
    HostPathType { path: PathBuf, what: &'static str },
    #[error("hostPath type {0:?} is not valid")]
    UnknownHostPathType(String),
    /// Creating a hostPath (`…OrCreate`) or an emptyDir failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io { action: &'static str, path: PathBuf, source: std::io::Error },
}

/// A container's `volumeMounts` entry that cannot be mounted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MountError {
    #[error("container {container:?}: volumeMount {mount:?} names no volume of the pod")]
    NoSuchVolume { container: String, mount: String },
    #[error("container {container:?}: volumeMount {mount:?} subPath: {source}")]
    SubPath { container: String, mount: String, source: projection::PathError },
    #[error("container {container:?}: volumeDevice {device:?} names no block volume of the pod")]
    NoSuchDevice { container: String, device: String },
    #[error("container {container:?}: volumeMount {mount:?}: invalid mountPropagation {propagation:?}")]
    Propagation { container: String, mount: String, propagation: String },
    /// Upstream's words, which name the volume only.
    #[error("failed to resolve recursive read-only mode: {0}")]
    RecursiveReadOnly(#[from] RecursiveReadOnlyError),
}

async fn fetch(pod: &Pod, v: &Volume, source: &ObjectSource) -> Result<Objects, ObjectError> {
    let refs = projection::references(v);
    let mut objects = Objects::default();
    for name in refs.config_maps {
        if let Some(cm) = source.config_map(pod, &name).await? {
            objects.config_maps.insert(name, cm);
        }
    }
    for name in refs.secrets {
        if let Some(s) = source.secret(pod, &name).await? {
            objects.secrets.insert(name, s);
        }
    }
    for key in refs.tokens {
        let token = source.token(pod, &key).await?;
        objects.tokens.insert(key, token);
    }
    Ok(objects)
}

async fn check_host_path(path: &Path, kind: &str) -> Result<(), VolumeError> {
    let meta = tokio::fs::metadata(path).await;
    let failed = |what: &'static str| Err(VolumeError::HostPathType { path: path.to_path_buf(), what });
    let io = |action: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| VolumeError::Io { action, path, source }
    };
    match kind {
        "" => Ok(()),
        "DirectoryOrCreate" if meta.is_err() => {
            tokio::fs::create_dir_all(path).await.map_err(io("create", path))?;
            tokio::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
                .await
                .map_err(io("set permissions of", path))
        }
        "FileOrCreate" if meta.is_err() => {
            if let Some(parent) = path.parent() {
                tokio::fs::create_dir_all(parent).await.map_err(io("create", parent))?;
            }
            tokio::fs::File::create(path).await.map(drop).map_err(io("create", path))
        }
        "Directory" | "DirectoryOrCreate" if !meta.as_ref().is_ok_and(|m| m.is_dir()) => failed("directory"),
        "File" | "FileOrCreate" if !meta.as_ref().is_ok_and(|m| m.is_file()) => failed("file"),
        "Socket" if !meta.as_ref().is_ok_and(|m| m.file_type().is_socket()) => failed("socket file"),
        "CharDevice" if !meta.as_ref().is_ok_and(|m| m.file_type().is_char_device()) => failed("character device"),
        "BlockDevice" if !meta.as_ref().is_ok_and(|m| m.file_type().is_block_device()) => failed("block device"),
        "Directory" | "DirectoryOrCreate" | "File" | "FileOrCreate" | "Socket" | "CharDevice" | "BlockDevice" => Ok(()),
        other => Err(VolumeError::UnknownHostPathType(other.to_string())),
    }
}

/// The directory (world-writable as upstream), a tmpfs on it for `medium: Memory`, and the
/// fsGroup's ownership.
fn setup_empty_dir(path: &Path, memory: bool, size: i128, group: Option<u32>) -> Result<(), VolumeError> {
    let err = |source: std::io::Error| VolumeError::Io { action: "set up", path: path.to_path_buf(), source };
    std::fs::create_dir_all(path).map_err(err)?;
    if memory {
        mount_tmpfs(path, size).map_err(err)?;
    }
    let mut mode = 0o777;
    if let Some(g) = group {
        std::os::unix::fs::chown(path, None, Some(g)).map_err(err)?;
        mode = projection::fs_group_mode(mode, true, false);
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(err)
}

/// Whether a tmpfs is mounted on `path` itself: a directory that merely lies on a tmpfs (a
/// root directory under /dev/shm) still needs its own, bounded mount.
fn is_tmpfs(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let on_tmpfs = nix::sys::statfs::statfs(path).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
    let device = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    let mount_point = path.parent().is_none_or(|parent| device(path) != device(parent));
    on_tmpfs && mount_point
}

/// The CRI mounts for a container's `volumeMounts`.
/// The container's `volumeDevices`: each block volume's device file on the host, created at
/// its `devicePath` in the container (upstream's permissions, `mrw`).
pub fn devices(c: &Container, volumes: &HashMap<String, Prepared>) -> Result<Vec<api::Device>, MountError> {
    let no_device = |name: &str| MountError::NoSuchDevice { container: c.name.clone(), device: name.to_string() };
    c.volume_devices
        .iter()
        .flatten()
        .map(|d| {
            let v = volumes.get(&d.name).filter(|v| v.block).ok_or_else(|| no_device(&d.name))?;
            Ok(api::Device {
                container_path: d.device_path.clone(),
                host_path: v.path.to_string_lossy().into_owned(),
                permissions: "mrw".into(),
            })
        })
        .collect()
}

/// `rro_supported`: the runtime handler supports recursive read-only mounts.
pub fn mounts(
    c: &Container,
    volumes: &HashMap<String, Prepared>,
    rro_supported: bool,
) -> Result<Vec<api::Mount>, MountError> {
    c.volume_mounts
        .iter()
        .flatten()
        .map(|m| {
            let v = volumes
                .get(&m.name)
                .ok_or_else(|| MountError::NoSuchVolume { container: c.name.clone(), mount: m.name.clone() })?;
            let host = match m.sub_path.as_deref() {
                Some(sub) if !sub.is_empty() => {
                    projection::validate_path(sub).map_err(|source| MountError::SubPath {
                        container: c.name.clone(),
                        mount: m.name.clone(),
                        source,
                    })?;
                    v.path.join(sub)
                }
                _ => v.path.clone(),
            };
            let propagation = match m.mount_propagation.as_deref() {
                None | Some("None") => api::MountPropagation::PropagationPrivate,
                Some("HostToContainer") => api::MountPropagation::PropagationHostToContainer,
                Some("Bidirectional") => api::MountPropagation::PropagationBidirectional,
                Some(other) => {
                    return Err(MountError::Propagation {
                        container: c.name.clone(),
                        mount: m.name.clone(),
                        propagation: other.to_string(),
                    });
                }
            };
            let recursive_read_only = recursive_read_only::resolve(m, rro_supported)?;
            Ok(api::Mount {
                container_path: m.mount_path.clone(),
                host_path: host.to_string_lossy().into_owned(),
                readonly: m.read_only.unwrap_or(false) || v.read_only,
                recursive_read_only,
                propagation: propagation as i32,
                ..Default::default()
            })
        })
        .collect()
}

/// Removes the pod's directory once the pod is gone, unmounting memory-backed volumes first.
pub async fn cleanup(root_dir: &Path, uid: &str) {
    let dir = pod_dir(root_dir, uid);
    let csi = dir.join("volumes").join(super::csi::POD_PLUGIN_DIR);
    let csi_devices = dir.join("volumeDevices").join(super::csi::POD_PLUGIN_DIR);
    if csi.exists() || csi_devices.exists() {
        // A CSI volume not torn down (or set up by an agent without CSI) may still be mounted
        // there: its data is not the node's to delete.
        tracing::warn!(pod_uid = uid, dir = %csi.display(), "CSI volumes not torn down; keeping the pod directory");
        return;
    }
    let plugins = std::fs::read_dir(dir.join("volumes")).into_iter().flatten().flatten();
    let volumes = plugins.flat_map(|p| std::fs::read_dir(p.path()).into_iter().flatten().flatten());
    for v in volumes {
        if is_tmpfs(&v.path())
            && let Err(err) = nix::mount::umount(&v.path())
        {
            tracing::warn!(pod_uid = uid, dir = %v.path().display(), error = %err, "cannot unmount volume");
        }
    }
    if let Err(e) = tokio::fs::remove_dir_all(&dir).await
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(pod_uid = uid, dir = %dir.display(), error = %e, "cannot remove pod directory");
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::VolumeMount;

    use super::*;

    fn vols() -> HashMap<String, Prepared> {
        HashMap::from([
            ("data".to_string(), Prepared { path: "/v/data".into(), read_only: false, block: false }),
            ("cfg".to_string(), Prepared { path: "/v/cfg".into(), read_only: true, block: false }),
        ])
    }

    fn mount(name: &str, path: &str) -> VolumeMount {
        VolumeMount { name: name.into(), mount_path: path.into(), ..Default::default() }
    }

    #[test]
    fn volume_devices_map_block_volumes_to_cri_devices() {
        let mut volumes = vols();
        volumes.insert("disk".into(), Prepared { path: "/p/disk/u1".into(), read_only: false, block: true });
        let device = |name: &str| k8s_openapi::api::core::v1::VolumeDevice {
            name: name.into(),
            device_path: "/dev/xvda".into(),
        };
        let c = Container { name: "c".into(), volume_devices: Some(vec![device("disk")]), ..Default::default() };
        assert_eq!(
            devices(&c, &volumes).unwrap(),
            [api::Device {
                container_path: "/dev/xvda".into(),
                host_path: "/p/disk/u1".into(),
                permissions: "mrw".into()
            }]
        );
        let c = Container { name: "c".into(), volume_devices: Some(vec![device("data")]), ..Default::default() };
        assert_eq!(
            devices(&c, &volumes).unwrap_err().to_string(),
            r#"container "c": volumeDevice "data" names no block volume of the pod"#
        );
    }

    #[test]
    fn volume_mounts_map_to_cri_mounts() {
        let mut sub = mount("data", "/d");
        sub.sub_path = Some("x/y".into());
        sub.mount_propagation = Some("HostToContainer".into());
        let c = Container {
            name: "c".into(),
            volume_mounts: Some(vec![sub, mount("cfg", "/etc/cfg")]),
            ..Default::default()
        };
        let m = mounts(&c, &vols(), false).unwrap();
        assert_eq!(m[0].host_path, "/v/data/x/y");
        assert!(!m[0].readonly);
        assert_eq!(m[0].propagation, api::MountPropagation::PropagationHostToContainer as i32);
        assert!(m[1].readonly, "API-backed volumes are mounted read-only");
    }

    #[test]
    fn bad_mounts_name_the_field() {
        let mut escape = mount("data", "/d");
        escape.sub_path = Some("../etc".into());
        let c = Container { name: "c".into(), volume_mounts: Some(vec![escape]), ..Default::default() };
        assert!(mounts(&c, &vols(), false).unwrap_err().to_string().contains("subPath"));
        let c = Container { name: "c".into(), volume_mounts: Some(vec![mount("nope", "/n")]), ..Default::default() };
        assert!(mounts(&c, &vols(), false).unwrap_err().to_string().contains("\"nope\""));
    }

    #[test]
    fn recursive_read_only_reaches_the_runtime_only_where_it_supports_it() {
        let mut rro = mount("data", "/d");
        rro.read_only = Some(true);
        rro.recursive_read_only = Some("IfPossible".into());
        let c = Container { name: "c".into(), volume_mounts: Some(vec![rro.clone()]), ..Default::default() };
        assert!(mounts(&c, &vols(), true).unwrap()[0].recursive_read_only);
        assert!(!mounts(&c, &vols(), false).unwrap()[0].recursive_read_only);
        rro.recursive_read_only = Some("Enabled".into());
        let c = Container { name: "c".into(), volume_mounts: Some(vec![rro]), ..Default::default() };
        assert!(mounts(&c, &vols(), true).unwrap()[0].recursive_read_only);
        assert_eq!(
            mounts(&c, &vols(), false).unwrap_err().to_string(),
            "failed to resolve recursive read-only mode: volume \"data\" requested recursive read-only mode, \
             but it is not supported by the runtime"
        );
    }

    #[test]
    fn unsupported_volume_kind_is_named() {
        let v: Volume =
            serde_json::from_value(serde_json::json!({"name": "d", "nfs": {"server": "s", "path": "/"}})).unwrap();
        assert_eq!(kind(&v), "nfs");
    }
}
