//! A pod's `persistentVolumeClaim` volume → the PersistentVolume bound to it (upstream's
//! desired-state-of-world populator, `getPVCExtractPV` and `getPVSpec`): the claim must exist,
//! not be deleting, be `Bound` to a volume, and that volume's `claimRef` must point back at the
//! claim. Until then the pod waits in `ContainerCreating` with upstream's message.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::CSIDriver;

/// Why the claim does not (yet) give a usable volume; shown as
/// `error processing PVC <ns>/<claim>: <this>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    #[error("failed to fetch PVC from API server: persistentvolumeclaims {0:?} not found")]
    ClaimNotFound(String),
    #[error("can't start pod because PVC {namespace}/{name} is being deleted")]
    ClaimDeleting { namespace: String, name: String },
    #[error("PVC {namespace}/{name} has non-bound phase ({phase:?}) or empty pvc.Spec.VolumeName ({volume:?})")]
    NotBound { namespace: String, name: String, phase: String, volume: String },
    #[error("failed to fetch PV {0} from API server: persistentvolumes {0:?} not found")]
    VolumeNotFound(String),
    #[error("found PV object {0} but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim")]
    VolumeNotBound(String),
    #[error("found PV object {pv} but its pv.Spec.ClaimRef.UID ({got}) does not point to claim.UID ({want})")]
    VolumeBoundElsewhere { pv: String, got: String, want: String },
    /// Not a pod wait: the volume is of a kind the node cannot mount.
    #[error("PV {pv}: {kind} volumes are not supported (no CSI or volume plugin)")]
    NotCsi { pv: String, kind: String },
}

impl ClaimError {
    /// Whether waiting can help (the claim or volume may still be bound); otherwise the pod
    /// cannot start with this volume at all.
    pub fn is_wait(&self) -> bool {
        !matches!(self, ClaimError::NotCsi { .. })
    }
}

/// The bound claim's volume name and the claim's UID.
pub fn bound_volume(
    namespace: &str,
    name: &str,
    claim: Option<&PersistentVolumeClaim>,
) -> Result<(String, String), ClaimError> {
    let claim = claim.ok_or_else(|| ClaimError::ClaimNotFound(name.to_string()))?;
    if claim.metadata.deletion_timestamp.is_some() {
        return Err(ClaimError::ClaimDeleting { namespace: namespace.to_string(), name: name.to_string() });
    }
    let phase = claim.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
    let volume = claim.spec.as_ref().and_then(|s| s.volume_name.clone()).unwrap_or_default();
    if phase != "Bound" || volume.is_empty() {
        return Err(ClaimError::NotBound { namespace: namespace.to_string(), name: name.to_string(), phase, volume });
    }
    Ok((volume, claim.metadata.uid.clone().unwrap_or_default()))
}

/// A generic ephemeral volume's claim exists but the pod does not control it (upstream's
/// `ephemeral.VolumeIsForPod`): someone else's claim is never used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("PVC {namespace}/{claim} was not created for pod {namespace}/{pod} (pod is not owner)")]
pub struct NotForPod {
    pub namespace: String,
    pub claim: String,
    pub pod: String,
}

/// Whether the claim is controlled by the pod (an owner reference with `controller: true` and
/// the pod's UID).
pub fn claim_for_pod(pod: &Pod, claim: &PersistentVolumeClaim) -> Result<(), NotForPod> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let owners = claim.metadata.owner_references.as_deref().unwrap_or_default();
    if owners.iter().any(|o| o.controller == Some(true) && o.uid == uid) {
        return Ok(());
    }
    Err(NotForPod {
        namespace: gantry_vocab::spec::namespace(pod).to_string(),
        claim: claim.metadata.name.clone().unwrap_or_default(),
        pod: pod.metadata.name.clone().unwrap_or_default(),
    })
}

