//! End-to-end, cluster mode: what the sandbox and the containers get from the pod spec on the
//! real containerd: resources and pod cgroups, security contexts, DNS, the managed hosts file
//! and secret volumes on tmpfs. Containers print what they see; the tests read their logs.

mod common;

use std::path::Path;

use common::cluster;
use common::{Env, container_output, eventually, pod_yaml};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

/// A pod bound to the node; `extra_spec` is YAML under `spec:` (two-space indent), `container`
/// YAML appended to the container (four-space indent).
fn pod(node: &str, name: &str, command: &str, extra_spec: &str, container: &str) -> Pod {
    let spec = format!(
        "  nodeName: {node}\n  terminationGracePeriodSeconds: 1\n  automountServiceAccountToken: false\n{extra_spec}"
    );
    let yaml = format!("{}{container}", pod_yaml(name, command, &spec));
    serde_yaml_ng::from_str(&yaml).unwrap()
}

/// Waits for an event with `reason` about the pod `name`, and returns its note.
async fn event(client: kube::Client, gantry: &common::Gantry, name: &str, reason: &str) -> String {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client, "default");
    eventually(&format!("a {reason} event on {name}"), gantry, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find_map(|e| {
            let about = e.involved_object.name.as_deref() == Some(name);
            (about && e.reason.as_deref() == Some(reason)).then(|| e.message.unwrap_or_default())
        })
    })
    .await
}

/// Runs the container's command until it printed `END`, and returns the output.
async fn report(env: &Env, gantry: &common::Gantry, name: &str) -> String {
    eventually(&format!("the report of {name}"), gantry, || async {
        let out = container_output(env, name);
        out.contains("END").then_some(out)
    })
    .await
}

#[tokio::test]
async fn memory_limit_reaches_the_container_and_the_pod_cgroup() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let pods: Api<Pod> = Api::namespaced(cluster.admin().await, "default");
    let container = "    resources:\n      requests: {memory: 32Mi, cpu: 100m}\n      limits: {memory: 64Mi}\n";
    let command = "echo LIMIT=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes); echo END; sleep 3600";
    let created =
        pods.create(&PostParams::default(), &pod(&env.node, "limited", command, "", container)).await.unwrap();
    let uid = created.metadata.uid.unwrap();
    let out = report(&env, &gantry, "limited").await;
    assert!(out.contains(&format!("LIMIT={}", 64 << 20)), "{out}");

    // The test environment gives each node agent its own cgroup root.
    let kubepods = |controller: &str| {
        Path::new("/sys/fs/cgroup")
            .join(controller)
            .join(env.ctd.cgroup_root().trim_start_matches('/'))
            .join("kubepods")
    };
    let pod_cgroup = kubepods("memory").join(format!("burstable/pod{uid}"));
    let pod_limit = std::fs::read_to_string(pod_cgroup.join("memory.limit_in_bytes")).unwrap();
    assert_eq!(pod_limit.trim(), (64 << 20).to_string(), "every container limits memory, so the pod does");
    let shares = std::fs::read_to_string(kubepods("cpu").join(format!("burstable/pod{uid}/cpu.shares")));
    assert_eq!(shares.unwrap().trim(), "102", "100m CPU");
    let status = pods.get("limited").await.unwrap().status.unwrap();
    assert_eq!(status.qos_class.as_deref(), Some("Burstable"));

    // The QoS levels (upstream's setCPUCgroupConfig): Burstable gets the shares of its pods'
    // requests, as pods come and go; BestEffort the minimum.
    let level_shares = |level: &str| {
        let text = std::fs::read_to_string(kubepods("cpu").join(level).join("cpu.shares")).unwrap_or_default();
        text.trim().to_string()
    };
    assert_eq!(level_shares("besteffort"), "2");
    assert_eq!(level_shares("burstable"), "102", "the one Burstable pod's 100m");
    let second = "    resources:\n      requests: {cpu: 200m}\n";
    pods.create(&PostParams::default(), &pod(&env.node, "second", "sleep 3600", "", second)).await.unwrap();
    eventually("Burstable shares for 300m", &gantry, || async { (level_shares("burstable") == "307").then_some(()) })
        .await;

    pods.delete("limited", &DeleteParams::default()).await.unwrap();
    eventually("the pod cgroup removed", &gantry, || async { (!pod_cgroup.exists()).then_some(()) }).await;
    eventually("Burstable shares for 200m", &gantry, || async { (level_shares("burstable") == "204").then_some(()) })
        .await;
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn run_as_non_root_and_run_as_user() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let gantry = cluster::start_node(&env, &cluster);
    let admin = cluster.admin().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let non_root = "  securityContext:\n    runAsNonRoot: true\n";
    let created =
        pods.create(&PostParams::default(), &pod(&env.node, "nonroot", "sleep 3600", non_root, "")).await.unwrap();
    let uid = created.metadata.uid.unwrap();
    let as_user = "  securityContext:\n    runAsUser: 1000\n    fsGroup: 2000\n    supplementalGroups: [3000]\n";
    let command = "echo UID=$(id -u) GROUPS=$(id -G); echo END; sleep 3600";
    pods.create(&PostParams::default(), &pod(&env.node, "asuser", command, as_user, "")).await.unwrap();
    let locked = r#"    securityContext:
      readOnlyRootFilesystem: true
      allowPrivilegeEscalation: false
      capabilities: {drop: [ALL]}
      seccompProfile: {type: RuntimeDefault}
