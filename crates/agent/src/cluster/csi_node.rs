//! The node's `CSINode` object (`storage.k8s.io/v1`) and the CSI drivers' topology labels on the
//! Node (upstream's `nodeinfomanager`): a driver that registers is added to (or updated in)
//! `CSINode.spec.drivers` with its node ID, topology keys and volume limit, and its topology
//! segments become Node labels; a driver that deregisters is removed from `CSINode` (its labels
//! stay, as upstream leaves them). Drivers registered before a restart stay in `CSINode` until
//! they deregister, so a restart does not make them flap.

use std::collections::BTreeMap;

use gantry_plugins::csi::DriverInfo;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;

use super::retry::WatchRetry;

/// How the `CSINode` should change: drivers to add or update, drivers to remove.
#[derive(Debug, Default, PartialEq)]
pub struct Change {
    pub upsert: Vec<CSINodeDriver>,
    pub remove: Vec<String>,
}

/// The change from the drivers registered before (`previous`) to now (`current`) (pure).
pub fn change(previous: &BTreeMap<String, DriverInfo>, current: &BTreeMap<String, DriverInfo>) -> Change {
    Change {
        upsert: current.values().filter(|d| previous.get(&d.name) != Some(*d)).map(entry).collect(),
        remove: previous.keys().filter(|n| !current.contains_key(*n)).cloned().collect(),
    }
}

/// A driver's `CSINode` entry (upstream `installDriverToCSINode`): topology keys sorted, the
/// volume limit only when the driver sets one.
pub fn entry(d: &DriverInfo) -> CSINodeDriver {
    CSINodeDriver {
        name: d.name.clone(),
        node_id: d.node_id.clone(),
        topology_keys: Some(d.topology.keys().cloned().collect()),
        allocatable: (d.max_volumes > 0)
            .then_some(VolumeNodeResources { count: Some(i32::try_from(d.max_volumes).unwrap_or(i32::MAX)) }),
    }
}

/// `spec.drivers` after the change, the other drivers left as they are.
pub fn apply(drivers: &[CSINodeDriver], change: &Change) -> Vec<CSINodeDriver> {
    let mut out: Vec<CSINodeDriver> = drivers
        .iter()
        .filter(|d| !change.remove.contains(&d.name) && !change.upsert.iter().any(|u| u.name == d.name))
        .cloned()
        .collect();
    out.extend(change.upsert.iter().cloned());
    out
}

/// Keeps `CSINode` `<node>` and the Node's topology labels in step with the registered
/// drivers; runs for the node's lifetime.
pub async fn run(client: Client, node: String, mut drivers: watch::Receiver<BTreeMap<String, DriverInfo>>) {
    let mut previous = BTreeMap::new();
    let mut retry = WatchRetry::default();
    loop {
        let current = drivers.borrow_and_update().clone();
        let change = change(&previous, &current);
        if change != Change::default() {
            let labels: BTreeMap<String, String> = current.values().flat_map(|d| d.topology.clone()).collect();
            match sync(&client, &node, &change, &labels).await {
                Ok(()) => {
                    tracing::info!(node = %node, drivers = ?current.keys().collect::<Vec<_>>(), "CSINode updated");
                    previous = current;
                    retry.recovered();
                }
                Err(e) => {
                    // Logged once per cause, retried with backoff.
                    let failure = retry.failed(&e.to_string());
                    if failure.log {
                        tracing::warn!(node = %node, error = %e, retry_in = ?failure.retry_in, "cannot update CSINode");
                    }
                    tokio::time::sleep(failure.retry_in).await;
                    continue;
                }
            }
        }
        if drivers.changed().await.is_err() {
            // The registry lives as long as the node; without it nothing changes any more.
            std::future::pending::<()>().await;
        }
    }
}

async fn sync(client: &Client, node: &str, change: &Change, labels: &BTreeMap<String, String>) -> kube::Result<()> {
    let nodes = Api::<Node>::all(client.clone());
    if !labels.is_empty() {
        let patch = serde_json::json!({"metadata": {"labels": labels}});
        nodes.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    }
    let api = Api::<CSINode>::all(client.clone());
    match api.get_opt(node).await? {
        Some(mut existing) => {
            let drivers = existing.spec.drivers.clone();
            existing.spec.drivers = apply(&drivers, change);
            api.replace(node, &PostParams::default(), &existing).await?;
        }
        None => {
            let owner = nodes.get(node).await?;
            let csi_node = CSINode {
                metadata: ObjectMeta {
                    name: Some(node.to_string()),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: node.to_string(),
                        uid: owner.metadata.uid.unwrap_or_default(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
                spec: CSINodeSpec { drivers: apply(&[], change) },
            };
            api.create(&PostParams::default(), &csi_node).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn driver(name: &str, node_id: &str, max: i64) -> DriverInfo {
        DriverInfo {
            name: name.into(),
            endpoint: PathBuf::from("/x"),
            node_id: node_id.into(),
            max_volumes: max,
            topology: BTreeMap::from([("topology.example.com/zone".into(), "z1".into())]),
            stages: true,
            volume_stats: false,
        }
    }

    #[test]
    fn registered_drivers_are_added_and_deregistered_ones_removed() {
        let a = driver("a.example.com", "n-a", 0);
        let b = driver("b.example.com", "n-b", 16);
        let none = BTreeMap::new();
        let both = BTreeMap::from([(a.name.clone(), a.clone()), (b.name.clone(), b.clone())]);
        let added = change(&none, &both);
        assert_eq!(added.upsert.len(), 2);
        assert!(added.remove.is_empty());
        let entries = apply(&[], &added);
        assert_eq!(entries[0].node_id, "n-a");
        assert_eq!(entries[0].allocatable, None);
        assert_eq!(entries[1].allocatable, Some(VolumeNodeResources { count: Some(16) }));
        assert_eq!(entries[1].topology_keys, Some(vec!["topology.example.com/zone".to_string()]));
        let only_b = BTreeMap::from([(b.name.clone(), b.clone())]);
        let removed = change(&both, &only_b);
        assert_eq!(removed, Change { upsert: vec![], remove: vec!["a.example.com".into()] });
        assert_eq!(apply(&entries, &removed), vec![entry(&b)]);
        // Nothing changed, nothing to write; a driver registered elsewhere is kept.
        assert_eq!(change(&only_b, &only_b), Change::default());
        let other = CSINodeDriver { name: "other".into(), node_id: "o".into(), ..Default::default() };
        assert_eq!(apply(std::slice::from_ref(&other), &change(&none, &only_b)), vec![other, entry(&b)]);
    }
}
