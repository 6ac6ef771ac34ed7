//! Pod cgroups (`cgroupsPerQOS`): every pod runs under `kubepods[/<qos>]/pod<uid>` below
//! `cgroupRoot`, with the pod's limits on it. Which cgroups and values a pod needs is pure
//! ([`plan`]); touching the cgroup file system is behind [`CgroupFs`], with one implementation
//! per hierarchy: [`CgroupV1`] (a tree per controller) and [`CgroupV2`] (the unified tree, where
//! shares become `cpu.weight` and limits go to `cpu.max`, `memory.max` and `pids.max`).
//!
//! With the `systemd` driver, the names are systemd slices, which systemd creates and limits
//! when Gantry asks over D-Bus ([`super::systemd`]).

use std::io;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

use std::collections::BTreeMap;

use gantry_config::{CgroupDriver, PodSettings, ReservedLimits};
use gantry_pod::qos::{self, QosClass};
use gantry_pod::resources::{self, CgroupValues};
use gantry_vocab::quantity;
use gantry_vocab::spec;

/// The cgroups a pod needs, outermost first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCgroups {
    /// What the runtime gets as the sandbox's `cgroup_parent`.
    pub parent: String,
    /// cgroupfs paths to create, with the values to set (the pod's own cgroup only).
    pub create: Vec<(String, Option<CgroupValues>)>,
}

/// The pod's cgroup parent and the cgroups Gantry creates for it (with systemd: the slices
/// Gantry asks systemd for).
/// `kubepods` gets `kubepods_limits` (node allocatable enforcement).
pub fn plan(settings: &PodSettings, kubepods_limits: Option<CgroupValues>, pod: &Pod) -> PodCgroups {
    if !settings.cgroups_per_qos {
        return PodCgroups { parent: settings.cgroup_root.clone(), create: Vec::new() };
    }
    let parts = qos::cgroup_components(qos::class(pod), spec::uid(pod));
    let create = (1..=parts.len())
        .map(|n| {
            let values = match parts[n - 1].as_str() {
                _ if n == parts.len() => Some(pod_values(settings, pod)),
                "kubepods" if n == 1 => kubepods_limits,
                // Upstream gives BestEffort pods together the minimum CPU weight.
                "besteffort" => Some(CgroupValues { cpu_shares: resources::shares(0), ..Default::default() }),
                _ => None,
            };
            (settings.cgroup_name(&parts[..n]), values)
        })
        .collect();
    PodCgroups { parent: settings.cgroup_name(&parts), create }
}

/// The pod cgroup's values: its resources and `podPidsLimit` (-1: explicitly unlimited).
fn pod_values(settings: &PodSettings, pod: &Pod) -> CgroupValues {
    let pids_limit = if settings.pod_pids_limit > 0 { settings.pod_pids_limit } else { -1 };
    CgroupValues { pids_limit, ..resources::pod(pod) }
}

/// Every path the pod's own cgroup can have, one per QoS class, so removing it needs no pod
/// spec. The QoS levels are shared and stay.
pub fn pod_paths(settings: &PodSettings, uid: &str) -> Vec<String> {
    [QosClass::Guaranteed, QosClass::Burstable, QosClass::BestEffort]
        .into_iter()
        .map(|class| settings.cgroup_name(&qos::cgroup_components(class, uid)))
        .collect()
}

/// The cgroups pod cgroups live in (the Guaranteed pods' parent and the two QoS levels).
pub fn qos_paths(settings: &PodSettings) -> Vec<String> {
    [&["kubepods"][..], &["kubepods", "burstable"], &["kubepods", "besteffort"]]
        .into_iter()
        .map(|parts| settings.cgroup_name(parts))
        .collect()
}

/// What the QoS levels should get for the active pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QosWanted {
    /// The Burstable level's CPU shares (upstream's `setCPUCgroupConfig`).
    pub burstable_shares: i64,
    /// `memory.min` of the Burstable level and of `kubepods` under MemoryQoS
    /// (upstream's `setMemoryQoS`).
    pub memory_min: (i64, i64),
}

