//! CSI drivers (upstream `volume/csi`'s registration handler and client): a driver registered
//! through `plugins_registry` (type `CSIPlugin`) is asked `NodeGetInfo` (node ID, topology,
//! volume limit) and `NodeGetCapabilities` (whether it stages volumes), and is then called for
//! the node side of a volume's life: `NodeStageVolume`, `NodePublishVolume`,
//! `NodeUnpublishVolume`, `NodeUnstageVolume`.
//!
//! The registered drivers are published on a `watch` channel ([`CsiDrivers::subscribe`]); the
//! agent writes them to the node's `CSINode` object and its topology labels to the Node. The
//! agent gets plain values from here ([`DriverInfo`], [`CsiError`]), never a gRPC type.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tonic::Status;

use crate::api::csi::node_client::NodeClient;
use crate::api::csi::node_service_capability::{self, rpc};
use crate::api::csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume, access_mode};
use crate::api::csi::{
    NodeGetCapabilitiesRequest, NodeGetInfoRequest, NodeGetVolumeStatsRequest, NodePublishVolumeRequest,
    NodeStageVolumeRequest, NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability, volume_usage,
};
use crate::devices::GrpcError;

/// Upstream's plugin type name.
pub const CSI_PLUGIN: &str = "CSIPlugin";
/// Upstream's `csiTimeout` for the node calls of a volume operation.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// Upstream's timeout for `NodeGetInfo` at registration.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(120);

/// What a registered driver told the node about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverInfo {
    pub name: String,
    pub endpoint: PathBuf,
    /// `NodeGetInfo.node_id`: the driver's name for this node (`CSINode` `nodeID`).
    pub node_id: String,
    /// `NodeGetInfo.max_volumes_per_node`; 0 when the driver sets no limit.
    pub max_volumes: i64,
    /// `NodeGetInfo.accessible_topology`: labels the Node carries for the driver.
    pub topology: BTreeMap<String, String>,
    /// `STAGE_UNSTAGE_VOLUME`: the driver wants `NodeStageVolume` before publishing.
    pub stages: bool,
    /// `GET_VOLUME_STATS`.
    pub volume_stats: bool,
}

/// Why a CSI driver could not be registered or called (upstream's texts, as events show them).
#[derive(Debug, thiserror::Error)]
pub enum CsiError {
    #[error(
        "kubernetes.io/csi: {op} for CSI driver {driver:?} failed. Plugin returned an empty list for supported versions"
    )]
    NoVersions { op: &'static str, driver: String },
    #[error(
        "kubernetes.io/csi: {op} for CSI driver {driver:?} failed. None of the versions specified {versions:?} are supported. err=none of the CSI versions reported by this driver are supported"
    )]
    UnsupportedVersions { op: &'static str, driver: String, versions: Vec<String> },
    #[error("driver name {0} not found in the list of registered CSI drivers")]
    NotRegistered(String),
    #[error("failed to dial CSI driver {driver:?} at {}: {source}", endpoint.display())]
    Dial { driver: String, endpoint: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Rpc(GrpcError),
}

impl From<Status> for CsiError {
    fn from(status: Status) -> Self {
        CsiError::Rpc(GrpcError(status))
    }
}

/// `NodeGetVolumeStats`' answer, as upstream's `MetricsCSI` reads it: bytes and inodes (each
/// `None` when the driver did not report that unit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VolumeUsage {
    pub bytes: Option<Usage>,
    pub inodes: Option<Usage>,
}

/// One unit of a volume's usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub total: u64,
    pub available: u64,
    pub used: u64,
}

/// One volume as the node calls of its driver need it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Volume {
    pub driver: String,
    /// The PV's `spec.csi.volumeHandle`.
    pub handle: String,
    pub fs_type: String,
    pub read_only: bool,
    /// `volumeMode: Block`: a raw block device rather than a mounted file system.
    pub block: bool,
    /// The PV's first access mode (`ReadWriteOnce` when it has none), as upstream passes it.
    pub access_mode: String,
    /// The PV's `spec.csi.volumeAttributes`.
    pub attributes: BTreeMap<String, String>,
    /// The attacher's `VolumeAttachment` `status.attachmentMetadata`, when attached.
    pub publish_context: BTreeMap<String, String>,
    /// The contents of the PV's node stage / node publish secret.
    pub stage_secrets: BTreeMap<String, String>,
    pub publish_secrets: BTreeMap<String, String>,
}

