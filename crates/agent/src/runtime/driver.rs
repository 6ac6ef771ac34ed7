//! Executes the core's actions through CRI.

mod resize;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::join_all;
use gantry_cri::{Cri, CriError, api};
use gantry_pod::recursive_read_only;
use gantry_pod::start_failure::StartFailure;
use k8s_openapi::api::core::v1::{Container, Pod};

use super::cgroups::{self, CgroupFs};
use super::config::{self, ContainerContext, SandboxContext};
use super::csi::CsiVolumes;
use super::env::{self, EnvObjects};
use super::handlers::Target;
use super::security::{self, ImageUser, NodeSecurity};
use super::start_slots::{Slot, StartKind, StartSlots};
use super::systemd::{self, SystemdError};
use super::{dns, downward, hooks, hosts, service_env, termination, volumes};
use crate::cluster::objects::ObjectSource;
use crate::events::{EventType, Recorder};
use crate::image::puller::ImagePuller;
use gantry_config::CgroupDriver;
use gantry_config::PodSettings;
use gantry_plugins::devices::{AdmitError, DeviceManager, RunOptions};
use gantry_pod::ObservedPod;
use gantry_pod::resize::Amounts;
use gantry_pod::resources::CgroupValues;
use gantry_vocab::spec;

/// Why a container (or the sandbox) could not be started, with the upstream waiting reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", reason.reason())]
pub struct StartError {
    pub reason: StartFailure,
    pub message: String,
}

impl StartError {
    pub(super) fn new(reason: StartFailure, message: impl Into<String>) -> Self {
        StartError { reason, message: message.into() }
    }
}

/// A container that is running now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub id: String,
}

#[derive(Clone)]
pub struct Driver {
    cri: Cri,
    node: String,
    pod_logs_dir: PathBuf,
    root_dir: PathBuf,
    /// ConfigMaps, Secrets and tokens for volumes and env (cluster mode only).
    objects: Option<ObjectSource>,
    images: ImagePuller,
    /// Cgroups, DNS and security settings for pods.
    pods: Arc<PodSettings>,
    /// Who makes the pod cgroups: the cgroup file system (cgroupfs driver, v1 or v2) or
    /// systemd's slices (systemd driver).
    cgroups: Option<Arc<dyn CgroupFs>>,
    /// The `kubepods` cgroup's limits (node allocatable enforcement).
    kubepods_limits: Option<CgroupValues>,
    /// Containers get `memory.oom.group=1` (cgroup v2 unless `singleProcessOOMKill`).
    oom_group: bool,
    /// MemoryQoS: the gate, on cgroup v2.
    memory_qos: bool,
    /// Events about a pod's setup (DNS configuration).
    events: Recorder,
    /// `<root-dir>/seccomp`, where Localhost seccomp profiles live.
    seccomp_root: PathBuf,
    /// The node's allocatable as its status reports it: the downward API's default for missing
    /// limits and the bound of memory-backed volumes.
    allocatable: Amounts,
    /// The machine's memory, which OOM scores are relative to.
    memory_capacity: i128,
    /// Device plugins: admission allocates devices, container starts get them.
    devices: Option<DeviceManager>,
    /// CSI drivers: claim volumes set up at container start, torn down with the pod.
    csi: Option<Arc<CsiVolumes>>,
    /// Sandbox creations and container create-and-starts in flight, node-wide (see
    /// [`RUNTIME_STARTS`]).
    starts: StartSlots,
    /// The runtime's default handler supports recursive read-only mounts, as its last
    /// `Status` answer said.
    recursive_read_only: Arc<AtomicBool>,
}

/// How many sandbox creations and container create-and-starts run at once. All at once is
/// slower in all, not faster: 110 pods started all together took 1.32× as long as 8
/// concurrent raw CRI callers did, while 8 callers were 2.7× as fast as one and 4 nearly as fast
/// as 8 (48.6 s against 45.0 s; the density benchmark on 2 shared cores). Pulls
/// and hooks are not counted: a slow pull must not hold up other pods. A freed slot goes to a
/// waiting container start before a waiting sandbox creation ([`StartSlots`]).
pub const RUNTIME_STARTS: usize = 8;

impl Driver {
    /// `parallel_pulls`: how many image pulls may run at once node-wide (`None`: no limit).
    pub fn new(cri: Cri, node: &str, pod_logs_dir: PathBuf, root_dir: PathBuf, parallel_pulls: Option<usize>) -> Self {
        let images = ImagePuller::new(cri.images.clone(), parallel_pulls);
        Driver {
            cri,
            node: node.to_string(),
            pod_logs_dir,
            seccomp_root: root_dir.join("seccomp"),
            root_dir,
            objects: None,
            images,
            pods: Arc::default(),
            cgroups: None,
            kubepods_limits: None,
            oom_group: false,
            memory_qos: false,
            events: Recorder::default(),
            allocatable: Amounts::default(),
            memory_capacity: 0,
            devices: None,
            csi: None,
            starts: StartSlots::new(RUNTIME_STARTS),
            recursive_read_only: Arc::default(),
        }
    }

