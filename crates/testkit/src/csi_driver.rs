//! A small CSI driver for tests: a real gRPC server on a unix socket serving the plugin
//! registration service (`GetInfo` says `CSIPlugin`, `NotifyRegistrationStatus`) and the CSI
//! `Identity` and `Node` services, so it registers through `<root-dir>/plugins_registry` as a
//! CSI node plugin DaemonSet does. Volumes are directories under a temporary directory (one per
//! volume handle): `NodeStageVolume` bind-mounts the volume's directory on the staging path,
//! `NodePublishVolume` creates the target and bind-mounts the staging path (or, for a driver
//! that does not stage, the volume's directory) there, read-only when asked; unpublish and
//! unstage unmount. The secrets and volume context each call got are kept for the test. A block volume (`Block` access type) is a loop device on a sparse file
//! (`losetup`, detached when the driver is dropped), published by bind-mounting the device node
//! on the target file. Every call is recorded, in order.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use gantry_plugins::api::csi::identity_server::{Identity, IdentityServer};
use gantry_plugins::api::csi::node_server::{Node, NodeServer};
use gantry_plugins::api::csi::node_service_capability::{self, rpc};
use gantry_plugins::api::csi::volume_capability::AccessType;
use gantry_plugins::api::csi::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest, GetPluginInfoResponse,
    NodeExpandVolumeRequest, NodeExpandVolumeResponse, NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse,
    NodeGetInfoRequest, NodeGetInfoResponse, NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse,
    NodePublishVolumeRequest, NodePublishVolumeResponse, NodeServiceCapability, NodeStageVolumeRequest,
    NodeStageVolumeResponse, NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse, NodeUnstageVolumeRequest,
    NodeUnstageVolumeResponse, ProbeRequest, ProbeResponse, Topology, VolumeCapability, VolumeUsage,
};
use gantry_plugins::api::registration::registration_server::{Registration, RegistrationServer};
use gantry_plugins::api::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use tonic::{Request, Response, Status};

use crate::error::{IoContext, Result};

/// A call the driver received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CsiCall {
    GetInfo,
    NotifyRegistrationStatus { registered: bool, error: String },
    NodeGetInfo,
    NodeGetCapabilities,
    NodeStageVolume { volume: String, staging: PathBuf },
    NodePublishVolume { volume: String, staging: Option<PathBuf>, target: PathBuf, read_only: bool },
    NodeUnpublishVolume { volume: String, target: PathBuf },
    NodeUnstageVolume { volume: String, staging: PathBuf },
    NodeGetVolumeStats { volume: String, path: PathBuf },
}

/// The topology key the driver reports, with the node ID as its value.
pub fn topology_key(driver: &str) -> String {
    format!("topology.{driver}/node")
}

#[derive(Clone)]
struct Service {
    name: String,
    node_id: String,
    stages: bool,
    max_volumes: i64,
    volumes: PathBuf,
    calls: Arc<Mutex<Vec<CsiCall>>>,
    /// The volume context of each publish, by target path.
    contexts: Arc<Mutex<BTreeMap<PathBuf, BTreeMap<String, String>>>>,
    /// The secrets of each stage, by volume ID, and of each publish, by target path.
    stage_secrets: Arc<Mutex<BTreeMap<String, BTreeMap<String, String>>>>,
    publish_secrets: Arc<Mutex<BTreeMap<PathBuf, BTreeMap<String, String>>>>,
    /// The loop device backing each block volume, by volume ID.
    loops: Arc<Mutex<BTreeMap<String, PathBuf>>>,
}

impl Service {
    fn record(&self, call: CsiCall) {
        self.calls.lock().unwrap().push(call);
    }

    fn volume_dir(&self, id: &str) -> std::result::Result<PathBuf, Status> {
        if id.is_empty() || id.contains('/') || id.starts_with('.') {
            return Err(Status::invalid_argument(format!("volume ID {id:?} is not valid")));
        }
        let dir = self.volumes.join(id);
        std::fs::create_dir_all(&dir).map_err(|e| Status::internal(format!("volume {id}: {e}")))?;
        Ok(dir)
    }

