//! Gantry's node agent: the orchestration between pod sources, the pure pod core
//! (`gantry-pod`), the CRI runtime (`gantry-cri`) and, in cluster mode, the API server.
//!
//! Top-level modules, lowest first (each uses only those above it; a test checks that the
//! module graph has no cycle):
//! - `clock`: the wall clock as tokio's clock sees it (virtual under a test's paused clock);
//! - `events`: pod and node events (log lines, and Events in the API server);
//! - `status_store`: the latest status of every pod, and `<root-dir>/pods.json`;
//! - `api`: the API client from a kubeconfig;
//! - `source`: where desired pods come from (manifest folder, URL; merge);
//! - `cluster`: the API server's side of pods (bound pods, mirrors, status, objects pods refer to);
//! - `image`: pulls, pull secrets, image GC;
//! - `runtime`: pod spec → CRI calls (the driver), volumes, probes' actions, hooks;
//! - `system_containers`: the agent and the node's processes in `kubeletCgroups`/`systemCgroups`;
//! - `node`: Node registration, status, Lease;
//! - `agent`: the agent loop and one worker per pod;
//! - `shutdown`: graceful node shutdown (logind inhibitor lock, pods stopped by priority).

pub mod agent;
pub mod api;
mod clock;
pub mod cluster;
pub mod events;
pub mod eviction;
pub mod image;
pub mod node;
pub mod runtime;
pub mod shutdown;
pub mod source;
pub mod status_store;
pub mod system_containers;
