//! What the node reports about the machine: identity (machine-id, boot id,
//! system UUID), kernel and OS, CPU/memory/storage capacity. Read from the
//! same files cAdvisor reads for the Go kubelet. (Free memory and disk for the
//! pressure conditions are the eviction manager's.)

use std::path::Path;

/// Static facts about the machine, read once at start-up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineFacts {
    /// `/etc/machine-id`, else `/var/lib/dbus/machine-id`.
    pub machine_id: String,
    /// cAdvisor's order: `/sys/class/dmi/id/product_uuid`, then the device tree's
    /// `system-id` and `vm,uuid` (ppc64), then `/etc/machine-id` (s390x); empty when none
    /// is readable.
    pub system_uuid: String,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// `uname -r`, from `/proc/sys/kernel/osrelease`.
    pub kernel_version: String,
    /// `PRETTY_NAME` of `/etc/os-release`, else "Unknown".
    pub os_image: String,
    /// Go's `GOOS`: "linux".
    pub operating_system: String,
    /// Go's `GOARCH` names: "amd64", "arm64", ...
    pub architecture: String,
    /// Logical CPUs.
    pub num_cpus: u32,
    /// `MemTotal` in bytes.
    pub memory_bytes: u64,
    /// Size of the file system holding the kubelet root directory.
    pub ephemeral_storage_bytes: u64,
    /// Per huge page size (bytes), the bytes pre-allocated (`nr_hugepages` × size; 0 when
    /// none), for every size the kernel offers under `/sys/kernel/mm/hugepages`.
    pub hugepages: Vec<(u64, u64)>,
}

/// Where the system UUID may be, in cAdvisor's order (the first readable file wins).
const SYSTEM_UUID_FILES: [&str; 4] =
    ["/sys/class/dmi/id/product_uuid", "/proc/device-tree/system-id", "/proc/device-tree/vm,uuid", "/etc/machine-id"];

/// The first of `files` that reads, trimmed (an empty readable file still wins, as upstream).
fn first_readable(files: &[&str], read: impl Fn(&str) -> Option<String>) -> String {
    files.iter().find_map(|f| read(f)).map(|s| s.trim().trim_end_matches('\0').to_string()).unwrap_or_default()
}

/// `hugepages-2048kB` → 2 MiB in bytes.
fn hugepage_size(dir_name: &str) -> Option<u64> {
    let kb: u64 = dir_name.strip_prefix("hugepages-")?.strip_suffix("kB")?.parse().ok()?;
    kb.checked_mul(1024)
}

/// Each huge page size under `dir` with the bytes pre-allocated, smallest size first.
fn read_hugepages(dir: &Path) -> Vec<(u64, u64)> {
    let mut sizes: Vec<(u64, u64)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let size = hugepage_size(&entry.file_name().to_string_lossy())?;
            let pages: u64 = std::fs::read_to_string(entry.path().join("nr_hugepages")).ok()?.trim().parse().ok()?;
            Some((size, pages.saturating_mul(size)))
        })
        .collect();
    sizes.sort();
    sizes
}

impl MachineFacts {
    /// Reads the machine; anything unreadable is left empty (and logged).
    pub fn read(root_dir: &Path) -> MachineFacts {
        let read = |path: &str| std::fs::read_to_string(path).ok().map(|s| s.trim().to_string());
        let machine_id = ["/etc/machine-id", "/var/lib/dbus/machine-id"]
            .into_iter()
            .filter_map(read)
            .find(|s| !s.is_empty())
            .unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let (memory_bytes, _) = parse_meminfo(&meminfo);
        let capacity = fs_capacity(root_dir);
        let facts = MachineFacts {
            machine_id,
            system_uuid: first_readable(&SYSTEM_UUID_FILES, |p| std::fs::read_to_string(p).ok()),
            boot_id: read("/proc/sys/kernel/random/boot_id").unwrap_or_default(),
            kernel_version: read("/proc/sys/kernel/osrelease").unwrap_or_default(),
            os_image: std::fs::read_to_string("/etc/os-release")
                .ok()
                .and_then(|t| parse_os_release(&t))
                .unwrap_or_else(|| "Unknown".to_string()),
            operating_system: std::env::consts::OS.to_string(),
            architecture: go_arch(std::env::consts::ARCH).to_string(),
            num_cpus: count_cpus(),
            memory_bytes: memory_bytes.unwrap_or(0),
            ephemeral_storage_bytes: capacity.unwrap_or(0),
            hugepages: read_hugepages(Path::new("/sys/kernel/mm/hugepages")),
        };
        if facts.machine_id.is_empty() || facts.boot_id.is_empty() || facts.memory_bytes == 0 {
            tracing::warn!(?facts, "some machine facts could not be read; they are reported empty");
        }
        facts
    }
}

/// The capacity of `dir`'s file system, or of its closest existing ancestor's (the root dir
/// may not exist yet).
fn fs_capacity(dir: &Path) -> Option<u64> {
    let mut path = Some(dir);
    while let Some(p) = path {
        if let Ok(st) = nix::sys::statvfs::statvfs(p) {
            #[allow(clippy::unnecessary_cast)] // the field types differ between targets
            return Some((st.blocks() as u64).saturating_mul(st.fragment_size() as u64));
        }
        path = p.parent();
    }
    None
}

