//! The `/stats/summary` JSON shape, as upstream's `stats/v1alpha1` (field names, omitted
//! empty fields).

use serde::Serialize;

#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    /// `kubelet`, `runtime`, `pods`: the agent's, the runtime's and the pods' cgroups.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub system_containers: Vec<ContainerStats>,
    pub start_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io: Option<IoStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rlimit: Option<RlimitStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap: Option<SwapStats>,
}

/// The node's task limit and task count.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RlimitStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maxpid: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub curproc: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SwapStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap_available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap_usage_bytes: Option<u64>,
}

/// Pressure stall information of one resource (the kernel's PSI file; `total` in µs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PsiStats {
    pub full: PsiData,
    pub some: PsiData,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PsiData {
    pub total: u64,
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
}

/// IO pressure (upstream's `IOStats` carries PSI only).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IoStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psi: Option<PsiStats>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ProcessStats {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process_count: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<FsStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_fs: Option<FsStats>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psi: Option<PsiStats>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major_page_faults: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psi: Option<PsiStats>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStats {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_errors: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
}

/// The default interface's counters inline, plus every interface.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NetworkStats {
    pub time: String,
    #[serde(flatten)]
    pub default: InterfaceStats,
    pub interfaces: Vec<InterfaceStats>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PodReference {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodReference,
    pub start_time: String,
    pub containers: Vec<ContainerStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io: Option<IoStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volume: Vec<VolumeStats>,
    #[serde(rename = "ephemeral-storage", skip_serializing_if = "Option::is_none")]
    pub ephemeral_storage: Option<FsStats>,
    #[serde(rename = "process_stats", skip_serializing_if = "Option::is_none")]
    pub process_stats: Option<ProcessStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap: Option<SwapStats>,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    pub start_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io: Option<IoStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logs: Option<FsStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap: Option<SwapStats>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStats {
    #[serde(flatten)]
    pub fs: FsStats,
    pub name: String,
    /// The claim behind the volume (a `persistentVolumeClaim` or generic ephemeral volume).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pvc_ref: Option<PvcReference>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PvcReference {
    pub name: String,
    pub namespace: String,
}
