//! cgroup counters on either hierarchy, for the node (the root cgroup), the pods (the pod
//! cgroups), and the system containers (`kubepods`, the agent's and the runtime's cgroups).
//!
//! cgroup v1 keeps CPU time in `cpuacct/…/cpuacct.usage` and memory in
//! `memory/…/memory.{usage_in_bytes,limit_in_bytes,stat}` (`total_*` keys), swap only as part
//! of `memory.memsw.*` (memory + swap, where swap accounting is on); cgroup v2 keeps
//! them in one directory: `cpu.stat` (`usage_usec`), `memory.{current,max,stat,swap.current,
//! swap.max}`, `pids.current` and the PSI files `{cpu,memory,io}.pressure`. The v2 root has no
//! `memory.current`: as runc (and so cAdvisor) does, the node's usage then comes from
//! `/proc/meminfo` (MemTotal − MemFree). The parsers are pure; [`Cgroup::read`] is the I/O.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::host::parse_kv;
use super::types::{PsiData, PsiStats};

pub use gantry_config::{CGROUP_MOUNT as MOUNT, Hierarchy, cgroup_hierarchy as hierarchy};

/// One cgroup: its directory on the unified hierarchy, or in the v1 `cpuacct` and `memory`
/// hierarchies (where a process can sit at different paths).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cgroup {
    V1 { cpuacct: PathBuf, memory: PathBuf, pids: PathBuf },
    V2(PathBuf),
}

/// A cgroup path relative to a hierarchy's mount point.
fn under(mount: &Path, path: &str) -> PathBuf {
    mount.join(path.trim_start_matches('/'))
}

impl Cgroup {
    /// The cgroup `path` (a cgroupfs path or nested systemd slices) in every hierarchy.
    pub fn named(mount: &Path, hierarchy: Hierarchy, path: &str) -> Cgroup {
        match hierarchy {
            Hierarchy::V2 => Cgroup::V2(under(mount, path)),
            Hierarchy::V1 => Cgroup::V1 {
                cpuacct: under(&mount.join("cpuacct"), path),
                memory: under(&mount.join("memory"), path),
                pids: under(&mount.join("pids"), path),
            },
        }
    }

    /// The cgroup of the process whose `/proc/<pid>/cgroup` reads `proc_cgroup`.
    pub fn of_process(mount: &Path, hierarchy: Hierarchy, proc_cgroup: &str) -> Option<Cgroup> {
        Some(match hierarchy {
            Hierarchy::V2 => Cgroup::V2(under(mount, &process_path(proc_cgroup, None)?)),
            Hierarchy::V1 => Cgroup::V1 {
                cpuacct: under(&mount.join("cpuacct"), &process_path(proc_cgroup, Some("cpuacct"))?),
                memory: under(&mount.join("memory"), &process_path(proc_cgroup, Some("memory"))?),
                pids: under(&mount.join("pids"), &process_path(proc_cgroup, Some("pids")).unwrap_or_default()),
            },
        })
    }

    /// The child cgroup `name` (a plain directory name) in every hierarchy.
    pub fn child(&self, name: &str) -> Cgroup {
        match self {
            Cgroup::V2(d) => Cgroup::V2(d.join(name)),
            Cgroup::V1 { cpuacct, memory, pids } => {
                Cgroup::V1 { cpuacct: cpuacct.join(name), memory: memory.join(name), pids: pids.join(name) }
            }
        }
    }