/// (`MemTotal`, `MemAvailable`) in bytes.
pub fn parse_meminfo(text: &str) -> (Option<u64>, Option<u64>) {
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            let mut parts = rest.split_whitespace();
            let value: u64 = parts.next()?.parse().ok()?;
            match parts.next() {
                Some("kB") => Some(value * 1024),
                None => Some(value),
                _ => None,
            }
        })
    };
    (field("MemTotal"), field("MemAvailable"))
}

/// `PRETTY_NAME` from os-release, unquoted.
pub fn parse_os_release(text: &str) -> Option<String> {
    let value = text.lines().find_map(|l| l.trim().strip_prefix("PRETTY_NAME="))?;
    let value = value.trim();
    let unquoted = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
        .unwrap_or(value);
    Some(unquoted.replace("\\\"", "\"")).filter(|s| !s.is_empty())
}

/// Logical CPUs: the `processor` entries of /proc/cpuinfo, else what the
/// process may use.
fn count_cpus() -> u32 {
    let from_cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok().map(|t| count_cpuinfo_processors(&t));
    match from_cpuinfo {
        Some(n) if n > 0 => n,
        _ => std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
    }
}

pub fn count_cpuinfo_processors(text: &str) -> u32 {
    text.lines().filter(|l| l.split(':').next().is_some_and(|k| k.trim() == "processor")).count() as u32
}

/// Rust's architecture name → Go's `GOARCH`.
pub fn go_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "powerpc64" => "ppc64",
        "loongarch64" => "loong64",
        "mips64" if cfg!(target_endian = "little") => "mips64le",
        "mips" if cfg!(target_endian = "little") => "mipsle",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_uuid_falls_back_in_cadvisors_order() {
        let files = |present: &'static [(&'static str, &'static str)]| {
            move |p: &str| present.iter().find(|(f, _)| *f == p).map(|(_, c)| c.to_string())
        };
        let dmi = files(&[("/sys/class/dmi/id/product_uuid", "4C4C4544-0042\n"), ("/etc/machine-id", "m")]);
        assert_eq!(first_readable(&SYSTEM_UUID_FILES, dmi), "4C4C4544-0042");
        let ppc = files(&[("/proc/device-tree/vm,uuid", "1f2e\0"), ("/etc/machine-id", "m")]);
        assert_eq!(first_readable(&SYSTEM_UUID_FILES, ppc), "1f2e");
        assert_eq!(first_readable(&SYSTEM_UUID_FILES, files(&[("/etc/machine-id", "abc\n")])), "abc");
        assert_eq!(first_readable(&SYSTEM_UUID_FILES, files(&[])), "");
    }

    #[test]
    fn hugepages_sizes_from_sysfs_with_zero_when_none_are_allocated() {
        assert_eq!(hugepage_size("hugepages-2048kB"), Some(2 << 20));
        assert_eq!(hugepage_size("hugepages-1048576kB"), Some(1 << 30));
        assert_eq!(hugepage_size("other"), None);
        let dir = tempfile::tempdir().unwrap();
        for (name, pages) in [("hugepages-2048kB", "3\n"), ("hugepages-1048576kB", "0\n")] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
            std::fs::write(dir.path().join(name).join("nr_hugepages"), pages).unwrap();
        }
        assert_eq!(read_hugepages(dir.path()), [(2 << 20, 3 * (2 << 20)), (1 << 30, 0)]);
    }

    #[test]
    fn meminfo() {
        let text = "MemTotal:       16265768 kB\nMemFree:         1000 kB\nMemAvailable:   8000000 kB\n";
        assert_eq!(parse_meminfo(text), (Some(16_265_768 * 1024), Some(8_000_000 * 1024)));
        assert_eq!(parse_meminfo(""), (None, None));
    }

    #[test]
    fn os_release() {
        assert_eq!(
            parse_os_release("NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n").as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        assert_eq!(parse_os_release("PRETTY_NAME=Alpine\n").as_deref(), Some("Alpine"));
        assert_eq!(parse_os_release("PRETTY_NAME='Single'\n").as_deref(), Some("Single"));
        assert_eq!(parse_os_release("NAME=x\n"), None);
    }

    #[test]
    fn cpuinfo() {
        assert_eq!(count_cpuinfo_processors("processor\t: 0\nmodel\t: x\n\nprocessor\t: 1\n"), 2);
    }

    #[test]
    fn go_arch_names() {
        assert_eq!(go_arch("x86_64"), "amd64");
        assert_eq!(go_arch("aarch64"), "arm64");
        assert_eq!(go_arch("s390x"), "s390x");
        assert_eq!(go_arch("riscv64"), "riscv64");
    }

    #[test]
    fn reads_this_machine() {
        let dir = tempfile::tempdir().unwrap();
        let facts = MachineFacts::read(&dir.path().join("not-yet-created"));
        assert_eq!(facts.operating_system, "linux");
        assert!(facts.num_cpus >= 1);
        assert!(facts.memory_bytes > 0);
        assert!(facts.ephemeral_storage_bytes > 0);
        assert!(!facts.boot_id.is_empty());
    }
}
