//! End-to-end, TLS bootstrap as `kubeadm join` sets it up: a node that has only a bootstrap
//! token gets its client certificate through a CertificateSigningRequest, joins, runs a pod,
//! and restarts without a new request; rotates its certificate without a restart while pod status
//! keeps flowing; a wrong token and a denied request stop start-up with
//! their own errors.
//!
//! The files are laid out as kubeadm does, in a temporary root: `etc/kubernetes/
//! bootstrap-kubelet.conf`, `etc/kubernetes/kubelet.conf` (written by Gantry),
//! `var/lib/kubelet/config.yaml`, `var/lib/kubelet/kubeadm-flags.env` and the certificates in
//! `var/lib/kubelet/pki`. Against a real cluster (`GANTRY_E2E_KUBECONFIG`) the test creates
//! its bootstrap token Secret and kubeadm's RBAC bindings as `kubeadm token create` and
//! `kubeadm init` would, and relies on the cluster's CSR approver and signer.

mod common;

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::cluster::{self, Cluster};
use common::{Env, Gantry, eventually, pod_yaml, poll, tail};
use gantry_test_apiserver::{Decision, User};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// The group `kubeadm token create` gives its tokens.
const KUBEADM_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";

/// A bootstrap token (`<6>.<16>` of [a-z0-9]) unique to this test run.
fn new_token() -> (String, String) {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    let seed = nanos ^ (u128::from(std::process::id()) << 40);
    (format!("{:06x}", seed & 0xff_ffff), format!("{:016x}", (seed >> 24) as u64))
}

/// The Secret `kubeadm token create` writes.
async fn create_token(admin: &Client, id: &str, secret: &str, groups: &str) {
    let expiration = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1);
    let obj: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("bootstrap-token-{id}"), "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "token-id": id, "token-secret": secret, "expiration": expiration.to_string(),
            "usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true",
            "auth-extra-groups": groups,
        },
    }))
    .unwrap();
    Api::<Secret>::namespaced(admin.clone(), "kube-system").create(&PostParams::default(), &obj).await.unwrap();
}

/// The ClusterRoleBindings `kubeadm init` creates for joining nodes (kept if they exist).
async fn kubeadm_bindings(admin: &Client) {
    let bindings = [
        ("kubeadm:kubelet-bootstrap", "system:node-bootstrapper", KUBEADM_GROUP),
        (
            "kubeadm:node-autoapprove-bootstrap",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            KUBEADM_GROUP,
        ),
        (
            "kubeadm:node-autoapprove-certificate-rotation",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            "system:nodes",
        ),
    ];
    for (name, role, group) in bindings {
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}],
        });
        let req = http::Request::post("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&binding).unwrap())
            .unwrap();
        match admin.request::<serde_json::Value>(req).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("creating ClusterRoleBinding {name}: {e}"),
        }
    }
}

/// A kubeconfig for the admin kubeconfig's cluster with `token` as credentials, as
/// `kubeadm join` writes bootstrap-kubelet.conf.
fn bootstrap_kubeconfig(admin_kubeconfig: &Path, token: &str, out: &Path) {
    let kc = kube::config::Kubeconfig::read_from(admin_kubeconfig).unwrap();
    let context = kc.contexts.iter().find(|c| Some(&c.name) == kc.current_context.as_ref()).unwrap();
    let cluster_name = &context.context.as_ref().unwrap().cluster;
    let cluster = kc.clusters.iter().find(|c| &c.name == cluster_name).unwrap().cluster.clone().unwrap();
    let ca = match (&cluster.certificate_authority_data, &cluster.certificate_authority) {
        (Some(data), _) => data.clone(),
        (None, Some(file)) => STANDARD.encode(std::fs::read(file).unwrap()),
        (None, None) => panic!("the admin kubeconfig names no CA"),
    };
    let yaml = serde_yaml_ng::to_string(&json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "tls-bootstrap-token-user@kubernetes",
        "clusters": [{"name": "kubernetes", "cluster": {"server": cluster.server.unwrap(), "certificate-authority-data": ca}}],
        "contexts": [{"name": "tls-bootstrap-token-user@kubernetes", "context": {"cluster": "kubernetes", "user": "tls-bootstrap-token-user"}}],
        "users": [{"name": "tls-bootstrap-token-user", "user": {"token": token}}],
    }))
    .unwrap();
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    std::fs::write(out, yaml).unwrap();
}