/// The QoS levels' values: the Burstable level gets `burstable_shares`, the BestEffort level
/// the minimum shares; with `memory_min` (MemoryQoS), the Burstable level and `kubepods` get
/// their `memory.min` (a zero one is left alone, as upstream).
pub fn qos_levels(
    settings: &PodSettings,
    burstable_shares: i64,
    memory_min: Option<(i64, i64)>,
) -> Vec<(String, CgroupValues)> {
    let (burstable_min, kubepods_min) = memory_min.unwrap_or_default();
    let mut levels = vec![
        (
            settings.cgroup_name(&["kubepods", "burstable"]),
            CgroupValues { cpu_shares: burstable_shares, memory_min: burstable_min, ..Default::default() },
        ),
        (
            settings.cgroup_name(&["kubepods", "besteffort"]),
            CgroupValues { cpu_shares: resources::shares(0), ..Default::default() },
        ),
    ];
    if kubepods_min > 0 {
        levels.push((
            settings.cgroup_name(&["kubepods"]),
            CgroupValues { memory_min: kubepods_min, ..Default::default() },
        ));
    }
    levels
}

/// A reserved cgroup's limits as upstream's `getCgroupConfig` computes them from the
/// reservation: CPU shares, and unless only compressible resources are enforced, the memory
/// limit and PIDs. None for an empty reservation (upstream: "not configured properly").
pub fn reserved_values(reserved: &BTreeMap<String, String>, limits: ReservedLimits) -> Option<CgroupValues> {
    if reserved.is_empty() || limits == ReservedLimits::Off {
        return None;
    }
    // The quantities were validated with the configuration.
    let units = |name: &str| reserved.get(name).and_then(|q| quantity::parse_units(q).ok()).map_or(0, |v| v as i64);
    let mut values = CgroupValues::default();
    if let Some(cpu) = reserved.get("cpu").and_then(|q| quantity::parse_milli(q).ok()) {
        values.cpu_shares = resources::shares(cpu);
    }
    if limits == ReservedLimits::All {
        values.memory_limit = units("memory");
        values.pids_limit = units("pid");
    }
    Some(values)
}

/// Why a reserved cgroup's limits could not be enforced (a start-up error, as upstream).
#[derive(Debug, thiserror::Error)]
#[error("Failed to enforce {which} Cgroup Limits on {cgroup:?}: {problem}")]
pub struct ReservedError {
    /// `Kube Reserved` or `System Reserved`.
    pub which: &'static str,
    pub cgroup: String,
    #[source]
    pub problem: ReservedProblem,
}

#[derive(Debug, thiserror::Error)]
pub enum ReservedProblem {
    #[error("{0:?} cgroup is not configured properly")]
    NotConfigured(String),
    #[error("cgroup {cgroup:?} has some missing paths: {paths}")]
    Missing { cgroup: String, paths: String },
    #[error(transparent)]
    Update(#[from] io::Error),
}

/// The directories an existing cgroup has on the hierarchy (each v1 controller's on v1) that
/// are missing, as upstream's `Validate` lists them.
pub fn missing_paths(mount: &Path, hierarchy: Hierarchy, path: &str) -> Vec<PathBuf> {
    let roots = match hierarchy {
        Hierarchy::V2 => vec![mount.to_path_buf()],
        Hierarchy::V1 => ["cpu", "memory", "pids"].iter().map(|c| mount.join(c)).filter(|d| d.is_dir()).collect(),
    };
    roots.into_iter().map(|r| r.join(path.trim_start_matches('/'))).filter(|d| !d.is_dir()).collect()
}

/// The pod UID a child cgroup of a QoS level belongs to: `pod<uid>` (cgroupfs) or
/// `kubepods-burstable-pod<uid with underscores>.slice` (systemd).
fn pod_uid(driver: CgroupDriver, child: &str) -> Option<String> {
    match driver {
        CgroupDriver::Cgroupfs => child.strip_prefix("pod").map(str::to_string),
        CgroupDriver::Systemd => {
            let last = child.strip_suffix(".slice")?.rsplit('-').next()?;
            last.strip_prefix("pod").map(|uid| uid.replace('_', "-"))
        }
    }
}

/// The pod cgroups among `children` of `parent` whose pod is not in `keep` (upstream's
/// orphaned pod cgroup cleanup).
pub fn orphans(driver: CgroupDriver, parent: &str, children: &[String], keep: impl Fn(&str) -> bool) -> Vec<String> {
    children
        .iter()
        .filter(|c| pod_uid(driver, c).is_some_and(|uid| !keep(&uid)))
        .map(|c| format!("{}/{c}", parent.trim_end_matches('/')))
        .collect()
}

/// Gantry's and the runtime's cgroup drivers differ: containers would land outside the pod
/// cgroups, or the runtime refuses the cgroup parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "cgroup driver mismatch: Gantry's cgroupDriver is {:?} but the container runtime uses the {:?} cgroup driver (containerd: SystemdCgroup = {} in the runc runtime options); configure both with the same driver",
    .ours.as_str(), .runtime.as_str(), *.runtime == CgroupDriver::Systemd
)]
pub struct DriverMismatch {
    pub ours: CgroupDriver,
    pub runtime: CgroupDriver,
}

