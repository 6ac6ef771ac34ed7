//! Maintenance-aware static pods (KEP-4212's node agent side). Watches the NodeMaintenance
//! objects; those in Drain are the hold input the agent applies to its static pods
//! (`gantry_maintenance::hold` decides which).
//! The input is kept in `<root-dir>/maintenance-holds.json` so that a restarted agent holds
//! the same pods from its first moment, before the API server answers: a held pod never
//! starts briefly. A cluster without the CRD (or the RBAC) gets one warning, and another only
//! when the cause changes; the watch keeps retrying with backoff (up to 5 minutes).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use futures::StreamExt;
use gantry_maintenance::api::{DrainStatus, NodeMaintenance, NodeMaintenanceStatus, NodeStatus, Stage};
use gantry_maintenance::hold::{self, ThisNode};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use super::retry::WatchRetry;

use gantry_vocab::spec;

/// File under `--root-dir` holding the last hold input.
pub const HOLDS_FILE: &str = "maintenance-holds.json";

/// What decides which static pods are held: the maintenances that can hold any, and the
/// node's labels for their node selectors.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HoldInput {
    pub maintenances: Vec<NodeMaintenance>,
    #[serde(default)]
    pub node_labels: BTreeMap<String, String>,
    /// `namespace/name` → the priority the API server gave each static pod's mirror (Priority
    /// admission resolves custom classes the file only names), which is what the planner reads.
    #[serde(default)]
    pub mirror_priorities: BTreeMap<String, i32>,
}

/// Compared as JSON: the generated `NodeMaintenance` has no `PartialEq`.
impl PartialEq for HoldInput {
    fn eq(&self, other: &Self) -> bool {
        self.node_labels == other.node_labels
            && serde_json::to_value(&self.maintenances).ok() == serde_json::to_value(&other.maintenances).ok()
    }
}

impl HoldInput {
    /// Static pod UID → the maintenance holding it.
    pub fn held(&self, node: &str, static_pods: &[Pod]) -> BTreeMap<String, String> {
        let pods: Vec<Pod> = static_pods
            .iter()
            .map(|p| {
                let mut p = p.clone();
                if let Some(priority) = self.mirror_priorities.get(&spec::full_name(&p)) {
                    p.spec.get_or_insert_default().priority = Some(*priority);
                }
                p
            })
            .collect();
        hold::static_pods_to_hold(&self.maintenances, &ThisNode { name: node, labels: &self.node_labels }, &pods)
    }

    /// The maintenances in Drain (not being deleted), slimmed to what the decision reads, so
    /// that status churn (counts, messages) neither rewrites the file nor wakes the agent.
    fn from_maintenances<'a>(
        all: impl Iterator<Item = &'a NodeMaintenance>,
        node_labels: BTreeMap<String, String>,
    ) -> Self {
        let maintenances =
            all.filter(|m| m.spec.stage == Stage::Drain && m.metadata.deletion_timestamp.is_none()).map(slim).collect();
        HoldInput { maintenances, node_labels, mirror_priorities: BTreeMap::new() }
    }
}

fn slim(m: &NodeMaintenance) -> NodeMaintenance {
    let mut out = NodeMaintenance::new(m.metadata.name.as_deref().unwrap_or_default(), m.spec.clone());
    let status = m.status.as_ref().map(|s| NodeMaintenanceStatus {
        drain_status: DrainStatus {
            reached_drain_targets: s.drain_status.reached_drain_targets.clone(),
            ..Default::default()
        },
        node_statuses: s
            .node_statuses
            .iter()
            .map(|n| NodeStatus { node_name: n.node_name.clone(), ..Default::default() })
            .collect(),
        ..Default::default()
    });
    out.status = status;
    out
}

pub fn holds_file(root_dir: &Path) -> PathBuf {
    root_dir.join(HOLDS_FILE)
}

/// The hold input the previous run saved; empty if none (or unreadable, with a warning).
pub fn load(path: &Path) -> HoldInput {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            tracing::warn!(file = %path.display(), error = %e, "ignoring unreadable maintenance hold file");
            HoldInput::default()
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => HoldInput::default(),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "cannot read maintenance hold file");
            HoldInput::default()
        }
    }
}

