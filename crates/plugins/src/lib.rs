//! The kubelet's node plugins: what a DaemonSet's plugin speaks to the node over unix sockets.
//!
//! - [`watcher`]: plugin registration (upstream's `pluginwatcher`): sockets in
//!   `<root-dir>/plugins_registry`, `GetInfo`, a handler per plugin type,
//!   `NotifyRegistrationStatus`, deregistration when the socket goes.
//! - [`devices`]: the device manager (upstream `cm/devicemanager`): device plugins registered
//!   on `<root-dir>/device-plugins/kubelet.sock` or through the watcher, their devices as node
//!   capacity, allocation at pod admission, the container options, the checkpoint.
//! - [`csi`]: CSI drivers registered through the watcher (`NodeGetInfo`, capabilities) and
//!   the node calls of a volume's life (stage, publish, unpublish, unstage).
//! - [`podresources`]: the `v1.PodResourcesLister` service on
//!   `<root-dir>/pod-resources/kubelet.sock` for monitoring agents.
//!
//! Architecture invariant: with `gantry-cri`, the only crate that speaks gRPC; what the agent
//! gets from it are plain values (device counts, allocation outcomes, the CRI mounts, devices,
//! envs and annotations to merge into a container's config).

pub mod csi;
pub mod devices;
mod dial;
pub mod podresources;
pub mod watcher;

/// The generated messages, clients and servers of the upstream interfaces in `proto/`.
#[allow(clippy::all, clippy::pedantic, unused_qualifications)]
pub mod api {
    /// `pluginregistration` (v1): the service every plugin serves in `plugins_registry`.
    pub mod registration {
        tonic::include_proto!("pluginregistration");
    }
    /// `deviceplugin/v1beta1`: the kubelet's `Registration` and the plugins' `DevicePlugin`.
    pub mod deviceplugin {
        tonic::include_proto!("v1beta1");
    }
    /// `podresources/v1`: `PodResourcesLister`.
    pub mod podresources {
        tonic::include_proto!("v1");
    }
    /// The CSI spec (`csi.v1`): the `Identity` and `Node` services a CSI driver serves.
    pub mod csi {
        tonic::include_proto!("csi.v1");
    }
}
