//! The raw CRI floor: pods started with nothing but plain CRI calls, one after another or
//! by a few concurrent workers. Benchmarks compare Gantry's pod startup against the best.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gantry_cri::api::runtime_service_client::RuntimeServiceClient;
use gantry_cri::api::{
    ContainerConfig, ContainerMetadata, CreateContainerRequest, ImageSpec, LinuxContainerConfig,
    LinuxContainerSecurityContext, LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, RunPodSandboxRequest, StartContainerRequest,
};
use tonic::transport::Channel;

use crate::containerd::Containerd;
use crate::error::{IoContext, Result, TestkitError};
use crate::images::BUSYBOX_IMAGE;

/// Label on every raw pod and container, telling them apart from Gantry's.
pub const RAW_LABEL: (&str, &str) = ("gantry.test/raw", "true");
const RAW_NAMESPACE: &str = "gantry-raw";
const CONTAINER_NAME: &str = "main";

/// Distinct pod names across calls within one process.
static NEXT_POD: AtomicUsize = AtomicUsize::new(0);

/// A started raw pod with one container.
#[derive(Debug, Clone)]
pub struct RawPod {
    pub sandbox_id: String,
    pub container_id: String,
    /// The container's CRI log file.
    pub log_path: PathBuf,
}

/// Start `n` pods (CNI networking) each running a busybox `sleep 3600`,
/// sequentially; returns the elapsed time of the loop.
pub async fn raw_start_pods(ctd: &Containerd, n: usize) -> Result<Duration> {
    let mut client = ctd.runtime_client().await;
    let log_root = raw_log_root(ctd);
    let started = Instant::now();
    for _ in 0..n {
        raw_run_pod(&mut client, &log_root, &["sleep", "3600"]).await?;
    }
    let elapsed = started.elapsed();
    tracing::info!(pods = n, elapsed_ms = elapsed.as_millis() as u64, "raw pods started");
    Ok(elapsed)
}

/// Start `n` pods like [`raw_start_pods`], by `workers` concurrent workers sharing one
/// connection; returns the elapsed time until the last one started.
pub async fn raw_start_pods_parallel(ctd: &Containerd, n: usize, workers: usize) -> Result<Duration> {
    let client = ctd.runtime_client().await;
    let log_root = raw_log_root(ctd);
    let left = std::sync::Arc::new(AtomicUsize::new(n));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers.max(1) {
        let (mut client, log_root, left) = (client.clone(), log_root.clone(), left.clone());
        tasks.spawn(async move {
            // Each worker takes the next pod until none is left.
            while left.fetch_update(Ordering::AcqRel, Ordering::Acquire, |l| l.checked_sub(1)).is_ok() {
                raw_run_pod(&mut client, &log_root, &["sleep", "3600"]).await?;
            }
            Ok::<(), TestkitError>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("raw pod worker panicked")?;
    }
    let elapsed = started.elapsed();
    tracing::info!(pods = n, workers, elapsed_ms = elapsed.as_millis() as u64, "raw pods started in parallel");
    Ok(elapsed)
}

/// Stop and remove every sandbox of `ctd` (raw or not); returns how many.
pub async fn remove_all_pods(ctd: &Containerd) -> Result<usize> {
    let client = ctd.runtime_client().await;
    crate::cri::remove_sandboxes(&client, &[]).await
}

/// Where raw pods' log directories go.
pub fn raw_log_root(ctd: &Containerd) -> PathBuf {
    ctd.dir().join("raw-logs")
}

/// RunPodSandbox → CreateContainer → StartContainer for one pod whose single
/// busybox container runs `command`.
pub async fn raw_run_pod(
    client: &mut RuntimeServiceClient<Channel>,
    log_root: &Path,
    command: &[&str],
) -> Result<RawPod> {
    let name = format!("raw-{}", NEXT_POD.fetch_add(1, Ordering::Relaxed));
    let log_dir = log_root.join(&name);
    // Like kubelet, create the pod log directory; containerd only writes in it.
    std::fs::create_dir_all(&log_dir).ctx(|| format!("create {}", log_dir.display()))?;
    let pod = pod_config(&name, &log_dir);

    let sandbox_id = client
        .run_pod_sandbox(RunPodSandboxRequest { config: Some(pod.clone()), runtime_handler: String::new() })
        .await
        .map_err(TestkitError::cri("RunPodSandbox"))?
        .into_inner()
        .pod_sandbox_id;
    let container = container_config(command);
    let log_path = log_dir.join(&container.log_path);
    let container_id = client
        .create_container(CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(container),
            sandbox_config: Some(pod),
        })
        .await
        .map_err(TestkitError::cri("CreateContainer"))?
        .into_inner()
        .container_id;
    client
        .start_container(StartContainerRequest { container_id: container_id.clone() })
        .await
        .map_err(TestkitError::cri("StartContainer"))?;
    tracing::debug!(pod = %name, sandbox = %sandbox_id, container = %container_id, "raw pod started");
    Ok(RawPod { sandbox_id, container_id, log_path })
}

fn raw_labels() -> HashMap<String, String> {
    HashMap::from([(RAW_LABEL.0.to_owned(), RAW_LABEL.1.to_owned())])
}

/// Namespaces as kubelet sets them for an ordinary pod: shared network and
/// IPC, a PID namespace per container.
fn pod_namespaces() -> NamespaceOption {
    NamespaceOption {
        network: NamespaceMode::Pod as i32,
        pid: NamespaceMode::Container as i32,
        ipc: NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

fn pod_config(name: &str, log_dir: &Path) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.to_owned(),
            uid: format!("{name}-{}", std::process::id()),
            namespace: RAW_NAMESPACE.to_owned(),
            attempt: 0,
        }),
        hostname: name.to_owned(),
        log_directory: log_dir.to_string_lossy().into_owned(),
        labels: raw_labels(),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(pod_namespaces()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn container_config(command: &[&str]) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata { name: CONTAINER_NAME.to_owned(), attempt: 0 }),
        image: Some(ImageSpec { image: BUSYBOX_IMAGE.to_owned(), ..Default::default() }),
        command: command.iter().map(|s| s.to_string()).collect(),
        // Relative to the pod's log directory, kubelet's `<name>/<attempt>.log`
        // flattened to one level.
        log_path: format!("{CONTAINER_NAME}_0.log"),
        labels: raw_labels(),
        linux: Some(LinuxContainerConfig {
            security_context: Some(LinuxContainerSecurityContext {
                namespace_options: Some(pod_namespaces()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
