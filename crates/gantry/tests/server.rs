//! End-to-end: the node API (issue 7): serving, authentication, authorization, `/pods`,
//! `/run`, and exec/attach/port-forward proxied to containerd's streaming server.
//!
//! WebSocket clients speak `v4.channel.k8s.io`: every binary frame starts with a channel
//! byte (exec/attach: 0 stdin, 1 stdout, 2 stderr, 3 status; port-forward: 2i data and
//! 2i+1 errors of the i-th port, each channel's first frame starting with the port number).
//! The SPDY/3.1 client (`common/spdy.rs`) opens one stream per channel instead, named by its
//! `streamtype` header, as `kubectl` does by default.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::node_api::{Identity, NodeApi, TestCa, WebSocket};
use common::spdy::{Spdy, Streams};
use common::{DEADLINE, Env, Gantry, eventually, pod_yaml, static_name};
use futures::{SinkExt, StreamExt};
use gantry_test_apiserver::{AccessRequest, Decision, UserInfo};
use k8s_openapi::api::core::v1::Pod;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

const CHANNEL: &str = "v4.channel.k8s.io";
/// Prints the terminal size once it is the one the test sends.
const TTY_SCRIPT: &str =
    "read go; until [ \"$(stty size)\" = \"45 123\" ]; do sleep 0.05; done; echo size:$(stty size)";

/// A node agent serving the node API with the test certificates, plus `extra` flags.
async fn start(env: &Env, api: &NodeApi, extra: &[&str]) -> Gantry {
    api.start_agent(env, extra).await
}

/// `path?query` with the pairs URL-encoded.
fn with_query(path: &str, pairs: &[(&str, &str)]) -> String {
    let url = reqwest::Url::parse_with_params(&format!("https://x{path}"), pairs).unwrap();
    format!("{}?{}", url.path(), url.query().unwrap_or_default())
}

async fn wait_running(gantry: &Gantry, name: &str) -> Pod {
    eventually(&format!("pod {name} running"), gantry, || async { gantry.pod_in_phase(&static_name(name), "Running") })
        .await
}

/// Reads frames until `done` says the collected per-channel output is complete, or the
/// socket closes; returns (stdout, stderr, status).
async fn read_channels(ws: &mut WebSocket, done: impl Fn(&[Vec<u8>; 4]) -> bool) -> [Vec<u8>; 4] {
    let mut out: [Vec<u8>; 4] = Default::default();
    let deadline = Instant::now() + DEADLINE;
    while !done(&out) {
        let left = deadline.saturating_duration_since(Instant::now());
        let msg = match tokio::time::timeout(left, ws.next()).await {
            Ok(Some(Ok(msg))) => msg,
            Ok(_) => break,
            Err(_) => panic!("timed out reading the stream; so far: {:?}", text(&out)),
        };
        if let Message::Binary(data) = msg
            && let Some((channel, rest)) = data.split_first()
            && (*channel as usize) < out.len()
        {
            out[*channel as usize].extend_from_slice(rest);
        }
    }
    out
}

