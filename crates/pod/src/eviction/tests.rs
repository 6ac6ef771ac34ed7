use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EmptyDirVolumeSource, PodSpec, ResourceRequirements, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn secs(text: &str) -> Option<Duration> {
    text.strip_suffix('s')?.parse().ok().map(Duration::from_secs)
}

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + s).unwrap()
}

const MI: i128 = 1 << 20;

fn observation(available: i128, capacity: i128, at: i64) -> Observation {
    Observation { available, capacity, time: t(at) }
}

fn config(hard: &[(&str, &str)]) -> Config {
    Config {
        thresholds: thresholds(&map(hard), &BTreeMap::new(), &BTreeMap::new(), &BTreeMap::new(), secs).unwrap(),
        max_pod_grace_seconds: 0,
        transition_period: Duration::from_secs(300),
        local_storage_isolation: true,
    }
}

fn resources(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Option<ResourceRequirements> {
    let q = |pairs: &[(&str, &str)]| {
        (!pairs.is_empty()).then(|| pairs.iter().map(|(k, v)| (k.to_string(), Quantity(v.to_string()))).collect())
    };
    Some(ResourceRequirements { requests: q(requests), limits: q(limits), ..Default::default() })
}

fn pod(name: &str, priority: i32, containers: Vec<Container>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        spec: Some(PodSpec { priority: Some(priority), containers, ..Default::default() }),
        status: None,
    }
}

fn container(name: &str, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
    Container { name: name.into(), resources: resources(requests, limits), ..Default::default() }
}

fn memory_usage(name: &str, bytes: u64) -> PodUsage {
    PodUsage {
        containers: vec![ContainerUsage { name: name.into(), memory_working_set: Some(bytes), ..Default::default() }],
        ..Default::default()
    }
}

fn names(pods: &[&Pod]) -> Vec<String> {
    pods.iter().map(|p| p.metadata.name.clone().unwrap()).collect()
}

#[test]
fn thresholds_parse_hard_soft_and_min_reclaim() {
    let all = thresholds(
        &map(&[("memory.available", "100Mi"), ("nodefs.available", "10%"), ("containerfs.available", "10%")]),
        &map(&[("memory.available", "300Mi")]),
        &map(&[("memory.available", "30s")]),
        &map(&[("memory.available", "50Mi")]),
        secs,
    )
    .unwrap();
    assert_eq!(all.len(), 3, "containerfs is derived, not observed: {all:?}");
    let soft = all.iter().find(|t| !t.is_hard()).unwrap();
    assert_eq!((soft.signal, soft.grace), (Signal::MemoryAvailable, Duration::from_secs(30)));
    assert_eq!(soft.min_reclaim.as_ref().unwrap().amount(0), 50 * MI);
    assert_eq!(all[1].value.amount(1000), 100, "10% of 1000");

    let missing =
        thresholds(&BTreeMap::new(), &map(&[("memory.available", "1Gi")]), &BTreeMap::new(), &BTreeMap::new(), secs);
    assert_eq!(
        missing.unwrap_err().to_string(),
        "grace period must be specified for the soft eviction threshold memory.available"
    );
    let bad = thresholds(&map(&[("memory.free", "1Gi")]), &BTreeMap::new(), &BTreeMap::new(), &BTreeMap::new(), secs);
    assert_eq!(bad.unwrap_err(), ThresholdError::Signal("memory.free".into()));
    let ignored =
        thresholds(&map(&[("nodefs.available", "0%")]), &BTreeMap::new(), &BTreeMap::new(), &BTreeMap::new(), secs);
    assert!(ignored.unwrap().is_empty(), "0% is never met, so upstream drops it");
}

#[test]
fn met_thresholds_and_min_reclaim() {
    let mut c = config(&[("memory.available", "100Mi"), ("nodefs.inodesFree", "5%")]);
    c.thresholds[0].min_reclaim = Some(Value::parse("50Mi").unwrap());
    let obs = |mem: i128, inodes: i128| -> Observations {
        [
            (Signal::MemoryAvailable, observation(mem, 1024 * MI, 0)),
            (Signal::NodeFsInodesFree, observation(inodes, 1000, 0)),
        ]
        .into()
    };
    assert!(met(&c.thresholds, &obs(200 * MI, 900), false).is_empty());
    let low = met(&c.thresholds, &obs(99 * MI, 49), false);
    assert_eq!(low.iter().map(|t| t.signal).collect::<Vec<_>>(), [Signal::MemoryAvailable, Signal::NodeFsInodesFree]);
    // Above the threshold but not by the minimum reclaim: still met when enforcing it.
    assert!(met(&c.thresholds, &obs(120 * MI, 900), false).is_empty());
    assert_eq!(met(&c.thresholds, &obs(120 * MI, 900), true).len(), 1);
    assert!(!reclaimed_enough(&c, &obs(120 * MI, 900)));
    assert!(reclaimed_enough(&c, &obs(151 * MI, 900)));
    assert!(met(&c.thresholds, &Observations::new(), false).is_empty(), "no observation, no pressure");
}