"#;
    let command =
        "grep -E 'NoNewPrivs|CapEff|Seccomp:' /proc/self/status; touch /x || echo READONLY; echo END; sleep 3600";
    pods.create(&PostParams::default(), &pod(&env.node, "locked", command, "", locked)).await.unwrap();

    let waiting = eventually("CreateContainerConfigError", &gantry, || async {
        let status = pods.get("nonroot").await.ok()?.status?;
        let waiting = status.container_statuses?.pop()?.state?.waiting?;
        (waiting.reason.as_deref() == Some("CreateContainerConfigError")).then_some(waiting)
    })
    .await;
    let expected = format!(
        "container has runAsNonRoot and image will run as root (pod: \"nonroot_default({uid})\", container: main)"
    );
    assert_eq!(waiting.message.as_deref(), Some(expected.as_str()));
    assert!(env.running("nonroot").await.is_empty());

    let out = report(&env, &gantry, "asuser").await;
    assert!(out.contains("UID=1000"), "{out}");
    let groups = out.lines().find_map(|l| l.split_once("GROUPS=")).map(|(_, g)| g.to_string()).unwrap();
    assert!(groups.split_whitespace().any(|g| g == "2000"), "fsGroup is a supplemental group: {out}");
    assert!(groups.split_whitespace().any(|g| g == "3000"), "{out}");

    let out = report(&env, &gantry, "locked").await;
    assert!(out.contains("NoNewPrivs:\t1"), "allowPrivilegeEscalation: false: {out}");
    assert!(out.contains("CapEff:\t0000000000000000"), "all capabilities dropped: {out}");
    assert!(out.contains("Seccomp:\t2"), "RuntimeDefault is a seccomp filter: {out}");
    assert!(out.contains("READONLY"), "read-only root file system: {out}");
    let note = event(admin, &gantry, "asuser", "MissingClusterDNS").await;
    assert!(note.contains("Falling back to \"Default\" policy."), "no --cluster-dns on this node: {note}");
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn cluster_dns_hosts_file_and_secret_tmpfs() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let kubeconfig = cluster.node_kubeconfig(&env.ctd.dir(), &env.node);
    let gantry = env.kubelet(&[
        &format!("--kubeconfig={}", kubeconfig.display()),
        "--cluster-dns=10.96.0.10",
        "--cluster-domain=cluster.local",
    ]);
    let admin = cluster.admin().await;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), "default");
    let secret: Secret =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "tmpfs-creds"}, "stringData": {"k": "v"}}))
            .unwrap();
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    let spec = r#"  hostAliases:
  - ip: 10.1.2.3
    hostnames: [foo.local, bar.local]
  volumes:
  - name: s
    secret: {secretName: tmpfs-creds}