/// A claim's volume used against its PV's `volumeMode`: a `Block` volume in a container's
/// `volumeMounts`, or a file system in its `volumeDevices` (upstream's desired-state-of-world
/// populator refuses both; the pod waits).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("volume {volume} has volumeMode {mode}, but is specified in {field}")]
pub struct VolumeModeMismatch {
    pub volume: String,
    pub mode: &'static str,
    pub field: &'static str,
}

/// Checks that every container of the pod (init, regular, ephemeral) uses the volume `volume`
/// as its mode says: mounted when a file system, as a device when `block`.
pub fn check_volume_mode(pod: &Pod, volume: &str, block: bool) -> Result<(), VolumeModeMismatch> {
    use gantry_vocab::spec;
    let ephemeral: Vec<_> = spec::ephemeral_containers(pod).iter().map(spec::ephemeral_as_container).collect();
    let all = || spec::init_containers(pod).iter().chain(spec::containers(pod)).chain(&ephemeral);
    let mounted = all().any(|c| c.volume_mounts.iter().flatten().any(|m| m.name == volume));
    let mapped = all().any(|c| c.volume_devices.iter().flatten().any(|d| d.name == volume));
    let field = match (block, mounted, mapped) {
        (true, true, _) => "volumeMounts",
        (false, _, true) => "volumeDevices",
        _ => return Ok(()),
    };
    Err(VolumeModeMismatch { volume: volume.to_string(), mode: if block { "Block" } else { "Filesystem" }, field })
}

/// The CSI source of the volume `pv_name` bound to the claim with UID `claim_uid`.
pub fn csi_source<'a>(
    pv_name: &str,
    pv: Option<&'a PersistentVolume>,
    claim_uid: &str,
) -> Result<&'a CSIPersistentVolumeSource, ClaimError> {
    let pv = pv.ok_or_else(|| ClaimError::VolumeNotFound(pv_name.to_string()))?;
    let spec = pv.spec.as_ref();
    let claim_ref =
        spec.and_then(|s| s.claim_ref.as_ref()).ok_or_else(|| ClaimError::VolumeNotBound(pv_name.into()))?;
    let got = claim_ref.uid.clone().unwrap_or_default();
    if got != claim_uid {
        return Err(ClaimError::VolumeBoundElsewhere { pv: pv_name.to_string(), got, want: claim_uid.to_string() });
    }
    spec.and_then(|s| s.csi.as_ref()).ok_or_else(|| ClaimError::NotCsi { pv: pv_name.to_string(), kind: kind(pv) })
}

/// The volume source's name in the PV spec, for the unsupported-kind message.
fn kind(pv: &PersistentVolume) -> String {
    const NOT_SOURCES: &[&str] = &[
        "accessModes",
        "capacity",
        "claimRef",
        "mountOptions",
        "nodeAffinity",
        "persistentVolumeReclaimPolicy",
        "storageClassName",
        "volumeMode",
        "volumeAttributesClassName",
    ];
    let spec = k8s_openapi::serde_json::to_value(&pv.spec).unwrap_or_default();
    let mut names = spec.as_object().into_iter().flat_map(|o| o.keys()).filter(|k| !NOT_SOURCES.contains(&k.as_str()));
    names.next().cloned().unwrap_or_else(|| "unknown".into())
}

/// A volume lifecycle mode (`CSIDriver` `spec.volumeLifecycleModes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    Persistent,
    Ephemeral,
}

impl Lifecycle {
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Persistent => "Persistent",
            Lifecycle::Ephemeral => "Ephemeral",
        }
    }
}

/// Why the driver does not serve volumes of a lifecycle mode (upstream's texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LifecycleError {
    #[error("volume mode {:?} not supported by driver {driver} (no CSIDriver object)", mode.as_str())]
    NoDriverObject { mode: Lifecycle, driver: String },
    #[error("volume mode {:?} not supported by driver {driver} (only supports {})", mode.as_str(), go_quoted(supported))]
    NotSupported { mode: Lifecycle, driver: String, supported: Vec<String> },
}

