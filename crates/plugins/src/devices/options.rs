//! The plugins' `Allocate` answers for one container → what its CRI config gets (pure;
//! upstream `deviceRunContainerOptions`): envs, mounts, devices, annotations and CDI devices.
//! Where two resources' answers collide (the same env or annotation with another value, the
//! same container path), the first one wins and the clash is logged, as upstream.

use std::collections::BTreeMap;

use gantry_cri::api;

use crate::api::deviceplugin::ContainerAllocateResponse;

/// What the device plugins give a container.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunOptions {
    pub envs: Vec<api::KeyValue>,
    pub mounts: Vec<api::Mount>,
    pub devices: Vec<api::Device>,
    pub annotations: BTreeMap<String, String>,
    pub cdi_devices: Vec<api::CdiDevice>,
}

impl RunOptions {
    pub fn is_empty(&self) -> bool {
        *self == RunOptions::default()
    }
}

/// Merges the answers (in resource order) for a container.
pub fn merge<'a>(responses: impl IntoIterator<Item = &'a ContainerAllocateResponse>) -> RunOptions {
    let mut out = RunOptions::default();
    let mut envs: BTreeMap<String, String> = BTreeMap::new();
    for r in responses {
        for (key, value) in sorted(&r.envs) {
            match envs.get(key) {
                Some(v) if v != value => {
                    tracing::error!(env = %key, "environment variable has conflicting settings from device plugins");
                }
                Some(_) => {}
                None => {
                    envs.insert(key.clone(), value.clone());
                    out.envs.push(api::KeyValue { key: key.clone(), value: value.clone() });
                }
            }
        }
        for m in &r.mounts {
            if out.mounts.iter().any(|o| o.container_path == m.container_path) {
                tracing::error!(path = %m.container_path, "mount has conflicting settings from device plugins");
                continue;
            }
            out.mounts.push(api::Mount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                readonly: m.read_only,
                ..Default::default()
            });
        }
        for d in &r.devices {
            if out.devices.iter().any(|o| o.container_path == d.container_path) {
                tracing::error!(path = %d.container_path, "device has conflicting settings from device plugins");
                continue;
            }
            out.devices.push(api::Device {
                container_path: d.container_path.clone(),
                host_path: d.host_path.clone(),
                permissions: d.permissions.clone(),
            });
        }
        for (key, value) in sorted(&r.annotations) {
            match out.annotations.get(key) {
                Some(v) if v != value => {
                    tracing::error!(annotation = %key, "annotation has conflicting settings from device plugins");
                }
                _ => {
                    out.annotations.insert(key.clone(), value.clone());
                }
            }
        }
        for c in &r.cdi_devices {
            if !out.cdi_devices.iter().any(|o| o.name == c.name) {
                out.cdi_devices.push(api::CdiDevice { name: c.name.clone() });
            }
        }
    }
    out
}

/// A map's entries in key order, so that the container config does not depend on hashing.
fn sorted(map: &std::collections::HashMap<String, String>) -> Vec<(&String, &String)> {
    let mut v: Vec<_> = map.iter().collect();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::api::deviceplugin::{CdiDevice, DeviceSpec, Mount};

    fn response(env: (&str, &str), path: &str) -> ContainerAllocateResponse {
        ContainerAllocateResponse {
            envs: HashMap::from([(env.0.to_string(), env.1.to_string())]),
            mounts: vec![Mount { container_path: path.into(), host_path: format!("/host{path}"), read_only: true }],
            devices: vec![DeviceSpec {
                container_path: path.into(),
                host_path: "/dev/null".into(),
                permissions: "rw".into(),
            }],
            annotations: HashMap::from([("a".to_string(), env.1.to_string())]),
            cdi_devices: vec![CdiDevice { name: "vendor.com/gpu=0".into() }],
        }
    }

    #[test]
    fn answers_become_cri_envs_mounts_devices_annotations_and_cdi_devices() {
        let opts = merge([&response(("GPU", "0"), "/dev/gpu0")]);
        assert_eq!(opts.envs, vec![api::KeyValue { key: "GPU".into(), value: "0".into() }]);
        assert_eq!(opts.mounts[0].host_path, "/host/dev/gpu0");
        assert!(opts.mounts[0].readonly);
        assert_eq!(opts.devices[0].permissions, "rw");
        assert_eq!(opts.annotations["a"], "0");
        assert_eq!(opts.cdi_devices, vec![api::CdiDevice { name: "vendor.com/gpu=0".into() }]);
    }

    #[test]
    fn on_a_clash_the_first_answer_wins() {
        let opts = merge([&response(("GPU", "0"), "/dev/x"), &response(("GPU", "1"), "/dev/x")]);
        assert_eq!(opts.envs.len(), 1);
        assert_eq!(opts.envs[0].value, "0");
        assert_eq!(opts.mounts.len(), 1);
        assert_eq!(opts.devices.len(), 1);
        assert_eq!(opts.annotations["a"], "0");
        assert_eq!(opts.cdi_devices.len(), 1);
        assert!(merge([]).is_empty());
    }
}
