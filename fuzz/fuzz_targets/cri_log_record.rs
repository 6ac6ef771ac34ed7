#![no_main]
//! A line of a CRI container log file (`<time> <stream> <tag> <content>`).

use libfuzzer_sys::fuzz_target;
use gantry_logs::format::parse;

fuzz_target!(|line: &[u8]| {
    let _ = parse(line);
});
