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
use gantry_vocab::cri_labels as labels;
use gantry_vocab::paths::{MASKED_PATHS, READONLY_PATHS};

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
    raw_start_shaped_pods_parallel(ctd, n, workers, Shape::Minimal).await
}

/// How raw pods are configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Namespaces, a log directory and a command: the least a pod can be.
    Minimal,
    /// As a kubelet configures an ordinary BestEffort pod of one container without volumes
    /// (what Gantry sends for it): a pod cgroup below a `kubepods/besteffort` of its own, the
    /// cluster DNS settings of a kubeadm node ([`CLUSTER_DNS`]), CPU shares, the CFS period and
    /// the OOM score, the default masked and read-only `/proc` and `/sys` paths, the kubelet's
    /// labels and annotations, the `default/kubernetes` service variables, and the two files
    /// every container gets mounted (`/etc/hosts` and its termination message file), which the
    /// worker writes first as the kubelet does.
    Kubelet,
    /// [`Shape::Kubelet`] with the volumes of a pod that mounts a ConfigMap, a Secret and the
    /// default service-account token (the density bench's objects case), each written by the
    /// worker first: a directory with the ConfigMap's file on disk, and a tmpfs each for the
    /// Secret's file and the token's three, the token's mounted read-only. Their tmpfs stay
    /// mounted until [`remove_raw_files`].
    KubeletWithObjects,
}

