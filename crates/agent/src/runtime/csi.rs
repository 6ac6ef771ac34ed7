//! A pod's volumes served by CSI drivers (upstream's CSI volume plugin, node side):
//! PersistentVolumeClaims and generic ephemeral volumes (the claim's bound PV,
//! `gantry_pod::claim`), and CSI ephemeral inline volumes. The `VolumeAttachment` when the
//! driver's `CSIDriver` object requires attach, `NodeStageVolume` once per volume on the node,
//! then `NodePublishVolume` per pod (a directory, or a device file for `volumeMode: Block`), the
//! pod's `fsGroup` as the driver's `fsGroupPolicy` says; on the pod's removal
//! `NodeUnpublishVolume`, and `NodeUnstageVolume` once no pod on the node publishes the volume
//! any more. Volumes that need attaching are reported in use (`volumes_in_use`) meanwhile.
//!
//! The state is on disk, in upstream's layouts (`Layout`), so that a restarted agent tears down
//! what an earlier one set up: a volume is staged when its staged record's `vol_data.json`
//! exists (`<root>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>` for a file system), and
//! published for a pod when the pod's record has one
//! (`<root>/pods/<uid>/volumes/kubernetes.io~csi/<pv>`, or `volumeDevices/...` for a block
//! device). Each file is written once its call succeeded (upstream writes it before the call).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use gantry_plugins::csi::{CsiDrivers, CsiError, VolumeUsage};
use gantry_pod::claim::{self, ClaimError, Lifecycle};
use gantry_vocab::{paths, spec};
use k8s_openapi::api::core::v1::{Pod, SecretReference, Volume};
use k8s_openapi::api::storage::v1::CSIDriver;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cluster::objects::{ObjectError, ObjectSource};

/// The CSI plugin's directory name among a pod's volumes.
pub const POD_PLUGIN_DIR: &str = "kubernetes.io~csi";
const VOL_DATA: &str = "vol_data.json";

/// Why a CSI volume is not (yet) set up; the message is upstream's event text.
#[derive(Debug, thiserror::Error)]
pub enum CsiVolumeError {
    #[error("error processing PVC {namespace}/{claim}: {source}")]
    Claim { namespace: String, claim: String, source: ClaimError },
    #[error("error processing PVC {namespace}/{claim}: {source}")]
    Read { namespace: String, claim: String, source: ObjectError },
    #[error(transparent)]
    NotForPod(#[from] claim::NotForPod),
    #[error(transparent)]
    Mode(#[from] claim::VolumeModeMismatch),
    #[error("persistentVolumeClaim volumes need an API server")]
    NoApiServer,
    #[error(
        "MountVolume.SetUp failed for volume {volume:?} : kubernetes.io/csi: mounter.SetupAt failed to check volume lifecycle mode: {why}"
    )]
    Lifecycle { volume: String, why: String },
    #[error("MountVolume.WaitForAttach failed for volume {pv:?} : {why}")]
    Attach { pv: String, why: String },
    #[error("MountVolume.MountDevice failed for volume {pv:?} : {source}")]
    Stage { pv: String, source: CsiError },
    #[error("MountVolume.SetUp failed for volume {pv:?} : {source}")]
    Publish { pv: String, source: CsiError },
    #[error("MountVolume.MountDevice failed for volume {pv:?} : fetching NodeStageSecretRef {source}")]
    StageSecret { pv: String, source: SecretError },
    #[error("MountVolume.SetUp failed for volume {pv:?} : fetching NodePublishSecretRef {source}")]
    PublishSecret { pv: String, source: SecretError },
    #[error("MountVolume.SetUp failed for volume {pv:?} : kubernetes.io/csi: {action} {}: {source}", path.display())]
    Io { pv: String, action: &'static str, path: PathBuf, source: std::io::Error },
}

/// Why the Secret a PersistentVolume names for its driver could not be read (upstream's
/// `getCredentialsFromSecret` text, after the reference).
#[derive(Debug, thiserror::Error)]
#[error(
    "{namespace}/{name} failed: kubernetes.io/csi: failed to find the secret {name} in the namespace {namespace} with error: {why}"
)]
pub struct SecretError {
    namespace: String,
    name: String,
    why: SecretMissing,
}

#[derive(Debug, thiserror::Error)]
pub enum SecretMissing {
    #[error("secrets {0:?} not found")]
    NotFound(String),
    #[error(transparent)]
    Read(ObjectError),
}

impl CsiVolumeError {
    /// Whether the pod waits in `ContainerCreating` (retrying) rather than failing to start
    /// with `CreateContainerConfigError`.
    pub fn is_wait(&self) -> bool {
        match self {
            CsiVolumeError::Claim { source, .. } => source.is_wait(),
            CsiVolumeError::NoApiServer => false,
            _ => true,
        }
    }
}

