//! The edge to the container runtime: turns the core's decisions into CRI calls and the
//! runtime's answers back into [`crate::pod::ObservedPod`]s.

pub mod config;
pub mod labels;
pub mod observe;
mod driver;
mod volumes;

pub use driver::{Driver, StartError, Started};
pub use observe::{Observer, Snapshot};
