//! How pods are set up on this node: cgroups (`cgroupsPerQOS`, `cgroupDriver`, `cgroupRoot`),
//! DNS (`clusterDNS`, `clusterDomain`, `resolvConf`) and security (`allowedUnsafeSysctls`,
//! `seccompDefault`, `--allow-privileged`), with upstream defaults and validation.

use std::net::IpAddr;

use super::file::KubeletConfiguration;
use super::flags::Flags;
use super::{ConfigError, Problem};

pub const DEFAULT_RESOLV_CONF: &str = "/etc/resolv.conf";

/// How pod cgroups are named and created (`cgroupDriver`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CgroupDriver {
    /// Paths in the cgroup file system, e.g. `/kubepods/burstable/pod<uid>`.
    #[default]
    Cgroupfs,
    /// systemd slices, e.g. `kubepods-burstable-pod<uid>.slice`.
    Systemd,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PodSettings {
    /// `cgroupsPerQOS` / `--cgroups-per-qos`, default true.
    pub cgroups_per_qos: bool,
    /// `cgroupDriver` / `--cgroup-driver`, default cgroupfs.
    pub cgroup_driver: CgroupDriver,
    /// `cgroupRoot` / `--cgroup-root`; with `cgroupsPerQOS`, empty means `/`.
    pub cgroup_root: String,
    /// `podPidsLimit` / `--pod-max-pids`: `pids.max` of every pod cgroup; -1 (default) or 0:
    /// no limit.
    pub pod_pids_limit: i64,
    /// `failCgroupV1`: refuse to start on a cgroup v1 host (default false: a warning).
    pub fail_cgroup_v1: bool,
    /// `singleProcessOOMKill`: unset means false on cgroup v2 (the OOM killer stops the whole
    /// container, `memory.oom.group=1`) and true on cgroup v1; explicit false is refused there.
    pub single_process_oom_kill: Option<bool>,
    /// `clusterDNS` / `--cluster-dns`.
    pub cluster_dns: Vec<IpAddr>,
    /// `clusterDomain` / `--cluster-domain`; empty = no cluster search domains.
    pub cluster_domain: String,
    /// `resolvConf` / `--resolv-conf`, default /etc/resolv.conf; empty = no host DNS.
    pub resolv_conf: String,
    /// `kubeletCgroups` / `--kubelet-cgroups`: the cgroup (cgroupfs path) the agent moves itself
    /// into and reports as the `kubelet` system container; empty: wherever it was started.
    pub kubelet_cgroups: String,
    /// `--runtime-cgroups`: the runtime's cgroup, reported as the `runtime` system container;
    /// empty: the cgroup of the process serving the CRI socket.
    pub runtime_cgroups: String,
    /// `systemCgroups` / `--system-cgroups`: the cgroup the node's non-kernel processes still in
    /// the root cgroup are moved into, reported as the `misc` system container.
    pub system_cgroups: String,
    /// The `MemoryQoS` gate (acted on only on cgroup v2).
    pub memory_qos: bool,
    /// `memoryThrottlingFactor` (default 0.9): how far between request and limit a container's
    /// `memory.high` sits under MemoryQoS.
    pub memory_throttling_factor: f64,
    /// `allowedUnsafeSysctls` / `--allowed-unsafe-sysctls`: names or `prefix*` patterns.
    pub allowed_unsafe_sysctls: Vec<String>,
    /// `seccompDefault` / `--seccomp-default`: RuntimeDefault for containers that set none.
    pub seccomp_default: bool,
    /// `--allow-privileged` (removed upstream, where privileged containers are always allowed).
    pub allow_privileged: bool,
}

impl Default for PodSettings {
    fn default() -> Self {
        PodSettings {
            cgroups_per_qos: true,
            cgroup_driver: CgroupDriver::Cgroupfs,
            cgroup_root: String::new(),
            pod_pids_limit: -1,
            fail_cgroup_v1: false,
            single_process_oom_kill: None,
            memory_qos: false,
            memory_throttling_factor: 0.9,
            kubelet_cgroups: String::new(),
            runtime_cgroups: String::new(),
            system_cgroups: String::new(),
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            resolv_conf: DEFAULT_RESOLV_CONF.to_string(),
            allowed_unsafe_sysctls: Vec::new(),
            seccomp_default: false,
            allow_privileged: true,
        }
    }
}

