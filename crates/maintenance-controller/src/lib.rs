//! The NodeMaintenance controller (`gantry maintenance-controller`): kube-runtime's
//! `Controller` over NodeMaintenance objects, with reflectors for Nodes, Pods and
//! PodDisruptionBudgets whose every change re-runs all maintenances, so a drain moves on as
//! soon as a pod is gone or a PDB allows a disruption again, not on a timer.
//!
//! Each reconcile takes a snapshot, asks the pure [`gantry_maintenance::decide::decide`] what to do and
//! applies it ([`apply`]). Everything needed to continue lives in the object's status, so a
//! restarted controller carries on where the previous one stopped. Only the replica holding
//! the Lease ([`election`]) runs the `Controller`; every replica keeps its caches warm and
//! serves metrics and health checks ([`serve`]). The watch loops and the metrics server run
//! under one supervisor for the controller's lifetime: one that ends or panics stops it.

mod apply;
pub mod election;
pub mod metrics;
pub mod serve;

use std::collections::HashSet;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt, stream};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};

pub use election::{LeaderElection, LostLease};
use gantry_maintenance::api::NodeMaintenance;
use gantry_maintenance::decide::decide;
use gantry_maintenance::plan::Cluster;
use gantry_supervisor::{Supervisor, TaskFault};
use metrics::Metrics;

/// How often a running drain is looked at again when nothing in the cluster changes.
const DRAIN_RECHECK: Duration = Duration::from_secs(10);
/// Retry delay after a failed reconcile (API errors, conflicts).
const ERROR_RETRY: Duration = Duration::from_secs(2);
/// How often one reconcile re-reads its object after a write conflict before giving up to
/// the error retry.
const CONFLICT_ATTEMPTS: usize = 3;

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("API request failed: {0}")]
    Api(#[from] kube::Error),
    #[error("cannot encode a patch: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Why the controller stopped other than by a clean shutdown.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot serve metrics on {0}: {1}")]
    Metrics(SocketAddr, std::io::Error),
    #[error(transparent)]
    LostLease(#[from] LostLease),
    #[error(transparent)]
    Task(#[from] TaskFault),
}

/// How to run: with or without leader election, and where to serve metrics.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub leader_election: Option<LeaderElection>,
    pub metrics_address: Option<SocketAddr>,
    /// Names this replica in events (`reportingInstance`).
    pub instance: Option<String>,
}

pub(crate) struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    nodes: Store<Node>,
    pods: Store<Pod>,
    pdbs: Store<PodDisruptionBudget>,
    maintenances: Store<NodeMaintenance>,
    /// UIDs of pods whose eviction this process saw accepted: the pod watch may not show
    /// their deletion yet, and evicting them again would be a needless request (and, with
    /// a PDB, could consume a second disruption).
    evicted: Mutex<HashSet<String>>,
}

/// A client suitable for the controller: no automatic retries, because a refused eviction
/// (429) must come back to the controller at once, to be reported and retried on the next
/// PDB change, rather than being retried blindly inside the client.
pub fn client_config(mut config: kube::Config) -> kube::Config {
    config.default_retry = false;
    config
}

type Stop = Shared<BoxFuture<'static, ()>>;

/// SIGTERM or SIGINT.
fn shutdown_signal() -> Stop {
    async {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("shutdown requested");
    }
    .boxed()
    .shared()
}

/// Runs the controller until the process is asked to stop (then `Ok`, with the Lease
/// released), until this replica loses the Lease (then `Err`: the caller must exit at
/// once, and the Deployment restarts it as a candidate), or until one of its loops (a watch,
/// the metrics server) ends or panics, which stops the others (the supervisor's rule).
pub async fn run(client: Client, options: Options) -> Result<(), RunError> {
    let stop = shutdown_signal();
    let metrics = Arc::new(Metrics::new());
    let endpoint = serve::Endpoint::new(metrics.clone());
    let mut supervisor = Supervisor::default();
    if let Some(address) = options.metrics_address {
        let (_, serving) = serve::bind(address, endpoint.clone()).await.map_err(|e| RunError::Metrics(address, e))?;
        supervisor.spawn("metrics-server", serving);
    }
    // Caches first, on every replica, so a new leader acts at once with a full picture.
    let (nodes, node_events, node_watch) = reflect(Api::<Node>::all(client.clone()));
    let (pods, pod_events, pod_watch) = reflect(Api::<Pod>::all(client.clone()));
    let (pdbs, pdb_events, pdb_watch) = reflect(Api::<PodDisruptionBudget>::all(client.clone()));
    supervisor.spawn("node-watch", node_watch);
    supervisor.spawn("pod-watch", pod_watch);
    supervisor.spawn("pdb-watch", pdb_watch);
    let changes = stream::select(stream::select(node_events, pod_events), pdb_events);
    let caches = Caches { nodes, pods, pdbs, changes };

    let mut outcome = Ok(());
    let control = async { outcome = control(client, options, metrics, endpoint, caches, stop).await };
    if let Err(fault) = supervisor.run(control).await {
        tracing::error!(error = %fault, "stopping the maintenance controller");
        return Err(fault.into());
    }
    outcome
}