    /// Asks the runtime (CRI `Status`) what its handlers support; a failed call keeps what the
    /// last one said. Called at start and before starting a container that asks for a
    /// recursively read-only mount, so an upgraded runtime is seen without a restart.
    pub async fn refresh_runtime_features(&self) {
        match self.cri.runtime.status(api::StatusRequest { verbose: false }).await {
            Ok(status) => self.recursive_read_only.store(default_handler_rro(&status), Ordering::Relaxed),
            Err(e) => tracing::debug!(node = %self.node, error = %e, "cannot read the runtime's features"),
        }
    }

    /// Whether mounts can be recursively read-only (pods run on the default runtime handler).
    pub fn supports_recursive_read_only(&self) -> bool {
        self.recursive_read_only.load(Ordering::Relaxed)
    }

    /// A place among the [`RUNTIME_STARTS`] runtime starts in flight.
    async fn start_slot(&self, kind: StartKind) -> Slot {
        self.starts.acquire(kind).await
    }

    /// Pods get their devices from `devices` (device plugins).
    pub fn with_devices(self, devices: DeviceManager) -> Self {
        Driver { devices: Some(devices), ..self }
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Claim volumes come from CSI drivers (`csi`).
    pub fn with_csi(self, csi: CsiVolumes) -> Self {
        Driver { csi: Some(Arc::new(csi)), ..self }
    }

    /// The node's CSI volumes, when claim volumes are served.
    pub fn csi(&self) -> Option<&CsiVolumes> {
        self.csi.as_deref()
    }

    pub fn devices(&self) -> Option<&DeviceManager> {
        self.devices.as_ref()
    }

    /// The node's allocatable (capacity − reservations − hard eviction thresholds, the figure
    /// the Node status reports) and the machine's memory capacity.
    pub fn with_node_resources(self, allocatable: Amounts, memory_capacity: i128) -> Self {
        Driver { allocatable, memory_capacity, ..self }
    }

    pub fn with_objects(self, objects: ObjectSource) -> Self {
        let images = self.images.clone().with_secrets(objects.clone());
        Driver { objects: Some(objects), images, ..self }
    }

    /// Image events (Pulling, Pulled, …) and pod setup events (DNS) go to `events`.
    pub fn with_events(self, events: Recorder) -> Self {
        Driver { images: self.images.clone().with_events(events.clone()), events, ..self }
    }

    pub fn images(&self) -> &ImagePuller {
        &self.images
    }

    /// Pod settings, and who makes the pod cgroups: Gantry in the cgroup file system (cgroupfs
    /// driver, either hierarchy) or systemd as slice units (systemd driver).
    /// `kubepods_limits`: the node allocatable to enforce on `kubepods`, if any.
    pub async fn with_pod_settings(
        self,
        pods: PodSettings,
        kubepods_limits: Option<CgroupValues>,
    ) -> Result<Self, SystemdError> {
        let cgroups: Option<Arc<dyn CgroupFs>> = match pods.cgroup_driver {
            _ if !pods.cgroups_per_qos => None,
            CgroupDriver::Cgroupfs => cgroups::detect().map(Arc::from),
            CgroupDriver::Systemd => {
                if !systemd::running() {
                    return Err(SystemdError::NotRunning);
                }
                let mount = Path::new(cgroups::MOUNT);
                // Slices are listed in the unified tree, or in v1's memory hierarchy.
                let listing = match cgroups::hierarchy(mount) {
                    Some(cgroups::Hierarchy::V1) => mount.join("memory"),
                    _ => mount.to_path_buf(),
                };
                Some(Arc::new(systemd::Slices::connect(listing).await?))
            }
        };
        // Upstream: on cgroup v2 the kernel kills a container's processes together on OOM
        // unless singleProcessOOMKill (on cgroup v1 it always kills one process).
        let v2 = cgroups::hierarchy(Path::new(cgroups::MOUNT)) == Some(cgroups::Hierarchy::V2);
        let oom_group = v2 && !pods.single_process_oom_kill.unwrap_or(false);
        let memory_qos = v2 && pods.memory_qos;
        let driver = Driver { pods: Arc::new(pods), cgroups, kubepods_limits, oom_group, memory_qos, ..self };
        driver.enforce_node_allocatable().await;
        Ok(driver)
    }

    /// Gives `kubepods` the node's allocatable as its limits at start-up, as upstream does
    /// (pods keep them: every pod's sandbox creation sets them again).
    async fn enforce_node_allocatable(&self) {
        let (Some(fs), Some(limits)) = (self.cgroups.clone(), self.kubepods_limits) else { return };
        let Some(kubepods) = cgroups::qos_paths(&self.pods).into_iter().next() else { return };
        let path = kubepods.clone();
        let result = tokio::task::spawn_blocking(move || fs.ensure(&path, Some(&limits)))
            .await
            .expect("cgroup task does not panic");
        match result {
            Ok(()) => tracing::info!(cgroup = %kubepods, "Updated Node Allocatable limit across pods"),
            Err(e) => tracing::warn!(cgroup = %kubepods, "Failed to update Node Allocatable Limits {kubepods:?}: {e}"),
        }
    }

    /// Enforces `kubeReserved`/`systemReserved` on their existing cgroups when
    /// `enforceNodeAllocatable` lists them (upstream's `enforceExistingCgroup`): the cgroup must
    /// exist; its limits are set through the cgroup driver.
    pub async fn enforce_reserved(&self, settings: &gantry_config::Settings) -> Result<(), cgroups::ReservedError> {
        let Some(fs) = self.cgroups.clone() else { return Ok(()) };
        let mount = Path::new(cgroups::MOUNT);
        let Some(hierarchy) = cgroups::hierarchy(mount) else { return Ok(()) };
        let jobs = [
            (
                "System Reserved",
                &settings.system_reserved_cgroup,
                &settings.system_reserved,
                settings.enforce_system_reserved,
            ),
            ("Kube Reserved", &settings.kube_reserved_cgroup, &settings.kube_reserved, settings.enforce_kube_reserved),
        ];
        for (which, cgroup, reserved, limits) in jobs {
            if limits == gantry_config::ReservedLimits::Off {
                continue;
            }
            let failed = |problem| cgroups::ReservedError { which, cgroup: cgroup.clone(), problem };
            let mut values = cgroups::reserved_values(reserved, limits)
                .ok_or_else(|| failed(cgroups::ReservedProblem::NotConfigured(cgroup.clone())))?;
            if self.memory_qos {
                // Upstream protects the reserved memory too under MemoryQoS.
                values.memory_min = values.memory_limit;
            }
            let missing = cgroups::missing_paths(mount, hierarchy, cgroup);
            if !missing.is_empty() {
                let paths = missing.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
                return Err(failed(cgroups::ReservedProblem::Missing { cgroup: cgroup.clone(), paths }));
            }
            let (fs, path) = (fs.clone(), cgroup.clone());
            tokio::task::spawn_blocking(move || fs.ensure(&path, Some(&values)))
                .await
                .expect("cgroup task does not panic")
                .map_err(|e| failed(e.into()))?;
            tracing::info!(
                cgroup = %cgroup,
                cpu_shares = values.cpu_shares,
                memory_limit = values.memory_limit,
                pids_limit = values.pids_limit,
                "Updated limits on {} cgroup {cgroup}",
                which.to_lowercase()
            );
        }
        Ok(())
    }

    /// Sets the QoS levels' CPU shares: the Burstable level's from its pods' requests, the
    /// BestEffort level's the minimum; under MemoryQoS also their `memory.min`. False when it
    /// could not (logged; tried again later).
    pub async fn update_qos_cgroups(&self, want: cgroups::QosWanted) -> bool {
        let Some(fs) = self.cgroups.clone() else { return true };
        let memory_min = self.memory_qos.then_some(want.memory_min);
        let levels = cgroups::qos_levels(&self.pods, want.burstable_shares, memory_min);
        let result = tokio::task::spawn_blocking(move || {
            levels.iter().try_for_each(|(path, values)| fs.ensure(path, Some(values)))
        })
        .await
        .expect("cgroup task does not panic");
        match result {
            Ok(()) => {
                tracing::debug!(?want, "updated the QoS cgroups");
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "Failed to update QoS cgroup configuration");
                false
            }
        }
    }