/// Upstream's `vol_data.json` keys (`specVolID`, `attachmentID` as spelled there).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct VolData {
    #[serde(rename = "specVolID", default, skip_serializing_if = "String::is_empty")]
    spec_vol_id: String,
    volume_handle: String,
    driver_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    node_name: String,
    #[serde(rename = "attachmentID", default, skip_serializing_if = "String::is_empty")]
    attachment_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    volume_lifecycle_mode: String,
    /// Gantry's own key (upstream keeps it in memory): the pod's name for the volume, under
    /// which its stats are reported, also after a restart.
    #[serde(rename = "gantry.dev/podVolumeName", default, skip_serializing_if = "String::is_empty")]
    pod_volume_name: String,
}

/// Upstream's `VolumeAttachment` name for a volume on a node: `csi-<sha256(handle+driver+node)>`.
pub fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    format!("csi-{}", hex::encode(Sha256::digest(format!("{handle}{driver}{node}"))))
}

/// Upstream's volume ID of an inline ephemeral volume: `csi-<sha256(pod UID + volume name)>`.
pub fn inline_volume_id(pod_uid: &str, volume: &str) -> String {
    format!("csi-{}", hex::encode(Sha256::digest(format!("{pod_uid}{volume}"))))
}

/// Upstream's unique name of a CSI volume (`status.volumesInUse`, `volumesAttached`).
pub fn unique_name(driver: &str, handle: &str) -> String {
    format!("kubernetes.io/csi/{driver}^{handle}")
}

/// `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>`: the staged volume's directory
/// (its `globalmount` is the staging path).
pub fn staging_dir(root_dir: &Path, driver: &str, handle: &str) -> PathBuf {
    root_dir.join("plugins/kubernetes.io/csi").join(driver).join(hex::encode(Sha256::digest(handle)))
}

/// Upstream's directory of the CSI plugin's block volumes.
const BLOCK_DIR: &str = "plugins/kubernetes.io/csi/volumeDevices";

/// Where one volume is staged and published, as upstream lays it out for each volume mode.
struct Layout {
    /// The pod's record of the published volume (its `vol_data.json`).
    record: PathBuf,
    /// `NodePublishVolume`'s target: a directory for a file system, a file for a block device.
    target: PathBuf,
    /// The staged volume's record, and `NodeStageVolume`'s staging path.
    staged: PathBuf,
    staging: PathBuf,
}

impl Layout {
    /// A file system: `pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount`, staged at
    /// `plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount`. A block device:
    /// recorded under `pods/<uid>/volumeDevices/kubernetes.io~csi/<pv>`, published on the file
    /// `plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<uid>`, staged at
    /// `.../volumeDevices/staging/<pv>` with its record in `.../volumeDevices/<pv>/data`.
    fn new(root_dir: &Path, uid: &str, pv: &str, block: bool, driver: &str, handle: &str) -> Layout {
        if block {
            let devices = root_dir.join(BLOCK_DIR);
            Layout {
                record: block_record_dir(root_dir, uid, pv),
                target: devices.join("publish").join(pv).join(uid),
                staged: devices.join(pv).join("data"),
                staging: devices.join("staging").join(pv),
            }
        } else {
            let staged = staging_dir(root_dir, driver, handle);
            let record = publish_dir(root_dir, uid, pv);
            Layout { target: record.join("mount"), record, staging: staged.join("globalmount"), staged }
        }
    }
}

/// `<root>/pods/<uid>/volumeDevices/kubernetes.io~csi/<pv>`: the pod's record of a block volume.
fn block_record_dir(root_dir: &Path, uid: &str, pv: &str) -> PathBuf {
    paths::pod_dir(root_dir, uid).join("volumeDevices").join(POD_PLUGIN_DIR).join(pv)
}

/// The pod's directories of published CSI volumes: file systems, then block devices.
fn pod_plugin_dirs(root_dir: &Path, uid: &str) -> [(PathBuf, bool); 2] {
    let pod = paths::pod_dir(root_dir, uid);
    [(pod.join("volumes").join(POD_PLUGIN_DIR), false), (pod.join("volumeDevices").join(POD_PLUGIN_DIR), true)]
}

/// `<root>/pods/<uid>/volumes/kubernetes.io~csi/<pv>`: the published volume's directory (its
/// `mount` is the target path).
pub fn publish_dir(root_dir: &Path, uid: &str, pv: &str) -> PathBuf {
    paths::volume_dir(root_dir, uid, "csi", pv)
}

/// A claim volume ready in the pod: the target path, and whether it is read-only.
pub struct Published {
    pub path: PathBuf,
    pub read_only: bool,
    /// A block device (for the container's `volumeDevices`), not a directory.
    pub block: bool,
}