impl Volume {
    /// A mounted file system (or a block device) with the PV's access mode in CSI's terms (upstream
    /// `asCSIAccessModeV1`; `ReadWriteOncePod` has no CSI 1.3 mode of its own).
    fn capability(&self) -> VolumeCapability {
        let mode = match self.access_mode.as_str() {
            "ReadOnlyMany" => access_mode::Mode::MultiNodeReaderOnly,
            "ReadWriteMany" => access_mode::Mode::MultiNodeMultiWriter,
            _ => access_mode::Mode::SingleNodeWriter,
        };
        let access_type = if self.block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume { fs_type: self.fs_type.clone(), mount_flags: vec![] })
        };
        VolumeCapability { access_mode: Some(AccessMode { mode: mode as i32 }), access_type: Some(access_type) }
    }
}

fn map(m: &BTreeMap<String, String>) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The CSI drivers registered on this node.
#[derive(Clone)]
pub struct CsiDrivers {
    drivers: Arc<watch::Sender<BTreeMap<String, DriverInfo>>>,
}

impl Default for CsiDrivers {
    fn default() -> Self {
        CsiDrivers { drivers: Arc::new(watch::Sender::new(BTreeMap::new())) }
    }
}

impl CsiDrivers {
    /// The registered drivers, now and as they change.
    pub fn subscribe(&self) -> watch::Receiver<BTreeMap<String, DriverInfo>> {
        self.drivers.subscribe()
    }

    /// Upstream's `ValidatePlugin`: the driver must support a CSI 1.x version.
    pub fn validate(name: &str, versions: &[String]) -> Result<(), CsiError> {
        let op = "RegisterPlugin";
        if versions.is_empty() {
            return Err(CsiError::NoVersions { op, driver: name.to_string() });
        }
        let supported = |v: &String| v.trim_start_matches('v').split('.').next() == Some("1");
        if !versions.iter().any(supported) {
            return Err(CsiError::UnsupportedVersions { op, driver: name.to_string(), versions: versions.to_vec() });
        }
        Ok(())
    }

