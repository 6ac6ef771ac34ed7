#![no_main]
//! A kubeconfig file, as the agent and the plugin read it.

use libfuzzer_sys::fuzz_target;
use kube::config::Kubeconfig;

fuzz_target!(|text: &str| {
    if let Ok(config) = Kubeconfig::from_yaml(text) {
        let _ = serde_json::to_string(&config);
    }
});