"#;
    let container = "    volumeMounts:\n    - {name: s, mountPath: /s}\n";
    let command = "cat /etc/resolv.conf /etc/hosts; grep ' /s ' /proc/mounts; echo HOSTNAME=$(hostname); echo END; \
                   sleep 3600";
    let pods: Api<Pod> = Api::namespaced(admin, "default");
    let created = pods.create(&PostParams::default(), &pod(&env.node, "dns", command, spec, container)).await.unwrap();
    let uid = created.metadata.uid.unwrap();
    let out = report(&env, &gantry, "dns").await;

    assert!(out.contains("nameserver 10.96.0.10"), "{out}");
    let search = out.lines().find(|l| l.starts_with("search ")).unwrap_or_default();
    assert!(search.starts_with("search default.svc.cluster.local svc.cluster.local cluster.local"), "{out}");
    assert!(out.contains("options ndots:5"), "{out}");
    assert!(out.contains("# Kubernetes-managed hosts file."), "{out}");
    assert!(out.contains("10.1.2.3\tfoo.local\tbar.local"), "{out}");
    assert!(out.contains("\tdns\n"), "the pod IP with its hostname: {out}");
    assert!(out.contains("HOSTNAME=dns"), "{out}");
    let secret_mount = out.lines().find(|l| l.contains(" /s ")).unwrap_or_default();
    assert!(secret_mount.starts_with("tmpfs /s tmpfs"), "{out}");

    let host_net = "  hostNetwork: true\n  hostAliases:\n  - ip: 10.9.9.9\n    hostnames: [alias.local]\n";
    let command = "cat /etc/hosts /etc/resolv.conf; echo END; sleep 3600";
    pods.create(&PostParams::default(), &pod(&env.node, "hostnet", command, host_net, "")).await.unwrap();
    let out = report(&env, &gantry, "hostnet").await;
    let node_hosts = std::fs::read_to_string("/etc/hosts").unwrap();
    assert!(out.starts_with(&node_hosts), "the node's hosts file first: {out}");
    assert!(out.contains("# Entries added by HostAliases.\n10.9.9.9\talias.local\n"), "{out}");
    assert!(!out.contains("nameserver 10.96.0.10"), "ClusterFirst on the host network uses the node's DNS: {out}");

    pods.delete("dns", &DeleteParams::default()).await.unwrap();
    eventually("the secret tmpfs unmounted on the host", &gantry, || async {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        (!mounts.contains(&uid)).then_some(())
    })
    .await;
    cluster.cleanup(&env.node).await;
}

#[tokio::test]
async fn unsafe_sysctl_rejects_the_pod_unless_allowed() {
    let Some((env, cluster)) = cluster::setup().await else { return };
    let kubeconfig = cluster.node_kubeconfig(&env.ctd.dir(), &env.node);
    let gantry =
        env.kubelet(&[&format!("--kubeconfig={}", kubeconfig.display()), "--allowed-unsafe-sysctls=kernel.msg*"]);
    let admin = cluster.admin().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let sysctls = |name: &str| format!("  securityContext:\n    sysctls:\n    - {{name: {name}, value: \"1024\"}}\n");
    let command = "echo MSGMNI=$(cat /proc/sys/kernel/msgmni); echo END; sleep 3600";
    pods.create(&PostParams::default(), &pod(&env.node, "forbidden", "sleep 3600", &sysctls("net.core.somaxconn"), ""))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod(&env.node, "allowed", command, &sysctls("kernel.msgmni"), ""))
        .await
        .unwrap();

    let status = eventually("the pod rejected", &gantry, || async {
        let status = pods.get("forbidden").await.ok()?.status?;
        (status.phase.as_deref() == Some("Failed")).then_some(status)
    })
    .await;
    assert_eq!(status.reason.as_deref(), Some("SysctlForbidden"));
    assert_eq!(
        status.message.as_deref(),
        Some("Pod was rejected: forbidden sysctl: \"net.core.somaxconn\" not allowlisted")
    );
    assert!(env.running("forbidden").await.is_empty());
    let note = event(admin, &gantry, "forbidden", "SysctlForbidden").await;
    assert_eq!(note, "forbidden sysctl: \"net.core.somaxconn\" not allowlisted");
    let out = report(&env, &gantry, "allowed").await;
    assert!(out.contains("MSGMNI=1024"), "the allowed sysctl is set in the sandbox: {out}");
    cluster.cleanup(&env.node).await;
}
