//! What the node reports about the machine: identity (machine-id, boot id,
//! system UUID), kernel and OS, CPU/memory/storage capacity, and current
//! free memory and disk for the pressure conditions. Read from the same
//! files cAdvisor reads for the Go kubelet.

use std::path::Path;

/// Static facts about the machine, read once at start-up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineFacts {
    /// `/etc/machine-id`, else `/var/lib/dbus/machine-id`.
    pub machine_id: String,
    /// `/sys/class/dmi/id/product_uuid`; empty when unreadable.
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
}

/// Current free resources, read on every status pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// `MemAvailable` in bytes.
    pub memory_available_bytes: Option<u64>,
    /// Bytes available to unprivileged users on the root dir's file system.
    pub nodefs_available_bytes: Option<u64>,
    pub nodefs_inodes_free: Option<u64>,
    pub nodefs_inodes: Option<u64>,
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
        let fs = statvfs_near(root_dir);
        let facts = MachineFacts {
            machine_id,
            system_uuid: read("/sys/class/dmi/id/product_uuid").unwrap_or_default(),
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
            ephemeral_storage_bytes: fs.map_or(0, |f| f.capacity),
        };
        if facts.machine_id.is_empty() || facts.boot_id.is_empty() || facts.memory_bytes == 0 {
            tracing::warn!(?facts, "some machine facts could not be read; they are reported empty");
        }
        facts
    }
}

/// Reads free memory and the root dir's free space and inodes.
pub fn read_usage(root_dir: &Path) -> Usage {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let (_, available) = parse_meminfo(&meminfo);
    let fs = statvfs_near(root_dir);
    Usage {
        memory_available_bytes: available,
        nodefs_available_bytes: fs.map(|f| f.available),
        nodefs_inodes_free: fs.map(|f| f.inodes_free),
        nodefs_inodes: fs.map(|f| f.inodes),
    }
}

#[derive(Clone, Copy, Debug)]
struct FsStats {
    capacity: u64,
    available: u64,
    inodes: u64,
    inodes_free: u64,
}

/// statvfs of `dir`, or of its closest existing ancestor (the root dir may
/// not exist yet).
fn statvfs_near(dir: &Path) -> Option<FsStats> {
    let mut path = Some(dir);
    while let Some(p) = path {
        if let Ok(st) = nix::sys::statvfs::statvfs(p) {
            #[allow(clippy::unnecessary_cast)] // the field types differ between targets
            let (frsize, blocks, available, files, files_free) = (
                st.fragment_size() as u64,
                st.blocks() as u64,
                st.blocks_available() as u64,
                st.files() as u64,
                st.files_available() as u64,
            );
            return Some(FsStats {
                capacity: blocks.saturating_mul(frsize),
                available: available.saturating_mul(frsize),
                inodes: files,
                inodes_free: files_free,
            });
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
        let usage = read_usage(dir.path());
        assert!(usage.memory_available_bytes.is_some() && usage.nodefs_available_bytes.is_some());
    }
}