    /// The cgroup the runtime made for container `id` below this pod cgroup: `<id>` (cgroupfs)
    /// or `<prefix>-<id>.scope` (systemd, e.g. containerd's `cri-containerd-<id>.scope`).
    pub fn container(&self, id: &str) -> Option<Cgroup> {
        let entries = std::fs::read_dir(self.dir()).ok()?;
        let name =
            entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).find(|name| container_id_of(name) == id)?;
        Some(self.child(&name))
    }

    /// The directory whose name identifies the cgroup (the memory one on v1).
    pub fn dir(&self) -> &Path {
        match self {
            Cgroup::V2(d) => d,
            Cgroup::V1 { memory, .. } => memory,
        }
    }

    /// Reads the counters; a file that is missing or unreadable leaves its value out.
    pub fn read(&self) -> Counters {
        let text = |dir: &Path, f: &str| std::fs::read_to_string(dir.join(f)).ok();
        let num = |dir: &Path, f: &str| text(dir, f).and_then(|t| parse_limit(&t));
        let psi = |dir: &Path, f: &str| text(dir, f).and_then(|t| parse_psi(&t));
        match self {
            Cgroup::V2(d) => Counters {
                cpu_usage_nanos: text(d, "cpu.stat").and_then(|t| parse_kv(&t).get("usage_usec").map(|u| u * 1000)),
                memory_usage: num(d, "memory.current").flatten(),
                memory_limit: num(d, "memory.max").flatten(),
                memory_stat: Stat::V2(text(d, "memory.stat").map(|t| parse_kv(&t)).unwrap_or_default()),
                swap_usage: num(d, "memory.swap.current").flatten(),
                swap_limit: num(d, "memory.swap.max").flatten(),
                processes: num(d, "pids.current").flatten(),
                cpu_psi: psi(d, "cpu.pressure"),
                memory_psi: psi(d, "memory.pressure"),
                io_psi: psi(d, "io.pressure"),
            },
            Cgroup::V1 { cpuacct, memory, pids } => {
                let limited = |f: &str| num(memory, f).flatten().filter(|l| *l < V1_UNLIMITED);
                let memory_usage = num(memory, "memory.usage_in_bytes").flatten();
                let memory_limit = limited("memory.limit_in_bytes");
                let (swap_usage, swap_limit) = v1_swap(
                    memory_usage,
                    num(memory, "memory.memsw.usage_in_bytes").flatten(),
                    memory_limit,
                    limited("memory.memsw.limit_in_bytes"),
                );
                Counters {
                    cpu_usage_nanos: num(cpuacct, "cpuacct.usage").flatten(),
                    memory_usage,
                    memory_limit,
                    memory_stat: Stat::V1(text(memory, "memory.stat").map(|t| parse_kv(&t)).unwrap_or_default()),
                    swap_usage,
                    swap_limit,
                    processes: num(pids, "pids.current").flatten(),
                    ..Default::default()
                }
            }
        }
    }
}

/// Swap usage and limit on cgroup v1, where `memsw` counts memory and swap together (and exists
/// only with swap accounting on): the swap part is memsw − memory, as cAdvisor reports it.
fn v1_swap(
    memory: Option<u64>,
    memsw: Option<u64>,
    memory_limit: Option<u64>,
    memsw_limit: Option<u64>,
) -> (Option<u64>, Option<u64>) {
    let usage = memsw.zip(memory).map(|(both, mem)| both.saturating_sub(mem));
    let limit = memsw_limit.zip(memory_limit).map(|(both, mem)| both.saturating_sub(mem));
    (usage, limit)
}

/// The container ID in the name of a container's cgroup, as upstream's
/// `extractIDFromCgroupPath`: the name itself (cgroupfs), or for a systemd scope
/// (`cri-containerd-<id>.scope`, `crio-<id>.scope`) the part after the last `-`.
pub fn container_id_of(name: &str) -> &str {
    match name.strip_suffix(".scope") {
        Some(unit) => unit.rsplit('-').next().unwrap_or(unit),
        None => name,
    }
}

/// cgroup v1 reports "no limit" as the largest page-aligned signed 64-bit value.
const V1_UNLIMITED: u64 = 0x7FFF_FFFF_FFFF_F000;

/// What a cgroup's files say, each value None when its file is missing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    pub cpu_usage_nanos: Option<u64>,
    pub memory_usage: Option<u64>,
    /// None: no limit.
    pub memory_limit: Option<u64>,
    pub memory_stat: Stat,
    pub swap_usage: Option<u64>,
    /// None: no limit.
    pub swap_limit: Option<u64>,
    /// `pids.current`: the tasks (processes and threads) in the cgroup.
    pub processes: Option<u64>,
    pub cpu_psi: Option<PsiStats>,
    pub memory_psi: Option<PsiStats>,
    pub io_psi: Option<PsiStats>,
}

/// `memory.stat`, whose keys differ between the hierarchies.
#[derive(Debug, Clone, PartialEq)]
pub enum Stat {
    V1(HashMap<String, u64>),
    V2(HashMap<String, u64>),
}

impl Default for Stat {
    fn default() -> Self {
        Stat::V2(HashMap::new())
    }
}

