//! Executes the core's actions through CRI.

use std::path::PathBuf;
use std::time::Duration;

use futures::future::join_all;
use gantry_cri::{Cri, CriError, api};
use k8s_openapi::api::core::v1::{Container, Pod};

use super::config::{self, ContainerContext};
use super::env::{self, EnvObjects};
use super::handlers::Target;
use super::{downward, hooks, service_env, termination, volumes};
use crate::cluster::objects::ObjectSource;
use crate::pod::ObservedPod;
use crate::pod::spec::{self, PullPolicy};

/// Why a container (or the sandbox) could not be started, with the upstream waiting reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct StartError {
    pub reason: &'static str,
    pub message: String,
}

impl StartError {
    pub(super) fn new(reason: &'static str, message: impl Into<String>) -> Self {
        StartError { reason, message: message.into() }
    }
}

/// A container that is running now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub id: String,
    /// Whether the image had to be pulled first.
    pub pulled: bool,
}

#[derive(Clone)]
pub struct Driver {
    cri: Cri,
    node: String,
    pod_logs_dir: PathBuf,
    root_dir: PathBuf,
    /// ConfigMaps, Secrets and tokens for volumes and env (cluster mode only).
    objects: Option<ObjectSource>,
}

impl Driver {
    pub fn new(cri: Cri, node: &str, pod_logs_dir: PathBuf, root_dir: PathBuf) -> Self {
        Driver { cri, node: node.to_string(), pod_logs_dir, root_dir, objects: None }
    }

    pub fn with_objects(self, objects: ObjectSource) -> Self {
        Driver { objects: Some(objects), ..self }
    }

    fn fields(&self, pod_ip: Option<&str>) -> downward::Fields {
        let (node_cpu_milli, node_memory_bytes) = node_allocatable();
        downward::Fields {
            node: self.node.clone(),
            pod_ip: pod_ip.map(str::to_string),
            host_ip: None,
            node_cpu_milli,
            node_memory_bytes,
        }
    }

    /// Rewrites the pod's API-backed volumes whose sources changed (called on each pod sync).
    pub async fn refresh_volumes(&self, pod: &Pod, pod_ip: Option<&str>) {
        if !volumes::has_projections(pod) {
            return;
        }
        if let Err(e) = volumes::prepare(&self.root_dir, pod, self.objects.as_ref(), &self.fields(pod_ip)).await {
            tracing::warn!(pod = %spec::full_name(pod), error = %e.message, "cannot refresh volumes");
        }
    }

    /// The ConfigMaps and Secrets the container's environment refers to (missing ones absent).
    async fn env_objects(&self, pod: &Pod, c: &Container) -> Result<EnvObjects, StartError> {
        let (cms, secrets) = env::referenced(c);
        let mut out = EnvObjects::default();
        let ns = spec::namespace(pod);
        let failed = |m: String| StartError::new("CreateContainerConfigError", m);
        if let Some(source) = &self.objects {
            let links = pod.spec.as_ref().and_then(|s| s.enable_service_links).unwrap_or(true);
            match source.services(ns, links).await {
                Ok(services) => out.services = service_env::for_pod(pod, &services),
                // Static pods must run while the API server does not (it may be one of them).
                Err(e) if !crate::cluster::is_api_pod(pod) => {
                    tracing::warn!(pod = %spec::full_name(pod), error = %e, "starting static pod without service environment variables");
                }
                Err(e) => return Err(failed(e)),
            }
        }
        if cms.is_empty() && secrets.is_empty() {
            return Ok(out);
        }
        let Some(source) = &self.objects else {
            return Err(StartError::new(
                "CreateContainerConfigError",
                "env refers to API objects but there is no API server",
            ));
        };
        for name in cms {
            if let Some(cm) = source.config_map(ns, &name).await.map_err(failed)? {
                out.config_maps.insert(name, cm);
            }
        }
        for name in secrets {
            if let Some(s) = source.secret(ns, &name).await.map_err(failed)? {
                out.secrets.insert(name, s);
            }
        }
        Ok(out)
    }

    pub fn runtime_name(&self) -> &str {
        &self.cri.version.runtime_name
    }

    pub fn cri(&self) -> &Cri {
        &self.cri
    }

    /// Creates the pod's sandbox (network namespace, pause container) and its log directory.
    pub async fn create_sandbox(&self, pod: &Pod, attempt: u32) -> Result<String, StartError> {
        let config = config::sandbox_config(pod, &self.node, &self.pod_logs_dir, attempt);
        tokio::fs::create_dir_all(&config.log_directory).await.map_err(|e| {
            StartError::new("CreatePodSandboxError", format!("cannot create {}: {e}", config.log_directory))
        })?;
        let request = api::RunPodSandboxRequest { config: Some(config), runtime_handler: String::new() };
        let response = self
            .cri
            .runtime
            .run_pod_sandbox(request)
            .await
            .map_err(|e| StartError::new("CreatePodSandboxError", format!("Failed to create pod sandbox: {e}")))?;
        Ok(response.pod_sandbox_id)
    }