#[test]
fn conditions_follow_signals_and_hold_for_the_transition_period() {
    let c = config(&[("memory.available", "100Mi"), ("nodefs.available", "10%"), ("pid.available", "100")]);
    let mut m = Manager::default();
    let low: Observations = [
        (Signal::MemoryAvailable, observation(10 * MI, 1024 * MI, 0)),
        (Signal::NodeFsAvailable, observation(5, 100, 0)),
        (Signal::PidAvailable, observation(10, 1000, 0)),
    ]
    .into();
    let pass = m.synchronize(&c, &low, t(0));
    assert_eq!(pass.pressure, Pressure { memory: true, disk: true, pid: true });
    assert_eq!(pass.reclaim.unwrap().signal, Signal::MemoryAvailable, "memory is reclaimed first");
    let fine: Observations = [
        (Signal::MemoryAvailable, observation(900 * MI, 1024 * MI, 10)),
        (Signal::NodeFsAvailable, observation(50, 100, 10)),
        (Signal::PidAvailable, observation(900, 1000, 10)),
    ]
    .into();
    let pass = m.synchronize(&c, &fine, t(299));
    assert_eq!(pass.pressure, Pressure { memory: true, disk: true, pid: true }, "held for 5m");
    assert_eq!(pass.reclaim, None, "nothing to reclaim once the signals recovered");
    assert_eq!(m.synchronize(&c, &fine, t(300)).pressure, Pressure::default());
}

#[test]
fn soft_thresholds_wait_for_their_grace_and_stale_stats_do_not_evict() {
    let mut c = config(&[]);
    c.thresholds = thresholds(
        &BTreeMap::new(),
        &map(&[("memory.available", "1Gi")]),
        &map(&[("memory.available", "30s")]),
        &BTreeMap::new(),
        secs,
    )
    .unwrap();
    let mut m = Manager::default();
    let low = |at| -> Observations { [(Signal::MemoryAvailable, observation(100 * MI, 4096 * MI, at))].into() };
    let pass = m.synchronize(&c, &low(0), t(0));
    assert!(pass.pressure.memory, "the condition does not wait for the grace period");
    assert_eq!(pass.reclaim, None);
    assert_eq!(m.synchronize(&c, &low(10), t(29)).reclaim, None);
    assert!(m.synchronize(&c, &low(30), t(30)).reclaim.is_some_and(|t| !t.is_hard()));
    assert_eq!(m.synchronize(&c, &low(30), t(40)).reclaim, None, "the same stats twice: wait for new ones");
    // Back above the threshold: the grace starts again.
    let fine: Observations = [(Signal::MemoryAvailable, observation(2048 * MI, 4096 * MI, 50))].into();
    m.synchronize(&c, &fine, t(50));
    assert_eq!(m.synchronize(&c, &low(60), t(60)).reclaim, None);
}

#[test]
fn previously_met_thresholds_stay_until_the_minimum_reclaim() {
    let mut c = config(&[("memory.available", "100Mi")]);
    c.thresholds[0].min_reclaim = Some(Value::parse("100Mi").unwrap());
    let mut m = Manager::default();
    let at = |mem, s| -> Observations { [(Signal::MemoryAvailable, observation(mem, 1024 * MI, s))].into() };
    assert!(m.synchronize(&c, &at(50 * MI, 0), t(0)).reclaim.is_some());
    assert!(m.synchronize(&c, &at(150 * MI, 10), t(10)).reclaim.is_some(), "150Mi < 100Mi + 100Mi");
    assert!(m.synchronize(&c, &at(250 * MI, 20), t(20)).reclaim.is_none());
}

