//! A small device plugin for tests: a real gRPC server on a unix socket serving the plugin
//! registration service (`GetInfo`, `NotifyRegistrationStatus`) and deviceplugin v1beta1's
//! `DevicePlugin`, so it registers through `<root-dir>/plugins_registry` (or the classic way
//! on `device-plugins/kubelet.sock`). Its devices are files under a temporary directory; a test
//! marks one unhealthy and reads every call the plugin received.
//!
//! `Allocate` gives each container: the env `EXAMPLE_DEVICES=<ids, comma-separated>`, each
//! device's file mounted read-only at `/run/example-devices/<id>`, `/dev/null` as the device
//! node `/dev/example-<id>`, and the annotation `example.com/devices=<ids>`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use gantry_plugins::api::deviceplugin::device_plugin_server::{DevicePlugin, DevicePluginServer};
use gantry_plugins::api::deviceplugin::registration_client::RegistrationClient as KubeletRegistrationClient;
use gantry_plugins::api::deviceplugin::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse, ContainerPreferredAllocationResponse, Device,
    DevicePluginOptions, DeviceSpec, Empty, ListAndWatchResponse, Mount, PreStartContainerRequest,
    PreStartContainerResponse, PreferredAllocationRequest, PreferredAllocationResponse, RegisterRequest,
};
use gantry_plugins::api::registration::registration_server::{Registration, RegistrationServer};
use gantry_plugins::api::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::error::{IoContext, Result, TestkitError};

/// A call the plugin received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginCall {
    GetInfo,
    NotifyRegistrationStatus { registered: bool, error: String },
    GetDevicePluginOptions,
    ListAndWatch,
    GetPreferredAllocation { available: Vec<String>, size: i32 },
    Allocate { devices: Vec<String> },
    PreStartContainer { devices: Vec<String> },
}

/// Where a device's file is mounted in a container.
pub const CONTAINER_DIR: &str = "/run/example-devices";

struct State {
    /// Device ID → healthy.
    devices: Vec<(String, bool)>,
    calls: Vec<PluginCall>,
}

#[derive(Clone)]
struct Service {
    resource: String,
    options: DevicePluginOptions,
    versions: Vec<String>,
    files: PathBuf,
    state: Arc<Mutex<State>>,
    changed: watch::Sender<u64>,
    /// Set when the plugin stops: its `ListAndWatch` streams end (the server's connections
    /// outlive an aborted server task).
    stopped: watch::Sender<bool>,
}

impl Service {
    fn record(&self, call: PluginCall) {
        self.state.lock().unwrap().calls.push(call);
    }

    fn list(&self) -> ListAndWatchResponse {
        let state = self.state.lock().unwrap();
        let devices = state
            .devices
            .iter()
            .map(|(id, healthy)| Device {
                id: id.clone(),
                health: if *healthy { "Healthy" } else { "Unhealthy" }.to_string(),
                topology: None,
            })
            .collect();
        ListAndWatchResponse { devices }
    }
}

/// A running test device plugin; stops (and removes its socket) when dropped.
pub struct TestDevicePlugin {
    service: Service,
    socket: PathBuf,
    server: tokio::task::JoinHandle<()>,
    _files: tempfile::TempDir,
}

impl TestDevicePlugin {
    /// Serves `resource` with `count` devices (`dev-0`, `dev-1`, …) on `socket`. `options`:
    /// whether it asks for `PreStartContainer` and offers `GetPreferredAllocation` (it prefers
    /// the last available devices, so a test can tell its choice from the default one).
    pub async fn start(socket: &Path, resource: &str, count: usize, options: DevicePluginOptions) -> Result<Self> {
        Self::start_with_versions(socket, resource, count, options, &["v1beta1"]).await
    }

