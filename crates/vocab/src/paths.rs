//! Where the node keeps a pod's files, as upstream lays them out (tools such as crictl and log
//! shippers read these paths).

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

use crate::spec;

/// Where a pod's container logs go: `<podLogsDir>/<namespace>_<name>_<uid>`.
pub fn pod_log_dir(pod_logs_dir: &Path, pod: &Pod) -> PathBuf {
    pod_logs_dir.join(format!("{}_{}_{}", spec::namespace(pod), spec::name(pod), spec::uid(pod)))
}

/// A container's log file relative to the pod log dir: `<container>/<restart>.log`.
pub fn container_log_path(container: &str, attempt: u32) -> String {
    format!("{container}/{attempt}.log")
}
