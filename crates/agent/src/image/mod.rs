//! The node's image lifecycle through the CRI image service.
//!
//! * [`gc`]: which images garbage collection removes (pure).
//! * [`node_images`]: the Node's `status.images` (pure).
//! * [`collector`]: the periodic garbage collection pass against CRI (edge).
//! * [`credentials`]: pull secrets → registry credentials for an image (pure).
//! * [`pull_backoff`]: backoff after failed pulls, per pod and image (pure).
//! * [`limiter`]: the node-wide limit on concurrent pulls.
//! * [`puller`]: pull policy, secrets, backoff, limit and events around CRI `PullImage` (edge).

pub mod collector;
pub mod credentials;
pub mod gc;
pub mod limiter;
pub mod node_images;
pub mod pull_backoff;
pub mod puller;
