//! The device manager's decisions (pure): which devices each resource has and which are
//! healthy, what the Node reports for them, which devices a container gets, and when a pod
//! cannot be admitted. Time is passed in.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::api::deviceplugin::{ContainerAllocateResponse, Device};

/// Upstream's `pluginapi.Healthy`.
pub const HEALTHY: &str = "Healthy";
/// How long a resource whose plugin went away stays in the Node's capacity (with nothing
/// allocatable) before it is removed (upstream `endpointStopGracePeriod`).
pub const STOP_GRACE_PERIOD: Duration = Duration::from_secs(5 * 60);

/// Why a container's devices cannot be allocated (upstream's wording; the pod is rejected with
/// `Allocate failed due to <this>, which is unexpected`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    #[error("requested number of devices unavailable for {resource}. Requested: {requested}, Available: {available}")]
    Unavailable { resource: String, requested: usize, available: usize },
    #[error("no healthy devices present; cannot allocate unhealthy devices {resource}")]
    NoHealthy { resource: String },
    #[error("previously allocated devices are no longer healthy; cannot allocate unhealthy devices {resource}")]
    NoLongerHealthy { resource: String },
}

/// One resource's devices as its plugin last listed them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Resource {
    healthy: BTreeSet<String>,
    unhealthy: BTreeSet<String>,
    /// When its plugin went away; `None` while connected.
    stopped: Option<Instant>,
}

/// The devices one container holds, and what the plugin's `Allocate` answered for them.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub pod_uid: String,
    pub container: String,
    pub resource: String,
    pub device_ids: Vec<String>,
    pub response: ContainerAllocateResponse,
}

/// What the Node reports for one resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Amounts {
    /// Every device, healthy or not.
    pub capacity: i64,
    /// Healthy devices (none while the plugin is away).
    pub allocatable: i64,
}

/// The device plugin resources on the Node: present ones, and removed ones (reported as 0 so
/// that the scheduler still tells them from cluster-level extended resources, as upstream).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capacity {
    pub resources: BTreeMap<String, Amounts>,
    pub removed: BTreeSet<String>,
}

/// What a container needs of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// It holds its devices already (admitted before, or restored from the checkpoint).
    Allocated(Vec<String>),
    /// `size` devices from `available` (healthy and free, in order), `reusable` ones first.
    Pick { reusable: Vec<String>, available: Vec<String>, size: usize },
}

/// The whole state: devices per resource and the allocations.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    resources: BTreeMap<String, Resource>,
    entries: Vec<Entry>,
    /// Resources removed after their grace period, reported once as 0 in capacity.
    removed: BTreeSet<String>,
}

impl Registry {
    /// The state a restart starts from: the checkpoint's allocations, and its resources with no
    /// devices until their plugins register again (upstream keeps the capacity at zero until
    /// then, and drops the resource after the grace period).
    pub fn restored(entries: Vec<Entry>, registered: impl IntoIterator<Item = String>, now: Instant) -> Self {
        let resources =
            registered.into_iter().map(|name| (name, Resource { stopped: Some(now), ..Resource::default() })).collect();
        Registry { resources, entries, removed: BTreeSet::new() }
    }

    /// A plugin's `ListAndWatch` answer: its whole device list.
    pub fn update(&mut self, resource: &str, devices: &[Device]) {
        let r = self.resources.entry(resource.to_string()).or_default();
        r.stopped = None;
        r.healthy = devices.iter().filter(|d| d.health == HEALTHY).map(|d| d.id.clone()).collect();
        r.unhealthy = devices.iter().filter(|d| d.health != HEALTHY).map(|d| d.id.clone()).collect();
        self.removed.remove(resource);
    }

    /// The plugin went away: its devices stay in capacity, none allocatable, until the grace
    /// period ends or it registers again.
    pub fn disconnected(&mut self, resource: &str, now: Instant) {
        if let Some(r) = self.resources.get_mut(resource) {
            let healthy = std::mem::take(&mut r.healthy);
            r.unhealthy.extend(healthy);
            r.stopped = Some(now);
        }
    }

    /// The Node's device plugin resources at `now`; drops resources whose grace period ended.
    pub fn capacity(&mut self, now: Instant) -> Capacity {
        let expired: Vec<String> = self
            .resources
            .iter()
            .filter(|(_, r)| r.stopped.is_some_and(|at| now.duration_since(at) >= STOP_GRACE_PERIOD))
            .map(|(name, _)| name.clone())
            .collect();
        for name in expired {
            self.resources.remove(&name);
            self.removed.insert(name);
        }
        let resources = self
            .resources
            .iter()
            .map(|(name, r)| {
                let allocatable = r.healthy.len() as i64;
                (name.clone(), Amounts { capacity: allocatable + r.unhealthy.len() as i64, allocatable })
            })
            .collect();
        Capacity { resources, removed: self.removed.clone() }
    }

