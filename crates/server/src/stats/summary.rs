//! `/stats/summary`: CRI `ListContainerStats` (and `ListPodSandboxStats` where the runtime
//! implements it, else the sandbox's network namespace for pod network), the pod cgroups (pod
//! CPU, memory, swap, IO pressure and process count, as upstream reads them through cAdvisor;
//! the runtime's sandbox stats, then the sum of the containers, where a pod has no cgroup of its
//! own), the node's own counters, the system containers (`kubelet`, `runtime`, `pods`: cgroups
//! read on either hierarchy) and the pods' volumes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use gantry_cri::{CriError, ImageClient, RuntimeClient, api};
use k8s_openapi::api::core::v1::{Pod, Volume};
use k8s_openapi::jiff::Timestamp;

use super::cgroup::{self, Cgroup, Counters, Hierarchy};
use super::host;
use super::rate::CpuRates;
use super::types::*;
use crate::RunningPod;
use gantry_config::PodSettings;
use gantry_pod::qos;
use gantry_vocab::cri_labels as labels;
use gantry_vocab::paths;
use gantry_vocab::spec;

/// What the stats code remembers between scrapes, owned by the node's server (so two nodes in
/// one process keep their own).
#[derive(Default)]
pub struct StatsCache {
    /// The last CPU sample per node/container/pod, for `usageNanoCores`: every scrape
    /// (summary, resource metrics) feeds and reads the same samples.
    rates: Mutex<CpuRates>,
    /// Set once the runtime said `ListPodSandboxStats` is unimplemented, to stop asking.
    no_sandbox_stats: AtomicBool,
    /// The process of each ready sandbox (its network namespace), by sandbox ID.
    sandbox_pids: Mutex<HashMap<String, u32>>,
    /// The pods' volumes as last measured in the background (`volumeStatsAggPeriod`).
    pub volumes: super::volumes::VolumeStatsCache,
}

/// Where the inputs come from.
pub struct Sources<'a> {
    pub node_name: &'a str,
    pub runtime: &'a RuntimeClient,
    pub images: &'a ImageClient,
    pub root_dir: &'a Path,
    pub pod_logs_dir: &'a Path,
    /// Where the cgroup file system is mounted.
    pub cgroup_mount: PathBuf,
    /// How pod cgroups are named (None without `cgroupsPerQOS`: pods have none of their own).
    pub pod_cgroups: Option<&'a PodSettings>,
    /// The system containers' cgroups (`kubeletCgroups`, `--runtime-cgroups`, `systemCgroups`).
    pub cgroups: &'a PodSettings,
    /// The runtime's unix socket: without `--runtime-cgroups`, the process behind it is the
    /// `runtime` system container.
    pub runtime_socket: Option<PathBuf>,
    /// The `KubeletPSI` gate: without it the summary has no pressure figures (nor `io`, which
    /// carries only pressure).
    pub psi: bool,
    /// The pods to report: all those this node runs (from the status store), or some of them.
    pub pods: Vec<RunningPod>,
    /// Whether `pods` are all the node's pods: only then are the CPU samples of containers and
    /// pods not in the summary dropped (a partial read keeps the others' for the next scrape).
    pub all_pods: bool,
    pub cache: &'a StatsCache,
}

fn rfc3339(ts: Timestamp) -> String {
    ts.to_string()
}

fn from_nanos(n: i64) -> String {
    Timestamp::from_nanosecond(n as i128).map(rfc3339).unwrap_or_default()
}

/// What the runtime said for a summary, read before the host's files.
pub struct Gathered {
    time: String,
    at: i128,
    containers: Vec<api::Container>,
    stats: HashMap<String, api::ContainerStats>,
    sandbox_stats: HashMap<String, SandboxStats>,
    image_fs: Option<FsStats>,
}

