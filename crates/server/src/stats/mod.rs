//! Node and pod statistics: `/stats/summary` (`summary`, shape in `types`), cgroup counters
//! on either hierarchy (`cgroup`), the node's own counters (`host`), CPU rates from two
//! samples (`rate`), the Prometheus text of `/metrics/resource` (`resource_metrics`), and the
//! pods' volume usage measured in the background (`volumes`).

pub mod cgroup;
pub mod host;
pub mod http;
pub mod rate;
pub mod resource_metrics;
pub mod summary;
pub mod types;
pub mod volumes;

pub use types::Summary;