/// What publishing one volume for a pod takes.
struct Plan {
    /// The PV's name (an inline volume's: the pod's volume name): the publish directory's.
    spec_vol_id: String,
    layout: Layout,
    volume: gantry_plugins::csi::Volume,
    /// Whether to wait for the `VolumeAttachment` first.
    attach: bool,
    lifecycle: Lifecycle,
    /// The PV's access modes (`None` for an inline volume), for the fsGroup policy.
    access_modes: Option<Vec<String>>,
    /// The PV's `nodeStageSecretRef` and `nodePublishSecretRef` (an inline volume's
    /// `nodePublishSecretRef`, in the pod's namespace).
    stage_secret: Option<SecretReference>,
    publish_secret: Option<SecretReference>,
}

/// The node's CSI volumes.
pub struct CsiVolumes {
    drivers: CsiDrivers,
    root_dir: PathBuf,
    node: String,
    /// Volume operations one at a time: a pod's containers start concurrently and each sets up
    /// the pod's volumes, and unstaging must not race a publish of the same volume.
    one_at_a_time: tokio::sync::Mutex<()>,
    /// Per pod UID, the attachable volumes (unique names) it uses or is about to: from the
    /// moment the node knows the volume needs attaching until its teardown is done.
    in_use: std::sync::Mutex<BTreeMap<String, BTreeSet<String>>>,
    /// Their union, sorted: the Node's `status.volumesInUse`.
    in_use_tx: tokio::sync::watch::Sender<Vec<String>>,
}

impl CsiVolumes {
    /// Volumes an earlier run published with an attachment count as in use from the start, as
    /// upstream's reconstructed volumes do.
    pub fn new(drivers: CsiDrivers, root_dir: PathBuf, node: String) -> Self {
        let csi = CsiVolumes {
            in_use: std::sync::Mutex::new(published_attachable(&root_dir)),
            drivers,
            root_dir,
            node,
            one_at_a_time: tokio::sync::Mutex::new(()),
            in_use_tx: tokio::sync::watch::Sender::new(Vec::new()),
        };
        csi.publish_in_use();
        csi
    }

    /// The node's `status.volumesInUse`, now and as it changes.
    pub fn volumes_in_use(&self) -> tokio::sync::watch::Receiver<Vec<String>> {
        self.in_use_tx.subscribe()
    }

    fn mark_in_use(&self, uid: &str, name: String) {
        let inserted = self.lock_in_use().entry(uid.to_string()).or_default().insert(name);
        if inserted {
            self.publish_in_use();
        }
    }

    fn forget_in_use(&self, uid: &str) {
        if self.lock_in_use().remove(uid).is_some() {
            self.publish_in_use();
        }
    }

