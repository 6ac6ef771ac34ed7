//! Helpers shared by the integration tests.
#![allow(dead_code)]

use gantry_test_apiserver::{TestApiServer, User};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use kube::core::Status;
use kube::{Client, Error};
use serde_json::{Value, json};

pub async fn start() -> (TestApiServer, Client) {
    let server = TestApiServer::start().await;
    let client = server.client(&User::Admin).await;
    (server, client)
}

/// A client that reports 429s at once instead of retrying them for minutes.
pub async fn client_without_retries(server: &TestApiServer, user: &User) -> Client {
    let mut config = server.config(user).await;
    config.default_retry = false;
    Client::try_from(config).unwrap()
}

/// Like `start`, with an admin client that does not retry 429s.
pub async fn start_without_retries() -> (TestApiServer, Client) {
    let server = TestApiServer::start().await;
    let client = client_without_retries(&server, &User::Admin).await;
    (server, client)
}

/// The Status of a failed API call.
pub fn status(e: Error) -> Box<Status> {
    match e {
        Error::Api(s) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

pub fn pod_json(name: &str, node: Option<&str>) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "image": "registry.local/app:1"}], "automountServiceAccountToken": false}
    });
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
    }
    p
}

pub fn pod(name: &str, node: Option<&str>) -> Pod {
    serde_json::from_value(pod_json(name, node)).unwrap()
}

pub async fn create_pod(client: &Client, ns: &str, name: &str, node: Option<&str>) -> Pod {
    Api::<Pod>::namespaced(client.clone(), ns).create(&PostParams::default(), &pod(name, node)).await.unwrap()
}

pub async fn create_node(client: &Client, name: &str) -> Node {
    let node: Node =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}))
            .unwrap();
    Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await.unwrap()
}

pub fn rv(obj: &impl kube::Resource) -> u64 {
    obj.meta().resource_version.as_deref().unwrap().parse().unwrap()
}

/// Raw HTTP requests through a kube client, for requests kube-rs would never send and for
/// looking at response bodies as they are.
pub struct RawClient {
    client: Client,
}

impl RawClient {
    pub async fn new(server: &TestApiServer, user: &User) -> RawClient {
        RawClient { client: server.client(user).await }
    }

    pub async fn send(&self, req: http::Request<Vec<u8>>) -> (u16, Value) {
        let res = self.client.send(req.map(kube::client::Body::from)).await.unwrap();
        let code = res.status().as_u16();
        let bytes = http_body_util::BodyExt::collect(res.into_body()).await.unwrap().to_bytes();
        (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send(http::Request::get(path).body(vec![]).unwrap()).await
    }

    pub async fn post(&self, path: &str, body: &str) -> (u16, Value) {
        self.send(
            http::Request::post(path)
                .header("content-type", "application/json")
                .body(body.as_bytes().to_vec())
                .unwrap(),
        )
        .await
    }

    pub async fn patch(&self, path: &str, content_type: &str, body: &str) -> (u16, Value) {
        self.send(
            http::Request::patch(path).header("content-type", content_type).body(body.as_bytes().to_vec()).unwrap(),
        )
        .await
    }
}
