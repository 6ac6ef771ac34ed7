//! The route table of the node API: the one place that lists every endpoint.
//!
//! To add an endpoint, add it to `read_only_routes` if upstream also serves it on the
//! read-only port (stats, metrics, pods), else to `debugging_routes` if it reaches into
//! containers (upstream's debugging handlers, e.g. `/containerLogs`), else to
//! `secure_routes`. Everything on the secure port is authenticated and authorized.
//! Authorization attributes come from the path alone (`authz::subresources`): `/stats*` →
//! `stats`, `/metrics*` → `metrics`, `/logs*` → `log`, `/pods` → `pods` (then `proxy`),
//! everything else → `proxy`. A new path prefix that needs its own subresource goes in that
//! table, not here.

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};

use super::authz::{self, Decision};
use super::serve::PeerCertificate;
use super::{ServerState, authn, pods, streaming};

/// The secure port: every route below, behind authentication and authorization.
pub fn router(state: ServerState) -> Router {
    secure_routes(state.settings().debugging_handlers)
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .with_state(state)
}

/// The read-only port: read-only endpoints, no authentication (upstream's `readOnlyPort`).
pub fn read_only_router(state: ServerState) -> Router {
    read_only_routes().with_state(state)
}

/// The healthz port.
pub fn healthz_router() -> Router {
    Router::new().route("/healthz", get(healthz))
}

fn read_only_routes() -> Router<ServerState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/pods", get(pods::list))
        .route("/pods/", get(pods::list))
        // Stats and metrics (issue 7, part 2).
        .route("/stats/summary", get(crate::stats::http::summary).post(crate::stats::http::summary))
        .route("/metrics", get(crate::metrics::metrics))
        .route("/metrics/resource", get(crate::stats::http::resource_metrics))
        .route("/metrics/probes", get(crate::metrics::probes))
}

fn secure_routes(debugging: bool) -> Router<ServerState> {
    let routes = read_only_routes();
    if debugging { routes.merge(debugging_routes()) } else { routes.merge(debugging_disabled()) }
}

/// Upstream's "debugging handlers" (`enableDebuggingHandlers`): the endpoints that reach into
/// containers. `/containerLogs` belongs here too.
fn debugging_routes() -> Router<ServerState> {
    Router::new()
        .route("/containerLogs/{namespace}/{pod}/{container}", get(crate::logs::http::container_logs))
        .route("/run/{namespace}/{pod}/{container}", post(streaming::run))
        .route("/run/{namespace}/{pod}/{uid}/{container}", post(streaming::run_uid))
        .route("/exec/{namespace}/{pod}/{container}", any(streaming::exec))
        .route("/exec/{namespace}/{pod}/{uid}/{container}", any(streaming::exec_uid))
        .route("/attach/{namespace}/{pod}/{container}", any(streaming::attach))
        .route("/attach/{namespace}/{pod}/{uid}/{container}", any(streaming::attach_uid))
        .route("/portForward/{namespace}/{pod}", any(streaming::port_forward))
        .route("/portForward/{namespace}/{pod}/{uid}", any(streaming::port_forward_uid))
}

/// The path prefixes upstream answers with 405 when debugging handlers are off.
pub const DEBUGGING_PREFIXES: &[&str] = &["/run", "/exec", "/attach", "/portForward", "/containerLogs", "/runningpods"];

fn debugging_disabled() -> Router<ServerState> {
    DEBUGGING_PREFIXES.iter().fold(Router::new(), |r, prefix| r.route(&format!("{prefix}/{{*rest}}"), any(disabled)))
}

async fn disabled() -> (StatusCode, &'static str) {
    (StatusCode::METHOD_NOT_ALLOWED, "Debug endpoints are disabled.")
}

/// `/healthz`: the agent answers, so it is healthy.
async fn healthz() -> &'static str {
    "ok"
}

/// Authentication, then authorization; 401 `Unauthorized`, 403 with upstream's message.
async fn auth(State(state): State<ServerState>, req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<PeerCertificate>().cloned().unwrap_or_default();
    let header = authorization_header(req.headers());
    let creds = authn::credentials(peer.0.as_ref(), header.as_deref());
    let user = match state.authenticator().authenticate(creds).await {
        Ok(user) => user,
        Err(e) => {
            tracing::info!(path = %req.uri().path(), reason = %e, "unauthenticated node API request");
            return (StatusCode::UNAUTHORIZED, "Unauthorized").into_response();
        }
    };
    let path = req.uri().path().to_string();
    let attrs = authz::attributes(req.method(), &path);
    match state.authorizer().authorize(&user, &attrs, &path).await {
        Ok(Decision::Allow) => {
            let method = req.method().clone();
            let resp = next.run(req).await;
            tracing::debug!(user = %user.username, %method, %path, status = resp.status().as_u16(), "node API request");
            resp
        }
        Ok(Decision::Deny) => {
            let message = authz::forbidden_message(&user.username, &attrs);
            tracing::info!(user = %user.username, %path, "{message}");
            (StatusCode::FORBIDDEN, message).into_response()
        }
        Err(e) => {
            let message = authz::error_message(&user.username, &attrs);
            tracing::warn!(user = %user.username, %path, error = %e, "{message}");
            (StatusCode::INTERNAL_SERVER_ERROR, message).into_response()
        }
    }
}

fn authorization_header(headers: &HeaderMap) -> Option<String> {
    headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(String::from)
}
