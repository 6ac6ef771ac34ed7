#![no_main]
//! Label and field selectors: the plugin's `--selector`/`--nodes` and the test API
//! server's `labelSelector`/`fieldSelector` parameters.

use libfuzzer_sys::fuzz_target;
use gantry_maintenance::cli::selector::{parse_nodes, parse_selector};
use gantry_test_apiserver::selectors::{FieldSelector, LabelSelector};

fuzz_target!(|text: &str| {
    let _ = parse_selector(text);
    let _ = parse_nodes(text);
    if let Ok(selector) = LabelSelector::parse(text) {
        let _ = selector.matches_object(&serde_json::json!({"metadata": {"labels": {"a": "b"}}}));
    }
    if let Ok(selector) = FieldSelector::parse(text) {
        let _ = selector.matches(&serde_json::json!({"metadata": {"name": "a", "namespace": "b"}}));
    }
});