/// A list as Go's `%q` prints a `[]string`: `["a" "b"]`.
fn go_quoted(list: &[String]) -> String {
    format!("[{}]", list.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(" "))
}

/// Upstream's `supportsVolumeLifecycleMode`: without a `CSIDriver` object only persistent
/// volumes; with one, the modes it lists (the API's default: `Persistent`).
pub fn check_lifecycle(mode: Lifecycle, driver: &str, object: Option<&CSIDriver>) -> Result<(), LifecycleError> {
    let Some(object) = object else {
        return match mode {
            Lifecycle::Persistent => Ok(()),
            Lifecycle::Ephemeral => Err(LifecycleError::NoDriverObject { mode, driver: driver.to_string() }),
        };
    };
    let supported =
        object.spec.volume_lifecycle_modes.clone().unwrap_or_else(|| vec![Lifecycle::Persistent.as_str().into()]);
    if supported.iter().any(|m| m == mode.as_str()) {
        return Ok(());
    }
    Err(LifecycleError::NotSupported { mode, driver: driver.to_string(), supported })
}

/// The volume context keys upstream adds when the `CSIDriver` asks for `podInfoOnMount`.
pub fn pod_info(pod: &Pod, mode: Lifecycle) -> BTreeMap<String, String> {
    let spec = pod.spec.as_ref();
    let account = spec.and_then(|s| s.service_account_name.clone()).unwrap_or_default();
    [
        ("csi.storage.k8s.io/pod.name", pod.metadata.name.clone().unwrap_or_default()),
        ("csi.storage.k8s.io/pod.namespace", gantry_vocab::spec::namespace(pod).to_string()),
        ("csi.storage.k8s.io/pod.uid", pod.metadata.uid.clone().unwrap_or_default()),
        ("csi.storage.k8s.io/serviceAccount.name", account),
        ("csi.storage.k8s.io/ephemeral", (mode == Lifecycle::Ephemeral).to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Whether the node applies the pod's `fsGroup` to a published CSI volume (upstream's
/// `supportsFSGroup`), by the `CSIDriver`'s `fsGroupPolicy` (`policy`; the API's default:
/// `ReadWriteOnceWithFSType`): `None` never, `File` always, `ReadWriteOnceWithFSType` only with
/// an fsType and a `ReadWriteOnce` volume (an inline volume always counts as one). Never for a
/// read-only volume. `access_modes`: the PV's, `None` for an inline volume.
pub fn applies_fs_group(policy: Option<&str>, fs_type: &str, access_modes: Option<&[String]>, read_only: bool) -> bool {
    match policy.unwrap_or("ReadWriteOnceWithFSType") {
        _ if read_only => false,
        "None" => false,
        "File" => true,
        _ if fs_type.is_empty() => false,
        _ => access_modes.is_none_or(|modes| modes.iter().any(|m| m == "ReadWriteOnce")),
    }
}

/// The access mode upstream hands the driver: the PV's first, `ReadWriteOnce` without one.
pub fn access_mode(pv: &PersistentVolume) -> String {
    let modes = pv.spec.as_ref().and_then(|s| s.access_modes.as_deref()).unwrap_or_default();
    modes.first().cloned().unwrap_or_else(|| "ReadWriteOnce".into())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        HostPathVolumeSource, ObjectReference, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
        PersistentVolumeSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    use super::*;

    fn claim(phase: &str, volume: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta { name: Some("data".into()), uid: Some("c1".into()), ..Default::default() },
            spec: Some(PersistentVolumeClaimSpec {
                volume_name: Some(volume.into()).filter(|v: &String| !v.is_empty()),
                ..Default::default()
            }),
            status: Some(PersistentVolumeClaimStatus { phase: Some(phase.into()), ..Default::default() }),
        }
    }

    fn pv(claim_uid: Option<&str>, csi: bool) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta { name: Some("pv1".into()), ..Default::default() },
            spec: Some(PersistentVolumeSpec {
                claim_ref: claim_uid.map(|u| ObjectReference { uid: Some(u.into()), ..Default::default() }),
                csi: csi.then(|| CSIPersistentVolumeSource {
                    driver: "d.example.com".into(),
                    volume_handle: "h".into(),
                    ..Default::default()
                }),
                host_path: (!csi).then(|| HostPathVolumeSource { path: "/x".into(), ..Default::default() }),
                access_modes: Some(vec!["ReadOnlyMany".into()]),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn a_bound_claim_gives_its_volume() {
        assert_eq!(bound_volume("ns", "data", Some(&claim("Bound", "pv1"))), Ok(("pv1".into(), "c1".into())));
        let bound = pv(Some("c1"), true);
        let src = csi_source("pv1", Some(&bound), "c1").unwrap();
        assert_eq!((src.driver.as_str(), src.volume_handle.as_str()), ("d.example.com", "h"));
        assert_eq!(access_mode(&pv(None, true)), "ReadOnlyMany");
        assert_eq!(access_mode(&PersistentVolume::default()), "ReadWriteOnce");
    }

    #[test]
    fn the_pod_waits_with_upstreams_messages() {
        let e = bound_volume("ns", "data", None).unwrap_err();
        assert_eq!(e.to_string(), r#"failed to fetch PVC from API server: persistentvolumeclaims "data" not found"#);
        let e = bound_volume("ns", "data", Some(&claim("Pending", ""))).unwrap_err();
        assert_eq!(e.to_string(), r#"PVC ns/data has non-bound phase ("Pending") or empty pvc.Spec.VolumeName ("")"#);
        let mut deleting = claim("Bound", "pv1");
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(
            bound_volume("ns", "data", Some(&deleting)).unwrap_err().to_string(),
            "can't start pod because PVC ns/data is being deleted"
        );
        let e = csi_source("pv1", None, "c1").unwrap_err();
        assert_eq!(e.to_string(), r#"failed to fetch PV pv1 from API server: persistentvolumes "pv1" not found"#);
        let unbound = pv(None, true);
        assert_eq!(
            csi_source("pv1", Some(&unbound), "c1").unwrap_err().to_string(),
            "found PV object pv1 but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
        );
        let other = pv(Some("c2"), true);
        assert_eq!(
            csi_source("pv1", Some(&other), "c1").unwrap_err().to_string(),
            "found PV object pv1 but its pv.Spec.ClaimRef.UID (c2) does not point to claim.UID (c1)"
        );
        assert!(e.is_wait());
    }

    #[test]
    fn ephemeral_volumes_need_a_driver_object_that_lists_them() {
        let driver = |modes: Option<Vec<&str>>| {
            let mut d = CSIDriver::default();
            d.spec.volume_lifecycle_modes = modes.map(|m| m.into_iter().map(String::from).collect());
            d
        };
        assert_eq!(check_lifecycle(Lifecycle::Persistent, "d", None), Ok(()));
        assert_eq!(
            check_lifecycle(Lifecycle::Ephemeral, "d", None).unwrap_err().to_string(),
            r#"volume mode "Ephemeral" not supported by driver d (no CSIDriver object)"#
        );
        assert_eq!(
            check_lifecycle(Lifecycle::Ephemeral, "d", Some(&driver(None))).unwrap_err().to_string(),
            r#"volume mode "Ephemeral" not supported by driver d (only supports ["Persistent"])"#
        );
        let both = driver(Some(vec!["Persistent", "Ephemeral"]));
        assert_eq!(check_lifecycle(Lifecycle::Ephemeral, "d", Some(&both)), Ok(()));
        assert!(check_lifecycle(Lifecycle::Persistent, "d", Some(&driver(Some(vec!["Ephemeral"])))).is_err());
    }

    #[test]
    fn an_ephemeral_volumes_claim_must_be_controlled_by_the_pod() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let pod: Pod = k8s_openapi::serde_json::from_value(k8s_openapi::serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"}, "spec": {"containers": []},
        }))
        .unwrap();
        let mut c = claim("Bound", "pv1");
        c.metadata.name = Some("p-data".into());
        assert_eq!(
            claim_for_pod(&pod, &c).unwrap_err().to_string(),
            "PVC ns/p-data was not created for pod ns/p (pod is not owner)"
        );
        let owner = |uid: &str, controller| OwnerReference {
            uid: uid.into(),
            controller: Some(controller),
            kind: "Pod".into(),
            name: "p".into(),
            api_version: "v1".into(),
            ..Default::default()
        };
        c.metadata.owner_references = Some(vec![owner("u1", false), owner("u2", true)]);
        assert!(claim_for_pod(&pod, &c).is_err(), "an owner that is not the controller, or another pod");
        c.metadata.owner_references = Some(vec![owner("u1", true)]);
        assert_eq!(claim_for_pod(&pod, &c), Ok(()));
    }

    #[test]
    fn fs_group_follows_the_drivers_policy() {
        let rwo = ["ReadWriteOnce".to_string()];
        let rox = ["ReadOnlyMany".to_string()];
        assert!(applies_fs_group(Some("File"), "", Some(&rox), false));
        assert!(!applies_fs_group(Some("File"), "ext4", Some(&rwo), true), "never on a read-only volume");
        assert!(!applies_fs_group(Some("None"), "ext4", Some(&rwo), false));
        assert!(applies_fs_group(None, "ext4", Some(&rwo), false), "the default: with fsType and RWO");
        assert!(!applies_fs_group(None, "", Some(&rwo), false), "no fsType");
        assert!(!applies_fs_group(Some("ReadWriteOnceWithFSType"), "ext4", Some(&rox), false), "not RWO");
        assert!(applies_fs_group(None, "ext4", None, false), "an inline volume counts as RWO");
    }

    #[test]
    fn the_pod_info_keys_are_upstreams() {
        let pod: Pod = k8s_openapi::serde_json::from_value(k8s_openapi::serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"serviceAccountName": "sa", "containers": []},
        }))
        .unwrap();
        let info = pod_info(&pod, Lifecycle::Ephemeral);
        assert_eq!(info["csi.storage.k8s.io/pod.name"], "p");
        assert_eq!(info["csi.storage.k8s.io/pod.namespace"], "ns");
        assert_eq!(info["csi.storage.k8s.io/pod.uid"], "u1");
        assert_eq!(info["csi.storage.k8s.io/serviceAccount.name"], "sa");
        assert_eq!(info["csi.storage.k8s.io/ephemeral"], "true");
        assert_eq!(pod_info(&pod, Lifecycle::Persistent)["csi.storage.k8s.io/ephemeral"], "false");
    }

    #[test]
    fn a_volume_is_used_as_its_mode_says() {
        let pod: Pod = k8s_openapi::serde_json::from_value(k8s_openapi::serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [{"name": "i", "volumeDevices": [{"name": "raw", "devicePath": "/dev/x"}]}],
                "containers": [{"name": "c", "volumeMounts": [{"name": "data", "mountPath": "/d"}]}],
            },
        }))
        .unwrap();
        assert_eq!(check_volume_mode(&pod, "data", false), Ok(()));
        assert_eq!(check_volume_mode(&pod, "raw", true), Ok(()));
        assert_eq!(
            check_volume_mode(&pod, "data", true).unwrap_err().to_string(),
            "volume data has volumeMode Block, but is specified in volumeMounts"
        );
        assert_eq!(
            check_volume_mode(&pod, "raw", false).unwrap_err().to_string(),
            "volume raw has volumeMode Filesystem, but is specified in volumeDevices"
        );
    }

    #[test]
    fn a_volume_without_a_csi_source_is_refused_not_awaited() {
        let host = pv(Some("c1"), false);
        let e = csi_source("pv1", Some(&host), "c1").unwrap_err();
        assert_eq!(e.to_string(), "PV pv1: hostPath volumes are not supported (no CSI or volume plugin)");
        assert!(!e.is_wait());
    }
}
