//! Requests and limits → the cgroup values a container or a whole pod gets, with upstream's
//! conversions: CPU shares from the request (min 2), CFS quota from the limit over a 100 ms
//! period (min 1 ms), memory limit in bytes.

use k8s_openapi::api::core::v1::{Container, Pod};

use gantry_vocab::spec;

use crate::qos::{self, QosClass};
use crate::requests::{cpu, memory};

pub const CPU_PERIOD_US: i64 = 100_000;
const MIN_SHARES: i64 = 2;
const MAX_SHARES: i64 = 262_144;
const SHARES_PER_CPU: i128 = 1024;
const MIN_QUOTA_US: i64 = 1000;

/// What goes into a cgroup; zero means "leave unset".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CgroupValues {
    pub cpu_shares: i64,
    pub cpu_quota: i64,
    pub cpu_period: i64,
    pub memory_limit: i64,
    /// `pids.max`; only pod cgroups get one (`podPidsLimit`).
    pub pids_limit: i64,
    /// cgroup v2 `memory.min` (MemoryQoS): pod and QoS cgroups only.
    pub memory_min: i64,
}

/// Upstream `MilliCPUToShares`.
pub fn shares(milli_cpu: i128) -> i64 {
    if milli_cpu <= 0 {
        return MIN_SHARES;
    }
    ((milli_cpu * SHARES_PER_CPU / 1000) as i64).clamp(MIN_SHARES, MAX_SHARES)
}

/// The cgroup v2 `cpu.weight` for CPU shares, with the linear formula the Go kubelet uses for
/// the cgroups it manages itself (kubepods, QoS levels, pods): 2 → 1, 1024 → 39, 262144 → 10000.
pub fn cpu_weight(shares: i64) -> i64 {
    if shares >= MAX_SHARES {
        return 10_000;
    }
    1 + ((shares.max(MIN_SHARES) - MIN_SHARES) * 9999) / (MAX_SHARES - MIN_SHARES)
}

/// Upstream `MilliCPUToQuota`: 0 (no quota) without a limit.
pub fn quota(milli_cpu: i128, period: i64) -> i64 {
    if milli_cpu <= 0 {
        return 0;
    }
    ((milli_cpu * period as i128 / 1000) as i64).max(MIN_QUOTA_US)
}

/// A container's cgroup values (upstream `calculateLinuxResources`).
pub fn container(c: &Container) -> CgroupValues {
    let cpu = cpu(c);
    CgroupValues {
        cpu_shares: shares(cpu.request.unwrap_or(0)),
        cpu_quota: quota(cpu.limit.unwrap_or(0), CPU_PERIOD_US),
        cpu_period: CPU_PERIOD_US,
        memory_limit: memory(c).limit.unwrap_or(0) as i64,
        ..Default::default()
    }
}

/// The pod's total of one amount (upstream `PodRequests`/`PodLimits`): regular containers and
/// sidecars run together, so they add up; a regular init container runs alone next to the
/// sidecars declared before it. The pod needs the larger of the two.
pub(crate) fn pod_total(pod: &Pod, amount: impl Fn(&Container) -> Option<i128>) -> i128 {
    let mut running: i128 = spec::containers(pod).iter().filter_map(&amount).sum();
    let mut sidecars_so_far = 0;
    let mut init_peak = 0;
    for c in spec::init_containers(pod) {
        let own = amount(c).unwrap_or(0);
        let use_while_init = if spec::is_sidecar(c) {
            running += own;
            sidecars_so_far += own;
            sidecars_so_far
        } else {
            sidecars_so_far + own
        };
        init_peak = init_peak.max(use_while_init);
    }
    running.max(init_peak)
}

/// The whole pod's values for the sandbox config (upstream `calculateSandboxResources`), for
/// runtimes that size a VM or a pod-level cgroup themselves; independent of the QoS class.
pub fn sandbox(pod: &Pod) -> CgroupValues {
    CgroupValues {
        cpu_shares: shares(pod_total(pod, |c| cpu(c).request)),
        cpu_quota: quota(pod_total(pod, |c| cpu(c).limit), CPU_PERIOD_US),
        cpu_period: CPU_PERIOD_US,
        memory_limit: pod_total(pod, |c| memory(c).limit) as i64,
        ..Default::default()
    }
}

