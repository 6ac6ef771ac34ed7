//! Applying an in-place resize to a running pod: CRI `UpdateContainerResources` per
//! container, the pod cgroup through the configured cgroup driver, and the container memory
//! usage the memory-limit-decrease rule needs.

use gantry_cri::{CriError, api};
use gantry_pod::resources::{self, CgroupValues};
use k8s_openapi::api::core::v1::{Container, Pod};

use super::Driver;
use crate::runtime::cgroups;
use crate::runtime::config;

impl Driver {
    /// Gives a running container the cgroup values of `c` (its allocated resources), with the
    /// same OOM score adjustment it was created with.
    pub async fn update_container_resources(&self, pod: &Pod, c: &Container, id: &str) -> Result<(), CriError> {
        let linux = config::linux_resources(
            resources::container(c),
            gantry_pod::qos::oom_score_adj(pod, c, self.memory_capacity),
        );
        let request = api::UpdateContainerResourcesRequest {
            container_id: id.to_string(),
            linux: Some(linux),
            ..Default::default()
        };
        self.cri.runtime.update_container_resources(request).await.map(|_| ())
    }

    /// The pod cgroup's values for `pod` (its allocated resources), as sandbox creation sets
    /// them; `None` when Gantry manages no pod cgroups.
    pub fn pod_cgroup_values(&self, pod: &Pod) -> Option<CgroupValues> {
        self.cgroups.as_ref()?;
        cgroups::plan(&self.pods, self.kubepods_limits, pod).create.last().and_then(|(_, v)| *v)
    }

    /// Writes `values` to the pod's cgroup (cgroupfs v1/v2 or the systemd slice).
    pub async fn set_pod_cgroup(&self, pod: &Pod, values: CgroupValues) -> std::io::Result<()> {
        let Some(fs) = self.cgroups.clone() else { return Ok(()) };
        let Some((path, _)) = cgroups::plan(&self.pods, self.kubepods_limits, pod).create.pop() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || fs.ensure(&path, Some(&values))).await.expect("cgroup task does not panic")
    }

    /// The container's memory working set (CRI `ContainerStats`), if the runtime reports it.
    pub async fn memory_usage(&self, id: &str) -> Option<u64> {
        let request = api::ContainerStatsRequest { container_id: id.to_string() };
        let stats = self.cri.runtime.container_stats(request).await.ok()?.stats?;
        stats.memory?.working_set_bytes.map(|v| v.value)
    }
}
