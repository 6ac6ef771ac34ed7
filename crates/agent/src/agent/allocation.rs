//! The resources this node allocated to each pod (upstream's allocation manager), checkpointed
//! to `<root-dir>/allocated_pods_state` so that a restarted agent keeps the resizes it admitted
//! and admits none twice.
//!
//! A pod is allocated its spec's resources when it is first admitted; afterwards its spec
//! (desired) and its allocation differ while a resize waits. The workers run their pods with
//! the allocated resources ([`Allocations::apply`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use gantry_pod::resize::{self, Admission, Amounts};
use gantry_vocab::spec;
use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
use serde::{Deserialize, Serialize};

pub const CHECKPOINT_FILE: &str = "allocated_pods_state";

/// One pod's allocation: the resources of each regular container and sidecar, by name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct PodAllocation {
    containers: BTreeMap<String, ResourceRequirements>,
    /// The pod's requests under this allocation (what other pods' resizes see as used).
    cpu_milli: i128,
    memory: i128,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Checkpoint {
    pods: BTreeMap<String, PodAllocation>,
}

pub struct Allocations {
    path: Option<PathBuf>,
    allocatable: Amounts,
    state: Mutex<Checkpoint>,
}

/// The containers an allocation covers: regular containers and sidecars (a regular init
/// container cannot be resized).
fn resizable(pod: &Pod) -> impl Iterator<Item = &k8s_openapi::api::core::v1::Container> {
    spec::init_containers(pod).iter().filter(|c| spec::is_sidecar(c)).chain(spec::containers(pod))
}

fn allocation_of(pod: &Pod) -> PodAllocation {
    let requests = resize::pod_requests(pod);
    PodAllocation {
        containers: resizable(pod).map(|c| (c.name.clone(), c.resources.clone().unwrap_or_default())).collect(),
        cpu_milli: requests.cpu_milli,
        memory: requests.memory,
    }
}