    /// The same, advertising `versions` in `GetInfo`.
    pub async fn start_with_versions(
        socket: &Path,
        resource: &str,
        count: usize,
        options: DevicePluginOptions,
        versions: &[&str],
    ) -> Result<Self> {
        let files = tempfile::tempdir().ctx(|| "device files directory".into())?;
        let mut devices = Vec::new();
        for i in 0..count {
            let id = format!("dev-{i}");
            std::fs::write(files.path().join(&id), format!("device {id}\n")).ctx(|| format!("device file {id}"))?;
            devices.push((id, true));
        }
        let service = Service {
            resource: resource.to_string(),
            options,
            versions: versions.iter().map(|v| v.to_string()).collect(),
            files: files.path().to_path_buf(),
            state: Arc::new(Mutex::new(State { devices, calls: Vec::new() })),
            changed: watch::Sender::new(0),
            stopped: watch::Sender::new(false),
        };
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir).ctx(|| format!("create {}", dir.display()))?;
        }
        let incoming = crate::cri::serve_socket(socket)?;
        let (registration, plugin) =
            (RegistrationServer::new(service.clone()), DevicePluginServer::new(service.clone()));
        let server = tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(registration)
                .add_service(plugin)
                .serve_with_incoming(incoming)
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "test device plugin stopped");
            }
        });
        Ok(TestDevicePlugin { service, socket: socket.to_path_buf(), server, _files: files })
    }

    /// Registers the classic way: `Register` on the kubelet's `device-plugins/kubelet.sock`,
    /// naming this plugin's socket (which must be in that directory).
    pub async fn register_with_kubelet(&self, kubelet_socket: &Path) -> Result<()> {
        let channel = crate::cri::connect(kubelet_socket).await?;
        let endpoint = self.socket.file_name().unwrap_or_default().to_string_lossy().into_owned();
        let request = RegisterRequest {
            version: "v1beta1".into(),
            endpoint,
            resource_name: self.service.resource.clone(),
            options: Some(self.service.options),
        };
        KubeletRegistrationClient::new(channel).register(request).await.map_err(TestkitError::cri("Register"))?;
        Ok(())
    }

    /// The host file of device `id`.
    pub fn device_file(&self, id: &str) -> PathBuf {
        self.service.files.join(id)
    }

    /// Marks device `id` healthy or not, and tells the node (`ListAndWatch`).
    pub fn set_healthy(&self, id: &str, healthy: bool) {
        let mut state = self.service.state.lock().unwrap();
        if let Some(d) = state.devices.iter_mut().find(|(d, _)| d == id) {
            d.1 = healthy;
        }
        drop(state);
        self.service.changed.send_modify(|n| *n += 1);
    }

    /// Every call received so far, in order.
    pub fn calls(&self) -> Vec<PluginCall> {
        self.service.state.lock().unwrap().calls.clone()
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for TestDevicePlugin {
    fn drop(&mut self) {
        self.service.stopped.send_replace(true);
        self.server.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

#[tonic::async_trait]
impl Registration for Service {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        self.record(PluginCall::GetInfo);
        Ok(Response::new(PluginInfo {
            r#type: "DevicePlugin".into(),
            name: self.resource.clone(),
            endpoint: String::new(),
            supported_versions: self.versions.clone(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let r = request.into_inner();
        self.record(PluginCall::NotifyRegistrationStatus { registered: r.plugin_registered, error: r.error });
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

type DeviceStream = Pin<Box<dyn futures::Stream<Item = Result<ListAndWatchResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(&self, _: Request<Empty>) -> Result<Response<DevicePluginOptions>, Status> {
        self.record(PluginCall::GetDevicePluginOptions);
        Ok(Response::new(self.options))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<Self::ListAndWatchStream>, Status> {
        self.record(PluginCall::ListAndWatch);
        let service = self.clone();
        let changes = self.changed.subscribe();
        // The current list, then a new one on every change, until the plugin stops.
        let stream = futures::stream::unfold((service, changes, true), |(service, mut changes, first)| async move {
            if !first {
                let mut stopped = service.stopped.subscribe();
                tokio::select! {
                    changed = changes.changed() => changed.ok()?,
                    _ = stopped.wait_for(|s| *s) => return None,
                }
            }
            let list = service.list();
            Some((Ok(list), (service, changes, false)))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let mut container_responses = Vec::new();
        for r in request.into_inner().container_requests {
            self.record(PluginCall::GetPreferredAllocation {
                available: r.available_device_i_ds.clone(),
                size: r.allocation_size,
            });
            let take = r.allocation_size.max(0) as usize;
            let device_i_ds = r.available_device_i_ds.iter().rev().take(take).cloned().collect();
            container_responses.push(ContainerPreferredAllocationResponse { device_i_ds });
        }
        Ok(Response::new(PreferredAllocationResponse { container_responses }))
    }

    async fn allocate(&self, request: Request<AllocateRequest>) -> Result<Response<AllocateResponse>, Status> {
        let mut container_responses = Vec::new();
        for r in request.into_inner().container_requests {
            self.record(PluginCall::Allocate { devices: r.devices_ids.clone() });
            let ids = r.devices_ids.join(",");
            container_responses.push(ContainerAllocateResponse {
                envs: HashMap::from([("EXAMPLE_DEVICES".to_string(), ids.clone())]),
                mounts: r
                    .devices_ids
                    .iter()
                    .map(|id| Mount {
                        container_path: format!("{CONTAINER_DIR}/{id}"),
                        host_path: self.files.join(id).display().to_string(),
                        read_only: true,
                    })
                    .collect(),
                devices: r
                    .devices_ids
                    .iter()
                    .map(|id| DeviceSpec {
                        container_path: format!("/dev/example-{id}"),
                        host_path: "/dev/null".into(),
                        permissions: "rw".into(),
                    })
                    .collect(),
                annotations: HashMap::from([("example.com/devices".to_string(), ids)]),
                cdi_devices: Vec::new(),
            });
        }
        Ok(Response::new(AllocateResponse { container_responses }))
    }

    async fn pre_start_container(
        &self,
        request: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        self.record(PluginCall::PreStartContainer { devices: request.into_inner().devices_ids });
        Ok(Response::new(PreStartContainerResponse {}))
    }
}