/// The pod cgroup's values (upstream `ResourceConfigForPod`): Guaranteed pods get shares, quota
/// and memory limit; Burstable pods get shares, and a quota or memory limit only when every
/// container sets that limit; BestEffort pods get the minimum shares.
pub fn pod(pod: &Pod) -> CgroupValues {
    let all = || spec::init_containers(pod).iter().chain(spec::containers(pod));
    let cpu_shares = shares(pod_total(pod, |c| cpu(c).request));
    let cpu_quota = quota(pod_total(pod, |c| cpu(c).limit), CPU_PERIOD_US);
    let memory_limit = pod_total(pod, |c| memory(c).limit) as i64;
    let cpu_limited = all().all(|c| cpu(c).limit.is_some());
    let memory_limited = all().all(|c| memory(c).limit.is_some());
    match qos::class(pod) {
        QosClass::Guaranteed => {
            CgroupValues { cpu_shares, cpu_quota, cpu_period: CPU_PERIOD_US, memory_limit, ..Default::default() }
        }
        QosClass::Burstable => CgroupValues {
            cpu_shares,
            cpu_quota: if cpu_limited { cpu_quota } else { 0 },
            cpu_period: if cpu_limited { CPU_PERIOD_US } else { 0 },
            memory_limit: if memory_limited { memory_limit } else { 0 },
            pids_limit: 0,
            memory_min: 0,
        },
        QosClass::BestEffort => CgroupValues { cpu_shares: MIN_SHARES, ..Default::default() },
    }
}

/// The page size memory.high is rounded down to.
const PAGE_SIZE: i128 = 4096;

/// A container's cgroup v2 memory protection under MemoryQoS (upstream's
/// `generateLinuxContainerResources`): `memory.min` = the request; `memory.high` = request +
/// (limit, else the node's allocatable memory, − request) × `memoryThrottlingFactor`, rounded
/// down to a page, unless request and limit are equal (no throttling for them) or it would not
/// be above the request. Returns the `unified` entries.
pub fn memory_qos(c: &Container, allocatable_memory: i128, throttling_factor: f64) -> Vec<(&'static str, String)> {
    let m = memory(c);
    let request = m.request.unwrap_or(0);
    let limit = m.limit.unwrap_or(0);
    let mut out = Vec::new();
    if request != 0 {
        out.push(("memory.min", request.to_string()));
    }
    if request != limit {
        let ceiling = if limit != 0 { limit } else { allocatable_memory };
        let high = if ceiling > 0 {
            let raw = request as f64 + (ceiling - request) as f64 * throttling_factor;
            (raw / PAGE_SIZE as f64).floor() as i128 * PAGE_SIZE
        } else {
            0
        };
        if high != 0 && high > request {
            out.push(("memory.high", high.to_string()));
        }
    }
    out
}

/// The pod's memory request in bytes (its cgroup's `memory.min` under MemoryQoS).
pub fn pod_memory_request(pod: &Pod) -> i64 {
    pod_total(pod, |c| memory(c).request) as i64
}

/// `memory.min` of the QoS levels under MemoryQoS (upstream's `setMemoryQoS`): the Burstable
/// level protects its pods' requests, `kubepods` (the Guaranteed level) the Guaranteed and the
/// Burstable pods' together. Returns (burstable, kubepods).
pub fn qos_memory_min<'a>(active: impl IntoIterator<Item = &'a Pod>) -> (i64, i64) {
    let (mut burstable, mut guaranteed) = (0, 0);
    for pod in active {
        match qos::class(pod) {
            QosClass::Burstable => burstable += pod_memory_request(pod),
            QosClass::Guaranteed => guaranteed += pod_memory_request(pod),
            QosClass::BestEffort => {}
        }
    }
    (burstable, guaranteed + burstable)
}

/// The Burstable QoS cgroup's CPU shares (upstream's `setCPUCgroupConfig`): the shares of the
/// sum of the active Burstable pods' CPU requests, the minimum (2) when they request none.
pub fn burstable_shares<'a>(active: impl IntoIterator<Item = &'a Pod>) -> i64 {
    let requested = active
        .into_iter()
        .filter(|p| qos::class(p) == QosClass::Burstable)
        .map(|p| pod_total(p, |c| cpu(c).request))
        .sum();
    shares(requested)
}

