//! What the runtime reports about one pod, in the shape the planner needs.

use super::Nanos;
use super::resources::CgroupValues;

/// Sandboxes and containers the runtime holds for one pod UID.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ObservedPod {
    pub sandboxes: Vec<SandboxInfo>,
    pub containers: Vec<ContainerInfo>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SandboxInfo {
    pub id: String,
    pub attempt: u32,
    pub ready: bool,
    pub created_at: Nanos,
    pub ip: Option<String>,
    pub additional_ips: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ContainerInfo {
    pub id: String,
    pub name: String,
    pub sandbox_id: String,
    pub attempt: u32,
    pub state: ContainerState,
    pub created_at: Nanos,
    pub started_at: Nanos,
    pub finished_at: Nanos,
    pub exit_code: i32,
    /// Reason and message as the runtime reports them for exited containers (e.g. `Completed`,
    /// `Error`, `OOMKilled`).
    pub reason: String,
    pub message: String,
    pub image: String,
    pub image_ref: String,
    /// Hash of the container spec this instance was created from.
    pub spec_hash: String,
    /// The identity of the container's first process, when the runtime reports it (CRI
    /// `ContainerStatus.user.linux`; containerd 2.0+).
    pub user: Option<LinuxUser>,
    /// The cgroup values the runtime reports it applied (CRI `ContainerStatus.resources.linux`);
    /// zero where it reports nothing.
    pub applied: CgroupValues,
}

/// A Linux process identity: uid, primary gid and supplemental groups.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinuxUser {
    pub uid: i64,
    pub gid: i64,
    pub supplemental_groups: Vec<i64>,
}

#[cfg(test)]
impl ContainerInfo {
    /// A container for tests: the given identity and state, everything else zero or empty.
    pub fn fixture(id: &str, name: &str, state: ContainerState) -> ContainerInfo {
        ContainerInfo {
            id: id.into(),
            name: name.into(),
            sandbox_id: String::new(),
            attempt: 0,
            state,
            created_at: 0,
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            image: String::new(),
            image_ref: String::new(),
            spec_hash: String::new(),
            user: None,
            applied: CgroupValues::default(),
        }
    }
}

impl ObservedPod {
    /// The newest sandbox, which is the one the pod lives in (older ones are leftovers).
    pub fn current_sandbox(&self) -> Option<&SandboxInfo> {
        self.sandboxes.iter().max_by_key(|s| (s.created_at, s.attempt))
    }

    /// More than one sandbox is ready: only one may hold the pod.
    pub fn several_ready(&self) -> bool {
        self.sandboxes.iter().filter(|s| s.ready).count() > 1
    }

    /// The newest instance of container `name`, in any sandbox.
    pub fn latest(&self, name: &str) -> Option<&ContainerInfo> {
        self.instances(name).max_by_key(|c| (c.attempt, c.created_at))
    }

    /// The newest instance of `name` inside `sandbox_id`.
    pub fn latest_in(&self, name: &str, sandbox_id: &str) -> Option<&ContainerInfo> {
        self.instances(name).filter(|c| c.sandbox_id == sandbox_id).max_by_key(|c| (c.attempt, c.created_at))
    }

    /// The instance before the newest one, for `lastState`.
    pub fn previous(&self, name: &str) -> Option<&ContainerInfo> {
        let latest = self.latest(name)?;
        self.instances(name).filter(|c| c.id != latest.id).max_by_key(|c| (c.attempt, c.created_at))
    }

    pub fn instances<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a ContainerInfo> + use<'a> {
        let name = name.to_string();
        self.containers.iter().filter(move |c| c.name == name)
    }

    pub fn running(&self) -> impl Iterator<Item = &ContainerInfo> {
        self.containers.iter().filter(|c| matches!(c.state, ContainerState::Running | ContainerState::Created))
    }

    /// Restarts so far: the attempt number of the newest instance.
    pub fn restart_count(&self, name: &str) -> u32 {
        self.latest(name).map_or(0, |c| c.attempt)
    }
}
