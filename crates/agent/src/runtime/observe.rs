//! Reads the runtime's sandboxes and containers into per-pod [`ObservedPod`]s.
//!
//! `ListContainers` does not carry exit codes or start times, so those come from
//! `ContainerStatus`, fetched only when a container is new or changed state (a container's
//! details do not change while its state does not).

use std::collections::HashMap;
use std::sync::Mutex;

use gantry_cri::{CriError, RuntimeClient, api};

use gantry_pod::resources::CgroupValues;
use gantry_pod::{ContainerInfo, ContainerState, LinuxUser, ObservedPod, SandboxInfo};
use gantry_vocab::cri_labels as labels;

/// Per-pod observations of everything this node agent owns, plus what the labels say about
/// each pod (needed to stop pods that no source wants any more).
#[derive(Debug, Default)]
pub struct Snapshot {
    pub pods: HashMap<String, ObservedPod>,
    pub identities: HashMap<String, PodIdentity>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PodIdentity {
    pub name: String,
    pub namespace: String,
    pub grace_seconds: i64,
}

/// A sandbox's primary IP and any others (dual stack).
type SandboxIps = (Option<String>, Vec<String>);

fn network_ips(network: Option<api::PodSandboxNetworkStatus>) -> SandboxIps {
    let ip = network.as_ref().map(|n| n.ip.clone()).filter(|ip| !ip.is_empty());
    let more = network.map(|n| n.additional_ips.into_iter().map(|i| i.ip).collect()).unwrap_or_default();
    (ip, more)
}

pub struct Observer {
    runtime: RuntimeClient,
    node: String,
    containers: Mutex<HashMap<String, ContainerInfo>>,
    sandbox_ips: Mutex<HashMap<String, SandboxIps>>,
}

impl Observer {
    pub fn new(runtime: RuntimeClient, node: &str) -> Self {
        Observer { runtime, node: node.to_string(), containers: Mutex::default(), sandbox_ips: Mutex::default() }
    }

    /// One pod's objects.
    pub async fn pod(&self, uid: &str) -> Result<ObservedPod, CriError> {
        let snapshot = self.list(labels::of_pod(&self.node, uid)).await?;
        Ok(snapshot.pods.into_values().next().unwrap_or_default())
    }

    /// Everything this node agent owns. Also forgets cached details of objects that are gone.
    pub async fn all(&self) -> Result<Snapshot, CriError> {
        let snapshot = self.list(labels::owned_by(&self.node)).await?;
        let live: std::collections::HashSet<&str> =
            snapshot.pods.values().flat_map(|p| p.containers.iter().map(|c| c.id.as_str())).collect();
        self.containers.lock().unwrap().retain(|id, _| live.contains(id.as_str()));
        let live_sandboxes: std::collections::HashSet<&str> =
            snapshot.pods.values().flat_map(|p| p.sandboxes.iter().map(|s| s.id.as_str())).collect();
        self.sandbox_ips.lock().unwrap().retain(|id, _| live_sandboxes.contains(id.as_str()));
        Ok(snapshot)
    }

    async fn list(&self, selector: HashMap<String, String>) -> Result<Snapshot, CriError> {
        let sandboxes = self
            .runtime
            .list_pod_sandbox(api::ListPodSandboxRequest {
                filter: Some(api::PodSandboxFilter { label_selector: selector.clone(), ..Default::default() }),
            })
            .await?
            .items;
        let containers = self
            .runtime
            .list_containers(api::ListContainersRequest {
                filter: Some(api::ContainerFilter { label_selector: selector, ..Default::default() }),
            })
            .await?
            .containers;
        let mut snapshot = Snapshot::default();
        for s in sandboxes {
            let uid = s.labels.get(labels::POD_UID).cloned().unwrap_or_default();
            snapshot.identities.entry(uid.clone()).or_insert_with(|| identity(&s.labels, &s.annotations));
            let info = self.sandbox_info(s).await?;
            snapshot.pods.entry(uid).or_default().sandboxes.push(info);
        }
        for c in containers {
            let uid = c.labels.get(labels::POD_UID).cloned().unwrap_or_default();
            snapshot.identities.entry(uid.clone()).or_insert_with(|| identity(&c.labels, &c.annotations));
            if let Some(info) = self.container_info(c).await? {
                snapshot.pods.entry(uid).or_default().containers.push(info);
            }
        }
        Ok(snapshot)
    }

    async fn sandbox_info(&self, s: api::PodSandbox) -> Result<SandboxInfo, CriError> {
        let ready = s.state == api::PodSandboxState::SandboxReady as i32;
        let cached = self.sandbox_ips.lock().unwrap().get(&s.id).cloned();
        let (ip, additional_ips) = match cached {
            Some(ips) => ips,
            None if ready => {
                let ips = self.sandbox_ips(&s.id).await?;
                self.sandbox_ips.lock().unwrap().insert(s.id.clone(), ips.clone());
                ips
            }
            None => (None, Vec::new()),
        };
        let attempt = s.metadata.as_ref().map_or(0, |m| m.attempt);
        Ok(SandboxInfo { id: s.id, attempt, ready, created_at: s.created_at, ip, additional_ips })
    }

