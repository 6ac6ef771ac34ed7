//! End-to-end: the `kubectl maintenance` plugin (`gantry maintenance`, and the same binary
//! linked as `kubectl-maintenance`) against the test API server (or a real cluster) with the
//! maintenance controller running: create, list, status, plan (dry run) and complete.

mod common;
#[path = "common/maintenance_kit.rs"]
mod kit;

use std::time::{Duration, Instant};

use common::cluster::Cluster;
use gantry_maintenance::api::{NodeMaintenance, Stage};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kit::{Controller, Invocation, install_crd, plugin};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

/// Polls the plugin until `check` accepts its output, or panics with the last output and
/// the controller's log.
async fn until(what: &str, dir: &std::path::Path, mut check: impl AsyncFnMut() -> Option<String>) -> String {
    let start = Instant::now();
    loop {
        if let Some(out) = check().await {
            return out;
        }
        if start.elapsed() > common::DEADLINE {
            let log = std::fs::read_to_string(dir.join("maintenance-controller.log")).unwrap_or_default();
            panic!("timed out waiting for {what}\n--- controller log ---\n{}", common::tail(&log, 40));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A pod bound to `node` (no agent: it stays Pending), controlled by a ReplicaSet unless bare.
fn pending_pod(name: &str, node: &str, app: &str, bare: bool) -> Pod {
    let mut pod = json!({
        "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": gantry_testkit::BUSYBOX_IMAGE}]},
    });
    if !bare {
        pod["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("rs-{app}"),
            "uid": "5a0b6d1e-0000-4000-8000-000000000003", "controller": true,
        }]);
    }
    serde_json::from_value(pod).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn plugin_creates_lists_shows_plans_and_completes_a_maintenance() {
    let cluster = Cluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = cluster.admin_kubeconfig(dir.path());
    let (gantry, kubectl) =
        (Invocation::Gantry(&kubeconfig), Invocation::Kubectl { link_dir: dir.path(), kubeconfig: &kubeconfig });
    let client = cluster.admin().await;
    let help = plugin(&kubectl, &["--help"]).await;
    assert!(help.ok && help.stdout.contains("Usage: kubectl maintenance"), "{}", help.stdout);
    if let Cluster::Real(_) = cluster {
        eprintln!("SKIPPED missing-CRD message check: a real cluster may already have the CRD");
    } else {
        // The CRD is not installed yet: the error says what to do.
        let out = plugin(&gantry, &["list"]).await;
        assert!(!out.ok && out.stderr.contains("install the CRD"), "{}", out.stderr);
    }
    install_crd(&client).await;

    // Two nodes in a pool of their own (no agent: the pods stay Pending), and a spare node so
    // the safety check does not refuse a maintenance of every schedulable node.
    let (n1, n2, spare) =
        (cluster.unique_node_name("plug-a"), cluster.unique_node_name("plug-b"), cluster.unique_node_name("spare"));
    let pool = format!("pool-{n1}");
    let nodes: Api<Node> = Api::all(client.clone());
    for (name, labels) in
        [(&n1, json!({"gantry.dev/e2e-pool": pool})), (&n2, json!({"gantry.dev/e2e-pool": pool})), (&spare, json!({}))]
    {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    let app = format!("web-{n1}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let (web, db) = (format!("web-{n1}"), format!("db-{n2}"));
    pods.create(&PostParams::default(), &pending_pod(&web, &n1, &app, false)).await.unwrap();
    // No controller owns the db pod: it would block the drain of its node.
    pods.create(&PostParams::default(), &pending_pod(&db, &n2, &format!("db-{n2}"), true)).await.unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    let pdb = serde_json::from_value(json!({
        "metadata": {"name": app},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
    }))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    let selector = format!("gantry.dev/e2e-pool={pool}");

    // A bad selector is refused before anything is sent, naming the flag.
    let out = plugin(&gantry, &["create", "bad", "--selector", "zone in (a"]).await;
    assert!(!out.ok);
    assert!(out.stderr.contains("invalid --selector") && out.stderr.contains("missing ')'"), "{}", out.stderr);

    // Dry run for a maintenance that does not exist yet: both pods, entry 1, nothing changed;
    // the bare db pod would block its node's drain.
    let out = plugin(&kubectl, &["plan", "--selector", &selector]).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains(&format!("Nodes (2): {}", sorted_pair(&n1, &n2))), "{}", out.stdout);
    let row_of = |stdout: &str, pod: &str| {
        stdout.lines().find(|l| l.contains(&format!("default/{pod}"))).unwrap_or_else(|| panic!("{stdout}")).to_string()
    };
    for (pod, node) in [(&web, &n1), (&db, &n2)] {
        let row = row_of(&out.stdout, pod);
        assert!(row.contains(node.as_str()) && row.contains("1: Default priority<=1000000000"), "{row}");
    }
    assert!(row_of(&out.stdout, &web).ends_with("evict"), "{}", out.stdout);
    assert!(
        row_of(&out.stdout, &db).contains("BLOCKS the drain: no controller: would not be recreated"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(&format!("1 pods block the drain: nothing would be evicted from {n2}.")),
        "{}",
        out.stdout
    );
    // With the opt-in the same dry run evicts it.
    let out = plugin(&kubectl, &["plan", "--selector", &selector, "--evict-bare-pods"]).await;
    assert!(out.ok && row_of(&out.stdout, &db).ends_with("evict"), "{}{}", out.stdout, out.stderr);
    assert!(pods.get(&web).await.unwrap().metadata.deletion_timestamp.is_none(), "the dry run evicts nothing");

    let name = format!("plug-{n1}");
    let out =
        plugin(&gantry, &["create", &name, "--selector", &selector, "--stage", "Drain", "--reason", "kernel upgrade"])
            .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout, format!("nodemaintenance.maintenance.gantry.dev/{name} created\n"));
    let out = plugin(&gantry, &["create", &name, "--nodes", &n1]).await;
    assert!(!out.ok && out.stderr.contains("already exists"), "{}", out.stderr);

    let _controller = Controller::start(&cluster, dir.path());
    // list: NAME STAGE NODES DRAINED AGE REASON.
    until("list to show both nodes", dir.path(), async || {
        let out = plugin(&kubectl, &["list"]).await;
        let row = out.stdout.lines().find(|l| l.starts_with(&format!("{name} ")))?.to_string();
        let cells: Vec<&str> = row.split_whitespace().collect();
        (cells[1] == "Drain" && cells[2] == "2" && row.ends_with("kernel upgrade")).then_some(out.stdout)
    })
    .await;
    // status: the PDB holds the web pod, and the status names it.
    let status = until("status to name the blocking PDB", dir.path(), async || {
        let out = plugin(&kubectl, &["status", &name]).await;
        let row = out.stdout.lines().find(|l| l.contains(&format!("default/{web}")))?.to_string();
        row.contains(&format!("PodDisruptionBudget default/{app}")).then_some(out.stdout)
    })
    .await;
    eprintln!("--- kubectl maintenance status ---\n{status}");
    assert!(
        status.contains("NODE") && status.contains("PODS REMAINING") && status.contains("BLOCKING POD"),
        "{status}"
    );
    let n1_row = status.lines().find(|l| l.starts_with(&format!("{n1} "))).unwrap_or_else(|| panic!("{status}"));
    assert_eq!(n1_row.split_whitespace().take(3).collect::<Vec<_>>(), [n1.as_str(), "Drain", "1"], "{status}");
    let n2_row = status.lines().find(|l| l.starts_with(&format!("{n2} "))).unwrap_or_else(|| panic!("{status}"));
    assert!(
        n2_row.contains(&format!("default/{db}")) && n2_row.contains("no controller: would not be recreated"),
        "{status}"
    );
    assert!(pods.get(&db).await.unwrap().metadata.deletion_timestamp.is_none(), "the bare pod is not evicted");

    // plan NAME uses the maintenance's (written-back) plan: the same pods.
    let out = plugin(&gantry, &["plan", &name]).await;
    assert!(out.ok && out.stdout.contains(&format!("default/{web}")), "{}{}", out.stdout, out.stderr);

    let out = plugin(&kubectl, &["status", "no-such-maintenance"]).await;
    assert!(!out.ok);
    assert!(out.stderr.contains("\"no-such-maintenance\" not found"), "{}", out.stderr);

    // status --watch follows the maintenance until it is complete, printing each change.
    let mut follower = Follower::start(&kubeconfig, &name).await;
    let out = plugin(&kubectl, &["complete", &name]).await;
    assert!(out.ok, "{}", out.stderr);
    let followed = follower.finish().await;
    assert!(followed.contains("Stage:    Complete"), "--watch did not show the change:\n{followed}");
    let maintenances: Api<NodeMaintenance> = Api::all(client.clone());
    assert_eq!(maintenances.get(&name).await.unwrap().spec.stage, Stage::Complete);
    until("Complete to uncordon the nodes", dir.path(), async || {
        let cordoned = |n: Node| n.spec.and_then(|s| s.unschedulable).unwrap_or(false);
        let free = !cordoned(nodes.get(&n1).await.ok()?) && !cordoned(nodes.get(&n2).await.ok()?);
        let out = plugin(&gantry, &["list"]).await;
        let listed = out.stdout.lines().any(|l| l.starts_with(&format!("{name} ")) && l.contains("Complete"));
        (free && listed).then_some(String::new())
    })
    .await;

    let _ = maintenances.delete(&name, &DeleteParams::default()).await;
    let _ = pdbs.delete(&app, &DeleteParams::default()).await;
    for n in [&n1, &n2, &spare] {
        cluster.cleanup(n).await;
    }
}

/// `gantry maintenance status NAME --watch`, running.
struct Follower {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Follower {
    /// Starts following and returns once the first status (stage Drain) is printed, so that
    /// later changes are known to come through the watch.
    async fn start(kubeconfig: &std::path::Path, name: &str) -> Follower {
        use tokio::io::AsyncBufReadExt as _;
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_gantry"))
            .args(["maintenance", "status", name, "--watch"])
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start status --watch");
        let mut follower = Follower { lines: tokio::io::BufReader::new(child.stdout.take().unwrap()).lines(), child };
        let first = tokio::time::timeout(common::DEADLINE, async {
            while let Some(line) = follower.lines.next_line().await.unwrap() {
                if line == "Stage:    Drain" {
                    return;
                }
            }
            panic!("status --watch ended before printing the status");
        });
        first.await.expect("status --watch printed nothing");
        follower
    }

    /// The rest of its output, once it has exited on its own (successfully).
    async fn finish(&mut self) -> String {
        let rest = tokio::time::timeout(common::DEADLINE, async {
            let mut out = String::new();
            while let Some(line) = self.lines.next_line().await.unwrap() {
                out.push_str(&line);
                out.push('\n');
            }
            (out, self.child.wait().await.unwrap())
        });
        let (out, status) = rest.await.expect("status --watch did not stop once the maintenance was complete");
        assert!(status.success(), "status --watch failed:\n{out}");
        out
    }
}

fn sorted_pair(a: &str, b: &str) -> String {
    let mut v = [a, b];
    v.sort();
    v.join(", ")
}
