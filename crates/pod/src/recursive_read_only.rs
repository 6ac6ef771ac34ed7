//! Recursive read-only mounts (`volumeMounts[].recursiveReadOnly`, GA in 1.33): whether a
//! read-only mount is read-only with all its submounts too, from what the container asks and
//! what the runtime handler supports (CRI `Status`, `runtime_handlers[].features`), as
//! upstream's `resolveRecursiveReadOnly` decides it.

use k8s_openapi::api::core::v1::VolumeMount;

/// Why a mount's `recursiveReadOnly` cannot be honoured; the container is then refused with
/// `CreateContainerConfigError` ("failed to resolve recursive read-only mode: " and this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecursiveReadOnlyError {
    #[error("volume {0:?} requested recursive read-only mode, but it is not read-only")]
    NotReadOnly(String),
    #[error(
        "volume {volume:?} requested recursive read-only mode, but it is not compatible with propagation {propagation:?}"
    )]
    Propagation { volume: String, propagation: String },
    #[error("volume {0:?} requested recursive read-only mode, but it is not supported by the runtime")]
    Unsupported(String),
    #[error("unknown recursive read-only mode {0:?}")]
    UnknownMode(String),
}

/// Whether `mount` is made recursively read-only, where the runtime handler `supported` it or
/// not: `Enabled` insists (an error without support), `IfPossible` takes what there is.
pub fn resolve(mount: &VolumeMount, supported: bool) -> Result<bool, RecursiveReadOnlyError> {
    let mode = match mount.recursive_read_only.as_deref() {
        None | Some("Disabled") => return Ok(false),
        Some(mode) => mode,
    };
    if mount.read_only != Some(true) {
        return Err(RecursiveReadOnlyError::NotReadOnly(mount.name.clone()));
    }
    if let Some(propagation) = mount.mount_propagation.as_deref().filter(|p| *p != "None") {
        let propagation = propagation.to_string();
        return Err(RecursiveReadOnlyError::Propagation { volume: mount.name.clone(), propagation });
    }
    match mode {
        "IfPossible" => Ok(supported),
        "Enabled" if supported => Ok(true),
        "Enabled" => Err(RecursiveReadOnlyError::Unsupported(mount.name.clone())),
        other => Err(RecursiveReadOnlyError::UnknownMode(other.to_string())),
    }
}

/// Whether any mount of the container asks for recursive read-only (so that the runtime's
/// support matters).
pub fn requested(mounts: &[VolumeMount]) -> bool {
    mounts.iter().any(|m| m.recursive_read_only.as_deref().is_some_and(|mode| mode != "Disabled"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(read_only: bool, mode: Option<&str>, propagation: Option<&str>) -> VolumeMount {
        VolumeMount {
            name: "mnt".into(),
            mount_path: "/mnt".into(),
            read_only: Some(read_only),
            recursive_read_only: mode.map(str::to_string),
            mount_propagation: propagation.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn enabled_needs_the_runtime_and_if_possible_takes_what_it_has() {
        for supported in [false, true] {
            assert_eq!(resolve(&mount(true, None, None), supported), Ok(false));
            assert_eq!(resolve(&mount(true, Some("Disabled"), None), supported), Ok(false));
            assert_eq!(resolve(&mount(false, None, None), supported), Ok(false));
            assert_eq!(resolve(&mount(true, Some("IfPossible"), None), supported), Ok(supported));
            assert_eq!(resolve(&mount(true, Some("IfPossible"), Some("None")), supported), Ok(supported));
        }
        assert_eq!(resolve(&mount(true, Some("Enabled"), None), true), Ok(true));
        let refused = resolve(&mount(true, Some("Enabled"), None), false).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "volume \"mnt\" requested recursive read-only mode, but it is not supported by the runtime"
        );
    }

    #[test]
    fn a_writable_or_propagated_mount_cannot_be_recursively_read_only() {
        let writable = resolve(&mount(false, Some("IfPossible"), None), true).unwrap_err();
        assert_eq!(writable.to_string(), "volume \"mnt\" requested recursive read-only mode, but it is not read-only");
        let propagated = resolve(&mount(true, Some("Enabled"), Some("HostToContainer")), true).unwrap_err();
        assert_eq!(
            propagated.to_string(),
            "volume \"mnt\" requested recursive read-only mode, but it is not compatible with propagation \"HostToContainer\""
        );
        let unknown = resolve(&mount(true, Some("Always"), None), true).unwrap_err();
        assert_eq!(unknown.to_string(), "unknown recursive read-only mode \"Always\"");
    }

    #[test]
    fn only_a_mode_other_than_disabled_is_a_request() {
        assert!(!requested(&[mount(true, None, None), mount(true, Some("Disabled"), None)]));
        assert!(requested(&[mount(true, None, None), mount(true, Some("IfPossible"), None)]));
    }
}
