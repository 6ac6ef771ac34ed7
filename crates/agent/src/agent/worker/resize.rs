//! In-place pod resize in the pod's worker: admitting a desired resize (allocation), applying
//! it to the running containers and the pod cgroup, and its conditions and events.

use std::sync::Arc;

use gantry_pod::resize::{self, Admission, ContainerResize, Pending};
use gantry_pod::{ContainerInfo, ContainerState, ObservedPod};
use k8s_openapi::api::core::v1::{Container, Pod, PodCondition, PodStatus};

use super::{Worker, now};
use crate::events::EventType;
use gantry_cri::CriError;
use gantry_vocab::spec;

#[derive(Default)]
pub(super) struct ResizeState {
    pending: Option<PodCondition>,
    in_progress: Option<PodCondition>,
    /// The allocated pod before the resize being applied: where the pod cgroup starts from.
    from: Option<Arc<Pod>>,
}

/// Why an in-place resize did not apply (shown in the `PodResizeInProgress` condition and the
/// `ResizeError` event).
#[derive(Debug, thiserror::Error)]
enum ResizeError {
    #[error("pod cgroup: {0}")]
    PodCgroup(#[source] std::io::Error),
    #[error("cannot stop container {0} to resize it")]
    Stop(String),
    /// The pure core's refusal to set a memory limit below current usage.
    #[error("{0}")]
    BelowUsage(String),
    /// The runtime's own message, as upstream reports it.
    #[error("{}", .0.grpc_message())]
    Update(CriError),
}

impl ResizeState {
    /// The status with the resize conditions, placed where upstream puts them (before
    /// `PodReadyToStartContainers`).
    pub(super) fn add_conditions(&self, mut status: PodStatus) -> PodStatus {
        let extra: Vec<PodCondition> = [&self.pending, &self.in_progress].into_iter().flatten().cloned().collect();
        if extra.is_empty() {
            return status;
        }
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        let at = conditions.iter().position(|c| c.type_ == "PodReadyToStartContainers").unwrap_or(0);
        conditions.splice(at..at, extra);
        status
    }
}

/// The containers a resize applies to: sidecars and regular containers.
fn resizable(pod: &Pod) -> impl Iterator<Item = &Container> {
    spec::init_containers(pod).iter().filter(|c| spec::is_sidecar(c)).chain(spec::containers(pod))
}

impl Worker {
    fn generation(&self) -> i64 {
        self.desired.metadata.generation.unwrap_or_default()
    }

    /// Admits a desired resize if the node has room: the allocation (checkpointed) takes the
    /// desired resources and `PodResizeInProgress` is set; otherwise `PodResizePending` says
    /// why. Deferred resizes come back here on every sync (a freed pod wakes the workers).
    pub(super) fn allocate_resize(&mut self) {
        let allocations = &self.shared.allocations;
        if !allocations.resize_wanted(&self.desired) {
            self.resize.pending = None;
            return;
        }
        let generation = self.generation();
        match allocations.try_resize(&self.desired) {
            Admission::Accept => {
                let before = std::mem::replace(&mut self.pod, allocations.apply(&self.desired));
                self.resize.from.get_or_insert(before);
                self.resize.pending = None;
                self.resize.in_progress =
                    Some(resize::condition(resize::IN_PROGRESS_CONDITION, "", "", Some(generation), now(), None));
                tracing::info!(pod = %spec::full_name(&self.pod), generation, "pod resize admitted");
                let message = resize::event_message("Pod resize started", &self.pod, generation, "");
                self.shared.events.record(&self.desired, None, EventType::Normal, "ResizeStarted", &message);
            }
            Admission::Pending(why, message) => {
                let previous = self.resize.pending.take();
                let reason = why.as_str();
                let changed = previous.as_ref().is_none_or(|p| {
                    p.reason.as_deref() != Some(reason) || p.message.as_deref() != Some(message.as_str())
                });
                if changed {
                    let event = match why {
                        Pending::Infeasible => "ResizeInfeasible",
                        Pending::Deferred => "ResizeDeferred",
                    };
                    let text =
                        resize::event_message(&format!("Pod resize {reason}"), &self.desired, generation, &message);
                    self.shared.events.record(&self.desired, None, EventType::Warning, event, &text);
                }
                self.resize.pending = Some(resize::condition(
                    resize::PENDING_CONDITION,
                    reason,
                    &message,
                    Some(generation),
                    now(),
                    previous.as_ref(),
                ));
            }
        }
    }

