//! The pure parts of `httpGet` probes and hooks: the target URL (host defaults to the pod IP,
//! port by number or by container port name), the headers (upstream `User-Agent` and
//! `Accept`), and how a response is classified.

use k8s_openapi::api::core::v1::{Container, HTTPGetAction};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use gantry_vocab::keys::KUBELET_VERSION;

/// Upstream reads at most this much of a probe response body.
pub const MAX_BODY: usize = 10 * 1024;

/// Why a probe's or hook's target cannot be built, with upstream's messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("couldn't find port: {port} in {container}")]
    NamedPortNotFound { port: String, container: String },
    #[error("invalid port number: {0}")]
    InvalidPort(i32),
    #[error("the pod has no IP yet")]
    NoPodIp,
}

/// The port a probe or hook targets: a number, or the name of one of the container's ports.
pub fn resolve_port(port: &IntOrString, c: &Container) -> Result<u16, TargetError> {
    let number = match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => match name.parse::<i32>() {
            Ok(n) => n,
            Err(_) => c
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| p.container_port)
                .ok_or_else(|| TargetError::NamedPortNotFound { port: name.clone(), container: c.name.clone() })?,
        },
    };
    u16::try_from(number).ok().filter(|n| *n > 0).ok_or(TargetError::InvalidPort(number))
}

/// `host:port`, bracketing IPv6 addresses as Go's `net.JoinHostPort` does.
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

/// The URL of an `httpGet` action; the host defaults to the pod IP.
pub fn url(action: &HTTPGetAction, c: &Container, pod_ip: Option<&str>) -> Result<String, TargetError> {
    let scheme = action.scheme.as_deref().unwrap_or("HTTP").to_ascii_lowercase();
    let host = action.host.as_deref().filter(|h| !h.is_empty()).or(pod_ip).ok_or(TargetError::NoPodIp)?;
    let port = resolve_port(&action.port, c)?;
    let path = action.path.as_deref().unwrap_or_default();
    let path = if path.is_empty() || path.starts_with('/') { path.to_string() } else { format!("/{path}") };
    Ok(format!("{scheme}://{}{path}", join_host_port(host, port)))
}

/// `kube-probe/<major>.<minor>`, as upstream identifies its probes.
pub fn user_agent() -> String {
    let version = KUBELET_VERSION.trim_start_matches('v');
    let mut parts = version.split('.');
    format!("kube-probe/{}.{}", parts.next().unwrap_or("1"), parts.next().unwrap_or("0"))
}

/// The request headers: the spec's, plus upstream's defaults for `User-Agent` and `Accept`.
pub fn headers(action: &HTTPGetAction) -> Vec<(String, String)> {
    let mut headers: Vec<(String, String)> =
        action.http_headers.iter().flatten().map(|h| (h.name.clone(), h.value.clone())).collect();
    let has = |headers: &[(String, String)], name: &str| headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
    if !has(&headers, "User-Agent") {
        headers.push(("User-Agent".into(), user_agent()));
    }
    if !has(&headers, "Accept") {
        headers.push(("Accept".into(), "*/*".into()));
    }
    headers
}

/// The verdict on one HTTP probe response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Success(String),
    /// Counts as success, with a `ProbeWarning` event.
    Warning(String),
    Failure(String),
}

/// 2xx succeeds; a 3xx left over means a redirect to another host was not followed, which
/// upstream reports as a warning; everything else fails.
pub fn classify(status: u16, body: &str) -> Verdict {
    match status {
        200..=299 => Verdict::Success(body.to_string()),
        300..=399 => Verdict::Warning(format!("Probe terminated redirects, Response body: {body}")),
        _ => Verdict::Failure(format!("HTTP probe failed with statuscode: {status}")),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerPort, HTTPHeader};

    use super::*;

    fn container() -> Container {
        Container {
            name: "web".into(),
            ports: Some(vec![ContainerPort { name: Some("http".into()), container_port: 8080, ..Default::default() }]),
            ..Default::default()
        }
    }

    #[test]
    fn ports_by_number_or_name() {
        let c = container();
        assert_eq!(resolve_port(&IntOrString::Int(80), &c), Ok(80));
        assert_eq!(resolve_port(&IntOrString::String("http".into()), &c), Ok(8080));
        assert_eq!(resolve_port(&IntOrString::String("9090".into()), &c), Ok(9090));
        assert_eq!(
            resolve_port(&IntOrString::String("grpc".into()), &c),
            Err(TargetError::NamedPortNotFound { port: "grpc".into(), container: "web".into() })
        );
        assert_eq!(resolve_port(&IntOrString::Int(70000), &c), Err(TargetError::InvalidPort(70000)));
    }

    #[test]
    fn url_defaults_to_the_pod_ip() {
        let c = container();
        let action = HTTPGetAction {
            path: Some("healthz".into()),
            port: IntOrString::String("http".into()),
            ..Default::default()
        };
        assert_eq!(url(&action, &c, Some("10.1.0.5")).unwrap(), "http://10.1.0.5:8080/healthz");
        let action = HTTPGetAction {
            host: Some("fd00::1".into()),
            scheme: Some("HTTPS".into()),
            port: IntOrString::Int(443),
            ..Default::default()
        };
        assert_eq!(url(&action, &c, Some("10.1.0.5")).unwrap(), "https://[fd00::1]:443");
        assert!(url(&HTTPGetAction::default(), &c, None).is_err());
    }

    #[test]
    fn upstream_default_headers_unless_set() {
        assert_eq!(user_agent(), "kube-probe/1.34");
        let action = HTTPGetAction {
            http_headers: Some(vec![HTTPHeader { name: "accept".into(), value: "text/plain".into() }]),
            ..Default::default()
        };
        let h = headers(&action);
        assert_eq!(
            h,
            [("accept".to_string(), "text/plain".to_string()), ("User-Agent".into(), "kube-probe/1.34".into())]
        );
    }

    #[test]
    fn status_classification() {
        assert_eq!(classify(200, "ok"), Verdict::Success("ok".into()));
        assert_eq!(classify(399, ""), Verdict::Warning("Probe terminated redirects, Response body: ".into()));
        assert_eq!(classify(400, "bad"), Verdict::Failure("HTTP probe failed with statuscode: 400".into()));
        assert_eq!(classify(503, ""), Verdict::Failure("HTTP probe failed with statuscode: 503".into()));
        assert_eq!(classify(199, ""), Verdict::Failure("HTTP probe failed with statuscode: 199".into()));
    }
}
