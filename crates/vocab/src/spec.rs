//! Read-only views of a pod spec with the defaults the API server would have applied.

use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod, PodSpec, Volume};
use md5::{Digest, Md5};

/// Pod restart policy (`spec.restartPolicy`, default Always).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    pub fn of(spec: &PodSpec) -> Self {
        match spec.restart_policy.as_deref() {
            Some("OnFailure") => RestartPolicy::OnFailure,
            Some("Never") => RestartPolicy::Never,
            _ => RestartPolicy::Always,
        }
    }

    /// Whether a container that exited with `exit_code` is started again.
    pub fn restarts(self, exit_code: i32) -> bool {
        match self {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => exit_code != 0,
            RestartPolicy::Never => false,
        }
    }
}

/// `imagePullPolicy` with the upstream default: Always for `:latest` or untagged images,
/// IfNotPresent otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    pub fn of(container: &Container) -> Self {
        match container.image_pull_policy.as_deref() {
            Some("Always") => PullPolicy::Always,
            Some("IfNotPresent") => PullPolicy::IfNotPresent,
            Some("Never") => PullPolicy::Never,
            _ => default_pull_policy(container.image.as_deref().unwrap_or_default()),
        }
    }
}

fn default_pull_policy(image: &str) -> PullPolicy {
    if image.contains('@') {
        return PullPolicy::IfNotPresent;
    }
    // The tag is after the last ':' that follows the last '/', so "host:5000/app" has none.
    let last_segment = image.rsplit('/').next().unwrap_or(image);
    match last_segment.split_once(':') {
        Some((_, "latest")) | None => PullPolicy::Always,
        Some(_) => PullPolicy::IfNotPresent,
    }
}

/// Grace period for stopping the pod's containers: the smaller of the deletion's and the
/// spec's, clamped to the upstream minimum of 2 s.
pub fn termination_grace_seconds(pod: &Pod) -> i64 {
    let from_spec = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(30);
    let requested = match pod.metadata.deletion_grace_period_seconds {
        Some(deletion) => deletion.min(from_spec),
        None => from_spec,
    };
    requested.max(MIN_GRACE_SECONDS)
}

pub const MIN_GRACE_SECONDS: i64 = 2;

/// The grace period left to stop a pod, at `now_nanos` (since the Unix epoch). A pod the API
/// is deleting must be gone by its `deletionTimestamp` (the API server sets it to the deletion
/// time plus the grace period, cut to whole seconds, so the end of that second counts), so an
/// agent that restarts in the middle of a termination finishes the original grace period
/// instead of starting a new one. Never more than [`termination_grace_seconds`] (a fresh
/// deletion gets all of it, and a node clock behind the API server's gains nothing), never
/// less than the 2 s minimum; other pods get the full grace period.
pub fn remaining_grace_seconds(pod: &Pod, now_nanos: i64) -> i64 {
    const SECOND: i128 = 1_000_000_000;
    let full = termination_grace_seconds(pod);
    let Some(deadline) = &pod.metadata.deletion_timestamp else { return full };
    let left = deadline.0.as_nanosecond() + SECOND - i128::from(now_nanos);
    // Whole seconds, rounded up.
    let left = i64::try_from(left.div_euclid(SECOND) + i128::from(left.rem_euclid(SECOND) > 0));
    left.unwrap_or(full).clamp(MIN_GRACE_SECONDS, full)
}

/// A stable hash of a container's spec; a running container whose hash differs from its
/// spec's is replaced. Resources are left out, as upstream hashes containers since in-place
/// resize: a resize is applied to the running container, not by replacing it.
pub fn container_hash(container: &Container) -> String {
    hash_of(&Container { resources: None, ..container.clone() })
}

/// Whether a running container labelled `running_hash` still matches its spec. Gantry
/// releases before in-place resize hashed the resources too; accepting that hash as well
/// keeps an upgrade from replacing every running container.
pub fn hash_matches(container: &Container, running_hash: &str) -> bool {
    running_hash == container_hash(container) || running_hash == hash_of(container)
}

fn hash_of(container: &Container) -> String {
    let json = serde_json::to_vec(container).unwrap_or_default();
    hex::encode(&Md5::digest(&json)[..8])
}

pub fn init_containers(pod: &Pod) -> &[Container] {
    pod.spec.as_ref().and_then(|s| s.init_containers.as_deref()).unwrap_or_default()
}