/// The kubeadm file layout under a temporary root.
struct KubeadmNode {
    root: PathBuf,
}

impl KubeadmNode {
    fn new(env: &Env) -> KubeadmNode {
        let root = env.ctd.dir().join("kubeadm-root");
        let (etc, lib) = (root.join("etc/kubernetes"), root.join("var/lib/kubelet"));
        std::fs::create_dir_all(etc.join("manifests")).unwrap();
        std::fs::create_dir_all(&lib).unwrap();
        // What `kubeadm init/join` writes (less what Gantry reports as not implemented), plus
        // the test environment's private log directory and no node API (ports shared by tests).
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: cgroupfs\n\
             clusterDNS:\n- 10.96.0.10\nclusterDomain: cluster.local\nstaticPodPath: {}\n\
             podLogsDir: {}\nenableServer: false\nfileCheckFrequency: 20s\n",
            etc.join("manifests").display(),
            env.pod_logs.display()
        );
        std::fs::write(lib.join("config.yaml"), config).unwrap();
        let flags = format!(
            "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint={} --pod-infra-container-image={}\"\n",
            env.ctd.endpoint(),
            gantry_testkit::PAUSE_IMAGE
        );
        std::fs::write(lib.join("kubeadm-flags.env"), flags).unwrap();
        KubeadmNode { root }
    }

    fn bootstrap_conf(&self) -> PathBuf {
        self.root.join("etc/kubernetes/bootstrap-kubelet.conf")
    }

    fn kubelet_conf(&self) -> PathBuf {
        self.root.join("etc/kubernetes/kubelet.conf")
    }

    fn cert_dir(&self) -> PathBuf {
        self.root.join("var/lib/kubelet/pki")
    }

    /// The command line of kubeadm's systemd drop-in (10-kubeadm.conf) with the flags file
    /// expanded as systemd does, plus the test's node name and cgroup root.
    fn args(&self, env: &Env) -> Vec<String> {
        let lib = self.root.join("var/lib/kubelet");
        let flags = std::fs::read_to_string(lib.join("kubeadm-flags.env")).unwrap();
        let kubeadm_args = flags.trim().strip_prefix("KUBELET_KUBEADM_ARGS=").unwrap().trim_matches('"').to_string();
        let mut args = vec![
            format!("--bootstrap-kubeconfig={}", self.bootstrap_conf().display()),
            format!("--kubeconfig={}", self.kubelet_conf().display()),
            format!("--config={}", lib.join("config.yaml").display()),
            format!("--root-dir={}", lib.display()),
        ];
        args.extend(kubeadm_args.split_whitespace().map(String::from));
        args.push(format!("--hostname-override={}", env.node));
        args.push(format!("--cgroup-root={}", env.ctd.cgroup_root()));
        args.push("-v=4".into());
        args
    }

    fn log(&self) -> PathBuf {
        self.root.join("gantry.log")
    }

    fn start(&self, env: &Env) -> Gantry {
        Gantry::start(&self.args(env), &self.log())
    }
}

/// The CSRs `user` made.
async fn csrs_by(admin: &Client, user: &str) -> Vec<CertificateSigningRequest> {
    let all = Api::<CertificateSigningRequest>::all(admin.clone()).list(&ListParams::default()).await.unwrap();
    all.items.into_iter().filter(|c| c.spec.username.as_deref() == Some(user)).collect()
}

