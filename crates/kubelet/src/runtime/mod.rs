//! The edge to the container runtime: turns the core's decisions into CRI calls and the
//! runtime's answers back into [`crate::pod::ObservedPod`]s.

pub mod config;
mod driver;
pub mod labels;
pub mod observe;
mod volumes;

pub use driver::{Driver, StartError, Started};
pub use observe::{Observer, Snapshot};