/// A native sidecar (KEP-753): an init container with `restartPolicy: Always`, which keeps
/// running next to the regular containers instead of running to completion.
pub fn is_sidecar(init_container: &Container) -> bool {
    init_container.restart_policy.as_deref() == Some("Always")
}

/// The pod's sidecars, in spec order.
pub fn sidecars(pod: &Pod) -> impl DoubleEndedIterator<Item = &Container> {
    init_containers(pod).iter().filter(|c| is_sidecar(c))
}

pub fn containers(pod: &Pod) -> &[Container] {
    pod.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default()
}

pub fn ephemeral_containers(pod: &Pod) -> &[EphemeralContainer] {
    pod.spec.as_ref().and_then(|s| s.ephemeral_containers.as_deref()).unwrap_or_default()
}

/// An ephemeral container as a [`Container`]: the fields both share (all but
/// `targetContainerName`), so it is configured and started like any other container.
pub fn ephemeral_as_container(e: &EphemeralContainer) -> Container {
    // Same field names and shapes by API design; the container's decoder skips the target.
    serde_json::to_value(e).and_then(serde_json::from_value).unwrap_or_else(|_| Container {
        name: e.name.clone(),
        image: e.image.clone(),
        ..Default::default()
    })
}

/// Any container of the pod by name (init, regular or ephemeral; names are unique across all).
pub fn any_container(pod: &Pod, name: &str) -> Option<Container> {
    let listed = init_containers(pod).iter().chain(containers(pod)).find(|c| c.name == name).cloned();
    listed.or_else(|| ephemeral_containers(pod).iter().find(|e| e.name == name).map(ephemeral_as_container))
}

pub fn restart_policy(pod: &Pod) -> RestartPolicy {
    pod.spec.as_ref().map_or(RestartPolicy::Always, RestartPolicy::of)
}

pub fn host_network(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false)
}

pub fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

pub fn name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

pub fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// `namespace/name`, the way pods are named in logs.
pub fn full_name(pod: &Pod) -> String {
    format!("{}/{}", namespace(pod), name(pod))
}

/// `name_namespace(uid)`, the way upstream's messages name a pod (its `format.Pod`).
pub fn format_pod(pod: &Pod) -> String {
    format!("{}_{}({})", name(pod), namespace(pod), uid(pod))
}

