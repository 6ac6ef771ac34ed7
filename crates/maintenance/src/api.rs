//! The `NodeMaintenance` API (`maintenance.gantry.dev/v1alpha1`, cluster-scoped), with the
//! fields and meanings of KEP-4212. Selectors are our own serde mirrors of the core
//! `NodeSelector` and `LabelSelector` (same JSON), so the schema needs no k8s-openapi feature.

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of the NodeMaintenance resource.
pub const GROUP: &str = "maintenance.gantry.dev";
/// Finalizer held while a maintenance is not Idle, so deletion runs Complete first.
pub const FINALIZER: &str = "maintenance.gantry.dev/maintenance-completion";
/// NoSchedule taint put on a node before its DaemonSet pods are evicted, so the DaemonSet
/// controller does not recreate them.
pub const DRAIN_TAINT_KEY: &str = "maintenance.gantry.dev/drain";
/// Annotation that allows a maintenance covering every control-plane or schedulable node.
pub const ALLOW_ALL_NODES_ANNOTATION: &str = "maintenance.gantry.dev/allow-all-nodes";
/// Condition type: all pods targeted by the drain plan are gone from all selected nodes.
pub const CONDITION_DRAINED: &str = "Drained";
/// Condition type: the spec breaks a rule (stage order, drainPlan order or immutability).
pub const CONDITION_INVALID: &str = "Invalid";
/// Condition type: the controller refuses to act because of a safety check.
pub const CONDITION_UNSAFE: &str = "Unsafe";

const STAGE_ORDER_RULE: &str = "{'Idle': 0, 'Cordon': 1, 'Drain': 2, 'Complete': 3}[self.stage] >= \
                                {'Idle': 0, 'Cordon': 1, 'Drain': 2, 'Complete': 3}[oldSelf.stage]";
const DRAIN_PLAN_IMMUTABLE_RULE: &str = "!has(oldSelf.drainPlan) || size(oldSelf.drainPlan) == 0 || (has(self.drainPlan) && self.drainPlan == oldSelf.drainPlan)";

/// The intent to maintain a set of nodes: cordon them, then drain them in the declared order.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "maintenance.gantry.dev",
    version = "v1alpha1",
    kind = "NodeMaintenance",
    plural = "nodemaintenances",
    shortname = "nm",
    status = "NodeMaintenanceStatus",
    printcolumn = r#"{"name":"Stage","type":"string","jsonPath":".spec.stage"}"#,
    printcolumn = r#"{"name":"Drained","type":"string","jsonPath":".status.conditions[?(@.type==\"Drained\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".spec.reason"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new(STAGE_ORDER_RULE).message("stage may only move forward: Idle, Cordon, Drain, Complete"))]
#[x_kube(validation = kube::core::Rule::new(DRAIN_PLAN_IMMUTABLE_RULE).message("drainPlan is immutable once set"))]
pub struct NodeMaintenanceSpec {
    /// Selects the nodes of this maintenance.
    pub node_selector: NodeSelector,
    /// Idle -> Cordon -> Drain -> Complete; only moves forward, Complete may be set from any stage.
    #[serde(default)]
    pub stage: Stage,
    /// Executed entry by entry during Drain. Empty means the 12 default entries, written back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drain_plan: Vec<DrainPlanEntry>,
    /// Why the maintenance happens, for humans.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Also evict pods that no controller owns (kubectl drain's `--force`). Nothing recreates
    /// them: they are gone for good. Without it such pods block the drain of their node.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub evict_bare_pods: bool,
    /// Also evict pods with emptyDir volumes, whose data is deleted (kubectl drain's
    /// `--delete-emptydir-data`). Without it such pods block the drain of their node.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub delete_empty_dir_data: bool,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, JsonSchema)]
pub enum Stage {
    #[default]
    Idle,
    Cordon,
    Drain,
    Complete,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Idle => "Idle",
            Stage::Cordon => "Cordon",
            Stage::Drain => "Drain",
            Stage::Complete => "Complete",
        }
    }
}

/// Which pods a drain plan entry selects by their kind of owner. Drained in this order.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, JsonSchema)]
pub enum PodType {
    /// All pods except DaemonSet and static pods.
    #[default]
    Default,
    DaemonSet,
    Static,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainPlanEntry {
    /// Narrows the entry to pods with these labels (executed before the same entry without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// Pods whose priority is less than or equal to this value are selected.
    pub pod_priority: i32,
    pub pod_type: PodType,
}

/// The KEP's priority steps: user priority classes, system-cluster-critical,
/// system-node-critical, maximum.
const DEFAULT_PRIORITIES: [i32; 4] = [1_000_000_000, 2_000_000_000, 2_000_001_000, i32::MAX];

/// The 12 entries used (and written back) when `spec.drainPlan` is empty.
pub fn default_drain_plan() -> Vec<DrainPlanEntry> {
    [PodType::Default, PodType::DaemonSet, PodType::Static]
        .into_iter()
        .flat_map(|pod_type| {
            DEFAULT_PRIORITIES.into_iter().map(move |pod_priority| DrainPlanEntry {
                pod_selector: None,
                pod_priority,
                pod_type,
            })
        })
        .collect()
}

/// Same JSON as core/v1 `NodeSelector`: the terms are ORed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelector {
    pub node_selector_terms: Vec<NodeSelectorTerm>,
}