    fn lock_in_use(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, BTreeSet<String>>> {
        self.in_use.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish_in_use(&self) {
        let all: BTreeSet<String> = self.lock_in_use().values().flatten().cloned().collect();
        self.in_use_tx.send_if_modified(|v| {
            let changed = v.iter().ne(all.iter());
            if changed {
                *v = all.into_iter().collect();
            }
            changed
        });
    }

    /// Sets up the pod's claim volume `v`, a `persistentVolumeClaim` or a generic ephemeral
    /// volume (whose claim the pod must control) (idempotent: a volume already published for the pod
    /// is only looked up).
    pub async fn set_up(
        &self,
        pod: &Pod,
        v: &Volume,
        objects: Option<&ObjectSource>,
    ) -> Result<Published, CsiVolumeError> {
        let claim_name = spec::claim_name(pod, v).expect("called for claim volumes");
        let (ns, claim_name) = (spec::namespace(pod), claim_name.as_str());
        let claim_read_only = v.persistent_volume_claim.as_ref().and_then(|c| c.read_only).unwrap_or(false);
        let objects = objects.ok_or(CsiVolumeError::NoApiServer)?;
        let read = |source| CsiVolumeError::Read { namespace: ns.to_string(), claim: claim_name.to_string(), source };
        let claim_err =
            |source| CsiVolumeError::Claim { namespace: ns.to_string(), claim: claim_name.to_string(), source };
        let pvc = objects.claim(ns, claim_name).await.map_err(read)?;
        let (pv_name, claim_uid) = claim::bound_volume(ns, claim_name, pvc.as_ref()).map_err(claim_err)?;
        if let (Some(_), Some(pvc)) = (&v.ephemeral, &pvc) {
            claim::claim_for_pod(pod, pvc)?;
        }
        let pv = objects.persistent_volume(&pv_name).await.map_err(read)?;
        let csi = claim::csi_source(&pv_name, pv.as_ref(), &claim_uid).map_err(claim_err)?;
        let read_only = claim_read_only || csi.read_only.unwrap_or(false);
        let block = pv.as_ref().and_then(|p| p.spec.as_ref()?.volume_mode.as_deref()) == Some("Block");
        claim::check_volume_mode(pod, &v.name, block)?;
        let layout = Layout::new(&self.root_dir, spec::uid(pod), &pv_name, block, &csi.driver, &csi.volume_handle);
        if read_vol_data(&layout.record).is_some() {
            return Ok(Published { path: layout.target, read_only, block });
        }
        let driver_object = objects.csi_driver(&csi.driver).await.map_err(read)?;
        let volume = gantry_plugins::csi::Volume {
            driver: csi.driver.clone(),
            handle: csi.volume_handle.clone(),
            fs_type: csi.fs_type.clone().unwrap_or_default(),
            read_only,
            block,
            access_mode: pv.as_ref().map(claim::access_mode).unwrap_or_default(),
            attributes: csi.volume_attributes.clone().unwrap_or_default(),
            ..Default::default()
        };
        // Upstream: without a CSIDriver object the volume is attachable.
        let attach = driver_object.as_ref().is_none_or(|d| d.spec.attach_required.unwrap_or(true));
        let access_modes = Some(pv.as_ref().and_then(|p| p.spec.as_ref()?.access_modes.clone()).unwrap_or_default());
        let plan = Plan {
            spec_vol_id: pv_name,
            layout,
            volume,
            attach,
            lifecycle: Lifecycle::Persistent,
            access_modes,
            stage_secret: csi.node_stage_secret_ref.clone(),
            publish_secret: csi.node_publish_secret_ref.clone(),
        };
        self.publish(pod, v, plan, driver_object.as_ref(), objects).await
    }

    /// Sets up the pod's CSI ephemeral inline volume `v` (`csi:` in the pod spec): published
    /// for the pod alone, never staged nor attached, under the volume's own name.
    pub async fn set_up_inline(
        &self,
        pod: &Pod,
        v: &Volume,
        objects: Option<&ObjectSource>,
    ) -> Result<Published, CsiVolumeError> {
        let source = v.csi.as_ref().expect("called for inline CSI volumes");
        let objects = objects.ok_or(CsiVolumeError::NoApiServer)?;
        let read_only = source.read_only.unwrap_or(false);
        let handle = inline_volume_id(spec::uid(pod), &v.name);
        let layout = Layout::new(&self.root_dir, spec::uid(pod), &v.name, false, &source.driver, &handle);
        if read_vol_data(&layout.record).is_some() {
            return Ok(Published { path: layout.target, read_only, block: false });
        }
        let lifecycle = |why: String| CsiVolumeError::Lifecycle { volume: v.name.clone(), why };
        let driver_object = objects.csi_driver(&source.driver).await.map_err(|e| lifecycle(e.to_string()))?;
        claim::check_lifecycle(Lifecycle::Ephemeral, &source.driver, driver_object.as_ref())
            .map_err(|e| lifecycle(e.to_string()))?;
        let volume = gantry_plugins::csi::Volume {
            driver: source.driver.clone(),
            handle,
            fs_type: source.fs_type.clone().unwrap_or_default(),
            read_only,
            attributes: source.volume_attributes.clone().unwrap_or_default(),
            ..Default::default()
        };
        let plan = Plan {
            spec_vol_id: v.name.clone(),
            layout,
            volume,
            attach: false,
            lifecycle: Lifecycle::Ephemeral,
            access_modes: None,
            stage_secret: None,
            publish_secret: source.node_publish_secret_ref.as_ref().map(|r| SecretReference {
                name: Some(r.name.clone()),
                namespace: Some(spec::namespace(pod).to_string()),
            }),
        };
        self.publish(pod, v, plan, driver_object.as_ref(), objects).await
    }

    /// Attaches (waits for the attacher), stages and publishes the planned volume for the pod.
    async fn publish(
        &self,
        pod: &Pod,
        v: &Volume,
        plan: Plan,
        driver_object: Option<&CSIDriver>,
        objects: &ObjectSource,
    ) -> Result<Published, CsiVolumeError> {
        let Plan {
            spec_vol_id: pv_name,
            layout,
            mut volume,
            attach,
            lifecycle,
            access_modes,
            stage_secret,
            publish_secret,
        } = plan;
        let (read_only, block) = (volume.read_only, volume.block);
        let _guard = self.one_at_a_time.lock().await;
        // Another container of the pod may have published it meanwhile.
        if read_vol_data(&layout.record).is_some() {
            return Ok(Published { path: layout.target, read_only, block });
        }
        if driver_object.is_some_and(|d| d.spec.pod_info_on_mount == Some(true)) {
            volume.attributes.extend(claim::pod_info(pod, lifecycle));
        }
        let io = |action, path: &Path, source| CsiVolumeError::Io {
            pv: pv_name.clone(),
            action,
            path: path.to_path_buf(),
            source,
        };
        let attachment = if attach {
            self.mark_in_use(spec::uid(pod), unique_name(&volume.driver, &volume.handle));
            let name = attachment_name(&volume.handle, &volume.driver, &self.node);
            volume.publish_context = self.attached(objects, &pv_name, &name).await?;
            name
        } else {
            String::new()
        };
        let driver = self
            .drivers
            .driver(&volume.driver)
            .map_err(|source| CsiVolumeError::Publish { pv: pv_name.clone(), source })?;
        // Inline volumes are never staged (upstream stages only persistent volumes).
        let stages = driver.stages && lifecycle == Lifecycle::Persistent;
        if stages && read_vol_data(&layout.staged).is_none() {
            if let Some(r) = &stage_secret {
                volume.stage_secrets = secret_data(objects, r)
                    .await
                    .map_err(|source| CsiVolumeError::StageSecret { pv: pv_name.clone(), source })?;
            }
            create_dir(&layout.staging).map_err(|e| io("cannot create", &layout.staging, e))?;
            create_dir(&layout.staged).map_err(|e| io("cannot create", &layout.staged, e))?;
            self.drivers
                .stage(&volume, &layout.staging)
                .await
                .map_err(|source| CsiVolumeError::Stage { pv: pv_name.clone(), source })?;
            let data = VolData {
                volume_handle: volume.handle.clone(),
                driver_name: volume.driver.clone(),
                ..Default::default()
            };
            write_vol_data(&layout.staged, &data).map_err(|e| io("cannot write", &layout.staged, e))?;
            tracing::info!(pod = %spec::full_name(pod), volume = %pv_name, driver = %volume.driver, "volume staged");
        }
        if let Some(r) = &publish_secret {
            volume.publish_secrets = secret_data(objects, r)
                .await
                .map_err(|source| CsiVolumeError::PublishSecret { pv: pv_name.clone(), source })?;
        }
        // The driver creates the target itself; its parent is the node's.
        let parent = layout.target.parent().unwrap_or(&layout.record);
        create_dir(parent).map_err(|e| io("cannot create", parent, e))?;
        create_dir(&layout.record).map_err(|e| io("cannot create", &layout.record, e))?;
        self.drivers
            .publish(&volume, stages.then_some(layout.staging.as_path()), &layout.target)
            .await
            .map_err(|source| CsiVolumeError::Publish { pv: pv_name.clone(), source })?;
        let security = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
        let policy = driver_object.and_then(|d| d.spec.fs_group_policy.as_deref());
        if let Some(group) = security.and_then(|s| s.fs_group)
            && !block
            && claim::applies_fs_group(policy, &volume.fs_type, access_modes.as_deref(), read_only)
        {
            let on_mismatch = security.and_then(|s| s.fs_group_change_policy.as_deref()) == Some("OnRootMismatch");
            let (target, group) = (layout.target.clone(), group as u32);
            tokio::task::spawn_blocking(move || set_ownership(&target, group, on_mismatch))
                .await
                .expect("the ownership walk does not panic")
                .map_err(|e| io("cannot apply fsGroup to", &layout.target, e))?;
        }
        let data = VolData {
            spec_vol_id: pv_name.clone(),
            volume_handle: volume.handle.clone(),
            driver_name: volume.driver.clone(),
            node_name: self.node.clone(),
            attachment_id: attachment,
            volume_lifecycle_mode: lifecycle.as_str().into(),
            pod_volume_name: v.name.clone(),
        };
        write_vol_data(&layout.record, &data).map_err(|e| io("cannot write", &layout.record, e))?;
        tracing::info!(pod = %spec::full_name(pod), volume = %pv_name, driver = %volume.driver, block, "volume published");
        Ok(Published { path: layout.target, read_only, block })
    }

    /// The attachment's metadata once the `VolumeAttachment` `name` says attached.
    async fn attached(
        &self,
        objects: &ObjectSource,
        pv: &str,
        name: &str,
    ) -> Result<BTreeMap<String, String>, CsiVolumeError> {
        let why = |why: String| CsiVolumeError::Attach { pv: pv.to_string(), why };
        let attachment = objects.volume_attachment(name).await.map_err(|e| why(e.to_string()))?;
        let attachment = attachment.ok_or_else(|| {
            why(format!("volume attachment {name} for volume {pv} on node {} is not found", self.node))
        })?;
        let status = attachment.status.unwrap_or_default();
        if !status.attached {
            let error = status.attach_error.and_then(|e| e.message).unwrap_or_default();
            return Err(why(format!("volume attachment {name} is not attached yet {error}").trim_end().to_string()));
        }
        Ok(status.attachment_metadata.unwrap_or_default())
    }

    /// Tears down every CSI volume of the removed pod `uid`: `NodeUnpublishVolume`, then
    /// `NodeUnstageVolume` for a volume no other pod on the node publishes. Returns whether
    /// everything is gone (the pod directory may then be removed; otherwise a mount is left
    /// and its data must not be deleted with the directory).
    pub async fn tear_down(&self, uid: &str) -> bool {
        let _guard = self.one_at_a_time.lock().await;
        let mut clean = true;
        for (plugin, block) in pod_plugin_dirs(&self.root_dir, uid) {
            let Ok(entries) = std::fs::read_dir(&plugin) else { continue };
            let mut all = true;
            for dir in entries.flatten().map(|e| e.path()) {
                all &= self.tear_down_volume(uid, &dir, block).await;
            }
            clean &= all && std::fs::remove_dir(&plugin).is_ok();
        }
        if clean {
            self.forget_in_use(uid);
        }
        clean
    }

    async fn tear_down_volume(&self, uid: &str, dir: &Path, block: bool) -> bool {
        let Some(data) = read_vol_data(dir) else {
            // Never published: only the directories the node made, if nothing is mounted there.
            return if block { remove_empty(&[dir], uid) } else { remove_empty(&[&dir.join("mount"), dir], uid) };
        };
        let (driver, handle, pv) = (data.driver_name.as_str(), data.volume_handle.as_str(), data.spec_vol_id.as_str());
        let layout = Layout::new(&self.root_dir, uid, pv, block, driver, handle);
        if let Err(e) = self.drivers.unpublish(driver, handle, &layout.target).await {
            tracing::warn!(pod_uid = uid, volume = %pv, driver, error = %e, "UnmountVolume.TearDown failed");
            return false;
        }
        tracing::info!(pod_uid = uid, volume = %pv, driver, "volume unpublished");
        let _ = std::fs::remove_file(dir.join(VOL_DATA));
        let unpublished = if block {
            // The device file, if the driver left it; its directory once no pod's is left.
            let file = match std::fs::remove_file(&layout.target) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!(pod_uid = uid, file = %layout.target.display(), error = %e, "cannot remove the device file");
                    false
                }
                _ => true,
            };
            if let Some(publish) = layout.target.parent() {
                let _ = std::fs::remove_dir(publish);
            }
            file && remove_empty(&[dir], uid)
        } else {
            remove_empty(&[&layout.target, dir], uid)
        };
        if !unpublished {
            return false;
        }
        if read_vol_data(&layout.staged).is_none() || self.published_anywhere(driver, handle) {
            return true;
        }
        if let Err(e) = self.drivers.unstage(driver, handle, &layout.staging).await {
            tracing::warn!(volume = %pv, driver, error = %e, "UnmountDevice failed");
            return false;
        }
        tracing::info!(volume = %pv, driver, "volume unstaged");
        let _ = std::fs::remove_file(layout.staged.join(VOL_DATA));
        let removed = remove_empty(&[&layout.staging, &layout.staged], uid);
        if block && let Some(volume_dir) = layout.staged.parent() {
            let _ = std::fs::remove_dir(volume_dir);
        }
        removed
    }