/// The summary's runtime reads (async); [`assemble`] adds what the host's files say.
/// `only_cpu_and_memory` leaves out filesystems, network and volumes.
pub async fn gather(src: &Sources<'_>, only_cpu_and_memory: bool) -> Result<Gathered, CriError> {
    let now = Timestamp::now();
    let time = rfc3339(now);
    let at = now.as_nanosecond();
    let owned = labels::owned_by(src.node_name);
    let running = api::ContainerFilter {
        state: Some(api::ContainerStateValue { state: api::ContainerState::ContainerRunning as i32 }),
        label_selector: owned.clone(),
        ..Default::default()
    };
    // Without pods to report, the runtime's container and sandbox stats are not needed.
    let with_pods = !src.pods.is_empty();
    let containers = if with_pods {
        src.runtime.list_containers(api::ListContainersRequest { filter: Some(running) }).await?.containers
    } else {
        Vec::new()
    };
    let stats = if with_pods {
        let filter = api::ContainerStatsFilter { label_selector: owned.clone(), ..Default::default() };
        src.runtime.list_container_stats(api::ListContainerStatsRequest { filter: Some(filter) }).await?.stats
    } else {
        Vec::new()
    };
    let stats: HashMap<String, api::ContainerStats> =
        stats.into_iter().filter_map(|s| Some((s.attributes.as_ref()?.id.clone(), s))).collect();
    let sandbox_stats = if only_cpu_and_memory || !with_pods {
        HashMap::new()
    } else {
        sandbox_stats(src.runtime, &owned, src.cache).await
    };
    let image_fs = if only_cpu_and_memory { None } else { image_fs(src.images, &time).await };
    Ok(Gathered { time, at, containers, stats, sandbox_stats, image_fs })
}

/// Builds the summary from what [`gather`] read and the host's cgroups, `/proc` and the pods'
/// log directories (volumes come from the background measure). Blocking: a walk of every log
/// directory and hundreds of small reads at density are for a blocking thread, not an async
/// worker.
pub fn assemble(src: &Sources<'_>, gathered: Gathered, only_cpu_and_memory: bool) -> Summary {
    let Gathered { time, at, containers, stats, sandbox_stats, image_fs } = gathered;
    let hierarchy = cgroup::hierarchy(&src.cgroup_mount);
    let logs_fs = host::filesystem(src.pod_logs_dir, &time);
    let mut rates = src.cache.rates.lock().unwrap_or_else(|p| p.into_inner());
    let node = node_stats(src, hierarchy, &time, at, &mut rates, only_cpu_and_memory, image_fs.clone());
    let mut pods = Vec::new();
    for running in &src.pods {
        let pod = running.pod.as_ref();
        let uid = spec::uid(pod);
        let mine: Vec<&api::Container> =
            containers.iter().filter(|c| c.labels.get(labels::POD_UID).map(String::as_str) == Some(uid)).collect();
        if mine.is_empty() {
            continue;
        }
        let mut ps = PodStats {
            pod_ref: PodReference {
                name: spec::name(pod).into(),
                namespace: spec::namespace(pod).into(),
                uid: uid.into(),
            },
            start_time: running.status.start_time.as_ref().map(|t| t.0.to_string()).unwrap_or_default(),
            ..Default::default()
        };
        let log_dir = paths::pod_log_dir(src.pod_logs_dir, pod);
        let pod_cgroup = hierarchy.and_then(|h| pod_cgroup(src, h, pod));
        for c in mine {
            let name = c.labels.get(labels::CONTAINER_NAME).cloned().unwrap_or_default();
            let mut cs =
                ContainerStats { name: name.clone(), start_time: from_nanos(c.created_at), ..Default::default() };
            let own = pod_cgroup.as_ref().and_then(|p| p.container(&c.id)).map(|cg| cg.read());
            container_usage(&mut cs, &c.id, stats.get(&c.id), own.as_ref(), &time, at, &mut rates);
            if only_cpu_and_memory {
                (cs.swap, cs.io) = (None, None);
            }
            let s = stats.get(&c.id);
            if !only_cpu_and_memory {
                cs.rootfs = s.and_then(|s| s.writable_layer.as_ref()).map(|w| FsStats {
                    used_bytes: w.used_bytes.as_ref().map(|v| v.value),
                    inodes_used: w.inodes_used.as_ref().map(|v| v.value),
                    ..image_fs.clone().unwrap_or(FsStats { time: time.clone(), ..Default::default() })
                });
                let (used, inodes) = host::disk_usage(&log_dir.join(&name));
                cs.logs = Some(FsStats {
                    used_bytes: Some(used),
                    inodes_used: Some(inodes),
                    ..logs_fs.clone().unwrap_or(FsStats { time: time.clone(), ..Default::default() })
                });
            }
            ps.containers.push(cs);
        }
        ps.containers.sort_by(|a, b| a.name.cmp(&b.name));
        let cgroup = pod_cgroup.map(|c| c.read());
        pod_totals(&mut ps, &time, at, &mut rates, cgroup.as_ref(), sandbox_stats.get(uid));
        if !only_cpu_and_memory {
            ps.network = sandbox_stats.get(uid).and_then(|s| s.network.clone());
            ps.volume = src.cache.volumes.get(uid);
            let etc_hosts = host::file_usage(&paths::pod_dir(src.root_dir, uid).join(paths::ETC_HOSTS));
            let pod_logs = host::files_usage(&paths::pod_log_dir(src.pod_logs_dir, pod));
            let pod_files =
                [etc_hosts, pod_logs].into_iter().flatten().fold((0, 0), |(b, i), (fb, fi)| (b + fb, i + fi));
            ps.ephemeral_storage = Some(ephemeral(&ps, pod, node.fs.as_ref(), pod_files, &time));
        }
        pods.push(ps);
    }
    let alive: std::collections::HashSet<String> = containers
        .iter()
        .map(|c| c.id.clone())
        .chain(src.pods.iter().map(|p| format!("pod/{}", spec::uid(&p.pod))))
        .collect();
    if src.all_pods {
        rates.retain(|k| k == "node" || k.starts_with("sys/") || alive.contains(k));
    }
    let mut summary = Summary { node, pods };
    if !src.psi {
        without_psi(&mut summary);
    }
    summary
}

