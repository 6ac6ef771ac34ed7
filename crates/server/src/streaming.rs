//! `/exec`, `/attach`, `/portForward` and `/run`.
//!
//! The first three ask the runtime for a streaming URL (CRI `Exec`/`Attach`/`PortForward`)
//! and proxy the client's upgraded connection to it (`proxy.rs`), so whatever the runtime's
//! streaming server speaks (SPDY/3.1, WebSocket `v4.channel.k8s.io`, ...) works end to end.
//! `/run` is a non-interactive command through CRI `ExecSync`, output in the body.

use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use gantry_cri::api as cri;

use super::ServerState;
use super::pods::{self, ApiError};
use super::proxy;

/// The query of a request, in order, repeated names kept (`command=sh&command=-c`).
type QueryPairs = Vec<(String, String)>;

/// What an exec or attach asks for (upstream `remotecommand` options).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamOptions {
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// A boolean query parameter: upstream's API server sends `1`; `true`/`false`/`0` are
/// accepted too. Anything else is a 400 naming the parameter.
fn flag(query: &QueryPairs, names: &[&str]) -> Result<bool, ApiError> {
    let mut value = false;
    for (k, v) in query.iter().filter(|(k, _)| names.contains(&k.as_str())) {
        value = match v.as_str() {
            "1" | "true" | "True" | "TRUE" => true,
            "0" | "false" | "False" | "FALSE" | "" => false,
            other => {
                return Err(ApiError::bad_request(format!(
                    "invalid value {other:?} for query parameter {k:?}: use 1 or 0 (true or false)"
                )));
            }
        };
    }
    Ok(value)
}

/// Parses exec/attach options: `command` (repeated), `input`/`stdin`, `output`/`stdout`,
/// `error`/`stderr`, `tty`. With a TTY there is no separate stderr stream (as upstream).
pub fn stream_options(query: &QueryPairs, needs_command: bool) -> Result<StreamOptions, ApiError> {
    let command: Vec<String> = query.iter().filter(|(k, _)| k == "command").map(|(_, v)| v.clone()).collect();
    if needs_command && command.is_empty() {
        return Err(ApiError::bad_request("missing required query parameter \"command\""));
    }
    let tty = flag(query, &["tty"])?;
    let mut options = StreamOptions {
        command,
        stdin: flag(query, &["input", "stdin"])?,
        stdout: flag(query, &["output", "stdout"])?,
        stderr: flag(query, &["error", "stderr"])?,
        tty,
    };
    if options.tty && options.stderr {
        options.stderr = false;
    }
    if !options.stdin && !options.stdout && !options.stderr {
        return Err(ApiError::bad_request("you must specify at least 1 of stdin, stdout, stderr"));
    }
    Ok(options)
}

/// The `port` query parameters of a port-forward (required by WebSocket clients, which
/// cannot name ports in-band; SPDY clients name them per stream).
pub fn forward_ports(query: &QueryPairs) -> Result<Vec<i32>, ApiError> {
    let mut ports = Vec::new();
    for (k, v) in query.iter().filter(|(k, _)| k == "port" || k == "ports") {
        for part in v.split(',').filter(|p| !p.is_empty()) {
            let port: u16 = part.trim().parse().map_err(|_| {
                ApiError::bad_request(format!("unable to parse {part:?} as a port (query parameter {k:?})"))
            })?;
            if port == 0 {
                return Err(ApiError::bad_request(format!("port {part:?} must be > 0 (query parameter {k:?})")));
            }
            ports.push(i32::from(port));
        }
    }
    Ok(ports)
}

/// `/run`'s `cmd` parameter: one string split on spaces, as upstream.
pub fn run_command(query: &QueryPairs) -> Result<Vec<String>, ApiError> {
    let cmd = query.iter().find(|(k, _)| k == "cmd").map(|(_, v)| v.as_str()).unwrap_or_default();
    if cmd.trim().is_empty() {
        return Err(ApiError::bad_request("missing required query parameter \"cmd\""));
    }
    Ok(cmd.split(' ').filter(|s| !s.is_empty()).map(String::from).collect())
}

