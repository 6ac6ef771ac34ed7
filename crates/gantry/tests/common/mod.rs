//! Shared pieces of the end-to-end tests: a private containerd, a `gantry kubelet` process
//! pointed at it, and polls with deadlines over its status file and the runtime.

#![allow(dead_code)] // each test binary uses a different subset

pub mod cluster;
pub mod node_api;
pub mod spdy;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gantry_cri::api::{ContainerFilter, ListContainersRequest, ListPodSandboxRequest, PodSandboxFilter};
use gantry_testkit::Containerd;
use k8s_openapi::api::core::v1::Pod;

pub const NODE: &str = "e2e-node";
pub const DEADLINE: Duration = Duration::from_secs(60);

/// A test environment: containerd plus the folders a node agent uses.
pub struct Env {
    pub ctd: Containerd,
    /// The node name the agent runs as.
    pub node: String,
    pub manifests: PathBuf,
    pub root: PathBuf,
    pub pod_logs: PathBuf,
    pub config: PathBuf,
}

impl Env {
    pub async fn start() -> Option<Env> {
        Self::start_as(NODE).await
    }

    pub async fn start_as(node: &str) -> Option<Env> {
        gantry_testkit::init_test_tracing();
        let ctd = Containerd::start_or_skip().await?;
        let dir = ctd.dir();
        let (manifests, root, pod_logs) = (dir.join("manifests"), dir.join("kubelet"), dir.join("pod-logs"));
        for d in [&manifests, &root, &pod_logs] {
            std::fs::create_dir_all(d).unwrap();
        }
        let config = dir.join("kubelet-config.yaml");
        // Tests run many agents at once: the node API (fixed ports 10250/10248) is off unless a
        // test turns it on with free ports (see `node_api::NodeApi::flags`).
        let yaml = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\npodLogsDir: {}\nfileCheckFrequency: 20s\nenableServer: false\n",
            pod_logs.display()
        );
        std::fs::write(&config, yaml).unwrap();
        Some(Env { ctd, node: node.to_string(), manifests, root, pod_logs, config })
    }

    /// The flags that point a node agent at this environment.
    pub fn args(&self) -> Vec<String> {
        vec![
            format!("--config={}", self.config.display()),
            format!("--container-runtime-endpoint={}", self.ctd.endpoint()),
            format!("--root-dir={}", self.root.display()),
            format!("--pod-manifest-path={}", self.manifests.display()),
            format!("--hostname-override={}", self.node),
            format!("--cgroup-root={}", self.ctd.cgroup_root()),
            "-v=4".to_string(),
        ]
    }

    pub fn kubelet(&self, extra: &[&str]) -> Gantry {
        let mut args = self.args();
        args.extend(extra.iter().map(|s| s.to_string()));
        Gantry::start(&args, &self.root.join("gantry.log"))
    }

    pub fn write_manifest(&self, file: &str, yaml: &str) {
        // Write then rename, as editors and config tools do, so the agent never reads half.
        let tmp = self.manifests.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, self.manifests.join(file)).unwrap();
    }

    pub fn remove_manifest(&self, file: &str) {
        std::fs::remove_file(self.manifests.join(file)).unwrap();
    }

    /// Containers Gantry created on this node, from the runtime itself.
    pub async fn containers(&self) -> Vec<RuntimeContainer> {
        let mut client = self.ctd.runtime_client().await;
        let filter = ContainerFilter { label_selector: owned(&self.node), ..Default::default() };
        let list = client.list_containers(ListContainersRequest { filter: Some(filter) }).await.unwrap().into_inner();
        list.containers
            .into_iter()
            .map(|c| RuntimeContainer {
                id: c.id,
                name: c.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default(),
                attempt: c.metadata.map(|m| m.attempt).unwrap_or_default(),
                pod: c.labels.get("io.kubernetes.pod.name").cloned().unwrap_or_default(),
                pod_uid: c.labels.get("io.kubernetes.pod.uid").cloned().unwrap_or_default(),
                running: c.state == gantry_cri::api::ContainerState::ContainerRunning as i32,
            })
            .collect()
    }

    /// (sandbox id, pod name, ready) of Gantry's sandboxes on this node.
    pub async fn sandboxes(&self) -> Vec<(String, String, bool)> {
        let mut client = self.ctd.runtime_client().await;
        let filter = PodSandboxFilter { label_selector: owned(&self.node), ..Default::default() };
        let list = client.list_pod_sandbox(ListPodSandboxRequest { filter: Some(filter) }).await.unwrap().into_inner();
        list.items
            .into_iter()
            .map(|s| {
                let pod = s.labels.get("io.kubernetes.pod.name").cloned().unwrap_or_default();
                (s.id, pod, s.state == gantry_cri::api::PodSandboxState::SandboxReady as i32)
            })
            .collect()
    }

    pub async fn running(&self, pod: &str) -> Vec<RuntimeContainer> {
        self.containers().await.into_iter().filter(|c| c.pod == pod && c.running).collect()
    }
}

