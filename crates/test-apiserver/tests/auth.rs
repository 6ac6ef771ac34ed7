//! Authentication (tokens, token files, client certificates), the Node authorizer and
//! NodeRestriction, TokenRequest, TokenReview and SubjectAccessReview hooks.

mod common;

use common::{RawClient, create_node, create_pod, pod_json, start, status};
use gantry_test_apiserver::{Decision, TestApiServer, User, UserInfo};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenReview};
use k8s_openapi::api::authorization::v1::{SelfSubjectAccessReview, SubjectAccessReview};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccount,
};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, VolumeAttachment};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn node_client_user(n: &str) -> User {
    User::Node(n.to_string())
}

#[tokio::test]
async fn bad_and_expired_tokens_get_401() {
    let (server, _admin) = start().await;
    for user in [User::Token("garbage".into()), User::ExpiredToken] {
        let raw = RawClient::new(&server, &user).await;
        let (code, body) = raw.get("/api/v1/namespaces").await;
        assert_eq!(code, 401);
        assert_eq!(
            body,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
        );
    }
}

#[tokio::test]
async fn token_file_kubeconfig() {
    let (server, _admin) = start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = server.kubeconfig_with_token_file(dir.path(), &User::Admin);
    assert!(std::fs::read_to_string(&path).unwrap().contains("tokenFile"));
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
    let client = Client::try_from(config).unwrap();
    Api::<Namespace>::all(client).get("default").await.unwrap();
    // The plain kubeconfig works too, read back from disk.
    let path = server.kubeconfig(dir.path(), &User::Node("n1".into()));
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let client =
        Client::try_from(kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap()).unwrap();
    create_node(&client, "n1").await;
}

#[tokio::test]
async fn client_certificates() {
    let (server, _admin) = start().await;
    let admin_cert =
        server.client(&User::ClientCert { cn: "alice".into(), groups: vec!["system:masters".into()] }).await;
    Api::<Pod>::all(admin_cert).list(&ListParams::default()).await.unwrap();

    let plain = server.client(&User::ClientCert { cn: "bob".into(), groups: vec!["devs".into()] }).await;
    let e = status(Api::<Pod>::namespaced(plain.clone(), "default").list(&ListParams::default()).await.unwrap_err());
    assert_eq!(e.code, 403);
    assert_eq!(
        e.message,
        "pods is forbidden: User \"bob\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
    );
    let review: SelfSubjectAccessReview = serde_json::from_value(
        json!({"spec": {"resourceAttributes": {"verb": "list", "resource": "pods", "namespace": "default"}}}),
    )
    .unwrap();
    let answer = Api::<SelfSubjectAccessReview>::all(plain).create(&PostParams::default(), &review).await.unwrap();
    assert!(!answer.status.unwrap().allowed);

    // A node certificate is a node identity.
    let node =
        server.client(&User::ClientCert { cn: "system:node:n9".into(), groups: vec!["system:nodes".into()] }).await;
    create_node(&node, "n9").await;
    assert_eq!(status(Api::<Node>::all(node).get("other").await.unwrap_err()).code, 403);
}

