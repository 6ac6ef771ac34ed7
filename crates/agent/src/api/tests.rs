//! Tests of kubeconfig loading and of the start-up check's error messages.

use std::io::Write as _;

use kube::core::Status;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

fn ctx() -> CheckContext {
    CheckContext {
        url: "https://10.0.0.1:6443".into(),
        user: "default-auth".into(),
        kubeconfig: PathBuf::from("/etc/kubernetes/kubelet.conf"),
        node: "n1".into(),
    }
}

fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
    let mut status = Status::failure(message, reason).with_code(code);
    status.reason = reason.to_string();
    kube::Error::Api(Box::new(status))
}

#[test]
fn not_found_node_means_the_server_works() {
    assert!(classify(api_error(404, "NotFound", "nodes \"n1\" not found"), &ctx()).is_none());
}

#[test]
fn unauthorized_names_user_and_kubeconfig() {
    let e = classify(api_error(401, "Unauthorized", "Unauthorized"), &ctx()).unwrap();
    assert!(matches!(e, ApiError::Unauthorized { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.starts_with("the API server rejected the node's credentials (expired or invalid)"), "{msg}");
    assert!(msg.contains("\"default-auth\"") && msg.contains("/etc/kubernetes/kubelet.conf"), "{msg}");
    assert!(msg.contains("https://10.0.0.1:6443"), "{msg}");
    assert!(!e.is_transient());
}

#[test]
fn forbidden_explains_node_identity() {
    let e = classify(
        api_error(403, "Forbidden", "nodes \"n1\" is forbidden: User \"bob\" cannot get resource \"nodes\""),
        &ctx(),
    )
    .unwrap();
    assert!(matches!(e, ApiError::Forbidden { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("system:node:n1") && msg.contains("User \"bob\" cannot get"), "{msg}");
}

#[test]
fn a_plain_404_is_not_kubernetes() {
    // What kube makes of a non-Status body (a web server, a wrong path prefix).
    let e = classify(api_error(404, "Failed to parse error data", "404 page not found"), &ctx()).unwrap();
    assert!(matches!(e, ApiError::NotKubernetes { .. }), "{e:?}");
    assert!(e.to_string().contains("404 page not found") && e.to_string().contains("check the server URL"), "{e}");
}

#[test]
fn server_errors_are_transient() {
    let e = classify(api_error(503, "ServiceUnavailable", "etcd is down"), &ctx()).unwrap();
    assert!(matches!(e, ApiError::Server { code: 503, .. }), "{e:?}");
    assert!(e.is_transient());
    let e = classify(api_error(429, "TooManyRequests", "slow down"), &ctx()).unwrap();
    assert!(e.is_transient());
}

#[test]
fn transport_errors_are_unreachable() {
    let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused (os error 111)");
    let e = classify(kube::Error::Service(Box::new(io)), &ctx()).unwrap();
    assert!(matches!(e, ApiError::Unreachable { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("https://10.0.0.1:6443") && msg.contains("Connection refused"), "{msg}");
    assert!(e.is_transient());
}

#[test]
fn rate_defaults_follow_client_go() {
    assert_eq!(effective_rate(50, 100), (Some(50), 100));
    assert_eq!(effective_rate(0, 0), (Some(5), 10));
    assert_eq!(effective_rate(-1, 5), (None, 5));
}

#[test]
fn error_chain_skips_repeats() {
    #[derive(Debug, thiserror::Error)]
    #[error("outer: {0}")]
    struct Outer(#[source] std::io::Error);
    let e = Outer(std::io::Error::other("root cause"));
    assert_eq!(error_chain(&e), "outer: root cause");
}

/// `connect`'s error (kube's `Client` is not `Debug`).
async fn connect_err(settings: &Settings) -> ApiError {
    match connect(settings).await {
        Ok(_) => panic!("connect should fail"),
        Err(e) => e,
    }
}

fn settings_with(kubeconfig: &Path) -> Settings {
    Settings { node_name: "n1".into(), kubeconfig: Some(kubeconfig.to_path_buf()), ..Settings::default() }
}

fn kubeconfig_text(server: &str, user_body: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\ncontexts:\n- name: ctx\n  \
         context:\n    cluster: c\n    user: node-user\ncurrent-context: ctx\nusers:\n- name: node-user\n  user:\n{user_body}"
    )
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::File::create(&path).unwrap().write_all(text.as_bytes()).unwrap();
    path
}

#[tokio::test]
async fn kubeconfig_problems_name_the_file() {
    let dir = tempfile::tempdir().unwrap();

    let missing = dir.path().join("nope.conf");
    let e = connect_err(&settings_with(&missing)).await;
    assert!(matches!(e, ApiError::ReadKubeconfig { .. }), "{e:?}");
    assert!(e.to_string().contains("nope.conf"), "{e}");

    let garbage = write(dir.path(), "garbage.conf", "clusters: [unclosed\n");
    let e = connect_err(&settings_with(&garbage)).await;
    assert!(matches!(e, ApiError::InvalidKubeconfig { .. }), "{e:?}");
    assert!(e.to_string().contains("garbage.conf"), "{e}");

    let no_context = write(dir.path(), "nocontext.conf", "apiVersion: v1\nkind: Config\nclusters: []\n");
    let e = connect_err(&settings_with(&no_context)).await;
    assert!(e.to_string().contains("current context"), "{e}");

    let missing_cert = write(
        dir.path(),
        "cert.conf",
        &kubeconfig_text(
            "https://127.0.0.1:1",
            "    client-certificate: /nonexistent/kubelet.crt\n    client-key: /nonexistent/kubelet.key\n",
        ),
    );
    let e = connect_err(&settings_with(&missing_cert)).await;
    assert!(matches!(e, ApiError::InvalidKubeconfig { .. }), "{e:?}");
    assert!(e.to_string().contains("/nonexistent/kubelet.crt"), "{e}");

    let e = connect_err(&Settings::default()).await;
    assert!(matches!(e, ApiError::NoKubeconfig), "{e:?}");
}

#[tokio::test]
async fn unreachable_server_is_named() {
    // A port nothing listens on.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let path = write(dir.path(), "k.conf", &kubeconfig_text(&url, "    token: abc\n"));
    let e = connect_err(&settings_with(&path)).await;
    assert!(matches!(e, ApiError::Unreachable { .. }), "{e:?}");
    assert!(e.to_string().contains(&url), "{e}");
}

/// Answers every request with `status` and `body`; returns the URL and the
/// Authorization headers it saw.
async fn canned_server(
    status: &'static str,
    body: &'static str,
) -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let n = sock.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).to_string();
                if let Some(line) = req.lines().find(|l| l.to_ascii_lowercase().starts_with("authorization:")) {
                    let _ = tx.send(line.to_string());
                }
                let resp = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
            });
        }
    });
    (url, rx)
}

