//! CRI v1 client for Gantry.
//!
//! Gantry talks to container runtimes only through CRI v1 (KEP-2040); this crate is the one
//! place that knows about sockets, gRPC channels and timeouts. It parses endpoints the way the
//! Go kubelet does, validates that the peer really serves `runtime.v1`, and turns transport
//! failures into errors an operator can act on (see [`CriError`]).

mod client;
mod endpoint;
mod error;
pub mod health;
mod observe;

pub use client::{Cri, ImageClient, RuntimeClient, connect};
pub use endpoint::Endpoint;
pub use error::{Code, CriError};
/// The generated CRI v1 message types, re-exported so callers need no direct `k8s-cri` dependency.
pub use k8s_cri::v1 as api;
pub use observe::{CallObserver, set_call_observer};
