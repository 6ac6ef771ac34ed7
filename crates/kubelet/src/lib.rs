//! Gantry's node agent.
//!
//! `pod` is the pure core (plans, status, backoff, GC); `runtime` turns its decisions into CRI
//! calls; `source` produces the pods the node should run; `agent` ties them together;
//! `config` resolves flags and the config file.

pub mod agent;
pub mod config;
pub mod pod;
pub mod runtime;
pub mod source;