#[test]
fn memory_ranking_usage_over_request_then_priority_then_excess() {
    let within = pod("within", 0, vec![container("c", &[("memory", "500Mi")], &[])]);
    let over_small = pod("over-small", 0, vec![container("c", &[("memory", "100Mi")], &[])]);
    let over_big = pod("over-big", 0, vec![container("c", &[("memory", "100Mi")], &[])]);
    let over_important = pod("over-important", 1000, vec![container("c", &[], &[])]);
    let usage: Usage = [
        ("uid-within".to_string(), memory_usage("c", 400 << 20)),
        ("uid-over-small".to_string(), memory_usage("c", 150 << 20)),
        ("uid-over-big".to_string(), memory_usage("c", 900 << 20)),
        ("uid-over-important".to_string(), memory_usage("c", 2000 << 20)),
    ]
    .into();
    let pods = [&within, &over_small, &over_big, &over_important];
    let ranked = rank(&pods, &usage, Signal::MemoryAvailable, false);
    assert_eq!(names(&ranked), ["over-big", "over-small", "over-important", "within"]);
    // A pod without stats comes first, as upstream's comparators order it.
    let mut partial = usage.clone();
    partial.remove("uid-within");
    assert_eq!(names(&rank(&pods, &partial, Signal::MemoryAvailable, false))[0], "within");
}

#[test]
fn critical_and_static_pods_are_never_chosen() {
    let mut critical = pod("critical", SYSTEM_CRITICAL_PRIORITY, vec![container("c", &[], &[])]);
    critical.metadata.name = Some("critical".into());
    let mut static_pod = pod("static", 0, vec![container("c", &[], &[])]);
    static_pod.metadata.annotations = Some([(keys::CONFIG_SOURCE.to_string(), "file".to_string())].into());
    let regular = pod("regular", 0, vec![container("c", &[("memory", "1Gi")], &[])]);
    assert!(is_critical(&critical) && is_critical(&static_pod) && !is_critical(&regular));
    let usage: Usage = [
        ("uid-critical".to_string(), memory_usage("c", 3 << 30)),
        ("uid-static".to_string(), memory_usage("c", 3 << 30)),
        ("uid-regular".to_string(), memory_usage("c", 10 << 20)),
    ]
    .into();
    let c = config(&[("memory.available", "100Mi")]);
    let obs: Observations = [(Signal::MemoryAvailable, observation(91_244 * 1024, 4096 * MI, 0))].into();
    let pass = Manager::default().synchronize(&c, &obs, t(0));
    let chosen = choose(&c, &pass, &[&critical, &static_pod, &regular], &usage, &obs, false).unwrap();
    assert_eq!(chosen.uid, "uid-regular");
    assert_eq!(chosen.grace_seconds, IMMEDIATE_GRACE_SECONDS, "hard threshold");
    assert!(chosen.disruption_target);
    assert!(choose(&c, &pass, &[&critical, &static_pod], &usage, &obs, false).is_none());
}

#[test]
fn messages_are_upstreams() {
    let p = pod("batch", 0, vec![container("batch", &[("memory", "256Mi")], &[]), container("idle", &[], &[])]);
    let usage = PodUsage {
        containers: vec![
            ContainerUsage { name: "batch".into(), memory_working_set: Some(1843 << 20), ..Default::default() },
            ContainerUsage { name: "idle".into(), memory_working_set: Some(0), ..Default::default() },
        ],
        ..Default::default()
    };
    let c = config(&[("memory.available", "100Mi")]);
    let obs: Observations = [(Signal::MemoryAvailable, observation(91_244 * 1024, 4096 * MI, 0))].into();
    let pass = Manager::default().synchronize(&c, &obs, t(0));
    let (text, annotations) = message(Resource::Memory, &p, Some(&usage), &pass, &obs);
    assert_eq!(
        text,
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 91244Ki. \
         Container batch was using 1843Mi, request is 256Mi, has larger consumption of memory. "
    );
    let annotation = |a: &std::collections::BTreeMap<String, String>, k: &str| a.get(k).cloned().unwrap_or_default();
    assert_eq!(
        [OFFENDING_CONTAINERS, OFFENDING_CONTAINERS_USAGE, STARVED_RESOURCE].map(|k| annotation(&annotations, k)),
        ["batch", "1843Mi", "memory"].map(String::from),
        "the event's annotations, as upstream"
    );
    assert!(message(Resource::Memory, &p, None, &pass, &obs).1.is_empty(), "no usage, no annotations");
    // A percentage threshold prints its amount (a float32 fraction of the capacity, as
    // upstream: 10% of 1Gi is 107374184); a container without a request prints 0.
    let c = config(&[("nodefs.available", "10%")]);
    let obs: Observations = [(Signal::NodeFsAvailable, observation(50 * MI, 1024 * MI, 0))].into();
    let pass = Manager::default().synchronize(&c, &obs, t(0));
    let disk = PodUsage {
        containers: vec![ContainerUsage {
            name: "idle".into(),
            rootfs_bytes: Some(1 << 20),
            logs_bytes: Some(1 << 20),
            ..Default::default()
        }],
        ..Default::default()
    };
    assert_eq!(
        message(Resource::EphemeralStorage, &p, Some(&disk), &pass, &obs).0,
        "The node was low on resource: ephemeral-storage. Threshold quantity: 107374184, available: 50Mi. \
         Container idle was using 2Mi, request is 0, has larger consumption of ephemeral-storage. "
    );
}

