//! TLS bootstrap through the API: bootstrap token authentication, the CSR API with its
//! approval and status subresources, and the in-process approver and signer.

mod common;

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::{create_node, start, status};
use gantry_test_apiserver::{Decision, TestApiServer, User};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use rcgen::{CertificateParams, DnType, KeyPair};
use serde_json::json;

const TOKEN: &str = "abcdef.0123456789abcdef";

/// The Secret `kubeadm token create` writes.
async fn create_bootstrap_token(admin: &Client, expiration: &str) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "bootstrap-token-abcdef", "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "token-id": "abcdef", "token-secret": "0123456789abcdef", "expiration": expiration,
            "usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true",
            "auth-extra-groups": "system:bootstrappers:kubeadm:default-node-token",
        },
    }))
    .unwrap();
    Api::<Secret>::namespaced(admin.clone(), "kube-system").create(&PostParams::default(), &secret).await.unwrap();
}

fn request(node: &str, sans: &[&str]) -> (String, KeyPair) {
    let mut params = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, format!("system:node:{node}"));
    params.distinguished_name.push(DnType::OrganizationName, "system:nodes");
    let key = KeyPair::generate().unwrap();
    (params.serialize_request(&key).unwrap().pem().unwrap(), key)
}

fn csr(name: &str, signer: &str, request: &str, usages: &[&str]) -> CertificateSigningRequest {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"request": STANDARD.encode(request), "signerName": signer, "usages": usages},
    }))
    .unwrap()
}