    /// The loop device of block volume `id`, set up on a sparse file on first use.
    fn loop_device(&self, id: &str) -> std::result::Result<PathBuf, Status> {
        let mut loops = self.loops.lock().unwrap();
        if let Some(device) = loops.get(id) {
            return Ok(device.clone());
        }
        let dir = self.volume_dir(id)?;
        let image = dir.join("block.img");
        let internal = |e: std::io::Error| Status::internal(format!("{}: {e}", image.display()));
        std::fs::File::create(&image).and_then(|f| f.set_len(BLOCK_VOLUME_BYTES)).map_err(internal)?;
        let out =
            std::process::Command::new("losetup").arg("-f").arg("--show").arg(&image).output().map_err(internal)?;
        if !out.status.success() {
            return Err(Status::internal(format!("losetup: {}", String::from_utf8_lossy(&out.stderr))));
        }
        let device = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        loops.insert(id.to_string(), device.clone());
        Ok(device)
    }
}

/// The size of a block volume's sparse backing file (and what `NodeGetVolumeStats` reports).
const BLOCK_VOLUME_BYTES: u64 = 16 << 20;

fn is_block(capability: Option<&VolumeCapability>) -> bool {
    matches!(capability.and_then(|c| c.access_type.as_ref()), Some(AccessType::Block(_)))
}

/// A running test CSI driver; stops (and removes its socket) when dropped.
pub struct TestCsiDriver {
    service: Service,
    socket: PathBuf,
    server: tokio::task::JoinHandle<()>,
    _volumes: tempfile::TempDir,
}