/// Checks the driver the runtime reports (CRI `RuntimeConfig`, containerd 2.x) against ours.
pub fn check_runtime_driver(ours: CgroupDriver, runtime: CgroupDriver) -> Result<(), DriverMismatch> {
    if ours == runtime { Ok(()) } else { Err(DriverMismatch { ours, runtime }) }
}

/// The mismatch behind a failed sandbox creation, for runtimes that do not report their
/// driver (containerd 1.6): runc under its systemd driver refuses a cgroupfs parent.
pub fn mismatch_in_sandbox_error(ours: CgroupDriver, message: &str) -> Option<DriverMismatch> {
    let systemd_wants_slice = message.contains("expected cgroupsPath to be of format") && message.contains("systemd");
    (ours == CgroupDriver::Cgroupfs && systemd_wants_slice)
        .then_some(DriverMismatch { ours, runtime: CgroupDriver::Systemd })
}

/// The mismatch the other way round, which the sandbox's creation does not reveal: containerd
/// 1.6 passes a `.slice` parent to runc in systemd's `slice:prefix:id` form, and runc under its
/// cgroupfs driver takes that as a relative path below its own cgroup, so the sandbox's process
/// (`/proc/<pid>/cgroup`) ends up outside the pod's slice `parent`.
pub fn mismatch_in_sandbox_cgroup(ours: CgroupDriver, parent: &str, proc_cgroup: &str) -> Option<DriverMismatch> {
    let inside = proc_cgroup.lines().any(|l| l.splitn(3, ':').nth(2).is_some_and(|path| path.starts_with(parent)));
    (ours == CgroupDriver::Systemd && !inside).then_some(DriverMismatch { ours, runtime: CgroupDriver::Cgroupfs })
}

/// The cgroup file system.
pub trait CgroupFs: Send + Sync {
    /// Creates the cgroup in every hierarchy (idempotent) and sets the values given.
    fn ensure(&self, path: &str, values: Option<&CgroupValues>) -> io::Result<()>;
    /// Removes the (empty) cgroup from every hierarchy; a missing one is not an error.
    fn remove(&self, path: &str) -> io::Result<()>;
    /// The names of the cgroup's child cgroups.
    fn children(&self, path: &str) -> Vec<String>;
}

/// cgroup v1 as mounted under `/sys/fs/cgroup/<controller>`.
pub struct CgroupV1 {
    mount: PathBuf,
    /// Found once: the mounts do not change while the node runs, and looking them up again
    /// for each of a pod's three cgroup levels cost 2% of the agent's CPU while 110 pods
    /// started.
    hierarchies: Vec<PathBuf>,
}

impl CgroupV1 {
    pub fn new(mount: impl Into<PathBuf>) -> Self {
        let mount = mount.into();
        CgroupV1 { hierarchies: Self::find_hierarchies(&mount), mount }
    }

    /// The v1 hierarchies, each once (`cpu` and `cpuacct` are often links to `cpu,cpuacct`);
    /// the v2 `unified` tree of a hybrid setup is not one.
    fn find_hierarchies(mount: &Path) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = Vec::new();
        for entry in std::fs::read_dir(mount).into_iter().flatten().flatten() {
            if entry.file_name() == "unified" {
                continue;
            }
            let Ok(real) = std::fs::canonicalize(entry.path()) else { continue };
            if real.is_dir() && !out.contains(&real) {
                out.push(real);
            }
        }
        out
    }
}

fn write(dir: &Path, file: &str, value: impl ToString) -> io::Result<()> {
    std::fs::write(dir.join(file), value.to_string())
        .map_err(|e| io::Error::new(e.kind(), format!("cannot write {}: {e}", dir.join(file).display())))
}

/// `pids.max`: the limit, or `max` for -1.
fn pids_max(limit: i64) -> String {
    if limit > 0 { limit.to_string() } else { "max".into() }
}