/// The summary as a kubelet with `KubeletPSI` off shows it (pure).
fn without_psi(summary: &mut Summary) {
    fn strip(cpu: &mut Option<CpuStats>, memory: &mut Option<MemoryStats>, io: &mut Option<IoStats>) {
        if let Some(c) = cpu {
            c.psi = None;
        }
        if let Some(m) = memory {
            m.psi = None;
        }
        *io = None;
    }
    let node = &mut summary.node;
    strip(&mut node.cpu, &mut node.memory, &mut node.io);
    let containers = summary.pods.iter_mut().flat_map(|p| p.containers.iter_mut());
    for c in node.system_containers.iter_mut().chain(containers) {
        strip(&mut c.cpu, &mut c.memory, &mut c.io);
    }
    for p in &mut summary.pods {
        strip(&mut p.cpu, &mut p.memory, &mut p.io);
    }
}

fn node_stats(
    src: &Sources<'_>,
    hierarchy: Option<Hierarchy>,
    time: &str,
    at: i128,
    rates: &mut CpuRates,
    only_cpu_and_memory: bool,
    image_fs: Option<FsStats>,
) -> NodeStats {
    let c = host::node_counters(&src.cgroup_mount);
    let usage = Usage::of(&c.cgroup, time, rates.sample_opt("node", at, c.cgroup.cpu_usage_nanos), c.mem_total);
    let mut node = NodeStats {
        node_name: src.node_name.into(),
        system_containers: system_containers(src, hierarchy, time, at, rates),
        start_time: c.boot_time.and_then(|s| Timestamp::from_second(s).ok()).map(rfc3339).unwrap_or_default(),
        cpu: usage.cpu,
        memory: usage.memory,
        ..Default::default()
    };
    if !only_cpu_and_memory {
        node.io = usage.io;
        node.swap = c.swap_total.map(|total| {
            let free = c.swap_free.unwrap_or(0);
            SwapStats {
                time: time.into(),
                swap_available_bytes: Some(free),
                swap_usage_bytes: Some(total.saturating_sub(free)),
            }
        });
        let (maxpid, curproc) = host::rlimit();
        node.rlimit = Some(RlimitStats { time: time.into(), maxpid, curproc });
        node.network = host::network(Path::new("/proc/self")).map(|(default, interfaces)| NetworkStats {
            time: time.into(),
            default,
            interfaces,
        });
        node.fs = host::filesystem(src.root_dir, time);
        node.runtime = Some(RuntimeStats { container_fs: image_fs.clone(), image_fs });
    }
    node
}

/// A cgroup's CPU, memory, swap and IO pressure as the summary shows them (pure).
#[derive(Debug, Default, PartialEq)]
struct Usage {
    cpu: Option<CpuStats>,
    memory: Option<MemoryStats>,
    swap: Option<SwapStats>,
    io: Option<IoStats>,
}

