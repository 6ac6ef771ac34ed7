//! The pure core: what should happen to a pod, given its spec and what the runtime reports.
//!
//! Architecture invariant: no I/O, no async runtime, no API client and no CRI types; inputs
//! and outputs are plain values (pod specs, what was observed, the current time), so every
//! rule here is tested without a runtime.
//!
//! Nothing in this module does I/O. Time is passed in as nanoseconds since the Unix epoch, the
//! unit CRI uses for its timestamps, so every decision can be tested with plain values.

pub mod backoff;
pub mod claim;
pub mod eviction;
pub mod gc;
pub mod observed;
pub mod plan;
pub mod probe;
pub mod qos;
pub mod recursive_read_only;
pub mod requests;
pub mod resize;
pub mod resources;
pub mod shutdown;
pub mod start_failure;
pub mod status;
pub mod sysctl;
pub mod termination;

pub use observed::{ContainerInfo, ContainerState, LinuxUser, ObservedPod, SandboxInfo};

/// Nanoseconds since the Unix epoch.
pub type Nanos = i64;

/// Seconds to nanoseconds.
pub const SECOND: Nanos = 1_000_000_000;