    /// Whether the device manager handles `resource` (it has or had a plugin, or devices of it
    /// are allocated); other extended resources are not its business.
    pub fn manages(&self, resource: &str) -> bool {
        self.resources.contains_key(resource) || self.entries.iter().any(|e| e.resource == resource)
    }

    /// Every registered resource with all its devices, healthy or not (the checkpoint's
    /// `RegisteredDevices`, the pod-resources API's allocatable devices).
    pub fn registered(&self) -> BTreeMap<String, Vec<String>> {
        self.resources
            .iter()
            .map(|(name, r)| (name.clone(), r.healthy.iter().chain(&r.unhealthy).cloned().collect()))
            .collect()
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The devices `container` of pod `uid` holds of each resource.
    pub fn container_entries<'a>(&'a self, uid: &'a str, container: &'a str) -> impl Iterator<Item = &'a Entry> {
        self.entries.iter().filter(move |e| e.pod_uid == uid && e.container == container)
    }

    /// What `container` of pod `uid` needs to get `size` devices of `resource` (upstream
    /// `devicesToAllocate`). `reusable`: devices of the pod's finished init containers, which
    /// later containers of the pod may take (and take first).
    pub fn need(
        &self,
        uid: &str,
        container: &str,
        resource: &str,
        size: usize,
        reusable: &BTreeSet<String>,
    ) -> Result<Need, AllocError> {
        if let Some(e) = self.container_entries(uid, container).find(|e| e.resource == resource) {
            return Ok(Need::Allocated(e.device_ids.clone()));
        }
        let unhealthy = || AllocError::NoHealthy { resource: resource.to_string() };
        let r = self.resources.get(resource).ok_or_else(unhealthy)?;
        if r.healthy.is_empty() {
            return Err(unhealthy());
        }
        let in_use: BTreeSet<&String> = self
            .entries
            .iter()
            .filter(|e| e.resource == resource)
            .flat_map(|e| &e.device_ids)
            .filter(|d| !reusable.contains(*d))
            .collect();
        let available: Vec<String> = r.healthy.iter().filter(|d| !in_use.contains(d)).cloned().collect();
        if available.len() < size {
            return Err(AllocError::Unavailable {
                resource: resource.to_string(),
                requested: size,
                available: available.len(),
            });
        }
        let reusable = available.iter().filter(|d| reusable.contains(*d)).cloned().collect();
        Ok(Need::Pick { reusable, available, size })
    }

    /// Records an allocation (replacing the container's earlier one of the same resource).
    pub fn record(&mut self, entry: Entry) {
        self.entries.retain(|e| {
            !(e.pod_uid == entry.pod_uid && e.container == entry.container && e.resource == entry.resource)
        });
        self.entries.push(entry);
    }

    /// Frees the devices of pods not in `active`; true when something was freed.
    pub fn retain_pods(&mut self, active: &BTreeSet<String>) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| active.contains(&e.pod_uid));
        before != self.entries.len()
    }

    /// Frees the devices of pod `uid`; true when it held some.
    pub fn release(&mut self, uid: &str) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| e.pod_uid != uid);
        before != self.entries.len()
    }
}