impl Usage {
    /// `nano_cores`: the CPU rate; `capacity`: what `availableBytes` counts down from when the
    /// cgroup has no memory limit (the node's memory for the root cgroup; none otherwise, as
    /// upstream leaves it out).
    fn of(c: &Counters, time: &str, nano_cores: Option<u64>, capacity: Option<u64>) -> Usage {
        let cpu = c.cpu_usage_nanos.map(|total| CpuStats {
            time: time.into(),
            usage_nano_cores: nano_cores,
            usage_core_nano_seconds: Some(total),
            psi: c.cpu_psi,
        });
        let memory = c.memory_usage.map(|usage| {
            let ws = cgroup::working_set(usage, &c.memory_stat);
            MemoryStats {
                time: time.into(),
                available_bytes: c.memory_limit.or(capacity).map(|limit| limit.saturating_sub(ws)),
                usage_bytes: Some(usage),
                working_set_bytes: Some(ws),
                rss_bytes: c.memory_stat.rss(),
                page_faults: c.memory_stat.page_faults(),
                major_page_faults: c.memory_stat.major_page_faults(),
                psi: c.memory_psi,
            }
        });
        let swap = c.swap_usage.map(|used| SwapStats {
            time: time.into(),
            swap_available_bytes: c.swap_limit.map(|limit| limit.saturating_sub(used)),
            swap_usage_bytes: Some(used),
        });
        let io = c.io_psi.map(|psi| IoStats { time: time.into(), psi: Some(psi) });
        Usage { cpu, memory, swap, io }
    }
}

/// The system containers as upstream's summary lists them: `kubelet` (`kubeletCgroups`, else
/// the agent's own cgroup), `runtime` (`--runtime-cgroups`, else the cgroup of the process
/// serving the CRI socket), `misc` (`systemCgroups`, when set) and `pods` (`kubepods`).
fn system_containers(
    src: &Sources<'_>,
    hierarchy: Option<Hierarchy>,
    time: &str,
    at: i128,
    rates: &mut CpuRates,
) -> Vec<ContainerStats> {
    let Some(h) = hierarchy else { return Vec::new() };
    let mount = &src.cgroup_mount;
    let of_process = |pid: &str| {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        Cgroup::of_process(mount, h, &text)
    };
    let named = |name: &str| (!name.is_empty()).then(|| Cgroup::named(mount, h, name));
    let runtime_pid = || src.runtime_socket.as_deref().and_then(host::socket_peer_pid);
    let found = [
        ("kubelet", named(&src.cgroups.kubelet_cgroups).or_else(|| of_process("self")), host::process_start("self")),
        (
            "runtime",
            named(&src.cgroups.runtime_cgroups).or_else(|| runtime_pid().and_then(|pid| of_process(&pid.to_string()))),
            None,
        ),
        ("misc", named(&src.cgroups.system_cgroups), None),
        ("pods", src.pod_cgroups.map(|s| Cgroup::named(mount, h, &s.cgroup_name(&["kubepods"]))), None),
    ];
    found
        .into_iter()
        .filter_map(|(name, cgroup, started)| {
            let cgroup = cgroup.filter(|c| c.dir().is_dir())?;
            let c = cgroup.read();
            let usage = Usage::of(&c, time, rates.sample_opt(&format!("sys/{name}"), at, c.cpu_usage_nanos), None);
            // cAdvisor dates a raw cgroup by its directory; the agent by its own start.
            let started = started.or_else(|| host::modified(cgroup.dir()));
            Some(ContainerStats {
                name: name.into(),
                start_time: started.map(rfc3339).unwrap_or_default(),
                cpu: usage.cpu,
                memory: usage.memory,
                io: usage.io,
                swap: usage.swap,
                ..Default::default()
            })
        })
        .collect()
}

/// A container's CPU, memory, swap and IO as upstream's CRI stats provider shows them: from the
/// container's own cgroup where it is found (as cAdvisor reads it, with PSI on cgroup v2),
/// else the runtime's `ContainerStats` (swap zero and IO without pressure when the runtime
/// reports none, as upstream fills them).
fn container_usage(
    cs: &mut ContainerStats,
    id: &str,
    cri: Option<&api::ContainerStats>,
    cgroup: Option<&Counters>,
    time: &str,
    at: i128,
    rates: &mut CpuRates,
) {
    let own = cgroup.map(|c| Usage::of(c, time, c.cpu_usage_nanos.and_then(|t| rates.sample(id, at, t)), None));
    let own = own.unwrap_or_default();
    let val = |v: &Option<api::UInt64Value>| v.as_ref().map(|v| v.value);
    cs.cpu = own.cpu.or_else(|| {
        let cpu = cri?.cpu.as_ref()?;
        let total = val(&cpu.usage_core_nano_seconds);
        let rate = total.and_then(|t| rates.sample(id, at, t));
        Some(CpuStats {
            time: time.into(),
            usage_nano_cores: rate.or(val(&cpu.usage_nano_cores)),
            usage_core_nano_seconds: total,
            psi: None,
        })
    });
    cs.memory = own.memory.or_else(|| Some(memory_from_cri(cri?.memory.as_ref()?, time)));
    cs.swap = own.swap.or_else(|| {
        let swap = cri.and_then(|s| s.swap.as_ref());
        Some(SwapStats {
            time: time.into(),
            swap_available_bytes: Some(swap.and_then(|s| val(&s.swap_available_bytes)).unwrap_or(0)),
            swap_usage_bytes: Some(swap.and_then(|s| val(&s.swap_usage_bytes)).unwrap_or(0)),
        })
    });
    cs.io = own.io.or(Some(IoStats { time: time.into(), psi: None }));
}