#[test]
fn disk_ranking_counts_writable_layers_logs_and_local_volumes() {
    let mut a = pod("a", 0, vec![container("c", &[("ephemeral-storage", "1Gi")], &[])]);
    a.spec.as_mut().unwrap().volumes = Some(vec![Volume {
        name: "scratch".into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }]);
    let b = pod("b", 0, vec![container("c", &[], &[])]);
    let usage: Usage = [
        (
            "uid-a".to_string(),
            PodUsage {
                containers: vec![ContainerUsage { name: "c".into(), rootfs_bytes: Some(10), ..Default::default() }],
                volumes: vec![VolumeUsage { name: "scratch".into(), bytes: Some(3 << 30), inodes: Some(5) }],
                ..Default::default()
            },
        ),
        (
            "uid-b".to_string(),
            PodUsage {
                containers: vec![ContainerUsage {
                    name: "c".into(),
                    rootfs_bytes: Some(1 << 20),
                    logs_bytes: Some(1 << 20),
                    rootfs_inodes: Some(1),
                    ..Default::default()
                }],
                ..Default::default()
            },
        ),
    ]
    .into();
    // Both exceed their requests; a's emptyDir makes it the larger.
    assert_eq!(names(&rank(&[&b, &a], &usage, Signal::NodeFsAvailable, false)), ["a", "b"]);
    // With a dedicated image fs, imagefs counts only writable layers: b's is larger.
    assert_eq!(names(&rank(&[&a, &b], &usage, Signal::ImageFsAvailable, true)), ["b", "a"]);
    assert_eq!(names(&rank(&[&b, &a], &usage, Signal::NodeFsInodesFree, false)), ["a", "b"]);
}

#[test]
fn pid_ranking_priority_then_processes() {
    let low = pod("low", 0, vec![]);
    let many = pod("many", 10, vec![]);
    let few = pod("few", 10, vec![]);
    let procs = |n| PodUsage { processes: Some(n), ..Default::default() };
    let usage: Usage =
        [("uid-low".to_string(), procs(1)), ("uid-many".to_string(), procs(500)), ("uid-few".to_string(), procs(3))]
            .into();
    assert_eq!(names(&rank(&[&few, &many, &low], &usage, Signal::PidAvailable, false)), ["low", "many", "few"]);
}