    /// Pulls the image if the policy says so, then creates and starts the container.
    pub async fn start_container(
        &self,
        pod: &Pod,
        c: &Container,
        sandbox_id: &str,
        attempt: u32,
        pod_ip: Option<&str>,
    ) -> Result<Started, StartError> {
        let pulled = self.ensure_image(c).await?;
        let fields = self.fields(pod_ip);
        let volumes = volumes::prepare(&self.root_dir, pod, self.objects.as_ref(), &fields).await?;
        let mut mounts = volumes::mounts(c, &volumes).map_err(|m| StartError::new("CreateContainerConfigError", m))?;
        mounts.extend(self.termination_message_mount(pod, c, attempt)?);
        let env_objects = self.env_objects(pod, c).await?;
        let node_allocatable = (fields.node_cpu_milli, fields.node_memory_bytes);
        let ctx = ContainerContext {
            node: &self.node,
            attempt,
            pod_ip,
            host_ip: None,
            mounts,
            env_objects,
            node_allocatable,
        };
        let container_config =
            config::container_config(pod, c, ctx).map_err(|m| StartError::new("CreateContainerConfigError", m))?;
        let sandbox_config = config::sandbox_config(pod, &self.node, &self.pod_logs_dir, 0);
        let request = api::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            config: Some(container_config),
            sandbox_config: Some(sandbox_config),
        };
        let id = self
            .cri
            .runtime
            .create_container(request)
            .await
            .map_err(|e| StartError::new("CreateContainerError", e.to_string()))?
            .container_id;
        self.cri
            .runtime
            .start_container(api::StartContainerRequest { container_id: id.clone() })
            .await
            .map_err(|e| StartError::new("RunContainerError", e.to_string()))?;
        if let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            let target = Target::new(&self.cri.runtime, &id, c, pod, pod_ip);
            if let Err(message) = hooks::run(target, pod, hook).await {
                // Upstream kills the container (preStop included) and reports it as not started.
                if let (Err(e), _) = self.stop_container(pod, &c.name, &id, Self::grace(pod), pod_ip).await {
                    tracing::warn!(pod = %spec::full_name(pod), container = %c.name, error = %e, "cannot stop container after its postStart hook failed");
                }
                return Err(StartError::new("PostStartHookError", message));
            }
        }
        Ok(Started { id, pulled })
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
            StartError::new("CreateContainerConfigError", format!("cannot create {}: {e}", host.display()))
        })?;
        Ok(Some(api::Mount {
            container_path: container_path.to_string(),
            host_path: host.to_string_lossy().into_owned(),
            ..Default::default()
        }))
    }

    /// Returns whether the image was pulled.
    async fn ensure_image(&self, c: &Container) -> Result<bool, StartError> {
        let image = c.image.clone().unwrap_or_default();
        let spec = api::ImageSpec { image: image.clone(), ..Default::default() };
        let policy = PullPolicy::of(c);
        let present = if policy == PullPolicy::Always {
            false
        } else {
            let status =
                self.cri.images.image_status(api::ImageStatusRequest { image: Some(spec.clone()), verbose: false });
            status.await.map_err(|e| StartError::new("ImageInspectError", e.to_string()))?.image.is_some()
        };
        match (present, policy) {
            (true, _) => Ok(false),
            (false, PullPolicy::Never) => Err(StartError::new(
                "ErrImageNeverPull",
                format!("Container image {image:?} is not present with pull policy of Never"),
            )),
            (false, _) => {
                let request = api::PullImageRequest { image: Some(spec), auth: None, sandbox_config: None };
                self.cri
                    .images
                    .pull_image(request)
                    .await
                    .map_err(|e| StartError::new("ErrImagePull", e.to_string()))?;
                Ok(true)
            }
        }
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
        let hook = spec::containers(pod)
            .iter()
            .find(|s| s.name == name)
            .and_then(|s| Some((s, s.lifecycle.as_ref()?.pre_stop.as_ref()?)));
        let mut grace_left = grace;
        let mut hook_failed = false;
        if let Some((container, hook)) = hook.filter(|_| !grace.is_zero()) {
            let target = Target::new(&self.cri.runtime, id, container, pod, pod_ip);
            let started = std::time::Instant::now();
            hook_failed = match tokio::time::timeout(grace, hooks::run(target, pod, hook)).await {
                Ok(Ok(())) => false,
                Ok(Err(message)) => {
                    tracing::warn!(pod = %spec::full_name(pod), container = name, error = %message, "preStop hook failed");
                    true
                }
                // Not finishing within the grace period is not a failure; StopContainer follows.
                Err(_) => false,
            };
            grace_left = hooks::remaining_grace(grace, started.elapsed());
        }
        (self.kill_container(id, grace_left).await, hook_failed)
    }

    /// Stops every running container of the pod at once (each after its preStop hook), then
    /// its sandboxes. Returns the containers whose preStop hook failed.
    pub async fn kill_pod(&self, pod: &Pod, observed: &ObservedPod, grace: Duration) -> Result<Vec<String>, CriError> {
        let pod_ip = observed.current_sandbox().and_then(|s| s.ip.as_deref());
        let stops = observed.running().map(|c| async move {
            let (result, hook_failed) = self.stop_container(pod, &c.name, &c.id, grace, pod_ip).await;
            result.map(|()| hook_failed.then(|| c.name.clone()))
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
        volumes::cleanup(&self.root_dir, uid).await;
        if let Some(objects) = &self.objects {
            objects.forget(uid);
        }
        Ok(())
    }

    /// The grace period for stopping `pod` now.
    pub fn grace(pod: &Pod) -> Duration {
        Duration::from_secs(spec::termination_grace_seconds(pod) as u64)
    }
}

/// The node's CPU (milli) and memory (bytes), the downward API's default for missing limits.
fn node_allocatable() -> (i128, i128) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as i128;
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i128>().ok())
        .unwrap_or(0);
    (cpus * 1000, kib * 1024)
}

/// Stopping or removing something that no longer exists has done its job.
fn already_gone_is_ok<T>(result: Result<T, CriError>) -> Result<(), CriError> {
    match result {
        Err(e) if !e.is_not_found() => Err(e),
        _ => Ok(()),
    }
}