/// Creates the cgroup `path` below hierarchy `root`, parents first, and returns its directory.
/// In the cpuset hierarchy each level made now, and the cgroup itself, gets its parent's CPUs
/// and memory nodes; a parent that existed already was the cgroup of an earlier call (a pod's
/// levels are ensured one by one), so it is not read again.
fn create_levels(root: &Path, path: &str, cpuset: bool) -> io::Result<PathBuf> {
    let mut dir = root.to_path_buf();
    let mut parts = path.split('/').filter(|p| !p.is_empty()).peekable();
    while let Some(part) = parts.next() {
        dir.push(part);
        let made = match std::fs::create_dir(&dir) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(io::Error::new(e.kind(), format!("cannot create {}: {e}", dir.display()))),
        };
        if cpuset && (made || parts.peek().is_none()) {
            inherit_cpuset(&dir)?;
        }
    }
    Ok(dir)
}

/// A new cpuset cgroup starts with no CPUs and memory nodes; it gets its parent's.
fn inherit_cpuset(dir: &Path) -> io::Result<()> {
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let own = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        if own.trim().is_empty()
            && let Some(parent) = dir.parent()
        {
            std::fs::write(dir.join(file), std::fs::read_to_string(parent.join(file))?)?;
        }
    }
    Ok(())
}

impl CgroupFs for CgroupV1 {
    fn ensure(&self, path: &str, values: Option<&CgroupValues>) -> io::Result<()> {
        for h in &self.hierarchies {
            let name = h.file_name().unwrap_or_default().to_string_lossy().into_owned();
            let controllers: Vec<&str> = name.split(',').collect();
            let dir = create_levels(h, path, controllers.contains(&"cpuset"))?;
            let Some(v) = values else { continue };
            if controllers.contains(&"cpu") {
                if v.cpu_shares > 0 {
                    write(&dir, "cpu.shares", v.cpu_shares)?;
                }
                if v.cpu_quota > 0 {
                    write(&dir, "cpu.cfs_period_us", v.cpu_period)?;
                    write(&dir, "cpu.cfs_quota_us", v.cpu_quota)?;
                }
            }
            if controllers.contains(&"memory") && v.memory_limit > 0 {
                write(&dir, "memory.limit_in_bytes", v.memory_limit)?;
            }
            if controllers.contains(&"pids") && v.pids_limit != 0 {
                write(&dir, "pids.max", pids_max(v.pids_limit))?;
            }
        }
        Ok(())
    }

    fn children(&self, path: &str) -> Vec<String> {
        let dir = self.mount.join("memory").join(path.trim_start_matches('/'));
        let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
        entries.filter(|e| e.path().is_dir()).map(|e| e.file_name().to_string_lossy().into_owned()).collect()
    }

    fn remove(&self, path: &str) -> io::Result<()> {
        for h in &self.hierarchies {
            let dir = h.join(path.trim_start_matches('/'));
            match std::fs::remove_dir(&dir) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(io::Error::new(e.kind(), format!("cannot remove {}: {e}", dir.display())));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// The unified hierarchy (cgroup v2) as mounted on `/sys/fs/cgroup`.
pub struct CgroupV2 {
    mount: PathBuf,
}

/// The controllers pod cgroups use, where the kernel offers them (upstream's list plus `io`
/// for the I/O figures of `/stats/summary`).
const V2_CONTROLLERS: [&str; 6] = ["cpu", "cpuset", "memory", "pids", "hugetlb", "io"];

impl CgroupV2 {
    pub fn new(mount: impl Into<PathBuf>) -> Self {
        CgroupV2 { mount: mount.into() }
    }

    /// Enables in `dir`'s children the controllers `dir` has and does not pass on yet: a v2
    /// cgroup has a controller's files only if its parent's `cgroup.subtree_control` lists it.
    fn delegate(dir: &Path) -> io::Result<()> {
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        let (available, enabled) = (read("cgroup.controllers"), read("cgroup.subtree_control"));
        let missing: Vec<String> = V2_CONTROLLERS
            .into_iter()
            .filter(|c| available.split_whitespace().any(|a| a == *c) && !enabled.split_whitespace().any(|e| e == *c))
            .map(|c| format!("+{c}"))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        write(dir, "cgroup.subtree_control", missing.join(" "))
    }
}

/// Removes `dir` and the cgroups below it (a runtime's leftover container cgroups), deepest
/// first; a cgroup directory holds only kernel files, which rmdir ignores.
fn remove_tree(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&entry.path())?;
        }
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(io::Error::new(e.kind(), format!("cannot remove {}: {e}", dir.display())))
        }
        _ => Ok(()),
    }
}

