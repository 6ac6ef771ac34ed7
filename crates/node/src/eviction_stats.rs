//! The eviction manager's stats: the node API's summary, as upstream's eviction manager reads
//! its summary provider (`makeSignalObservations`): the node's part every pass, the pods' part
//! only for the pods a pass asks about.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use gantry_agent::eviction::{Stats, StatsSource};
use gantry_cri::{CriError, api};
use gantry_pod::eviction::{ContainerUsage, Observation, Observations, PodUsage, Signal, VolumeUsage};
use gantry_server::ServerState;
use gantry_server::stats::Summary;
use gantry_server::stats::types::{FsStats, MemoryStats};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

pub struct SummaryStats {
    pub state: ServerState,
}

impl StatsSource for SummaryStats {
    async fn node(&self) -> Result<Stats, CriError> {
        let summary = gantry_server::stats::http::collect_for(&self.state, Vec::new()).await?;
        let info = self.state.cri().images.image_fs_info(api::ImageFsInfoRequest::default()).await?;
        let image_mount =
            info.image_filesystems.iter().find_map(|fs| fs.fs_id.as_ref().map(|id| id.mountpoint.clone()));
        let dedicated_imagefs = image_mount.is_some_and(|m| !same_device(self.state.root_dir(), Path::new(&m)));
        Ok(Stats { observations: observations(&summary), dedicated_imagefs })
    }

    async fn usage(&self, pods: &[Pod]) -> Result<gantry_pod::eviction::Usage, CriError> {
        let pods = pods.iter().map(|p| gantry_server::RunningPod::new(p.clone())).collect();
        Ok(usage(&gantry_server::stats::http::collect_for(&self.state, pods).await?))
    }
}

/// Whether two paths are on one file system (upstream compares the devices too).
fn same_device(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev(),
        _ => true,
    }
}

fn at(time: &str) -> Option<Timestamp> {
    time.parse().ok()
}

/// `available` of `available + working set` (upstream's memory observations).
fn memory(m: &MemoryStats) -> Option<Observation> {
    let available = m.available_bytes?;
    let capacity = available + m.working_set_bytes?;
    Some(Observation { available: available.into(), capacity: capacity.into(), time: at(&m.time)? })
}

fn bytes(fs: &FsStats) -> Option<Observation> {
    Some(Observation {
        available: fs.available_bytes?.into(),
        capacity: fs.capacity_bytes?.into(),
        time: at(&fs.time)?,
    })
}

fn inodes(fs: &FsStats) -> Option<Observation> {
    Some(Observation { available: fs.inodes_free?.into(), capacity: fs.inodes?.into(), time: at(&fs.time)? })
}

/// The signals the summary shows (a signal it lacks is not observed, so never met).
pub fn observations(summary: &Summary) -> Observations {
    let node = &summary.node;
    let pods_container = node.system_containers.iter().find(|c| c.name == "pods");
    let image_fs = node.runtime.as_ref().and_then(|r| r.image_fs.as_ref());
    let pids = node.rlimit.as_ref().and_then(|r| {
        let (max, current) = (r.maxpid?, r.curproc?);
        Some(Observation { available: (max - current).into(), capacity: max.into(), time: at(&r.time)? })
    });
    [
        (Signal::MemoryAvailable, node.memory.as_ref().and_then(memory)),
        (Signal::AllocatableMemoryAvailable, pods_container.and_then(|c| c.memory.as_ref()).and_then(memory)),
        (Signal::NodeFsAvailable, node.fs.as_ref().and_then(bytes)),
        (Signal::NodeFsInodesFree, node.fs.as_ref().and_then(inodes)),
        (Signal::ImageFsAvailable, image_fs.and_then(bytes)),
        (Signal::ImageFsInodesFree, image_fs.and_then(inodes)),
        (Signal::PidAvailable, pids),
    ]
    .into_iter()
    .filter_map(|(signal, o)| Some((signal, o?)))
    .collect()
}