/// A kubeadm node layout whose bootstrap kubeconfig holds a new token of `group`, with
/// kubeadm's bindings on a real cluster (the test server has them built in): the token id and
/// the node.
async fn node_with_token(admin: &Client, cluster: &Cluster, env: &Env, group: &str) -> (String, KubeadmNode) {
    let (id, secret) = new_token();
    create_token(admin, &id, &secret, group).await;
    if let Cluster::Real(_) = cluster {
        kubeadm_bindings(admin).await;
    }
    let node = KubeadmNode::new(env);
    bootstrap_kubeconfig(&cluster.admin_kubeconfig(&env.ctd.dir()), &format!("{id}.{secret}"), &node.bootstrap_conf());
    (id, node)
}

fn bound_pod(node: &str, name: &str) -> Pod {
    let spec = format!("  nodeName: {node}\n  automountServiceAccountToken: false\n");
    serde_yaml_ng::from_str(&pod_yaml(name, "while true; do sleep 1; done", &spec)).unwrap()
}

/// Waits for the agent to exit; returns its log.
/// Creates a pod bound to `node` and waits until the agent runs it.
async fn run_pod(gantry: &Gantry, pods: &Api<Pod>, node: &str, name: &str, what: &str) {
    pods.create(&PostParams::default(), &bound_pod(node, name)).await.unwrap();
    eventually(what, gantry, || async {
        let p = pods.get(name).await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
}

async fn wait_exit(gantry: &mut Gantry, log: &Path, what: &str) -> String {
    let read = || std::fs::read_to_string(log).unwrap_or_default();
    poll(
        what,
        || tail(&read(), 40),
        || {
            let exited = gantry.try_exit();
            async move { exited }
        },
    )
    .await;
    read()
}

#[tokio::test]
async fn joins_with_a_bootstrap_token_runs_a_pod_and_restarts_without_a_new_csr() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let admin = cluster.admin().await;
    let (id, node) = node_with_token(&admin, &cluster, &env, KUBEADM_GROUP).await;
    let mut gantry = node.start(&env);

    let nodes: Api<Node> = Api::all(admin.clone());
    eventually("the Node registered with the bootstrapped certificate", &gantry, || async {
        nodes.get_opt(&env.node).await.ok().flatten()
    })
    .await;
    let requester = format!("system:bootstrap:{id}");
    let made = csrs_by(&admin, &requester).await;
    assert_eq!(made.len(), 1, "one CSR from the bootstrap token");
    let csr = &made[0];
    let name = csr.metadata.name.clone().unwrap();
    assert!(name.starts_with("node-csr-"), "{name}");
    assert_eq!(csr.spec.signer_name, "kubernetes.io/kube-apiserver-client-kubelet");
    assert_eq!(csr.spec.usages.clone().unwrap(), ["digital signature", "client auth"]);
    let current = node.cert_dir().join("kubelet-client-current.pem");
    let target = std::fs::read_link(&current).expect("kubelet-client-current.pem is a symlink");
    assert!(target.file_name().unwrap().to_str().unwrap().starts_with("kubelet-client-20"), "{target:?}");
    let kubelet_conf = std::fs::read_to_string(node.kubelet_conf()).unwrap();
    assert!(kubelet_conf.contains(&format!("client-certificate: {}", current.display())), "{kubelet_conf}");
    assert!(!node.cert_dir().join("kubelet-client.key.tmp").exists(), "the pending key is gone once issued");

    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod = format!("tls-{id}");
    run_pod(&gantry, &pods, &env.node, &pod, "the API pod Running").await;

    // A restart finds a valid kubelet.conf: no second request.
    gantry.kill();
    let mut gantry = Gantry::start(&node.args(&env), &node.root.join("gantry-restarted.log"));
    eventually("the restarted agent connected", &gantry, || async {
        gantry.log().contains("connected to the API server").then_some(())
    })
    .await;
    assert!(gantry.log().contains("no bootstrap needed"), "{}", tail(&gantry.log(), 30));
    assert_eq!(csrs_by(&admin, &requester).await.len(), 1, "no new CSR after the restart");
    assert!(gantry.try_exit().is_none());

    let _ = pods.delete(&pod, &DeleteParams::default().grace_period(0)).await;
    let _ = Api::<Secret>::namespaced(admin.clone(), "kube-system")
        .delete(&format!("bootstrap-token-{id}"), &DeleteParams::default())
        .await;
    let _ = Api::<CertificateSigningRequest>::all(admin).delete(&name, &DeleteParams::default()).await;
    gantry.kill();
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn a_wrong_token_or_missing_bootstrap_kubeconfig_stops_start_up() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let node = KubeadmNode::new(&env);
    let mut gantry = node.start(&env);
    let log = wait_exit(&mut gantry, &node.log(), "exit without a bootstrap kubeconfig").await;
    assert!(
        log.contains(&format!(
            "cannot read the bootstrap kubeconfig {} (given with --bootstrap-kubeconfig)",
            node.bootstrap_conf().display()
        )),
        "{}",
        tail(&log, 20)
    );

    bootstrap_kubeconfig(&cluster.admin_kubeconfig(&env.ctd.dir()), "zzzzzz.zzzzzzzzzzzzzzzz", &node.bootstrap_conf());
    let mut gantry = node.start(&env);
    let log = wait_exit(&mut gantry, &node.log(), "exit with a wrong token").await;
    assert!(log.contains("answered 401 Unauthorized to the bootstrap credentials"), "{}", tail(&log, 20));
    assert!(!node.kubelet_conf().exists(), "no kubelet.conf without a certificate");
}

/// A kubeadm node layout whose bootstrap token's group may create CSRs but is not
/// auto-approved, so its client CSR waits for a human: the admin client, the token id and the
/// node. `None` (the case skipped) on a real cluster, whose approver would approve it.
async fn node_awaiting_approval(cluster: &mut Cluster, env: &Env, case: &str) -> Option<(Client, String, KubeadmNode)> {
    let server = cluster.test_server(case)?;
    // A token group that may create CSRs but is not auto-approved: the request waits for a human.
    const GROUP: &str = "system:bootstrappers:manual";
    server.set_authorizer(|req| {
        let manual = req.user.groups.iter().any(|g| g == GROUP);
        if manual && req.resource == "certificatesigningrequests" && req.subresource.is_empty() {
            Decision::Allow
        } else {
            Decision::NoOpinion(String::new())
        }
    });
    let admin = server.client(&User::Admin).await;
    let (id, node) = node_with_token(&admin, cluster, env, GROUP).await;
    Some((admin, id, node))
}

#[tokio::test]
async fn a_denied_csr_is_named_in_the_start_up_error() {
    let Some((env, mut cluster)) = cluster::setup().await else { return };
    let Some((admin, id, node)) =
        node_awaiting_approval(&mut cluster, &env, "denied CSR (the real cluster's approver would approve it)").await
    else {
        return;
    };
    let mut gantry = node.start(&env);

    let requester = format!("system:bootstrap:{id}");
    let csr = eventually("the pending CSR", &gantry, || async { csrs_by(&admin, &requester).await.pop() }).await;
    let name = csr.metadata.name.unwrap();
    assert!(node.cert_dir().join("kubelet-client.key.tmp").exists(), "the pending key is kept while waiting");

    // A restart while the request is pending resumes the wait on the same request.
    gantry.kill();
    let restarted_log = node.root.join("gantry-restarted.log");
    let mut gantry = Gantry::start(&node.args(&env), &restarted_log);
    eventually("the restarted agent waiting on the same CSR", &gantry, || async {
        gantry.log().contains(&format!("requesting a client certificate (TLS bootstrap) csr={name}")).then_some(())
    })
    .await;
    assert_eq!(csrs_by(&admin, &requester).await.len(), 1, "no second CSR after the restart");
    let deny = Patch::Merge(json!({"status": {"conditions": [
        {"type": "Denied", "status": "True", "reason": "NotOurNode", "message": "unknown machine"}
    ]}}));
    Api::<CertificateSigningRequest>::all(admin)
        .patch_subresource("approval", &name, &PatchParams::default(), &deny)
        .await
        .unwrap();
    let log = wait_exit(&mut gantry, &restarted_log, "exit after the denial").await;
    assert!(
        log.contains(&format!("certificate signing request {name} was denied: NotOurNode: unknown machine")),
        "{}",
        tail(&log, 20)
    );
}

#[tokio::test]
async fn an_expired_client_certificate_is_bootstrapped_again_at_start_up() {
    let Some((env, mut cluster)) = cluster::setup().await else { return };
    let Some(server) = cluster.test_server("expired certificate (needs the test signer's short lifetime)") else {
        return;
    };
    server.set_signing_duration(std::time::Duration::from_secs(3));
    let admin = server.client(&User::Admin).await;
    let (id, node) = node_with_token(&admin, &cluster, &env, KUBEADM_GROUP).await;
    let mut gantry = node.start(&env);
    let requester = format!("system:bootstrap:{id}");
    eventually("the first certificate", &gantry, || async {
        node.cert_dir().join("kubelet-client-current.pem").exists().then_some(())
    })
    .await;
    gantry.kill();
    let kubelet_conf = node.kubelet_conf();
    poll("the first certificate to expire", String::new, || async {
        let pem = gantry_agent::api::bootstrap::kubeconfig_client_cert(&kubelet_conf).ok()?;
        gantry_agent::api::bootstrap::cert_valid_at(&pem, jiff::Timestamp::now().as_second()).is_err().then_some(())
    })
    .await;

    let gantry = Gantry::start(&node.args(&env), &node.root.join("gantry-restarted.log"));
    eventually("a second CSR from the bootstrap token", &gantry, || async {
        (csrs_by(&admin, &requester).await.len() == 2).then_some(())
    })
    .await;
    eventually("the restarted agent connected with the new certificate", &gantry, || async {
        gantry.log().contains("connected to the API server").then_some(())
    })
    .await;
}

/// The `kubelet-client-<time>.pem` files in the cert dir.
fn issued_files(cert_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(cert_dir)
        .map(|d| d.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
        .unwrap_or_default();
    names.retain(|n| n.starts_with("kubelet-client-20") && n.ends_with(".pem"));
    names.sort();
    names
}

#[tokio::test]
async fn the_client_certificate_rotates_without_a_restart_while_pod_status_keeps_flowing() {
    use k8s_openapi::api::coordination::v1::Lease;
    let Some((env, mut cluster)) = cluster::setup().await else { return };
    let Some(server) = cluster.test_server("rotation (needs the test signer's short lifetime)") else {
        return;
    };
    const LIFETIME: std::time::Duration = std::time::Duration::from_secs(8);
    server.set_signing_duration(LIFETIME);
    let admin = server.client(&User::Admin).await;
    let (id, node) = node_with_token(&admin, &cluster, &env, KUBEADM_GROUP).await;
    // config.yaml does not set rotateCertificates: with a config file it defaults to true.
    let mut gantry = node.start(&env);
    let current = node.cert_dir().join("kubelet-client-current.pem");
    // Read as soon as the bootstrap certificate is there: on a loaded machine the first pod
    // can take longer to run than the certificate takes to rotate.
    let first_target =
        eventually("the bootstrap certificate", &gantry, || async { std::fs::read_link(&current).ok() }).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let first_pod = format!("rot-a-{id}");
    run_pod(&gantry, &pods, &env.node, &first_pod, "the first pod Running").await;

    // Two renewals, each a CSR of the node's own identity, approved and issued.
    let node_user = format!("system:node:{}", env.node);
    let renewals = eventually("two certificate rotations", &gantry, || async {
        let made = csrs_by(&admin, &node_user).await;
        let issued = made.iter().filter(|c| c.status.as_ref().is_some_and(|s| s.certificate.is_some())).count();
        (issued >= 2 && gantry.log().matches("client certificate rotated").count() >= 2).then_some(made)
    })
    .await;
    for csr in &renewals {
        let name = csr.metadata.name.clone().unwrap();
        assert!(name.starts_with("csr-"), "rotation requests are named by the server, as upstream: {name}");
        assert_eq!(csr.spec.signer_name, "kubernetes.io/kube-apiserver-client-kubelet");
    }
    let files = issued_files(&node.cert_dir());
    assert!(files.len() >= 3, "the bootstrap certificate and two renewals, old ones kept: {files:?}");
    let target = std::fs::read_link(&current).unwrap();
    assert_ne!(target, first_target, "the symlink moved to the new certificate");
    assert!(std::path::Path::new(&first_target).exists(), "the old certificate file is kept");

    // By now the bootstrap certificate has expired: the node still renews its Lease and reports
    // a new pod's status, so new connections use the renewed certificate.
    let first_pem = std::fs::read(&first_target).unwrap();
    poll("the first certificate to expire", String::new, || async {
        gantry_agent::api::bootstrap::cert_valid_at(&first_pem, jiff::Timestamp::now().as_second())
            .is_err()
            .then_some(())
    })
    .await;
    let mark = jiff::Timestamp::now();
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    eventually("the Lease renewed after the first certificate expired", &gantry, || async {
        let renewed = leases.get(&env.node).await.ok()?.spec?.renew_time?.0;
        (renewed > mark).then_some(())
    })
    .await;
    let second_pod = format!("rot-b-{id}");
    run_pod(&gantry, &pods, &env.node, &second_pod, "a pod created after the rotations Running").await;
    assert!(gantry.try_exit().is_none(), "the agent never restarted: {}", tail(&gantry.log(), 30));
    assert!(!gantry.log().contains("stopping the node agent"), "{}", tail(&gantry.log(), 30));
}

/// The node's serving CSRs (signer kubernetes.io/kubelet-serving), oldest first.
async fn serving_csrs(admin: &Client, node: &str) -> Vec<CertificateSigningRequest> {
    let mut made = csrs_by(admin, &format!("system:node:{node}")).await;
    made.retain(|c| c.spec.signer_name == "kubernetes.io/kubelet-serving");
    made.sort_by_key(|c| c.metadata.creation_timestamp.clone().map(|t| t.0));
    made
}

fn issued(csr: &CertificateSigningRequest) -> bool {
    csr.status.as_ref().is_some_and(|s| s.certificate.is_some())
}

/// What an operator does for serving CSRs: `kubectl certificate approve <name>`.
async fn approve(admin: &Client, name: &str) {
    let approve = Patch::Merge(json!({"status": {"conditions": [
        {"type": "Approved", "status": "True", "reason": "E2EApprove", "message": "approved by the tls_bootstrap test"}
    ]}}));
    Api::<CertificateSigningRequest>::all(admin.clone())
        .patch_subresource("approval", name, &PatchParams::default(), &approve)
        .await
        .unwrap();
}

/// The cluster CA (PEM) of a kubeconfig: what the API server trusts the node API with
/// (`--kubelet-certificate-authority` on a kubeadm cluster).
fn cluster_ca(kubeconfig: &Path) -> Vec<u8> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let cluster = kc.clusters[0].cluster.clone().unwrap();
    match (&cluster.certificate_authority_data, &cluster.certificate_authority) {
        (Some(data), _) => STANDARD.decode(data.trim()).unwrap(),
        (None, Some(file)) => std::fs::read(file).unwrap(),
        (None, None) => panic!("the kubeconfig names no CA"),
    }
}

/// The certificate the node API presents on 127.0.0.1:`port` to a client that verifies it
/// against `ca_pem` for the name 127.0.0.1, as the API server does before `kubectl logs`; the
/// handshake error otherwise.
async fn served_certificate(port: u16, ca_pem: &[u8]) -> std::io::Result<Vec<u8>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, tcp).await?;
    Ok(tls.get_ref().1.peer_certificates().unwrap()[0].to_vec())
}