impl TestCsiDriver {
    /// Serves driver `name` on `socket` (its registration socket and its endpoint), reporting
    /// `node_id`; `stages`: whether it has `STAGE_UNSTAGE_VOLUME`; `max_volumes`: its limit.
    pub async fn start(socket: &Path, name: &str, node_id: &str, stages: bool, max_volumes: i64) -> Result<Self> {
        let volumes = tempfile::tempdir().ctx(|| "CSI volumes directory".into())?;
        let service = Service {
            name: name.to_string(),
            node_id: node_id.to_string(),
            stages,
            max_volumes,
            volumes: volumes.path().to_path_buf(),
            calls: Arc::default(),
            contexts: Arc::default(),
            stage_secrets: Arc::default(),
            publish_secrets: Arc::default(),
            loops: Arc::default(),
        };
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir).ctx(|| format!("create {}", dir.display()))?;
        }
        let incoming = crate::cri::serve_socket(socket)?;
        let (registration, identity, node) = (
            RegistrationServer::new(service.clone()),
            IdentityServer::new(service.clone()),
            NodeServer::new(service.clone()),
        );
        let server = tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(registration)
                .add_service(identity)
                .add_service(node)
                .serve_with_incoming(incoming)
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "test CSI driver stopped");
            }
        });
        Ok(TestCsiDriver { service, socket: socket.to_path_buf(), server, _volumes: volumes })
    }

    /// The directory backing volume `id` (what every pod using it sees).
    pub fn volume_dir(&self, id: &str) -> PathBuf {
        self.service.volumes.join(id)
    }

    /// Every call received so far, in order.
    pub fn calls(&self) -> Vec<CsiCall> {
        self.service.calls.lock().unwrap().clone()
    }

    /// The volume context `NodePublishVolume` last got for `target`.
    pub fn publish_context(&self, target: &Path) -> Option<BTreeMap<String, String>> {
        self.service.contexts.lock().unwrap().get(target).cloned()
    }

    /// The secrets `NodeStageVolume` last got for volume `id`.
    pub fn stage_secrets(&self, id: &str) -> Option<BTreeMap<String, String>> {
        self.service.stage_secrets.lock().unwrap().get(id).cloned()
    }

    /// The secrets `NodePublishVolume` last got for `target`.
    pub fn publish_secrets(&self, target: &Path) -> Option<BTreeMap<String, String>> {
        self.service.publish_secrets.lock().unwrap().get(target).cloned()
    }

    /// The file backing block volume `id` (its loop device's).
    pub fn block_file(&self, id: &str) -> PathBuf {
        self.service.volumes.join(id).join("block.img")
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for TestCsiDriver {
    fn drop(&mut self) {
        self.server.abort();
        let _ = std::fs::remove_file(&self.socket);
        for device in self.service.loops.lock().unwrap().values() {
            let _ = std::process::Command::new("losetup").arg("-d").arg(device).status();
        }
    }
}

fn bind(source: &Path, target: &Path, read_only: bool) -> std::result::Result<(), Status> {
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(|e| Status::invalid_argument(e.to_string()));
    let (src, dst) = (c(source)?, c(target)?);
    let mount = |flags: libc::c_ulong| {
        // SAFETY: valid NUL-terminated paths; no file system type or data for a bind mount.
        let rc = unsafe { libc::mount(src.as_ptr(), dst.as_ptr(), std::ptr::null(), flags, std::ptr::null()) };
        if rc == 0 {
            Ok(())
        } else {
            Err(Status::internal(format!("mount {}: {}", target.display(), std::io::Error::last_os_error())))
        }
    };
    mount(libc::MS_BIND)?;
    if read_only {
        mount(libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY)?;
    }
    Ok(())
}

/// Bytes and inodes of the file system at `path` as a CSI driver reports them.
pub fn statvfs_usage(path: &Path) -> std::io::Result<[VolumeUsage; 2]> {
    let p = CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: a valid NUL-terminated path and a zeroed out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(p.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let block = st.f_frsize as i64;
    let (blocks, free, avail) = (st.f_blocks as i64, st.f_bfree as i64, st.f_bavail as i64);
    let (files, ffree) = (st.f_files as i64, st.f_ffree as i64);
    use gantry_plugins::api::csi::volume_usage::Unit;
    Ok([
        VolumeUsage {
            total: blocks * block,
            available: avail * block,
            used: (blocks - free) * block,
            unit: Unit::Bytes as i32,
        },
        VolumeUsage { total: files, available: ffree, used: files - ffree, unit: Unit::Inodes as i32 },
    ])
}

/// Unmounts `target` when it is mounted (CSI's calls are idempotent).
fn unmount(target: &Path) -> std::result::Result<(), Status> {
    let t = CString::new(target.as_os_str().as_bytes()).map_err(|e| Status::invalid_argument(e.to_string()))?;
    // SAFETY: a valid NUL-terminated path.
    let rc = unsafe { libc::umount2(t.as_ptr(), 0) };
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        _ if rc == 0 => Ok(()),
        Some(libc::EINVAL | libc::ENOENT) => Ok(()),
        _ => Err(Status::internal(format!("unmount {}: {err}", target.display()))),
    }
}

#[tonic::async_trait]
impl Registration for Service {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        self.record(CsiCall::GetInfo);
        Ok(Response::new(PluginInfo {
            r#type: "CSIPlugin".into(),
            name: self.name.clone(),
            endpoint: String::new(),
            supported_versions: vec!["1.0.0".into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let r = request.into_inner();
        self.record(CsiCall::NotifyRegistrationStatus { registered: r.plugin_registered, error: r.error });
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

#[tonic::async_trait]
impl Identity for Service {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: "0.1.0".into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse { capabilities: vec![] }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Node for Service {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let r = request.into_inner();
        let staging = PathBuf::from(&r.staging_target_path);
        self.record(CsiCall::NodeStageVolume { volume: r.volume_id.clone(), staging: staging.clone() });
        self.stage_secrets.lock().unwrap().insert(r.volume_id.clone(), r.secrets.into_iter().collect());
        if !staging.is_dir() {
            return Err(Status::failed_precondition(format!("staging path {} does not exist", staging.display())));
        }
        if is_block(r.volume_capability.as_ref()) {
            // A block volume is its loop device: nothing to mount for staging.
            self.loop_device(&r.volume_id)?;
        } else {
            bind(&self.volume_dir(&r.volume_id)?, &staging, false)?;
        }
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let r = request.into_inner();
        let staging = PathBuf::from(&r.staging_target_path);
        self.record(CsiCall::NodeUnstageVolume { volume: r.volume_id, staging: staging.clone() });
        unmount(&staging)?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let r = request.into_inner();
        let target = PathBuf::from(&r.target_path);
        let staging = Some(PathBuf::from(&r.staging_target_path)).filter(|p| !p.as_os_str().is_empty());
        self.record(CsiCall::NodePublishVolume {
            volume: r.volume_id.clone(),
            staging: staging.clone(),
            target: target.clone(),
            read_only: r.readonly,
        });
        self.publish_secrets.lock().unwrap().insert(target.clone(), r.secrets.into_iter().collect());
        let context: BTreeMap<String, String> = r.volume_context.into_iter().collect();
        // An inline ephemeral volume is never staged (the node says which it is when the
        // CSIDriver asks for pod info, as real drivers require).
        let ephemeral = context.get("csi.storage.k8s.io/ephemeral").map(String::as_str) == Some("true");
        self.contexts.lock().unwrap().insert(target.clone(), context);
        if self.stages && !ephemeral && staging.is_none() {
            return Err(Status::failed_precondition("staging target path is required"));
        }
        let internal = |e: std::io::Error| Status::internal(format!("{}: {e}", target.display()));
        if is_block(r.volume_capability.as_ref()) {
            // The device node bind-mounted on a file the driver creates.
            let device = self.loop_device(&r.volume_id)?;
            std::fs::File::create(&target).map_err(internal)?;
            bind(&device, &target, r.readonly)?;
        } else {
            let source = match &staging {
                Some(s) if self.stages && !ephemeral => s.clone(),
                _ => self.volume_dir(&r.volume_id)?,
            };
            std::fs::create_dir_all(&target).map_err(internal)?;
            bind(&source, &target, r.readonly)?;
        }
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let r = request.into_inner();
        let target = PathBuf::from(&r.target_path);
        self.record(CsiCall::NodeUnpublishVolume { volume: r.volume_id, target: target.clone() });
        unmount(&target)?;
        let removed = if target.is_file() { std::fs::remove_file(&target) } else { std::fs::remove_dir(&target) };
        match removed {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Status::internal(format!("{}: {e}", target.display())));
            }
            _ => {}
        }
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    /// The file system of the published volume, from `statvfs` (bytes and inodes).
    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let r = request.into_inner();
        let path = PathBuf::from(&r.volume_path);
        self.record(CsiCall::NodeGetVolumeStats { volume: r.volume_id.clone(), path: path.clone() });
        if !path.exists() {
            return Err(Status::not_found(format!("volume path {} does not exist", path.display())));
        }
        // A block volume has no file system: its size only, as drivers report it.
        if self.loops.lock().unwrap().contains_key(&r.volume_id) {
            use gantry_plugins::api::csi::volume_usage::Unit;
            let size = VolumeUsage { total: BLOCK_VOLUME_BYTES as i64, unit: Unit::Bytes as i32, ..Default::default() };
            return Ok(Response::new(NodeGetVolumeStatsResponse { usage: vec![size], volume_condition: None }));
        }
        let usage = statvfs_usage(&path).map_err(|e| Status::internal(format!("statvfs {}: {e}", path.display())))?;
        Ok(Response::new(NodeGetVolumeStatsResponse { usage: usage.to_vec(), volume_condition: None }))
    }

    async fn node_expand_volume(
        &self,
        _: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        Err(Status::unimplemented("NodeExpandVolume"))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        self.record(CsiCall::NodeGetCapabilities);
        let capability = |t: rpc::Type| NodeServiceCapability {
            r#type: Some(node_service_capability::Type::Rpc(node_service_capability::Rpc { r#type: t as i32 })),
        };
        let mut capabilities = vec![capability(rpc::Type::GetVolumeStats)];
        if self.stages {
            capabilities.push(capability(rpc::Type::StageUnstageVolume));
        }
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(&self, _: Request<NodeGetInfoRequest>) -> Result<Response<NodeGetInfoResponse>, Status> {
        self.record(CsiCall::NodeGetInfo);
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: self.max_volumes,
            accessible_topology: Some(Topology {
                segments: [(topology_key(&self.name), self.node_id.clone())].into_iter().collect(),
            }),
        }))
    }
}