#[tokio::test]
async fn rejected_token_fails_with_unauthorized() {
    let (url, mut auth) = canned_server(
        "401 Unauthorized",
        r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}"#,
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let token = write(dir.path(), "token", "file-token\n");
    let path = write(dir.path(), "k.conf", &kubeconfig_text(&url, &format!("    tokenFile: {}\n", token.display())));
    let e = connect_err(&settings_with(&path)).await;
    assert!(matches!(e, ApiError::Unauthorized { .. }), "{e:?}");
    assert!(e.to_string().contains("\"node-user\"") && e.to_string().contains("k.conf"), "{e}");
    // The token file was read and sent.
    assert_eq!(auth.recv().await.unwrap().to_ascii_lowercase(), "authorization: bearer file-token");
}

#[tokio::test]
async fn missing_node_is_a_working_connection() {
    let (url, mut auth) = canned_server(
        "404 Not Found",
        r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"nodes \"n1\" not found","reason":"NotFound","details":{"name":"n1","kind":"nodes"},"code":404}"#,
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "k.conf", &kubeconfig_text(&url, "    token: inline-token\n"));
    let clients = connect_clients(&settings_with(&path)).await.unwrap();
    assert_eq!(clients.server, url);
    assert_eq!(clients.user, "node-user");
    assert_eq!(auth.recv().await.unwrap().to_ascii_lowercase(), "authorization: bearer inline-token");
}

#[tokio::test]
async fn a_web_server_is_not_kubernetes() {
    let (url, _auth) = canned_server("404 Not Found", "404 page not found").await;
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "k.conf", &kubeconfig_text(&url, "    token: t\n"));
    let e = connect_err(&settings_with(&path)).await;
    assert!(matches!(e, ApiError::NotKubernetes { .. }), "{e:?}");
}

/// Made with `openssl x509 -req` (no extensions file), which issues X.509 v1.
const V1_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBOTCB4AIURxBWe+e871tqZirFazW+ZDVuSN8wCgYIKoZIzj0EAwIwDTELMAkG
A1UEAwwCY2EwIBcNMjYxMTI0MDM0NTMzWhgPMjEyNjEwMzEwMzQ1MzNaMDAxFzAV
BgNVBAMMDnN5c3RlbTpub2RlOm4xMRUwEwYDVQQKDAxzeXN0ZW06bm9kZXMwWTAT
BgcqhkjOPQIBBggqhkjOPQMBBwNCAAS8n1NyPCbZb73Da8EbUUczNqRBkt4GIFh6
wcOvNIrX8MJra+kyOd/a/d/CZnvz6c+GZB3SdQZz4XEMtk0a/5BIMAoGCCqGSM49
BAMCA0gAMEUCIHyERnS1PVRCjFv/PS8BNoRsHQ9y+8P5lAynUJYAzARBAiEAjMC2
PCBsOSdlCl6cEsuescw0qu9cXXrQ72aExPUoNDs=
-----END CERTIFICATE-----";

#[test]
fn v1_client_certificates_get_a_clear_message() {
    let e = reject_v1_certificate(V1_CERT.as_bytes()).unwrap_err().to_string();
    assert!(e.contains("X.509 v1 certificate") && e.contains("rustls"), "{e}");
    assert!(
        reject_v1_certificate(rcgen::generate_simple_self_signed(vec!["a".to_string()]).unwrap().cert.pem().as_bytes())
            .is_ok()
    );
}

const V1_KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgV9iuEk5vqseT4EZm\n4HNg302AVvubRjYFMvsAEznygJ+hRANCAAS8n1NyPCbZb73Da8EbUUczNqRBkt4G\nIFh6wcOvNIrX8MJra+kyOd/a/d/CZnvz6c+GZB3SdQZz4XEMtk0a/5BI\n-----END PRIVATE KEY-----";

#[tokio::test]
async fn an_x509_v1_client_certificate_is_refused_saying_so() {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let dir = tempfile::tempdir().unwrap();
    let user = format!("    client-certificate-data: {}\n    client-key-data: {}\n", b64(V1_CERT), b64(V1_KEY));
    let path = write(dir.path(), "v1.conf", &kubeconfig_text("https://127.0.0.1:1", &user));
    let e = connect_err(&settings_with(&path)).await;
    assert!(matches!(e, ApiError::InvalidKubeconfig { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("v1.conf") && msg.contains("is an X.509 v1 certificate"), "{msg}");
    assert!(!msg.contains("UnsupportedCertVersion"), "{msg}");
}
