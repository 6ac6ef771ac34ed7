#![no_main]
//! A KubeletConfiguration file (YAML or JSON), resolved into settings with no flags.

use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;

use gantry_config::{Flags, resolve};

fuzz_target!(|text: &str| {
    let flags = Flags::parse_args::<&str>(&[]).expect("no flags parse");
    let _ = resolve(flags, Some((PathBuf::from("/var/lib/kubelet/config.yaml"), text)), "node-1");
});