    /// Checks the runtime's cgroup driver where it reports one (CRI `RuntimeConfig`, as upstream
    /// asks it at start-up); runtimes without the call are checked at the first sandbox.
    pub async fn check_runtime_cgroup_driver(&self) -> Result<(), cgroups::DriverMismatch> {
        let reported = match self.cri.runtime.runtime_config(api::RuntimeConfigRequest {}).await {
            Ok(config) => config.linux.map(|l| l.cgroup_driver()),
            Err(e) if e.code() == Some(gantry_cri::Code::Unimplemented) => {
                tracing::info!(
                    "CRI implementation should be updated to support RuntimeConfig. Falling back to using cgroupDriver from kubelet config."
                );
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot ask the runtime for its cgroup driver");
                None
            }
        };
        let Some(runtime) = reported else { return Ok(()) };
        let runtime = match runtime {
            api::CgroupDriver::Systemd => CgroupDriver::Systemd,
            api::CgroupDriver::Cgroupfs => CgroupDriver::Cgroupfs,
        };
        tracing::info!(cgroup_driver = runtime.as_str(), "cgroup driver reported by the container runtime");
        cgroups::check_runtime_driver(self.pods.cgroup_driver, runtime)
    }

    fn node_security(&self) -> NodeSecurity<'_> {
        NodeSecurity {
            seccomp_default: self.pods.seccomp_default,
            allow_privileged: self.pods.allow_privileged,
            seccomp_root: &self.seccomp_root,
        }
    }

    fn fields(&self, pod_ip: Option<&str>) -> downward::Fields {
        downward::Fields {
            node: self.node.clone(),
            pod_ip: pod_ip.map(str::to_string),
            host_ip: None,
            node_cpu_milli: self.allocatable.cpu_milli,
            node_memory_bytes: self.allocatable.memory,
        }
    }

    /// Rewrites the pod's API-backed volumes whose sources changed (called on each pod sync).
    pub async fn refresh_volumes(&self, pod: &Pod, pod_ip: Option<&str>) {
        if !volumes::has_projections(pod) {
            return;
        }
        if let Err(e) =
            volumes::prepare(&self.root_dir, pod, self.objects.as_ref(), self.csi.as_deref(), &self.fields(pod_ip))
                .await
        {
            tracing::warn!(pod = %spec::full_name(pod), error = %e.message, "cannot refresh volumes");
        }
    }

    /// The ConfigMaps and Secrets the container's environment refers to (missing ones absent).
    async fn env_objects(&self, pod: &Pod, c: &Container) -> Result<EnvObjects, StartError> {
        let (cms, secrets) = env::referenced(c);
        let mut out = EnvObjects::default();
        let failed = |m: String| StartError::new(StartFailure::CreateContainerConfigError, m);
        if let Some(source) = &self.objects {
            match source.services(pod).await {
                Ok(services) => out.services = service_env::for_pod(pod, &services),
                // Static pods must run while the API server does not (it may be one of them).
                Err(e) if !gantry_vocab::keys::is_api_pod(pod) => {
                    tracing::warn!(pod = %spec::full_name(pod), error = %e, "starting static pod without service environment variables");
                }
                Err(e) => return Err(failed(e.to_string())),
            }
        }
        if cms.is_empty() && secrets.is_empty() {
            return Ok(out);
        }
        let Some(source) = &self.objects else {
            return Err(StartError::new(
                StartFailure::CreateContainerConfigError,
                "env refers to API objects but there is no API server",
            ));
        };
        for name in cms {
            if let Some(cm) = source.config_map(pod, &name).await.map_err(|e| failed(e.to_string()))? {
                out.config_maps.insert(name, cm);
            }
        }
        for name in secrets {
            if let Some(s) = source.secret(pod, &name).await.map_err(|e| failed(e.to_string()))? {
                out.secrets.insert(name, s);
            }
        }
        Ok(out)
    }

    pub fn runtime_name(&self) -> &str {
        &self.cri.version.runtime_name
    }

    /// `--root-dir` (pod directories, volumes).
    pub fn root_dir(&self) -> &Path {
        &self.root_dir
    }

    pub fn cri(&self) -> &Cri {
        &self.cri
    }

    /// Whether this node can run the pod at all (sysctl admission); `Err((reason, message))`.
    pub fn admit(&self, pod: &Pod) -> Result<(), (&'static str, String)> {
        gantry_pod::sysctl::admit(pod, &self.pods.allowed_unsafe_sysctls)
            .map_err(|e| (gantry_pod::sysctl::FORBIDDEN_REASON, e.to_string()))
    }

    /// Allocates the pod's devices (device plugins), or says why the pod cannot be admitted
    /// (upstream's `UnexpectedAdmissionError`). A pod that fails here keeps no device.
    pub async fn admit_devices(&self, pod: &Pod) -> Result<(), (&'static str, String)> {
        let Some(devices) = &self.devices else { return Ok(()) };
        devices.admit(pod).await.map_err(|e| {
            devices.release(spec::uid(pod));
            (AdmitError::REASON, e.to_string())
        })
    }

    /// Frees the devices of a pod that is gone.
    pub fn release_devices(&self, uid: &str) {
        if let Some(devices) = &self.devices {
            devices.release(uid);
        }
    }

    /// Frees the devices of every pod not in `active` (removed while the agent was down).
    pub fn retain_devices(&self, active: &std::collections::BTreeSet<String>) {
        if let Some(devices) = &self.devices {
            devices.retain(active);
        }
    }

    /// The sandbox's hostname, DNS, cgroup parent and security context; `record` emits the
    /// DNS events (once per sandbox, not on every container start).
    async fn sandbox_context(&self, pod: &Pod, record: bool) -> Result<SandboxContext, StartError> {
        let failed = |m: String| StartError::new(StartFailure::CreatePodSandboxError, m);
        let host_resolv_conf = match self.pods.resolv_conf.as_str() {
            "" => None,
            path => Some(
                tokio::fs::read_to_string(path)
                    .await
                    .map_err(|e| failed(format!("cannot read resolv.conf {path}: {e}")))?,
            ),
        };
        let node_dns = dns::NodeDns {
            cluster_dns: &self.pods.cluster_dns,
            cluster_domain: &self.pods.cluster_domain,
            host_resolv_conf: host_resolv_conf.as_deref(),
        };
        let pod_dns = dns::compose(pod, &node_dns);
        if record {
            for (reason, message) in &pod_dns.events {
                self.events.record(pod, None, EventType::Warning, reason, message);
            }
        }
        let hostname = if spec::host_network(pod) {
            String::new()
        } else {
            hosts::kernel_hostname(pod, &self.pods.cluster_domain).map_err(|e| failed(e.to_string()))?
        };
        Ok(SandboxContext {
            hostname,
            dns: pod_dns.config,
            cgroup_parent: cgroups::plan(&self.pods, self.kubepods_limits, pod).parent,
            security: security::sandbox(pod, &self.node_security()).map_err(|e| failed(e.to_string()))?,
        })
    }

    /// Creates the pod's cgroups (QoS level, then the pod's own with its limits).
    async fn ensure_cgroups(&self, pod: &Pod) -> Result<(), StartError> {
        let Some(fs) = self.cgroups.clone() else { return Ok(()) };
        let mut plan = cgroups::plan(&self.pods, self.kubepods_limits, pod);
        if self.memory_qos
            && let Some((_, Some(own))) = plan.create.last_mut()
        {
            // Upstream's ResourceConfigForPod under MemoryQoS: the pod's requests are protected.
            own.memory_min = gantry_pod::resources::pod_memory_request(pod);
        }
        tokio::task::spawn_blocking(move || {
            plan.create.iter().try_for_each(|(path, values)| fs.ensure(path, values.as_ref()))
        })
        .await
        .expect("cgroup task does not panic")
        .map_err(|e| StartError::new(StartFailure::CreatePodSandboxError, format!("cannot create the pod cgroup: {e}")))
    }

    /// Creates the pod's sandbox (network namespace, pause container) and its log directory.
    pub async fn create_sandbox(&self, pod: &Pod, attempt: u32) -> Result<String, StartError> {
        self.ensure_cgroups(pod).await?;
        let ctx = self.sandbox_context(pod, true).await?;
        let config = config::sandbox_config(pod, &self.node, &self.pod_logs_dir, attempt, ctx);
        tokio::fs::create_dir_all(&config.log_directory).await.map_err(|e| {
            StartError::new(StartFailure::CreatePodSandboxError, format!("cannot create {}: {e}", config.log_directory))
        })?;
        let request = api::RunPodSandboxRequest { config: Some(config), runtime_handler: String::new() };
        let slot = self.start_slot(StartKind::Sandbox).await;
        let response = self.cri.runtime.run_pod_sandbox(request).await;
        drop(slot);
        let response = response.map_err(|e| {
            let message = e.to_string();
            let reason = StartFailure::CreatePodSandboxError;
            match cgroups::mismatch_in_sandbox_error(self.pods.cgroup_driver, &message) {
                Some(mismatch) => StartError::new(reason, format!("{mismatch}: {message}")),
                None => StartError::new(reason, format!("Failed to create pod sandbox: {message}")),
            }
        })?;
        self.check_sandbox_cgroup(pod, &response.pod_sandbox_id).await?;
        Ok(response.pod_sandbox_id)
    }

    /// With the systemd driver, a sandbox whose process is outside its pod's slice shows a
    /// runtime on the cgroupfs driver (containerd 1.6 cannot say so through CRI): the sandbox is
    /// removed and the pod fails with the mismatch, as a refused parent does the other way. A
    /// runtime that reports no process for the sandbox is not checked.
    async fn check_sandbox_cgroup(&self, pod: &Pod, id: &str) -> Result<(), StartError> {
        if self.cgroups.is_none() || self.pods.cgroup_driver != CgroupDriver::Systemd {
            return Ok(());
        }
        let request = api::PodSandboxStatusRequest { pod_sandbox_id: id.into(), verbose: true };
        let Some(pid) = self.cri.runtime.pod_sandbox_status(request).await.ok().and_then(|s| sandbox_pid(&s.info))
        else {
            return Ok(());
        };
        let Ok(proc_cgroup) = tokio::fs::read_to_string(format!("/proc/{pid}/cgroup")).await else { return Ok(()) };
        let parent = cgroups::plan(&self.pods, self.kubepods_limits, pod).parent;
        let Some(mismatch) = cgroups::mismatch_in_sandbox_cgroup(self.pods.cgroup_driver, &parent, &proc_cgroup) else {
            return Ok(());
        };
        let found = proc_cgroup.lines().next().unwrap_or_default().to_string();
        tracing::error!(pod = %spec::full_name(pod), expected = %parent, found = %found, "{mismatch}");
        let _ = self.cri.runtime.stop_pod_sandbox(api::StopPodSandboxRequest { pod_sandbox_id: id.into() }).await;
        let _ = self.remove_sandbox(id).await;
        let message = format!("{mismatch}: the sandbox runs in cgroup {found:?}, not below {parent}");
        Err(StartError::new(StartFailure::CreatePodSandboxError, message))
    }

    /// The managed `/etc/hosts` mount, unless a volume is mounted there or the pod has no IP yet.
    async fn hosts_mount(
        &self,
        pod: &Pod,
        c: &Container,
        pod_ip: Option<&str>,
    ) -> Result<Option<api::Mount>, StartError> {
        let user_mounted = c.volume_mounts.iter().flatten().any(|m| m.mount_path.trim_end_matches('/') == "/etc/hosts");
        if user_mounted || (pod_ip.is_none() && !spec::host_network(pod)) {
            return Ok(None);
        }
        let node_hosts = if spec::host_network(pod) {
            tokio::fs::read_to_string("/etc/hosts").await.unwrap_or_default()
        } else {
            String::new()
        };
        let content = hosts::content(pod, pod_ip, &self.pods.cluster_domain, &node_hosts);
        let dir = volumes::pod_dir(&self.root_dir, spec::uid(pod));
        let mount = tokio::task::spawn_blocking(move || hosts::write(&dir, &content))
            .await
            .expect("hosts task does not panic")
            .map_err(|e| {
                StartError::new(StartFailure::CreateContainerConfigError, format!("cannot write the hosts file: {e}"))
            })?;
        Ok(Some(mount))
    }

    /// The user the container's image runs as.
    async fn image_user(&self, c: &Container) -> Result<ImageUser, StartError> {
        let spec = api::ImageSpec { image: c.image.clone().unwrap_or_default(), ..Default::default() };
        let status = self.cri.images.image_status(api::ImageStatusRequest { image: Some(spec), verbose: false });
        let image = status.await.map_err(|e| StartError::new(StartFailure::ImageInspectError, e.to_string()))?.image;
        Ok(ImageUser::of(image.as_ref()))
    }

    /// Makes the image present (see [`ImagePuller`]), then creates and starts the container.
    /// `target_id`: the container whose process namespace it joins (ephemeral containers).
    pub async fn start_container(
        &self,
        pod: &Pod,
        c: &Container,
        sandbox_id: &str,
        attempt: u32,
        pod_ip: Option<&str>,
        target_id: Option<&str>,
    ) -> Result<Started, StartError> {
        let image = self.images.ensure_image(pod, c).await.map_err(|f| StartError::new(f.reason, f.message))?;
        let fields = self.fields(pod_ip);
        let volumes =
            volumes::prepare(&self.root_dir, pod, self.objects.as_ref(), self.csi.as_deref(), &fields).await?;
        if recursive_read_only::requested(c.volume_mounts.as_deref().unwrap_or_default()) {
            self.refresh_runtime_features().await;
        }
        let mut mounts = volumes::mounts(c, &volumes, self.supports_recursive_read_only())
            .map_err(|e| StartError::new(StartFailure::CreateContainerConfigError, e.to_string()))?;
        mounts.extend(self.hosts_mount(pod, c, pod_ip).await?);
        mounts.extend(self.termination_message_mount(pod, c, attempt)?);
        let env_objects = self.env_objects(pod, c).await?;
        let image_user = match image {
            Some(image) => ImageUser::of(Some(&image)),
            None => self.image_user(c).await?,
        };
        let mut devices: RunOptions = match &self.devices {
            Some(d) => d
                .run_options(pod, &c.name)
                .await
                .map_err(|e| StartError::new(StartFailure::CreateContainerConfigError, e.to_string()))?,
            None => Default::default(),
        };
        let block_devices = volumes::devices(c, &volumes)
            .map_err(|e| StartError::new(StartFailure::CreateContainerConfigError, e.to_string()))?;
        devices.devices.extend(block_devices);
        let node_allocatable = (fields.node_cpu_milli, fields.node_memory_bytes);
        let ctx = ContainerContext {
            node: &self.node,
            attempt,
            pod_ip,
            host_ip: None,
            mounts,
            env_objects,
            node_allocatable,
            memory_capacity: self.memory_capacity,
            image_user,
            node_security: self.node_security(),
            target_id,
            oom_group: self.oom_group,
            memory_qos: self.memory_qos.then_some(self.pods.memory_throttling_factor),
            devices,
        };
        let container_config = config::container_config(pod, c, ctx)
            .map_err(|e| StartError::new(StartFailure::CreateContainerConfigError, e.to_string()))?;
        let sandbox_ctx = self.sandbox_context(pod, false).await?;
        let sandbox_config = config::sandbox_config(pod, &self.node, &self.pod_logs_dir, 0, sandbox_ctx);
        let request = api::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            config: Some(container_config),
            sandbox_config: Some(sandbox_config),
        };
        let slot = self.start_slot(StartKind::Container).await;
        let id = self
            .cri
            .runtime
            .create_container(request)
            .await
            .map_err(|e| StartError::new(StartFailure::CreateContainerError, e.to_string()))?
            .container_id;
        self.cri
            .runtime
            .start_container(api::StartContainerRequest { container_id: id.clone() })
            .await
            .map_err(|e| StartError::new(StartFailure::RunContainerError, e.to_string()))?;
        drop(slot);
        if let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            let target = Target::new(&self.cri.runtime, &id, c, pod, pod_ip);
            if let Err(message) = hooks::run(target, pod, hook).await {
                // Upstream kills the container (preStop included) and reports it as not started.
                if let (Err(e), _) = self.stop_container(pod, &c.name, &id, Self::grace(pod), pod_ip).await {
                    tracing::warn!(pod = %spec::full_name(pod), container = %c.name, error = %e, "cannot stop container after its postStart hook failed");
                }
                return Err(StartError::new(StartFailure::PostStartHookError, message.to_string()));
            }
        }
        Ok(Started { id })
    }

    /// The bind mount of the container's termination message file (a fresh, empty host file
    /// per instance), unless the container has no `terminationMessagePath`.
    fn termination_message_mount(
        &self,
        pod: &Pod,
        c: &Container,
        attempt: u32,
    ) -> Result<Option<api::Mount>, StartError> {
        let container_path = termination::container_path(c);
        if container_path.is_empty() {
            return Ok(None);
        }
        let host = termination::host_file(&volumes::pod_dir(&self.root_dir, spec::uid(pod)), &c.name, attempt);
        termination::create(&host).map_err(|e| {
            StartError::new(StartFailure::CreateContainerConfigError, format!("cannot create {}: {e}", host.display()))
        })?;
        Ok(Some(api::Mount {
            container_path: container_path.to_string(),
            host_path: host.to_string_lossy().into_owned(),
            ..Default::default()
        }))
    }

    /// Stops one container with the given grace period; a container that is already gone is
    /// not an error.
    pub async fn kill_container(&self, id: &str, grace: Duration) -> Result<(), CriError> {
        already_gone_is_ok(self.cri.runtime.stop_container(id, grace).await)
    }

    /// Stops one container of `pod`: its preStop hook first, bounded by the grace period, then
    /// StopContainer with what is left of it (at least 2 s). Returns whether preStop failed.
    pub async fn stop_container(
        &self,
        pod: &Pod,
        name: &str,
        id: &str,
        grace: Duration,
        pod_ip: Option<&str>,
    ) -> (Result<(), CriError>, bool) {
        self.stop_in_turn(pod, name, id, grace, pod_ip, std::future::ready(())).await
    }

    /// [`Self::stop_container`], waiting for `turn` (within the grace period) between the
    /// preStop hook and StopContainer: a sidecar's turn comes once the containers it serves
    /// have stopped.
    async fn stop_in_turn(
        &self,
        pod: &Pod,
        name: &str,
        id: &str,
        grace: Duration,
        pod_ip: Option<&str>,
        turn: impl Future<Output = ()>,
    ) -> (Result<(), CriError>, bool) {
        let hook = spec::init_containers(pod)
            .iter()
            .chain(spec::containers(pod))
            .find(|s| s.name == name)
            .and_then(|s| Some((s, s.lifecycle.as_ref()?.pre_stop.as_ref()?)));
        let started = tokio::time::Instant::now();
        let mut hook_failed = false;
        if let Some((container, hook)) = hook.filter(|_| !grace.is_zero()) {
            let target = Target::new(&self.cri.runtime, id, container, pod, pod_ip);
            hook_failed = match tokio::time::timeout(grace, hooks::run(target, pod, hook)).await {
                Ok(Ok(())) => false,
                Ok(Err(message)) => {
                    tracing::warn!(pod = %spec::full_name(pod), container = name, error = %message, "preStop hook failed");
                    true
                }
                // Not finishing within the grace period is not a failure; StopContainer follows.
                Err(_) => false,
            };
        }
        if tokio::time::timeout(grace.saturating_sub(started.elapsed()), turn).await.is_err() {
            tracing::info!(pod = %spec::full_name(pod), container = name, "grace period over before the containers stopped that this sidecar waits for");
        }
        let grace_left = hooks::remaining_grace(grace, started.elapsed());
        (self.kill_container(id, grace_left).await, hook_failed)
    }

    /// Stops every running container of the pod (each after its preStop hook), then its
    /// sandboxes: regular containers at once, sidecars each once the regular containers and
    /// the sidecars declared after it have stopped (upstream's termination ordering), all
    /// within the one grace period. Returns the containers whose preStop hook failed.
    pub async fn kill_pod(&self, pod: &Pod, observed: &ObservedPod, grace: Duration) -> Result<Vec<String>, CriError> {
        let pod_ip = observed.current_sandbox().and_then(|s| s.ip.as_deref());
        let running: Vec<&str> = observed.running().map(|c| c.name.as_str()).collect();
        let (stopped_tx, stopped_rx) = tokio::sync::watch::channel(Vec::<String>::new());
        let stopped_tx = &stopped_tx;
        let running = &running;
        let stops = observed.running().map(|c| {
            let mut stopped = stopped_rx.clone();
            async move {
                let wait_for = gantry_pod::termination::stop_after(pod, &c.name, running);
                let turn = async move {
                    let _ = stopped.wait_for(|done| wait_for.iter().all(|n| done.iter().any(|d| d == n))).await;
                };
                let (result, hook_failed) = self.stop_in_turn(pod, &c.name, &c.id, grace, pod_ip, turn).await;
                stopped_tx.send_modify(|done| done.push(c.name.clone()));
                result.map(|()| hook_failed.then(|| c.name.clone()))
            }
        });
        let failed_hooks = join_all(stops).await.into_iter().collect::<Result<Vec<_>, _>>()?;
        for s in observed.sandboxes.iter().filter(|s| s.ready) {
            let request = api::StopPodSandboxRequest { pod_sandbox_id: s.id.clone() };
            already_gone_is_ok(self.cri.runtime.stop_pod_sandbox(request).await)?;
        }
        Ok(failed_hooks.into_iter().flatten().collect())
    }

    pub async fn remove_container(&self, id: &str) -> Result<(), CriError> {
        let request = api::RemoveContainerRequest { container_id: id.to_string() };
        already_gone_is_ok(self.cri.runtime.remove_container(request).await)
    }

    pub async fn remove_sandbox(&self, id: &str) -> Result<(), CriError> {
        let request = api::RemovePodSandboxRequest { pod_sandbox_id: id.to_string() };
        already_gone_is_ok(self.cri.runtime.remove_pod_sandbox(request).await)
    }

    /// Removes everything of a pod that is gone for good, including its directory.
    pub async fn remove_pod(&self, uid: &str, observed: &ObservedPod) -> Result<(), CriError> {
        for c in &observed.containers {
            self.remove_container(&c.id).await?;
        }
        for s in &observed.sandboxes {
            self.remove_sandbox(&s.id).await?;
        }
        let volumes_gone = match &self.csi {
            Some(csi) => csi.tear_down(uid).await,
            None => true,
        };
        // A volume still mounted keeps the pod's directory (its data is not the node's).
        if volumes_gone {
            volumes::cleanup(&self.root_dir, uid).await;
        }
        self.remove_cgroups(uid).await;
        if let Some(objects) = &self.objects {
            objects.forget(uid);
        }
        Ok(())
    }

    /// Removes the pod's cgroup (whichever QoS level it was under) once its containers are gone.
    async fn remove_cgroups(&self, uid: &str) {
        let Some(fs) = self.cgroups.clone() else { return };
        let paths = cgroups::pod_paths(&self.pods, uid);
        let result = tokio::task::spawn_blocking(move || paths.iter().try_for_each(|p| fs.remove(p)))
            .await
            .expect("cgroup task does not panic");
        if let Err(e) = result {
            tracing::warn!(pod_uid = uid, error = %e, "cannot remove the pod cgroup");
        }
    }

    /// Tears down the CSI volumes still published for pods that are gone (a teardown that
    /// failed, or a pod removed while the agent was down), then their directories; `keep` holds
    /// the UIDs of every pod that exists in the runtime or is wanted.
    pub async fn tear_down_orphaned_volumes(&self, keep: &std::collections::HashSet<String>) {
        let Some(csi) = &self.csi else { return };
        for uid in csi.pods_with_volumes().into_iter().filter(|uid| !keep.contains(uid)) {
            tracing::info!(pod_uid = %uid, "tearing down the CSI volumes of a pod that is gone");
            if csi.tear_down(&uid).await {
                volumes::cleanup(&self.root_dir, &uid).await;
            }
        }
    }

    /// Removes the cgroups of pods that are gone (e.g. removed while the agent was down); `keep`
    /// holds the UIDs of every pod that exists in the runtime or is wanted.
    pub async fn remove_orphaned_cgroups(&self, keep: std::collections::HashSet<String>) {
        let Some(fs) = self.cgroups.clone() else { return };
        let settings = self.pods.clone();
        let task = tokio::task::spawn_blocking(move || {
            for parent in cgroups::qos_paths(&settings) {
                for path in
                    cgroups::orphans(settings.cgroup_driver, &parent, &fs.children(&parent), |uid| keep.contains(uid))
                {
                    match fs.remove(&path) {
                        Ok(()) => tracing::info!(cgroup = %path, "removed orphaned pod cgroup"),
                        Err(e) => tracing::warn!(cgroup = %path, error = %e, "cannot remove orphaned pod cgroup"),
                    }
                }
            }
        });
        task.await.expect("cgroup task does not panic");
    }

    /// The grace period for stopping `pod` now.
    pub fn grace(pod: &Pod) -> Duration {
        Duration::from_secs(spec::termination_grace_seconds(pod) as u64)
    }
}

