//! One hook through which every CRI call is reported (operation, duration, success), so the
//! agent can count and time runtime operations without this crate knowing about metrics.

use std::sync::OnceLock;
use std::time::Duration;

/// Called after every CRI call with the RPC name (`ListContainers`), its duration and whether
/// it succeeded.
pub type CallObserver = fn(op: &'static str, elapsed: Duration, ok: bool);

static OBSERVER: OnceLock<CallObserver> = OnceLock::new();

/// Installs the observer; the first one installed stays.
pub fn set_call_observer(f: CallObserver) {
    let _ = OBSERVER.set(f);
}

pub(crate) fn observe(op: &'static str, elapsed: Duration, ok: bool) {
    if let Some(f) = OBSERVER.get() {
        f(op, elapsed, ok);
    }
}