/// Each pod's usage by UID.
pub fn usage(summary: &Summary) -> gantry_pod::eviction::Usage {
    let used = |fs: Option<&FsStats>| (fs.and_then(|f| f.used_bytes), fs.and_then(|f| f.inodes_used));
    summary
        .pods
        .iter()
        .map(|p| {
            let containers = p
                .containers
                .iter()
                .map(|c| {
                    let (rootfs_bytes, rootfs_inodes) = used(c.rootfs.as_ref());
                    let (logs_bytes, logs_inodes) = used(c.logs.as_ref());
                    ContainerUsage {
                        name: c.name.clone(),
                        memory_working_set: c.memory.as_ref().and_then(|m| m.working_set_bytes),
                        rootfs_bytes,
                        rootfs_inodes,
                        logs_bytes,
                        logs_inodes,
                    }
                })
                .collect();
            let volumes = p
                .volume
                .iter()
                .map(|v| VolumeUsage { name: v.name.clone(), bytes: v.fs.used_bytes, inodes: v.fs.inodes_used })
                .collect();
            let usage = PodUsage {
                containers,
                volumes,
                ephemeral_bytes: p.ephemeral_storage.as_ref().and_then(|e| e.used_bytes),
                processes: p.process_stats.as_ref().and_then(|s| s.process_count),
            };
            (p.pod_ref.uid.clone(), usage)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use gantry_server::stats::types::{
        ContainerStats, NodeStats, PodReference, PodStats, RlimitStats, RuntimeStats, VolumeStats,
    };

    use super::*;

    const T: &str = "2026-11-24T12:00:00Z";

    fn fs(available: u64, capacity: u64, inodes_free: u64, inodes: u64) -> FsStats {
        FsStats {
            time: T.into(),
            available_bytes: Some(available),
            capacity_bytes: Some(capacity),
            inodes_free: Some(inodes_free),
            inodes: Some(inodes),
            ..Default::default()
        }
    }

    fn memory(available: u64, working_set: u64) -> MemoryStats {
        MemoryStats {
            time: T.into(),
            available_bytes: Some(available),
            working_set_bytes: Some(working_set),
            ..Default::default()
        }
    }

    #[test]
    fn signals_and_usage_from_the_summary() {
        let summary = Summary {
            node: NodeStats {
                memory: Some(memory(300, 700)),
                system_containers: vec![ContainerStats {
                    name: "pods".into(),
                    memory: Some(memory(100, 400)),
                    ..Default::default()
                }],
                fs: Some(fs(10, 100, 5, 50)),
                runtime: Some(RuntimeStats { image_fs: Some(fs(20, 200, 7, 70)), container_fs: None }),
                rlimit: Some(RlimitStats { time: T.into(), maxpid: Some(1000), curproc: Some(250) }),
                ..Default::default()
            },
            pods: vec![PodStats {
                pod_ref: PodReference { name: "p".into(), namespace: "default".into(), uid: "u".into() },
                containers: vec![ContainerStats {
                    name: "c".into(),
                    memory: Some(memory(0, 42)),
                    rootfs: Some(FsStats { used_bytes: Some(3), inodes_used: Some(1), ..fs(0, 0, 0, 0) }),
                    ..Default::default()
                }],
                volume: vec![VolumeStats {
                    name: "scratch".into(),
                    fs: FsStats { used_bytes: Some(9), ..fs(0, 0, 0, 0) },
                    pvc_ref: None,
                }],
                ..Default::default()
            }],
        };
        let o = observations(&summary);
        let pair = |s: Signal| (o[&s].available, o[&s].capacity);
        assert_eq!(pair(Signal::MemoryAvailable), (300, 1000), "capacity = available + working set");
        assert_eq!(pair(Signal::AllocatableMemoryAvailable), (100, 500));
        assert_eq!(pair(Signal::NodeFsAvailable), (10, 100));
        assert_eq!(pair(Signal::NodeFsInodesFree), (5, 50));
        assert_eq!(pair(Signal::ImageFsAvailable), (20, 200));
        assert_eq!(pair(Signal::ImageFsInodesFree), (7, 70));
        assert_eq!(pair(Signal::PidAvailable), (750, 1000));
        assert_eq!(o[&Signal::MemoryAvailable].time, T.parse().unwrap());
        let u = &usage(&summary)["u"];
        assert_eq!(u.containers[0].memory_working_set, Some(42));
        assert_eq!((u.containers[0].rootfs_bytes, u.containers[0].rootfs_inodes), (Some(3), Some(1)));
        assert_eq!(u.volumes[0].bytes, Some(9));
        assert!(observations(&Summary::default()).is_empty(), "no stats, no signal");
    }
}