/// Upstream's message for a command that exited non-zero.
pub fn exit_message(cmd: &[String], code: i32, stderr: &[u8]) -> String {
    format!("command '[{}]' exited with {code}: {}", cmd.join(" "), String::from_utf8_lossy(stderr))
}

fn cri_error(e: gantry_cri::CriError) -> ApiError {
    ApiError::internal(e.to_string())
}

// ---- handlers ---------------------------------------------------------------------------

pub async fn exec(
    State(s): State<ServerState>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    Query(q): Query<QueryPairs>,
    req: Request,
) -> Response {
    stream(s, Kind::Exec, ns, pod, None, container, q, req).await
}

pub async fn exec_uid(
    State(s): State<ServerState>,
    Path((ns, pod, uid, container)): Path<(String, String, String, String)>,
    Query(q): Query<QueryPairs>,
    req: Request,
) -> Response {
    stream(s, Kind::Exec, ns, pod, Some(uid), container, q, req).await
}

pub async fn attach(
    State(s): State<ServerState>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    Query(q): Query<QueryPairs>,
    req: Request,
) -> Response {
    stream(s, Kind::Attach, ns, pod, None, container, q, req).await
}

pub async fn attach_uid(
    State(s): State<ServerState>,
    Path((ns, pod, uid, container)): Path<(String, String, String, String)>,
    Query(q): Query<QueryPairs>,
    req: Request,
) -> Response {
    stream(s, Kind::Attach, ns, pod, Some(uid), container, q, req).await
}

pub async fn port_forward(
    State(s): State<ServerState>,
    Path((ns, pod)): Path<(String, String)>,
    Query(q): Query<QueryPairs>,
    req: Request,
) -> Response {
    forward(s, ns, pod, None, q, req).await.unwrap_or_else(IntoResponse::into_response)
}

pub async fn port_forward_uid(
    State(s): State<ServerState>,
    Path((ns, pod, uid)): Path<(String, String, String)>,
    Query(q): Query<QueryPairs>,
    req: Request,
) -> Response {
    forward(s, ns, pod, Some(uid), q, req).await.unwrap_or_else(IntoResponse::into_response)
}

pub async fn run(
    State(s): State<ServerState>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    Query(q): Query<QueryPairs>,
) -> Response {
    run_in(s, ns, pod, None, container, q).await.unwrap_or_else(IntoResponse::into_response)
}

pub async fn run_uid(
    State(s): State<ServerState>,
    Path((ns, pod, uid, container)): Path<(String, String, String, String)>,
    Query(q): Query<QueryPairs>,
) -> Response {
    run_in(s, ns, pod, Some(uid), container, q).await.unwrap_or_else(IntoResponse::into_response)
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Exec,
    Attach,
}