/// Waits for the CSR's certificate (PEM).
async fn issued(api: &Api<CertificateSigningRequest>, name: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = api.get(name).await.unwrap();
        if let Some(cert) = got.status.and_then(|s| s.certificate) {
            return String::from_utf8(cert.0).unwrap();
        }
        assert!(tokio::time::Instant::now() < deadline, "no certificate for {name}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn cert_client(server: &TestApiServer, cert_pem: &str, key: &KeyPair) -> Client {
    let yaml = serde_yaml_ng::to_string(&json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server.url(), "certificate-authority-data": STANDARD.encode(server.ca_pem())}}],
        "users": [{"name": "u", "user": {"client-certificate-data": STANDARD.encode(cert_pem), "client-key-data": STANDARD.encode(key.serialize_pem())}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    .unwrap();
    let kc = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
    Client::try_from(config).unwrap()
}

#[tokio::test]
async fn bootstrap_token_gets_a_node_client_certificate() {
    let (server, admin) = start().await;
    create_bootstrap_token(&admin, "2099-01-01T00:00:00Z").await;
    let bootstrap = server.client(&User::Token(TOKEN.into())).await;
    let csrs: Api<CertificateSigningRequest> = Api::all(bootstrap.clone());
    let (req, key) = request("n1", &[]);
    let created = csrs
        .create(
            &PostParams::default(),
            &csr(
                "node-csr-A_b",
                "kubernetes.io/kube-apiserver-client-kubelet",
                &req,
                &["digital signature", "client auth"],
            ),
        )
        .await
        .unwrap();
    let spec = &created.spec;
    assert_eq!(spec.username.as_deref(), Some("system:bootstrap:abcdef"));
    assert!(spec.groups.as_ref().unwrap().contains(&"system:bootstrappers".to_string()));
    let cert = issued(&csrs, "node-csr-A_b").await;
    let approved = csrs.get("node-csr-A_b").await.unwrap();
    let cond = &approved.status.unwrap().conditions.unwrap()[0];
    assert_eq!((cond.type_.as_str(), cond.reason.as_deref()), ("Approved", Some("AutoApproved")));

    // The issued certificate is the node's identity.
    let node = cert_client(&server, &cert, &key).await;
    create_node(&node, "n1").await;
    assert_eq!(Api::<Node>::all(node.clone()).get("n1").await.unwrap().name_any(), "n1");

    // A bootstrapper may not read nodes or approve anything.
    assert_eq!(status(Api::<Node>::all(bootstrap.clone()).get("n1").await.unwrap_err()).code, 403);
    let (serving_req, _) = request("n1", &["n1", "10.0.0.1"]);
    let serving = csr("serving", "kubernetes.io/kubelet-serving", &serving_req, &["digital signature", "server auth"]);
    let node_csrs: Api<CertificateSigningRequest> = Api::all(node);
    node_csrs.create(&PostParams::default(), &serving).await.unwrap();
    let approve =
        Patch::Merge(json!({"status": {"conditions": [{"type": "Approved", "status": "True", "reason": "Test"}]}}));
    let e = status(csrs.patch_subresource("approval", "serving", &PatchParams::default(), &approve).await.unwrap_err());
    assert_eq!(e.code, 403);
    assert!(e.message.contains("cannot patch resource \"certificatesigningrequests/approval\""), "{}", e.message);
    // Writing the approval subresource is not enough: approving needs `approve` on the signer.
    server.set_authorizer(|req| {
        if req.user.username == "bob" && req.resource == "certificatesigningrequests" {
            Decision::Allow
        } else {
            Decision::NoOpinion(String::new())
        }
    });
    let bob = server.client(&User::ClientCert { cn: "bob".into(), groups: vec![] }).await;
    let bob_csrs: Api<CertificateSigningRequest> = Api::all(bob);
    let e =
        status(bob_csrs.patch_subresource("approval", "serving", &PatchParams::default(), &approve).await.unwrap_err());
    assert_eq!(e.code, 403);
    assert!(
        e.message.contains("user not permitted to approve requests with signerName \"kubernetes.io/kubelet-serving\""),
        "{}",
        e.message
    );

    // Serving requests stay pending until an administrator approves them.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(node_csrs.get("serving").await.unwrap().status.and_then(|s| s.certificate).is_none());
    Api::<CertificateSigningRequest>::all(admin)
        .patch_subresource("approval", "serving", &PatchParams::default(), &approve)
        .await
        .unwrap();
    let serving_cert = issued(&node_csrs, "serving").await;
    let (_, pem) = x509_parser::pem::parse_x509_pem(serving_cert.as_bytes()).unwrap();
    let parsed = pem.parse_x509().unwrap();
    let sans = parsed.subject_alternative_name().unwrap().unwrap().value.general_names.len();
    assert_eq!(sans, 2);
}

#[tokio::test]
async fn csr_names_follow_path_segment_rules_only() {
    let (_server, admin) = start().await;
    let csrs: Api<CertificateSigningRequest> = Api::all(admin);
    let (req, _) = request("n3", &[]);
    let body = |name: &str| {
        csr(name, "kubernetes.io/kube-apiserver-client-kubelet", &req, &["digital signature", "client auth"])
    };
    let e = status(csrs.create(&PostParams::default(), &body("a%b")).await.unwrap_err());
    assert_eq!(e.code, 422);
    assert!(e.message.contains("may not contain '%'"), "{}", e.message);
}

#[tokio::test]
async fn expired_or_unknown_bootstrap_tokens_get_401() {
    let (server, admin) = start().await;
    let csrs: Api<CertificateSigningRequest> = Api::all(server.client(&User::Token(TOKEN.into())).await);
    let (req, _) = request("n1", &[]);
    let body = csr("x", "kubernetes.io/kube-apiserver-client-kubelet", &req, &["digital signature", "client auth"]);
    assert_eq!(status(csrs.create(&PostParams::default(), &body).await.unwrap_err()).code, 401);
    create_bootstrap_token(&admin, "2020-01-01T00:00:00Z").await;
    assert_eq!(status(csrs.create(&PostParams::default(), &body).await.unwrap_err()).code, 401);
}

#[tokio::test]
async fn signing_duration_sets_the_lifetime() {
    let (server, admin) = start().await;
    server.set_signing_duration(Duration::from_secs(30));
    let csrs: Api<CertificateSigningRequest> = Api::all(admin);
    let (req, _) = request("n2", &[]);
    csrs.create(
        &PostParams::default(),
        &csr("c", "kubernetes.io/kube-apiserver-client-kubelet", &req, &["digital signature", "client auth"]),
    )
    .await
    .unwrap();
    let approve =
        Patch::Merge(json!({"status": {"conditions": [{"type": "Approved", "status": "True", "reason": "Test"}]}}));
    csrs.patch_subresource("approval", "c", &PatchParams::default(), &approve).await.unwrap();
    let cert = issued(&csrs, "c").await;
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert.as_bytes()).unwrap();
    let v = pem.parse_x509().unwrap().validity().clone();
    let now = jiff::Timestamp::now().as_second();
    assert!((v.not_after.timestamp() - now - 30).abs() <= 2, "expires in about 30 s");
}