impl CgroupFs for CgroupV2 {
    fn ensure(&self, path: &str, values: Option<&CgroupValues>) -> io::Result<()> {
        let mut dir = self.mount.clone();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            Self::delegate(&dir)?;
            dir.push(part);
            match std::fs::create_dir(&dir) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                    return Err(io::Error::new(e.kind(), format!("cannot create {}: {e}", dir.display())));
                }
                _ => {}
            }
        }
        let Some(v) = values else { return Ok(()) };
        if v.cpu_shares > 0 {
            write(&dir, "cpu.weight", resources::cpu_weight(v.cpu_shares))?;
        }
        if v.cpu_quota > 0 {
            write(&dir, "cpu.max", format!("{} {}", v.cpu_quota, v.cpu_period))?;
        }
        if v.memory_limit > 0 {
            write(&dir, "memory.max", v.memory_limit)?;
        }
        if v.memory_min > 0 {
            write(&dir, "memory.min", v.memory_min)?;
        }
        if v.pids_limit != 0 {
            write(&dir, "pids.max", pids_max(v.pids_limit))?;
        }
        Ok(())
    }

    fn remove(&self, path: &str) -> io::Result<()> {
        remove_tree(&self.mount.join(path.trim_start_matches('/')))
    }

    fn children(&self, path: &str) -> Vec<String> {
        let entries = std::fs::read_dir(self.mount.join(path.trim_start_matches('/'))).into_iter().flatten().flatten();
        entries.filter(|e| e.path().is_dir()).map(|e| e.file_name().to_string_lossy().into_owned()).collect()
    }
}

pub use gantry_config::{CGROUP_MOUNT as MOUNT, Hierarchy, cgroup_hierarchy as hierarchy};

/// Upstream's warning (and event message) on a cgroup v1 node.
pub const V1_DEPRECATED: &str = "cgroup v1 detected. cgroup v1 support has been transitioned into maintenance mode, please plan for the migration towards cgroup v2. More information at https://git.k8s.io/enhancements/keps/sig-node/4569-cgroup-v1-maintenance-mode";

/// Moves process `pid` into the cgroup `path` (a cgroupfs path, which must exist) in every
/// hierarchy.
pub fn attach(mount: &Path, hierarchy: Hierarchy, path: &str, pid: u32) -> io::Result<()> {
    let roots = match hierarchy {
        Hierarchy::V2 => vec![mount.to_path_buf()],
        Hierarchy::V1 => CgroupV1::find_hierarchies(mount),
    };
    for root in roots {
        write(&root.join(path.trim_start_matches('/')), "cgroup.procs", pid)?;
    }
    Ok(())
}