impl Allocations {
    /// Reads the checkpoint under `root_dir` (an unreadable one is logged and starts empty:
    /// every running pod is then allocated its spec again).
    pub fn load(root_dir: &Path, allocatable: Amounts) -> Allocations {
        let path = root_dir.join(CHECKPOINT_FILE);
        let state = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(file = %path.display(), error = %e, "cannot parse the pod allocation checkpoint; starting empty");
                Checkpoint::default()
            }),
            Err(_) => Checkpoint::default(),
        };
        Allocations { path: Some(path), allocatable, state: Mutex::new(state) }
    }

    /// Allocates `pod` its spec's resources unless it has an allocation already (admitted
    /// before a restart).
    pub fn admit(&self, pod: &Pod) {
        let mut state = self.state.lock().unwrap();
        if !state.pods.contains_key(spec::uid(pod)) {
            state.pods.insert(spec::uid(pod).to_string(), allocation_of(pod));
            self.save(&state);
        }
    }

    /// `pod` with each container's resources replaced by its allocation. The same `Arc` when
    /// they are already the allocated ones (no resize pending, the usual case): each pod's spec
    /// is then held once, not once more per worker.
    pub fn apply(&self, pod: &Arc<Pod>) -> Arc<Pod> {
        let state = self.state.lock().unwrap();
        let Some(alloc) = state.pods.get(spec::uid(pod)) else { return pod.clone() };
        // No resources in the spec and an empty allocation are the same.
        let differs = |c: &Container| {
            let own = c.resources.as_ref();
            alloc
                .containers
                .get(&c.name)
                .is_some_and(|r| own.map_or(*r != ResourceRequirements::default(), |own| own != r))
        };
        let Some(s) = pod.spec.as_ref() else { return pod.clone() };
        if !s.init_containers.iter().flatten().chain(&s.containers).any(differs) {
            return pod.clone();
        }
        let mut out = Pod::clone(pod);
        if let Some(s) = out.spec.as_mut() {
            for c in s.init_containers.iter_mut().flatten().chain(s.containers.iter_mut()) {
                if let Some(r) = alloc.containers.get(&c.name) {
                    c.resources = Some(r.clone());
                }
            }
        }
        Arc::new(out)
    }

    /// Whether the desired pod's resources differ from its allocation.
    pub fn resize_wanted(&self, desired: &Pod) -> bool {
        let state = self.state.lock().unwrap();
        state.pods.get(spec::uid(desired)).is_some_and(|a| a.containers != allocation_of(desired).containers)
    }

    /// Admits the desired pod's resources against the node's allocatable and the other pods'
    /// allocations, and allocates them if they fit; one lock, so two resizes never take the
    /// same room.
    pub fn try_resize(&self, desired: &Pod) -> Admission {
        let mut state = self.state.lock().unwrap();
        let uid = spec::uid(desired);
        let others: Amounts = state
            .pods
            .iter()
            .filter(|(u, _)| u.as_str() != uid)
            .map(|(_, a)| Amounts { cpu_milli: a.cpu_milli, memory: a.memory })
            .sum();
        let admission = resize::admit(resize::pod_requests(desired), others, self.allocatable);
        if admission == Admission::Accept {
            state.pods.insert(uid.to_string(), allocation_of(desired));
            self.save(&state);
        }
        admission
    }

    /// Forgets a pod that is gone; returns whether it had an allocation (room freed).
    pub fn remove(&self, uid: &str) -> bool {
        let mut state = self.state.lock().unwrap();
        let removed = state.pods.remove(uid).is_some();
        if removed {
            self.save(&state);
        }
        removed
    }

    /// Forgets every pod for which `keep` is false (upstream `RemoveOrphanedPods`).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut state = self.state.lock().unwrap();
        let before = state.pods.len();
        state.pods.retain(|uid, _| keep(uid));
        if state.pods.len() != before {
            self.save(&state);
        }
    }

    /// Writes the checkpoint atomically (temporary file, then rename).
    fn save(&self, state: &Checkpoint) {
        let Some(path) = &self.path else { return };
        let tmp = path.with_extension("tmp");
        let result = serde_json::to_vec(state)
            .map_err(std::io::Error::other)
            .and_then(|bytes| std::fs::write(&tmp, bytes))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = result {
            tracing::warn!(file = %path.display(), error = %e, "cannot write the pod allocation checkpoint");
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod(uid: &str, cpu: &str) -> Pod {
        let resources = ResourceRequirements {
            requests: Some([("cpu".to_string(), Quantity(cpu.into()))].into()),
            ..Default::default()
        };
        Pod {
            metadata: ObjectMeta { uid: Some(uid.into()), ..Default::default() },
            spec: Some(PodSpec {
                containers: vec![Container { name: "app".into(), resources: Some(resources), ..Default::default() }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_pod_running_its_allocation_is_shared_not_copied() {
        let allocations = Allocations { path: None, allocatable: Amounts::default(), state: Default::default() };
        let desired = Arc::new(pod("a", "300m"));
        allocations.admit(&desired);
        assert!(Arc::ptr_eq(&allocations.apply(&desired), &desired), "resources as allocated: the same Arc");
        let mut bare = pod("b", "0");
        bare.spec.as_mut().unwrap().containers[0].resources = None;
        let bare = Arc::new(bare);
        allocations.admit(&bare);
        assert!(Arc::ptr_eq(&allocations.apply(&bare), &bare), "no resources, empty allocation: the same");
        let resized = Arc::new(pod("a", "500m"));
        let applied = allocations.apply(&resized);
        assert!(!Arc::ptr_eq(&applied, &resized), "a pending resize runs the allocated resources");
        let requests = applied.spec.as_ref().unwrap().containers[0].resources.clone().unwrap().requests.unwrap();
        assert_eq!(requests["cpu"].0, "300m");
    }

    #[test]
    fn resizes_are_admitted_against_the_other_allocations_and_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let allocatable = Amounts { cpu_milli: 1000, memory: 1 << 30 };
        let allocations = Allocations::load(dir.path(), allocatable);
        allocations.admit(&pod("a", "300m"));
        allocations.admit(&pod("b", "500m"));
        assert!(!allocations.resize_wanted(&pod("a", "300m")));
        assert!(allocations.resize_wanted(&pod("a", "600m")));
        assert!(matches!(allocations.try_resize(&pod("a", "600m")), Admission::Pending(resize::Pending::Deferred, _)));
        assert!(matches!(allocations.try_resize(&pod("a", "2")), Admission::Pending(resize::Pending::Infeasible, _)));
        assert_eq!(allocations.try_resize(&pod("a", "400m")), Admission::Accept);

        // A restart keeps the accepted resize; the spec's resources do not replace it.
        let restarted = Allocations::load(dir.path(), allocatable);
        restarted.admit(&pod("a", "900m"));
        let applied = Arc::unwrap_or_clone(restarted.apply(&Arc::new(pod("a", "900m"))));
        let requests = applied.spec.unwrap().containers[0].resources.clone().unwrap().requests.unwrap();
        assert_eq!(requests["cpu"].0, "400m");

        // Room freed by a pod that is gone lets a deferred resize in.
        restarted.retain(|uid| uid != "b");
        assert!(!restarted.remove("b"), "already forgotten");
        assert_eq!(restarted.try_resize(&pod("a", "600m")), Admission::Accept);
    }
}