impl Stat {
    fn get(&self, v1: &str, v2: &str) -> Option<u64> {
        match self {
            Stat::V1(m) => m.get(v1).copied(),
            Stat::V2(m) => m.get(v2).copied(),
        }
    }
    pub fn inactive_file(&self) -> Option<u64> {
        self.get("total_inactive_file", "inactive_file")
    }
    /// Anonymous memory, cAdvisor's RSS (`total_rss` on v1, `anon` on v2).
    pub fn rss(&self) -> Option<u64> {
        self.get("total_rss", "anon")
    }
    pub fn page_faults(&self) -> Option<u64> {
        self.get("total_pgfault", "pgfault")
    }
    pub fn major_page_faults(&self) -> Option<u64> {
        self.get("total_pgmajfault", "pgmajfault")
    }
}

/// The working set as cAdvisor defines it: usage minus inactive file pages, never below 0.
pub fn working_set(usage: u64, stat: &Stat) -> u64 {
    usage.saturating_sub(stat.inactive_file().unwrap_or(0))
}

/// A cgroup value: a number, or `max` (no limit: Some(None)); None when it does not parse.
pub fn parse_limit(text: &str) -> Option<Option<u64>> {
    match text.trim() {
        "max" => Some(None),
        v => v.parse().ok().map(Some),
    }
}

/// A PSI file (`/proc/pressure/*`, `<cgroup>/*.pressure`):
/// `some avg10=0.12 avg60=0.05 avg300=0.01 total=12345`, then the same for `full` (absent
/// for the node's CPU on older kernels: zeros then, as upstream reports it).
pub fn parse_psi(text: &str) -> Option<PsiStats> {
    let mut out = PsiStats::default();
    let mut any = false;
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let target = match f.next() {
            Some("some") => &mut out.some,
            Some("full") => &mut out.full,
            _ => continue,
        };
        let mut data = PsiData::default();
        for kv in f {
            let Some((k, v)) = kv.split_once('=') else { continue };
            match k {
                "avg10" => data.avg10 = v.parse().ok()?,
                "avg60" => data.avg60 = v.parse().ok()?,
                "avg300" => data.avg300 = v.parse().ok()?,
                "total" => data.total = v.parse().ok()?,
                _ => {}
            }
        }
        *target = data;
        any = true;
    }
    any.then_some(out)
}

