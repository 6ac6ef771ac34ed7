//! Quality of service: a pod's QoS class and its containers' OOM score adjustment, as upstream
//! computes them. Only CPU and memory count, and zero quantities count as unset.

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::requests::{self, Memory};
use gantry_vocab::spec;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

/// The path components of a pod's cgroup below `cgroupRoot`, as upstream names them:
/// `kubepods`, the QoS level (none for Guaranteed) and `pod<uid>`. The cgroup driver turns them
/// into a path or nested slices.
pub fn cgroup_components(class: QosClass, uid: &str) -> Vec<String> {
    let mut parts = vec!["kubepods".to_string()];
    match class {
        QosClass::Guaranteed => {}
        QosClass::Burstable => parts.push("burstable".into()),
        QosClass::BestEffort => parts.push("besteffort".into()),
    }
    parts.push(format!("pod{uid}"));
    parts
}

/// Upstream `GetPodQOS`: Guaranteed when every container limits both CPU and memory and the
/// requests (defaulting to the limits) equal them; BestEffort when nothing is set.
pub fn class(pod: &Pod) -> QosClass {
    let all = spec::init_containers(pod).iter().chain(spec::containers(pod));
    let mut any_set = false;
    let mut guaranteed = true;
    for c in all {
        let cpu = requests::cpu(c);
        let memory = requests::memory(c);
        any_set |= cpu.request.is_some() || cpu.limit.is_some() || memory.request.is_some() || memory.limit.is_some();
        guaranteed &= cpu.limit.is_some() && cpu.request == cpu.limit;
        guaranteed &= memory.limit.is_some() && memory.request == memory.limit;
    }
    match (any_set, guaranteed) {
        (false, _) => QosClass::BestEffort,
        (true, true) => QosClass::Guaranteed,
        (true, false) => QosClass::Burstable,
    }
}

const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
const BEST_EFFORT_OOM_SCORE_ADJ: i64 = 1000;
/// `scheduling.SystemCriticalPriority`: pods at or above it are critical.
const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// Upstream `IsCriticalPod`: static and mirror pods, and pods with a system-critical priority.
fn is_critical(pod: &Pod) -> bool {
    let annotations = pod.metadata.annotations.as_ref();
    let has = |key: &str| annotations.is_some_and(|a| a.contains_key(key));
    let source_is_static =
        annotations.and_then(|a| a.get("kubernetes.io/config.source")).is_some_and(|s| s != "api" && !s.is_empty());
    let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
    source_is_static || has("kubernetes.io/config.mirror") || priority >= SYSTEM_CRITICAL_PRIORITY
}

/// Upstream `IsNodeCriticalPod`: critical and of the `system-node-critical` priority class.
fn is_node_critical(pod: &Pod) -> bool {
    let class = pod.spec.as_ref().and_then(|s| s.priority_class_name.as_deref());
    is_critical(pod) && class == Some("system-node-critical")
}

