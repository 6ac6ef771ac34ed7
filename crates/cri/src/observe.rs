//! The hook through which every CRI call is reported (operation, duration, success), so the
//! agent can count and time runtime operations without this crate knowing about metrics. Each
//! client carries its own (set with [`crate::Cri::observed_by`]), so two nodes in one process
//! count their own calls.

use std::sync::Arc;
use std::time::Duration;

/// Called after every CRI call with the RPC name (`ListContainers`), its duration and whether
/// it succeeded.
pub type CallObserver = Arc<dyn Fn(&'static str, Duration, bool) + Send + Sync>;
