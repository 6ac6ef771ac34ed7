//! The node's own counters: the root cgroup (either hierarchy, `cgroup.rs`), `/proc/meminfo`,
//! `/proc/pressure`, the task limit and count, `/proc/net/dev` and `/proc/net/route` of a
//! network namespace, `statvfs` of a filesystem.
//! The parsers are pure; the readers are thin.

use std::collections::HashMap;
use std::path::Path;

use super::cgroup::{self, Cgroup, Counters, Stat};
use super::types::{FsStats, InterfaceStats};

/// `/proc/net/dev` → counters per interface, loopback left out (as upstream).
pub fn parse_net_dev(text: &str) -> Vec<InterfaceStats> {
    text.lines()
        .skip(2)
        .filter_map(|line| {
            let (name, rest) = line.split_once(':')?;
            let name = name.trim();
            if name == "lo" {
                return None;
            }
            let n: Vec<u64> = rest.split_whitespace().filter_map(|f| f.parse().ok()).collect();
            (n.len() >= 11).then(|| InterfaceStats {
                name: name.to_string(),
                rx_bytes: n[0],
                rx_errors: n[2],
                tx_bytes: n[8],
                tx_errors: n[10],
            })
        })
        .collect()
}

/// The interface of the default IPv4 route in `/proc/net/route`.
pub fn default_route_interface(text: &str) -> Option<String> {
    text.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 2 && f[1] == "00000000").then(|| f[0].to_string())
    })
}

/// `key value` lines (cgroup `memory.stat`) or `Key: value kB` lines (`/proc/meminfo`, in bytes).
pub fn parse_kv(text: &str) -> HashMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let key = f.next()?.trim_end_matches(':').to_string();
            let value: u64 = f.next()?.parse().ok()?;
            let scale = if f.next() == Some("kB") { 1024 } else { 1 };
            Some((key, value * scale))
        })
        .collect()
}

/// The network counters of the namespace `/proc/<pid>` is in (or the host's, for `self`).
pub fn network(proc_dir: &Path) -> Option<(InterfaceStats, Vec<InterfaceStats>)> {
    let dev = std::fs::read_to_string(proc_dir.join("net/dev")).ok()?;
    let interfaces = parse_net_dev(&dev);
    let default_name =
        std::fs::read_to_string(proc_dir.join("net/route")).ok().and_then(|r| default_route_interface(&r));
    let default = default_name
        .and_then(|n| interfaces.iter().find(|i| i.name == n).cloned())
        .or_else(|| interfaces.iter().find(|i| i.name == "eth0").cloned())
        .or_else(|| interfaces.first().cloned())?;
    Some((default, interfaces))
}

/// Capacity and free space of the filesystem holding `path`.
pub fn filesystem(path: &Path, time: &str) -> Option<FsStats> {
    let s = nix::sys::statvfs::statvfs(path).ok()?;
    let frag = s.fragment_size() as u64;
    let capacity = s.blocks() as u64 * frag;
    let available = s.blocks_available() as u64 * frag;
    let free = s.blocks_free() as u64 * frag;
    let inodes = s.files() as u64;
    let inodes_free = s.files_free() as u64;
    Some(FsStats {
        time: time.to_string(),
        available_bytes: Some(available),
        capacity_bytes: Some(capacity),
        used_bytes: Some(capacity.saturating_sub(free)),
        inodes_free: Some(inodes_free),
        inodes: Some(inodes),
        inodes_used: Some(inodes.saturating_sub(inodes_free)),
    })
}

/// Bytes and inodes used under `dir` (log directories, emptyDir volumes).
pub fn disk_usage(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut bytes = 0;
    let mut inodes = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            inodes += 1;
            bytes += meta.blocks() * 512;
            if meta.is_dir() {
                stack.push(e.path());
            }
        }
    }
    (bytes, inodes)
}

/// Bytes and inodes (1) of one file, such as the pod's `etc-hosts`.
pub fn file_usage(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.blocks() * 512, 1))
}

/// Bytes and inodes of the regular files directly in `dir`, not in its subdirectories: the
/// pod-level log files of a pod's log directory, beside its containers' directories (upstream's
/// `podLogStats`).
pub fn files_usage(dir: &Path) -> Option<(u64, u64)> {
    let files = std::fs::read_dir(dir).ok()?.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_file()));
    Some(files.filter_map(|e| file_usage(&e.path())).fold((0, 0), |(b, i), (fb, fi)| (b + fb, i + fi)))
}

