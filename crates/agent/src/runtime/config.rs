//! Pod spec → CRI sandbox and container configs. Pure: everything it needs is passed in.

use std::collections::HashMap;
use std::path::Path;

use gantry_cri::api;
use gantry_plugins::devices::RunOptions;
use k8s_openapi::api::core::v1::{Container, Pod};

use super::downward;
use super::env::{self, EnvObjects};
use super::security::{self, ImageUser, NodeSecurity};
use gantry_pod::{qos, requests, resources};
use gantry_vocab::cri_labels as labels;
use gantry_vocab::paths::container_log_path;
use gantry_vocab::spec;

/// What a sandbox config needs beyond the pod, computed by the driver from node settings.
#[derive(Debug, Clone, Default)]
pub struct SandboxContext {
    /// The kernel hostname (empty for host-network pods: the runtime keeps the node's).
    pub hostname: String,
    pub dns: api::DnsConfig,
    pub cgroup_parent: String,
    /// The sandbox security context without namespace options.
    pub security: api::LinuxSandboxSecurityContext,
}

pub fn sandbox_config(
    pod: &Pod,
    node: &str,
    pod_logs_dir: &Path,
    attempt: u32,
    ctx: SandboxContext,
) -> api::PodSandboxConfig {
    let (name, namespace, uid) = (spec::name(pod), spec::namespace(pod), spec::uid(pod));
    let mut sandbox_labels = pod.metadata.labels.clone().unwrap_or_default().into_iter().collect::<HashMap<_, _>>();
    sandbox_labels.extend(labels::sandbox(node, name, namespace, uid));
    let mut annotations: HashMap<String, String> =
        pod.metadata.annotations.clone().unwrap_or_default().into_iter().collect();
    annotations.insert(labels::GRACE_PERIOD.to_string(), spec::termination_grace_seconds(pod).to_string());
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.to_string(),
            uid: uid.to_string(),
            namespace: namespace.to_string(),
            attempt,
        }),
        hostname: ctx.hostname,
        log_directory: gantry_vocab::paths::pod_log_dir(pod_logs_dir, pod).to_string_lossy().into_owned(),
        port_mappings: port_mappings(pod),
        labels: sandbox_labels,
        annotations,
        dns_config: Some(ctx.dns),
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: ctx.cgroup_parent,
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(pod)),
                ..ctx.security
            }),
            sysctls: sysctls(pod),
            resources: Some(linux_resources(resources::sandbox(pod), 0)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn linux_resources(v: resources::CgroupValues, oom_score_adj: i64) -> api::LinuxContainerResources {
    api::LinuxContainerResources {
        cpu_period: v.cpu_period,
        cpu_quota: v.cpu_quota,
        cpu_shares: v.cpu_shares,
        memory_limit_in_bytes: v.memory_limit,
        oom_score_adj,
        ..Default::default()
    }
}

fn sysctls(pod: &Pod) -> HashMap<String, String> {
    let sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    sc.and_then(|s| s.sysctls.as_ref()).into_iter().flatten().map(|s| (s.name.clone(), s.value.clone())).collect()
}

fn namespace_options(pod: &Pod) -> api::NamespaceOption {
    let s = pod.spec.as_ref();
    let node_if = |flag: Option<bool>| {
        if flag.unwrap_or(false) { api::NamespaceMode::Node } else { api::NamespaceMode::Pod }
    };
    let pid = if s.and_then(|s| s.host_pid).unwrap_or(false) {
        api::NamespaceMode::Node
    } else if s.and_then(|s| s.share_process_namespace).unwrap_or(false) {
        api::NamespaceMode::Pod
    } else {
        api::NamespaceMode::Container
    };
    api::NamespaceOption {
        network: node_if(s.and_then(|s| s.host_network)) as i32,
        pid: pid as i32,
        ipc: node_if(s.and_then(|s| s.host_ipc)) as i32,
        ..Default::default()
    }
}

/// A container's namespaces: the pod's, except that a container targeting another one (an
/// ephemeral container's `targetContainerName`) joins that one's PID namespace where it
/// would otherwise have its own.
fn container_namespaces(pod: &Pod, target_id: Option<&str>) -> api::NamespaceOption {
    let mut ns = namespace_options(pod);
    if let Some(target) = target_id
        && ns.pid == api::NamespaceMode::Container as i32
    {
        ns.pid = api::NamespaceMode::Target as i32;
        ns.target_id = target.to_string();
    }
    ns
}

fn port_mappings(pod: &Pod) -> Vec<api::PortMapping> {
    spec::containers(pod)
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.unwrap_or(0) > 0)
        .map(|p| api::PortMapping {
            protocol: match p.protocol.as_deref() {
                Some("UDP") => api::Protocol::Udp,
                Some("SCTP") => api::Protocol::Sctp,
                _ => api::Protocol::Tcp,
            } as i32,
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or(0),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect()
}

/// What a container config needs beyond the pod and the container itself.
pub struct ContainerContext<'a> {
    pub node: &'a str,
    pub attempt: u32,
    pub pod_ip: Option<&'a str>,
    pub host_ip: Option<&'a str>,
    pub mounts: Vec<api::Mount>,
    /// The ConfigMaps and Secrets the environment refers to.
    pub env_objects: EnvObjects,
    /// Node allocatable (CPU milli, memory bytes): the default for `resourceFieldRef` limits.
    pub node_allocatable: (i128, i128),
    /// The machine's memory, which the OOM score is relative to (upstream's `MemoryCapacity`).
    pub memory_capacity: i128,
    /// The user the image runs as, for `runAsNonRoot`.
    pub image_user: ImageUser,
    pub node_security: NodeSecurity<'a>,
    /// For an ephemeral container with a target: the target's container ID.
    pub target_id: Option<&'a str>,
    /// `memory.oom.group=1` in the CRI `unified` settings: the kernel's OOM killer stops the
    /// whole container (cgroup v2 unless `singleProcessOOMKill`).
    pub oom_group: bool,
    /// MemoryQoS (the gate, on cgroup v2): `memoryThrottlingFactor` for the container's
    /// `memory.min`/`memory.high` in `unified` (relative to `node_allocatable`'s memory).
    pub memory_qos: Option<f64>,
    /// What the device plugins give the container (envs, mounts, devices, annotations).
    pub devices: RunOptions,
}

/// Why a container's CRI config cannot be built (upstream's `CreateContainerConfigError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContainerConfigError {
    #[error(transparent)]
    Env(#[from] env::EnvError),
    #[error(transparent)]
    Resources(#[from] requests::BadQuantity),
    #[error(transparent)]
    Security(#[from] security::SecurityError),
}

pub fn container_config(
    pod: &Pod,
    c: &Container,
    ctx: ContainerContext,
) -> Result<api::ContainerConfig, ContainerConfigError> {
    let (name, namespace, uid) = (spec::name(pod), spec::namespace(pod), spec::uid(pod));
    let mut annotations = HashMap::from([
        (labels::CONTAINER_HASH.to_string(), spec::container_hash(c)),
        (labels::RESTART_COUNT.to_string(), ctx.attempt.to_string()),
        (labels::GRACE_PERIOD.to_string(), spec::termination_grace_seconds(pod).to_string()),
        (labels::TERMINATION_MESSAGE_PATH.to_string(), super::termination::container_path(c).to_string()),
        (labels::TERMINATION_MESSAGE_POLICY.to_string(), super::termination::policy(c).to_string()),
    ]);
    let fields = downward::Fields {
        node: ctx.node.to_string(),
        pod_ip: ctx.pod_ip.map(str::to_string),
        host_ip: ctx.host_ip.map(str::to_string),
        node_cpu_milli: ctx.node_allocatable.0,
        node_memory_bytes: ctx.node_allocatable.1,
    };
    let resolved = env::resolve(pod, c, &fields, &ctx.env_objects)?;
    requests::check(c)?;
    let limits = resources::container(c);
    let security = security::container(pod, c, &ctx.image_user, &ctx.node_security)?;
    let mut resources = linux_resources(limits, qos::oom_score_adj(pod, c, ctx.memory_capacity));
    if ctx.oom_group {
        resources.unified.insert("memory.oom.group".into(), "1".into());
    }
    if let Some(factor) = ctx.memory_qos {
        let entries = resources::memory_qos(c, ctx.node_allocatable.1, factor);
        resources.unified.extend(entries.into_iter().map(|(k, v)| (k.to_string(), v)));
    }
    // As upstream: the devices' envs and mounts come first, the container's own after them.
    let RunOptions { envs: device_envs, mounts: device_mounts, devices, annotations: device_annotations, cdi_devices } =
        ctx.devices;
    for (key, value) in device_annotations {
        annotations.entry(key).or_insert(value);
    }
    let envs = device_envs
        .into_iter()
        .chain(resolved.envs.into_iter().map(|(key, value)| api::KeyValue { key, value }))
        .collect();
    let mounts = device_mounts.into_iter().chain(ctx.mounts).collect();
    Ok(api::ContainerConfig {
        metadata: Some(api::ContainerMetadata { name: c.name.clone(), attempt: ctx.attempt }),
        image: Some(api::ImageSpec { image: c.image.clone().unwrap_or_default(), ..Default::default() }),
        command: resolved.command,
        args: resolved.args,
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs,
        mounts,
        devices,
        cdi_devices,
        labels: labels::container(ctx.node, name, namespace, uid, &c.name),
        annotations,
        log_path: container_log_path(&c.name, ctx.attempt),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(api::LinuxContainerConfig {
            resources: Some(resources),
            security_context: Some(api::LinuxContainerSecurityContext {
                namespace_options: Some(container_namespaces(pod, ctx.target_id)),
                ..security
            }),
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerPort, EnvVar, EnvVarSource, ObjectFieldSelector, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web-node1".into()),
                namespace: Some("kube-system".into()),
                uid: Some("abc".into()),
                labels: Some([("app".to_string(), "web".to_string())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "web".into(),
                    image: Some("busybox:1".into()),
                    command: Some(vec!["sh".into()]),
                    env: Some(vec![
                        EnvVar { name: "A".into(), value: Some("1".into()), ..Default::default() },
                        EnvVar {
                            name: "POD".into(),
                            value_from: Some(EnvVarSource {
                                field_ref: Some(ObjectFieldSelector {
                                    field_path: "metadata.name".into(),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                    ]),
                    ports: Some(vec![
                        ContainerPort { container_port: 80, host_port: Some(8080), ..Default::default() },
                        ContainerPort { container_port: 81, ..Default::default() },
                    ]),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn sandbox_carries_identity_logs_and_host_ports() {
        let ctx = SandboxContext { hostname: "web-node1".into(), ..Default::default() };
        let cfg = sandbox_config(&pod(), "node1", Path::new("/var/log/pods"), 2, ctx);
        assert_eq!(cfg.log_directory, "/var/log/pods/kube-system_web-node1_abc");
        assert_eq!(cfg.metadata.as_ref().unwrap().attempt, 2);
        assert_eq!(cfg.labels[labels::POD_UID], "abc");
        assert_eq!(cfg.labels[labels::NODE], "node1");
        assert_eq!(cfg.labels["app"], "web");
        assert_eq!(cfg.port_mappings.len(), 1, "only ports with a hostPort are mapped");
        assert_eq!(cfg.hostname, "web-node1");
    }

    fn context(devices: RunOptions) -> ContainerContext<'static> {
        ContainerContext {
            node: "node1",
            attempt: 3,
            pod_ip: None,
            host_ip: None,
            mounts: vec![api::Mount { container_path: "/data".into(), ..Default::default() }],
            env_objects: EnvObjects::default(),
            node_allocatable: (0, 1 << 30),
            memory_capacity: 1 << 30,
            image_user: ImageUser { uid: Some(0), username: String::new() },
            node_security: NodeSecurity {
                seccomp_default: false,
                allow_privileged: true,
                seccomp_root: Path::new("/s"),
            },
            target_id: None,
            oom_group: false,
            memory_qos: None,
            devices,
        }
    }

    #[test]
    fn device_plugin_options_come_before_the_containers_own() {
        let p = pod();
        let c = &p.spec.as_ref().unwrap().containers[0];
        let devices = RunOptions {
            envs: vec![api::KeyValue { key: "GPU".into(), value: "gpu-0".into() }],
            mounts: vec![api::Mount {
                container_path: "/dev/gpu0".into(),
                host_path: "/h/gpu0".into(),
                ..Default::default()
            }],
            devices: vec![api::Device {
                container_path: "/dev/x".into(),
                host_path: "/dev/null".into(),
                permissions: "rw".into(),
            }],
            annotations: [
                ("vendor/gpu".to_string(), "gpu-0".to_string()),
                (labels::CONTAINER_HASH.to_string(), "not the kubelet's".to_string()),
            ]
            .into(),
            cdi_devices: vec![api::CdiDevice { name: "vendor.com/gpu=0".into() }],
        };
        let cfg = container_config(&p, c, context(devices)).unwrap();
        let env: Vec<&str> = cfg.envs.iter().map(|kv| kv.key.as_str()).collect();
        assert_eq!(env, ["GPU", "A", "POD"]);
        let mounts: Vec<&str> = cfg.mounts.iter().map(|m| m.container_path.as_str()).collect();
        assert_eq!(mounts, ["/dev/gpu0", "/data"]);
        assert_eq!(cfg.devices[0].container_path, "/dev/x");
        assert_eq!(cfg.cdi_devices[0].name, "vendor.com/gpu=0");
        assert_eq!(cfg.annotations["vendor/gpu"], "gpu-0");
        assert_eq!(
            cfg.annotations[labels::CONTAINER_HASH],
            spec::container_hash(c),
            "the kubelet's own annotations win"
        );
        // Without devices, nothing is added.
        let cfg = container_config(&p, c, context(RunOptions::default())).unwrap();
        assert!(cfg.devices.is_empty() && cfg.cdi_devices.is_empty());
        assert_eq!(cfg.mounts.len(), 1);
    }

    #[test]
    fn container_config_resolves_env_and_log_path() {
        let p = pod();
        let c = &p.spec.as_ref().unwrap().containers[0];
        let ctx = |memory_qos: Option<f64>| ContainerContext {
            mounts: vec![],
            oom_group: true,
            memory_qos,
            ..context(RunOptions::default())
        };
        // MemoryQoS: a 64Mi request is protected and throttled 90% of the way to the node's
        // allocatable 1Gi (no limit), page-aligned.
        let mut requested = c.clone();
        requested.resources =
            Some(serde_json::from_value(serde_json::json!({"requests": {"memory": "64Mi"}})).unwrap());
        let cfg = container_config(&p, &requested, ctx(Some(0.9))).unwrap();
        let unified = &cfg.linux.as_ref().unwrap().resources.as_ref().unwrap().unified;
        let high = ((64u64 << 20) as f64 + ((1u64 << 30) - (64 << 20)) as f64 * 0.9) as u64 / 4096 * 4096;
        assert_eq!(unified.get("memory.min").cloned(), Some((64u64 << 20).to_string()));
        assert_eq!(unified.get("memory.high").cloned(), Some(high.to_string()));
        let cfg = container_config(&p, c, ctx(None)).unwrap();
        let unified = &cfg.linux.as_ref().unwrap().resources.as_ref().unwrap().unified;
        assert_eq!(unified.get("memory.oom.group").map(String::as_str), Some("1"), "cgroup v2: the whole container");
        assert!(!unified.contains_key("memory.min"), "MemoryQoS off");
        assert_eq!(cfg.log_path, "web/3.log");
        let env: Vec<(&str, &str)> = cfg.envs.iter().map(|kv| (kv.key.as_str(), kv.value.as_str())).collect();
        assert_eq!(env, [("A", "1"), ("POD", "web-node1")]);
        assert_eq!(cfg.annotations[labels::CONTAINER_HASH], spec::container_hash(c));
        let linux = cfg.linux.unwrap();
        let resources = linux.resources.unwrap();
        assert_eq!((resources.cpu_shares, resources.oom_score_adj), (2, 1000), "BestEffort");
        assert_eq!(linux.security_context.unwrap().run_as_user.unwrap().value, 0, "the image's user");
    }

    #[test]
    fn a_target_shares_its_process_namespace_unless_the_pod_shares_one() {
        let mut p = pod();
        let ns = container_namespaces(&p, Some("abc"));
        assert_eq!((ns.pid, ns.target_id.as_str()), (api::NamespaceMode::Target as i32, "abc"));
        assert_eq!(container_namespaces(&p, None).pid, api::NamespaceMode::Container as i32);
        p.spec.as_mut().unwrap().share_process_namespace = Some(true);
        let shared = container_namespaces(&p, Some("abc"));
        assert_eq!((shared.pid, shared.target_id.as_str()), (api::NamespaceMode::Pod as i32, ""));
    }

    #[test]
    fn host_network_pods_use_the_node_namespace() {
        let mut p = pod();
        p.spec.as_mut().unwrap().host_network = Some(true);
        let cfg = sandbox_config(&p, "n", Path::new("/l"), 0, SandboxContext::default());
        let ns = cfg.linux.unwrap().security_context.unwrap().namespace_options.unwrap();
        assert_eq!(ns.network, api::NamespaceMode::Node as i32);
        assert_eq!(cfg.hostname, "");
    }
}