#[tokio::test]
async fn node_may_manage_its_own_node_only() {
    let (server, admin) = start().await;
    let node = server.client(&node_client_user("n1")).await;
    let nodes: Api<Node> = Api::all(node.clone());
    create_node(&node, "n1").await;
    let other: Node = serde_json::from_value(json!({"metadata": {"name": "n2"}})).unwrap();
    let e = status(nodes.create(&PostParams::default(), &other).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    assert_eq!(e.message, "nodes \"n2\" is forbidden: node \"n1\" is not allowed to modify node \"n2\"");
    create_node(&admin, "n2").await;

    let heartbeat = Patch::Strategic(json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}));
    nodes.patch_status("n1", &PatchParams::default(), &heartbeat).await.unwrap();
    assert_eq!(status(nodes.patch_status("n2", &PatchParams::default(), &heartbeat).await.unwrap_err()).code, 403);
    let e = status(nodes.get("n2").await.unwrap_err());
    assert_eq!(
        e.message,
        "nodes \"n2\" is forbidden: User \"system:node:n1\" cannot get resource \"nodes\" in API group \"\" at the cluster scope: node 'n1' cannot read 'n2', only its own Node object"
    );
    assert_eq!(status(nodes.list(&ListParams::default()).await.unwrap_err()).code, 403);
    assert_eq!(nodes.list(&ListParams::default().fields("metadata.name=n1")).await.unwrap().items.len(), 1);
    // NodeRestriction: no taint changes, no restricted labels.
    let taint = Patch::Merge(json!({"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}));
    assert_eq!(status(nodes.patch("n1", &PatchParams::default(), &taint).await.unwrap_err()).code, 403);
    let label = Patch::Merge(json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}));
    assert_eq!(status(nodes.patch("n1", &PatchParams::default(), &label).await.unwrap_err()).code, 403);
    let ok_label = Patch::Merge(json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "z1", "custom": "x"}}}));
    nodes.patch("n1", &PatchParams::default(), &ok_label).await.unwrap();
    assert_eq!(status(nodes.delete("n1", &DeleteParams::default()).await.unwrap_err()).code, 403);
}

#[tokio::test]
async fn node_pod_access() {
    let (server, admin) = start().await;
    let node = server.client(&node_client_user("n1")).await;
    let n1 = create_node(&node, "n1").await;
    create_pod(&admin, "default", "mine", Some("n1")).await;
    create_pod(&admin, "default", "theirs", Some("n2")).await;
    let pods: Api<Pod> = Api::all(node.clone());
    let e = status(pods.list(&ListParams::default()).await.unwrap_err());
    assert!(e.message.ends_with("can only list/watch pods with spec.nodeName field selector"), "{}", e.message);
    let mine = pods.list(&ListParams::default().fields("spec.nodeName=n1")).await.unwrap();
    assert_eq!(mine.items.len(), 1);
    let ns_pods: Api<Pod> = Api::namespaced(node.clone(), "default");
    ns_pods.get("mine").await.unwrap();
    assert_eq!(status(ns_pods.get("theirs").await.unwrap_err()).code, 403);

    // Status of its own pods only; no spec updates.
    let st = Patch::Merge(json!({"status": {"phase": "Running"}}));
    ns_pods.patch_status("mine", &PatchParams::default(), &st).await.unwrap();
    let e = status(ns_pods.patch_status("theirs", &PatchParams::default(), &st).await.unwrap_err());
    assert_eq!(e.code, 403);
    assert_eq!(
        status(
            ns_pods
                .patch("mine", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})))
                .await
                .unwrap_err()
        )
        .code,
        403
    );

    // Deletes of its own pods only.
    assert_eq!(status(ns_pods.delete("theirs", &DeleteParams::default()).await.unwrap_err()).code, 403);
    ns_pods.delete("mine", &DeleteParams::default()).await.unwrap();

    // Mirror pods: annotation, nodeName and a controller owner reference to its Node.
    let mut mirror = pod_json("static-web-n1", Some("n1"));
    mirror["metadata"]["annotations"] =
        json!({"kubernetes.io/config.mirror": "abc", "kubernetes.io/config.source": "file"});
    mirror["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": n1.metadata.uid.clone().unwrap(), "controller": true}]);
    mirror["spec"].as_object_mut().unwrap().remove("automountServiceAccountToken");
    let created =
        ns_pods.create(&PostParams::default(), &serde_json::from_value(mirror.clone()).unwrap()).await.unwrap();
    assert_eq!(created.spec.unwrap().service_account_name, None, "mirror pods get no service account");
    let mut plain = pod_json("not-mirror", Some("n1"));
    plain["metadata"]["ownerReferences"] = mirror["metadata"]["ownerReferences"].clone();
    let e = status(ns_pods.create(&PostParams::default(), &serde_json::from_value(plain).unwrap()).await.unwrap_err());
    assert!(e.message.contains("can only create mirror pods"), "{}", e.message);
    let mut elsewhere = mirror.clone();
    elsewhere["metadata"]["name"] = json!("static-elsewhere");
    elsewhere["spec"]["nodeName"] = json!("n2");
    assert_eq!(
        status(ns_pods.create(&PostParams::default(), &serde_json::from_value(elsewhere).unwrap()).await.unwrap_err())
            .code,
        403
    );
}