/// When a directory last changed: cAdvisor's creation time of a raw cgroup.
pub fn modified(dir: &Path) -> Option<k8s_openapi::jiff::Timestamp> {
    let t = std::fs::metadata(dir).ok()?.modified().ok()?;
    k8s_openapi::jiff::Timestamp::try_from(t).ok()
}

/// The process serving a unix socket (the container runtime behind its CRI endpoint), from the
/// peer credentials of a connection.
pub fn socket_peer_pid(socket: &Path) -> Option<i32> {
    let stream = std::os::unix::net::UnixStream::connect(socket).ok()?;
    let cred = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials).ok()?;
    Some(cred.pid())
}

/// The node's counters: the root cgroup on either hierarchy, with `/proc` standing in for
/// what the root lacks (CPU time without a cpuacct controller; memory usage on the v2 root,
/// which has no `memory.current`, as MemTotal − MemFree as runc computes it), and PSI from
/// `/proc/pressure` on cgroup v2.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct NodeCounters {
    pub cgroup: Counters,
    pub mem_total: Option<u64>,
    pub swap_total: Option<u64>,
    pub swap_free: Option<u64>,
    /// Seconds since the epoch.
    pub boot_time: Option<i64>,
}

pub fn node_counters(mount: &Path) -> NodeCounters {
    let meminfo = std::fs::read_to_string("/proc/meminfo").map(|t| parse_kv(&t)).unwrap_or_default();
    let hierarchy = cgroup::hierarchy(mount);
    let mut cgroup = match hierarchy {
        Some(h) => Cgroup::named(mount, h, "/").read(),
        None => Counters::default(),
    };
    node_fallbacks(&mut cgroup, &meminfo);
    node_pressure(&mut cgroup, hierarchy, |r| std::fs::read_to_string(format!("/proc/pressure/{r}")).ok());
    cgroup.cpu_usage_nanos = cgroup.cpu_usage_nanos.or_else(proc_stat_cpu_nanos);
    NodeCounters {
        cgroup,
        mem_total: meminfo.get("MemTotal").copied(),
        swap_total: meminfo.get("SwapTotal").copied(),
        swap_free: meminfo.get("SwapFree").copied(),
        boot_time: proc_stat_value("btime"),
    }
}

/// The node's PSI, from `/proc/pressure` (the root cgroup's figures), on cgroup v2 only: upstream
/// (cAdvisor) takes PSI from the v2 pressure files, so a v1 node reports none (pure given `read`).
fn node_pressure(root: &mut Counters, hierarchy: Option<cgroup::Hierarchy>, read: impl Fn(&str) -> Option<String>) {
    if hierarchy != Some(cgroup::Hierarchy::V2) {
        return;
    }
    let pressure = |r: &str| read(r).and_then(|t| cgroup::parse_psi(&t));
    root.cpu_psi = pressure("cpu");
    root.memory_psi = pressure("memory");
    root.io_psi = pressure("io");
}

/// What the v2 root cgroup lacks, from `/proc/meminfo` (pure).
fn node_fallbacks(root: &mut Counters, meminfo: &HashMap<String, u64>) {
    if root.memory_usage.is_none()
        && let (Some(total), Some(free)) = (meminfo.get("MemTotal"), meminfo.get("MemFree"))
    {
        root.memory_usage = Some(total.saturating_sub(*free));
    }
    if let Stat::V2(stat) = &mut root.memory_stat
        && stat.is_empty()
    {
        for (from, to) in [("Inactive(file)", "inactive_file"), ("AnonPages", "anon")] {
            if let Some(v) = meminfo.get(from) {
                stat.insert(to.to_string(), *v);
            }
        }
    }
}

/// The node's task limit (the smaller of `kernel.pid_max` and `kernel.threads-max`) and the
/// tasks that exist (the total after the slash in `/proc/loadavg`), as upstream's `pidlimit`.
pub fn rlimit() -> (Option<i64>, Option<i64>) {
    let read = |f: &str| std::fs::read_to_string(f).ok().and_then(|t| t.trim().parse::<i64>().ok());
    let max = [read("/proc/sys/kernel/pid_max"), read("/proc/sys/kernel/threads-max")].into_iter().flatten().min();
    let tasks = std::fs::read_to_string("/proc/loadavg").ok().and_then(|t| loadavg_tasks(&t));
    (max, tasks)
}

/// `0.10 0.20 0.30 2/345 6789` → 345.
pub fn loadavg_tasks(text: &str) -> Option<i64> {
    text.split_whitespace().nth(3)?.split_once('/')?.1.parse().ok()
}

