//! What the benches share: starting `gantry` as a child process (a cluster node agent, or any
//! command line) and waiting for its Node to register.
#![allow(dead_code)] // each bench uses a different subset

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gantry_test_apiserver::{TestApiServer, User};
use gantry_testkit::Containerd;
use k8s_openapi::api::core::v1::Node;
use kube::Api;

/// Runs `gantry args…` with its stderr in `dir/log`: this tree's binary, or `GANTRY_BENCH_BIN`
/// (another build, to compare two versions on the same machine in the same conditions); under
/// the command `GANTRY_BENCH_AGENT_WRAPPER` when set (e.g. `heaptrack -o /tmp/agent` to see
/// where its memory goes; the figures measured from the child's pid are then the wrapper's).
pub fn spawn(dir: &Path, log: &str, args: &[String]) -> Child {
    let binary = std::env::var_os("GANTRY_BENCH_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_gantry").into());
    let wrapper = std::env::var("GANTRY_BENCH_AGENT_WRAPPER").unwrap_or_default();
    let mut words = wrapper.split_whitespace();
    let mut command = match words.next() {
        Some(program) => {
            let mut c = Command::new(program);
            c.args(words).arg(&binary);
            c
        }
        None => Command::new(&binary),
    };
    command
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(log)).unwrap())
        .spawn()
        .expect("spawn gantry")
}

/// The command line of a node agent `node` in cluster mode against `server`, its state and
/// pod logs under `dir`, without the node API server (its config file is written now).
pub fn cluster_node_args(ctd: &Containerd, server: &TestApiServer, dir: &Path, node: &str) -> Vec<String> {
    let kubeconfig = server.kubeconfig(dir, &User::Node(node.to_string()));
    let config = dir.join("config.yaml");
    // Disk thresholds far below upstream's defaults: a benchmark machine's disk is often more
    // than 90% full, and the default 10% would evict or refuse the pods being measured. The
    // eviction manager still runs (its cost is part of what is measured). Image GC is off
    // (`imageGCHighThresholdPercent: 100`, as upstream): on a disk over 85% full it removed the
    // pods' image between their starts, and the rest waited in ImagePullBackOff. The cluster
    // DNS settings are a kubeadm node's: without them each pod is told, in an Event, that it
    // falls back to the host's DNS.
    let yaml = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\npodLogsDir: {}\nenableServer: false\n\
         imageGCHighThresholdPercent: 100\nclusterDNS: [{}]\nclusterDomain: cluster.local\n\
         evictionHard:\n  memory.available: 100Mi\n  nodefs.available: 1%\n  imagefs.available: 1%\n  nodefs.inodesFree: 1%\n",
        dir.join("logs").display(),
        gantry_testkit::CLUSTER_DNS,
    );
    std::fs::write(&config, yaml).unwrap();
    vec![
        "kubelet".into(),
        format!("--config={}", config.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--container-runtime-endpoint={}", ctd.endpoint()),
        format!("--root-dir={}", dir.join("root").display()),
        format!("--hostname-override={node}"),
    ]
}

/// Waits (up to a minute) until Node `node` is registered.
pub async fn wait_for_node(admin: &kube::Client, node: &str) {
    let nodes: Api<Node> = Api::all(admin.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    while nodes.get_opt(node).await.ok().flatten().is_none() {
        assert!(Instant::now() < deadline, "node never registered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
