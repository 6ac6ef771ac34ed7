//! Gantry's node agent.
//!
//! `pod` is the pure core (plans, status, backoff, GC); `runtime` turns its decisions into CRI
//! calls; `source` produces the pods the node should run; `agent` ties them together;
//! `config` resolves flags and the config file. In cluster mode, `api` builds the API server
//! client and `node` registers the Node and keeps its status and lease fresh.

pub mod agent;
pub mod api;
pub mod cluster;
pub mod config;
pub mod image;
pub mod logs;
pub mod metrics;
pub mod node;
pub mod pod;
pub mod runtime;
pub mod server;
pub mod source;
pub mod stats;