#[tokio::test]
async fn node_leases_events_secrets_and_tokens() {
    let (server, admin) = start().await;
    let node = server.client(&node_client_user("n1")).await;
    create_node(&node, "n1").await;
    let leases: Api<Lease> = Api::namespaced(node.clone(), "kube-node-lease");
    let lease = |n: &str| {
        serde_json::from_value::<Lease>(json!({"metadata": {"name": n}, "spec": {"holderIdentity": n}})).unwrap()
    };
    let mut own = leases.create(&PostParams::default(), &lease("n1")).await.unwrap();
    own.spec.as_mut().unwrap().lease_duration_seconds = Some(40);
    leases.replace("n1", &PostParams::default(), &own).await.unwrap();
    assert_eq!(status(leases.create(&PostParams::default(), &lease("n2")).await.unwrap_err()).code, 403);
    let elsewhere: Api<Lease> = Api::namespaced(node.clone(), "default");
    assert_eq!(status(elsewhere.create(&PostParams::default(), &lease("n1")).await.unwrap_err()).code, 403);

    let events: Api<Event> = Api::namespaced(node.clone(), "default");
    let ev: Event = serde_json::from_value(json!({"metadata": {"name": "n1.123"}, "involvedObject": {"kind": "Node", "name": "n1"}, "reason": "Starting", "message": "hi"})).unwrap();
    events.create(&PostParams::default(), &ev).await.unwrap();

    // Secrets and service account tokens only through a pod bound to the node.
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), "default");
    for name in ["used", "unused"] {
        let s: Secret = serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {"k": "v"}})).unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    Api::<ServiceAccount>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "runner"}})).unwrap())
        .await
        .unwrap();
    let mut p = pod_json("user", Some("n1"));
    p["spec"]["volumes"] = json!([{"name": "s", "secret": {"secretName": "used"}}]);
    p["spec"]["serviceAccountName"] = json!("runner");
    let pod = Api::<Pod>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &serde_json::from_value(p).unwrap())
        .await
        .unwrap();
    let node_secrets: Api<Secret> = Api::namespaced(node.clone(), "default");
    assert_eq!(node_secrets.get("used").await.unwrap().data.unwrap()["k"].0, b"v");
    let e = status(node_secrets.get("unused").await.unwrap_err());
    assert!(e.message.ends_with("no relationship found between node 'n1' and this object"), "{}", e.message);
    assert_eq!(node_secrets.list(&ListParams::default().fields("metadata.name=used")).await.unwrap().items.len(), 1);
    assert_eq!(status(node_secrets.list(&ListParams::default()).await.unwrap_err()).code, 403);

    let sas: Api<ServiceAccount> = Api::namespaced(node.clone(), "default");
    let bound: TokenRequest = serde_json::from_value(json!({"spec": {"audiences": ["api"], "boundObjectRef": {
        "apiVersion": "v1", "kind": "Pod", "name": "user", "uid": pod.metadata.uid.clone().unwrap()}}}))
    .unwrap();
    let tr: TokenRequest = sas.create_subresource("token", "runner", &PostParams::default(), &bound).await.unwrap();
    assert!(!tr.status.unwrap().token.is_empty());
    let unbound: TokenRequest = serde_json::from_value(json!({"spec": {"audiences": ["api"]}})).unwrap();
    let e = status(
        sas.create_subresource::<_, TokenRequest>("token", "runner", &PostParams::default(), &unbound)
            .await
            .unwrap_err(),
    );
    assert!(e.message.ends_with("node requested token not bound to a pod"), "{}", e.message);
    let e = status(
        sas.create_subresource::<_, TokenRequest>("token", "default", &PostParams::default(), &bound)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 403, "no pod on n1 uses the default service account");
}

