//! Per-instance pod network: a private bridge and /24 out of 10.244.0.0/16.
//!
//! Many containerd instances run at once (parallel tests in several processes),
//! so each needs its own bridge name and subnet. Index N (1..=254) is owned by
//! whoever holds an exclusive `flock` on `/run/gantry-testkit/subnet-N.lock`;
//! the kernel drops the lock when the owner exits, even after a crash, so an
//! index can never be leaked for good.

use std::fs::{File, OpenOptions};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::cmd;
use crate::error::{IoContext, Result, TestkitError};

/// On tmpfs, so stale lock files disappear at reboot. Not under `$TMPDIR`:
/// every process must agree on the directory whatever its environment.
const LOCK_DIR: &str = "/run/gantry-testkit";
const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// Plugins the generated conflist needs from [`CNI_BIN_DIR`].
pub(crate) const REQUIRED_PLUGINS: [&str; 4] = ["bridge", "host-local", "loopback", "portmap"];

/// Directory holding the CNI plugin binaries.
pub fn cni_bin_dir() -> &'static Path {
    Path::new(CNI_BIN_DIR)
}

/// An exclusively owned bridge + subnet; the bridge link is deleted on drop.
#[derive(Debug)]
pub struct PodNetwork {
    index: u8,
    /// Held for the lifetime of the network: the flock is the ownership.
    lock: File,
}

/// Who last used an index, as recorded in its lock file. Found when a new
/// owner claims the index: a previous owner whose record is still there died
/// without cleaning up, and its containerd may still be running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRecord {
    pub base: PathBuf,
    pub containerd_pid: u32,
}

impl PodNetwork {
    /// Claim the first free index. Also returns the record a previous owner
    /// that died without cleaning up left behind, so the caller can reap it.
    pub fn allocate() -> Result<(Self, Option<OwnerRecord>)> {
        std::fs::create_dir_all(LOCK_DIR).ctx(|| format!("create {LOCK_DIR}"))?;
        for index in 1..=254u8 {
            if let Some(lock) = try_claim(index)? {
                let network = PodNetwork { index, lock };
                // A dead owner may have left its bridge behind; as the owner
                // now, we may safely remove it.
                network.delete_bridge();
                let previous = network.read_owner();
                tracing::debug!(bridge = %network.bridge(), subnet = %network.subnet(), "allocated pod network");
                return Ok((network, previous));
            }
        }
        Err(TestkitError::NoFreeSubnet)
    }

    /// Note which instance uses this index, for reaping should we die.
    pub fn record_owner(&self, record: &OwnerRecord) -> Result<()> {
        let text = json!({ "base": record.base, "containerd_pid": record.containerd_pid });
        self.write_lock_file(text.to_string().as_bytes())
    }

    /// Forget the owner record: called after a clean shutdown.
    pub fn clear_owner(&self) -> Result<()> {
        self.write_lock_file(b"")
    }

    fn read_owner(&self) -> Option<OwnerRecord> {
        use std::io::{Read, Seek};
        let mut file = &self.lock;
        let mut text = String::new();
        file.rewind().ok()?;
        file.read_to_string(&mut text).ok()?;
        let value: Value = serde_json::from_str(&text).ok()?;
        Some(OwnerRecord {
            base: PathBuf::from(value["base"].as_str()?),
            containerd_pid: value["containerd_pid"].as_u64()?.try_into().ok()?,
        })
    }

    fn write_lock_file(&self, content: &[u8]) -> Result<()> {
        use std::io::{Seek, Write};
        let mut file = &self.lock;
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(content))
            .ctx(|| format!("write owner record for index {}", self.index))
    }

    /// Linux bridge device name (at most 9 chars, well within IFNAMSIZ).
    pub fn bridge(&self) -> String {
        format!("gantry{}", self.index)
    }

    /// CNI network name, unique like the bridge so CNI result caches never mix.
    pub fn name(&self) -> String {
        format!("gantry-testkit-{}", self.index)
    }

    /// The pod subnet in CIDR notation, e.g. `10.244.7.0/24`.
    pub fn subnet(&self) -> String {
        format!("10.244.{}.0/24", self.index)
    }

    /// The bridge's own address: how the host reaches pods and pods the host.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 244, self.index, 1)
    }

    /// Whether `ip` lies in this network's subnet.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let [a, b, c, _] = ip.octets();
        (a, b, c) == (10, 244, self.index)
    }

    /// The CNI conflist. No route besides the on-link subnet is given to pods
    /// and masquerading is off, so pod traffic can never leave the host.
    /// Loopback is not listed: containerd's CRI plugin sets up `lo` itself
    /// with the `loopback` binary from the same bin dir.
    pub fn conflist(&self, ipam_data_dir: &Path) -> Value {
        json!({
            "cniVersion": "1.0.0",
            "name": self.name(),
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge(),
                    "isGateway": true,
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{ "subnet": self.subnet(), "gateway": self.gateway().to_string() }]],
                        "dataDir": ipam_data_dir,
                    },
                },
                { "type": "portmap", "capabilities": { "portMappings": true } },
            ],
        })
    }

    /// Write the conflist into `conf_dir` (created if needed).
    pub fn write_config(&self, conf_dir: &Path, ipam_data_dir: &Path) -> Result<PathBuf> {
        std::fs::create_dir_all(conf_dir).ctx(|| format!("create {}", conf_dir.display()))?;
        let path = conf_dir.join("10-gantry.conflist");
        let text =
            serde_json::to_vec_pretty(&self.conflist(ipam_data_dir)).expect("serialising a JSON value cannot fail");
        std::fs::write(&path, text).ctx(|| format!("write {}", path.display()))?;
        Ok(path)
    }

    fn delete_bridge(&self) {
        let bridge = self.bridge();
        if !Path::new("/sys/class/net").join(&bridge).exists() {
            return;
        }
        match cmd::run(Command::new("ip").args(["link", "del", &bridge])) {
            Ok(_) => tracing::debug!(%bridge, "deleted bridge"),
            Err(error) => tracing::warn!(%bridge, %error, "could not delete bridge"),
        }
    }
}

impl Drop for PodNetwork {
    fn drop(&mut self) {
        // Runs before the lock field is dropped, so the next owner of this
        // index never sees our bridge.
        self.delete_bridge();
    }
}

/// Try to take the lock for `index` without blocking.
fn try_claim(index: u8) -> Result<Option<File>> {
    let path = Path::new(LOCK_DIR).join(format!("subnet-{index}.lock"));
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .ctx(|| format!("open {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(source)) => {
            Err(TestkitError::Io { context: format!("lock {}", path.display()), source })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_allocations_are_distinct() {
        // flock is per open file description, so two claims from one process
        // exclude each other just like claims from two processes.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let (a, _) = PodNetwork::allocate().unwrap();
        let (b, _) = PodNetwork::allocate().unwrap();
        assert_ne!(a.subnet(), b.subnet());
        assert_ne!(a.bridge(), b.bridge());
        assert!(a.bridge().len() <= 15);
        assert!(a.contains(a.gateway()) && !b.contains(a.gateway()));
        let conf = a.conflist(Path::new("/x"));
        assert_eq!(conf["plugins"][0]["ipMasq"], false);
        assert_eq!(conf["plugins"][0]["bridge"], a.bridge());

        let record = OwnerRecord { base: "/dev/shm/gantry-ctd-x".into(), containerd_pid: 42 };
        a.record_owner(&record).unwrap();
        assert_eq!(a.read_owner(), Some(record));
        a.clear_owner().unwrap();
        assert_eq!(a.read_owner(), None);
    }
}
