//! Pod and container security contexts → CRI security contexts, as upstream merges and checks
//! them: container fields win over the pod's, `runAsNonRoot` is verified against the image's
//! user, fsGroup and supplementalGroups become supplemental groups, seccomp profiles resolve
//! container → pod → `seccompDefault`. Pure.

use std::path::Path;

use gantry_cri::api;
use k8s_openapi::api::core::v1::{Container, Pod, PodSecurityContext, SeccompProfile, SecurityContext};

use gantry_vocab::paths::{MASKED_PATHS, READONLY_PATHS};
use gantry_vocab::spec;

/// The user an image runs as (CRI `ImageStatus`): a uid, else a user name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageUser {
    pub uid: Option<i64>,
    pub username: String,
}

impl ImageUser {
    /// An image that names no user runs as root, as upstream assumes.
    pub fn of(image: Option<&api::Image>) -> Self {
        match image {
            Some(i) if i.uid.is_some() => ImageUser { uid: i.uid.as_ref().map(|u| u.value), username: String::new() },
            Some(i) if !i.username.is_empty() => ImageUser { uid: None, username: i.username.clone() },
            _ => ImageUser { uid: Some(0), username: String::new() },
        }
    }
}

/// What the security settings need from the node.
pub struct NodeSecurity<'a> {
    pub seccomp_default: bool,
    pub allow_privileged: bool,
    /// `<root-dir>/seccomp`, where `Localhost` profiles live.
    pub seccomp_root: &'a Path,
}

fn pod_sc(pod: &Pod) -> Option<&PodSecurityContext> {
    pod.spec.as_ref().and_then(|s| s.security_context.as_ref())
}

/// Upstream `DetermineEffectiveSecurityContext`: the container's context with the pod's user,
/// group, runAsNonRoot and SELinux options where the container sets none.
pub fn effective(pod: &Pod, c: &Container) -> SecurityContext {
    let mut sc = c.security_context.clone().unwrap_or_default();
    if let Some(p) = pod_sc(pod) {
        sc.run_as_user = sc.run_as_user.or(p.run_as_user);
        sc.run_as_group = sc.run_as_group.or(p.run_as_group);
        sc.run_as_non_root = sc.run_as_non_root.or(p.run_as_non_root);
        if sc.se_linux_options.is_none() {
            sc.se_linux_options = p.se_linux_options.clone();
        }
    }
    sc
}

/// Why a container's security context is refused, with upstream's messages. `pod` is
/// upstream's `name_namespace(uid)` reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecurityError {
    #[error("container's runAsUser breaks non-root policy (pod: {pod:?}, container: {container})")]
    RunAsRoot { pod: String, container: String },
    #[error("container has runAsNonRoot and image will run as root (pod: {pod:?}, container: {container})")]
    ImageRunsAsRoot { pod: String, container: String },
    #[error(
        "container has runAsNonRoot and image has non-numeric user ({user}), cannot verify user is non-root (pod: {pod:?}, container: {container})"
    )]
    NonNumericImageUser { user: String, pod: String, container: String },
    #[error("pod with UID {0:?} specified privileged container, but is disallowed")]
    PrivilegedDisallowed(String),
    #[error("container {container:?}: {source}")]
    Seccomp { container: String, source: SeccompError },
}

/// A seccomp profile that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SeccompError {
    #[error("localhostProfile must be set if seccompProfile type is Localhost.")]
    LocalhostProfileMissing,
}

/// Upstream `verifyRunAsNonRoot`, with its messages.
pub fn verify_run_as_non_root(pod: &Pod, c: &Container, image: &ImageUser) -> Result<(), SecurityError> {
    let sc = effective(pod, c);
    if sc.run_as_non_root != Some(true) {
        return Ok(());
    }
    match (sc.run_as_user, image.uid) {
        (Some(0), _) => Err(SecurityError::RunAsRoot { pod: spec::format_pod(pod), container: c.name.clone() }),
        (Some(_), _) => Ok(()),
        (None, Some(0)) => {
            Err(SecurityError::ImageRunsAsRoot { pod: spec::format_pod(pod), container: c.name.clone() })
        }
        (None, None) if !image.username.is_empty() => Err(SecurityError::NonNumericImageUser {
            user: image.username.clone(),
            pod: spec::format_pod(pod),
            container: c.name.clone(),
        }),
        _ => Ok(()),
    }
}