#[test]
fn local_storage_limits() {
    let mut empty_dir = pod("empty-dir", 0, vec![container("c", &[], &[])]);
    empty_dir.spec.as_mut().unwrap().volumes = Some(vec![Volume {
        name: "scratch".into(),
        empty_dir: Some(EmptyDirVolumeSource { size_limit: Some(Quantity("10Mi".into())), ..Default::default() }),
        ..Default::default()
    }]);
    let limited = pod("limited", 0, vec![container("c", &[], &[("ephemeral-storage", "5Mi")])]);
    let two = pod(
        "two",
        0,
        vec![
            container("a", &[], &[("ephemeral-storage", "4Mi")]),
            container("b", &[], &[("ephemeral-storage", "4Mi")]),
        ],
    );
    let fine = pod("fine", 0, vec![container("c", &[], &[("ephemeral-storage", "1Gi")])]);
    let usage: Usage = [
        (
            "uid-empty-dir".to_string(),
            PodUsage {
                volumes: vec![VolumeUsage { name: "scratch".into(), bytes: Some(11 << 20), inodes: None }],
                ..Default::default()
            },
        ),
        (
            "uid-limited".to_string(),
            PodUsage {
                containers: vec![ContainerUsage {
                    name: "c".into(),
                    rootfs_bytes: Some(5 << 20),
                    logs_bytes: Some(1),
                    ..Default::default()
                }],
                ephemeral_bytes: Some(4 << 20),
                ..Default::default()
            },
        ),
        ("uid-two".to_string(), PodUsage { ephemeral_bytes: Some(9 << 20), ..Default::default() }),
        ("uid-fine".to_string(), PodUsage { ephemeral_bytes: Some(9 << 20), ..Default::default() }),
    ]
    .into();
    let evicted = local_storage(&[&empty_dir, &limited, &two, &fine], &usage, false);
    let got: Vec<(&str, &str, i64, bool)> =
        evicted.iter().map(|e| (e.uid.as_str(), e.message.as_str(), e.grace_seconds, e.disruption_target)).collect();
    assert_eq!(
        got,
        [
            ("uid-empty-dir", "Usage of EmptyDir volume \"scratch\" exceeds the limit \"10Mi\". ", 1, false),
            ("uid-limited", "Container c exceeded its local ephemeral storage limit \"5Mi\". ", 1, false),
            ("uid-two", "Pod ephemeral local storage usage exceeds the total limit of containers 8Mi. ", 1, false),
        ]
    );
    // With a dedicated image fs the writable layer does not count against the container limit.
    assert!(local_storage(&[&limited], &usage, true).is_empty());

    // Only pods with a limit need their usage read.
    for p in [&empty_dir, &limited, &two, &fine] {
        assert!(has_local_storage_limit(p), "{:?}", p.metadata.name);
    }
    let plain = pod("plain", 0, vec![container("c", &[], &[("memory", "1Gi")])]);
    let critical = pod("critical", 2_000_000_000, vec![container("c", &[], &[("ephemeral-storage", "5Mi")])]);
    let mut no_size_limit = plain.clone();
    no_size_limit.spec.as_mut().unwrap().volumes =
        Some(vec![Volume { name: "tmp".into(), empty_dir: Some(Default::default()), ..Default::default() }]);
    for p in [&plain, &critical, &no_size_limit] {
        assert!(!has_local_storage_limit(p), "{:?}", p.metadata.name);
    }
}

#[test]
fn evicted_status_is_failed_with_disruption_target() {
    let now = Time(t(0));
    let status = evicted_status(
        PodStatus { phase: Some("Running".into()), ..Default::default() },
        Some(3),
        "m",
        true,
        now.clone(),
    );
    assert_eq!(
        (status.phase.as_deref(), status.reason.as_deref(), status.message.as_deref()),
        (Some("Failed"), Some("Evicted"), Some("m"))
    );
    let c = &status.conditions.as_ref().unwrap()[0];
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_deref()),
        ("DisruptionTarget", "True", Some("TerminationByKubelet"))
    );
    assert_eq!(c.observed_generation, Some(3));
    let local = evicted_status(PodStatus::default(), None, "m", false, now);
    assert!(local.conditions.is_none(), "local storage evictions set no condition, as upstream");
    let done = evicted_status(
        PodStatus { phase: Some("Succeeded".into()), ..Default::default() },
        None,
        "m",
        true,
        Time(t(1)),
    );
    assert_eq!(done.phase.as_deref(), Some("Succeeded"));
}

#[test]
fn canonical_quantities() {
    assert_eq!(canonical("0.5Gi"), "512Mi");
    assert_eq!(canonical("256Mi"), "256Mi");
    assert_eq!(canonical("500M"), "500M");
    assert_eq!(canonical("1000"), "1k");
}

#[test]
fn admission_under_pressure() {
    use k8s_openapi::api::core::v1::Toleration;
    let best_effort = pod("be", 0, vec![container("c", &[], &[])]);
    let burstable = pod("b", 0, vec![container("c", &[("memory", "1Mi")], &[])]);
    let mut tolerating = best_effort.clone();
    tolerating.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
        key: Some("node.kubernetes.io/memory-pressure".into()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Default::default()
    }]);
    let mut critical = best_effort.clone();
    critical.spec.as_mut().unwrap().priority = Some(SYSTEM_CRITICAL_PRIORITY);
    let memory = Pressure { memory: true, ..Default::default() };
    assert_eq!(refuse_admission(Pressure::default(), &best_effort), None);
    assert_eq!(refuse_admission(memory, &best_effort).as_deref(), Some("The node had condition: [MemoryPressure]. "));
    assert_eq!(refuse_admission(memory, &burstable), None);
    assert_eq!(refuse_admission(memory, &tolerating), None);
    let disk = Pressure { memory: true, disk: true, pid: false };
    assert_eq!(
        refuse_admission(disk, &burstable).as_deref(),
        Some("The node had condition: [MemoryPressure DiskPressure]. ")
    );
    assert_eq!(refuse_admission(disk, &critical), None);
}
