#![no_main]
//! A NodeMaintenance object (JSON), decided on against a one-node cluster and rendered as
//! the plugin shows it.

use libfuzzer_sys::fuzz_target;
use gantry_maintenance::api::NodeMaintenance;
use gantry_maintenance::cli::table;
use gantry_maintenance::plan::Cluster;
use k8s_openapi::api::core::v1::Node;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = serde_json::from_slice::<NodeMaintenance>(data) else { return };
    let node: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": "node-1", "labels": {"pool": "a"}}})).unwrap();
    let nodes = [node];
    let cluster = Cluster { nodes: &nodes, pods: &[], pdbs: &[], maintenances: std::slice::from_ref(&m) };
    let _ = gantry_maintenance::decide::decide(&m, cluster, jiff::Timestamp::UNIX_EPOCH);
    let _ = table::status(&m);
});