#[tokio::test]
async fn token_request_and_token_review() {
    let (server, admin) = start().await;
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    let req: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": ["gantry"], "expirationSeconds": 3600}})).unwrap();
    let tr: TokenRequest = sas.create_subresource("token", "default", &PostParams::default(), &req).await.unwrap();
    let status_ = tr.status.unwrap();
    let token = status_.token;
    assert!(status_.expiration_timestamp.0 > k8s_openapi::jiff::Timestamp::now());
    assert_eq!(token.split('.').count(), 3, "a JWT");

    let reviews: Api<TokenReview> = Api::all(admin.clone());
    let review = |token: &str, aud: &[&str]| -> TokenReview {
        serde_json::from_value(json!({"spec": {"token": token, "audiences": aud}})).unwrap()
    };
    let r = reviews.create(&PostParams::default(), &review(&token, &["gantry"])).await.unwrap().status.unwrap();
    assert_eq!(r.authenticated, Some(true));
    let user = r.user.unwrap();
    assert_eq!(user.username.as_deref(), Some("system:serviceaccount:default:default"));
    assert!(user.groups.unwrap().contains(&"system:serviceaccounts:default".to_string()));
    assert_eq!(r.audiences, Some(vec!["gantry".to_string()]));
    let r = reviews.create(&PostParams::default(), &review(&token, &["other"])).await.unwrap().status.unwrap();
    assert_ne!(r.authenticated, Some(true));
    // The admin token authenticates by default.
    let r = reviews.create(&PostParams::default(), &review(server.admin_token(), &[])).await.unwrap().status.unwrap();
    assert_eq!(r.authenticated, Some(true));

    // Validation: at least ten minutes.
    let short: TokenRequest = serde_json::from_value(json!({"spec": {"expirationSeconds": 10}})).unwrap();
    let e = status(
        sas.create_subresource::<_, TokenRequest>("token", "default", &PostParams::default(), &short)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(e.message.contains("may not specify a duration less than 10 minutes"), "{}", e.message);
    assert_eq!(
        status(
            sas.create_subresource::<_, TokenRequest>("token", "ghost", &PostParams::default(), &req)
                .await
                .unwrap_err()
        )
        .code,
        404
    );

    // A token for the API audience authenticates API requests (and is then authorized).
    let api_req: TokenRequest = serde_json::from_value(json!({"spec": {}})).unwrap();
    let api_token = sas
        .create_subresource::<_, TokenRequest>("token", "default", &PostParams::default(), &api_req)
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let sa_client = server.client(&User::Token(api_token)).await;
    let e = status(Api::<ConfigMap>::namespaced(sa_client, "default").list(&ListParams::default()).await.unwrap_err());
    assert_eq!(e.code, 403, "authenticated, not authorized");
    assert!(e.message.contains("system:serviceaccount:default:default"), "{}", e.message);
}

#[tokio::test]
async fn hooks_answer_reviews_and_requests() {
    let server = TestApiServer::start().await;
    let admin = server.client(&User::Admin).await;
    let sar = |user: &str| -> SubjectAccessReview {
        serde_json::from_value(json!({"spec": {"user": user, "resourceAttributes": {"verb": "get", "resource": "nodes", "subresource": "proxy", "name": "n1"}}})).unwrap()
    };
    let sars: Api<SubjectAccessReview> = Api::all(admin.clone());
    assert!(!sars.create(&PostParams::default(), &sar("kube-apiserver-client")).await.unwrap().status.unwrap().allowed);
    let masters: SubjectAccessReview =
        serde_json::from_value(json!({"spec": {"user": "x", "groups": ["system:masters"], "resourceAttributes": {"verb": "get", "resource": "nodes"}}})).unwrap();
    assert!(sars.create(&PostParams::default(), &masters).await.unwrap().status.unwrap().allowed);

    server.set_authorizer(|req| {
        if req.user.username == "kube-apiserver-client" || (req.user.username == "carol" && req.verb == "list") {
            Decision::Allow
        } else {
            Decision::NoOpinion(String::new())
        }
    });
    assert!(sars.create(&PostParams::default(), &sar("kube-apiserver-client")).await.unwrap().status.unwrap().allowed);

    server.set_token_review(|token, _aud| {
        (token == "carol-token").then(|| UserInfo {
            username: "carol".into(),
            groups: vec!["system:authenticated".into()],
            ..Default::default()
        })
    });
    let carol = server.client(&User::Token("carol-token".into())).await;
    Api::<ConfigMap>::namespaced(carol.clone(), "default").list(&ListParams::default()).await.unwrap();
    assert_eq!(
        status(Api::<ConfigMap>::namespaced(carol, "default").get("kube-root-ca.crt").await.unwrap_err()).code,
        403
    );
    let reviews: Api<TokenReview> = Api::all(admin);
    let r: TokenReview = serde_json::from_value(json!({"spec": {"token": "carol-token"}})).unwrap();
    let answer = reviews.create(&PostParams::default(), &r).await.unwrap().status.unwrap();
    assert_eq!(answer.user.unwrap().username.as_deref(), Some("carol"));

    server.add_token(
        "static",
        UserInfo { username: "dave".into(), groups: vec!["system:masters".into()], ..Default::default() },
    );
    let dave = server.client(&User::Token("static".into())).await;
    Api::<Namespace>::all(dave).list(&ListParams::default()).await.unwrap();
}

/// As kube-apiserver: authorization comes before routing, so a resource that does not exist
/// (a CRD not installed yet) is 403 for a caller not allowed to use it, and 404 otherwise; the
/// authorizer hook sees the request either way.
#[tokio::test]
async fn unknown_resources_are_authorized_before_they_are_not_found() {
    let (server, _admin) = start().await;
    let path = "/apis/example.dev/v1/widgets";
    let node = RawClient::new(&server, &node_client_user("n1")).await;
    assert_eq!(node.get(path).await.0, 403);
    let admin = RawClient::new(&server, &User::Admin).await;
    assert_eq!(admin.get(path).await.0, 404);

    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = asked.clone();
    server.set_authorizer(move |req| {
        if req.api_group == "example.dev" && req.resource == "widgets" && req.verb == "list" {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Decision::Allow
        } else {
            Decision::NoOpinion(String::new())
        }
    });
    assert_eq!(node.get(path).await.0, 404);
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn node_csi_objects() {
    let (server, admin) = start().await;
    let node = server.client(&node_client_user("n1")).await;
    create_node(&node, "n1").await;

    // CSINode: its own only, written by the node.
    let csi_nodes: Api<CSINode> = Api::all(node.clone());
    let csi_node = |n: &str| {
        serde_json::from_value::<CSINode>(json!({"metadata": {"name": n}, "spec": {"drivers": [
            {"name": "d.example.com", "nodeID": n, "topologyKeys": ["zone"], "allocatable": {"count": 3}}]}}))
        .unwrap()
    };
    let mut own = csi_nodes.create(&PostParams::default(), &csi_node("n1")).await.unwrap();
    own.spec.drivers.clear();
    let own = csi_nodes.replace("n1", &PostParams::default(), &own).await.unwrap();
    assert!(own.spec.drivers.is_empty());
    let e = status(csi_nodes.create(&PostParams::default(), &csi_node("n2")).await.unwrap_err());
    assert_eq!(e.code, 403);
    assert!(e.message.ends_with("can only access CSINode with the same name as the requesting node"), "{}", e.message);

    // CSIDriver: read by any node, with the API's defaults.
    let drivers: Api<CSIDriver> = Api::all(admin.clone());
    let d: CSIDriver =
        serde_json::from_value(json!({"metadata": {"name": "d.example.com"}, "spec": {"podInfoOnMount": true}}))
            .unwrap();
    drivers.create(&PostParams::default(), &d).await.unwrap();
    let read = Api::<CSIDriver>::all(node.clone()).get("d.example.com").await.unwrap();
    assert_eq!(read.spec.attach_required, Some(true));
    assert_eq!(read.spec.pod_info_on_mount, Some(true));
    assert_eq!(read.spec.fs_group_policy.as_deref(), Some("ReadWriteOnceWithFSType"));
    assert_eq!(read.spec.volume_lifecycle_modes, Some(vec!["Persistent".to_string()]));
    assert_eq!(
        status(
            Api::<CSIDriver>::all(node.clone()).delete("d.example.com", &DeleteParams::default()).await.unwrap_err()
        )
        .code,
        403
    );

    // VolumeAttachment: the node may get those to itself, nothing else; status is a subresource.
    let attachments: Api<VolumeAttachment> = Api::all(admin.clone());
    // Upstream's names: `csi-` and a SHA-256 in hex, longer than a DNS label may be.
    let mine = format!("csi-{}", "a".repeat(64));
    for (name, to) in [(mine.as_str(), "n1"), ("csi-theirs", "n2")] {
        let va: VolumeAttachment = serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
            "attacher": "d.example.com", "nodeName": to, "source": {"persistentVolumeName": "pv1"}}}))
        .unwrap();
        let created = attachments.create(&PostParams::default(), &va).await.unwrap();
        assert!(!created.status.unwrap().attached, "a new attachment is not attached");
    }
    let attached = Patch::Merge(json!({"status": {"attached": true, "attachmentMetadata": {"k": "v"}}}));
    attachments.patch_status(&mine, &PatchParams::default(), &attached).await.unwrap();
    let node_attachments: Api<VolumeAttachment> = Api::all(node.clone());
    let mine = node_attachments.get(&mine).await.unwrap();
    assert!(mine.status.as_ref().unwrap().attached);
    assert_eq!(mine.status.unwrap().attachment_metadata.unwrap()["k"], "v");
    let e = status(node_attachments.get("csi-theirs").await.unwrap_err());
    assert!(e.message.ends_with("no relationship found between node 'n1' and this object"), "{}", e.message);
    assert_eq!(status(node_attachments.list(&ListParams::default()).await.unwrap_err()).code, 403);
}

