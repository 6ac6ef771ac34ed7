//! `GET /containerLogs/{namespace}/{pod}/{container}`: plain text, streamed (chunked) so
//! `follow` works; 400 naming the bad parameter, 404 for an unknown pod or container.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::service::{self, LogsError};
use crate::ServerState;
use gantry_logs::LogOptions;

pub async fn container_logs(
    State(state): State<ServerState>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    let opts = match LogOptions::from_query(query.iter().map(|(k, v)| (k.as_str(), v.as_str()))) {
        Ok(o) => o,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let runtime = &state.cri().runtime;
    let found = service::locate(
        &state.pod_copies(),
        runtime,
        state.node_name(),
        state.pod_logs_dir(),
        (&namespace, &pod, &container),
        &opts,
    )
    .await;
    let log = match found {
        Ok(log) => log,
        Err(e) => {
            let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            if matches!(e, LogsError::Cri(_)) {
                tracing::warn!(pod = %pod, namespace = %namespace, container = %container, error = %e, "cannot serve container logs");
            }
            return (status, e.to_string()).into_response();
        }
    };
    let mut rx = service::spawn_stream(log, opts, runtime.clone());
    let body = Body::from_stream(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)));
    ([(header::CONTENT_TYPE, "text/plain")], body).into_response()
}
