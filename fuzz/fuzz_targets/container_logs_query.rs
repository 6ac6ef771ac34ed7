#![no_main]
//! The query of a `/containerLogs` request (`follow`, `tailLines`, `sinceTime`, …), as
//! `&`-separated `key=value` pairs.

use libfuzzer_sys::fuzz_target;
use gantry_logs::options::LogOptions;

fuzz_target!(|query: &str| {
    let pairs = query.split('&').map(|p| p.split_once('=').unwrap_or((p, "")));
    if let Ok(options) = LogOptions::from_query(pairs) {
        let _ = options.since_timestamp(jiff::Timestamp::UNIX_EPOCH);
    }
});
