//! `<root-dir>/device-plugins/kubelet_internal_checkpoint`: the allocations and registered
//! resources, so that a restart keeps every device with its pod. The JSON layout is upstream's
//! (`Data.PodDeviceEntries[]` with `DeviceIDs` per NUMA node, `-1` for devices without
//! topology, and `AllocResp` as the base64 of the protobuf `ContainerAllocateResponse`;
//! `Data.RegisteredDevices`; `Checksum`). The checksum is FNV-1a (32 bit, as upstream's) over
//! the JSON of `Data`; upstream hashes a Go-specific dump of the struct instead, so a checkpoint
//! of the Go kubelet fails the check here and is ignored, as upstream ignores a corrupt one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine;
use prost::Message;
use serde::{Deserialize, Serialize};

use super::state::Entry;
use crate::api::deviceplugin::ContainerAllocateResponse;

pub const FILE_NAME: &str = "kubelet_internal_checkpoint";
/// The NUMA node upstream files devices without topology under.
const NO_TOPOLOGY: &str = "-1";

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot read the device checkpoint {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot write the device checkpoint {}: {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },
    #[error("the device checkpoint {} is not valid JSON: {source}", path.display())]
    Decode { path: PathBuf, source: serde_json::Error },
    #[error("the device checkpoint {} is corrupt: checksum {found} does not match its data ({expected})", path.display())]
    Checksum { path: PathBuf, found: u64, expected: u64 },
    #[error("the device checkpoint {} has an invalid AllocResp for pod {pod_uid} container {container}", path.display())]
    AllocResp { path: PathBuf, pod_uid: String, container: String },
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
struct File {
    data: Data,
    checksum: u64,
}

#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
struct Data {
    pod_device_entries: Vec<PodDevicesEntry>,
    registered_devices: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
struct PodDevicesEntry {
    #[serde(rename = "PodUID")]
    pod_uid: String,
    container_name: String,
    resource_name: String,
    #[serde(rename = "DeviceIDs")]
    device_ids: BTreeMap<String, Vec<String>>,
    alloc_resp: String,
}

/// What a checkpoint holds.
#[derive(Debug, Default, PartialEq)]
pub struct Checkpoint {
    pub entries: Vec<Entry>,
    pub registered: BTreeMap<String, Vec<String>>,
}

fn fnv1a32(bytes: &[u8]) -> u64 {
    let mut hash: u32 = 0x811c_9dc5;
    for b in bytes {
        hash ^= u32::from(*b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    u64::from(hash)
}

fn checksum(data: &Data) -> u64 {
    fnv1a32(&serde_json::to_vec(data).unwrap_or_default())
}

/// The file's bytes for `checkpoint` (pure).
pub fn encode(checkpoint: &Checkpoint) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let data = Data {
        pod_device_entries: checkpoint
            .entries
            .iter()
            .map(|e| PodDevicesEntry {
                pod_uid: e.pod_uid.clone(),
                container_name: e.container.clone(),
                resource_name: e.resource.clone(),
                device_ids: BTreeMap::from([(NO_TOPOLOGY.to_string(), e.device_ids.clone())]),
                alloc_resp: b64.encode(e.response.encode_to_vec()),
            })
            .collect(),
        registered_devices: checkpoint.registered.clone(),
    };
    let file = File { checksum: checksum(&data), data };
    serde_json::to_vec(&file).unwrap_or_default()
}

/// The checkpoint in `bytes` read from `path` (pure; `path` names it in errors).
pub fn decode(path: &Path, bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
    let file: File =
        serde_json::from_slice(bytes).map_err(|source| CheckpointError::Decode { path: path.to_path_buf(), source })?;
    let expected = checksum(&file.data);
    if file.checksum != expected {
        return Err(CheckpointError::Checksum { path: path.to_path_buf(), found: file.checksum, expected });
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut entries = Vec::new();
    for e in file.data.pod_device_entries {
        let response = b64
            .decode(&e.alloc_resp)
            .ok()
            .and_then(|raw| ContainerAllocateResponse::decode(raw.as_slice()).ok())
            .ok_or_else(|| CheckpointError::AllocResp {
                path: path.to_path_buf(),
                pod_uid: e.pod_uid.clone(),
                container: e.container_name.clone(),
            })?;
        entries.push(Entry {
            device_ids: e.device_ids.into_values().flatten().collect(),
            pod_uid: e.pod_uid,
            container: e.container_name,
            resource: e.resource_name,
            response,
        });
    }
    Ok(Checkpoint { entries, registered: file.data.registered_devices })
}

/// Reads the checkpoint in `dir`; none yet is an empty one.
pub fn load(dir: &Path) -> Result<Checkpoint, CheckpointError> {
    let path = dir.join(FILE_NAME);
    match std::fs::read(&path) {
        Ok(bytes) => decode(&path, &bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Checkpoint::default()),
        Err(source) => Err(CheckpointError::Read { path, source }),
    }
}

/// Writes the checkpoint in `dir` atomically (a temporary file renamed over it).
pub fn save(dir: &Path, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
    let path = dir.join(FILE_NAME);
    let tmp = dir.join(format!(".{FILE_NAME}.tmp"));
    let write = |source| CheckpointError::Write { path: path.clone(), source };
    std::fs::write(&tmp, encode(checkpoint)).map_err(write)?;
    std::fs::rename(&tmp, &path).map_err(write)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::api::deviceplugin::{DeviceSpec, Mount};

    fn checkpoint() -> Checkpoint {
        Checkpoint {
            entries: vec![Entry {
                pod_uid: "uid-1".into(),
                container: "app".into(),
                resource: "example.com/gpu".into(),
                device_ids: vec!["gpu-0".into(), "gpu-1".into()],
                response: ContainerAllocateResponse {
                    envs: HashMap::from([("GPUS".into(), "gpu-0,gpu-1".into())]),
                    mounts: vec![Mount {
                        container_path: "/dev/gpu0".into(),
                        host_path: "/tmp/gpu0".into(),
                        read_only: true,
                    }],
                    devices: vec![DeviceSpec {
                        container_path: "/dev/x".into(),
                        host_path: "/dev/null".into(),
                        permissions: "rw".into(),
                    }],
                    ..Default::default()
                },
            }],
            registered: BTreeMap::from([(
                "example.com/gpu".into(),
                vec!["gpu-0".into(), "gpu-1".into(), "gpu-2".into()],
            )]),
        }
    }

    #[test]
    fn a_checkpoint_round_trips_in_upstreams_layout() {
        let bytes = encode(&checkpoint());
        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let entry = &json["Data"]["PodDeviceEntries"][0];
        assert_eq!(entry["PodUID"], "uid-1");
        assert_eq!(entry["ContainerName"], "app");
        assert_eq!(entry["ResourceName"], "example.com/gpu");
        assert_eq!(entry["DeviceIDs"]["-1"], serde_json::json!(["gpu-0", "gpu-1"]));
        assert!(entry["AllocResp"].is_string());
        assert_eq!(json["Data"]["RegisteredDevices"]["example.com/gpu"].as_array().unwrap().len(), 3);
        assert!(json["Checksum"].is_u64());
        assert_eq!(decode(Path::new("cp"), &bytes).unwrap(), checkpoint());
    }

    #[test]
    fn a_changed_checkpoint_fails_its_checksum() {
        let text = String::from_utf8(encode(&checkpoint())).unwrap().replace("gpu-2", "gpu-9");
        let err = decode(Path::new("/x/cp"), text.as_bytes()).unwrap_err();
        assert!(matches!(err, CheckpointError::Checksum { .. }), "{err}");
        assert!(err.to_string().contains("/x/cp"));
    }

    #[test]
    fn save_and_load_use_the_file_in_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), Checkpoint::default());
        save(dir.path(), &checkpoint()).unwrap();
        assert!(dir.path().join(FILE_NAME).exists());
        assert_eq!(load(dir.path()).unwrap(), checkpoint());
    }
}
