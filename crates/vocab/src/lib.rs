//! The Kubernetes vocabulary every Gantry crate shares: resource quantities, well-known keys,
//! the labels Gantry puts on CRI objects, read-only views of a pod spec with API defaults, and
//! the node's file layout.
//!
//! Architecture invariant: plain data and pure functions over `k8s-openapi` types; no I/O,
//! no async, no client. Anything two crates must agree on is defined here once.

pub mod cri_labels;
pub mod keys;
pub mod paths;
pub mod quantity;
pub mod spec;