impl PodSettings {
    /// The cgroup `parts` (e.g. `["kubepods", "burstable"]`) below `cgroupRoot`, named as the
    /// driver names it: `/<root>/kubepods/burstable` (cgroupfs), or nested slices named after
    /// all their ancestors, `/kubepods.slice/kubepods-burstable.slice` (systemd, upstream
    /// `CgroupName.ToSystemd`: a dash in a component becomes an underscore). The agent creates
    /// pod cgroups by these names and the stats read them, so both agree.
    pub fn cgroup_name<S: AsRef<str>>(&self, parts: &[S]) -> String {
        let root = self.cgroup_root.trim_matches('/');
        match self.cgroup_driver {
            CgroupDriver::Cgroupfs => {
                let all: Vec<&str> =
                    root.split('/').filter(|p| !p.is_empty()).chain(parts.iter().map(AsRef::as_ref)).collect();
                format!("/{}", all.join("/"))
            }
            CgroupDriver::Systemd => {
                let slice = root.rsplit('/').next().unwrap_or_default().trim_end_matches(".slice");
                let all: Vec<String> = slice
                    .split('-')
                    .filter(|p| !p.is_empty())
                    .map(str::to_string)
                    .chain(parts.iter().map(|p| p.as_ref().replace('-', "_")))
                    .collect();
                if all.is_empty() {
                    return "/".into();
                }
                (1..=all.len()).map(|n| format!("/{}.slice", all[..n].join("-"))).collect()
            }
        }
    }
}

impl CgroupDriver {
    /// The name in the configuration (`cgroupDriver`).
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupDriver::Cgroupfs => "cgroupfs",
            CgroupDriver::Systemd => "systemd",
        }
    }
}

type Invalid<'a> = &'a dyn Fn(&str, Problem) -> ConfigError;

fn driver(field: &str, value: &str, invalid: Invalid) -> Result<CgroupDriver, ConfigError> {
    match value {
        "cgroupfs" => Ok(CgroupDriver::Cgroupfs),
        "systemd" => Ok(CgroupDriver::Systemd),
        other => {
            Err(invalid(field, format!("invalid cgroup driver {other:?}: use \"cgroupfs\" or \"systemd\"").into()))
        }
    }
}

/// Upstream accepts -1 (no limit) and positive numbers; 0 also means no limit.
fn pids_limit(field: &str, value: i64, invalid: Invalid) -> Result<i64, ConfigError> {
    if value < -1 {
        return Err(invalid(
            field,
            format!("{value} is not a process count: use a positive number, or -1 for no limit").into(),
        ));
    }
    Ok(value)
}

fn dns_ips<S: AsRef<str>>(field: &str, values: &[S], invalid: Invalid) -> Result<Vec<IpAddr>, ConfigError> {
    values
        .iter()
        .map(|v| {
            let v = v.as_ref().trim();
            v.parse().map_err(|_| invalid(field, format!("{v:?} is not a valid IP address").into()))
        })
        .collect()
}

fn sysctl_patterns<S: AsRef<str>>(field: &str, values: &[S], invalid: Invalid) -> Result<Vec<String>, ConfigError> {
    let mut out = Vec::new();
    for v in values {
        let v = v.as_ref().trim();
        let name = v.strip_suffix('*').unwrap_or(v);
        if v.is_empty() || name.contains('*') || name.contains(char::is_whitespace) {
            return Err(invalid(field, format!("{v:?} is not a sysctl name or a prefix ending in *").into()));
        }
        out.push(v.to_string());
    }
    Ok(out)
}

impl PodSettings {
    pub(super) fn apply_file(&mut self, c: &KubeletConfiguration, invalid: Invalid) -> Result<(), ConfigError> {
        if let Some(b) = c.cgroups_per_qos {
            self.cgroups_per_qos = b;
        }
        if let Some(d) = c.cgroup_driver.as_deref().filter(|d| !d.is_empty()) {
            self.cgroup_driver = driver("cgroupDriver", d, invalid)?;
        }
        if let Some(r) = &c.cgroup_root {
            self.cgroup_root = r.clone();
        }
        if let Some(n) = c.pod_pids_limit {
            self.pod_pids_limit = pids_limit("podPidsLimit", n, invalid)?;
        }
        if let Some(b) = c.fail_cgroup_v1 {
            self.fail_cgroup_v1 = b;
        }
        if c.single_process_oom_kill.is_some() {
            self.single_process_oom_kill = c.single_process_oom_kill;
        }
        if let Some(f) = c.memory_throttling_factor {
            if !(f > 0.0 && f <= 1.0) {
                return Err(invalid(
                    "memoryThrottlingFactor",
                    Problem::Rule(format!(
                        "invalid configuration: memoryThrottlingFactor {f} must be greater than 0 and less than or equal to 1.0"
                    )),
                ));
            }
            self.memory_throttling_factor = f;
        }
        if let Some(c) = &c.kubelet_cgroups {
            self.kubelet_cgroups = c.clone();
        }
        if let Some(c) = &c.system_cgroups {
            self.system_cgroups = c.clone();
        }
        if let Some(ips) = &c.cluster_dns {
            self.cluster_dns = dns_ips("clusterDNS", ips, invalid)?;
        }
        if let Some(d) = &c.cluster_domain {
            self.cluster_domain = d.trim_end_matches('.').to_string();
        }
        if let Some(r) = &c.resolv_conf {
            self.resolv_conf = r.clone();
        }
        if let Some(s) = &c.allowed_unsafe_sysctls {
            self.allowed_unsafe_sysctls = sysctl_patterns("allowedUnsafeSysctls", s, invalid)?;
        }
        if let Some(b) = c.seccomp_default {
            self.seccomp_default = b;
        }
        Ok(())
    }

