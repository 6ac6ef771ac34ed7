//! The edge to the container runtime: turns the core's decisions into CRI calls and the
//! runtime's answers back into [`gantry_pod::ObservedPod`]s.

mod atomic_writer;
pub mod cgroups;
pub mod config;
pub mod csi;
mod dns;
mod downward;
mod driver;
mod env;
pub mod handlers;
pub mod hooks;
mod hosts;
pub mod http_get;
pub mod observe;
pub mod projection;
mod security;
mod service_env;
mod start_slots;
pub mod systemd;
pub mod termination;
mod volumes;

pub use driver::{Driver, StartError, Started};
pub use observe::{Observer, Snapshot};