/// Written to a temporary file and renamed, so a crash never leaves half a file.
async fn save(path: &Path, input: &HoldInput) {
    let tmp = path.with_extension("json.tmp");
    let result = async {
        tokio::fs::write(&tmp, serde_json::to_vec_pretty(input).map_err(std::io::Error::other)?).await?;
        tokio::fs::rename(&tmp, path).await
    };
    if let Err(e) = result.await {
        tracing::error!(file = %path.display(), error = %e, "cannot save maintenance holds; a restart may not hold static pods");
    }
}

/// Watches NodeMaintenances (and this node's mirror pods, for their priorities) forever and
/// publishes (and saves) the hold input after every complete list and change. Until the first
/// complete list, the saved input stays in force.
pub async fn run(
    client: Client,
    node: String,
    root_dir: PathBuf,
    holds: watch::Sender<HoldInput>,
    mut mirrors: watch::Receiver<Vec<Pod>>,
) {
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client);
    // No `default_backoff`: it resets on the `Init` that starts every retry, so a lasting
    // failure (a 403 without the RBAC) was retried about every second. `WatchRetry` resets
    // only once the watch works again.
    let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
    let mut retry = WatchRetry::default();
    let mut resume_at: Option<Instant> = None;
    let mut all: BTreeMap<String, NodeMaintenance> = BTreeMap::new();
    let mut initial: Option<BTreeMap<String, NodeMaintenance>> = None;
    let mut listed = false;
    let path = holds_file(&root_dir);
    loop {
        tokio::select! {
            () = sleep_until(resume_at.unwrap_or_else(Instant::now)), if resume_at.is_some() => {
                resume_at = None;
                continue;
            }
            event = stream.next(), if resume_at.is_none() => {
                let Some(event) = event else { return };
                let key = |m: &NodeMaintenance| m.metadata.name.clone().unwrap_or_default();
                // A retry starts with `Init` before its list can fail again; only a completed
                // list or a change shows the watch works.
                let recovered = matches!(event, Ok(Event::InitDone | Event::Apply(_) | Event::Delete(_)));
                match event {
                    Ok(Event::Init) => initial = Some(BTreeMap::new()),
                    Ok(Event::InitApply(m)) => {
                        if let Some(buffer) = initial.as_mut() {
                            buffer.insert(key(&m), m);
                        }
                    }
                    Ok(Event::InitDone) => {
                        all = initial.take().unwrap_or_default();
                        listed = true;
                        tracing::info!(node = %node, maintenances = all.len(), "listed NodeMaintenances; static pod holds follow them");
                    }
                    Ok(Event::Apply(m)) => {
                        all.insert(key(&m), m);
                    }
                    Ok(Event::Delete(m)) => {
                        all.remove(&key(&m));
                    }
                    Err(e) => {
                        let failure = retry.failed(&e.to_string());
                        if failure.log {
                            tracing::warn!(
                                node = %node, error = %e,
                                "cannot watch NodeMaintenances (is the maintenance.gantry.dev CRD installed and readable by nodes?); \
                                 keeping the current static pod holds and retrying with backoff (up to 5 minutes)"
                            );
                        }
                        resume_at = Some(Instant::now() + failure.retry_in);
                        continue;
                    }
                }
                if recovered && retry.recovered() {
                    tracing::info!(node = %node, "watching NodeMaintenances");
                }
            }
            Ok(()) = mirrors.changed() => {}
        }
        if !listed || initial.is_some() {
            continue; // act on complete lists only
        }
        let draining = all.values().any(|m| m.spec.stage == Stage::Drain);
        let labels = if draining { node_labels(&nodes, &node).await } else { BTreeMap::new() };
        let mut input = HoldInput::from_maintenances(all.values(), labels);
        // A held pod's mirror is gone; its last known priority still applies.
        input.mirror_priorities = holds.borrow().mirror_priorities.clone();
        input.mirror_priorities.extend(mirror_priorities(&mirrors.borrow_and_update()));
        if !draining {
            input.mirror_priorities.clear();
        }
        if *holds.borrow() != input {
            save(&path, &input).await;
            holds.send_replace(input);
        }
    }
}