    /// The pods (UIDs) with a record of a published CSI volume on disk.
    pub fn pods_with_volumes(&self) -> BTreeSet<String> {
        published(&self.root_dir).map(|(uid, _)| uid).collect()
    }

    /// Whether any pod on the node still has the volume published.
    fn published_anywhere(&self, driver: &str, handle: &str) -> bool {
        published(&self.root_dir).any(|(_, d)| d.driver_name == driver && d.volume_handle == handle)
    }
}

/// The data of the Secret `r` names, as the driver gets it (upstream's
/// `getCredentialsFromSecret`: every key, its value as a string).
async fn secret_data(objects: &ObjectSource, r: &SecretReference) -> Result<BTreeMap<String, String>, SecretError> {
    let (namespace, name) = (r.namespace.clone().unwrap_or_default(), r.name.clone().unwrap_or_default());
    let why = match objects.volume_secret(&namespace, &name).await {
        Ok(Some(secret)) => {
            let data = secret.data.unwrap_or_default().into_iter();
            return Ok(data.map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned())).collect());
        }
        Ok(None) => SecretMissing::NotFound(name.clone()),
        Err(e) => SecretMissing::Read(e),
    };
    Err(SecretError { namespace, name, why })
}

/// The usage of the pod `uid`'s published CSI volumes whose driver reports it
/// (`GET_VOLUME_STATS`), by the pod's volume name; a volume whose driver cannot answer now is
/// left out (as upstream leaves out a volume whose metrics fail). A file system is asked about
/// at its mount, a block volume at its device file (upstream's block mapper has metrics too).
pub async fn volume_stats(drivers: &CsiDrivers, root_dir: &Path, uid: &str) -> Vec<(String, VolumeUsage)> {
    let mut out = Vec::new();
    for (plugin, block) in pod_plugin_dirs(root_dir, uid) {
        let published = std::fs::read_dir(plugin).into_iter().flatten().flatten().map(|e| e.path());
        for dir in published {
            let Some(data) = read_vol_data(&dir).filter(|d| !d.pod_volume_name.is_empty()) else { continue };
            if !drivers.driver(&data.driver_name).is_ok_and(|d| d.volume_stats) {
                continue;
            }
            let (driver, handle) = (&data.driver_name, &data.volume_handle);
            let target = Layout::new(root_dir, uid, &data.spec_vol_id, block, driver, handle).target;
            match drivers.volume_stats(driver, handle, &target).await {
                Ok(usage) => out.push((data.pod_volume_name, usage)),
                // Asked again every period: debug, not a warning each time.
                Err(e) => {
                    tracing::debug!(pod_uid = uid, volume = %data.pod_volume_name, error = %e, "NodeGetVolumeStats failed")
                }
            }
        }
    }
    out
}

