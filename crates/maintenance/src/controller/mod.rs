//! The NodeMaintenance controller (`gantry maintenance-controller`): kube-runtime's
//! `Controller` over NodeMaintenance objects, with reflectors for Nodes, Pods and
//! PodDisruptionBudgets whose every change re-runs all maintenances, so a drain moves on as
//! soon as a pod is gone or a PDB allows a disruption again, not on a timer.
//!
//! Each reconcile takes a snapshot, asks the pure [`crate::decide::decide`] what to do and
//! applies it ([`apply`]). Everything needed to continue lives in the object's status, so a
//! restarted controller carries on where the previous one stopped.

mod apply;

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client, Resource};

use crate::api::NodeMaintenance;
use crate::decide::decide;
use crate::plan::Cluster;

/// How often a running drain is looked at again when nothing in the cluster changes.
const DRAIN_RECHECK: Duration = Duration::from_secs(10);
/// Retry delay after a failed reconcile (API errors, conflicts).
const ERROR_RETRY: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("API request failed: {0}")]
    Api(#[from] kube::Error),
    #[error("cannot encode a patch: {0}")]
    Encode(#[from] serde_json::Error),
}

pub(crate) struct Context {
    pub client: Client,
    pub recorder: Recorder,
    nodes: Store<Node>,
    pods: Store<Pod>,
    pdbs: Store<PodDisruptionBudget>,
    maintenances: Store<NodeMaintenance>,
}

/// A client suitable for the controller: no automatic retries, because a refused eviction
/// (429) must come back to the controller at once, to be reported and retried on the next
/// PDB change, rather than being retried blindly inside the client.
pub fn client_config(mut config: kube::Config) -> kube::Config {
    config.default_retry = false;
    config
}

/// Runs the controller until the process is asked to stop.
pub async fn run(client: Client) {
    let (nodes, node_events) = reflect(Api::<Node>::all(client.clone()));
    let (pods, pod_events) = reflect(Api::<Pod>::all(client.clone()));
    let (pdbs, pdb_events) = reflect(Api::<PodDisruptionBudget>::all(client.clone()));
    let changes = stream::select(stream::select(node_events, pod_events), pdb_events);

    let controller = Controller::new(Api::<NodeMaintenance>::all(client.clone()), watcher::Config::default())
        .reconcile_all_on(changes)
        .shutdown_on_signal();
    let _ = futures::join!(nodes.wait_until_ready(), pods.wait_until_ready(), pdbs.wait_until_ready());
    let reporter = Reporter { controller: "gantry-maintenance-controller".into(), instance: None };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        nodes,
        pods,
        pdbs,
        maintenances: controller.store(),
    });
    tracing::info!("maintenance controller running");
    controller
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile did not complete");
            }
        })
        .await;
}

/// A reflector driven by its own task (so its store fills before the controller starts);
/// the returned stream yields `()` after changes, coalesced: one pending trigger is enough
/// because every trigger re-runs all maintenances against the latest stores.
fn reflect<K>(api: Api<K>) -> (Store<K>, impl futures::Stream<Item = ()> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let (mut tx, rx) = futures::channel::mpsc::channel(1);
    let events = reflector::reflector(writer, watcher::watcher(api, watcher::Config::default())).default_backoff();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            if let Err(e) = event {
                tracing::warn!(error = %e, "watch failed; retrying");
                continue;
            }
            if tx.try_send(()).is_err_and(|e| e.is_disconnected()) {
                return;
            }
        }
    });
    (store, rx)
}

fn snapshot<K: Clone>(store: &Store<K>) -> Vec<K>
where
    K: Resource<DynamicType = ()> + 'static,
{
    store.state().iter().map(|o| (**o).clone()).collect()
}

async fn reconcile(m: Arc<NodeMaintenance>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    let (nodes, pods, pdbs) = (snapshot(&ctx.nodes), snapshot(&ctx.pods), snapshot(&ctx.pdbs));
    let maintenances = snapshot(&ctx.maintenances);
    let cluster = Cluster { nodes: &nodes, pods: &pods, pdbs: &pdbs, maintenances: &maintenances };
    let decision = decide(&m, cluster, Timestamp::now());
    let requeue = decision.requeue;
    apply::apply(&ctx, &m, &nodes, decision).await?;
    Ok(if requeue { Action::requeue(DRAIN_RECHECK) } else { Action::await_change() })
}

fn error_policy(m: Arc<NodeMaintenance>, error: &ControllerError, _: Arc<Context>) -> Action {
    let name = m.metadata.name.as_deref().unwrap_or_default();
    tracing::warn!(maintenance = name, error = %error, "reconcile failed; retrying");
    Action::requeue(ERROR_RETRY)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::rbac::v1::ClusterRole;

    /// What the controller calls, as (API group, resource, verb); `deploy/controller.yaml` must
    /// grant exactly these.
    const CALLS: &[(&str, &str, &str)] = &[
        ("maintenance.gantry.dev", "nodemaintenances", "get"),
        ("maintenance.gantry.dev", "nodemaintenances", "list"),
        ("maintenance.gantry.dev", "nodemaintenances", "watch"),
        ("maintenance.gantry.dev", "nodemaintenances", "patch"),
        ("maintenance.gantry.dev", "nodemaintenances/status", "patch"),
        ("", "nodes", "get"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("", "nodes", "patch"),
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods/eviction", "create"),
        ("policy", "poddisruptionbudgets", "get"),
        ("policy", "poddisruptionbudgets", "list"),
        ("policy", "poddisruptionbudgets", "watch"),
        ("events.k8s.io", "events", "create"),
        ("events.k8s.io", "events", "patch"),
    ];

    #[test]
    fn deployed_cluster_role_grants_exactly_what_the_controller_calls() {
        let manifests = include_str!("../../../../deploy/controller.yaml");
        let role: ClusterRole = manifests
            .split("\n---\n")
            .find(|doc| doc.contains("kind: ClusterRole\n"))
            .map(|doc| serde_yaml_ng::from_str(doc).expect("the ClusterRole parses"))
            .expect("a ClusterRole");
        let mut granted: Vec<(String, String, String)> = Vec::new();
        for rule in role.rules.unwrap_or_default() {
            for group in rule.api_groups.unwrap_or_default() {
                for resource in rule.resources.clone().unwrap_or_default() {
                    for verb in &rule.verbs {
                        granted.push((group.clone(), resource.clone(), verb.clone()));
                    }
                }
            }
        }
        let mut wanted: Vec<(String, String, String)> =
            CALLS.iter().map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string())).collect();
        granted.sort();
        wanted.sort();
        assert_eq!(granted, wanted);
    }
}