/// The pod's own cgroup, named as the agent names it (its QoS class and UID below `kubepods`).
fn pod_cgroup(src: &Sources<'_>, hierarchy: Hierarchy, pod: &Pod) -> Option<Cgroup> {
    let name = src.pod_cgroups?.cgroup_name(&qos::cgroup_components(qos::class(pod), spec::uid(pod)));
    Some(Cgroup::named(&src.cgroup_mount, hierarchy, &name)).filter(|c| c.dir().is_dir())
}

/// Pod CPU and memory as upstream's CRI stats provider reports them: the pod cgroup's files
/// (with swap, IO pressure and the process count), else the runtime's pod sandbox stats, else
/// the sum of the containers (the pause container's few hundred KiB left out).
fn pod_totals(
    ps: &mut PodStats,
    time: &str,
    at: i128,
    rates: &mut CpuRates,
    cgroup: Option<&Counters>,
    sandbox: Option<&SandboxStats>,
) {
    let key = format!("pod/{}", ps.pod_ref.uid);
    if let Some(c) = cgroup {
        let usage = Usage::of(c, time, rates.sample_opt(&key, at, c.cpu_usage_nanos), None);
        (ps.cpu, ps.memory, ps.swap, ps.io) = (usage.cpu, usage.memory, usage.swap, usage.io);
        ps.process_stats = c.processes.map(|n| ProcessStats { process_count: Some(n) });
        return;
    }
    if let Some(s) = sandbox.filter(|s| s.cpu_total.is_some()) {
        let total = s.cpu_total;
        ps.cpu = Some(CpuStats {
            time: time.into(),
            usage_nano_cores: rates.sample_opt(&key, at, total),
            usage_core_nano_seconds: total,
            psi: None,
        });
        ps.memory = s.memory.clone();
        return;
    }
    let sum = |f: &dyn Fn(&ContainerStats) -> Option<u64>| -> Option<u64> {
        ps.containers.iter().map(f).try_fold(0u64, |acc, v| Some(acc + v?))
    };
    let total = sum(&|c| c.cpu.as_ref()?.usage_core_nano_seconds);
    let nano_cores = sum(&|c| c.cpu.as_ref()?.usage_nano_cores);
    let own_rate = rates.sample_opt(&key, at, total);
    ps.cpu = Some(CpuStats {
        time: time.into(),
        usage_nano_cores: nano_cores.or(own_rate),
        usage_core_nano_seconds: total,
        psi: None,
    });
    ps.memory = Some(MemoryStats {
        time: time.into(),
        available_bytes: None,
        usage_bytes: sum(&|c| c.memory.as_ref()?.usage_bytes),
        working_set_bytes: sum(&|c| c.memory.as_ref()?.working_set_bytes),
        rss_bytes: sum(&|c| c.memory.as_ref()?.rss_bytes),
        page_faults: sum(&|c| c.memory.as_ref()?.page_faults),
        major_page_faults: sum(&|c| c.memory.as_ref()?.major_page_faults),
        psi: None,
    });
}

/// Upstream's `IsLocalEphemeralVolume`: the volumes whose data is on the node's disk for the
/// pod's lifetime (disk emptyDir, configMap, gitRepo) count as its ephemeral storage; tmpfs
/// volumes (secret, projected, downward API, memory emptyDir) do not.
fn is_local_ephemeral(v: &Volume) -> bool {
    v.git_repo.is_some()
        || v.empty_dir.as_ref().is_some_and(|e| e.medium.as_deref().unwrap_or_default().is_empty())
        || v.config_map.is_some()
}

