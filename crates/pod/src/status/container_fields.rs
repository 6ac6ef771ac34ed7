//! Container status fields the Go kubelet v1.34 fills besides the state: the volume mounts, the
//! identity of the first process and the resources in effect.

use k8s_openapi::api::core::v1::{
    Container, ContainerUser, LinuxContainerUser, ResourceRequirements, VolumeMount, VolumeMountStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::LinuxUser;
use crate::recursive_read_only;
use crate::resources::CgroupValues;
use gantry_vocab::quantity::{format_binary_bytes, format_decimal_milli};

/// `volumeMounts`, one per mount of the spec (gate `RecursiveReadOnlyMounts`, GA in 1.33).
/// A read-only mount says whether it is recursively read-only: `Enabled` where the mount asks
/// for it and the runtime handler supports it (`rro_supported`), else `Disabled` (also for a
/// request that cannot be honoured: that container is refused before it runs).
pub fn volume_mounts(c: &Container, rro_supported: bool) -> Option<Vec<VolumeMountStatus>> {
    let mounts = c.volume_mounts.as_deref().unwrap_or_default();
    (!mounts.is_empty()).then(|| mounts.iter().map(|m| volume_mount(m, rro_supported)).collect())
}

fn volume_mount(m: &VolumeMount, rro_supported: bool) -> VolumeMountStatus {
    let read_only = m.read_only == Some(true);
    let recursive = recursive_read_only::resolve(m, rro_supported) == Ok(true);
    VolumeMountStatus {
        name: m.name.clone(),
        mount_path: m.mount_path.clone(),
        // `readOnly` is omitted when false, as the Go type's `omitempty` does.
        read_only: read_only.then_some(true),
        recursive_read_only: read_only.then(|| if recursive { "Enabled" } else { "Disabled" }.to_string()),
    }
}

/// `user` (gate `SupplementalGroupsPolicy`, beta and on in 1.33+): the identity the runtime
/// reports for the first process, absent when it reports none (containerd before 2.0).
pub fn user(user: Option<&LinuxUser>) -> Option<ContainerUser> {
    user.map(|u| ContainerUser {
        linux: Some(LinuxContainerUser {
            uid: u.uid,
            gid: u.gid,
            supplemental_groups: (!u.supplemental_groups.is_empty()).then(|| u.supplemental_groups.clone()),
        }),
    })
}

/// `resources` of a running container (gate `InPlacePodVerticalScaling`, beta and on in 1.33+):
/// the allocated requests and limits (the worker passes the pod with its allocation), with the
/// CPU limit, memory limit and CPU request replaced by what the runtime reports it applied.
/// `allocatedResources` is not reported: its gate (`InPlacePodVerticalScalingAllocatedStatus`)
/// is deprecated and off in 1.34.
pub fn resources(c: &Container, applied: &CgroupValues) -> ResourceRequirements {
    let spec = c.resources.clone().unwrap_or_default();
    let limits = spec.limits.map(|mut limits| {
        if let Some(milli) = applied_cpu_limit(applied) {
            limits.insert("cpu".to_string(), Quantity(format_decimal_milli(milli.into())));
        }
        if applied.memory_limit > 0 {
            limits.insert("memory".to_string(), Quantity(format_binary_bytes(applied.memory_limit.into())));
        }
        limits
    });
    let requests = spec.requests.map(|mut requests| {
        if let Some(milli) = applied_cpu_request(applied) {
            requests.insert("cpu".to_string(), Quantity(format_decimal_milli(milli.into())));
        }
        requests
    });
    ResourceRequirements { limits, requests, ..spec }
}

/// Upstream `quotaToMilliCPU`: no limit without a period or with quota -1 (unlimited).
fn applied_cpu_limit(v: &CgroupValues) -> Option<i64> {
    if v.cpu_period <= 0 || v.cpu_quota == -1 {
        return None;
    }
    Some(v.cpu_quota * 1000 / v.cpu_period).filter(|m| *m > 0)
}

/// Upstream `sharesToMilliCPU`: shares below the minimum (2) mean "not reported".
fn applied_cpu_request(v: &CgroupValues) -> Option<i64> {
    const MIN_SHARES: i64 = 2;
    if v.cpu_shares < MIN_SHARES {
        return None;
    }
    Some((v.cpu_shares * 1000 + 1023) / 1024).filter(|m| *m > 0)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity(s.to_string())
    }

    fn container(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        let list = |l: &[(&str, &str)]| {
            (!l.is_empty()).then(|| l.iter().map(|(k, v)| (k.to_string(), q(v))).collect::<BTreeMap<_, _>>())
        };
        Container {
            name: "a".into(),
            resources: Some(ResourceRequirements { requests: list(requests), limits: list(limits), claims: None }),
            ..Default::default()
        }
    }

    #[test]
    fn read_only_mounts_report_whether_they_are_recursively_read_only() {
        let mount = |name: &str, read_only: bool, mode: Option<&str>| VolumeMount {
            name: name.into(),
            mount_path: format!("/{name}"),
            read_only: read_only.then_some(true),
            recursive_read_only: mode.map(str::to_string),
            ..Default::default()
        };
        let c = Container {
            volume_mounts: Some(vec![
                mount("rw", false, None),
                mount("ro", true, None),
                mount("if-possible", true, Some("IfPossible")),
                mount("enabled", true, Some("Enabled")),
                mount("disabled", true, Some("Disabled")),
            ]),
            ..Default::default()
        };
        let modes = |supported| -> Vec<Option<String>> {
            volume_mounts(&c, supported).unwrap().into_iter().map(|m| m.recursive_read_only).collect()
        };
        let s = |m: &str| Some(m.to_string());
        assert_eq!(modes(true), [None, s("Disabled"), s("Enabled"), s("Enabled"), s("Disabled")]);
        assert_eq!(modes(false), [None, s("Disabled"), s("Disabled"), s("Disabled"), s("Disabled")]);
        let mounts = volume_mounts(&c, false).unwrap();
        assert_eq!(mounts[0], VolumeMountStatus { name: "rw".into(), mount_path: "/rw".into(), ..Default::default() });
        assert_eq!(mounts[1].read_only, Some(true));
        assert_eq!(volume_mounts(&Container::default(), true), None);
    }

    #[test]
    fn user_mirrors_the_runtime_and_omits_empty_groups() {
        assert_eq!(user(None), None);
        let u = user(Some(&LinuxUser { uid: 1000, gid: 3000, supplemental_groups: vec![3000, 4000] })).unwrap();
        let linux = u.linux.unwrap();
        assert_eq!((linux.uid, linux.gid), (1000, 3000));
        assert_eq!(linux.supplemental_groups, Some(vec![3000, 4000]));
        let root = user(Some(&LinuxUser::default())).unwrap().linux.unwrap();
        assert_eq!(root.supplemental_groups, None);
    }

    #[test]
    fn resources_take_cpu_and_memory_from_the_runtime() {
        let c = container(
            &[("cpu", "250m"), ("memory", "64Mi"), ("ephemeral-storage", "1Gi")],
            &[("cpu", "1"), ("memory", "128Mi")],
        );
        // What containerd reports for a limit of 500m/256Mi and a request of 100m: the
        // runtime's values win over the spec.
        let applied = CgroupValues {
            cpu_shares: 102,
            cpu_quota: 50_000,
            cpu_period: 100_000,
            memory_limit: 256 << 20,
            pids_limit: 0,
            memory_min: 0,
        };
        let r = resources(&c, &applied);
        let limits = r.limits.unwrap();
        assert_eq!(limits["cpu"], q("500m"));
        assert_eq!(limits["memory"], q("256Mi"));
        let requests = r.requests.unwrap();
        assert_eq!(requests["cpu"], q("100m"));
        assert_eq!(requests["memory"], q("64Mi"), "memory requests are not enforced, so the spec's stand");
        assert_eq!(requests["ephemeral-storage"], q("1Gi"));
    }

    #[test]
    fn resources_keep_the_spec_when_the_runtime_reports_nothing() {
        let c = container(&[("cpu", "250m")], &[("cpu", "1")]);
        let unlimited = CgroupValues { cpu_quota: -1, cpu_period: 100_000, ..Default::default() };
        let r = resources(&c, &unlimited);
        assert_eq!(r.limits.unwrap()["cpu"], q("1"));
        assert_eq!(r.requests.unwrap()["cpu"], q("250m"));
        let none = resources(&Container::default(), &CgroupValues::default());
        assert_eq!(none, ResourceRequirements::default(), "reported as `resources: {{}}`");
    }
}
