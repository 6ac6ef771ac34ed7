//! End-to-end, cluster mode: API-backed volumes (projected service-account token, ConfigMap,
//! Secret, downward API) and env from ConfigMaps, on the real containerd. Containers print what
//! they see; the tests read it from the pod's container log.

mod common;

use common::cluster;
use common::{container_output, eventually, pod_yaml};
use gantry_vocab::quantity;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

/// A pod bound to the node; `extra_spec` is YAML under `spec:` (two-space indent), `container`
/// YAML appended to the container (four-space indent).
fn pod(node: &str, name: &str, command: &str, extra_spec: &str, container: &str) -> Pod {
    let spec = format!("  nodeName: {node}\n  terminationGracePeriodSeconds: 1\n{extra_spec}");
    let yaml = format!("{}{container}", pod_yaml(name, command, &spec));
    serde_yaml_ng::from_str(&yaml).unwrap()
}

#[tokio::test]
async fn default_service_account_volume_gives_a_valid_token_and_ca() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let admin = cluster.admin().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let dir = "/var/run/secrets/kubernetes.io/serviceaccount";
    let command = format!(
        "echo TOKEN=$(cat {dir}/token); echo NS=$(cat {dir}/namespace); echo MOUNT=$(grep ' {dir} ' /proc/mounts); \
         cat {dir}/ca.crt; sleep 3600"
    );
    // The pod's memory limit bounds the token's tmpfs, as upstream sizes memory-backed volumes.
    let limits = "    resources:\n      limits:\n        memory: 48Mi\n";
    let created = pods.create(&PostParams::default(), &pod(&env.node, "sa", &command, "", limits)).await.unwrap();
    let volumes = created.spec.unwrap().volumes.unwrap_or_default();
    assert!(volumes.iter().any(|v| v.name.starts_with("kube-api-access-")), "admission injected the volume");

    let out = eventually("the token and ca.crt in the container", &gantry, || async {
        let out = container_output(&env, "sa");
        out.contains("END CERTIFICATE").then_some(out)
    })
    .await;
    let token = out.lines().find_map(|l| l.strip_prefix("TOKEN=")).unwrap().trim().to_string();
    assert!(out.contains("NS=default"), "{out}");
    let mount = out.lines().find_map(|l| l.strip_prefix("MOUNT=")).unwrap();
    assert!(mount.starts_with("tmpfs ") && mount.contains("size=49152k"), "a tmpfs of the pod's 48Mi: {mount}");
    let root_ca: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    let ca = root_ca.get("kube-root-ca.crt").await.unwrap().data.unwrap()["ca.crt"].clone();
    assert!(out.contains(ca.lines().nth(1).unwrap()), "ca.crt is the cluster's root CA");

    let reviews: Api<TokenReview> = Api::all(admin);
    let review = TokenReview { spec: TokenReviewSpec { token: Some(token), audiences: None }, ..Default::default() };
    let status = reviews.create(&PostParams::default(), &review).await.unwrap().status.unwrap();
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    assert_eq!(status.user.unwrap().username.as_deref(), Some("system:serviceaccount:default:default"));
    cluster.cleanup(&env.node).await;
}