#[tokio::test]
async fn node_reads_the_secrets_a_csi_volume_of_its_pods_names() {
    let (server, admin) = start().await;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), "default");
    for name in ["stage", "unrelated"] {
        let s: Secret = serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {"k": "v"}})).unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pv1"},
        "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"], "csi": {
            "driver": "d.example.com", "volumeHandle": "h1",
            "nodeStageSecretRef": {"name": "stage", "namespace": "default"}}},
    }))
    .unwrap();
    Api::<PersistentVolume>::all(admin.clone()).create(&PostParams::default(), &pv).await.unwrap();
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv1", "resources": {"requests": {"storage": "1Mi"}}},
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    let server_node = server.client(&node_client_user("n1")).await;
    let node_secrets: Api<Secret> = Api::namespaced(server_node.clone(), "default");
    // No pod of the node uses the claim yet: no relationship.
    assert_eq!(status(node_secrets.get("stage").await.unwrap_err()).code, 403);
    let mut pod = pod_json("user", Some("n1"));
    pod["spec"]["volumes"] = json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]);
    let pod: Pod = serde_json::from_value(pod).unwrap();
    Api::<Pod>::namespaced(admin.clone(), "default").create(&PostParams::default(), &pod).await.unwrap();
    assert_eq!(node_secrets.get("stage").await.unwrap().data.unwrap()["k"].0, b"v");
    let e = status(node_secrets.get("unrelated").await.unwrap_err());
    assert!(e.message.ends_with("no relationship found between node 'n1' and this object"), "{}", e.message);
}