    /// A sandbox just created, as one `PodSandboxStatus` shows it (its IPs are kept for later
    /// looks): what its containers start in, without listing the pod again. `None` when the
    /// runtime no longer has it.
    pub async fn created_sandbox(&self, id: &str) -> Result<Option<SandboxInfo>, CriError> {
        let Some(status) = self.sandbox_status(id).await? else { return Ok(None) };
        let ips = network_ips(status.network);
        self.sandbox_ips.lock().unwrap().insert(id.to_string(), ips.clone());
        let ready = status.state == api::PodSandboxState::SandboxReady as i32;
        let attempt = status.metadata.as_ref().map_or(0, |m| m.attempt);
        let (ip, additional_ips) = ips;
        Ok(Some(SandboxInfo { id: status.id, attempt, ready, created_at: status.created_at, ip, additional_ips }))
    }

    async fn sandbox_ips(&self, id: &str) -> Result<SandboxIps, CriError> {
        Ok(network_ips(self.sandbox_status(id).await?.and_then(|s| s.network)))
    }

    async fn sandbox_status(&self, id: &str) -> Result<Option<api::PodSandboxStatus>, CriError> {
        let request = api::PodSandboxStatusRequest { pod_sandbox_id: id.to_string(), verbose: false };
        match self.runtime.pod_sandbox_status(request).await {
            Ok(resp) => Ok(resp.status),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Drops what is cached of a container, so that the next look asks the runtime again (its
    /// resources changed).
    pub fn forget(&self, container_id: &str) {
        self.containers.lock().unwrap().remove(container_id);
    }

    /// `None` when the container vanished between list and status.
    async fn container_info(&self, c: api::Container) -> Result<Option<ContainerInfo>, CriError> {
        let state = state_of(c.state);
        if let Some(cached) = self.containers.lock().unwrap().get(&c.id).filter(|i| i.state == state) {
            return Ok(Some(cached.clone()));
        }
        let request = api::ContainerStatusRequest { container_id: c.id.clone(), verbose: false };
        let status = match self.runtime.container_status(request).await {
            Ok(resp) => resp.status,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(status) = status else { return Ok(None) };
        let mut info = container_info(&c, &status);
        if info.state == ContainerState::Exited {
            let written = super::termination::read(&status);
            if !written.is_empty() {
                info.message = if info.message.is_empty() { written } else { format!("{}: {written}", info.message) };
            }
        }
        self.containers.lock().unwrap().insert(c.id.clone(), info.clone());
        Ok(Some(info))
    }
}

fn identity(labels_: &HashMap<String, String>, annotations: &HashMap<String, String>) -> PodIdentity {
    PodIdentity {
        name: labels_.get(labels::POD_NAME).cloned().unwrap_or_default(),
        namespace: labels_.get(labels::POD_NAMESPACE).cloned().unwrap_or_default(),
        grace_seconds: annotations.get(labels::GRACE_PERIOD).and_then(|g| g.parse().ok()).unwrap_or(30),
    }
}

fn state_of(raw: i32) -> ContainerState {
    match api::ContainerState::try_from(raw) {
        Ok(api::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(api::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(api::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    }
}

fn container_info(c: &api::Container, status: &api::ContainerStatus) -> ContainerInfo {
    let metadata = c.metadata.clone().unwrap_or_default();
    ContainerInfo {
        id: c.id.clone(),
        name: metadata.name,
        sandbox_id: c.pod_sandbox_id.clone(),
        attempt: metadata.attempt,
        state: state_of(status.state),
        created_at: status.created_at,
        started_at: status.started_at,
        finished_at: status.finished_at,
        exit_code: status.exit_code,
        reason: status.reason.clone(),
        message: status.message.clone(),
        image: status.image.as_ref().map(|i| i.image.clone()).unwrap_or_default(),
        image_ref: status.image_ref.clone(),
        spec_hash: c.annotations.get(labels::CONTAINER_HASH).cloned().unwrap_or_default(),
        user: status.user.as_ref().and_then(|u| u.linux.as_ref()).map(|l| LinuxUser {
            uid: l.uid,
            gid: l.gid,
            supplemental_groups: l.supplemental_groups.clone(),
        }),
        applied: applied_resources(status),
    }
}

/// The cgroup values the runtime reports for the container; zero where it reports none.
fn applied_resources(status: &api::ContainerStatus) -> CgroupValues {
    let Some(linux) = status.resources.as_ref().and_then(|r| r.linux.as_ref()) else {
        return CgroupValues::default();
    };
    CgroupValues {
        cpu_shares: linux.cpu_shares,
        cpu_quota: linux.cpu_quota,
        cpu_period: linux.cpu_period,
        memory_limit: linux.memory_limit_in_bytes,
        ..Default::default()
    }
}