/// Per pod UID, the volumes published on disk with an attachment (a restarted node's volumes
/// in use).
fn published_attachable(root_dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (uid, data) in published(root_dir).filter(|(_, d)| !d.attachment_id.is_empty()) {
        out.entry(uid).or_default().insert(unique_name(&data.driver_name, &data.volume_handle));
    }
    out
}

/// Every volume published for a pod on the node (file systems and block devices), by pod UID.
fn published(root_dir: &Path) -> impl Iterator<Item = (String, VolData)> + '_ {
    let pods = std::fs::read_dir(root_dir.join("pods")).into_iter().flatten().flatten();
    pods.flat_map(move |p| {
        let uid = p.file_name().to_string_lossy().into_owned();
        pod_plugin_dirs(root_dir, &uid).into_iter().flat_map(move |(dir, _)| {
            let uid = uid.clone();
            let volumes = std::fs::read_dir(dir).into_iter().flatten().flatten();
            volumes.filter_map(move |v| Some((uid.clone(), read_vol_data(&v.path())?)))
        })
    })
}

/// Upstream's `SetVolumeOwnership`: every file under `root` (symlinks aside) gets group `gid`
/// and group read/write (directories also search and setgid); with `on_root_mismatch`, nothing
/// is changed when the root already has them.
fn set_ownership(root: &Path, gid: u32, on_root_mismatch: bool) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(root)?;
    let wanted = super::projection::fs_group_mode(0, meta.is_dir(), false);
    if on_root_mismatch && meta.gid() == gid && meta.mode() & wanted == wanted {
        return Ok(());
    }
    walk_ownership(root, gid)
}