/// The reflectors' stores and their coalesced change triggers.
struct Caches<S> {
    nodes: Store<Node>,
    pods: Store<Pod>,
    pdbs: Store<PodDisruptionBudget>,
    changes: S,
}

/// Waits for the caches, then for the Lease if leader election is on, and reconciles until
/// `stop` or the Lease is lost.
async fn control<S>(
    client: Client,
    options: Options,
    metrics: Arc<Metrics>,
    endpoint: Arc<serve::Endpoint>,
    caches: Caches<S>,
    stop: Stop,
) -> Result<(), RunError>
where
    S: futures::Stream<Item = ()> + Send + 'static,
{
    let Caches { nodes, pods, pdbs, changes } = caches;
    let _ = futures::join!(nodes.wait_until_ready(), pods.wait_until_ready(), pdbs.wait_until_ready());
    endpoint.ready.store(true, Ordering::Relaxed);

    let mut elector = options.leader_election.map(|config| election::Elector::new(client.clone(), config));
    if let Some(elector) = &mut elector {
        tokio::select! {
            _ = elector.acquire() => {}
            _ = stop.clone() => return Ok(()),
        }
    }

    let controller = Controller::new(Api::<NodeMaintenance>::all(client.clone()), watcher::Config::default())
        .reconcile_all_on(changes)
        .graceful_shutdown_on(stop.clone());
    let reporter = Reporter { controller: "gantry-maintenance-controller".into(), instance: options.instance };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        metrics,
        nodes,
        pods,
        pdbs,
        maintenances: controller.store(),
        evicted: Mutex::new(HashSet::new()),
    });
    tracing::info!("maintenance controller running");
    let running = controller.run(reconcile, error_policy, ctx).for_each(|result| async move {
        if let Err(e) = result {
            tracing::debug!(error = %e, "reconcile did not complete");
        }
    });
    let Some(elector) = &mut elector else {
        running.await;
        return Ok(());
    };
    tokio::select! {
        _ = running => {
            elector.release().await;
            Ok(())
        }
        lost = elector.renew_until_lost() => {
            tracing::error!(error = %lost, "stopping: another replica may be acting now");
            Err(lost.into())
        }
    }
}

/// A reflector and the watch loop that drives it (for the caller's supervisor, so its store
/// fills before the controller starts); the returned stream yields `()` after changes,
/// coalesced: one pending trigger is enough because every trigger re-runs all maintenances
/// against the latest stores. The loop keeps the store current whether or not anyone listens.
fn reflect<K>(
    api: Api<K>,
) -> (Store<K>, impl futures::Stream<Item = ()> + Send + 'static, impl Future<Output = ()> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let (mut tx, rx) = futures::channel::mpsc::channel(1);
    let events = reflector::reflector(writer, watcher::watcher(api, watcher::Config::default())).default_backoff();
    let watch = async move {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            if let Err(e) = event {
                tracing::warn!(error = %e, "watch failed; retrying");
                continue;
            }
            // Full: a trigger is pending already. Closed: the controller has stopped.
            let _ = tx.try_send(());
        }
    };
    (store, rx, watch)
}

fn snapshot<K>(store: &Store<K>) -> Vec<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store.state().iter().map(|o| (**o).clone()).collect()
}