fn mirror_priorities(mirrors: &[Pod]) -> BTreeMap<String, i32> {
    mirrors.iter().filter_map(|m| Some((spec::full_name(m), m.spec.as_ref()?.priority?))).collect()
}

async fn node_labels(nodes: &Api<Node>, node: &str) -> BTreeMap<String, String> {
    match nodes.get_opt(node).await {
        Ok(n) => n.and_then(|n| n.metadata.labels).unwrap_or_default(),
        Err(e) => {
            tracing::debug!(node, error = %e, "cannot read the Node's labels; using the maintenances' node lists");
            BTreeMap::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use gantry_maintenance::api::default_drain_plan;

    use super::*;

    fn maintenance(name: &str, stage: Stage, reached: usize) -> NodeMaintenance {
        let spec = serde_json::from_value(serde_json::json!({
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]},
            "stage": stage,
        }))
        .unwrap();
        let mut m = NodeMaintenance::new(name, spec);
        let mut status = NodeMaintenanceStatus::default();
        status.drain_status.reached_drain_targets = default_drain_plan()[..reached].to_vec();
        m.status = Some(status);
        m
    }

    #[test]
    fn only_draining_maintenances_are_kept_and_status_churn_is_ignored() {
        let all = [
            maintenance("cordon", Stage::Cordon, 0),
            maintenance("early", Stage::Drain, 8),
            maintenance("static", Stage::Drain, 9),
            maintenance("done", Stage::Complete, 12),
        ];
        let input = HoldInput::from_maintenances(all.iter(), BTreeMap::new());
        let names: Vec<_> = input.maintenances.iter().map(|m| m.metadata.name.clone().unwrap()).collect();
        assert_eq!(names, ["early", "static"]);

        let mut churned = all.clone();
        churned[2].metadata.resource_version = Some("42".into());
        let status = churned[2].status.as_mut().unwrap();
        status.drain_status.pods_pending_eviction = 3;
        status.node_statuses.push(NodeStatus { node_name: "n1".into(), pods_remaining: 2, ..Default::default() });
        let with_node = HoldInput::from_maintenances(churned.iter(), BTreeMap::new());
        assert_ne!(with_node, input, "a node joining the status matters");
        churned[2].status.as_mut().unwrap().node_statuses[0].pods_remaining = 1;
        churned[2].metadata.resource_version = Some("43".into());
        assert_eq!(HoldInput::from_maintenances(churned.iter(), BTreeMap::new()), with_node, "counts do not");
    }

    #[test]
    fn a_mirror_priority_wins_over_the_static_pod_file() {
        let mut pod = Pod::default();
        pod.metadata.uid = Some("u1".into());
        pod.metadata.namespace = Some("kube-system".into());
        pod.metadata.name = Some("db-n1".into());
        // Reached Static <= 1e9 only: a pod whose (custom) class resolved to 1.5e9 is not covered.
        let mut input = HoldInput::from_maintenances([maintenance("m", Stage::Drain, 9)].iter(), BTreeMap::new());
        assert_eq!(input.held("n1", std::slice::from_ref(&pod)).len(), 1, "the file alone says priority 0");
        input.mirror_priorities.insert("kube-system/db-n1".into(), 1_500_000_000);
        assert!(input.held("n1", &[pod]).is_empty(), "the mirror's resolved priority is what the planner sees");
    }

    #[test]
    fn saved_input_round_trips_and_a_missing_or_bad_file_holds_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = holds_file(dir.path());
        assert_eq!(load(&path), HoldInput::default());
        let input = HoldInput::from_maintenances([maintenance("m", Stage::Drain, 12)].iter(), BTreeMap::new());
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(save(&path, &input));
        assert_eq!(load(&path), input);
        let mut pod = Pod::default();
        pod.metadata.uid = Some("u1".into());
        assert_eq!(load(&path).held("n1", &[pod]).get("u1").map(String::as_str), Some("m"));
        std::fs::write(&path, "{not json").unwrap();
        assert_eq!(load(&path), HoldInput::default());
    }
}
