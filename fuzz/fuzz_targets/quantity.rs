#![no_main]
//! A resource quantity (`100m`, `1.5Gi`, `2e3`) and a percentage threshold (`10%`).

use libfuzzer_sys::fuzz_target;
use gantry_vocab::quantity::{format_binary_bytes, format_decimal_milli, parse_milli, parse_percentage, parse_units};

fuzz_target!(|text: &str| {
    if let Ok(milli) = parse_milli(text) {
        let _ = format_decimal_milli(milli);
    }
    if let Ok(units) = parse_units(text) {
        let _ = format_binary_bytes(units);
    }
    let _ = parse_percentage(text);
});