fn owned(node: &str) -> HashMap<String, String> {
    HashMap::from([("gantry.dev/node".to_string(), node.to_string())])
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeContainer {
    pub id: String,
    pub name: String,
    pub attempt: u32,
    pub pod: String,
    pub pod_uid: String,
    pub running: bool,
}

/// A `gantry kubelet` process. Killed (SIGKILL, like a crash) on drop.
/// A `gantry` command's process, its stderr appended to a log file; killed on drop.
pub struct Process {
    child: Option<Child>,
    log: PathBuf,
}

impl Process {
    pub fn spawn(args: &[String], log: &Path) -> Process {
        let log_file = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_gantry"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn gantry {}: {e}", args.first().map_or("", String::as_str)));
        Process { child: Some(child), log: log.to_path_buf() }
    }

    /// The process ID, until the process was killed.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the process the hard way, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether the process exited, and how.
    pub fn try_exit(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

pub struct Gantry {
    process: Process,
    root: PathBuf,
}

impl Gantry {
    pub fn start(args: &[String], log: &Path) -> Gantry {
        let root = args.iter().find_map(|a| a.strip_prefix("--root-dir=")).map(PathBuf::from).expect("--root-dir");
        let args: Vec<String> = std::iter::once("kubelet".to_string()).chain(args.iter().cloned()).collect();
        Gantry { process: Process::spawn(&args, log), root }
    }

    /// The agent's process ID.
    pub fn pid(&self) -> u32 {
        self.process.pid().unwrap_or_default()
    }

    /// The pods in the status file (empty until the agent wrote it).
    pub fn pods(&self) -> Vec<Pod> {
        gantry_agent::status_store::read_pod_list(&self.root.join("pods.json")).unwrap_or_default()
    }

    pub fn pod(&self, name: &str) -> Option<Pod> {
        self.pods().into_iter().find(|p| p.metadata.name.as_deref() == Some(name))
    }

    pub fn pod_in_phase(&self, name: &str, phase: &str) -> Option<Pod> {
        self.pod(name).filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase))
    }

    pub fn phase(&self, name: &str) -> Option<String> {
        self.pod(name)?.status?.phase
    }

    pub fn log(&self) -> String {
        self.process.log()
    }

    /// Kills the process the hard way, as a crash would.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Whether the process exited, and how.
    pub fn try_exit(&mut self) -> Option<std::process::ExitStatus> {
        self.process.try_exit()
    }
}

/// Polls `check` until it returns `Some`, or panics after `DEADLINE` with `what` and the
/// agent's log.
pub async fn eventually<T, F, Fut>(what: &str, gantry: &Gantry, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    poll(what, || format!("--- gantry log ---\n{}", tail(&gantry.log(), 80)), check).await
}

/// Polls `check` every 50 ms until it returns `Some`, or panics after `DEADLINE` with `what`
/// and what `logs` says about the processes involved.
pub async fn poll<T, F, Fut>(what: &str, logs: impl Fn() -> String, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if start.elapsed() > DEADLINE {
            panic!("timed out waiting for {what}\n{}", logs());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A pod manifest running a busybox shell command.
pub fn pod_yaml(name: &str, command: &str, extra_spec: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
{extra_spec}  containers:
  - name: main
    image: {image}
    command: ["sh", "-c", {command:?}]
"#,
        image = gantry_testkit::BUSYBOX_IMAGE,
    )
}

/// The pod's full name as Gantry names static pods.
pub fn static_name(name: &str) -> String {
    format!("{name}-{NODE}")
}

/// What the pod's `main` container printed so far (all attempts), without the CRI prefixes.
pub fn container_output(env: &Env, pod: &str) -> String {
    let mut out = String::new();
    for dir in std::fs::read_dir(&env.pod_logs).into_iter().flatten().flatten() {
        if !dir.file_name().to_string_lossy().starts_with(&format!("default_{pod}_")) {
            continue;
        }
        for log in std::fs::read_dir(dir.path().join("main")).into_iter().flatten().flatten() {
            for line in std::fs::read_to_string(log.path()).unwrap_or_default().lines() {
                out.push_str(line.splitn(4, ' ').nth(3).unwrap_or_default());
                out.push('\n');
            }
        }
    }
    out
}
