#![no_main]
//! A kubelet command line (arguments separated by NUL bytes), resolved into settings.

use libfuzzer_sys::fuzz_target;
use gantry_config::{Flags, resolve};

fuzz_target!(|text: &str| {
    let args: Vec<&str> = text.split('\0').collect();
    if let Ok(flags) = Flags::parse_args(&args) {
        let _ = resolve(flags, None, "node-1");
    }
});