/// Upstream `getSeccompProfile`: the container's profile, else the pod's, else RuntimeDefault
/// with `seccompDefault`, else Unconfined.
pub fn seccomp(
    pod: Option<&SeccompProfile>,
    container: Option<&SeccompProfile>,
    node: &NodeSecurity,
) -> Result<api::SecurityProfile, SeccompError> {
    use api::security_profile::ProfileType;
    let profile =
        |t: ProfileType, localhost_ref: String| api::SecurityProfile { profile_type: t as i32, localhost_ref };
    let Some(p) = container.or(pod) else {
        let t = if node.seccomp_default { ProfileType::RuntimeDefault } else { ProfileType::Unconfined };
        return Ok(profile(t, String::new()));
    };
    match p.type_.as_str() {
        "RuntimeDefault" => Ok(profile(ProfileType::RuntimeDefault, String::new())),
        "Localhost" => match p.localhost_profile.as_deref().filter(|l| !l.is_empty()) {
            Some(l) => Ok(profile(ProfileType::Localhost, node.seccomp_root.join(l).to_string_lossy().into_owned())),
            None => Err(SeccompError::LocalhostProfileMissing),
        },
        _ => Ok(profile(ProfileType::Unconfined, String::new())),
    }
}

/// Pod supplemental groups: fsGroup first, then supplementalGroups, as upstream.
fn supplemental_groups(pod: &Pod) -> Vec<i64> {
    let Some(p) = pod_sc(pod) else { return Vec::new() };
    p.fs_group.into_iter().chain(p.supplemental_groups.iter().flatten().copied()).collect()
}

fn is_privileged(c: &Container) -> bool {
    c.security_context.as_ref().and_then(|s| s.privileged).unwrap_or(false)
}

/// The container's CRI security context (namespace options are added by the caller).
pub fn container(
    pod: &Pod,
    c: &Container,
    image: &ImageUser,
    node: &NodeSecurity,
) -> Result<api::LinuxContainerSecurityContext, SecurityError> {
    if is_privileged(c) && !node.allow_privileged {
        return Err(SecurityError::PrivilegedDisallowed(spec::uid(pod).to_string()));
    }
    verify_run_as_non_root(pod, c, image)?;
    let sc = effective(pod, c);
    let (run_as_user, run_as_username) = match (sc.run_as_user, image.uid) {
        (Some(uid), _) => (Some(uid), String::new()),
        (None, Some(uid)) => (Some(uid), String::new()),
        (None, None) => (None, image.username.clone()),
    };
    let caps = sc.capabilities.as_ref();
    let proc_unmasked = sc.proc_mount.as_deref() == Some("Unmasked");
    let paths = |list: &[&str]| if proc_unmasked { Vec::new() } else { list.iter().map(|p| p.to_string()).collect() };
    let seccomp = seccomp(
        pod_sc(pod).and_then(|p| p.seccomp_profile.as_ref()),
        c.security_context.as_ref().and_then(|s| s.seccomp_profile.as_ref()),
        node,
    )
    .map_err(|source| SecurityError::Seccomp { container: c.name.clone(), source })?;
    Ok(api::LinuxContainerSecurityContext {
        capabilities: caps.map(|c| api::Capability {
            add_capabilities: c.add.clone().unwrap_or_default(),
            drop_capabilities: c.drop.clone().unwrap_or_default(),
            ..Default::default()
        }),
        privileged: sc.privileged.unwrap_or(false),
        selinux_options: selinux(sc.se_linux_options.as_ref()),
        run_as_user: run_as_user.map(|value| api::Int64Value { value }),
        run_as_group: sc.run_as_group.map(|value| api::Int64Value { value }),
        run_as_username,
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        supplemental_groups: supplemental_groups(pod),
        // Upstream sets no_new_privs only when allowPrivilegeEscalation is explicitly false.
        no_new_privs: sc.allow_privilege_escalation == Some(false),
        masked_paths: paths(MASKED_PATHS),
        readonly_paths: paths(READONLY_PATHS),
        seccomp: Some(seccomp),
        ..Default::default()
    })
}

