//! `GET /metrics` and `GET /metrics/probes`.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use gantry_cri::api;

use crate::ServerState;
use gantry_metrics::{VolumeFigures, VolumeLabels, set_running, set_volume_stats};
use gantry_vocab::cri_labels as labels;
use gantry_vocab::spec;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

pub async fn metrics(State(state): State<ServerState>) -> Response {
    refresh_running(&state).await;
    refresh_volume_stats(&state);
    ([(header::CONTENT_TYPE, OPENMETRICS)], state.metrics().encode()).into_response()
}

pub async fn probes(State(state): State<ServerState>) -> Response {
    ([(header::CONTENT_TYPE, OPENMETRICS)], state.metrics().encode_probes()).into_response()
}

/// Running pods (a ready sandbox) and containers by state, from the runtime right now.
async fn refresh_running(state: &ServerState) {
    let runtime = &state.cri().runtime;
    let owned = labels::owned_by(state.node_name());
    let ready = api::PodSandboxFilter {
        state: Some(api::PodSandboxStateValue { state: api::PodSandboxState::SandboxReady as i32 }),
        label_selector: owned.clone(),
        ..Default::default()
    };
    let sandboxes = runtime.list_pod_sandbox(api::ListPodSandboxRequest { filter: Some(ready) }).await;
    let filter = api::ContainerFilter { label_selector: owned, ..Default::default() };
    let containers = runtime.list_containers(api::ListContainersRequest { filter: Some(filter) }).await;
    let (Ok(sandboxes), Ok(containers)) = (sandboxes, containers) else {
        tracing::warn!(node = %state.node_name(), "cannot list the runtime's pods for /metrics");
        return;
    };
    let pods: std::collections::HashSet<&str> =
        sandboxes.items.iter().filter_map(|s| s.labels.get(labels::POD_UID).map(String::as_str)).collect();
    let mut by_state = [("created", 0), ("running", 0), ("exited", 0), ("unknown", 0)];
    for c in &containers.containers {
        let i = match api::ContainerState::try_from(c.state) {
            Ok(api::ContainerState::ContainerCreated) => 0,
            Ok(api::ContainerState::ContainerRunning) => 1,
            Ok(api::ContainerState::ContainerExited) => 2,
            _ => 3,
        };
        by_state[i].1 += 1;
    }
    set_running(state.metrics(), pods.len() as i64, &by_state);
}

/// The claims' volumes as last measured in the background (upstream's volume stats collector
/// reads the same figures as `/stats/summary`; one sample per claim).
fn refresh_volume_stats(state: &ServerState) {
    let mut claims = Vec::new();
    for pod in state.pods() {
        for volume in state.stats_cache().volumes.get(spec::uid(&pod.pod)) {
            let Some(claim) = volume.pvc_ref else { continue };
            let labels = VolumeLabels { namespace: claim.namespace, persistentvolumeclaim: claim.name };
            let fs = volume.fs;
            let figures = VolumeFigures {
                capacity_bytes: fs.capacity_bytes,
                available_bytes: fs.available_bytes,
                used_bytes: fs.used_bytes,
                inodes: fs.inodes,
                inodes_free: fs.inodes_free,
                inodes_used: fs.inodes_used,
            };
            if !claims.iter().any(|(l, _)| *l == labels) {
                claims.push((labels, figures));
            }
        }
    }
    set_volume_stats(state.metrics(), &claims);
}