/// Ephemeral storage as upstream counts it (`calcEphemeralStorage`): writable layers, logs,
/// the local ephemeral volumes and the pod's own files (`/etc/hosts`, pod-level log files), on
/// the kubelet's root filesystem.
fn ephemeral(ps: &PodStats, pod: &Pod, root_fs: Option<&FsStats>, pod_files: (u64, u64), time: &str) -> FsStats {
    let ephemeral_volumes: Vec<&VolumeStats> = spec_volumes(pod)
        .iter()
        .filter(|v| is_local_ephemeral(v))
        .filter_map(|v| ps.volume.iter().find(|s| s.name == v.name))
        .collect();
    let containers = ps.containers.iter().flat_map(|c| [c.rootfs.as_ref(), c.logs.as_ref()]).flatten();
    let all = containers.chain(ephemeral_volumes.iter().map(|v| &v.fs));
    let (used, inodes) =
        all.fold(pod_files, |(b, i), f| (b + f.used_bytes.unwrap_or(0), i + f.inodes_used.unwrap_or(0)));
    FsStats {
        used_bytes: Some(used),
        inodes_used: Some(inodes),
        ..root_fs.cloned().unwrap_or(FsStats { time: time.into(), ..Default::default() })
    }
}

pub(super) fn spec_volumes(pod: &Pod) -> &[Volume] {
    pod.spec.as_ref().and_then(|s| s.volumes.as_deref()).unwrap_or_default()
}

async fn image_fs(images: &ImageClient, time: &str) -> Option<FsStats> {
    let info = images.image_fs_info(api::ImageFsInfoRequest::default()).await.ok()?;
    let fs = info.image_filesystems.first()?;
    let mountpoint = fs.fs_id.as_ref().map(|id| id.mountpoint.clone()).unwrap_or_default();
    let base =
        host::filesystem(Path::new(&mountpoint), time).unwrap_or(FsStats { time: time.into(), ..Default::default() });
    Some(FsStats {
        used_bytes: fs.used_bytes.as_ref().map(|v| v.value),
        inodes_used: fs.inodes_used.as_ref().map(|v| v.value),
        ..base
    })
}

/// What we know about a pod from its sandbox.
#[derive(Debug, Default)]
struct SandboxStats {
    cpu_total: Option<u64>,
    memory: Option<MemoryStats>,
    network: Option<NetworkStats>,
}

/// Per pod UID: the runtime's sandbox stats, or the sandbox network namespace's counters.
async fn sandbox_stats(
    runtime: &RuntimeClient,
    owned: &HashMap<String, String>,
    cache: &StatsCache,
) -> HashMap<String, SandboxStats> {
    let time = rfc3339(Timestamp::now());
    let mut out = HashMap::new();
    if !cache.no_sandbox_stats.load(Ordering::Relaxed) {
        let filter = api::PodSandboxStatsFilter { label_selector: owned.clone(), ..Default::default() };
        match runtime.list_pod_sandbox_stats(api::ListPodSandboxStatsRequest { filter: Some(filter) }).await {
            Ok(resp) => {
                for s in resp.stats {
                    let Some(uid) = s.attributes.as_ref().and_then(|a| a.labels.get(labels::POD_UID).cloned()) else {
                        continue;
                    };
                    let Some(linux) = s.linux else { continue };
                    out.insert(uid, from_cri_sandbox(linux, &time));
                }
                return out;
            }
            Err(e) if e.code() == Some(gantry_cri::Code::Unimplemented) => {
                tracing::info!(
                    "the runtime does not implement ListPodSandboxStats; reading sandbox namespaces instead"
                );
                cache.no_sandbox_stats.store(true, Ordering::Relaxed);
            }
            Err(e) => tracing::debug!(error = %e, "ListPodSandboxStats failed"),
        }
    }
    let ready = api::PodSandboxFilter {
        state: Some(api::PodSandboxStateValue { state: api::PodSandboxState::SandboxReady as i32 }),
        label_selector: owned.clone(),
        ..Default::default()
    };
    let Ok(sandboxes) = runtime.list_pod_sandbox(api::ListPodSandboxRequest { filter: Some(ready) }).await else {
        return out;
    };
    // A sandbox keeps its process for life: ask the runtime (a verbose status, the slow part
    // of a scrape) once per sandbox, a few at a time.
    let known: HashMap<String, u32> = cache.sandbox_pids.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let missing: Vec<String> =
        sandboxes.items.iter().filter(|sb| !known.contains_key(&sb.id)).map(|sb| sb.id.clone()).collect();
    let found: Vec<(String, u32)> = futures::stream::iter(missing)
        .map(|id| async move {
            let req = api::PodSandboxStatusRequest { pod_sandbox_id: id.clone(), verbose: true };
            let status = runtime.pod_sandbox_status(req).await.ok()?;
            Some((id, sandbox_pid(&status.info)?))
        })
        .buffer_unordered(8)
        .filter_map(|r| async move { r })
        .collect()
        .await;
    let pids = {
        let mut pids = cache.sandbox_pids.lock().unwrap_or_else(|p| p.into_inner());
        pids.extend(found);
        pids.retain(|id, _| sandboxes.items.iter().any(|sb| &sb.id == id));
        pids.clone()
    };
    for sb in &sandboxes.items {
        let Some(uid) = sb.labels.get(labels::POD_UID).cloned() else { continue };
        let Some(pid) = pids.get(&sb.id) else { continue };
        let network = host::network(&PathBuf::from(format!("/proc/{pid}"))).map(|(default, interfaces)| NetworkStats {
            time: time.clone(),
            default,
            interfaces,
        });
        out.insert(uid, SandboxStats { network, ..Default::default() });
    }
    out
}

