//! The node's own counters: the root cgroup (cgroup v1 `cpuacct`, `memory`), `/proc/meminfo`,
//! `/proc/net/dev` and `/proc/net/route` of a network namespace, `statvfs` of a filesystem.
//! The parsers are pure; the readers are thin.

use std::collections::HashMap;
use std::path::Path;

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

/// The working set as upstream (cAdvisor) defines it: usage minus inactive file pages.
pub fn working_set(usage: u64, memory_stat: &HashMap<String, u64>) -> u64 {
    let inactive = memory_stat.get("total_inactive_file").or(memory_stat.get("inactive_file")).copied().unwrap_or(0);
    usage.saturating_sub(inactive)
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

/// The node's CPU time and memory from the root cgroup (v1 mount at `cgroup_root`).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct NodeCounters {
    pub cpu_usage_nanos: Option<u64>,
    pub memory_usage: Option<u64>,
    pub memory_stat: HashMap<String, u64>,
    pub mem_total: Option<u64>,
    /// Seconds since the epoch.
    pub boot_time: Option<i64>,
}

pub fn node_counters(cgroup_root: &Path) -> NodeCounters {
    let read = |p: &str| std::fs::read_to_string(cgroup_root.join(p)).ok();
    let num = |p: &str| read(p).and_then(|t| t.trim().parse::<u64>().ok());
    let meminfo = std::fs::read_to_string("/proc/meminfo").map(|t| parse_kv(&t)).unwrap_or_default();
    let boot_time = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|t| t.lines().find_map(|l| l.strip_prefix("btime ").and_then(|v| v.trim().parse().ok())));
    NodeCounters {
        cpu_usage_nanos: num("cpuacct/cpuacct.usage").or_else(proc_stat_cpu_nanos),
        memory_usage: num("memory/memory.usage_in_bytes"),
        memory_stat: read("memory/memory.stat").map(|t| parse_kv(&t)).unwrap_or_default(),
        mem_total: meminfo.get("MemTotal").copied(),
        boot_time,
    }
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
        let stat = parse_kv("cache 10\ntotal_inactive_file 300\ntotal_rss 500\n");
        assert_eq!(working_set(1000, &stat), 700);
        assert_eq!(working_set(100, &stat), 0);
        assert_eq!(parse_kv("MemTotal:        2048 kB\n")["MemTotal"], 2 * 1024 * 1024);
    }
}