    pub(super) fn apply_flags(&mut self, f: &Flags, invalid: Invalid) -> Result<(), ConfigError> {
        if let Some(b) = f.cgroups_per_qos {
            self.cgroups_per_qos = b;
        }
        if let Some(d) = &f.cgroup_driver {
            self.cgroup_driver = driver("--cgroup-driver", d, invalid)?;
        }
        if let Some(r) = &f.cgroup_root {
            self.cgroup_root = r.clone();
        }
        if let Some(n) = f.pod_max_pids {
            self.pod_pids_limit = pids_limit("--pod-max-pids", n, invalid)?;
        }
        for (value, target) in [
            (&f.kubelet_cgroups, &mut self.kubelet_cgroups),
            (&f.runtime_cgroups, &mut self.runtime_cgroups),
            (&f.system_cgroups, &mut self.system_cgroups),
        ] {
            if let Some(v) = value {
                target.clone_from(v);
            }
        }
        if !f.cluster_dns.is_empty() {
            let values: Vec<&str> = f.cluster_dns.iter().flat_map(|v| v.split(',')).filter(|v| !v.is_empty()).collect();
            self.cluster_dns = dns_ips("--cluster-dns", &values, invalid)?;
        }
        if let Some(d) = &f.cluster_domain {
            self.cluster_domain = d.trim_end_matches('.').to_string();
        }
        if let Some(r) = &f.resolv_conf {
            self.resolv_conf = r.clone();
        }
        if !f.allowed_unsafe_sysctls.is_empty() {
            let values: Vec<&str> =
                f.allowed_unsafe_sysctls.iter().flat_map(|v| v.split(',')).filter(|v| !v.is_empty()).collect();
            self.allowed_unsafe_sysctls = sysctl_patterns("--allowed-unsafe-sysctls", &values, invalid)?;
        }
        if let Some(b) = f.seccomp_default {
            self.seccomp_default = b;
        }
        if let Some(b) = f.allow_privileged {
            self.allow_privileged = b;
        }
        self.check(invalid)
    }