/// The claim behind the pod's volume `v`: a `persistentVolumeClaim`'s, or the one the ephemeral
/// volume controller creates for a generic ephemeral volume (upstream's `ephemeral.VolumeClaimName`,
/// `<pod name>-<volume name>`).
pub fn claim_name(pod: &Pod, v: &Volume) -> Option<String> {
    if let Some(claim) = &v.persistent_volume_claim {
        Some(claim.claim_name.clone())
    } else {
        v.ephemeral.as_ref().map(|_| format!("{}-{}", name(pod), v.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(image: &str, policy: Option<&str>) -> Container {
        Container {
            name: "c".into(),
            image: Some(image.into()),
            image_pull_policy: policy.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn pull_policy_defaults_follow_the_tag() {
        assert_eq!(PullPolicy::of(&container("busybox", None)), PullPolicy::Always);
        assert_eq!(PullPolicy::of(&container("busybox:latest", None)), PullPolicy::Always);
        assert_eq!(PullPolicy::of(&container("registry:5000/busybox", None)), PullPolicy::Always);
        assert_eq!(PullPolicy::of(&container("registry:5000/busybox:1.36", None)), PullPolicy::IfNotPresent);
        assert_eq!(PullPolicy::of(&container("busybox@sha256:abc", None)), PullPolicy::IfNotPresent);
        assert_eq!(PullPolicy::of(&container("busybox", Some("Never"))), PullPolicy::Never);
    }

    #[test]
    fn pods_are_named_as_upstream_formats_them() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("web".into());
        pod.metadata.namespace = Some("prod".into());
        pod.metadata.uid = Some("u1".into());
        assert_eq!(format_pod(&pod), "web_prod(u1)");
    }

    #[test]
    fn restart_policy_decides_per_exit_code() {
        assert!(RestartPolicy::Always.restarts(0));
        assert!(!RestartPolicy::OnFailure.restarts(0));
        assert!(RestartPolicy::OnFailure.restarts(1));
        assert!(!RestartPolicy::Never.restarts(1));
    }

    #[test]
    fn grace_period_prefers_deletion_and_clamps_to_two_seconds() {
        let mut pod = Pod {
            spec: Some(PodSpec { termination_grace_period_seconds: Some(0), ..Default::default() }),
            ..Default::default()
        };
        assert_eq!(termination_grace_seconds(&pod), 2);
        pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(15);
        assert_eq!(termination_grace_seconds(&pod), 15);
        pod.metadata.deletion_grace_period_seconds = Some(5);
        assert_eq!(termination_grace_seconds(&pod), 5);
        pod.metadata.deletion_grace_period_seconds = Some(60);
        assert_eq!(termination_grace_seconds(&pod), 15, "the smaller of deletion and spec");
        pod.spec = None;
        pod.metadata.deletion_grace_period_seconds = None;
        assert_eq!(termination_grace_seconds(&pod), 30);
    }

    #[test]
    fn a_deleted_pod_gets_what_is_left_of_its_grace_period() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let second = 1_000_000_000;
        let mut pod = Pod {
            spec: Some(PodSpec { termination_grace_period_seconds: Some(30), ..Default::default() }),
            ..Default::default()
        };
        let deleted_at = 1_700_000_000 * second;
        assert_eq!(remaining_grace_seconds(&pod, deleted_at), 30, "not being deleted: the full period");
        pod.metadata.deletion_grace_period_seconds = Some(30);
        let deadline = k8s_openapi::jiff::Timestamp::from_second(1_700_000_030).unwrap();
        pod.metadata.deletion_timestamp = Some(Time(deadline));
        assert_eq!(remaining_grace_seconds(&pod, deleted_at), 30);
        // Deleted at 0.9 s: the deadline 30.9 s reads 30 s; all of the grace period is left.
        assert_eq!(remaining_grace_seconds(&pod, deleted_at + second * 9 / 10), 30, "a fresh deletion");
        assert_eq!(remaining_grace_seconds(&pod, deleted_at + 11 * second + 1), 20, "rounded up");
        assert_eq!(remaining_grace_seconds(&pod, deleted_at + 29 * second), 2, "at least the minimum");
        assert_eq!(remaining_grace_seconds(&pod, deleted_at + 3600 * second), 2, "past the deadline");
        assert_eq!(remaining_grace_seconds(&pod, deleted_at - 60 * second), 30, "a clock behind gains nothing");
    }

    #[test]
    fn ephemeral_containers_convert_to_containers() {
        let e = EphemeralContainer {
            name: "debugger".into(),
            image: Some("busybox".into()),
            target_container_name: Some("app".into()),
            stdin: Some(true),
            tty: Some(true),
            command: Some(vec!["sh".into()]),
            ..Default::default()
        };
        let c = ephemeral_as_container(&e);
        assert_eq!((c.name.as_str(), c.image.as_deref()), ("debugger", Some("busybox")));
        assert_eq!((c.stdin, c.tty, c.command.clone()), (Some(true), Some(true), Some(vec!["sh".to_string()])));
        let pod = Pod {
            spec: Some(PodSpec { ephemeral_containers: Some(vec![e]), ..Default::default() }),
            ..Default::default()
        };
        assert_eq!(any_container(&pod, "debugger"), Some(c));
        assert_eq!(any_container(&pod, "other"), None);
    }

    #[test]
    fn container_hash_changes_with_the_spec() {
        let a = container("busybox:1", None);
        let mut b = a.clone();
        assert_eq!(container_hash(&a), container_hash(&b));
        b.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            limits: Some(
                [("cpu".to_string(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()))].into(),
            ),
            ..Default::default()
        });
        assert_eq!(container_hash(&a), container_hash(&b), "a resize is not a spec change");
        let before_resize_support = hash_of(&b);
        assert_ne!(before_resize_support, container_hash(&b));
        assert!(hash_matches(&b, &before_resize_support), "an upgrade keeps running containers");
        assert!(hash_matches(&b, &container_hash(&a)));
        b.args = Some(vec!["x".into()]);
        assert_ne!(container_hash(&a), container_hash(&b));
        assert!(!hash_matches(&b, &container_hash(&a)));
        assert!(!hash_matches(&b, &before_resize_support));
    }
}