    /// Asks the driver on `endpoint` who it is on this node and what it can do, and records it.
    pub async fn register(&self, name: &str, endpoint: &Path) -> Result<DriverInfo, CsiError> {
        let mut client = client(name, endpoint).await?;
        let info = tokio::time::timeout(REGISTER_TIMEOUT, client.node_get_info(NodeGetInfoRequest {}))
            .await
            .map_err(|_| Status::deadline_exceeded("context deadline exceeded"))??
            .into_inner();
        let caps = tokio::time::timeout(REGISTER_TIMEOUT, client.node_get_capabilities(NodeGetCapabilitiesRequest {}))
            .await
            .map_err(|_| Status::deadline_exceeded("context deadline exceeded"))??
            .into_inner();
        let has = |wanted: rpc::Type| {
            caps.capabilities
                .iter()
                .any(|c| matches!(&c.r#type, Some(node_service_capability::Type::Rpc(r)) if r.r#type == wanted as i32))
        };
        let driver = DriverInfo {
            name: name.to_string(),
            endpoint: endpoint.to_path_buf(),
            node_id: info.node_id,
            max_volumes: info.max_volumes_per_node,
            topology: info.accessible_topology.map(|t| t.segments.into_iter().collect()).unwrap_or_default(),
            stages: has(rpc::Type::StageUnstageVolume),
            volume_stats: has(rpc::Type::GetVolumeStats),
        };
        self.drivers.send_modify(|d| {
            d.insert(name.to_string(), driver.clone());
        });
        Ok(driver)
    }

    /// The driver's socket went away.
    pub fn deregister(&self, name: &str) {
        self.drivers.send_if_modified(|d| d.remove(name).is_some());
    }

    /// The registered driver `name`.
    pub fn driver(&self, name: &str) -> Result<DriverInfo, CsiError> {
        self.drivers.borrow().get(name).cloned().ok_or_else(|| CsiError::NotRegistered(name.to_string()))
    }

    /// `NodeStageVolume` to `staging` (which the caller created).
    pub async fn stage(&self, v: &Volume, staging: &Path) -> Result<(), CsiError> {
        let request = NodeStageVolumeRequest {
            volume_id: v.handle.clone(),
            publish_context: map(&v.publish_context),
            staging_target_path: path(staging),
            volume_capability: Some(v.capability()),
            secrets: map(&v.stage_secrets),
            volume_context: map(&v.attributes),
        };
        let mut c = self.client(&v.driver).await?;
        call(c.node_stage_volume(request)).await
    }

    /// `NodePublishVolume` to `target` (the driver creates it), from `staging` when staged.
    pub async fn publish(&self, v: &Volume, staging: Option<&Path>, target: &Path) -> Result<(), CsiError> {
        let request = NodePublishVolumeRequest {
            volume_id: v.handle.clone(),
            publish_context: map(&v.publish_context),
            staging_target_path: staging.map(path).unwrap_or_default(),
            target_path: path(target),
            volume_capability: Some(v.capability()),
            readonly: v.read_only,
            secrets: map(&v.publish_secrets),
            volume_context: map(&v.attributes),
        };
        let mut c = self.client(&v.driver).await?;
        call(c.node_publish_volume(request)).await
    }

    pub async fn unpublish(&self, driver: &str, handle: &str, target: &Path) -> Result<(), CsiError> {
        let request = NodeUnpublishVolumeRequest { volume_id: handle.to_string(), target_path: path(target) };
        let mut c = self.client(driver).await?;
        call(c.node_unpublish_volume(request)).await
    }

    pub async fn unstage(&self, driver: &str, handle: &str, staging: &Path) -> Result<(), CsiError> {
        let request = NodeUnstageVolumeRequest { volume_id: handle.to_string(), staging_target_path: path(staging) };
        let mut c = self.client(driver).await?;
        call(c.node_unstage_volume(request)).await
    }

    /// `NodeGetVolumeStats` of the volume published at `target`.
    pub async fn volume_stats(&self, driver: &str, handle: &str, target: &Path) -> Result<VolumeUsage, CsiError> {
        let request = NodeGetVolumeStatsRequest {
            volume_id: handle.to_string(),
            volume_path: path(target),
            staging_target_path: String::new(),
        };
        let mut c = self.client(driver).await?;
        let answer = tokio::time::timeout(CALL_TIMEOUT, c.node_get_volume_stats(request))
            .await
            .map_err(|_| Status::deadline_exceeded("context deadline exceeded"))??
            .into_inner();
        let unit = |wanted: volume_usage::Unit| {
            answer.usage.iter().find(|u| u.unit == wanted as i32).map(|u| Usage {
                // Negative figures are a driver's bug; upstream would show them, zero is kinder.
                total: u.total.max(0) as u64,
                available: u.available.max(0) as u64,
                used: u.used.max(0) as u64,
            })
        };
        Ok(VolumeUsage { bytes: unit(volume_usage::Unit::Bytes), inodes: unit(volume_usage::Unit::Inodes) })
    }

    async fn client(&self, driver: &str) -> Result<NodeClient<tonic::transport::Channel>, CsiError> {
        let info = self.driver(driver)?;
        client(driver, &info.endpoint).await
    }
}

async fn client(driver: &str, endpoint: &Path) -> Result<NodeClient<tonic::transport::Channel>, CsiError> {
    let channel = crate::dial::channel(endpoint).await.map_err(|source| CsiError::Dial {
        driver: driver.to_string(),
        endpoint: endpoint.to_path_buf(),
        source,
    })?;
    Ok(NodeClient::new(channel))
}

async fn call<T>(f: impl std::future::Future<Output = Result<tonic::Response<T>, Status>>) -> Result<(), CsiError> {
    tokio::time::timeout(CALL_TIMEOUT, f)
        .await
        .map_err(|_| Status::deadline_exceeded("context deadline exceeded"))??;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driver_must_speak_csi_1() {
        let v = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(CsiDrivers::validate("d", &v(&["1.0.0"])).is_ok());
        assert!(CsiDrivers::validate("d", &v(&["0.3.0", "v1.2.0"])).is_ok());
        assert_eq!(
            CsiDrivers::validate("d", &[]).unwrap_err().to_string(),
            "kubernetes.io/csi: RegisterPlugin for CSI driver \"d\" failed. Plugin returned an empty list for supported versions"
        );
        assert!(matches!(CsiDrivers::validate("d", &v(&["0.3.0"])), Err(CsiError::UnsupportedVersions { .. })));
    }

    #[test]
    fn the_access_mode_is_the_persistent_volumes() {
        let rwo = Volume { fs_type: "ext4".into(), ..Default::default() }.capability();
        assert_eq!(rwo.access_mode.unwrap().mode, access_mode::Mode::SingleNodeWriter as i32);
        assert!(matches!(rwo.access_type, Some(AccessType::Mount(m)) if m.fs_type == "ext4"));
        let rox = Volume { access_mode: "ReadOnlyMany".into(), ..Default::default() }.capability();
        assert_eq!(rox.access_mode.unwrap().mode, access_mode::Mode::MultiNodeReaderOnly as i32);
        let block = Volume { block: true, ..Default::default() }.capability();
        assert!(matches!(block.access_type, Some(AccessType::Block(_))));
        let rwx = Volume { access_mode: "ReadWriteMany".into(), ..Default::default() }.capability();
        assert_eq!(rwx.access_mode.unwrap().mode, access_mode::Mode::MultiNodeMultiWriter as i32);
    }

    #[test]
    fn an_unregistered_driver_is_named() {
        let drivers = CsiDrivers::default();
        assert_eq!(
            drivers.driver("example.com").unwrap_err().to_string(),
            "driver name example.com not found in the list of registered CSI drivers"
        );
    }
}