/// The devices to give a container, `size` in all: the reusable ones first, then the plugin's
/// preferred ones (those it may give), then the first available ones.
pub fn choose(reusable: &[String], available: &[String], size: usize, preferred: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(size);
    for id in reusable.iter().chain(preferred).chain(available) {
        if out.len() == size {
            break;
        }
        if available.contains(id) && !out.contains(id) {
            out.push(id.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(id: &str, health: &str) -> Device {
        Device { id: id.into(), health: health.into(), topology: None }
    }

    fn entry(uid: &str, container: &str, ids: &[&str]) -> Entry {
        Entry {
            pod_uid: uid.into(),
            container: container.into(),
            resource: "example.com/gpu".into(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
            response: ContainerAllocateResponse::default(),
        }
    }

    const GPU: &str = "example.com/gpu";

    fn none() -> BTreeSet<String> {
        BTreeSet::new()
    }

    #[test]
    fn a_finished_init_containers_devices_are_reused_by_the_pods_next_containers() {
        let mut r = Registry::default();
        r.update(GPU, &[dev("a", HEALTHY), dev("b", HEALTHY)]);
        r.record(entry("p1", "init", &["a"]));
        // Without reuse, only b is free; with a reusable, both are, a first.
        assert_eq!(
            r.need("p1", "app", GPU, 2, &none()).unwrap_err().to_string(),
            "requested number of devices unavailable for example.com/gpu. Requested: 2, Available: 1"
        );
        let reusable = BTreeSet::from(["a".to_string()]);
        assert_eq!(
            r.need("p1", "app", GPU, 2, &reusable),
            Ok(Need::Pick { reusable: vec!["a".into()], available: vec!["a".into(), "b".into()], size: 2 })
        );
    }

    #[test]
    fn capacity_counts_every_device_and_allocatable_the_healthy_ones() {
        let mut r = Registry::default();
        r.update(GPU, &[dev("a", HEALTHY), dev("b", HEALTHY), dev("c", "Unhealthy")]);
        let cap = r.capacity(Instant::now());
        assert_eq!(cap.resources[GPU], Amounts { capacity: 3, allocatable: 2 });
        assert!(cap.removed.is_empty());
    }

    #[test]
    fn a_gone_plugin_keeps_capacity_with_nothing_allocatable_until_the_grace_period_ends() {
        let mut r = Registry::default();
        let t0 = Instant::now();
        r.update(GPU, &[dev("a", HEALTHY), dev("b", HEALTHY)]);
        r.disconnected(GPU, t0);
        assert_eq!(r.capacity(t0 + Duration::from_secs(60)).resources[GPU], Amounts { capacity: 2, allocatable: 0 });
        let cap = r.capacity(t0 + STOP_GRACE_PERIOD);
        assert!(!cap.resources.contains_key(GPU));
        assert!(cap.removed.contains(GPU), "a removed resource is reported as 0, not dropped");
        // Registering again brings it back.
        r.update(GPU, &[dev("a", HEALTHY)]);
        let cap = r.capacity(t0 + STOP_GRACE_PERIOD);
        assert_eq!(cap.resources[GPU], Amounts { capacity: 1, allocatable: 1 });
        assert!(cap.removed.is_empty());
    }

    #[test]
    fn restored_resources_report_zero_until_their_plugin_returns() {
        let t0 = Instant::now();
        let mut r = Registry::restored(vec![entry("p1", "c", &["a"])], [GPU.to_string()], t0);
        assert_eq!(r.capacity(t0).resources[GPU], Amounts { capacity: 0, allocatable: 0 });
        // The restored allocation is kept: the container keeps its device.
        assert_eq!(r.need("p1", "c", GPU, 1, &none()), Ok(Need::Allocated(vec!["a".into()])));
    }

    #[test]
    fn allocation_takes_healthy_free_devices_and_refuses_more_than_are_free() {
        let mut r = Registry::default();
        r.update(GPU, &[dev("a", HEALTHY), dev("b", HEALTHY), dev("c", "Unhealthy")]);
        r.record(entry("p1", "c", &["a"]));
        assert_eq!(
            r.need("p2", "c", GPU, 1, &none()),
            Ok(Need::Pick { reusable: vec![], available: vec!["b".into()], size: 1 })
        );
        let err = r.need("p2", "c", GPU, 2, &none()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "requested number of devices unavailable for example.com/gpu. Requested: 2, Available: 1"
        );
        assert!(r.release("p1"));
        assert_eq!(
            r.need("p2", "c", GPU, 2, &none()),
            Ok(Need::Pick { reusable: vec![], available: vec!["a".into(), "b".into()], size: 2 })
        );
    }

    #[test]
    fn a_resource_without_healthy_devices_cannot_allocate() {
        let mut r = Registry::default();
        r.update(GPU, &[dev("a", "Unhealthy")]);
        assert_eq!(r.need("p", "c", GPU, 1, &none()), Err(AllocError::NoHealthy { resource: GPU.into() }));
        assert!(r.manages(GPU));
        assert!(!r.manages("example.com/fpga"));
    }

    #[test]
    fn retain_frees_the_devices_of_pods_that_are_gone() {
        let mut r = Registry::default();
        r.record(entry("p1", "c", &["a"]));
        r.record(entry("p2", "c", &["b"]));
        assert!(r.retain_pods(&BTreeSet::from(["p2".to_string()])));
        assert_eq!(r.entries().len(), 1);
        assert!(!r.retain_pods(&BTreeSet::from(["p2".to_string()])));
    }

    #[test]
    fn choose_prefers_the_plugins_choice_among_available_devices() {
        let available: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        assert_eq!(choose(&[], &available, 2, &["c".into()]), vec!["c".to_string(), "a".to_string()]);
        // A preferred device that is not available is ignored.
        assert_eq!(choose(&[], &available, 1, &["z".into()]), vec!["a".to_string()]);
        assert_eq!(choose(&[], &available, 2, &[]), vec!["a".to_string(), "b".to_string()]);
        // Reusable devices come first.
        assert_eq!(choose(&["b".into()], &available, 2, &["c".into()]), vec!["b".to_string(), "c".to_string()]);
    }
}