#[allow(clippy::too_many_arguments)]
async fn stream(
    s: ServerState,
    kind: Kind,
    ns: String,
    pod: String,
    uid: Option<String>,
    container: String,
    q: QueryPairs,
    req: Request,
) -> Response {
    let result = async {
        let options = stream_options(&q, matches!(kind, Kind::Exec))?;
        proxy::require_upgrade(&req)?;
        let (_, id) = pods::running_container(&s, &ns, &pod, uid.as_deref(), &container).await?;
        let runtime = &s.cri().runtime;
        let url = match kind {
            Kind::Exec => {
                let r = cri::ExecRequest {
                    container_id: id,
                    cmd: options.command.clone(),
                    tty: options.tty,
                    stdin: options.stdin,
                    stdout: options.stdout,
                    stderr: options.stderr,
                };
                runtime.exec(r).await.map_err(cri_error)?.url
            }
            Kind::Attach => {
                let r = cri::AttachRequest {
                    container_id: id,
                    stdin: options.stdin,
                    tty: options.tty,
                    stdout: options.stdout,
                    stderr: options.stderr,
                };
                runtime.attach(r).await.map_err(cri_error)?.url
            }
        };
        tracing::info!(pod = %format!("{ns}/{pod}"), container = %container, kind = ?kind, command = ?options.command, "streaming to the runtime");
        Ok::<_, ApiError>(proxy::upgrade(req, &url).await)
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn forward(
    s: ServerState,
    ns: String,
    pod: String,
    uid: Option<String>,
    q: QueryPairs,
    req: Request,
) -> Result<Response, ApiError> {
    let ports = forward_ports(&q)?;
    proxy::require_upgrade(&req)?;
    let (_, sandbox) = pods::ready_sandbox(&s, &ns, &pod, uid.as_deref()).await?;
    let r = cri::PortForwardRequest { pod_sandbox_id: sandbox, port: ports.clone() };
    let url = s.cri().runtime.port_forward(r).await.map_err(cri_error)?.url;
    tracing::info!(pod = %format!("{ns}/{pod}"), ?ports, "port-forward to the runtime");
    Ok(proxy::upgrade(req, &url).await)
}

async fn run_in(
    s: ServerState,
    ns: String,
    pod: String,
    uid: Option<String>,
    container: String,
    q: QueryPairs,
) -> Result<Response, ApiError> {
    let cmd = run_command(&q)?;
    let (_, id) = pods::running_container(&s, &ns, &pod, uid.as_deref(), &container).await?;
    let out = s.cri().runtime.exec_sync_for(&id, cmd.clone(), std::time::Duration::ZERO).await.map_err(cri_error)?;
    if out.exit_code != 0 {
        return Err(ApiError::internal(exit_message(&cmd, out.exit_code, &out.stderr)));
    }
    let mut body = out.stdout;
    body.extend_from_slice(&out.stderr);
    Ok((StatusCode::OK, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> QueryPairs {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn exec_options_use_upstream_parameter_names() {
        let o = stream_options(
            &q(&[("command", "sh"), ("command", "-c"), ("command", "echo hi"), ("input", "1"), ("output", "1")]),
            true,
        )
        .unwrap();
        assert_eq!(o.command, vec!["sh", "-c", "echo hi"]);
        assert!(o.stdin && o.stdout && !o.stderr && !o.tty);
        let o = stream_options(&q(&[("command", "ls"), ("stdout", "true"), ("stderr", "true"), ("tty", "1")]), true)
            .unwrap();
        assert!(o.stdout && o.tty && !o.stderr, "a TTY merges stderr into stdout");
    }

    #[test]
    fn bad_exec_options_are_400s_naming_the_parameter() {
        let e = stream_options(&q(&[("output", "1")]), true).unwrap_err();
        assert_eq!(
            (e.status, e.message.as_str()),
            (StatusCode::BAD_REQUEST, "missing required query parameter \"command\"")
        );
        assert!(stream_options(&q(&[("output", "1")]), false).is_ok(), "attach has no command");
        let e = stream_options(&q(&[("command", "ls")]), true).unwrap_err();
        assert_eq!(e.message, "you must specify at least 1 of stdin, stdout, stderr");
        let e = stream_options(&q(&[("command", "ls"), ("tty", "maybe")]), true).unwrap_err();
        assert!(e.message.contains("\"tty\"") && e.message.contains("\"maybe\""), "{}", e.message);
    }

    #[test]
    fn ports_are_parsed_and_checked() {
        assert_eq!(forward_ports(&q(&[("port", "80"), ("port", "8080,9090")])).unwrap(), vec![80, 8080, 9090]);
        assert_eq!(forward_ports(&q(&[])).unwrap(), Vec::<i32>::new());
        let e = forward_ports(&q(&[("port", "http")])).unwrap_err();
        assert!(e.message.contains("\"http\"") && e.message.contains("\"port\""), "{}", e.message);
        assert!(forward_ports(&q(&[("port", "0")])).unwrap_err().message.contains("must be > 0"));
        assert!(forward_ports(&q(&[("port", "70000")])).is_err());
    }

    #[test]
    fn run_splits_cmd_on_spaces() {
        assert_eq!(run_command(&q(&[("cmd", "echo  a b")])).unwrap(), vec!["echo", "a", "b"]);
        assert_eq!(run_command(&q(&[])).unwrap_err().message, "missing required query parameter \"cmd\"");
        assert_eq!(
            exit_message(&["sh".into(), "-c".into(), "exit 3".into()], 3, b"oops"),
            "command '[sh -c exit 3]' exited with 3: oops"
        );
    }
}