/// Decides and applies. The object handed in may lag our own last write (the watch has not
/// delivered it yet); the status write carries its resourceVersion, so a stale decision
/// fails with a conflict and is made again from a fresh read, instead of, say, recording
/// the controller's own cordon as the node's state before the maintenance.
async fn reconcile(m: Arc<NodeMaintenance>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    let mut m = (*m).clone();
    let api: Api<NodeMaintenance> = Api::all(ctx.client.clone());
    let mut attempt = 1;
    loop {
        let (nodes, pods, pdbs) = (snapshot(&ctx.nodes), snapshot(&ctx.pods), snapshot(&ctx.pdbs));
        let mut maintenances = snapshot(&ctx.maintenances);
        // Our own object as we read it, not as the store may still have it.
        maintenances.retain(|o| o.name_any() != m.name_any());
        maintenances.push(m.clone());
        forget_gone_evictions(&ctx, &pods);
        let cluster = Cluster { nodes: &nodes, pods: &pods, pdbs: &pdbs, maintenances: &maintenances };
        let decision = decide(&m, cluster, Timestamp::now());
        let requeue = decision.requeue;
        match apply::apply(&ctx, &m, &nodes, &pods, &pdbs, decision).await {
            Ok(()) => {
                ctx.metrics.observe_maintenances(&snapshot(&ctx.maintenances));
                return Ok(if requeue { Action::requeue(DRAIN_RECHECK) } else { Action::await_change() });
            }
            Err(ControllerError::Api(kube::Error::Api(e))) if e.code == 409 && attempt < CONFLICT_ATTEMPTS => {
                tracing::debug!(maintenance = %m.name_any(), "stale object; deciding again from a fresh read");
                attempt += 1;
                match api.get_opt(&m.name_any()).await? {
                    Some(fresh) => m = fresh,
                    None => return Ok(Action::await_change()),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Keeps the accepted-eviction memory to pods that still exist.
fn forget_gone_evictions(ctx: &Context, pods: &[Pod]) {
    let live: HashSet<&str> = pods.iter().filter_map(|p| p.metadata.uid.as_deref()).collect();
    ctx.evicted.lock().unwrap_or_else(|p| p.into_inner()).retain(|uid| live.contains(uid.as_str()));
}

fn error_policy(m: Arc<NodeMaintenance>, error: &ControllerError, _: Arc<Context>) -> Action {
    let name = m.metadata.name.as_deref().unwrap_or_default();
    tracing::warn!(maintenance = name, error = %error, "reconcile failed; retrying");
    Action::requeue(ERROR_RETRY)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};

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
        ("", "nodes/status", "patch"),
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

    /// What the controller calls in its own namespace (leader election).
    const NAMESPACED_CALLS: &[(&str, &str, &str)] = &[
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "update"),
    ];

    fn document<T: serde::de::DeserializeOwned>(marker: &str) -> T {
        let manifests = include_str!("../../../deploy/controller.yaml");
        manifests
            .split("\n---\n")
            .find(|doc| doc.contains(marker))
            .map(|doc| serde_yaml_ng::from_str(doc).expect("the document parses"))
            .unwrap_or_else(|| panic!("a document with {marker:?}"))
    }

    fn granted(rules: Vec<PolicyRule>) -> Vec<(String, String, String)> {
        let mut granted: Vec<(String, String, String)> = Vec::new();
        for rule in rules {
            for group in rule.api_groups.unwrap_or_default() {
                for resource in rule.resources.clone().unwrap_or_default() {
                    for verb in &rule.verbs {
                        granted.push((group.clone(), resource.clone(), verb.clone()));
                    }
                }
            }
        }
        granted.sort();
        granted
    }

    fn wanted(calls: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
        let mut wanted: Vec<(String, String, String)> =
            calls.iter().map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string())).collect();
        wanted.sort();
        wanted
    }

    #[test]
    fn deployed_cluster_role_grants_exactly_what_the_controller_calls() {
        let role: ClusterRole = document("kind: ClusterRole\n");
        assert_eq!(granted(role.rules.unwrap_or_default()), wanted(CALLS));
    }

    #[test]
    fn deployed_role_grants_exactly_the_lease_calls_in_the_controller_namespace() {
        let role: Role = document("kind: Role\nmetadata");
        let deployment: Deployment = document("kind: Deployment\n");
        assert_eq!(role.metadata.namespace, deployment.metadata.namespace, "the Lease lives in the pod's namespace");
        assert_eq!(granted(role.rules.unwrap_or_default()), wanted(NAMESPACED_CALLS));
        assert_eq!(deployment.spec.and_then(|s| s.replicas), Some(2), "two replicas, one leader");
    }
}