/// The size of a memory-backed volume (a `medium: Memory` emptyDir, and the tmpfs under
/// secret, downward API and projected volumes), as upstream's `calculateEmptyDirMemorySize`:
/// the node's allocatable memory, lowered to the pod cgroup's memory limit when it has one, and
/// to the volume's own `sizeLimit` when that is positive and smaller.
pub fn memory_volume_size(pod: &Pod, size_limit: Option<i128>, node_allocatable_memory: i128) -> i128 {
    let mut size = node_allocatable_memory;
    let pod_limit = i128::from(self::pod(pod).memory_limit);
    if pod_limit > 0 && pod_limit <= size {
        size = pod_limit;
    }
    if let Some(limit) = size_limit.filter(|l| *l > 0 && *l <= size) {
        size = limit;
    }
    size
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodSpec;

    use super::*;
    use crate::requests::tests::container as res;

    fn pod_of(init: Vec<Container>, containers: Vec<Container>) -> Pod {
        Pod {
            spec: Some(PodSpec { init_containers: Some(init), containers, ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn memory_volume_sizes() {
        let gi = 1i128 << 30;
        let limited = pod_of(vec![], vec![res(&[], &[("memory", "64Mi")]), res(&[], &[("memory", "64Mi")])]);
        assert_eq!(memory_volume_size(&limited, None, 4 * gi), 128 << 20, "the pod's memory limit");
        assert_eq!(memory_volume_size(&limited, Some(16 << 20), 4 * gi), 16 << 20, "a smaller sizeLimit");
        assert_eq!(memory_volume_size(&limited, Some(gi), 4 * gi), 128 << 20, "a larger sizeLimit is ignored");
        let unlimited = pod_of(vec![], vec![res(&[], &[("memory", "64Mi")]), res(&[], &[])]);
        assert_eq!(memory_volume_size(&unlimited, None, 4 * gi), 4 * gi, "no pod limit: node allocatable");
        assert_eq!(memory_volume_size(&limited, None, 100 << 20), 100 << 20, "never above allocatable");
        assert_eq!(memory_volume_size(&unlimited, Some(0), 4 * gi), 4 * gi, "sizeLimit 0 is ignored");
    }

    #[test]
    fn cpu_conversions() {
        assert_eq!(shares(0), 2);
        assert_eq!(shares(1), 2, "minimum");
        assert_eq!(shares(100), 102);
        assert_eq!(shares(1000), 1024);
        assert_eq!(shares(1_000_000), 262_144, "maximum");
        assert_eq!(quota(0, CPU_PERIOD_US), 0);
        assert_eq!(quota(5, CPU_PERIOD_US), 1000, "minimum 1 ms");
        assert_eq!(quota(250, CPU_PERIOD_US), 25_000);
        assert_eq!(quota(2000, CPU_PERIOD_US), 200_000);
    }

    #[test]
    fn shares_to_cgroup_v2_weight() {
        assert_eq!(cpu_weight(2), 1, "BestEffort");
        assert_eq!(cpu_weight(0), 1);
        assert_eq!(cpu_weight(102), 4, "100m");
        assert_eq!(cpu_weight(1024), 39, "1 CPU");
        assert_eq!(cpu_weight(262_144), 10_000);
        assert_eq!(cpu_weight(1 << 20), 10_000);
    }

    #[test]
    fn container_values() {
        let c = res(&[("cpu", "250m"), ("memory", "64Mi")], &[("cpu", "500m"), ("memory", "128Mi")]);
        let v = container(&c);
        assert_eq!(
            v,
            CgroupValues {
                cpu_shares: 256,
                cpu_quota: 50_000,
                cpu_period: 100_000,
                memory_limit: 128 << 20,
                pids_limit: 0,
                memory_min: 0
            }
        );
        let limit_only = container(&res(&[], &[("cpu", "1")]));
        assert_eq!((limit_only.cpu_shares, limit_only.cpu_quota), (1024, 100_000), "request defaults to limit");
        assert_eq!(
            container(&res(&[], &[])),
            CgroupValues { cpu_shares: 2, cpu_period: 100_000, ..Default::default() }
        );
    }

    #[test]
    fn memory_qos_of_a_container() {
        let mi = 1i128 << 20;
        let entries = |c: &Container, allocatable: i128| memory_qos(c, allocatable, 0.9);
        // Request 64Mi, limit 128Mi: high = 64Mi + 64Mi × 0.9, page-aligned.
        let c = res(&[("memory", "64Mi")], &[("memory", "128Mi")]);
        let high = ((64 * mi) as f64 + (64 * mi) as f64 * 0.9) as i128 / 4096 * 4096;
        assert_eq!(entries(&c, 0), [("memory.min", (64 * mi).to_string()), ("memory.high", high.to_string())]);
        // Request = limit (Guaranteed-like): protection only.
        let c = res(&[("memory", "64Mi")], &[("memory", "64Mi")]);
        assert_eq!(entries(&c, 0), [("memory.min", (64 * mi).to_string())]);
        // No limit: throttled below the node's allocatable memory.
        let c = res(&[("memory", "64Mi")], &[]);
        let high = ((64 * mi) as f64 + (960 * mi) as f64 * 0.9) as i128 / 4096 * 4096;
        assert_eq!(entries(&c, 1024 * mi), [("memory.min", (64 * mi).to_string()), ("memory.high", high.to_string())]);
        // Nothing requested, no limit, no allocatable known: nothing.
        assert!(entries(&res(&[], &[]), 0).is_empty());
        // A limit only (request defaults to it): protection only.
        assert_eq!(entries(&res(&[], &[("memory", "32Mi")]), 0), [("memory.min", (32 * mi).to_string())]);
    }

    #[test]
    fn qos_levels_memory_min() {
        let mi = 1i64 << 20;
        let burstable = pod_of(vec![], vec![res(&[("memory", "64Mi")], &[])]);
        let guaranteed = pod_of(vec![], vec![res(&[], &[("cpu", "1"), ("memory", "32Mi")])]);
        let best_effort = pod_of(vec![], vec![res(&[], &[])]);
        assert_eq!(qos_memory_min([&burstable, &guaranteed, &best_effort]), (64 * mi, 96 * mi));
        assert_eq!(pod_memory_request(&guaranteed), 32 * mi);
    }

    #[test]
    fn burstable_level_shares_sum_the_burstable_pods_requests() {
        let burstable = |cpu: &str| pod_of(vec![], vec![res(&[("cpu", cpu)], &[])]);
        let guaranteed = pod_of(vec![], vec![res(&[], &[("cpu", "1"), ("memory", "64Mi")])]);
        let best_effort = pod_of(vec![], vec![res(&[], &[])]);
        assert_eq!(burstable_shares([&burstable("100m"), &burstable("200m")]), 307, "300m");
        assert_eq!(burstable_shares([&burstable("100m"), &guaranteed, &best_effort]), 102, "Burstable pods only");
        assert_eq!(burstable_shares([&guaranteed]), 2, "none: the minimum");
        assert_eq!(burstable_shares([]), 2);
    }

    #[test]
    fn pod_values_by_qos() {
        let g = pod_of(
            vec![res(&[], &[("cpu", "2"), ("memory", "1Gi")])],
            vec![res(&[], &[("cpu", "500m"), ("memory", "64Mi")]), res(&[], &[("cpu", "500m"), ("memory", "64Mi")])],
        );
        let v = pod(&g);
        assert_eq!(v.cpu_shares, 2048, "the init container's request is larger than the sum");
        assert_eq!((v.cpu_quota, v.memory_limit), (200_000, 1 << 30));

        let b = pod_of(vec![], vec![res(&[("cpu", "100m")], &[("memory", "64Mi")]), res(&[("memory", "1Mi")], &[])]);
        let v = pod(&b);
        assert_eq!(
            v,
            CgroupValues { cpu_shares: 102, ..Default::default() },
            "limits only when all containers set them"
        );
        let b2 = pod_of(vec![], vec![res(&[("cpu", "100m")], &[("memory", "64Mi")])]);
        assert_eq!(pod(&b2).memory_limit, 64 << 20);

        assert_eq!(pod(&pod_of(vec![], vec![res(&[], &[])])), CgroupValues { cpu_shares: 2, ..Default::default() });
        assert_eq!(sandbox(&b).cpu_shares, 102);
        assert_eq!(sandbox(&b).memory_limit, 64 << 20, "the sandbox gets the sum regardless of QoS");
    }

    fn sidecar(requests: &[(&str, &str)]) -> Container {
        Container { restart_policy: Some("Always".into()), ..res(requests, &[]) }
    }

    #[test]
    fn sidecars_add_to_the_containers_and_to_later_init_containers() {
        // Upstream's example shape: sidecar 1, init 2, sidecar 3, init 4 + two regular containers.
        let p = pod_of(
            vec![
                sidecar(&[("cpu", "100m")]),
                res(&[("cpu", "300m")], &[]),
                sidecar(&[("cpu", "200m")]),
                res(&[("cpu", "250m")], &[]),
            ],
            vec![res(&[("cpu", "50m")], &[]), res(&[("cpu", "50m")], &[])],
        );
        let cpu_request = |p: &Pod| pod_total(p, |c| cpu(c).request);
        // Running: 100 + 200 + 50 + 50 = 400; init 2 needs 100 + 300 = 400; init 4 needs 300 + 250 = 550.
        assert_eq!(cpu_request(&p), 550);
        let mut big_apps = p.clone();
        big_apps.spec.as_mut().unwrap().containers = vec![res(&[("cpu", "1")], &[])];
        assert_eq!(cpu_request(&big_apps), 1300, "sidecars add to the regular containers");
        let only_sidecar = pod_of(vec![sidecar(&[("memory", "64Mi")])], vec![res(&[("memory", "64Mi")], &[])]);
        assert_eq!(pod_total(&only_sidecar, |c| memory(c).request), 128 << 20);
    }
}