fn proc_stat_value(key: &str) -> Option<i64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// When the process `pid` started, from `/proc/<pid>/stat` (clock ticks after boot).
pub fn process_start(pid: &str) -> Option<k8s_openapi::jiff::Timestamp> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may contain spaces and parentheses: fields count from the last ')'.
    let ticks: i64 = stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()?;
    let boot = proc_stat_value("btime")?;
    // USER_HZ is 100 on Linux.
    k8s_openapi::jiff::Timestamp::from_millisecond(boot * 1000 + ticks * 10).ok()
}

/// CPU time of all CPUs from `/proc/stat` when no cpuacct controller is mounted.
fn proc_stat_cpu_nanos() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal: everything but idle and iowait.
    let busy: u64 = f.iter().enumerate().filter(|(i, _)| *i != 3 && *i != 4).take(6).map(|(_, v)| v).sum();
    // USER_HZ is 100 on Linux.
    Some(busy * 10_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_level_log_files_are_the_files_beside_the_container_directories() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pod.log"), vec![b'x'; 64 << 10]).unwrap();
        std::fs::create_dir(dir.path().join("main")).unwrap();
        std::fs::write(dir.path().join("main/0.log"), vec![b'x'; 256 << 10]).unwrap();
        let (bytes, inodes) = files_usage(dir.path()).unwrap();
        assert_eq!(inodes, 1, "only the top-level file");
        assert!((64 << 10..256 << 10).contains(&bytes), "{bytes}");
        assert_eq!(files_usage(&dir.path().join("missing")), None);
    }

    #[test]
    fn node_psi_only_on_cgroup_v2() {
        let psi =
            "some avg10=1.50 avg60=0.00 avg300=0.00 total=1000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=10\n";
        let read = |_: &str| Some(psi.to_string());
        for hierarchy in [Some(cgroup::Hierarchy::V1), None] {
            let mut root = Counters::default();
            node_pressure(&mut root, hierarchy, read);
            assert_eq!((root.cpu_psi, root.memory_psi, root.io_psi), (None, None, None), "{hierarchy:?}");
        }
        let mut root = Counters::default();
        node_pressure(&mut root, Some(cgroup::Hierarchy::V2), read);
        let expected = cgroup::parse_psi(psi);
        assert!(expected.is_some());
        assert_eq!((root.cpu_psi, root.memory_psi, root.io_psi), (expected, expected, expected));
    }

    #[test]
    fn parses_proc_net_dev_without_loopback() {
        let text = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo: 100 1 0 0 0 0 0 0 100 1 0 0 0 0 0 0\n  eth0: 2000 20 3 0 0 0 0 0 4000 40 5 0 0 0 0 0\n";
        assert_eq!(
            parse_net_dev(text),
            [InterfaceStats { name: "eth0".into(), rx_bytes: 2000, rx_errors: 3, tx_bytes: 4000, tx_errors: 5 }]
        );
        let route = "Iface\tDestination\tGateway\nens3\t0000A8C0\t00000000\nens4\t00000000\t0100A8C0\n";
        assert_eq!(default_route_interface(route).as_deref(), Some("ens4"));
    }

    #[test]
    fn memory_stat_and_meminfo() {
        let stat = Stat::V1(parse_kv("cache 10\ntotal_inactive_file 300\ntotal_rss 500\n"));
        assert_eq!(cgroup::working_set(1000, &stat), 700);
        assert_eq!(cgroup::working_set(100, &stat), 0);
        assert_eq!(parse_kv("MemTotal:        2048 kB\n")["MemTotal"], 2 * 1024 * 1024);
    }

    #[test]
    fn v2_root_memory_from_meminfo() {
        let meminfo = parse_kv("MemTotal: 1000 kB\nMemFree: 400 kB\nInactive(file): 100 kB\nAnonPages: 50 kB\n");
        let mut root = Counters::default();
        node_fallbacks(&mut root, &meminfo);
        assert_eq!(root.memory_usage, Some(600 * 1024));
        assert_eq!(cgroup::working_set(root.memory_usage.unwrap(), &root.memory_stat), 500 * 1024);
        assert_eq!(root.memory_stat.rss(), Some(50 * 1024));
        // A root with its own memory.stat keeps it.
        let mut root = Counters { memory_stat: Stat::V2(parse_kv("inactive_file 7\n")), ..Default::default() };
        node_fallbacks(&mut root, &meminfo);
        assert_eq!(root.memory_stat.inactive_file(), Some(7));
    }

    #[test]
    fn task_count_from_loadavg() {
        assert_eq!(loadavg_tasks("2.48 1.77 1.70 3/109 28720\n"), Some(109));
        assert_eq!(loadavg_tasks("garbage"), None);
    }
}