/// The processes directly in the root cgroup (on v1, the memory hierarchy's root).
pub fn root_processes(mount: &Path, hierarchy: Hierarchy) -> io::Result<Vec<u32>> {
    let root = match hierarchy {
        Hierarchy::V2 => mount.to_path_buf(),
        Hierarchy::V1 => mount.join("memory"),
    };
    let text = std::fs::read_to_string(root.join("cgroup.procs"))?;
    Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// The node's cgroup file system for the cgroupfs driver, on either hierarchy.
pub fn detect() -> Option<Box<dyn CgroupFs>> {
    let mount = Path::new(MOUNT);
    match hierarchy(mount)? {
        Hierarchy::V1 => Some(Box::new(CgroupV1::new(mount))),
        Hierarchy::V2 => Some(Box::new(CgroupV2::new(mount))),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn container(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        let list = |items: &[(&str, &str)]| {
            (!items.is_empty()).then(|| items.iter().map(|(k, v)| (k.to_string(), Quantity(v.to_string()))).collect())
        };
        let resources = ResourceRequirements { requests: list(requests), limits: list(limits), ..Default::default() };
        Container { name: "c".into(), resources: Some(resources), ..Default::default() }
    }

    fn pod(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: ObjectMeta { uid: Some("1-2".into()), ..Default::default() },
            spec: Some(PodSpec { containers: vec![container(requests, limits)], ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn cgroupfs_paths_by_qos() {
        let s = PodSettings::default();
        let guaranteed = plan(&s, None, &pod(&[], &[("cpu", "1"), ("memory", "1Gi")]));
        assert_eq!(guaranteed.parent, "/kubepods/pod1-2");
        assert_eq!(guaranteed.create.len(), 2);
        assert_eq!(guaranteed.create[1].1.unwrap().memory_limit, 1 << 30);
        let burstable = plan(&s, None, &pod(&[("memory", "1Mi")], &[]));
        assert_eq!(burstable.parent, "/kubepods/burstable/pod1-2");
        let paths: Vec<&str> = burstable.create.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(paths, ["/kubepods", "/kubepods/burstable", "/kubepods/burstable/pod1-2"]);
        assert!(burstable.create[1].1.is_none(), "QoS levels are only created");
        assert_eq!(
            pod_paths(&s, "1-2"),
            ["/kubepods/pod1-2", "/kubepods/burstable/pod1-2", "/kubepods/besteffort/pod1-2"]
        );
        let best_effort = plan(&s, None, &pod(&[], &[]));
        assert_eq!(best_effort.parent, "/kubepods/besteffort/pod1-2");
        assert_eq!(best_effort.create[1].1.unwrap().cpu_shares, 2, "the besteffort level gets the minimum weight");

        let rooted = PodSettings { cgroup_root: "/custom/".into(), ..Default::default() };
        let p = plan(&rooted, None, &pod(&[], &[]));
        assert_eq!(p.parent, "/custom/kubepods/besteffort/pod1-2");
        assert_eq!(p.create[0].0, "/custom/kubepods", "the root itself is not created");
    }

    #[test]
    fn kubepods_gets_the_allocatable_limits() {
        let limits = CgroupValues { cpu_shares: 2048, memory_limit: 1 << 30, ..Default::default() };
        let p = plan(&PodSettings::default(), Some(limits), &pod(&[], &[]));
        assert_eq!(p.create[0], ("/kubepods".to_string(), Some(limits)));
    }

    #[test]
    fn systemd_slices() {
        let s = PodSettings { cgroup_driver: CgroupDriver::Systemd, ..Default::default() };
        let p = plan(&s, None, &pod(&[("memory", "1Mi")], &[]));
        assert_eq!(p.parent, "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice");
        let slices: Vec<&str> = p.create.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            slices,
            [
                "/kubepods.slice",
                "/kubepods.slice/kubepods-burstable.slice",
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice"
            ]
        );
        assert_eq!(pod_paths(&s, "1-2")[0], "/kubepods.slice/kubepods-pod1_2.slice");
        let g = plan(&s, None, &pod(&[], &[("cpu", "1"), ("memory", "1Gi")]));
        assert_eq!(g.parent, "/kubepods.slice/kubepods-pod1_2.slice");
        let rooted = PodSettings { cgroup_root: "kubelet.slice".into(), ..s };
        assert_eq!(plan(&rooted, None, &pod(&[], &[])).parent.split('/').nth(1), Some("kubelet.slice"));
    }

    #[test]
    fn orphaned_pod_cgroups() {
        let s = PodSettings { cgroup_root: "/r".into(), ..Default::default() };
        assert_eq!(qos_paths(&s), ["/r/kubepods", "/r/kubepods/burstable", "/r/kubepods/besteffort"]);
        let children = ["burstable", "besteffort", "poda", "podb"].map(String::from);
        assert_eq!(orphans(CgroupDriver::Cgroupfs, "/r/kubepods", &children, |uid| uid == "a"), ["/r/kubepods/podb"]);
        let slices = ["kubepods-burstable.slice", "kubepods-pod1_2.slice", "kubepods-pod3_4.slice"].map(String::from);
        assert_eq!(
            orphans(CgroupDriver::Systemd, "/kubepods.slice", &slices, |uid| uid == "1-2"),
            ["/kubepods.slice/kubepods-pod3_4.slice"]
        );
    }

    #[test]
    fn driver_mismatch_names_both_settings() {
        assert_eq!(check_runtime_driver(CgroupDriver::Systemd, CgroupDriver::Systemd), Ok(()));
        let e = check_runtime_driver(CgroupDriver::Systemd, CgroupDriver::Cgroupfs).unwrap_err().to_string();
        assert!(e.contains("cgroupDriver is \"systemd\"") && e.contains("SystemdCgroup = false"), "{e}");
        let runc = r#"failed to create containerd task: OCI runtime create failed: expected cgroupsPath to be of format "slice:prefix:name" for systemd cgroups, got "/kubepods/besteffort/pod1/abc" instead: unknown"#;
        let m = mismatch_in_sandbox_error(CgroupDriver::Cgroupfs, runc).unwrap();
        assert_eq!(m.runtime, CgroupDriver::Systemd);
        assert!(m.to_string().contains("SystemdCgroup = true"), "{m}");
        assert_eq!(mismatch_in_sandbox_error(CgroupDriver::Cgroupfs, "image not found"), None);
    }

    #[test]
    fn reserved_cgroup_values() {
        let reserved: BTreeMap<String, String> =
            [("cpu", "500m"), ("memory", "256Mi"), ("pid", "1000")].map(|(k, v)| (k.into(), v.into())).into();
        let all = reserved_values(&reserved, ReservedLimits::All).unwrap();
        assert_eq!((all.cpu_shares, all.memory_limit, all.pids_limit), (512, 256 << 20, 1000));
        let cpu = reserved_values(&reserved, ReservedLimits::CpuOnly).unwrap();
        assert_eq!((cpu.cpu_shares, cpu.memory_limit, cpu.pids_limit), (512, 0, 0), "compressible only");
        assert_eq!(reserved_values(&BTreeMap::new(), ReservedLimits::All), None);
        assert_eq!(reserved_values(&reserved, ReservedLimits::Off), None);
    }

    #[test]
    fn missing_reserved_cgroups_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("system.slice")).unwrap();
        assert!(missing_paths(dir.path(), Hierarchy::V2, "/system.slice").is_empty());
        assert_eq!(missing_paths(dir.path(), Hierarchy::V2, "/kube.slice"), [dir.path().join("kube.slice")]);
    }

    #[test]
    fn systemd_parent_under_a_cgroupfs_runtime_is_a_mismatch() {
        let parent = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice";
        let stray = "0::/system.slice/containerd.service/kubepods-besteffort-pod1.slice:cri-containerd:ab\n";
        let m = mismatch_in_sandbox_cgroup(CgroupDriver::Systemd, parent, stray).unwrap();
        let text = m.to_string();
        assert!(text.contains("cgroupDriver is \"systemd\"") && text.contains("SystemdCgroup = false"), "{text}");
        let inside = format!("0::{parent}/cri-containerd-ab.scope\n");
        assert_eq!(mismatch_in_sandbox_cgroup(CgroupDriver::Systemd, parent, &inside), None);
        assert_eq!(mismatch_in_sandbox_cgroup(CgroupDriver::Cgroupfs, parent, stray), None);
    }

    #[test]
    fn qos_levels_get_their_shares() {
        let s = PodSettings { cgroup_root: "/r".into(), ..Default::default() };
        let levels = qos_levels(&s, 307, None);
        let [(burstable, b), (besteffort, be)] = &levels[..] else { panic!("{levels:?}") };
        assert_eq!((burstable.as_str(), b.cpu_shares), ("/r/kubepods/burstable", 307));
        assert_eq!((besteffort.as_str(), be.cpu_shares), ("/r/kubepods/besteffort", 2));
        assert_eq!((b.memory_limit, b.cpu_quota, b.pids_limit, b.memory_min), (0, 0, 0, 0), "nothing else is set");
        // MemoryQoS: the Burstable level and kubepods protect their pods' requests.
        let levels = qos_levels(&s, 307, Some((64, 96)));
        assert_eq!(levels[0].1.memory_min, 64);
        assert_eq!(levels[2], ("/r/kubepods".to_string(), CgroupValues { memory_min: 96, ..Default::default() }));
    }

    #[test]
    fn without_cgroups_per_qos_the_root_is_the_parent() {
        let s = PodSettings { cgroups_per_qos: false, cgroup_root: "/pods".into(), ..Default::default() };
        assert_eq!(plan(&s, None, &pod(&[], &[])), PodCgroups { parent: "/pods".into(), create: vec![] });
    }

    #[test]
    fn v1_creates_sets_and_removes_in_every_hierarchy() {
        let dir = tempfile::tempdir().unwrap();
        for h in ["cpu,cpuacct", "memory", "cpuset", "unified"] {
            std::fs::create_dir(dir.path().join(h)).unwrap();
        }
        std::os::unix::fs::symlink(dir.path().join("cpu,cpuacct"), dir.path().join("cpu")).unwrap();
        std::fs::write(dir.path().join("cpuset/cpuset.cpus"), "0-1\n").unwrap();
        std::fs::write(dir.path().join("cpuset/cpuset.mems"), "0\n").unwrap();
        let fs = CgroupV1::new(dir.path());
        assert_eq!(fs.hierarchies.len(), 3, "links and unified are not hierarchies of their own");
        let values = CgroupValues {
            cpu_shares: 102,
            cpu_quota: 50_000,
            cpu_period: 100_000,
            memory_limit: 1 << 20,
            pids_limit: 0,
            memory_min: 0,
        };
        fs.ensure("/kubepods/podx", Some(&values)).unwrap();
        let read = |p: &str| std::fs::read_to_string(dir.path().join(p)).unwrap();
        assert_eq!(read("cpu,cpuacct/kubepods/podx/cpu.shares"), "102");
        assert_eq!(read("cpu,cpuacct/kubepods/podx/cpu.cfs_quota_us"), "50000");
        assert_eq!(read("memory/kubepods/podx/memory.limit_in_bytes"), "1048576");
        assert_eq!(read("cpuset/kubepods/podx/cpuset.cpus"), "0-1\n");
        // A cgroup left without CPUs (a crash between its mkdir and the copy) gets them when
        // it is ensured again.
        std::fs::write(dir.path().join("cpuset/kubepods/podx/cpuset.cpus"), "").unwrap();
        fs.ensure("/kubepods/podx", None).unwrap();
        assert_eq!(read("cpuset/kubepods/podx/cpuset.cpus"), "0-1\n");
        assert!(!dir.path().join("unified/kubepods").exists());
        // A real cgroup directory has only kernel files, which rmdir ignores; the test's
        // plain directory must be emptied first.
        for h in ["cpu,cpuacct", "memory", "cpuset"] {
            for f in std::fs::read_dir(dir.path().join(h).join("kubepods/podx")).unwrap() {
                std::fs::remove_file(f.unwrap().path()).unwrap();
            }
        }
        fs.remove("/kubepods/podx").unwrap();
        assert!(!dir.path().join("memory/kubepods/podx").exists());
        fs.remove("/kubepods/podx").unwrap();
    }

    #[test]
    fn v2_delegates_controllers_and_writes_v2_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("cgroup.controllers"), "cpuset cpu io memory pids rdma\n").unwrap();
        std::fs::write(root.join("cgroup.subtree_control"), "memory\n").unwrap();
        let fs = CgroupV2::new(root);
        let values = CgroupValues {
            cpu_shares: 1024,
            cpu_quota: 50_000,
            cpu_period: 100_000,
            memory_limit: 1 << 20,
            pids_limit: 42,
            memory_min: 1 << 19,
        };
        fs.ensure("/kubepods/podx", Some(&values)).unwrap();
        let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
        assert_eq!(read("kubepods/podx/memory.min"), (1 << 19).to_string(), "MemoryQoS");
        // A plain file stands in for the kernel's; it keeps the last write.
        assert_eq!(read("cgroup.subtree_control"), "+cpu +cpuset +pids +io", "only what is offered and missing");
        assert_eq!(read("kubepods/podx/cpu.weight"), "39", "1 CPU");
        assert_eq!(read("kubepods/podx/cpu.max"), "50000 100000");
        assert_eq!(read("kubepods/podx/memory.max"), "1048576");
        assert_eq!(read("kubepods/podx/pids.max"), "42");
        assert_eq!(fs.children("/kubepods"), ["podx"]);
        std::fs::create_dir(root.join("kubepods/podx/container")).unwrap();
        for f in ["cpu.weight", "cpu.max", "memory.max", "memory.min", "pids.max"] {
            std::fs::remove_file(root.join("kubepods/podx").join(f)).unwrap();
        }
        fs.remove("/kubepods/podx").unwrap();
        assert!(!root.join("kubepods/podx").exists(), "leftover container cgroups go too");
        fs.remove("/kubepods/podx").unwrap();
    }

    #[test]
    fn pod_pids_limit_goes_to_the_pod_cgroup_only() {
        let s = PodSettings { pod_pids_limit: 100, ..Default::default() };
        let p = plan(&s, None, &pod(&[("memory", "1Mi")], &[]));
        assert_eq!(p.create.last().unwrap().1.unwrap().pids_limit, 100);
        assert!(p.create.iter().rev().skip(1).all(|(_, v)| v.is_none_or(|v| v.pids_limit == 0)));
        let unlimited = plan(&PodSettings::default(), None, &pod(&[], &[]));
        assert_eq!(unlimited.create.last().unwrap().1.unwrap().pids_limit, -1, "explicitly no limit");
    }

    #[test]
    fn hierarchy_of_this_host() {
        // Whatever the host runs, a plain directory is neither.
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(hierarchy(dir.path()), None);
    }
}
