//! `GET|POST /stats/summary` and `GET /metrics/resource`.

use std::path::PathBuf;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::summary::{self, Sources};
use super::{Summary, resource_metrics};
use crate::{RunningPod, ServerState};

/// The summary for `state`'s node and all its pods.
pub async fn collect(state: &ServerState, only_cpu_and_memory: bool) -> Result<Summary, gantry_cri::CriError> {
    collect_pods(state, state.pods(), true, only_cpu_and_memory).await
}

/// The full summary of the node and of `pods` only (the eviction manager's reads: the node's
/// signals every pass with no pod, the pods' usage only when a pass needs it).
pub async fn collect_for(state: &ServerState, pods: Vec<RunningPod>) -> Result<Summary, gantry_cri::CriError> {
    collect_pods(state, pods, false, false).await
}

async fn collect_pods(
    state: &ServerState,
    pods: Vec<RunningPod>,
    all_pods: bool,
    only_cpu_and_memory: bool,
) -> Result<Summary, gantry_cri::CriError> {
    let sources = sources(state, pods, all_pods);
    let gathered = summary::gather(&sources, only_cpu_and_memory).await?;
    let (state, pods) = (state.clone(), sources.pods);
    // The host's files are read in one blocking task per summary, off the async worker.
    let assembled = tokio::task::spawn_blocking(move || {
        summary::assemble(&self::sources(&state, pods, all_pods), gathered, only_cpu_and_memory)
    });
    // A blocking task runs to its end once started: its only failure is a panic, raised here.
    Ok(assembled.await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())))
}

fn sources(state: &ServerState, pods: Vec<RunningPod>, all_pods: bool) -> Sources<'_> {
    let cri = state.cri();
    Sources {
        node_name: state.node_name(),
        runtime: &cri.runtime,
        images: &cri.images,
        root_dir: state.root_dir(),
        pod_logs_dir: state.pod_logs_dir(),
        cgroup_mount: PathBuf::from(super::cgroup::MOUNT),
        pod_cgroups: state.pod_cgroups(),
        cgroups: state.cgroups(),
        runtime_socket: state.runtime_socket().map(PathBuf::from),
        psi: state.psi(),
        pods,
        all_pods,
        cache: state.stats_cache(),
    }
}

pub async fn summary(State(state): State<ServerState>, Query(query): Query<Vec<(String, String)>>) -> Response {
    // Upstream reads the flag with strconv.ParseBool and ignores a value it cannot parse.
    let only = query
        .iter()
        .find(|(k, _)| k == "only_cpu_and_memory")
        .is_some_and(|(_, v)| matches!(v.as_str(), "1" | "t" | "T" | "true" | "TRUE" | "True"));
    match collect(&state, only).await {
        Ok(s) => Json(s).into_response(),
        Err(e) => {
            tracing::warn!(node = %state.node_name(), error = %e, "cannot build the stats summary");
            (StatusCode::INTERNAL_SERVER_ERROR, format!("Internal Error: failed to get node info: {e}")).into_response()
        }
    }
}

pub async fn resource_metrics(State(state): State<ServerState>) -> Response {
    let summary = collect(&state, true).await;
    if let Err(e) = &summary {
        tracing::warn!(node = %state.node_name(), error = %e, "cannot collect resource metrics");
    }
    let text = resource_metrics::render(summary.as_ref().ok());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}