fn text(out: &[Vec<u8>; 4]) -> [String; 4] {
    out.clone().map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn stdin_frame(data: &str) -> Message {
    let mut frame = vec![0u8];
    frame.extend_from_slice(data.as_bytes());
    Message::binary(frame)
}

/// Standalone node: client certificates from the test CA, AlwaysAllow.
async fn standalone(pods: &[(&str, String)]) -> Option<(Env, NodeApi, Gantry, Identity)> {
    standalone_with(pods, &[]).await
}

async fn standalone_with(pods: &[(&str, String)], extra: &[&str]) -> Option<(Env, NodeApi, Gantry, Identity)> {
    let env = Env::start().await?;
    for (file, yaml) in pods {
        env.write_manifest(file, yaml);
    }
    let api = NodeApi::new(&env.ctd.dir());
    let mut flags = vec!["--authorization-mode=AlwaysAllow"];
    flags.extend_from_slice(extra);
    let gantry = start(&env, &api, &flags).await;
    let alice = api.ca.client("alice", &["dev"]);
    Some((env, api, gantry, alice))
}

#[tokio::test(flavor = "multi_thread")]
async fn healthz_pods_and_client_certificates() {
    let sleeper = pod_yaml("sleeper", "sleep 3600", "");
    let read_only = common::node_api::free_port();
    let flag = format!("--read-only-port={read_only}");
    let Some((_env, api, gantry, alice)) = standalone_with(&[("sleeper.yaml", sleeper)], &[&flag]).await else {
        return;
    };
    wait_running(&gantry, "sleeper").await;

    // The read-only port: plain HTTP, no authentication, read-only endpoints only.
    let plain = reqwest::Client::builder().no_proxy().build().unwrap();
    let resp = plain.get(format!("http://127.0.0.1:{read_only}/pods")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert!(resp.text().await.unwrap().contains(&static_name("sleeper")));
    let exec = format!("http://127.0.0.1:{read_only}/exec/default/{}/main?command=ls&output=1", static_name("sleeper"));
    assert_eq!(plain.post(exec).send().await.unwrap().status().as_u16(), 404, "no exec on the read-only port");

    // /healthz on the secure port too.
    let resp = api.client(Some(&alice)).get(api.url("/healthz")).send().await.unwrap();
    assert_eq!((resp.status().as_u16(), resp.text().await.unwrap()), (200, "ok".to_string()));

    // No credentials and anonymous requests off (config-file default): 401.
    let resp = api.client(None).get(api.url("/pods")).send().await.unwrap();
    assert_eq!((resp.status().as_u16(), resp.text().await.unwrap()), (401, "Unauthorized".to_string()));

    // A client certificate from another CA never gets through. With TLS 1.3 the client learns
    // of the rejection only when it reads, so the request goes over raw TLS: reqwest once
    // waited forever here after the server's alert.
    let mallory = TestCa::new("other-ca").client("mallory", &["system:masters"]);
    let answer = tokio::time::timeout(DEADLINE, api.raw_get(&mallory, "/pods"))
        .await
        .expect("the node API neither answered nor refused a foreign client certificate");
    if let Ok(answer) = answer {
        assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 401"), "mallory got: {answer}");
    }

    // A valid certificate: the PodList with the running pod and its status.
    let client = api.client(Some(&alice));
    let started = Instant::now();
    for _ in 0..50 {
        assert_eq!(client.get(api.url("/pods")).send().await.unwrap().status().as_u16(), 200);
    }
    eprintln!("MEASURED /pods round trip: {:?} mean over 50", started.elapsed() / 50);
    let resp = client.get(api.url("/pods")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let list: serde_json::Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
    assert_eq!(list["kind"], "PodList");
    let pod = list["items"].as_array().unwrap().iter().find(|p| p["metadata"]["name"] == static_name("sleeper"));
    let pod = pod.unwrap_or_else(|| panic!("sleeper not in /pods: {list}"));
    assert_eq!(pod["status"]["phase"], "Running");
}

/// `tlsMinVersion` and `tlsCipherSuites` as upstream: the list restricts TLS 1.2 suites (a
/// TLS 1.2 client gets the one listed suite; TLS 1.3 stays available), and VersionTLS13 turns
/// TLS 1.2 clients away.
#[tokio::test(flavor = "multi_thread")]
async fn tls_min_version_and_cipher_suites() {
    use rustls::version::{TLS12, TLS13};
    use rustls::{CipherSuite, ProtocolVersion};
    let suites = "--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305,TLS_RSA_WITH_AES_128_CBC_SHA";
    let Some((env, api, mut gantry, _)) = standalone_with(&[], &[suites]).await else { return };
    let tls12 = api.handshake(&[&TLS12]).await.expect("a TLS 1.2 handshake");
    assert_eq!(tls12, (ProtocolVersion::TLSv1_2, CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256));
    assert_eq!(api.handshake(&[&TLS13]).await.expect("a TLS 1.3 handshake").0, ProtocolVersion::TLSv1_3);
    assert!(gantry.log().contains("TLS_RSA_WITH_AES_128_CBC_SHA"), "the skipped suite is named in a warning");

    gantry.kill();
    let _gantry = start(&env, &api, &["--authorization-mode=AlwaysAllow", "--tls-min-version=VersionTLS13"]).await;
    let refused = api.handshake(&[&TLS12]).await;
    assert!(refused.is_err(), "TLS 1.2 accepted with VersionTLS13: {refused:?}");
    assert_eq!(api.handshake(&[&TLS13]).await.expect("a TLS 1.3 handshake").0, ProtocolVersion::TLSv1_3);
}

#[tokio::test(flavor = "multi_thread")]
async fn anonymous_requests_self_signed_certificate_and_debugging_handlers_off() {
    let Some(env) = Env::start().await else { return };
    let api = NodeApi::new(&env.ctd.dir());
    // No --tls-cert-file: a self-signed pair in <root-dir>/pki.
    let flags = [
        "--enable-server=true".to_string(),
        "--address=127.0.0.1".to_string(),
        format!("--port={}", api.port),
        format!("--healthz-port={}", api.healthz_port),
        "--anonymous-auth=true".to_string(),
        "--authorization-mode=AlwaysAllow".to_string(),
        "--enable-debugging-handlers=false".to_string(),
    ];
    let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut gantry = env.kubelet(&refs);
    let insecure = reqwest::Client::builder().danger_accept_invalid_certs(true).no_proxy().build().unwrap();
    let pods = api.url("/pods");
    let resp = eventually("anonymous /pods", &gantry, || async { insecure.get(&pods).send().await.ok() }).await;
    assert_eq!(resp.status().as_u16(), 200, "anonymous is allowed when enabled");
    // Debugging handlers off: the container endpoints answer 405 as upstream.
    let resp = insecure.post(api.url("/run/default/p/main?cmd=ls")).send().await.unwrap();
    assert_eq!((resp.status().as_u16(), resp.text().await.unwrap()), (405, "Debug endpoints are disabled.".into()));
    let cert = env.root.join("pki/kubelet.crt");
    let first = std::fs::read(&cert).expect("self-signed kubelet.crt in <root-dir>/pki");
    assert!(env.root.join("pki/kubelet.key").exists());
    // Trusting the generated certificate for the node's name works (it is self-signed).
    let trusted = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&first).unwrap())
        .tls_built_in_root_certs(false)
        .resolve(common::NODE, format!("127.0.0.1:{}", api.port).parse().unwrap())
        .no_proxy()
        .build()
        .unwrap();
    let by_name = format!("https://{}:{}/healthz", common::NODE, api.port);
    let verified = trusted.get(&by_name).send().await.expect("the self-signed certificate names the node");
    assert_eq!(verified.status().as_u16(), 200);

    // A restart reuses the pair.
    gantry.kill();
    let gantry = env.kubelet(&refs);
    eventually("anonymous /pods after restart", &gantry, || async { insecure.get(&pods).send().await.ok() }).await;
    assert_eq!(std::fs::read(&cert).unwrap(), first, "the self-signed certificate is reused");
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_over_websocket_with_stdin_output_and_exit_code() {
    let sleeper = pod_yaml("sleeper", "sleep 3600", "");
    let Some((_env, api, gantry, alice)) = standalone(&[("sleeper.yaml", sleeper)]).await else { return };
    wait_running(&gantry, "sleeper").await;
    let pod = static_name("sleeper");

    let script = "read line; echo got:$line; echo oops >&2; exit 3";
    let path = with_query(
        &format!("/exec/default/{pod}/main"),
        &[("command", "sh"), ("command", "-c"), ("command", script), ("input", "1"), ("output", "1"), ("error", "1")],
    );
    let mut ws = api.websocket(Some(&alice), &path, CHANNEL).await.expect("exec upgrade");
    ws.send(stdin_frame("hello\n")).await.unwrap();
    let out = text(&read_channels(&mut ws, |o| !o[3].is_empty()).await);
    assert_eq!(out[1], "got:hello\n");
    assert_eq!(out[2], "oops\n");
    let status: serde_json::Value = serde_json::from_str(&out[3]).unwrap();
    assert_eq!(status["status"], "Failure", "{status}");
    assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
    assert_eq!(status["details"]["causes"][0]["message"], "3", "{status}");

    // A zero exit reports Success (here through the `/{podUID}/` form of the path).
    let uid = gantry.pod(&pod).unwrap().metadata.uid.unwrap();
    let path = with_query(&format!("/exec/default/{pod}/{uid}/main"), &[("command", "true"), ("output", "1")]);
    let mut ws = api.websocket(Some(&alice), &path, CHANNEL).await.expect("exec upgrade");
    let out = text(&read_channels(&mut ws, |o| !o[3].is_empty()).await);
    assert!(out[3].contains("Success"), "{:?}", out[3]);
    let wrong_uid = with_query(&format!("/exec/default/{pod}/not-{uid}/main"), &[("command", "true"), ("output", "1")]);
    assert_eq!(api.websocket(Some(&alice), &wrong_uid, CHANNEL).await.unwrap_err(), (404, "pod does not exist".into()));

    // A TTY with terminal resizing (channel 4 carries the size as JSON). The runtime applies
    // the size asynchronously, so the script waits for it (the read has a deadline).
    let path = with_query(
        &format!("/exec/default/{pod}/main"),
        &[("command", "sh"), ("command", "-c"), ("command", TTY_SCRIPT), ("input", "1"), ("output", "1"), ("tty", "1")],
    );
    let mut ws = api.websocket(Some(&alice), &path, CHANNEL).await.expect("tty exec upgrade");
    let mut resize = vec![4u8];
    resize.extend_from_slice(br#"{"Width":123,"Height":45}"#);
    ws.send(Message::binary(resize)).await.unwrap();
    ws.send(stdin_frame("go\n")).await.unwrap();
    let out = text(&read_channels(&mut ws, |o| !o[3].is_empty()).await);
    assert!(out[1].contains("size:45 123"), "stty saw the resize: {:?}", out[1]);
}

#[tokio::test(flavor = "multi_thread")]
async fn attach_to_a_container_reading_stdin() {
    let echo = pod_yaml("echoer", "while read l; do echo attached:$l; done", "")
        .replace("    command:", "    stdin: true\n    command:");
    let Some((_env, api, gantry, alice)) = standalone(&[("echoer.yaml", echo)]).await else { return };
    wait_running(&gantry, "echoer").await;
    let path =
        with_query(&format!("/attach/default/{}/main", static_name("echoer")), &[("input", "1"), ("output", "1")]);
    let mut ws = api.websocket(Some(&alice), &path, CHANNEL).await.expect("attach upgrade");
    ws.send(stdin_frame("ping\n")).await.unwrap();
    let out = read_channels(&mut ws, |o| String::from_utf8_lossy(&o[1]).contains("attached:ping")).await;
    assert!(String::from_utf8_lossy(&out[1]).contains("attached:ping"));
}

#[tokio::test(flavor = "multi_thread")]
async fn port_forward_over_websocket_reaches_a_server_in_the_pod() {
    let web =
        pod_yaml("web", "mkdir -p /www && echo hello-from-pod > /www/index.html && exec httpd -f -p 8080 -h /www", "");
    let Some((_env, api, gantry, alice)) = standalone(&[("web.yaml", web)]).await else { return };
    wait_running(&gantry, "web").await;
    let path = format!("/portForward/default/{}?port=8080", static_name("web"));
    // httpd may not listen yet right after the container started: retry whole exchanges.
    let body = eventually("an HTTP answer through the port-forward", &gantry, || async {
        let mut ws = api.websocket(Some(&alice), &path, CHANNEL).await.ok()?;
        ws.send(stdin_frame("GET /index.html HTTP/1.0\r\n\r\n")).await.ok()?;
        let mut data = Vec::new();
        let mut headers_seen = [false; 2];
        let deadline = Instant::now() + Duration::from_secs(5);
        while !String::from_utf8_lossy(&data).contains("hello-from-pod") {
            let left = deadline.checked_duration_since(Instant::now())?;
            let Ok(Some(Ok(Message::Binary(frame)))) = tokio::time::timeout(left, ws.next()).await else { break };
            let Some((&channel, rest)) = frame.split_first() else { continue };
            let channel = channel as usize;
            // The first frame of each channel starts with the port (2 bytes, little endian).
            let rest = if channel < 2 && !headers_seen[channel] {
                headers_seen[channel] = true;
                assert_eq!(rest.get(..2), Some(&8080u16.to_le_bytes()[..]), "port header on channel {channel}");
                &rest[2..]
            } else {
                rest
            };
            if channel == 0 {
                data.extend_from_slice(rest);
            }
        }
        let body = String::from_utf8_lossy(&data).into_owned();
        body.contains("hello-from-pod").then_some(body)
    })
    .await;
    assert!(body.starts_with("HTTP/1.") && body.contains(" 200 "), "{body}");
}

/// What `kubectl exec` does by default: an upgrade to SPDY/3.1 with the `v4.channel.k8s.io`
/// remotecommand subprotocol, one SPDY stream per channel (header `streamtype`), proxied byte
/// for byte to containerd's streaming server (Go's spdystream).
#[tokio::test(flavor = "multi_thread")]
async fn spdy_exec_streams_stdin_stdout_stderr_and_exit_code() {
    let sleeper = pod_yaml("sleeper", "sleep 3600", "");
    let Some((_env, api, gantry, alice)) = standalone(&[("sleeper.yaml", sleeper)]).await else { return };
    wait_running(&gantry, "sleeper").await;
    let script = "read x; echo out:$x; echo err >&2; exit 3";
    let path = with_query(
        &format!("/exec/default/{}/main", static_name("sleeper")),
        &[("command", "sh"), ("command", "-c"), ("command", script), ("input", "1"), ("output", "1"), ("error", "1")],
    );
    let mut tls = api.tls(Some(&alice)).await;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
         X-Stream-Protocol-Version: v4.channel.k8s.io\r\nX-Stream-Protocol-Version: channel.k8s.io\r\nContent-Length: 0\r\n\r\n"
    );
    tls.write_all(req.as_bytes()).await.unwrap();
    // Byte by byte, so that nothing after the head (SPDY frames) is consumed here.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(DEADLINE, tls.read(&mut byte)).await.expect("response head").unwrap();
        assert_eq!(n, 1, "connection closed; got {:?}", String::from_utf8_lossy(&head));
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: spdy/3.1"), "{head}");
    assert!(head.contains("x-stream-protocol-version: v4.channel.k8s.io"), "{head}");

    // As client-go: the error stream first, then stdin, stdout, stderr; the server starts the
    // command once it has them all.
    let deadline = Instant::now() + DEADLINE;
    let mut spdy = Spdy::new(tls);
    let mut ids = Vec::new();
    for kind in ["error", "stdin", "stdout", "stderr"] {
        ids.push(spdy.open_stream(&[("streamType", kind)], false).await.expect("SYN_STREAM"));
    }
    let [error, stdin, stdout, stderr] = ids[..] else { unreachable!() };
    assert_eq!(ids, [1, 3, 5, 7], "client streams have odd ids");
    let mut streams = Streams::default();
    spdy.read_until(&mut streams, deadline, |s| ids.iter().all(|id| s.replied.contains(id))).await;
    assert!(ids.iter().all(|id| streams.replied.contains(id)), "a SYN_REPLY per stream: {streams:?}");

    spdy.send_data(stdin, b"hello\n", false).await.unwrap();
    spdy.send_data(stdin, b"", true).await.unwrap();
    // Output streams end with FIN. The status comes last; then the server closes the
    // connection (GOAWAY), resetting (CANCEL) the streams it had not half-closed (here error
    // and stdin), so the error stream ends with FIN or RST_STREAM.
    spdy.read_until(&mut streams, deadline, |s| [error, stdout, stderr].iter().all(|id| s.ended(*id))).await;
    assert_eq!(streams.text(stdout), "out:hello\n", "{streams:?}");
    assert_eq!(streams.text(stderr), "err\n", "{streams:?}");
    for id in [stdout, stderr] {
        assert!(
            streams.finished.contains(&id) && !streams.reset.contains_key(&id),
            "stream {id} ends cleanly: {streams:?}"
        );
    }
    assert!(streams.ended(error), "the error stream ends: {streams:?}");
    let status: serde_json::Value = serde_json::from_str(&streams.text(error)).expect("a Status on the error stream");
    assert_eq!(status["status"], "Failure", "{status}");
    assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
    assert_eq!(status["details"]["causes"][0]["reason"], "ExitCode", "{status}");
    assert_eq!(status["details"]["causes"][0]["message"], "3", "{status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn run_errors_and_disconnects() {
    let sleeper = pod_yaml("sleeper", "sleep 3600", "");
    let Some((_env, api, gantry, alice)) = standalone(&[("sleeper.yaml", sleeper)]).await else { return };
    wait_running(&gantry, "sleeper").await;
    let pod = static_name("sleeper");
    let client = api.client(Some(&alice));

    // /run: output in the body; a failing command is a 500 with upstream's message.
    let resp = client
        .post(api.url(&with_query(&format!("/run/default/{pod}/main"), &[("cmd", "echo hello there")])))
        .send()
        .await
        .unwrap();
    assert_eq!((resp.status().as_u16(), resp.text().await.unwrap()), (200, "hello there\n".to_string()));
    // Measured, not asserted: a /run round trip (TLS kept alive, auth, CRI ExecSync).
    let started = Instant::now();
    for _ in 0..20 {
        let resp = client.post(api.url(&format!("/run/default/{pod}/main?cmd=true"))).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 200);
    }
    eprintln!("MEASURED /run round trip: {:?} mean over 20", started.elapsed() / 20);
    let resp = client.post(api.url(&format!("/run/default/{pod}/main?cmd=false"))).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 500);
    assert!(resp.text().await.unwrap().contains("command '[false]' exited with 1"));
    let resp = client.post(api.url(&format!("/run/default/{pod}/main"))).send().await.unwrap();
    assert_eq!(
        (resp.status().as_u16(), resp.text().await.unwrap()),
        (400, "missing required query parameter \"cmd\"".into())
    );

    // Unknown pod or container: 404 with a message; bad parameters: 400 naming them.
    let exec = |p: &str| with_query(p, &[("command", "true"), ("output", "1")]);
    let err = api.websocket(Some(&alice), &exec("/exec/default/nope/main"), CHANNEL).await.unwrap_err();
    assert_eq!(err, (404, "pod does not exist".into()));
    let err = api.websocket(Some(&alice), &exec(&format!("/exec/default/{pod}/nope")), CHANNEL).await.unwrap_err();
    assert_eq!(err, (404, "container not found (\"nope\")".into()));
    let err = api.websocket(Some(&alice), &format!("/exec/default/{pod}/main?output=1"), CHANNEL).await.unwrap_err();
    assert_eq!(err, (400, "missing required query parameter \"command\"".into()));
    let err = api.websocket(Some(&alice), &format!("/portForward/default/{pod}?port=http"), CHANNEL).await.unwrap_err();
    assert_eq!(err.0, 400);
    assert!(err.1.contains("\"port\""), "{}", err.1);
    let resp = client.get(api.url(&exec(&format!("/exec/default/{pod}/main")))).send().await.unwrap();
    assert_eq!((resp.status().as_u16(), resp.text().await.unwrap()), (400, "Upgrade request required".into()));

    // A client that goes away mid-stream: the runtime's exec session ends, the agent lives on.
    // containerd runs exec'd processes detached from the request, but closes their stdin when
    // the stream ends: a process reading stdin ends when the client is gone.
    let script = "cat >/dev/null; echo tick-7777";
    let exec_args = [("command", "sh"), ("command", "-c"), ("command", script), ("input", "1"), ("output", "1")];
    let path = with_query(&format!("/exec/default/{pod}/main"), &exec_args);
    let ws = api.websocket(Some(&alice), &path, CHANNEL).await.expect("exec upgrade");
    let ps = api.url(&format!("/run/default/{pod}/main?cmd=ps"));
    eventually("the exec'd loop to run", &gantry, || async {
        let out = client.post(&ps).send().await.ok()?.text().await.ok()?;
        out.contains("tick-7777").then_some(())
    })
    .await;
    drop(ws);
    eventually("the exec'd loop to end after the client left", &gantry, || async {
        let out = client.post(&ps).send().await.ok()?.text().await.ok()?;
        (!out.contains("tick-7777")).then_some(())
    })
    .await;
    let resp = client.get(api.url("/healthz")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
}

/// Who asked the test API server what, through SubjectAccessReviews.
type Reviews = Arc<Mutex<Vec<AccessRequest>>>;

#[tokio::test(flavor = "multi_thread")]
async fn tokens_are_reviewed_and_subresources_authorized_by_the_api_server() {
    let mut cluster = Cluster::start().await;
    let Some(server) = cluster.test_server("node API token and SubjectAccessReview hooks") else { return };
    let user = |name: &str| UserInfo { username: name.into(), groups: vec!["dev".into()], ..Default::default() };
    let (alice, bob) = (user("alice"), user("bob"));
    server.set_token_review(move |token, _| match token {
        "alice-token" => Some(alice.clone()),
        "bob-token" => Some(bob.clone()),
        _ => None,
    });
    let reviews: Reviews = Arc::default();
    let seen = reviews.clone();
    server.set_authorizer(move |req| {
        if req.resource != "nodes" {
            return Decision::NoOpinion(String::new());
        }
        seen.lock().unwrap().push(req.clone());
        match (req.user.username.as_str(), req.subresource.as_str()) {
            ("alice", _) | ("bob", "stats") => Decision::Allow,
            _ => Decision::Deny("bob may only read stats".into()),
        }
    });
    let Some(env) = Env::start_as(&cluster.node_name()).await else { return };
    let api = NodeApi::new(&env.ctd.dir());
    let kubeconfig = cluster.node_kubeconfig(&env.ctd.dir(), &env.node);
    // The config file's defaults: webhook authentication, Webhook authorization, no anonymous.
    let gantry = start(&env, &api, &[&format!("--kubeconfig={}", kubeconfig.display())]).await;
    let client = api.client(None);
    let get = |token: &str, path: &str| client.get(api.url(path)).bearer_auth(token).send();

    let resp = get("alice-token", "/pods").await.unwrap();
    assert_eq!(resp.status().as_u16(), 200, "{}", gantry.log());
    let resp = get("bob-token", "/pods").await.unwrap();
    assert_eq!(
        (resp.status().as_u16(), resp.text().await.unwrap()),
        (403, "Forbidden (user=bob, verb=get, resource=nodes, subresource(s)=[pods proxy])".to_string())
    );
    let resp = client.post(api.url("/run/default/x/main?cmd=ls")).bearer_auth("bob-token").send().await.unwrap();
    assert_eq!(
        (resp.status().as_u16(), resp.text().await.unwrap()),
        (403, "Forbidden (user=bob, verb=create, resource=nodes, subresource(s)=[proxy])".to_string())
    );
    // Allowed for bob: the stats subresource (no route yet on this branch: 404 past auth).
    let resp = get("bob-token", "/stats/summary").await.unwrap();
    assert_ne!(resp.status().as_u16(), 403);
    assert_ne!(resp.status().as_u16(), 401);
    let resp = get("who-knows", "/pods").await.unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let resp = client.get(api.url("/pods")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 401);

    // The reviews name the node, the resource and the subresource; answers are cached.
    let count = |user: &str, sub: &str| {
        reviews.lock().unwrap().iter().filter(|r| r.user.username == user && r.subresource == sub).count()
    };
    {
        let all = reviews.lock().unwrap();
        let r = all.iter().find(|r| r.user.username == "alice").expect("a review for alice");
        assert_eq!(
            (r.verb.as_str(), r.resource.as_str(), r.subresource.as_str(), r.name.as_str()),
            ("get", "nodes", "pods", env.node.as_str())
        );
        assert!(r.user.groups.contains(&"system:authenticated".to_string()), "{r:?}");
    }
    let before = (count("bob", "pods"), count("alice", "pods"));
    assert_eq!(get("bob-token", "/pods").await.unwrap().status().as_u16(), 403);
    assert_eq!(get("alice-token", "/pods").await.unwrap().status().as_u16(), 200);
    assert_eq!((count("bob", "pods"), count("alice", "pods")), before, "denied and allowed answers are cached");
}

/// `kubectl exec` and `kubectl port-forward` the way they really travel: client → API server
/// → this node's API (authenticated with the API server's kubelet client certificate,
/// authorized by SubjectAccessReview) → containerd. Needs a real cluster that can reach this
/// machine (`GANTRY_E2E_KUBECONFIG`); the in-process test server does not proxy to nodes.
/// Covers `kubectl exec`, `kubectl port-forward` and `kubectl logs`.
#[tokio::test(flavor = "multi_thread")]
async fn exec_and_port_forward_through_the_api_server() {
    use base64::Engine;
    use kube::Api;
    use kube::api::{AttachParams, PostParams};

    let Some((env, cluster)) = common::cluster::setup().await else { return };
    if matches!(cluster, Cluster::Test(_)) {
        eprintln!("SKIPPED exec/port-forward through the API server: needs GANTRY_E2E_KUBECONFIG (a real API server)");
        return;
    }
    // The API server's kubelet client certificate chains to the cluster CA.
    let kubeconfig = cluster.node_kubeconfig(&env.ctd.dir(), &env.node);
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
    let ca_pem = match (config.root_cert, config.root_cert_file) {
        (Some(ders), _) => {
            let b64 = base64::engine::general_purpose::STANDARD;
            let pem = |der: &Vec<u8>| {
                let b = b64.encode(der);
                let lines: Vec<&str> = b.as_bytes().chunks(64).map(|c| std::str::from_utf8(c).unwrap()).collect();
                format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", lines.join("\n"))
            };
            ders.iter().map(pem).collect::<String>()
        }
        (None, Some(file)) => std::fs::read_to_string(file).unwrap(),
        (None, None) => panic!("the kubeconfig names no cluster CA"),
    };
    let ca = env.ctd.dir().join("cluster-ca.crt");
    std::fs::write(&ca, ca_pem).unwrap();
    let port = common::node_api::free_port();
    let flags = [
        format!("--kubeconfig={}", kubeconfig.display()),
        "--enable-server=true".into(),
        format!("--port={port}"),
        format!("--healthz-port={}", common::node_api::free_port()),
        format!("--client-ca-file={}", ca.display()),
    ];
    let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    let gantry = env.kubelet(&refs);
    let pods: Api<Pod> = Api::namespaced(cluster.admin().await, "default");
    let spec = format!(
        "  nodeName: {}\n  terminationGracePeriodSeconds: 1\n  automountServiceAccountToken: false\n",
        env.node
    );
    let web = "mkdir -p /www && echo hello-from-pod > /www/index.html && echo serving && exec httpd -f -p 8080 -h /www";
    let pod: Pod = serde_yaml_ng::from_str(&pod_yaml("web", web, &spec)).unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    eventually("the pod Running in the API", &gantry, || async {
        let p = pods.get("web").await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;

    let ap = AttachParams::default().stdin(false).stdout(true).stderr(false);
    let mut proc = pods.exec("web", ["sh", "-c", "echo through-the-api; exit 4"], &ap).await.unwrap();
    let mut out = String::new();
    proc.stdout().unwrap().read_to_string(&mut out).await.unwrap();
    let status = proc.take_status().unwrap().await.unwrap();
    assert_eq!(out, "through-the-api\n");
    assert_eq!(status.reason.as_deref(), Some("NonZeroExitCode"), "{status:?}");

    let mut pf = pods.portforward("web", &[8080]).await.unwrap();
    let mut stream = pf.take_stream(8080).unwrap();
    stream.write_all(b"GET /index.html HTTP/1.0\r\n\r\n").await.unwrap();
    let mut body = Vec::new();
    stream.read_to_end(&mut body).await.unwrap();
    assert!(String::from_utf8_lossy(&body).contains("hello-from-pod"));

    // `kubectl logs`: the API server reads /containerLogs from the node.
    let logs = pods.logs("web", &kube::api::LogParams::default()).await.unwrap();
    assert_eq!(logs, "serving\n");
    cluster.cleanup(&env.node).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn start_up_fails_clearly_when_the_port_is_taken_or_the_certificate_is_missing() {
    let Some(env) = Env::start().await else { return };
    let api = NodeApi::new(&env.ctd.dir());
    let taken = std::net::TcpListener::bind(("127.0.0.1", api.port)).unwrap();
    let mut gantry = env.kubelet(&api.flags().iter().map(String::as_str).collect::<Vec<_>>());
    let status = wait_exit(&mut gantry).await;
    assert!(!status.success());
    let log = gantry.log();
    assert!(log.contains(&format!("cannot listen on 127.0.0.1:{} (port)", api.port)), "{log}");
    drop(taken);

    let missing = env.ctd.dir().join("missing.crt");
    let mut flags = api.flags();
    flags.retain(|f| !f.starts_with("--tls-cert-file="));
    flags.push(format!("--tls-cert-file={}", missing.display()));
    let log_before = gantry.log().len();
    let mut gantry = env.kubelet(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    let status = wait_exit(&mut gantry).await;
    assert!(!status.success());
    let log = gantry.log()[log_before..].to_string();
    assert!(log.contains(&format!("cannot read tlsCertFile {}", missing.display())), "{log}");
}

/// Polls until the agent process exits (with a deadline).
async fn wait_exit(gantry: &mut Gantry) -> std::process::ExitStatus {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(status) = gantry.try_exit() {
            return status;
        }
        assert!(Instant::now() < deadline, "the agent did not exit\n{}", common::tail(&gantry.log(), 20));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
