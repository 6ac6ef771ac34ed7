//! RunOnce mode (deprecated, KEP-4580; only with the LegacyNodeRunOnceMode gate): run the
//! static pods, wait until their containers run, report, and exit. The containers keep
//! running afterwards, as upstream.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;

use super::{AgentError, Shared, worker};
use crate::source::SourceUpdate;
use crate::source::merge::Merger;
use gantry_pod::ContainerState;
use gantry_vocab::spec;

/// Upstream waits this long for the first manifest update.
const MANIFEST_DELAY: Duration = Duration::from_secs(1);
const FIRST_RETRY_DELAY: Duration = Duration::from_secs(1);
const MAX_RETRIES: u32 = 10;

/// The outcome for one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodResult {
    pub pod: String,
    /// `running`, or `succeeded` for a pod that ran to completion before it was seen running.
    pub outcome: &'static str,
    pub error: Option<String>,
}

impl PodResult {
    fn ok(pod: &Pod, outcome: &'static str) -> Self {
        PodResult { pod: spec::full_name(pod), outcome, error: None }
    }

    fn failed(pod: &Pod, error: String) -> Self {
        PodResult { pod: spec::full_name(pod), outcome: "failed", error: Some(error) }
    }
}

impl std::fmt::Display for PodResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.error {
            None => write!(f, "pod {}: {}", self.pod, self.outcome),
            Some(e) => write!(f, "pod {}: failed: {e}", self.pod),
        }
    }
}

/// Runs the pods from the first source update and reports one result per pod.
pub async fn run(shared: Arc<Shared>, mut updates: mpsc::Receiver<SourceUpdate>) -> Result<Vec<PodResult>, AgentError> {
    let update = tokio::time::timeout(MANIFEST_DELAY, updates.recv())
        .await
        .ok()
        .flatten()
        .ok_or(AgentError::NoManifestUpdate(MANIFEST_DELAY))?;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let pods: Vec<Arc<Pod>> = Merger::default().apply(update, &now).pods.into_values().collect();
    tracing::info!(pods = pods.len(), "processing manifest with pods");
    let (done_tx, _done_rx) = mpsc::unbounded_channel();
    let mut tasks = tokio::task::JoinSet::new();
    let _workers: Vec<_> =
        pods.iter().map(|p| worker::spawn(p.clone(), shared.clone(), done_tx.clone(), &mut tasks)).collect();
    Ok(join_all(pods.iter().map(|p| wait_running(&shared, p))).await)
}

/// Polls with the upstream schedule (1 s doubling, 10 retries) until every regular container
/// runs. A pod that reached a final phase is not waited for: it will never run again.
async fn wait_running(shared: &Shared, pod: &Pod) -> PodResult {
    let mut delay = FIRST_RETRY_DELAY;
    let mut not_running = Vec::new();
    for retry in 0..=MAX_RETRIES {
        match shared.observer.pod(spec::uid(pod)).await {
            Ok(observed) => {
                not_running = spec::containers(pod)
                    .iter()
                    .filter(|c| !observed.latest(&c.name).is_some_and(|i| i.state == ContainerState::Running))
                    .map(|c| c.name.clone())
                    .collect();
                if not_running.is_empty() {
                    return PodResult::ok(pod, "running");
                }
            }
            Err(e) => tracing::warn!(pod = %spec::full_name(pod), error = %e, "cannot read pod state"),
        }
        match phase(shared, pod).as_deref() {
            Some("Succeeded") => return PodResult::ok(pod, "succeeded"),
            Some("Failed") => {
                let reasons = waiting_reasons(shared, pod, &not_running);
                return PodResult::failed(pod, format!("pod failed; containers not running: {reasons}"));
            }
            _ => {}
        }
        if retry < MAX_RETRIES {
            tokio::time::sleep(delay).await;
            delay *= 2;
        }
    }
    let reasons = waiting_reasons(shared, pod, &not_running);
    PodResult::failed(pod, format!("containers not running after {MAX_RETRIES} retries: {reasons}"))
}

fn phase(shared: &Shared, pod: &Pod) -> Option<String> {
    shared.statuses.status(spec::uid(pod))?.phase.clone()
}

fn waiting_reasons(shared: &Shared, pod: &Pod, names: &[String]) -> String {
    let status = shared.statuses.status(spec::uid(pod));
    let statuses = status.and_then(|s| s.container_statuses.clone()).unwrap_or_default();
    names
        .iter()
        .map(|name| {
            let state = statuses.iter().find(|s| &s.name == name).and_then(|s| s.state.clone());
            let waiting = state.as_ref().and_then(|s| s.waiting.as_ref()?.reason.clone());
            let terminated = state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .map(|t| format!("{}, exit code {}", t.reason.as_deref().unwrap_or("Terminated"), t.exit_code));
            match waiting.or(terminated) {
                Some(r) => format!("{name} ({r})"),
                None => name.clone(),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}