fn walk_ownership(path: &Path, gid: u32) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    std::os::unix::fs::lchown(path, None, Some(gid))?;
    let mode = super::projection::fs_group_mode(meta.mode() & 0o7777, meta.is_dir(), false);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            walk_ownership(&entry?.path(), gid)?;
        }
    }
    Ok(())
}

fn create_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o750).create(dir)
}

fn read_vol_data(dir: &Path) -> Option<VolData> {
    let bytes = std::fs::read(dir.join(VOL_DATA)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn write_vol_data(dir: &Path, data: &VolData) -> std::io::Result<()> {
    std::fs::write(dir.join(VOL_DATA), serde_json::to_vec(data).map_err(std::io::Error::other)?)
}

/// Removes the directories (innermost first) with `rmdir`, never recursively: a directory
/// that is still a mount point or not empty stays, and that is logged.
fn remove_empty(dirs: &[&Path], uid: &str) -> bool {
    dirs.iter().all(|d| match std::fs::remove_dir(d) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => {
            tracing::warn!(pod_uid = uid, dir = %d.display(), error = %e, "cannot remove volume directory");
            false
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_paths_are_upstreams() {
        // sha256("h1" + "d.example.com" + "node-a")
        let name = attachment_name("h1", "d.example.com", "node-a");
        assert_eq!(name, format!("csi-{}", hex::encode(Sha256::digest("h1d.example.comnode-a"))));
        assert_eq!(name.len(), 4 + 64);
        let id = inline_volume_id("u1", "scratch");
        assert_eq!(id, format!("csi-{}", hex::encode(Sha256::digest("u1scratch"))));
        assert_eq!(
            staging_dir(Path::new("/var/lib/kubelet"), "d.example.com", "h1"),
            PathBuf::from(format!(
                "/var/lib/kubelet/plugins/kubernetes.io/csi/d.example.com/{}",
                hex::encode(Sha256::digest("h1"))
            ))
        );
        assert_eq!(
            publish_dir(Path::new("/var/lib/kubelet"), "u1", "pv1"),
            PathBuf::from("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pv1")
        );
    }

    #[test]
    fn vol_data_has_upstreams_keys() {
        let data = VolData {
            spec_vol_id: "pv1".into(),
            volume_handle: "h1".into(),
            driver_name: "d".into(),
            node_name: "n".into(),
            attachment_id: String::new(),
            volume_lifecycle_mode: "Persistent".into(),
            pod_volume_name: "data".into(),
        };
        let json = serde_json::to_value(&data).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"specVolID": "pv1", "volumeHandle": "h1", "driverName": "d", "nodeName": "n",
                "volumeLifecycleMode": "Persistent", "gantry.dev/podVolumeName": "data"})
        );
        let staged = VolData { volume_handle: "h1".into(), driver_name: "d".into(), ..Default::default() };
        assert_eq!(
            serde_json::to_value(&staged).unwrap(),
            serde_json::json!({"volumeHandle": "h1", "driverName": "d"})
        );
    }

    #[tokio::test]
    async fn a_pod_whose_volume_never_published_leaves_nothing_and_a_mount_is_never_removed_recursively() {
        let root = tempfile::tempdir().unwrap();
        let csi = CsiVolumes::new(CsiDrivers::default(), root.path().to_path_buf(), "n".into());
        let dir = publish_dir(root.path(), "u1", "pv1");
        std::fs::create_dir_all(&dir).unwrap();
        assert!(csi.tear_down("u1").await);
        assert!(!dir.exists());
        // Published with a driver that is gone: nothing is removed, and the caller is told.
        std::fs::create_dir_all(dir.join("mount")).unwrap();
        std::fs::write(dir.join("mount/data"), "keep").unwrap();
        let data = VolData {
            spec_vol_id: "pv1".into(),
            volume_handle: "h".into(),
            driver_name: "d".into(),
            ..Default::default()
        };
        write_vol_data(&dir, &data).unwrap();
        assert!(!csi.tear_down("u1").await);
        assert_eq!(std::fs::read_to_string(dir.join("mount/data")).unwrap(), "keep");
    }

    #[tokio::test]
    async fn attached_volumes_an_earlier_run_published_are_in_use_until_torn_down() {
        let root = tempfile::tempdir().unwrap();
        let attached = publish_dir(root.path(), "u1", "pv1");
        let local = publish_dir(root.path(), "u2", "pv2");
        for (dir, attachment) in [(&attached, "csi-abc"), (&local, "")] {
            std::fs::create_dir_all(dir).unwrap();
            let data = VolData {
                volume_handle: "h".into(),
                driver_name: "d".into(),
                attachment_id: attachment.into(),
                ..Default::default()
            };
            write_vol_data(dir, &data).unwrap();
        }
        let csi = CsiVolumes::new(CsiDrivers::default(), root.path().to_path_buf(), "n".into());
        let in_use = csi.volumes_in_use();
        assert_eq!(*in_use.borrow(), ["kubernetes.io/csi/d^h"], "only the volume that needs attaching");
        // The driver is gone, so the volume stays mounted: still in use.
        assert!(!csi.tear_down("u1").await);
        assert_eq!(*in_use.borrow(), ["kubernetes.io/csi/d^h"]);
        std::fs::remove_file(attached.join(VOL_DATA)).unwrap();
        assert!(csi.tear_down("u1").await);
        assert!(in_use.borrow().is_empty());
    }

    #[test]
    fn fs_group_ownership_is_upstreams_and_skipped_when_the_root_matches() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let root = tempfile::tempdir().unwrap();
        let (sub, file) = (root.path().join("sub"), root.path().join("sub/file"));
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(&file, "x").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        set_ownership(root.path(), 4321, false).unwrap();
        let meta = |p: &Path| std::fs::metadata(p).unwrap();
        assert_eq!((meta(&sub).gid(), meta(&sub).mode() & 0o7777 & 0o2070), (4321, 0o2070));
        assert_eq!((meta(&file).gid(), meta(&file).mode() & 0o7777), (4321, 0o660));
        // The root already right: OnRootMismatch changes nothing below it.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        set_ownership(root.path(), 4321, true).unwrap();
        assert_eq!(meta(&file).mode() & 0o7777, 0o600);
        set_ownership(root.path(), 4321, false).unwrap();
        assert_eq!(meta(&file).mode() & 0o7777, 0o660);
    }
}