/// [`raw_start_pods_parallel`] with pods of `shape`.
pub async fn raw_start_shaped_pods_parallel(
    ctd: &Containerd,
    n: usize,
    workers: usize,
    shape: Shape,
) -> Result<Duration> {
    let client = ctd.runtime_client().await;
    let log_root = raw_log_root(ctd);
    let kubelet = (shape != Shape::Minimal).then(|| KubeletShape::new(ctd, shape == Shape::KubeletWithObjects));
    let left = std::sync::Arc::new(AtomicUsize::new(n));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers.max(1) {
        let (mut client, log_root, left, kubelet) = (client.clone(), log_root.clone(), left.clone(), kubelet.clone());
        tasks.spawn(async move {
            // Each worker takes the next pod until none is left.
            while left.fetch_update(Ordering::AcqRel, Ordering::Acquire, |l| l.checked_sub(1)).is_ok() {
                match &kubelet {
                    None => raw_run_pod(&mut client, &log_root, &["sleep", "3600"]).await?,
                    Some(kubelet) => kubelet.run_pod(&mut client, &log_root).await?,
                };
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

/// The cluster DNS service's address of a kubeadm cluster (`clusterDNS`), with the domain
/// `cluster.local`: a kubelet-shaped pod resolves through it as an ordinary pod of namespace
/// `default` on such a node does.
pub const CLUSTER_DNS: &str = "10.96.0.10";

/// Where a kubelet-shaped raw pod's cgroup and files go.
#[derive(Debug, Clone)]
struct KubeletShape {
    cgroup_parent: String,
    files: PathBuf,
    dns: gantry_cri::api::DnsConfig,
    /// With the objects case's three volumes.
    objects: bool,
}

impl KubeletShape {
    fn new(ctd: &Containerd, objects: bool) -> Self {
        let resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        let values = |key: &str| -> Vec<String> {
            resolv
                .lines()
                .filter_map(|l| l.strip_prefix(key))
                .flat_map(|rest| rest.split_whitespace().map(String::from))
                .collect()
        };
        let cluster = ["default.svc.cluster.local", "svc.cluster.local", "cluster.local"].map(String::from);
        let mut searches: Vec<String> = cluster.to_vec();
        searches.extend(values("search ").into_iter().filter(|s| !cluster.contains(s)));
        KubeletShape {
            cgroup_parent: format!("{}/raw-kubepods/besteffort", ctd.cgroup_root()),
            files: raw_files(ctd),
            objects,
            dns: gantry_cri::api::DnsConfig {
                servers: vec![CLUSTER_DNS.into()],
                searches,
                options: vec!["ndots:5".into()],
            },
        }
    }

    /// [`raw_run_pod`] of a `sleep 3600` container, configured as a kubelet does.
    async fn run_pod(&self, client: &mut RuntimeServiceClient<Channel>, log_root: &Path) -> Result<RawPod> {
        let (name, log_dir) = next_pod(log_root)?;
        let uid = pod_uid(&name);
        let mut pod = pod_config(&name, &log_dir);
        self.shape_sandbox(&mut pod, &name, &uid);
        let files = self.files.join(&uid);
        let (hosts, message) = (files.join("etc-hosts"), files.join("containers/main/0"));
        std::fs::create_dir_all(message.parent().unwrap_or(&files)).ctx(|| format!("create {}", files.display()))?;
        std::fs::write(&hosts, format!("127.0.0.1\tlocalhost\n::1\tlocalhost\n10.0.0.1\t{name}\n"))
            .ctx(|| format!("write {}", hosts.display()))?;
        std::fs::write(&message, b"").ctx(|| format!("write {}", message.display()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&message, std::fs::Permissions::from_mode(0o666))
            .ctx(|| format!("chmod {}", message.display()))?;
        let mut container = container_config(&["sleep", "3600"]);
        shape_container(&mut container, &name, &uid, &hosts, &message);
        if self.objects {
            container.mounts.extend(object_volumes(&files.join("volumes"))?);
        }
        run(client, pod, container, &name, &log_dir).await
    }

    fn shape_sandbox(&self, pod: &mut PodSandboxConfig, name: &str, uid: &str) {
        pod.labels.extend(kubelet_labels(name, uid));
        pod.annotations.insert(labels::GRACE_PERIOD.into(), "30".into());
        pod.dns_config = Some(self.dns.clone());
        if let Some(linux) = pod.linux.as_mut() {
            linux.cgroup_parent = format!("{}/pod{uid}", self.cgroup_parent);
            linux.resources = Some(gantry_cri::api::LinuxContainerResources { cpu_shares: 2, ..Default::default() });
        }
    }
}

fn kubelet_labels(name: &str, uid: &str) -> [(String, String); 3] {
    [
        (labels::POD_NAME.into(), name.into()),
        (labels::POD_NAMESPACE.into(), RAW_NAMESPACE.into()),
        (labels::POD_UID.into(), uid.into()),
    ]
}

fn shape_container(c: &mut ContainerConfig, name: &str, uid: &str, hosts: &Path, message: &Path) {
    c.labels.extend(kubelet_labels(name, uid));
    c.labels.insert(labels::CONTAINER_NAME.into(), CONTAINER_NAME.into());
    c.annotations.extend([
        (labels::CONTAINER_HASH.into(), "5d2a6b1e".into()),
        (labels::RESTART_COUNT.into(), "0".into()),
        (labels::GRACE_PERIOD.into(), "30".into()),
        (labels::TERMINATION_MESSAGE_PATH.into(), "/dev/termination-log".into()),
        (labels::TERMINATION_MESSAGE_POLICY.into(), "File".into()),
    ]);
    c.log_path = format!("{CONTAINER_NAME}/0.log");
    let service = [
        ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
        ("KUBERNETES_SERVICE_PORT", "443"),
        ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
        ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
        ("KUBERNETES_PORT_443_TCP", "tcp://10.96.0.1:443"),
        ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
        ("KUBERNETES_PORT_443_TCP_PORT", "443"),
        ("KUBERNETES_PORT_443_TCP_ADDR", "10.96.0.1"),
    ];
    c.envs =
        service.iter().map(|(k, v)| gantry_cri::api::KeyValue { key: k.to_string(), value: v.to_string() }).collect();
    let mount = |container_path: &str, host: &Path| gantry_cri::api::Mount {
        container_path: container_path.into(),
        host_path: host.to_string_lossy().into_owned(),
        ..Default::default()
    };
    c.mounts = vec![mount("/etc/hosts", hosts), mount("/dev/termination-log", message)];
    if let Some(linux) = c.linux.as_mut() {
        linux.resources = Some(gantry_cri::api::LinuxContainerResources {
            cpu_shares: 2,
            cpu_period: 100_000,
            oom_score_adj: 1000,
            ..Default::default()
        });
        if let Some(security) = linux.security_context.as_mut() {
            let paths = |paths: &[&str]| paths.iter().map(|p| p.to_string()).collect();
            security.masked_paths = paths(MASKED_PATHS);
            security.readonly_paths = paths(READONLY_PATHS);
        }
    }
}

/// The objects case's volumes, written below `dir`, as container mounts: the ConfigMap's
/// directory, and the Secret's and the token's tmpfs.
fn object_volumes(dir: &Path) -> Result<Vec<gantry_cri::api::Mount>> {
    let (config, secret, token) = (dir.join("cfg"), dir.join("sec"), dir.join("token"));
    write_files(&config, &[("v", "1")])?;
    mount_tmpfs(&secret)?;
    write_files(&secret, &[("k", "1")])?;
    mount_tmpfs(&token)?;
    write_files(
        &token,
        &[
            ("token", "header.claims.signature"),
            ("ca.crt", "-----BEGIN CERTIFICATE-----\n"),
            ("namespace", RAW_NAMESPACE),
        ],
    )?;
    let mount = |container_path: &str, host: &Path, readonly| gantry_cri::api::Mount {
        container_path: container_path.into(),
        host_path: host.to_string_lossy().into_owned(),
        readonly,
        ..Default::default()
    };
    Ok(vec![
        mount("/cfg", &config, false),
        mount("/sec", &secret, false),
        mount("/var/run/secrets/kubernetes.io/serviceaccount", &token, true),
    ])
}

fn write_files(dir: &Path, files: &[(&str, &str)]) -> Result<()> {
    std::fs::create_dir_all(dir).ctx(|| format!("create {}", dir.display()))?;
    for (name, content) in files {
        let path = dir.join(name);
        std::fs::write(&path, content).ctx(|| format!("write {}", path.display()))?;
    }
    Ok(())
}

fn mount_tmpfs(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).ctx(|| format!("create {}", dir.display()))?;
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).expect("no NUL in a path we made");
    // SAFETY: NUL-terminated strings that outlive the call; no data argument.
    let mounted = unsafe { libc::mount(c"tmpfs".as_ptr(), path.as_ptr(), c"tmpfs".as_ptr(), 0, std::ptr::null()) };
    if mounted != 0 {
        return Err(std::io::Error::last_os_error()).ctx(|| format!("mount a tmpfs on {}", dir.display()));
    }
    Ok(())
}

/// Where kubelet-shaped raw pods' files go.
fn raw_files(ctd: &Containerd) -> PathBuf {
    ctd.dir().join("raw-pods")
}

/// Unmounts the tmpfs of [`Shape::KubeletWithObjects`] pods and removes the files of every
/// kubelet-shaped raw pod; call it once their sandboxes are removed.
pub fn remove_raw_files(ctd: &Containerd) -> Result<()> {
    let files = raw_files(ctd);
    let Ok(pods) = std::fs::read_dir(&files) else { return Ok(()) };
    for pod in pods.flatten() {
        for volume in ["sec", "token"] {
            let path = pod.path().join("volumes").join(volume);
            let Ok(path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else { continue };
            // SAFETY: a NUL-terminated path. Not mounted (a pod of another shape): EINVAL.
            unsafe { libc::umount2(path.as_ptr(), 0) };
        }
    }
    std::fs::remove_dir_all(&files).ctx(|| format!("remove {}", files.display()))
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
    let (name, log_dir) = next_pod(log_root)?;
    let pod = pod_config(&name, &log_dir);
    run(client, pod, container_config(command), &name, &log_dir).await
}

/// A new raw pod's name, and its log directory, created (as the kubelet does; containerd only
/// writes in it).
fn next_pod(log_root: &Path) -> Result<(String, PathBuf)> {
    let name = format!("raw-{}", NEXT_POD.fetch_add(1, Ordering::Relaxed));
    let log_dir = log_root.join(&name);
    std::fs::create_dir_all(&log_dir).ctx(|| format!("create {}", log_dir.display()))?;
    Ok((name, log_dir))
}

fn pod_uid(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

/// RunPodSandbox → CreateContainer → StartContainer.
async fn run(
    client: &mut RuntimeServiceClient<Channel>,
    pod: PodSandboxConfig,
    container: ContainerConfig,
    name: &str,
    log_dir: &Path,
) -> Result<RawPod> {
    let sandbox_id = client
        .run_pod_sandbox(RunPodSandboxRequest { config: Some(pod.clone()), runtime_handler: String::new() })
        .await
        .map_err(TestkitError::cri("RunPodSandbox"))?
        .into_inner()
        .pod_sandbox_id;
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
            uid: pod_uid(name),
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