/// Upstream `GetContainerOOMScoreAdjust`: -997 for Guaranteed and node-critical pods, 1000 for
/// BestEffort, and for Burstable `1000 - 1000*memoryRequest/capacity` kept within [3, 999] so
/// it stays between the other two.
pub fn oom_score_adj(pod: &Pod, c: &Container, memory_capacity: i128) -> i64 {
    if is_node_critical(pod) {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    match class(pod) {
        QosClass::Guaranteed => return GUARANTEED_OOM_SCORE_ADJ,
        QosClass::BestEffort => return BEST_EFFORT_OOM_SCORE_ADJ,
        QosClass::Burstable => {}
    }
    if memory_capacity <= 0 {
        return BEST_EFFORT_OOM_SCORE_ADJ - 1;
    }
    let by_request = |c: &Container| {
        let Memory { request, .. } = requests::memory(c);
        (1000 - 1000 * request.unwrap_or(0) / memory_capacity) as i64
    };
    let mut adj = by_request(c);
    if spec::sidecars(pod).any(|s| s.name == c.name) {
        // A sidecar is killed no sooner than the regular container it serves that asks for the
        // least memory (upstream's rule for restartable init containers).
        let least = spec::containers(pod).iter().map(by_request).max().unwrap_or(adj);
        adj = adj.min(least);
    }
    adj.clamp(1000 + GUARANTEED_OOM_SCORE_ADJ, BEST_EFFORT_OOM_SCORE_ADJ - 1)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodSpec;

    use super::*;
    use crate::requests::tests::container;

    fn pod(containers: Vec<Container>) -> Pod {
        Pod { spec: Some(PodSpec { containers, ..Default::default() }), ..Default::default() }
    }

    #[test]
    fn classes() {
        assert_eq!(class(&pod(vec![container(&[], &[])])), QosClass::BestEffort);
        let g = container(&[], &[("cpu", "1"), ("memory", "1Gi")]);
        assert_eq!(class(&pod(vec![g.clone()])), QosClass::Guaranteed, "requests default to limits");
        let same_value = container(&[("cpu", "1000m"), ("memory", "1073741824")], &[("cpu", "1"), ("memory", "1Gi")]);
        assert_eq!(class(&pod(vec![same_value])), QosClass::Guaranteed, "quantities compare by value");
        assert_eq!(class(&pod(vec![g, container(&[("cpu", "1")], &[])])), QosClass::Burstable);
        assert_eq!(class(&pod(vec![container(&[("memory", "1Gi")], &[("memory", "2Gi")])])), QosClass::Burstable);
        assert_eq!(class(&pod(vec![container(&[("cpu", "0")], &[])])), QosClass::BestEffort, "zero is unset");
        assert_eq!(
            class(&pod(vec![container(&[("ephemeral-storage", "1Gi")], &[])])),
            QosClass::BestEffort,
            "only cpu and memory count"
        );
    }

    #[test]
    fn oom_scores() {
        let gi = 1i128 << 30;
        let g = pod(vec![container(&[], &[("cpu", "1"), ("memory", "1Gi")])]);
        assert_eq!(oom_score_adj(&g, &g.spec.as_ref().unwrap().containers[0], 4 * gi), -997);
        let be = pod(vec![container(&[], &[])]);
        assert_eq!(oom_score_adj(&be, &be.spec.as_ref().unwrap().containers[0], 4 * gi), 1000);
        let quarter = pod(vec![container(&[("memory", "1Gi")], &[])]);
        assert_eq!(oom_score_adj(&quarter, &quarter.spec.as_ref().unwrap().containers[0], 4 * gi), 750);
        let all = pod(vec![container(&[("memory", "4Gi")], &[("memory", "8Gi")])]);
        assert_eq!(oom_score_adj(&all, &all.spec.as_ref().unwrap().containers[0], 4 * gi), 3, "floor above Guaranteed");
        let tiny = pod(vec![container(&[("cpu", "100m")], &[])]);
        assert_eq!(oom_score_adj(&tiny, &tiny.spec.as_ref().unwrap().containers[0], 4 * gi), 999, "below BestEffort");
    }

    #[test]
    fn sidecars_score_no_higher_than_the_smallest_regular_container() {
        let gi = 1i128 << 30;
        let mut proxy = container(&[("memory", "256Mi")], &[]);
        proxy.name = "proxy".into();
        proxy.restart_policy = Some("Always".into());
        let mut app = container(&[("memory", "2Gi")], &[]);
        app.name = "app".into();
        let mut p = pod(vec![app]);
        p.spec.as_mut().unwrap().init_containers = Some(vec![proxy.clone()]);
        assert_eq!(oom_score_adj(&p, &proxy, 4 * gi), 500, "as the app, not 938 by its own request");
        let mut plain_init = proxy.clone();
        plain_init.restart_policy = None;
        p.spec.as_mut().unwrap().init_containers = Some(vec![plain_init.clone()]);
        assert_eq!(oom_score_adj(&p, &plain_init, 4 * gi), 938, "a regular init container keeps its own");
    }

    #[test]
    fn node_critical_pods_are_protected() {
        let mut p = pod(vec![container(&[("cpu", "100m")], &[])]);
        p.spec.as_mut().unwrap().priority_class_name = Some("system-node-critical".into());
        p.spec.as_mut().unwrap().priority = Some(2_000_001_000);
        assert_eq!(oom_score_adj(&p, &p.spec.as_ref().unwrap().containers[0], 1 << 30), -997);
        p.spec.as_mut().unwrap().priority = Some(0);
        assert_eq!(oom_score_adj(&p, &p.spec.as_ref().unwrap().containers[0], 1 << 30), 999, "not critical");
    }
}