/// containerd's verbose sandbox status carries `{"pid": N, ...}` under `info`.
fn sandbox_pid(info: &HashMap<String, String>) -> Option<u32> {
    let v: serde_json::Value = serde_json::from_str(info.get("info")?).ok()?;
    v.get("pid")?.as_u64().filter(|p| *p > 0).map(|p| p as u32)
}

/// The runtime's memory figures, for a cgroup Gantry cannot read itself (no PSI from CRI).
fn memory_from_cri(m: &api::MemoryUsage, time: &str) -> MemoryStats {
    let val = |v: &Option<api::UInt64Value>| v.as_ref().map(|v| v.value);
    MemoryStats {
        time: time.into(),
        available_bytes: val(&m.available_bytes),
        usage_bytes: val(&m.usage_bytes),
        working_set_bytes: val(&m.working_set_bytes),
        rss_bytes: val(&m.rss_bytes),
        page_faults: val(&m.page_faults),
        major_page_faults: val(&m.major_page_faults),
        psi: None,
    }
}

fn from_cri_sandbox(linux: api::LinuxPodSandboxStats, time: &str) -> SandboxStats {
    let val = |v: &Option<api::UInt64Value>| v.as_ref().map(|v| v.value);
    let iface = |i: &api::NetworkInterfaceUsage| InterfaceStats {
        name: i.name.clone(),
        rx_bytes: val(&i.rx_bytes).unwrap_or(0),
        rx_errors: val(&i.rx_errors).unwrap_or(0),
        tx_bytes: val(&i.tx_bytes).unwrap_or(0),
        tx_errors: val(&i.tx_errors).unwrap_or(0),
    };
    SandboxStats {
        cpu_total: linux.cpu.as_ref().and_then(|c| val(&c.usage_core_nano_seconds)),
        memory: linux.memory.as_ref().map(|m| memory_from_cri(m, time)),
        network: linux.network.as_ref().and_then(|n| {
            Some(NetworkStats {
                time: time.into(),
                default: n.default_interface.as_ref().map(iface)?,
                interfaces: n.interfaces.iter().map(iface).collect(),
            })
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_psi_gate_no_pressure_is_reported_anywhere() {
        let psi = Some(PsiStats::default());
        let cpu = || Some(CpuStats { psi, ..Default::default() });
        let memory = || Some(MemoryStats { psi, ..Default::default() });
        let io = || Some(IoStats { time: String::new(), psi });
        let container = || ContainerStats { cpu: cpu(), memory: memory(), io: io(), ..Default::default() };
        let mut summary = Summary {
            node: NodeStats {
                cpu: cpu(),
                memory: memory(),
                io: io(),
                system_containers: vec![container()],
                ..Default::default()
            },
            pods: vec![PodStats {
                cpu: cpu(),
                memory: memory(),
                io: io(),
                containers: vec![container()],
                ..Default::default()
            }],
        };
        let before = serde_json::to_string(&summary).unwrap();
        assert_eq!(before.matches("\"psi\"").count(), 12, "{before}");
        without_psi(&mut summary);
        let after = serde_json::to_string(&summary).unwrap();
        assert!(!after.contains("psi") && !after.contains("\"io\""), "{after}");
        assert_eq!(after.matches("\"cpu\"").count(), 4, "CPU and memory stay: {after}");
    }

    #[test]
    fn container_usage_prefers_the_container_cgroup_and_fills_what_upstream_fills() {
        let cri = api::ContainerStats {
            cpu: Some(api::CpuUsage {
                usage_core_nano_seconds: Some(api::UInt64Value { value: 5 }),
                ..Default::default()
            }),
            memory: Some(api::MemoryUsage {
                working_set_bytes: Some(api::UInt64Value { value: 7 }),
                ..Default::default()
            }),
            ..Default::default()
        };
        // Without a cgroup: the runtime's figures, swap zero, IO without pressure.
        let mut cs = ContainerStats::default();
        container_usage(&mut cs, "c", Some(&cri), None, "t", 0, &mut CpuRates::default());
        assert_eq!(cs.cpu.as_ref().unwrap().usage_core_nano_seconds, Some(5));
        assert_eq!(cs.memory.as_ref().unwrap().working_set_bytes, Some(7));
        let swap = cs.swap.unwrap();
        assert_eq!((swap.swap_usage_bytes, swap.swap_available_bytes), (Some(0), Some(0)));
        assert_eq!(cs.io, Some(IoStats { time: "t".into(), psi: None }));
        // With the container's cgroup (v2): its counters, swap and pressure win.
        let psi = Some(PsiStats { some: PsiData { total: 3, ..Default::default() }, ..Default::default() });
        let own = Counters {
            cpu_usage_nanos: Some(9),
            memory_usage: Some(100),
            swap_usage: Some(4),
            swap_limit: Some(10),
            cpu_psi: psi,
            memory_psi: psi,
            io_psi: psi,
            ..Default::default()
        };
        let mut cs = ContainerStats::default();
        container_usage(&mut cs, "c", Some(&cri), Some(&own), "t", 0, &mut CpuRates::default());
        let cpu = cs.cpu.unwrap();
        assert_eq!((cpu.usage_core_nano_seconds, cpu.psi), (Some(9), psi));
        let memory = cs.memory.unwrap();
        assert_eq!((memory.working_set_bytes, memory.psi), (Some(100), psi));
        let swap = cs.swap.unwrap();
        assert_eq!((swap.swap_usage_bytes, swap.swap_available_bytes), (Some(4), Some(6)));
        assert_eq!(cs.io.unwrap().psi, psi);
    }

    #[test]
    fn sandbox_pid_from_verbose_info() {
        let info = HashMap::from([("info".to_string(), r#"{"pid": 42, "processStatus": "running"}"#.to_string())]);
        assert_eq!(sandbox_pid(&info), Some(42));
        assert_eq!(sandbox_pid(&HashMap::new()), None);
    }

    #[test]
    fn pod_totals_sum_containers_and_keep_missing_values_missing() {
        let mem = |ws| MemoryStats { working_set_bytes: Some(ws), usage_bytes: Some(ws + 1), ..Default::default() };
        let cpu =
            |t| CpuStats { usage_core_nano_seconds: Some(t), usage_nano_cores: Some(t / 10), ..Default::default() };
        let mut ps = PodStats {
            containers: vec![
                ContainerStats { cpu: Some(cpu(100)), memory: Some(mem(10)), ..Default::default() },
                ContainerStats { cpu: Some(cpu(200)), memory: Some(mem(20)), ..Default::default() },
            ],
            ..Default::default()
        };
        pod_totals(&mut ps, "t", 0, &mut CpuRates::default(), None, None);
        let m = ps.memory.unwrap();
        assert_eq!((m.working_set_bytes, m.usage_bytes, m.rss_bytes), (Some(30), Some(32), None));
        let c = ps.cpu.unwrap();
        assert_eq!((c.usage_core_nano_seconds, c.usage_nano_cores), (Some(300), Some(30)));
    }

    #[test]
    fn json_shape_matches_statsapi() {
        let s = Summary {
            node: NodeStats { node_name: "n".into(), ..Default::default() },
            pods: vec![PodStats { ephemeral_storage: Some(FsStats::default()), ..Default::default() }],
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["node"]["nodeName"], "n");
        assert!(v["pods"][0]["podRef"].is_object());
        assert!(v["pods"][0]["ephemeral-storage"].is_object());
        let n = NetworkStats {
            time: "t".into(),
            default: InterfaceStats { name: "eth0".into(), rx_bytes: 1, ..Default::default() },
            interfaces: vec![],
        };
        let v = serde_json::to_value(&n).unwrap();
        assert_eq!((v["name"].as_str(), v["rxBytes"].as_u64()), (Some("eth0"), Some(1)));
    }
}