/// Stopping or removing something that no longer exists has done its job.
fn already_gone_is_ok<T>(result: Result<T, CriError>) -> Result<(), CriError> {
    match result {
        Err(e) if !e.is_not_found() => Err(e),
        _ => Ok(()),
    }
}

/// The sandbox's process in a verbose `PodSandboxStatus` (containerd: `{"pid": N, …}` under
/// `info`).
fn sandbox_pid(info: &std::collections::HashMap<String, String>) -> Option<u32> {
    let v: serde_json::Value = serde_json::from_str(info.get("info")?).ok()?;
    v.get("pid")?.as_u64().filter(|p| *p > 0).map(|p| p as u32)
}

/// Whether a CRI `Status` answer says the default runtime handler (`""`, which pods without a
/// RuntimeClass run on) supports recursive read-only mounts. A runtime that lists no handlers
/// (containerd before 2.0) supports nothing, as upstream reads it.
fn default_handler_rro(status: &api::StatusResponse) -> bool {
    status
        .runtime_handlers
        .iter()
        .any(|h| h.name.is_empty() && h.features.as_ref().is_some_and(|f| f.recursive_read_only_mounts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_default_handler_with_the_feature_supports_recursive_read_only() {
        let handler = |name: &str, rro: bool| api::RuntimeHandler {
            name: name.into(),
            features: Some(api::RuntimeHandlerFeatures { recursive_read_only_mounts: rro, user_namespaces: false }),
        };
        let status = |handlers| api::StatusResponse { runtime_handlers: handlers, ..Default::default() };
        assert!(!default_handler_rro(&status(vec![])), "a runtime that lists no handlers");
        assert!(!default_handler_rro(&status(vec![handler("", false), handler("kata", true)])));
        assert!(default_handler_rro(&status(vec![handler("", true), handler("kata", false)])));
    }
}
