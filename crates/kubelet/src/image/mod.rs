//! The node's image lifecycle through the CRI image service.
//!
//! * [`gc`]: which images garbage collection removes (pure).
//! * [`node_images`]: the Node's `status.images` (pure).
//! * [`collector`]: the periodic garbage collection pass against CRI (edge).

pub mod collector;
pub mod gc;
pub mod node_images;
