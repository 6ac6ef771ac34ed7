use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::{SECOND, SandboxInfo};

const NOW: Nanos = 10_000 * SECOND;

fn pod(init: &[&str], regular: &[&str], policy: &str) -> Pod {
    let c = |n: &&str| Container { name: n.to_string(), image: Some("busybox:1".into()), ..Default::default() };
    Pod {
        metadata: ObjectMeta { name: Some("p".into()), uid: Some("u".into()), ..Default::default() },
        spec: Some(PodSpec {
            init_containers: (!init.is_empty()).then(|| init.iter().map(c).collect()),
            containers: regular.iter().map(c).collect(),
            restart_policy: Some(policy.into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn sandbox() -> SandboxInfo {
    SandboxInfo {
        id: "s".into(),
        attempt: 0,
        ready: true,
        created_at: 1,
        ip: Some("10.244.0.5".into()),
        additional_ips: vec![],
    }
}

fn inst(name: &str, attempt: u32, state: ContainerState, exit: i32) -> ContainerInfo {
    ContainerInfo {
        sandbox_id: "s".into(),
        attempt,
        created_at: attempt as i64,
        started_at: NOW - 10 * SECOND,
        finished_at: if state == ContainerState::Exited { NOW - SECOND } else { 0 },
        exit_code: exit,
        image: "busybox:1".into(),
        image_ref: "sha256:abc".into(),
        ..ContainerInfo::fixture(&format!("{name}{attempt}"), name, state)
    }
}

fn status_of(pod: &Pod, containers: Vec<ContainerInfo>, waiting: &HashMap<String, Waiting>) -> PodStatus {
    let observed = ObservedPod { sandboxes: vec![sandbox()], containers };
    compute(&Input {
        pod,
        observed: &observed,
        waiting,
        health: &HashMap::new(),
        runtime_name: "containerd",
        recursive_read_only: false,
        host_ip: Some("192.0.2.1"),
        start_time: Some(NOW - 20 * SECOND),
        previous: None,
        now: NOW,
    })
}

fn condition<'a>(s: &'a PodStatus, t: &str) -> &'a PodCondition {
    s.conditions.as_ref().unwrap().iter().find(|c| c.type_ == t).unwrap()
}

#[test]
fn running_pod_is_ready_with_ids_and_ip() {
    let p = pod(&[], &["a"], "Always");
    let s = status_of(&p, vec![inst("a", 0, ContainerState::Running, 0)], &HashMap::new());
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(s.pod_ip.as_deref(), Some("10.244.0.5"));
    let cs = &s.container_statuses.as_ref().unwrap()[0];
    assert!(cs.ready);
    assert_eq!(cs.container_id.as_deref(), Some("containerd://a0"));
    assert_eq!(cs.image_id, "sha256:abc");
    assert_eq!(condition(&s, "Ready").status, "True");
    assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
}

#[test]
fn container_not_created_yet_waits_with_container_creating() {
    let p = pod(&[], &["a"], "Always");
    let s = status_of(&p, vec![], &HashMap::new());
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    let w = s.container_statuses.unwrap()[0].state.clone().unwrap().waiting.unwrap();
    assert_eq!(w.reason.as_deref(), Some("ContainerCreating"));
}

#[test]
fn regular_containers_wait_with_pod_initializing_behind_init_containers() {
    let p = pod(&["i"], &["a"], "Always");
    let s = status_of(&p, vec![inst("i", 0, ContainerState::Running, 0)], &HashMap::new());
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    let w = s.container_statuses.as_ref().unwrap()[0].state.clone().unwrap().waiting.unwrap();
    assert_eq!(w.reason.as_deref(), Some("PodInitializing"));
    let init = condition(&s, "Initialized");
    assert_eq!(init.status, "False");
    assert_eq!(init.message.as_deref(), Some("containers with incomplete status: [i]"));
}

#[test]
fn crash_looping_container_shows_backoff_and_last_state() {
    let p = pod(&[], &["a"], "Always");
    let mut waiting = HashMap::new();
    waiting.insert("a".to_string(), Waiting { reason: "CrashLoopBackOff".into(), message: "back-off 10s".into() });
    let s = status_of(&p, vec![inst("a", 2, ContainerState::Exited, 3)], &waiting);
    let cs = &s.container_statuses.as_ref().unwrap()[0];
    assert_eq!(cs.restart_count, 2);
    assert_eq!(cs.state.as_ref().unwrap().waiting.as_ref().unwrap().reason.as_deref(), Some("CrashLoopBackOff"));
    let last = cs.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!(last.exit_code, 3);
    assert_eq!(last.reason.as_deref(), Some("Error"));
    assert_eq!(s.phase.as_deref(), Some("Running"), "upstream: Always + stopped containers = Running");
}

#[test]
fn phases_of_finished_pods() {
    let cases =
        [("Never", 0, "Succeeded"), ("Never", 1, "Failed"), ("OnFailure", 0, "Succeeded"), ("Always", 0, "Running")];
    for (policy, exit, phase) in cases {
        let p = pod(&[], &["a"], policy);
        let s = status_of(&p, vec![inst("a", 0, ContainerState::Exited, exit)], &HashMap::new());
        assert_eq!(s.phase.as_deref(), Some(phase), "{policy} exit {exit}");
        let term = s.container_statuses.as_ref().unwrap()[0].state.clone().unwrap().terminated.unwrap();
        assert_eq!(term.reason.as_deref(), Some(if exit == 0 { "Completed" } else { "Error" }));
    }
}

#[test]
fn failed_init_container_fails_a_never_pod() {
    let p = pod(&["i"], &["a"], "Never");
    let s = status_of(&p, vec![inst("i", 0, ContainerState::Exited, 1)], &HashMap::new());
    assert_eq!(s.phase.as_deref(), Some("Failed"));
    assert_eq!(condition(&s, "ContainersReady").reason.as_deref(), Some("PodFailed"));
}

#[test]
fn condition_transition_time_is_kept_while_status_is_unchanged() {
    let p = pod(&[], &["a"], "Always");
    let first = status_of(&p, vec![inst("a", 0, ContainerState::Running, 0)], &HashMap::new());
    let observed =
        ObservedPod { sandboxes: vec![sandbox()], containers: vec![inst("a", 0, ContainerState::Running, 0)] };
    let later = compute(&Input {
        pod: &p,
        observed: &observed,
        waiting: &HashMap::new(),
        health: &HashMap::new(),
        runtime_name: "containerd",
        recursive_read_only: false,
        host_ip: None,
        start_time: None,
        previous: Some(&first),
        now: NOW + 100 * SECOND,
    });
    assert_eq!(condition(&later, "Ready").last_transition_time, condition(&first, "Ready").last_transition_time);
}

#[test]
fn qos_classes() {
    let mut p = pod(&[], &["a"], "Always");
    assert_eq!(crate::qos::class(&p).as_str(), "BestEffort");
    let q = |v: &str| Quantity(v.to_string());
    let limits = [("cpu".to_string(), q("1")), ("memory".to_string(), q("64Mi"))].into_iter().collect();
    p.spec.as_mut().unwrap().containers[0].resources =
        Some(ResourceRequirements { limits: Some(limits), ..Default::default() });
    assert_eq!(crate::qos::class(&p).as_str(), "Guaranteed");
    let requests = [("cpu".to_string(), q("500m"))].into_iter().collect();
    p.spec.as_mut().unwrap().containers[0].resources.as_mut().unwrap().requests = Some(requests);
    assert_eq!(crate::qos::class(&p).as_str(), "Burstable");
}

#[test]
fn conditions_owned_by_others_are_kept() {
    let mut p = pod(&[], &["a"], "Always");
    p.status = Some(PodStatus {
        conditions: Some(vec![
            PodCondition { type_: "DisruptionTarget".into(), status: "True".into(), ..Default::default() },
            PodCondition { type_: "Ready".into(), status: "False".into(), ..Default::default() },
        ]),
        ..Default::default()
    });
    let s = status_of(&p, vec![inst("a", 0, ContainerState::Running, 0)], &HashMap::new());
    assert_eq!(condition(&s, "DisruptionTarget").status, "True");
    assert_eq!(condition(&s, "Ready").status, "True", "our own conditions are recomputed");
    assert_eq!(s.conditions.unwrap().iter().filter(|c| c.type_ == "Ready").count(), 1);
}

#[test]
fn readiness_probe_drives_container_and_pod_readiness() {
    let mut p = pod(&[], &["a"], "Always");
    p.spec.as_mut().unwrap().containers[0].readiness_probe = Some(Default::default());
    let observed =
        ObservedPod { sandboxes: vec![sandbox()], containers: vec![inst("a", 0, ContainerState::Running, 0)] };
    let with = |health: &HashMap<String, Health>| {
        compute(&Input {
            pod: &p,
            observed: &observed,
            waiting: &HashMap::new(),
            health,
            runtime_name: "containerd",
            recursive_read_only: false,
            host_ip: None,
            start_time: None,
            previous: None,
            now: NOW,
        })
    };
    let unknown = with(&HashMap::new());
    assert!(!unknown.container_statuses.as_ref().unwrap()[0].ready, "not ready before the first probe");
    assert_eq!(condition(&unknown, "Ready").status, "False");
    assert_eq!(condition(&unknown, "ContainersReady").message.as_deref(), Some("containers with unready status: [a]"));
    let ready = with(&HashMap::from([("a0".to_string(), Health { started: true, ready: true, failed: None })]));
    assert!(ready.container_statuses.as_ref().unwrap()[0].ready);
    assert_eq!(condition(&ready, "Ready").status, "True");
    let not_started = with(&HashMap::from([("a0".to_string(), Health::default())]));
    assert_eq!(not_started.container_statuses.as_ref().unwrap()[0].started, Some(false));
    assert_eq!(condition(&not_started, "Ready").status, "False");
}

fn with_sidecar(mut p: Pod, name: &str) -> Pod {
    let init = p.spec.as_mut().unwrap().init_containers.as_mut().unwrap();
    init.iter_mut().find(|c| c.name == name).unwrap().restart_policy = Some("Always".into());
    p
}

#[test]
fn sidecar_and_container_running_make_a_ready_running_pod() {
    let p = with_sidecar(pod(&["proxy"], &["app"], "Always"), "proxy");
    let s = status_of(
        &p,
        vec![inst("proxy", 0, ContainerState::Running, 0), inst("app", 0, ContainerState::Running, 0)],
        &HashMap::new(),
    );
    assert_eq!(s.phase.as_deref(), Some("Running"));
    let proxy = &s.init_container_statuses.as_ref().unwrap()[0];
    assert_eq!((proxy.started, proxy.ready), (Some(true), true), "a running sidecar is started and ready");
    assert_eq!(condition(&s, "Initialized").status, "True");
    assert_eq!(condition(&s, "Ready").status, "True");
    // kubectl's READY column: ready regular containers and sidecars over their number.
    let ready = s.container_statuses.iter().flatten().chain(s.init_container_statuses.iter().flatten());
    assert_eq!(ready.filter(|c| c.ready).count(), 2);
}

#[test]
fn unready_sidecar_makes_the_pod_unready() {
    let mut p = with_sidecar(pod(&["proxy"], &["app"], "Always"), "proxy");
    p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].readiness_probe = Some(Default::default());
    let s = status_of(
        &p,
        vec![inst("proxy", 0, ContainerState::Running, 0), inst("app", 0, ContainerState::Running, 0)],
        &HashMap::new(),
    );
    let ready = condition(&s, "Ready");
    assert_eq!(ready.status, "False");
    assert_eq!(ready.message.as_deref(), Some("containers with unready status: [proxy]"));
    assert_eq!(condition(&s, "Initialized").status, "True", "started is enough to initialize");
}

#[test]
fn sidecar_not_yet_started_keeps_the_pod_pending_and_uninitialized() {
    let mut p = with_sidecar(pod(&["proxy", "setup"], &["app"], "Always"), "proxy");
    p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].startup_probe = Some(Default::default());
    let s = status_of(&p, vec![inst("proxy", 0, ContainerState::Running, 0)], &HashMap::new());
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    let init = condition(&s, "Initialized");
    assert_eq!(init.status, "False");
    assert_eq!(init.message.as_deref(), Some("containers with incomplete status: [proxy setup]"));
    assert_eq!(s.init_container_statuses.as_ref().unwrap()[0].started, Some(false));
}

#[test]
fn job_phase_comes_from_regular_containers_only() {
    for (exit, phase) in [(0, "Succeeded"), (1, "Failed")] {
        let p = with_sidecar(pod(&["proxy"], &["job"], "Never"), "proxy");
        let running_sidecar = status_of(
            &p,
            vec![inst("proxy", 0, ContainerState::Running, 0), inst("job", 0, ContainerState::Exited, exit)],
            &HashMap::new(),
        );
        assert_eq!(running_sidecar.phase.as_deref(), Some("Running"), "until the sidecar is stopped");
        let stopped = status_of(
            &p,
            vec![inst("proxy", 0, ContainerState::Exited, 137), inst("job", 0, ContainerState::Exited, exit)],
            &HashMap::new(),
        );
        assert_eq!(stopped.phase.as_deref(), Some(phase), "the sidecar's exit code does not count");
    }
}

#[test]
fn restarting_sidecar_keeps_a_running_pod_running() {
    let p = with_sidecar(pod(&["proxy"], &["app"], "Never"), "proxy");
    let backing_off = HashMap::from([(
        "proxy".to_string(),
        Waiting { reason: "CrashLoopBackOff".into(), message: "back-off 10s".into() },
    )]);
    let s = status_of(
        &p,
        vec![inst("proxy", 1, ContainerState::Exited, 1), inst("app", 0, ContainerState::Running, 0)],
        &backing_off,
    );
    assert_eq!(s.phase.as_deref(), Some("Running"));
    let proxy = &s.init_container_statuses.as_ref().unwrap()[0];
    assert_eq!(proxy.restart_count, 1);
    assert!(!proxy.ready);
    assert_eq!(condition(&s, "Ready").status, "False");
}

#[test]
fn ephemeral_containers_are_reported_apart() {
    let mut p = pod(&[], &["app"], "Always");
    p.spec.as_mut().unwrap().ephemeral_containers = Some(vec![k8s_openapi::api::core::v1::EphemeralContainer {
        name: "debugger".into(),
        image: Some("busybox:1".into()),
        target_container_name: Some("app".into()),
        ..Default::default()
    }]);
    let s = status_of(
        &p,
        vec![inst("app", 0, ContainerState::Running, 0), inst("debugger", 0, ContainerState::Running, 0)],
        &HashMap::new(),
    );
    let debugger = &s.ephemeral_container_statuses.as_ref().unwrap()[0];
    assert_eq!(debugger.name, "debugger");
    assert!(debugger.state.as_ref().unwrap().running.is_some());
    assert_eq!(debugger.container_id.as_deref(), Some("containerd://debugger0"));
    assert_eq!(s.container_statuses.as_ref().unwrap().len(), 1);
    assert_eq!(condition(&s, "Ready").status, "True", "no effect on readiness");
    let waiting = status_of(&p, vec![inst("app", 0, ContainerState::Running, 0)], &HashMap::new());
    let state = waiting.ephemeral_container_statuses.unwrap()[0].state.clone().unwrap();
    assert_eq!(state.waiting.unwrap().reason.as_deref(), Some("ContainerCreating"));
}

#[test]
fn observed_generation_is_the_pods_generation_on_status_and_owned_conditions() {
    let mut p = pod(&[], &["a"], "Always");
    p.metadata.generation = Some(3);
    let foreign = PodCondition { type_: "DisruptionTarget".into(), status: "True".into(), ..Default::default() };
    p.status = Some(PodStatus { conditions: Some(vec![foreign]), ..Default::default() });
    let s = status_of(&p, vec![inst("a", 0, ContainerState::Running, 0)], &HashMap::new());
    assert_eq!(s.observed_generation, Some(3));
    for c in s.conditions.as_ref().unwrap() {
        let expected = if c.type_ == "DisruptionTarget" { None } else { Some(3) };
        assert_eq!(c.observed_generation, expected, "condition {}", c.type_);
    }
}

#[test]
fn container_status_reports_mounts_user_and_running_resources() {
    use k8s_openapi::api::core::v1::VolumeMount;
    let mut p = pod(&[], &["a", "b"], "Always");
    for c in &mut p.spec.as_mut().unwrap().containers {
        c.volume_mounts =
            Some(vec![VolumeMount { name: "data".into(), mount_path: "/data".into(), ..Default::default() }]);
        c.resources = Some(ResourceRequirements {
            limits: Some([("memory".to_string(), Quantity("64Mi".into()))].into()),
            ..Default::default()
        });
    }
    let user = crate::LinuxUser { uid: 1000, gid: 3000, supplemental_groups: vec![4000] };
    let running = ContainerInfo {
        user: Some(user.clone()),
        applied: crate::resources::CgroupValues { memory_limit: 32 << 20, ..Default::default() },
        ..inst("a", 0, ContainerState::Running, 0)
    };
    let exited = ContainerInfo { user: Some(user), ..inst("b", 0, ContainerState::Exited, 1) };
    let s = status_of(&p, vec![running, exited], &HashMap::new());
    let statuses = s.container_statuses.unwrap();
    for cs in &statuses {
        assert_eq!(cs.volume_mounts.as_ref().unwrap()[0].mount_path, "/data", "{}", cs.name);
        let linux = cs.user.as_ref().and_then(|u| u.linux.as_ref()).unwrap();
        assert_eq!((linux.uid, linux.gid, linux.supplemental_groups.clone()), (1000, 3000, Some(vec![4000])));
    }
    let limits = statuses[0].resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert_eq!(limits["memory"], Quantity("32Mi".into()), "the runtime's value");
    assert_eq!(statuses[1].resources, None, "only running containers report resources");
    assert!(statuses.iter().all(|cs| cs.allocated_resources.is_none()));
}

#[test]
fn waiting_container_reports_mounts_but_no_user() {
    use k8s_openapi::api::core::v1::VolumeMount;
    let mut p = pod(&[], &["a"], "Always");
    p.spec.as_mut().unwrap().containers[0].volume_mounts =
        Some(vec![VolumeMount { name: "data".into(), mount_path: "/data".into(), ..Default::default() }]);
    let s = status_of(&p, vec![], &HashMap::new());
    let cs = &s.container_statuses.unwrap()[0];
    assert_eq!(cs.volume_mounts.as_ref().unwrap().len(), 1);
    assert_eq!((cs.user.as_ref(), cs.resources.as_ref()), (None, None));
}

/// The pod as the API server has it after the kubelet's status write: a new resource version,
/// managed fields, and the kubelet's conditions.
fn written_back(pod: &Pod) -> Pod {
    let mut newer = pod.clone();
    newer.metadata.resource_version = Some("2".into());
    newer.metadata.managed_fields = Some(vec![Default::default()]);
    let status = newer.status.get_or_insert_with(Default::default);
    status.phase = Some("Running".into());
    status.conditions = Some(vec![cond_of("Ready", "True")]);
    newer
}

fn cond_of(type_: &str, status: &str) -> PodCondition {
    PodCondition { type_: type_.into(), status: status.into(), ..Default::default() }
}

#[test]
fn the_kubelets_own_status_coming_back_needs_no_sync() {
    let mut pod = pod(&[], &["app"], "Always");
    pod.metadata.resource_version = Some("1".into());
    assert!(!needs_sync(&pod, &written_back(&pod)));
}

#[test]
fn spec_metadata_and_foreign_conditions_need_a_sync() {
    let pod = pod(&[], &["app"], "Always");
    let mut labelled = written_back(&pod);
    labelled.metadata.labels = Some([("tier".to_string(), "web".to_string())].into());
    assert!(needs_sync(&pod, &labelled), "labels feed the downward API");
    let mut gated = written_back(&pod);
    gated.status.as_mut().unwrap().conditions.as_mut().unwrap().push(cond_of("example.com/gate", "True"));
    assert!(needs_sync(&pod, &gated), "a readiness gate's condition feeds Ready");
    let mut respecced = written_back(&pod);
    respecced.spec.as_mut().unwrap().active_deadline_seconds = Some(30);
    assert!(needs_sync(&pod, &respecced));
}