    /// Upstream: the systemd driver needs slice-shaped names, so a cgroupRoot must be one;
    /// systemCgroups needs a cgroupRoot and cannot be the root itself.
    fn check(&self, invalid: Invalid) -> Result<(), ConfigError> {
        if !self.system_cgroups.is_empty() && self.cgroup_root.is_empty() {
            return Err(invalid(
                "systemCgroups",
                Problem::Rule(
                    "invalid configuration: systemCgroups (--system-cgroups) was specified and cgroupRoot (--cgroup-root) was not specified"
                        .into(),
                ),
            ));
        }
        if self.system_cgroups == "/" {
            return Err(invalid("systemCgroups", Problem::Rule("system container cannot be root (\"/\")".into())));
        }
        if self.cgroup_driver == CgroupDriver::Systemd
            && !self.cgroup_root.is_empty()
            && self.cgroup_root != "/"
            && !self.cgroup_root.ends_with(".slice")
        {
            return Err(invalid(
                "cgroupRoot",
                format!(
                    "{:?} is not a systemd slice name (like \"kubelet.slice\"), as the systemd cgroup driver needs",
                    self.cgroup_root
                )
                .into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Input;

    fn invalid(field: &str, problem: Problem) -> ConfigError {
        ConfigError::InvalidValue { input: Input::CommandLine, field: field.into(), problem: Box::new(problem) }
    }

    #[test]
    fn cgroup_names_per_driver() {
        let fs = PodSettings { cgroup_root: "/custom/".into(), ..Default::default() };
        assert_eq!(fs.cgroup_name(&["kubepods", "burstable"]), "/custom/kubepods/burstable");
        assert_eq!(PodSettings::default().cgroup_name(&["kubepods"]), "/kubepods");
        let sd = PodSettings { cgroup_driver: CgroupDriver::Systemd, ..Default::default() };
        assert_eq!(sd.cgroup_name(&["kubepods", "pod1-2"]), "/kubepods.slice/kubepods-pod1_2.slice");
        let rooted = PodSettings { cgroup_root: "kubelet.slice".into(), ..sd.clone() };
        assert_eq!(rooted.cgroup_name(&["kubepods"]), "/kubelet.slice/kubelet-kubepods.slice");
        assert_eq!(sd.cgroup_name::<&str>(&[]), "/");
    }

    #[test]
    fn defaults_are_upstream() {
        let s = PodSettings::default();
        assert!(s.cgroups_per_qos && s.allow_privileged && !s.seccomp_default);
        assert_eq!(s.cgroup_driver, CgroupDriver::Cgroupfs);
        assert_eq!(s.resolv_conf, "/etc/resolv.conf");
        assert_eq!((s.pod_pids_limit, s.fail_cgroup_v1), (-1, false));
    }

    #[test]
    fn pids_limit_below_minus_one_is_rejected() {
        let mut s = PodSettings::default();
        let e = s.apply_flags(&Flags { pod_max_pids: Some(-2), ..Default::default() }, &invalid).unwrap_err();
        assert!(e.to_string().contains("--pod-max-pids"), "{e}");
    }

    #[test]
    fn file_then_flags() {
        let mut s = PodSettings::default();
        let c = KubeletConfiguration {
            cgroup_driver: Some("systemd".into()),
            cluster_dns: Some(vec!["10.96.0.10".into()]),
            cluster_domain: Some("cluster.local.".into()),
            allowed_unsafe_sysctls: Some(vec!["net.core.*".into()]),
            pod_pids_limit: Some(100),
            fail_cgroup_v1: Some(true),
            ..Default::default()
        };
        s.apply_file(&c, &invalid).unwrap();
        assert_eq!((s.pod_pids_limit, s.fail_cgroup_v1), (100, true));
        assert_eq!(s.cgroup_driver, CgroupDriver::Systemd);
        assert_eq!(s.cluster_domain, "cluster.local");
        assert_eq!(s.allowed_unsafe_sysctls, ["net.core.*"]);
        let f = Flags {
            cgroup_driver: Some("cgroupfs".into()),
            cluster_dns: vec!["10.0.0.10,fd00::10".into()],
            resolv_conf: Some(String::new()),
            ..Default::default()
        };
        s.apply_flags(&f, &invalid).unwrap();
        assert_eq!(s.cgroup_driver, CgroupDriver::Cgroupfs);
        assert_eq!(s.cluster_dns.len(), 2);
        assert_eq!(s.resolv_conf, "");
    }

    #[test]
    fn flags_parse() {
        let f = Flags::parse_args(&[
            "--cgroups-per-qos=false",
            "--cgroup-root=/k",
            "--cluster-dns=10.0.0.10",
            "--cluster-dns",
            "10.0.0.11",
            "--allowed-unsafe-sysctls=kernel.msg*,net.core.somaxconn",
            "--seccomp-default",
            "--allow-privileged=false",
        ])
        .unwrap();
        assert!(f.compat.unimplemented.is_empty(), "{:?}", f.compat.unimplemented);
        let mut s = PodSettings::default();
        s.apply_flags(&f, &invalid).unwrap();
        assert!(!s.cgroups_per_qos && s.seccomp_default && !s.allow_privileged);
        assert_eq!(s.cgroup_root, "/k");
        assert_eq!(s.cluster_dns.len(), 2);
        assert_eq!(s.allowed_unsafe_sysctls, ["kernel.msg*", "net.core.somaxconn"]);
    }

    #[test]
    fn bad_values_name_the_field() {
        let mut s = PodSettings::default();
        let f = Flags { cgroup_driver: Some("docker".into()), ..Default::default() };
        assert!(s.apply_flags(&f, &invalid).unwrap_err().to_string().contains("--cgroup-driver"));
        let c = KubeletConfiguration { cluster_dns: Some(vec!["dns.local".into()]), ..Default::default() };
        assert!(s.apply_file(&c, &invalid).unwrap_err().to_string().contains("clusterDNS"));
        let f = Flags { allowed_unsafe_sysctls: vec!["net.*.x".into()], ..Default::default() };
        assert!(s.apply_flags(&f, &invalid).unwrap_err().to_string().contains("--allowed-unsafe-sysctls"));
    }
}

/// Where the cgroup file system is mounted.
pub const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

/// The cgroup hierarchy a node runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hierarchy {
    /// One hierarchy per controller set under `/sys/fs/cgroup/<controller>`.
    V1,
    /// The unified hierarchy (`cgroup2fs` on `/sys/fs/cgroup`).
    V2,
}

/// The hierarchy mounted at `mount`, if any (upstream `IsCgroup2UnifiedMode`: a statfs).
/// The agent (which cgroups to write) and the stats (which files to read) must agree, so
/// both ask here.
pub fn cgroup_hierarchy(mount: &std::path::Path) -> Option<Hierarchy> {
    let fs = nix::sys::statfs::statfs(mount).ok()?;
    if fs.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC {
        Some(Hierarchy::V2)
    } else {
        mount.join("memory").is_dir().then_some(Hierarchy::V1)
    }
}