/// A pod without limits sees the node's allocatable (capacity − reservations − the hard
/// eviction threshold, as the Node status reports it) through the downward API's limits, and
/// its memory emptyDir is sized to it, as upstream does.
#[tokio::test]
async fn missing_limits_and_memory_volume_size_follow_node_allocatable() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let kubeconfig = cluster.node_kubeconfig(&env.ctd.dir(), &env.node);
    let gantry = env.kubelet(&[
        &format!("--kubeconfig={}", kubeconfig.display()),
        "--system-reserved=cpu=100m,memory=256Mi",
        "--eviction-hard=memory.available<100Mi",
    ]);
    let admin = cluster.admin().await;
    let spec =
        "  automountServiceAccountToken: false\n  volumes:\n  - name: scratch\n    emptyDir:\n      medium: Memory\n";
    let container = "    volumeMounts:\n    - name: scratch\n      mountPath: /scratch\n    env:\n\
        \x20   - name: MEM\n      valueFrom:\n        resourceFieldRef:\n          resource: limits.memory\n\
        \x20   - name: CPU\n      valueFrom:\n        resourceFieldRef:\n          resource: limits.cpu\n          divisor: 1m\n";
    let command = "echo MEM=$MEM; echo CPU=$CPU; echo MOUNT=$(grep ' /scratch ' /proc/mounts); sleep 3600";
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    pods.create(&PostParams::default(), &pod(&env.node, "alloc", command, spec, container)).await.unwrap();
    let out = eventually("the pod's view of its limits", &gantry, || async {
        let out = container_output(&env, "alloc");
        out.contains("MOUNT=").then_some(out)
    })
    .await;
    let nodes: Api<Node> = Api::all(admin);
    let allocatable = nodes.get(&env.node).await.unwrap().status.unwrap().allocatable.unwrap();
    let memory = quantity::parse_units(&allocatable["memory"].0).unwrap();
    let cpu = quantity::parse_milli(&allocatable["cpu"].0).unwrap();
    let value = |key: &str| out.lines().find_map(|l| l.strip_prefix(key)).unwrap_or_else(|| panic!("{key} in {out}"));
    assert_eq!(value("MEM=").parse::<i128>().unwrap(), memory, "limits.memory defaults to the Node's allocatable");
    assert_eq!(value("CPU=").parse::<i128>().unwrap(), cpu, "limits.cpu defaults to the Node's allocatable");
    // tmpfs rounds its size up to whole pages and shows it in KiB.
    let mount = value("MOUNT=");
    let size = mount.split(&[' ', ',']).find_map(|o| o.strip_prefix("size=")?.strip_suffix('k')?.parse::<i128>().ok());
    let size = size.unwrap_or_else(|| panic!("a size= option: {mount}")) * 1024;
    assert!((memory..memory + 4096).contains(&size), "the tmpfs of {size} bytes is the allocatable {memory}: {mount}");
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn config_map_change_appears_in_the_mounted_file() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    // The contents follow at the next pod sync: with the default 1m that would be most of
    // the wait's deadline, so the flag also shows that `--sync-frequency` drives the resync.
    let kubeconfig = cluster.node_kubeconfig(&env.ctd.dir(), &env.node);
    let gantry = env.kubelet(&[&format!("--kubeconfig={}", kubeconfig.display()), "--sync-frequency=3s"]);
    let admin = cluster.admin().await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    let cm: ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "live"}, "data": {"greeting": "hello-v1"}}))
            .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let spec = "  automountServiceAccountToken: false\n  volumes:\n  - name: cfg\n    configMap:\n      name: live\n";
    let mounts = "    volumeMounts:\n    - name: cfg\n      mountPath: /cfg\n";
    let command = "while true; do echo SEEN=$(cat /cfg/greeting); sleep 1; done";
    let pods: Api<Pod> = Api::namespaced(admin, "default");
    pods.create(&PostParams::default(), &pod(&env.node, "cfgpod", command, spec, mounts)).await.unwrap();
    eventually("the first value", &gantry, || async {
        container_output(&env, "cfgpod").contains("SEEN=hello-v1").then_some(())
    })
    .await;

    let patch = serde_json::json!({"data": {"greeting": "hello-v2"}});
    cms.patch("live", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    eventually("the updated value", &gantry, || async {
        container_output(&env, "cfgpod").contains("SEEN=hello-v2").then_some(())
    })
    .await;
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn env_from_a_missing_key_is_a_create_container_config_error() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let admin = cluster.admin().await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    let cm: ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "settings"}, "data": {"present": "1"}}))
            .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let container = "    env:\n    - name: X\n      valueFrom:\n        configMapKeyRef:\n          name: settings\n          key: K\n";
    let pods: Api<Pod> = Api::namespaced(admin, "default");
    let spec = "  automountServiceAccountToken: false\n";
    pods.create(&PostParams::default(), &pod(&env.node, "badenv", "sleep 3600", spec, container)).await.unwrap();
    let waiting = eventually("CreateContainerConfigError", &gantry, || async {
        let status = pods.get("badenv").await.ok()?.status?;
        let waiting = status.container_statuses?.pop()?.state?.waiting?;
        (waiting.reason.as_deref() == Some("CreateContainerConfigError")).then_some(waiting)
    })
    .await;
    assert_eq!(waiting.message.as_deref(), Some("couldn't find key K in ConfigMap default/settings"));
    assert!(env.running("badenv").await.is_empty());
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn secret_items_modes_and_downward_api() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let admin = cluster.admin().await;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), "default");
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "creds"}, "stringData": {"user": "alice", "pw": "s3cret", "unused": "x"}
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    let spec = r#"  automountServiceAccountToken: false
  volumes:
  - name: s
    secret:
      secretName: creds
      defaultMode: 288 # 0440
      items:
      - {key: user, path: user}
      - {key: pw, path: nested/pw, mode: 256}
  - name: info
    downwardAPI:
      items:
      - path: labels
        fieldRef: {fieldPath: metadata.labels}
      - path: name
        fieldRef: {fieldPath: metadata.name}
"#;
    let container = r#"    volumeMounts:
    - {name: s, mountPath: /s}
    - {name: info, mountPath: /info}
    env:
    - name: POD_NS
      valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
    - name: GREETING
      value: "hi-$(POD_NS)"
"#;
    let command = "stat -L -c 'MODE %a %n' /s/user /s/nested/pw; ls /s; echo PW=$(cat /s/nested/pw); \
                   echo NAME=$(cat /info/name); cat /info/labels; echo; echo GREETING=$GREETING; sleep 3600";
    let mut p = pod(&env.node, "files", command, spec, container);
    p.metadata.labels = Some([("app".to_string(), "files".to_string())].into());
    let pods: Api<Pod> = Api::namespaced(admin, "default");
    pods.create(&PostParams::default(), &p).await.unwrap();
    let out = eventually("the container's report", &gantry, || async {
        let out = container_output(&env, "files");
        out.contains("GREETING=").then_some(out)
    })
    .await;
    assert!(out.contains("MODE 440 /s/user"), "{out}");
    assert!(out.contains("MODE 400 /s/nested/pw"), "{out}");
    assert!(!out.contains("unused"), "only the listed items: {out}");
    assert!(out.contains("PW=s3cret"), "{out}");
    assert!(out.contains("NAME=files"), "{out}");
    assert!(out.contains("app=\"files\""), "{out}");
    assert!(out.contains("GREETING=hi-default"), "{out}");
    cluster.cleanup(&env.node).await;
}
