//! System containers, as upstream's container manager keeps them (`setupNode`): with
//! `kubeletCgroups` the agent moves itself into that cgroup, and with `systemCgroups` the node's
//! non-kernel processes still in the root cgroup (all but PID 1) are moved into that one. Both
//! are cgroupfs paths whatever the cgroup driver (upstream manages them with the cgroupfs
//! manager too), created when missing, and checked again every minute.

use std::io;
use std::path::Path;
use std::time::Duration;

use gantry_config::PodSettings;

use crate::runtime::cgroups::{self, CgroupFs, Hierarchy};

/// How often the processes are checked, as upstream's `ensureStateFunc` loop.
const PERIOD: Duration = Duration::from_secs(60);

/// Upstream retries moving the root cgroup's processes this many times per round (processes
/// fork while they are moved).
const SYSTEM_ATTEMPTS: usize = 11;

/// Why a system container could not be kept.
#[derive(Debug, thiserror::Error)]
pub enum SystemContainerError {
    #[error("cannot create cgroup {cgroup}: {source}")]
    Create { cgroup: String, source: io::Error },
    #[error("failed to move PID {pid} into the system container {cgroup:?}: {source}")]
    Move { pid: u32, cgroup: String, source: io::Error },
    #[error("failed to list PIDs for root: {0}")]
    ListRoot(io::Error),
}

/// Whether the configuration asks for any system container to be kept.
pub fn configured(pods: &PodSettings) -> bool {
    !pods.kubelet_cgroups.is_empty() || !pods.system_cgroups.is_empty()
}

/// Keeps the system containers for the node's lifetime (supervised as `system-containers`).
/// A failure is logged when it first happens or changes, then at debug level.
pub async fn run(pods: PodSettings) {
    let mount = Path::new(cgroups::MOUNT);
    let Some((fs, hierarchy)) = cgroups::detect().zip(cgroups::hierarchy(mount)) else {
        tracing::warn!(
            "no cgroup file system at {}: kubeletCgroups and systemCgroups are not applied",
            mount.display()
        );
        return std::future::pending().await;
    };
    let fs: std::sync::Arc<dyn CgroupFs> = fs.into();
    let mut last_error: Option<String> = None;
    loop {
        let (fs, pods) = (fs.clone(), pods.clone());
        let errors = tokio::task::spawn_blocking(move || ensure(fs.as_ref(), mount, hierarchy, &pods))
            .await
            .expect("cgroup task does not panic");
        let text = (!errors.is_empty()).then(|| errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "));
        match &text {
            Some(t) if last_error.as_ref() != Some(t) => {
                tracing::warn!(error = %t, "Failed to ensure state of the system containers")
            }
            Some(t) => tracing::debug!(error = %t, "Failed to ensure state of the system containers"),
            None if last_error.is_some() => tracing::info!("system containers are in place again"),
            None => {}
        }
        last_error = text;
        tokio::time::sleep(PERIOD).await;
    }
}

/// One round: the agent into `kubeletCgroups`, the root cgroup's processes into `systemCgroups`.
fn ensure(fs: &dyn CgroupFs, mount: &Path, hierarchy: Hierarchy, pods: &PodSettings) -> Vec<SystemContainerError> {
    let mut errors = Vec::new();
    let create = |cgroup: &str| {
        fs.ensure(cgroup, None).map_err(|source| SystemContainerError::Create { cgroup: cgroup.into(), source })
    };
    if !pods.kubelet_cgroups.is_empty() && !in_container_pid_namespace() {
        let cgroup = &pods.kubelet_cgroups;
        let moved = create(cgroup).and_then(|()| {
            let pid = std::process::id();
            cgroups::attach(mount, hierarchy, cgroup, pid).map_err(|source| SystemContainerError::Move {
                pid,
                cgroup: cgroup.clone(),
                source,
            })
        });
        errors.extend(moved.err());
    }
    if !pods.system_cgroups.is_empty() {
        match create(&pods.system_cgroups) {
            Ok(()) => errors.extend(move_root_processes(mount, hierarchy, &pods.system_cgroups).err()),
            Err(e) => errors.push(e),
        }
    }
    errors
}

/// Upstream's `ensureSystemCgroups`: moves what is left in the root cgroup until nothing
/// movable is, keeping only the last attempt's error.
fn move_root_processes(mount: &Path, hierarchy: Hierarchy, cgroup: &str) -> Result<(), SystemContainerError> {
    let mut last = Ok(());
    for _ in 0..SYSTEM_ATTEMPTS {
        let pids = match cgroups::root_processes(mount, hierarchy) {
            Ok(all) => movable(&all, is_kernel_thread),
            Err(e) => {
                last = Err(SystemContainerError::ListRoot(e));
                continue;
            }
        };
        if pids.is_empty() {
            return Ok(());
        }
        tracing::debug!(?pids, cgroup, "Moving non-kernel processes");
        for pid in pids {
            if let Err(source) = cgroups::attach(mount, hierarchy, cgroup, pid) {
                last = Err(SystemContainerError::Move { pid, cgroup: cgroup.into(), source });
            }
        }
    }
    last
}

/// The processes to move: all but PID 1 and kernel threads (pure).
fn movable(pids: &[u32], is_kernel: impl Fn(u32) -> bool) -> Vec<u32> {
    pids.iter().copied().filter(|&pid| pid != 1 && !is_kernel(pid)).collect()
}

/// A kernel thread has no executable (upstream's `isKernelPid`).
fn is_kernel_thread(pid: u32) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe")).is_err_and(|e| e.kind() == io::ErrorKind::NotFound)
}

/// Upstream leaves a kubelet alone that runs in a container: a PID namespace other than init's
/// (when init's cannot be read, as in some sandboxes, the agent is taken to be on the host).
fn in_container_pid_namespace() -> bool {
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    ns("self").zip(ns("1")).is_some_and(|(own, init)| own != init)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_1_and_kernel_threads_stay_in_the_root_cgroup() {
        assert_eq!(movable(&[1, 2, 40, 41, 300], |pid| pid == 2 || pid == 40), vec![41, 300]);
        assert!(movable(&[1], |_| false).is_empty());
    }

    #[test]
    fn kernel_threads_have_no_executable() {
        assert!(!is_kernel_thread(std::process::id()));
        // kthreadd is PID 2 in the host's PID namespace.
        if !in_container_pid_namespace() && std::fs::read_link("/proc/1/ns/pid").is_ok() {
            assert!(is_kernel_thread(2));
        }
    }

    #[test]
    fn nothing_to_keep_without_the_settings() {
        assert!(!configured(&PodSettings::default()));
        assert!(configured(&PodSettings { system_cgroups: "/system".into(), ..Default::default() }));
    }

    #[test]
    fn the_agent_moves_into_kubelet_cgroups_on_v2() {
        // A fake unified hierarchy: the agent's cgroup is created and gets its PID.
        let dir = tempfile::tempdir().unwrap();
        let fs = cgroups::CgroupV2::new(dir.path());
        let pods = PodSettings { kubelet_cgroups: "/kubelet".into(), ..Default::default() };
        let errors = ensure(&fs, dir.path(), Hierarchy::V2, &pods);
        assert!(errors.is_empty(), "{errors:?}");
        if !in_container_pid_namespace() {
            let procs = std::fs::read_to_string(dir.path().join("kubelet/cgroup.procs")).unwrap();
            assert_eq!(procs, std::process::id().to_string());
        }
    }
}
