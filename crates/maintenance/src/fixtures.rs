//! Builders for the unit tests of the planner and the reconcile decision.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, NodeSpec, Pod, PodSpec, PodStatus, Taint};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector as K8sSelector, ObjectMeta, OwnerReference};

use crate::api::{
    DRAIN_TAINT_KEY, DrainPlanEntry, NodeMaintenance, NodeMaintenanceSpec, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, Stage,
};

use gantry_vocab::keys::MIRROR as MIRROR_ANNOTATION;

pub const NOW: &str = "2026-11-22T06:00:00Z";

pub fn now() -> Timestamp {
    NOW.parse().unwrap()
}

pub fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        },
        ..Default::default()
    }
}

pub fn cordoned(mut n: Node) -> Node {
    n.spec = Some(NodeSpec { unschedulable: Some(true), ..Default::default() });
    n
}

pub fn tainted(mut n: Node) -> Node {
    let taint = Taint { key: DRAIN_TAINT_KEY.into(), effect: "NoSchedule".into(), ..Default::default() };
    n.spec.get_or_insert_default().taints = Some(vec![taint]);
    n
}

pub fn pod(name: &str, node: &str, priority: i32, app: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            namespace: Some("default".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            labels: Some([("app".to_string(), app.to_string())].into()),
            ..Default::default()
        },
        spec: Some(PodSpec { node_name: Some(node.into()), priority: Some(priority), ..Default::default() }),
        status: Some(PodStatus { phase: Some("Running".into()), ..Default::default() }),
    }
}

pub fn owned_by(mut p: Pod, kind: &str, name: &str) -> Pod {
    p.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: kind.into(),
        name: name.into(),
        uid: "owner".into(),
        controller: Some(true),
        ..Default::default()
    }]);
    p
}

pub fn mirror(mut p: Pod) -> Pod {
    p.metadata.annotations = Some([(MIRROR_ANNOTATION.to_string(), "hash".to_string())].into());
    p
}

pub fn pdb(name: &str, app: &str, allowed: i32) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta { namespace: Some("default".into()), name: Some(name.into()), ..Default::default() },
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(K8sSelector {
                match_labels: Some([("app".to_string(), app.to_string())].into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: Some(PodDisruptionBudgetStatus { disruptions_allowed: allowed, ..Default::default() }),
    }
}

pub fn maintenance(name: &str, nodes: &[&str], stage: Stage, plan: Vec<DrainPlanEntry>) -> NodeMaintenance {
    let term = NodeSelectorTerm {
        match_fields: vec![NodeSelectorRequirement {
            key: "metadata.name".into(),
            operator: "In".into(),
            values: nodes.iter().map(|n| n.to_string()).collect(),
        }],
        ..Default::default()
    };
    let spec = NodeMaintenanceSpec {
        node_selector: NodeSelector { node_selector_terms: vec![term] },
        stage,
        drain_plan: plan,
        reason: String::new(),
    };
    NodeMaintenance::new(name, spec)
}
