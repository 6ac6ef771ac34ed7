//! The wall clock as tokio's clock sees it.
//!
//! In production this is the system time. Under a test's paused tokio clock
//! (`tokio::time::pause`) it moves only when tokio's clock moves, so time-based decisions that
//! compare the runtime's timestamps with "now" (crash-loop and image pull backoff) follow the
//! same virtual time as the timers that wait for them.

use std::time::{SystemTime, UNIX_EPOCH};

use gantry_pod::Nanos;

/// Nanoseconds since the Unix epoch.
pub(crate) fn now() -> Nanos {
    let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as i128;
    // Zero unless tokio's clock is paused: then how far it was advanced, less the real time
    // that passed since it was paused.
    let (tokio_now, std_now) = (tokio::time::Instant::now().into_std(), std::time::Instant::now());
    let skew = match tokio_now.checked_duration_since(std_now) {
        Some(ahead) => ahead.as_nanos() as i128,
        None => -(std_now.duration_since(tokio_now).as_nanos() as i128),
    };
    (wall + skew) as Nanos
}
