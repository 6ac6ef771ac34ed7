//! Where the node keeps a pod's files, as upstream lays them out (tools such as crictl and log
//! shippers read these paths), and which paths inside a container a kubelet hides.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Pod, Volume};

use crate::spec;

/// Where a pod's container logs go: `<podLogsDir>/<namespace>_<name>_<uid>`.
pub fn pod_log_dir(pod_logs_dir: &Path, pod: &Pod) -> PathBuf {
    pod_logs_dir.join(format!("{}_{}_{}", spec::namespace(pod), spec::name(pod), spec::uid(pod)))
}

/// A container's log file relative to the pod log dir: `<container>/<restart>.log`.
pub fn container_log_path(container: &str, attempt: u32) -> String {
    format!("{container}/{attempt}.log")
}

/// A pod's directory: `<root-dir>/pods/<uid>` (volumes, `etc-hosts`, termination messages).
pub fn pod_dir(root_dir: &Path, uid: &str) -> PathBuf {
    root_dir.join("pods").join(uid)
}

/// The plugin directory a volume type lives in below `<pod-dir>/volumes/kubernetes.io~…`, for
/// the volume types the node keeps itself; None for the others (hostPath lives elsewhere).
pub fn volume_plugin(v: &Volume) -> Option<&'static str> {
    if v.empty_dir.is_some() {
        Some("empty-dir")
    } else if v.config_map.is_some() {
        Some("configmap")
    } else if v.secret.is_some() {
        Some("secret")
    } else if v.downward_api.is_some() {
        Some("downward-api")
    } else if v.projected.is_some() {
        Some("projected")
    } else {
        None
    }
}

/// Where a volume's files are: `<pod-dir>/volumes/kubernetes.io~<plugin>/<name>`.
pub fn volume_dir(root_dir: &Path, uid: &str, plugin: &str, name: &str) -> PathBuf {
    pod_dir(root_dir, uid).join("volumes").join(format!("kubernetes.io~{plugin}")).join(name)
}

/// The pod's managed hosts file in its pod directory, bind-mounted as `/etc/hosts`.
pub const ETC_HOSTS: &str = "etc-hosts";

/// The paths a container's `/proc` and `/sys` hide and make read-only, upstream's defaults
/// (`procMount: Default`): the kubelet sends them for every container that is not privileged.
pub const MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
pub const READONLY_PATHS: &[&str] = &["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"];