fn selinux(o: Option<&k8s_openapi::api::core::v1::SELinuxOptions>) -> Option<api::SeLinuxOption> {
    o.map(|o| api::SeLinuxOption {
        user: o.user.clone().unwrap_or_default(),
        role: o.role.clone().unwrap_or_default(),
        r#type: o.type_.clone().unwrap_or_default(),
        level: o.level.clone().unwrap_or_default(),
    })
}

/// The sandbox's CRI security context (namespace options are added by the caller): the pod's
/// user and groups, privileged when any container is, the pod-level seccomp profile.
pub fn sandbox(pod: &Pod, node: &NodeSecurity) -> Result<api::LinuxSandboxSecurityContext, SeccompError> {
    let p = pod_sc(pod);
    let all = || spec::init_containers(pod).iter().chain(spec::containers(pod));
    Ok(api::LinuxSandboxSecurityContext {
        selinux_options: selinux(p.and_then(|p| p.se_linux_options.as_ref())),
        run_as_user: p.and_then(|p| p.run_as_user).map(|value| api::Int64Value { value }),
        run_as_group: p.and_then(|p| p.run_as_group).map(|value| api::Int64Value { value }),
        supplemental_groups: supplemental_groups(pod),
        privileged: all().any(is_privileged),
        seccomp: Some(seccomp(p.and_then(|p| p.seccomp_profile.as_ref()), None, node)?),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Capabilities, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn node() -> NodeSecurity<'static> {
        NodeSecurity {
            seccomp_default: false,
            allow_privileged: true,
            seccomp_root: Path::new("/var/lib/kubelet/seccomp"),
        }
    }
    const ROOT: ImageUser = ImageUser { uid: Some(0), username: String::new() };

    fn pod(pod_sc: PodSecurityContext, sc: Option<SecurityContext>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                security_context: Some(pod_sc),
                containers: vec![Container { name: "main".into(), security_context: sc, ..Default::default() }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn main(p: &Pod) -> &Container {
        &p.spec.as_ref().unwrap().containers[0]
    }

    #[test]
    fn image_without_user_is_root() {
        assert_eq!(ImageUser::of(None).uid, Some(0));
        let named = api::Image { username: "nginx".into(), ..Default::default() };
        assert_eq!(ImageUser::of(Some(&named)), ImageUser { uid: None, username: "nginx".into() });
        let numbered = api::Image { uid: Some(api::Int64Value { value: 101 }), ..Default::default() };
        assert_eq!(ImageUser::of(Some(&numbered)).uid, Some(101));
        assert_eq!(ImageUser::of(Some(&api::Image::default())).uid, Some(0));
    }

    #[test]
    fn run_as_non_root_is_checked_against_the_image() {
        let non_root = PodSecurityContext { run_as_non_root: Some(true), ..Default::default() };
        let p = pod(non_root.clone(), None);
        assert_eq!(
            verify_run_as_non_root(&p, main(&p), &ROOT).unwrap_err().to_string(),
            "container has runAsNonRoot and image will run as root (pod: \"web_default(u1)\", container: main)"
        );
        let named = ImageUser { uid: None, username: "app".into() };
        assert!(
            verify_run_as_non_root(&p, main(&p), &named).unwrap_err().to_string().contains("non-numeric user (app)")
        );
        assert!(verify_run_as_non_root(&p, main(&p), &ImageUser { uid: Some(1000), username: String::new() }).is_ok());

        let as_1000 = SecurityContext { run_as_user: Some(1000), ..Default::default() };
        let p = pod(non_root.clone(), Some(as_1000));
        assert!(verify_run_as_non_root(&p, main(&p), &ROOT).is_ok(), "runAsUser decides over the image");
        let as_root = SecurityContext { run_as_user: Some(0), ..Default::default() };
        let p = pod(non_root, Some(as_root));
        assert!(
            verify_run_as_non_root(&p, main(&p), &ROOT)
                .unwrap_err()
                .to_string()
                .contains("runAsUser breaks non-root policy")
        );
        let allowed = SecurityContext { run_as_non_root: Some(false), ..Default::default() };
        let p = pod(PodSecurityContext { run_as_non_root: Some(true), ..Default::default() }, Some(allowed));
        assert!(verify_run_as_non_root(&p, main(&p), &ROOT).is_ok(), "the container's setting wins");
    }

    #[test]
    fn container_fields_win_over_the_pod() {
        let pod_sc = PodSecurityContext {
            run_as_user: Some(1000),
            run_as_group: Some(2000),
            fs_group: Some(3000),
            supplemental_groups: Some(vec![4000]),
            ..Default::default()
        };
        let sc = SecurityContext {
            run_as_user: Some(1001),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities { add: Some(vec!["NET_ADMIN".into()]), drop: Some(vec!["ALL".into()]) }),
            ..Default::default()
        };
        let p = pod(pod_sc, Some(sc));
        let c = container(&p, main(&p), &ROOT, &node()).unwrap();
        assert_eq!(c.run_as_user.unwrap().value, 1001);
        assert_eq!(c.run_as_group.unwrap().value, 2000);
        assert_eq!(c.supplemental_groups, [3000, 4000], "fsGroup first");
        assert!(c.readonly_rootfs && c.no_new_privs && !c.privileged);
        assert_eq!(c.capabilities.as_ref().unwrap().add_capabilities, ["NET_ADMIN"]);
        assert_eq!(c.capabilities.unwrap().drop_capabilities, ["ALL"]);
        assert!(c.masked_paths.contains(&"/proc/kcore".to_string()));
        assert!(c.readonly_paths.contains(&"/proc/sys".to_string()));
    }

    #[test]
    fn image_user_fills_in_and_defaults_are_upstream() {
        let p = pod(PodSecurityContext::default(), None);
        let image = ImageUser { uid: None, username: "app".into() };
        let c = container(&p, main(&p), &image, &node()).unwrap();
        assert_eq!((c.run_as_user, c.run_as_username.as_str()), (None, "app"));
        assert!(!c.no_new_privs, "allowPrivilegeEscalation unset leaves no_new_privs off");
        let unmasked = SecurityContext { proc_mount: Some("Unmasked".into()), ..Default::default() };
        let p = pod(PodSecurityContext::default(), Some(unmasked));
        assert!(container(&p, main(&p), &ROOT, &node()).unwrap().masked_paths.is_empty());
    }

    #[test]
    fn privileged_needs_permission() {
        let sc = SecurityContext { privileged: Some(true), ..Default::default() };
        let p = pod(PodSecurityContext::default(), Some(sc));
        assert!(container(&p, main(&p), &ROOT, &node()).unwrap().privileged);
        assert!(sandbox(&p, &node()).unwrap().privileged);
        let strict = NodeSecurity { allow_privileged: false, ..node() };
        let e = container(&p, main(&p), &ROOT, &strict).unwrap_err();
        assert_eq!(e.to_string(), "pod with UID \"u1\" specified privileged container, but is disallowed");
    }

    #[test]
    fn seccomp_resolution() {
        use api::security_profile::ProfileType;
        let sp =
            |t: &str, l: Option<&str>| SeccompProfile { type_: t.into(), localhost_profile: l.map(str::to_string) };
        let kind = |p: api::SecurityProfile| ProfileType::try_from(p.profile_type).unwrap();
        assert_eq!(kind(seccomp(None, None, &node()).unwrap()), ProfileType::Unconfined);
        let defaulted = NodeSecurity { seccomp_default: true, ..node() };
        assert_eq!(kind(seccomp(None, None, &defaulted).unwrap()), ProfileType::RuntimeDefault);
        let pod_rd = sp("RuntimeDefault", None);
        assert_eq!(kind(seccomp(Some(&pod_rd), None, &node()).unwrap()), ProfileType::RuntimeDefault);
        let unconfined = sp("Unconfined", None);
        assert_eq!(kind(seccomp(Some(&pod_rd), Some(&unconfined), &node()).unwrap()), ProfileType::Unconfined);
        let local = seccomp(None, Some(&sp("Localhost", Some("p.json"))), &node()).unwrap();
        assert_eq!(local.localhost_ref, "/var/lib/kubelet/seccomp/p.json");
        assert!(
            seccomp(None, Some(&sp("Localhost", None)), &node()).unwrap_err().to_string().contains("localhostProfile")
        );
    }
}