/// Same JSON as core/v1 `NodeSelectorTerm`: the requirements are ANDed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorTerm {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<NodeSelectorRequirement>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_fields: Vec<NodeSelectorRequirement>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorRequirement {
    pub key: String,
    /// In, NotIn, Exists, DoesNotExist, Gt, Lt.
    pub operator: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// Same JSON as meta/v1 `LabelSelector`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelectorRequirement {
    pub key: String,
    /// In, NotIn, Exists, DoesNotExist.
    pub operator: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeMaintenanceStatus {
    /// One entry per started stage, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stage_statuses: Vec<StageStatus>,
    #[serde(default)]
    pub drain_status: DrainStatus,
    /// One entry per selected node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_statuses: Vec<NodeStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StageStatus {
    pub name: Stage,
    /// RFC 3339 time the stage started.
    pub start_timestamp: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainStatus {
    /// The drain plan entries targeted so far (the lowest across all selected nodes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reached_drain_targets: Vec<DrainPlanEntry>,
    /// Pods matching the reached targets that have not been asked to leave yet.
    #[serde(default)]
    pub pods_pending_eviction: i32,
    /// Pods matching the reached targets that were evicted and are still terminating.
    #[serde(default)]
    pub active_evictions: i32,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    pub node_name: String,
    /// Whether the node was unschedulable before this maintenance cordoned it (restored on
    /// Complete). Unset until the maintenance reaches Cordon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub was_unschedulable: Option<bool>,
    /// All pods matching the whole drain plan are gone from this node.
    #[serde(default)]
    pub drain_targets_reached: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub drain_message: String,
    /// Pods on this node the drain still waits for.
    #[serde(default)]
    pub pods_remaining: i32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocking_pods: Vec<BlockingPod>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockingPod {
    pub namespace: String,
    pub name: String,
    pub reason: String,
}

/// Same JSON as meta/v1 `Condition`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// True, False or Unknown.
    pub status: String,
    pub reason: String,
    #[serde(default)]
    pub message: String,
    /// RFC 3339 time of the last status change.
    pub last_transition_time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The CRD manifest as YAML, generated from these types (`gantry crd`).
pub fn crd_yaml() -> Result<String, serde_yaml_ng::Error> {
    use kube::CustomResourceExt;
    serde_yaml_ng::to_string(&NodeMaintenance::crd())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_plan_has_the_keps_twelve_entries_in_order() {
        let plan = default_drain_plan();
        assert_eq!(plan.len(), 12);
        assert_eq!((plan[0].pod_type, plan[0].pod_priority), (PodType::Default, 1_000_000_000));
        assert_eq!((plan[3].pod_type, plan[3].pod_priority), (PodType::Default, i32::MAX));
        assert_eq!((plan[4].pod_type, plan[4].pod_priority), (PodType::DaemonSet, 1_000_000_000));
        assert_eq!((plan[10].pod_type, plan[10].pod_priority), (PodType::Static, 2_000_001_000));
        assert!(plan.iter().all(|e| e.pod_selector.is_none()));
    }

    #[test]
    fn crd_is_cluster_scoped_with_status_and_cel_rules() {
        let yaml = crd_yaml().unwrap();
        assert!(yaml.contains("scope: Cluster"), "{yaml}");
        assert!(yaml.contains("group: maintenance.gantry.dev"));
        assert!(yaml.contains("status: {}"), "status subresource missing");
        assert!(yaml.contains("x-kubernetes-validations"));
        assert!(yaml.contains("stage may only move forward"));
        assert!(yaml.contains("drainPlan is immutable once set"));
    }

    #[test]
    fn deploy_manifest_matches_the_types() {
        let shipped = include_str!("../../../deploy/crd.yaml");
        assert_eq!(shipped, crd_yaml().unwrap(), "regenerate with `gantry crd > deploy/crd.yaml`");
    }

    #[test]
    fn spec_round_trips_the_keps_yaml() {
        let yaml = r#"
nodeSelector:
  nodeSelectorTerms:
  - matchExpressions:
    - {key: kubernetes.io/hostname, operator: In, values: [node-1]}
stage: Drain
drainPlan:
- {podPriority: 1000, podType: Default, podSelector: {matchLabels: {app: postgres}}}
- {podPriority: 1000, podType: Default}
reason: kernel upgrade
"#;
        let spec: NodeMaintenanceSpec = serde_yaml_ng::from_str(yaml).unwrap();
        assert_eq!(spec.stage, Stage::Drain);
        assert_eq!(spec.drain_plan.len(), 2);
        assert_eq!(spec.drain_plan[0].pod_selector.as_ref().unwrap().match_labels["app"], "postgres");
        let back: NodeMaintenanceSpec = serde_json::from_value(serde_json::to_value(&spec).unwrap()).unwrap();
        assert_eq!(back, spec);
    }
}