/// (DNS names, IPs) in a certificate or request's subject alternative names.
fn alt_names(san: Option<&x509_parser::extensions::SubjectAlternativeName>) -> (Vec<String>, Vec<String>) {
    use x509_parser::extensions::GeneralName;
    let (mut dns, mut ips) = (Vec::new(), Vec::new());
    for name in san.map(|s| s.general_names.as_slice()).unwrap_or_default() {
        match name {
            GeneralName::DNSName(d) => dns.push(d.to_string()),
            GeneralName::IPAddress(b) if b.len() == 4 => {
                ips.push(std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*b).unwrap()).to_string())
            }
            _ => {}
        }
    }
    (dns, ips)
}

#[tokio::test]
async fn the_node_api_serves_a_cluster_issued_certificate_once_approved_and_rotates_it() {
    use x509_parser::prelude::FromDer;
    let Some((env, mut cluster)) = cluster::setup().await else { return };
    // On the test server, short lifetimes make the serving certificate rotate during the test
    // (the client certificate rotates too; the rotation test covers it).
    const LIFETIME: std::time::Duration = std::time::Duration::from_secs(20);
    let rotates = match cluster.test_server("serving certificate rotation (needs the test signer's short lifetime)") {
        Some(server) => {
            server.set_signing_duration(LIFETIME);
            true
        }
        None => false,
    };
    let admin = cluster.admin().await;
    let (id, node) = node_with_token(&admin, &cluster, &env, KUBEADM_GROUP).await;
    let (port, healthz_port) = (common::node_api::free_port(), common::node_api::free_port());
    let config = node.root.join("var/lib/kubelet/config.yaml");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "enableServer: false\n",
        &format!("serverTLSBootstrap: true\naddress: 127.0.0.1\nport: {port}\nhealthzPort: {healthz_port}\n"),
    );
    std::fs::write(&config, text).unwrap();
    let mut args = node.args(&env);
    args.push("--node-ip=127.0.0.1".into());
    let mut gantry = Gantry::start(&args, &node.log());

    // The request: the node's own identity, upstream's signer, usages, subject and names.
    let csr = eventually("a serving CSR", &gantry, || async { serving_csrs(&admin, &env.node).await.pop() }).await;
    let name = csr.metadata.name.clone().unwrap();
    assert_eq!(csr.spec.usages.clone().unwrap(), ["digital signature", "server auth"]);
    let (_, pem) = x509_parser::pem::parse_x509_pem(&csr.spec.request.0).unwrap();
    let (_, request) = x509_parser::certification_request::X509CertificationRequest::from_der(&pem.contents).unwrap();
    let info = &request.certification_request_info;
    assert_eq!(info.subject.to_string(), format!("O=system:nodes, CN=system:node:{}", env.node));
    let san = request.requested_extensions().into_iter().flatten().find_map(|e| match e {
        x509_parser::extensions::ParsedExtension::SubjectAlternativeName(san) => Some(san),
        _ => None,
    });
    assert_eq!(
        alt_names(san),
        (vec![env.node.clone()], vec!["127.0.0.1".to_string()]),
        "the node's Hostname and InternalIP"
    );

    // Until someone approves it, the secure port listens but completes no handshake.
    let plain = reqwest::Client::builder().no_proxy().build().unwrap();
    eventually("the healthz port to answer", &gantry, || async {
        (plain.get(format!("http://127.0.0.1:{healthz_port}/healthz")).send().await.ok()?.status() == 200).then_some(())
    })
    .await;
    let ca = cluster_ca(&cluster.admin_kubeconfig(&env.ctd.dir()));
    tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("the secure port listens");
    let refused = served_certificate(port, &ca).await;
    assert!(refused.is_err(), "no TLS before the serving certificate is approved");
    assert!(!issued(&serving_csrs(&admin, &env.node).await[0]), "serving CSRs wait for approval");
    assert!(!node.cert_dir().join("kubelet.crt").exists(), "no self-signed fallback");

    // Approved, as `kubectl certificate approve`: the cluster-issued certificate is served.
    approve(&admin, &name).await;
    let der = eventually("the issued serving certificate served", &gantry, || async {
        served_certificate(port, &ca).await.ok()
    })
    .await;
    let (_, served) = x509_parser::parse_x509_certificate(&der).unwrap();
    let (_, ca_block) = x509_parser::pem::parse_x509_pem(&ca).unwrap();
    let ca_cert = ca_block.parse_x509().unwrap();
    assert_eq!(served.issuer(), ca_cert.subject(), "issued by the cluster CA");
    let san = served.subject_alternative_name().unwrap().map(|s| s.value);
    assert_eq!(alt_names(san), (vec![env.node.clone()], vec!["127.0.0.1".to_string()]));
    let current = std::fs::read_link(node.cert_dir().join("kubelet-server-current.pem")).unwrap();
    assert!(current.file_name().unwrap().to_str().unwrap().starts_with("kubelet-server-20"), "{current:?}");

    if rotates {
        // Before the first certificate expires a second request comes; approved, its
        // certificate replaces the first on the same, never restarted, process.
        let first_serial = served.raw_serial().to_vec();
        let renewal = eventually("a second serving CSR", &gantry, || async {
            let made = serving_csrs(&admin, &env.node).await;
            (made.len() >= 2).then(|| made[1].metadata.name.clone().unwrap())
        })
        .await;
        approve(&admin, &renewal).await;
        eventually("the renewed serving certificate served", &gantry, || async {
            let der = served_certificate(port, &ca).await.ok()?;
            let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
            (cert.raw_serial() != first_serial.as_slice()).then_some(())
        })
        .await;
        assert!(gantry.log().contains("serving certificate rotated"), "{}", tail(&gantry.log(), 30));
        assert!(gantry.try_exit().is_none(), "the agent never restarted: {}", tail(&gantry.log(), 30));
    }
    let _ = Api::<Secret>::namespaced(admin.clone(), "kube-system")
        .delete(&format!("bootstrap-token-{id}"), &DeleteParams::default())
        .await;
    gantry.kill();
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn static_pods_run_while_the_bootstrap_csr_waits_for_approval() {
    let Some((env, mut cluster)) = cluster::setup().await else { return };
    let Some((admin, id, node)) = node_awaiting_approval(
        &mut cluster,
        &env,
        "a pending bootstrap CSR (the real cluster's approver would approve it)",
    )
    .await
    else {
        return;
    };
    let manifest = pod_yaml("early", "while true; do sleep 1; done", "");
    std::fs::write(node.root.join("etc/kubernetes/manifests/early.yaml"), manifest).unwrap();
    let gantry = node.start(&env);

    // The static pod runs on containerd while the node's client certificate is still pending.
    let pod = format!("early-{}", env.node);
    let requester = format!("system:bootstrap:{id}");
    let csr =
        eventually("the pending bootstrap CSR", &gantry, || async { csrs_by(&admin, &requester).await.pop() }).await;
    let running = eventually("the static pod running before the CSR is approved", &gantry, || async {
        env.running(&pod).await.pop()
    })
    .await;
    let csr = Api::<CertificateSigningRequest>::all(admin.clone()).get(&csr.metadata.name.unwrap()).await.unwrap();
    assert!(!issued(&csr), "the CSR is still pending");
    assert!(!node.kubelet_conf().exists(), "no kubelet.conf yet");

    // Approved: the node joins, registers and mirrors the static pod, which it adopts as it runs.
    approve(&admin, &csr.metadata.name.unwrap()).await;
    let nodes: Api<Node> = Api::all(admin.clone());
    eventually("the Node registered after the approval", &gantry, || async {
        nodes.get_opt(&env.node).await.ok().flatten()
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let mirror = eventually("the mirror pod", &gantry, || async { pods.get_opt(&pod).await.ok().flatten() }).await;
    let annotations = mirror.metadata.annotations.unwrap_or_default();
    assert!(annotations.contains_key("kubernetes.io/config.mirror"), "{annotations:?}");
    let now = env.running(&pod).await;
    assert_eq!(now.iter().map(|c| &c.id).collect::<Vec<_>>(), [&running.id], "the same container, not restarted");
}