/// The path of the process's cgroup in `/proc/<pid>/cgroup`: the v2 line (`0::/path`), or
/// the v1 line of the hierarchy holding `controller`.
pub fn process_path(proc_cgroup: &str, controller: Option<&str>) -> Option<String> {
    proc_cgroup.lines().find_map(|line| {
        let mut f = line.splitn(3, ':');
        let (id, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let matches = match controller {
            None => id == "0" && controllers.is_empty(),
            Some(c) => controllers.split(',').any(|x| x == c),
        };
        matches.then(|| path.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psi_files() {
        let text =
            "some avg10=1.50 avg60=0.25 avg300=0.00 total=123456\nfull avg10=0.00 avg60=0.10 avg300=0.00 total=99\n";
        let p = parse_psi(text).unwrap();
        assert_eq!(p.some, PsiData { avg10: 1.5, avg60: 0.25, avg300: 0.0, total: 123456 });
        assert_eq!(p.full.total, 99);
        // The node's cpu.pressure on kernels before 5.13 has no "full" line.
        let cpu = parse_psi("some avg10=0.00 avg60=0.00 avg300=0.00 total=7\n").unwrap();
        assert_eq!((cpu.some.total, cpu.full), (7, PsiData::default()));
        assert_eq!(parse_psi(""), None);
        assert_eq!(parse_psi("some avg10=x total=1"), None);
    }

    #[test]
    fn limits_and_process_paths() {
        assert_eq!(parse_limit("max\n"), Some(None));
        assert_eq!(parse_limit("67108864\n"), Some(Some(67108864)));
        assert_eq!(parse_limit("x"), None);
        let v1 = "12:pids:/a\n4:memory:/kubepods/besteffort/pod1/c1\n3:cpu,cpuacct:/kubepods/besteffort/pod1/c1\n1:name=systemd:/x\n0::/\n";
        assert_eq!(process_path(v1, Some("memory")).as_deref(), Some("/kubepods/besteffort/pod1/c1"));
        assert_eq!(process_path(v1, Some("cpuacct")).as_deref(), Some("/kubepods/besteffort/pod1/c1"));
        assert_eq!(process_path(v1, None).as_deref(), Some("/"));
        let v2 = "0::/kubepods.slice/kubepods-pod1_2.slice/cri-containerd-ab.scope\n";
        let c = Cgroup::of_process(Path::new("/cg"), Hierarchy::V2, v2).unwrap();
        assert_eq!(c.dir(), Path::new("/cg/kubepods.slice/kubepods-pod1_2.slice/cri-containerd-ab.scope"));
        let c = Cgroup::of_process(Path::new("/cg"), Hierarchy::V1, v1).unwrap();
        assert_eq!(
            c,
            Cgroup::V1 {
                cpuacct: "/cg/cpuacct/kubepods/besteffort/pod1/c1".into(),
                memory: "/cg/memory/kubepods/besteffort/pod1/c1".into(),
                pids: "/cg/pids/a".into(),
            }
        );
    }

    #[test]
    fn reads_v2_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for (f, v) in [
            ("cpu.stat", "usage_usec 1500\nuser_usec 1000\n"),
            ("memory.current", "1000\n"),
            ("memory.max", "max\n"),
            ("memory.stat", "anon 600\ninactive_file 300\npgfault 7\npgmajfault 1\n"),
            ("memory.swap.current", "0\n"),
            ("memory.swap.max", "4096\n"),
            ("pids.current", "3\n"),
            (
                "memory.pressure",
                "some avg10=0.00 avg60=0.00 avg300=0.00 total=5\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=2\n",
            ),
        ] {
            std::fs::write(d.join(f), v).unwrap();
        }
        let c = Cgroup::V2(d.to_path_buf()).read();
        assert_eq!((c.cpu_usage_nanos, c.memory_usage, c.memory_limit), (Some(1_500_000), Some(1000), None));
        assert_eq!(working_set(c.memory_usage.unwrap(), &c.memory_stat), 700);
        assert_eq!(
            (c.memory_stat.rss(), c.memory_stat.page_faults(), c.memory_stat.major_page_faults()),
            (Some(600), Some(7), Some(1))
        );
        assert_eq!((c.swap_usage, c.swap_limit, c.processes), (Some(0), Some(4096), Some(3)));
        assert_eq!(c.memory_psi.unwrap().full.total, 2);
        assert_eq!(c.cpu_psi, None, "no cpu.pressure file");
    }

    #[test]
    fn container_cgroups_are_found_by_id_under_the_pod() {
        assert_eq!(container_id_of("cri-containerd-ab12.scope"), "ab12");
        assert_eq!(container_id_of("crio-ab12.scope"), "ab12");
        assert_eq!(container_id_of("ab12"), "ab12");
        let dir = tempfile::tempdir().unwrap();
        let pod = Cgroup::V2(dir.path().to_path_buf());
        for d in ["cri-containerd-aaa.scope", "bbb", "cri-containerd-ccc.scope"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        assert_eq!(pod.container("aaa"), Some(Cgroup::V2(dir.path().join("cri-containerd-aaa.scope"))));
        assert_eq!(pod.container("bbb"), Some(Cgroup::V2(dir.path().join("bbb"))));
        assert_eq!(pod.container("ddd"), None);
        let v1 = Cgroup::named(Path::new("/cg"), Hierarchy::V1, "/kubepods/podx").child("c1");
        assert_eq!(
            v1,
            Cgroup::V1 {
                cpuacct: "/cg/cpuacct/kubepods/podx/c1".into(),
                memory: "/cg/memory/kubepods/podx/c1".into(),
                pids: "/cg/pids/kubepods/podx/c1".into(),
            }
        );
    }

    #[test]
    fn v1_swap_is_memsw_minus_memory() {
        assert_eq!(v1_swap(Some(100), Some(150), Some(200), Some(300)), (Some(50), Some(100)));
        assert_eq!(v1_swap(Some(100), None, None, None), (None, None), "no swap accounting");
        assert_eq!(v1_swap(Some(100), Some(100), None, None), (Some(0), None), "no limit");
    }

    #[test]
    fn reads_v1_files() {
        let dir = tempfile::tempdir().unwrap();
        let mount = dir.path();
        let c = Cgroup::named(mount, Hierarchy::V1, "/kubepods");
        let Cgroup::V1 { cpuacct, memory, pids } = &c else { unreachable!() };
        for d in [cpuacct, memory, pids] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(cpuacct.join("cpuacct.usage"), "42\n").unwrap();
        std::fs::write(memory.join("memory.usage_in_bytes"), "1000\n").unwrap();
        std::fs::write(memory.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        std::fs::write(memory.join("memory.stat"), "rss 1\ntotal_rss 500\ntotal_inactive_file 100\n").unwrap();
        let r = c.read();
        assert_eq!((r.cpu_usage_nanos, r.memory_limit, r.memory_stat.rss()), (Some(42), None, Some(500)));
        assert_eq!(working_set(1000, &r.memory_stat), 900);
    }
}
