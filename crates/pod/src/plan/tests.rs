use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, Probe};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::SECOND;

const NOW: Nanos = 10_000 * SECOND;

fn container(name: &str) -> Container {
    Container { name: name.into(), image: Some("busybox:1".into()), ..Default::default() }
}

fn pod(init: &[&str], regular: &[&str], policy: &str) -> Pod {
    Pod {
        metadata: ObjectMeta { name: Some("p".into()), uid: Some("u1".into()), ..Default::default() },
        spec: Some(PodSpec {
            init_containers: (!init.is_empty()).then(|| init.iter().map(|n| container(n)).collect()),
            containers: regular.iter().map(|n| container(n)).collect(),
            restart_policy: Some(policy.into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn sandbox(id: &str, attempt: u32, ready: bool) -> SandboxInfo {
    SandboxInfo { id: id.into(), attempt, ready, created_at: attempt as i64, ip: None, additional_ips: vec![] }
}

fn instance(pod: &Pod, name: &str, sandbox: &str, attempt: u32, state: ContainerState, exit: i32) -> ContainerInfo {
    let spec = spec::init_containers(pod).iter().chain(spec::containers(pod)).find(|c| c.name == name).unwrap();
    ContainerInfo {
        sandbox_id: sandbox.into(),
        attempt,
        created_at: NOW - 100 * SECOND,
        started_at: NOW - 90 * SECOND,
        finished_at: if state == ContainerState::Exited { NOW - SECOND } else { 0 },
        exit_code: exit,
        image: "busybox:1".into(),
        image_ref: "sha256:1".into(),
        spec_hash: spec::container_hash(spec),
        ..ContainerInfo::fixture(&format!("{name}-{attempt}"), name, state)
    }
}

/// `sidecars` of `init` get `restartPolicy: Always`.
fn pod_with_sidecars(init: &[&str], sidecars: &[&str], regular: &[&str], policy: &str) -> Pod {
    let mut p = pod(init, regular, policy);
    for c in p.spec.as_mut().unwrap().init_containers.iter_mut().flatten() {
        if sidecars.contains(&c.name.as_str()) {
            c.restart_policy = Some("Always".into());
        }
    }
    p
}

fn running_in(p: &Pod, names: &[&str]) -> ObservedPod {
    ObservedPod {
        sandboxes: vec![sandbox("s", 0, true)],
        containers: names.iter().map(|n| instance(p, n, "s", 0, ContainerState::Running, 0)).collect(),
    }
}

fn plan(p: &Pod, obs: &ObservedPod) -> PodActions {
    compute(p, obs, &HashMap::new(), &Backoff::default(), NOW, 0)
}

fn names(starts: &[Start]) -> Vec<&str> {
    starts.iter().map(|s| s.name.as_str()).collect()
}

#[test]
fn new_pod_gets_a_sandbox_and_all_regular_containers() {
    let p = pod(&[], &["a", "b"], "Always");
    let actions = compute(&p, &ObservedPod::default(), &HashMap::new(), &Backoff::default(), NOW, 0);
    assert_eq!(actions.create_sandbox, Some(0));
    assert_eq!(names(&actions.start), ["a", "b"]);
    assert!(!actions.kill_pod);
}

#[test]
fn new_pod_with_init_containers_starts_only_the_first_init() {
    let p = pod(&["i1", "i2"], &["a"], "Always");
    let actions = compute(&p, &ObservedPod::default(), &HashMap::new(), &Backoff::default(), NOW, 0);
    assert_eq!(actions.create_sandbox, Some(0));
    assert_eq!(names(&actions.start), ["i1"]);
    assert!(actions.start[0].init);
}

#[test]
fn init_containers_run_one_at_a_time_in_order() {
    let p = pod(&["i1", "i2"], &["a"], "Always");
    let mut obs = ObservedPod { sandboxes: vec![sandbox("s", 0, true)], containers: vec![] };
    obs.containers.push(instance(&p, "i1", "s", 0, ContainerState::Running, 0));
    assert!(compute(&p, &obs, &HashMap::new(), &Backoff::default(), NOW, 0).is_empty(), "waits for i1");

    obs.containers[0] = instance(&p, "i1", "s", 0, ContainerState::Exited, 0);
    assert_eq!(names(&compute(&p, &obs, &HashMap::new(), &Backoff::default(), NOW, 0).start), ["i2"]);

    obs.containers.push(instance(&p, "i2", "s", 0, ContainerState::Exited, 0));
    assert_eq!(names(&compute(&p, &obs, &HashMap::new(), &Backoff::default(), NOW, 0).start), ["a"]);
}

#[test]
fn failed_init_container_fails_the_pod_under_never_and_restarts_otherwise() {
    for (policy, expect_kill) in [("Never", true), ("OnFailure", false), ("Always", false)] {
        let p = pod(&["i1"], &["a"], policy);
        let obs = ObservedPod {
            sandboxes: vec![sandbox("s", 0, true)],
            containers: vec![instance(&p, "i1", "s", 0, ContainerState::Exited, 1)],
        };
        let actions = compute(&p, &obs, &HashMap::new(), &Backoff::default(), NOW, 0);
        assert_eq!(actions.kill_pod, expect_kill, "{policy}");
        assert_eq!(actions.start.is_empty(), expect_kill, "{policy}");
    }
}

#[test]
fn running_pod_needs_nothing() {
    let p = pod(&[], &["a"], "Always");
    let obs = ObservedPod {
        sandboxes: vec![sandbox("s", 0, true)],
        containers: vec![instance(&p, "a", "s", 3, ContainerState::Running, 0)],
    };
    assert!(compute(&p, &obs, &HashMap::new(), &Backoff::default(), NOW, 0).is_empty());
}

#[test]
fn exited_containers_restart_per_policy() {
    let cases = [
        ("Always", 0, true),
        ("Always", 1, true),
        ("OnFailure", 0, false),
        ("OnFailure", 2, true),
        ("Never", 1, false),
    ];
    for (policy, exit, restarts) in cases {
        let p = pod(&[], &["a"], policy);
        let obs = ObservedPod {
            sandboxes: vec![sandbox("s", 0, true)],
            containers: vec![instance(&p, "a", "s", 0, ContainerState::Exited, exit)],
        };
        let actions = compute(&p, &obs, &HashMap::new(), &Backoff::default(), NOW, 0);
        assert_eq!(!actions.start.is_empty(), restarts, "{policy} exit {exit}");
        assert_eq!(actions.kill_pod, !restarts, "a finished pod releases its sandbox ({policy} exit {exit})");
        if restarts {
            assert_eq!(actions.start[0].attempt, 1);
            assert_eq!(actions.start[0].restart_of, Some(NOW - SECOND));
        }
    }
}

#[test]
fn restart_waits_for_backoff() {
    let p = pod(&[], &["a"], "Always");
    let obs = ObservedPod {
        sandboxes: vec![sandbox("s", 0, true)],
        containers: vec![instance(&p, "a", "s", 1, ContainerState::Exited, 1)],
    };
    let mut backoff = Backoff::default();
    backoff.record_restart(&backoff::key("u1", "a"), NOW - 30 * SECOND, NOW - 30 * SECOND);
    let actions = compute(&p, &obs, &HashMap::new(), &backoff, NOW, 0);
    assert!(actions.start.is_empty());
    assert!(!actions.kill_pod, "a pod in backoff keeps its sandbox");
    assert_eq!(actions.back_off.len(), 1);
    assert_eq!(actions.next_wake(), Some(9 * SECOND));
    assert!(
        actions.back_off[0].delay_message.starts_with("back-off 10s restarting failed container=a pod=p_default(u1)")
    );
}

#[test]
fn changed_spec_replaces_the_container() {
    let p = pod(&[], &["a"], "Always");
    let mut running = instance(&p, "a", "s", 0, ContainerState::Running, 0);
    running.spec_hash = "old".into();
    let obs = ObservedPod { sandboxes: vec![sandbox("s", 0, true)], containers: vec![running] };
    let actions = compute(&p, &obs, &HashMap::new(), &Backoff::default(), NOW, 0);
    assert_eq!(actions.kill_containers.len(), 1);
    assert_eq!(actions.kill_containers[0].reason, KillReason::SpecChanged);
    assert_eq!(names(&actions.start), ["a"]);
}

#[test]
fn dead_sandbox_is_replaced_and_init_containers_run_again() {
    let p = pod(&["i1"], &["a"], "Always");
    let obs = ObservedPod {
        sandboxes: vec![sandbox("s", 0, false)],
        containers: vec![
            instance(&p, "i1", "s", 0, ContainerState::Exited, 0),
            instance(&p, "a", "s", 0, ContainerState::Running, 0),
        ],
    };
    let actions = compute(&p, &obs, &HashMap::new(), &Backoff::default(), NOW, 0);
    assert!(actions.kill_pod, "the stale container is stopped first");
    assert_eq!(actions.create_sandbox, Some(1));
    assert_eq!(names(&actions.start), ["i1"]);
    assert_eq!(actions.start[0].attempt, 1);
}

#[test]
fn several_ready_sandboxes_are_stopped_and_replaced_by_one() {
    // An agent killed in the middle of RunPodSandbox: the runtime finished that sandbox after
    // the next agent had already made another.
    let p = pod(&[], &["a"], "Always");
    let obs = ObservedPod {
        sandboxes: vec![sandbox("s0", 0, true), sandbox("s1", 1, true)],
        containers: vec![instance(&p, "a", "s1", 0, ContainerState::Running, 0)],
    };
    let actions = plan(&p, &obs);
    assert!(actions.kill_pod, "both sandboxes and the container are stopped");
    assert_eq!(actions.create_sandbox, Some(2));
    assert_eq!(names(&actions.start), ["a"]);
}

#[test]
fn a_ready_leftover_beside_a_dead_current_sandbox_is_stopped() {
    let p = pod(&[], &["a"], "Always");
    let obs = ObservedPod { sandboxes: vec![sandbox("s0", 0, true), sandbox("s1", 1, false)], containers: vec![] };
    let actions = plan(&p, &obs);
    assert!(actions.kill_pod, "the older ready sandbox would otherwise run for ever");
    assert_eq!(actions.create_sandbox, Some(2));

    let one_dead = ObservedPod { sandboxes: vec![sandbox("s1", 1, false)], containers: vec![] };
    assert!(!plan(&p, &one_dead).kill_pod, "nothing to stop");
}

#[test]
fn completed_pod_gets_no_new_sandbox() {
    let p = pod(&[], &["a"], "Never");
    let obs = ObservedPod {
        sandboxes: vec![sandbox("s", 0, false)],
        containers: vec![instance(&p, "a", "s", 0, ContainerState::Exited, 0)],
    };
    let actions = compute(&p, &obs, &HashMap::new(), &Backoff::default(), NOW, 0);
    assert!(actions.is_empty());
}

#[test]
fn created_but_never_started_container_is_replaced() {
    let p = pod(&[], &["a"], "Always");
    let obs = ObservedPod {
        sandboxes: vec![sandbox("s", 0, true)],
        containers: vec![instance(&p, "a", "s", 0, ContainerState::Created, 0)],
    };
    let actions = compute(&p, &obs, &HashMap::new(), &Backoff::default(), NOW, 0);
    assert_eq!(actions.kill_containers[0].reason, KillReason::NeverStarted);
    assert_eq!(actions.start[0].attempt, 1);
}

/// A container whose start failed: exit 128, `StartError`, never running.
fn start_error(p: &Pod, name: &str, attempt: u32) -> ContainerInfo {
    ContainerInfo {
        started_at: 0,
        reason: "StartError".into(),
        ..instance(p, name, "s", attempt, ContainerState::Exited, 128)
    }
}

#[test]
fn a_start_cut_off_by_the_previous_agents_death_is_replaced_at_once_whatever_the_policy() {
    for policy in ["Never", "OnFailure", "Always"] {
        let p = pod(&["i1"], &["a"], policy);
        let cut_off =
            |name| ObservedPod { sandboxes: vec![sandbox("s", 0, true)], containers: vec![start_error(&p, name, 0)] };
        let mut backoff = Backoff::default();
        backoff.record_restart(&backoff::key("u1", "a"), NOW - 30 * SECOND, NOW - 30 * SECOND);
        let agent_started = NOW - 10 * SECOND;
        for name in ["i1", "a"] {
            let obs = cut_off(name);
            let obs = if name == "a" {
                ObservedPod {
                    containers: vec![instance(&p, "i1", "s", 0, ContainerState::Exited, 0), obs.containers[0].clone()],
                    ..obs
                }
            } else {
                obs
            };
            let actions = compute(&p, &obs, &HashMap::new(), &backoff, NOW, agent_started);
            assert!(!actions.kill_pod, "{policy} {name}: the pod does not fail for the agent's death");
            assert_eq!(actions.kill_containers[0].reason, KillReason::NeverStarted, "{policy} {name}");
            assert_eq!(names(&actions.start), [name], "{policy} {name}: started at once, no backoff");
            assert_eq!(actions.start[0].restart_of, None, "{policy} {name}: not a restart for the backoff");
        }
    }
}

#[test]
fn a_start_that_fails_under_this_agent_is_a_failure_with_backoff() {
    let p = pod(&[], &["a"], "Always");
    let obs = ObservedPod { sandboxes: vec![sandbox("s", 0, true)], containers: vec![start_error(&p, "a", 1)] };
    let mut backoff = Backoff::default();
    backoff.record_restart(&backoff::key("u1", "a"), NOW - 30 * SECOND, NOW - 30 * SECOND);
    let agent_started = NOW - 1000 * SECOND;
    let actions = compute(&p, &obs, &HashMap::new(), &backoff, NOW, agent_started);
    assert!(actions.kill_containers.is_empty(), "kept as the previous instance");
    assert_eq!(actions.back_off.len(), 1, "backs off");

    let never = pod(&[], &["a"], "Never");
    let obs = ObservedPod { sandboxes: vec![sandbox("s", 0, true)], containers: vec![start_error(&never, "a", 0)] };
    assert!(compute(&never, &obs, &HashMap::new(), &Backoff::default(), NOW, agent_started).kill_pod);
}

#[test]
fn container_in_unknown_state_is_stopped_before_its_replacement() {
    let p = pod(&[], &["a"], "Always");
    let obs = ObservedPod {
        sandboxes: vec![sandbox("s", 0, true)],
        containers: vec![instance(&p, "a", "s", 0, ContainerState::Unknown, 0)],
    };
    let actions = compute(&p, &obs, &HashMap::new(), &Backoff::default(), NOW, 0);
    assert_eq!(actions.kill_containers[0].reason, KillReason::Stuck);
    assert_eq!(actions.start[0].attempt, 1);
}

#[test]
fn go_durations() {
    assert_eq!(format_go_duration(10 * SECOND), "10s");
    assert_eq!(format_go_duration(80 * SECOND), "1m20s");
    assert_eq!(format_go_duration(300 * SECOND), "5m0s");
}

#[test]
fn next_init_container_starts_once_the_sidecar_runs() {
    let p = pod_with_sidecars(&["proxy", "setup"], &["proxy"], &["app"], "Always");
    assert_eq!(names(&plan(&p, &ObservedPod::default()).start), ["proxy"]);
    let mut obs = running_in(&p, &["proxy"]);
    assert_eq!(names(&plan(&p, &obs).start), ["setup"], "the sidecar does not need to finish");
    obs.containers.push(instance(&p, "setup", "s", 0, ContainerState::Exited, 0));
    assert_eq!(names(&plan(&p, &obs).start), ["app"]);
    obs.containers.push(instance(&p, "app", "s", 0, ContainerState::Running, 0));
    assert!(plan(&p, &obs).is_empty(), "sidecar and app run side by side");
}

#[test]
fn next_init_container_waits_for_the_sidecars_startup_probe() {
    let mut p = pod_with_sidecars(&["proxy"], &["proxy"], &["app"], "Always");
    p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].startup_probe = Some(Probe::default());
    let obs = running_in(&p, &["proxy"]);
    assert!(plan(&p, &obs).is_empty(), "not started until the startup probe succeeded");
    let started = HashMap::from([("proxy-0".to_string(), Health { started: true, ready: false, failed: None })]);
    let actions = compute(&p, &obs, &started, &Backoff::default(), NOW, 0);
    assert_eq!(names(&actions.start), ["app"]);
}

#[test]
fn sidecar_restarts_whatever_the_pod_restart_policy() {
    for policy in ["Never", "OnFailure", "Always"] {
        let p = pod_with_sidecars(&["proxy"], &["proxy"], &["app"], policy);
        let mut obs = running_in(&p, &["app"]);
        obs.containers.push(instance(&p, "proxy", "s", 0, ContainerState::Exited, 0));
        let actions = plan(&p, &obs);
        assert_eq!(names(&actions.start), ["proxy"], "{policy}");
        assert_eq!(actions.start[0].attempt, 1);
        assert!(actions.start[0].restart_of.is_some(), "{policy}: the restart goes through the backoff");
        assert!(!actions.kill_pod);
    }
}

#[test]
fn sidecar_restart_backs_off() {
    let p = pod_with_sidecars(&["proxy"], &["proxy"], &["app"], "Never");
    let mut obs = running_in(&p, &["app"]);
    obs.containers.push(instance(&p, "proxy", "s", 1, ContainerState::Exited, 1));
    let mut backoff = Backoff::default();
    backoff.record_restart(&backoff::key("u1", "proxy"), NOW - 30 * SECOND, NOW - 30 * SECOND);
    let actions = compute(&p, &obs, &HashMap::new(), &backoff, NOW, 0);
    assert!(actions.start.is_empty());
    assert_eq!(actions.back_off[0].name, "proxy");
}

#[test]
fn regular_init_containers_do_not_run_again_once_initialized() {
    let p = pod_with_sidecars(&["setup", "proxy"], &["proxy"], &["app"], "Always");
    // The setup instance was pruned by GC; the app runs, so the pod was initialized.
    let obs = running_in(&p, &["proxy", "app"]);
    assert!(plan(&p, &obs).is_empty());
}

#[test]
fn job_with_sidecar_completes_when_its_regular_containers_are_done() {
    for (policy, exit) in [("Never", 0), ("Never", 1), ("OnFailure", 0)] {
        let p = pod_with_sidecars(&["proxy"], &["proxy"], &["job"], policy);
        let mut obs = running_in(&p, &["proxy"]);
        obs.containers.push(instance(&p, "job", "s", 0, ContainerState::Exited, exit));
        let actions = plan(&p, &obs);
        assert!(actions.kill_pod, "{policy}/{exit}: the sidecar is stopped with the pod");
        assert!(actions.start.is_empty());

        // Stopped: no new sandbox, no sidecar restart.
        let mut stopped = obs.clone();
        stopped.sandboxes[0].ready = false;
        stopped.containers[0].state = ContainerState::Exited;
        assert!(plan(&p, &stopped).is_empty(), "{policy}/{exit}");
    }
}

#[test]
fn exited_sidecar_of_a_completed_job_is_not_restarted() {
    let p = pod_with_sidecars(&["proxy"], &["proxy"], &["job"], "Never");
    let obs = ObservedPod {
        sandboxes: vec![sandbox("s", 0, true)],
        containers: vec![
            instance(&p, "proxy", "s", 0, ContainerState::Exited, 137),
            instance(&p, "job", "s", 0, ContainerState::Exited, 0),
        ],
    };
    let actions = plan(&p, &obs);
    assert!(actions.kill_pod);
    assert!(actions.start.is_empty() && actions.back_off.is_empty());
}

#[test]
fn changed_sidecar_is_replaced() {
    let p = pod_with_sidecars(&["proxy"], &["proxy"], &["app"], "Always");
    let mut obs = running_in(&p, &["proxy", "app"]);
    obs.containers[0].spec_hash = "old".into();
    let actions = plan(&p, &obs);
    assert_eq!(actions.kill_containers[0].reason, KillReason::SpecChanged);
    assert_eq!(names(&actions.start), ["proxy"]);
}

fn with_debugger(mut p: Pod, target: Option<&str>) -> Pod {
    p.spec.as_mut().unwrap().ephemeral_containers = Some(vec![k8s_openapi::api::core::v1::EphemeralContainer {
        name: "debugger".into(),
        image: Some("busybox:1".into()),
        target_container_name: target.map(Into::into),
        ..Default::default()
    }]);
    p
}

#[test]
fn ephemeral_container_starts_once_in_the_target_process_namespace() {
    let p = with_debugger(pod(&[], &["app"], "Always"), Some("app"));
    let mut obs = running_in(&p, &["app"]);
    let actions = plan(&p, &obs);
    assert_eq!(names(&actions.start), ["debugger"]);
    assert_eq!(actions.start[0].target_id.as_deref(), Some("app-0"));

    obs.containers.push(ContainerInfo {
        sandbox_id: "s".into(),
        ..ContainerInfo::fixture("dbg", "debugger", ContainerState::Exited)
    });
    assert!(plan(&p, &obs).is_empty(), "never restarted");
}

#[test]
fn ephemeral_container_waits_for_its_target_and_not_for_initialization() {
    let p = with_debugger(pod(&["setup"], &["app"], "Always"), Some("app"));
    let obs = running_in(&p, &["setup"]);
    assert!(plan(&p, &obs).is_empty(), "the target does not run yet");
    let untargeted = with_debugger(pod(&["setup"], &["app"], "Always"), None);
    let actions = plan(&untargeted, &obs);
    assert_eq!(names(&actions.start), ["debugger"], "starts while an init container runs");
    assert_eq!(actions.start[0].target_id, None);
}

#[test]
fn ephemeral_containers_do_not_keep_a_completed_pod() {
    let p = with_debugger(pod(&[], &["job"], "Never"), None);
    let mut obs = running_in(&p, &[]);
    obs.containers.push(instance(&p, "job", "s", 0, ContainerState::Exited, 0));
    let actions = plan(&p, &obs);
    assert!(actions.kill_pod);
    assert!(actions.start.is_empty());
}