    /// Brings the running containers to their allocated resources: the pod cgroup's growing
    /// limits first, then `UpdateContainerResources` (or a restart, per `resizePolicy`), then
    /// its shrinking limits. Returns true when it changed something (look again).
    pub(super) async fn actuate_resize(&mut self, observed: &ObservedPod) -> bool {
        let running = |c: &Container| -> Option<ContainerInfo> {
            // A runtime that reports no resources cannot be compared with; nothing to do.
            observed
                .latest(&c.name)
                .filter(|i| i.state == ContainerState::Running && i.applied != Default::default())
                .cloned()
        };
        let work: Vec<(Container, ContainerInfo, ContainerResize)> = resizable(&self.pod)
            .filter_map(|c| running(c).map(|i| (c.clone(), i)))
            .map(|(c, i)| {
                let action = resize::container_action(&c, &i.applied);
                (c, i, action)
            })
            .filter(|(_, _, a)| *a != ContainerResize::None)
            .collect();
        if work.is_empty() {
            self.resize_done();
            return false;
        }
        match self.apply_resize(&work, observed).await {
            Ok(()) => true,
            Err(error) => {
                let error = error.to_string();
                let generation = self.generation();
                // Retried on every sync; logged and reported once per distinct error.
                let already = self.resize.in_progress.as_ref().and_then(|c| c.message.as_deref()) == Some(&error);
                if !already {
                    tracing::warn!(pod = %spec::full_name(&self.pod), %error, "cannot resize pod");
                    let text = resize::event_message("Pod resize error", &self.pod, generation, &error);
                    self.shared.events.record(&self.desired, None, EventType::Warning, "ResizeError", &text);
                }
                let previous = self.resize.in_progress.take();
                self.resize.in_progress = Some(resize::condition(
                    resize::IN_PROGRESS_CONDITION,
                    resize::ERROR_REASON,
                    &error,
                    Some(generation),
                    now(),
                    previous.as_ref(),
                ));
                false
            }
        }
    }

    async fn apply_resize(
        &self,
        work: &[(Container, ContainerInfo, ContainerResize)],
        observed: &ObservedPod,
    ) -> Result<(), ResizeError> {
        let driver = &self.shared.driver;
        let target = driver.pod_cgroup_values(&self.pod);
        let start = self.resize.from.as_deref().and_then(|p| driver.pod_cgroup_values(p)).or(target);
        let steps = start.zip(target).map(|(old, new)| resize::pod_cgroup_steps(&old, &new));
        if let Some((before, _)) = steps {
            driver.set_pod_cgroup(&self.pod, before).await.map_err(ResizeError::PodCgroup)?;
        }
        for (c, info, action) in work {
            match action {
                ContainerResize::Restart => {
                    let message = format!("Container {} resize requires restart", c.name);
                    self.shared.events.record(&self.pod, Some(&c.name), EventType::Normal, "Killing", &message);
                    let pod_ip = observed.current_sandbox().and_then(|s| s.ip.as_deref());
                    let grace = crate::runtime::Driver::grace(&self.pod);
                    if !self.stop_container(info, grace, pod_ip).await {
                        return Err(ResizeError::Stop(c.name.clone()));
                    }
                }
                ContainerResize::Update => {
                    let new_limit = gantry_pod::resources::container(c).memory_limit;
                    if new_limit > 0
                        && (info.applied.memory_limit <= 0 || new_limit < info.applied.memory_limit)
                        && let Some(usage) = driver.memory_usage(&info.id).await
                        && let Some(refused) = resize::memory_decrease_refused(&c.name, new_limit, usage)
                    {
                        return Err(ResizeError::BelowUsage(refused));
                    }
                    let result = driver.update_container_resources(&self.pod, c, &info.id).await;
                    // Read the resources back from the runtime on the next look.
                    self.shared.observer.forget(&info.id);
                    result.map_err(ResizeError::Update)?;
                    tracing::info!(pod = %spec::full_name(&self.pod), container = %c.name, "container resources updated");
                }
                ContainerResize::None => {}
            }
        }
        if let Some((_, after)) = steps {
            driver.set_pod_cgroup(&self.pod, after).await.map_err(ResizeError::PodCgroup)?;
        }
        Ok(())
    }

    /// Every container runs with its allocation: an in-progress resize is complete.
    fn resize_done(&mut self) {
        self.resize.from = None;
        if self.resize.in_progress.take().is_some() {
            let generation = self.generation();
            let message = resize::event_message("Pod resize completed", &self.pod, generation, "");
            self.shared.events.record(&self.desired, None, EventType::Normal, "ResizeCompleted", &message);
        }
    }
}
