//! Applies a [`Decision`] to the cluster, in an order that keeps restarts safe: the status
//! (with each node's cordon memory) is written before any node is cordoned, and the
//! finalizer is removed only after every node is restored. Every step gets an event.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, NodeCondition, ObjectReference, Pod, Taint};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::metrics::EvictionResult;
use super::{Context, ControllerError};
use gantry_maintenance::api::{
    BlockingPod, CONDITION_DRAINED, CONDITION_INVALID, CONDITION_UNSAFE, DRAIN_TAINT_KEY, FINALIZER, NodeMaintenance,
    NodeMaintenanceStatus, Stage,
};
use gantry_maintenance::decide::Decision;
use gantry_maintenance::plan::{self, PodRef};

pub(super) async fn apply(
    ctx: &Context,
    m: &NodeMaintenance,
    nodes: &[Node],
    pods: &[Pod],
    pdbs: &[PodDisruptionBudget],
    mut d: Decision,
) -> Result<(), ControllerError> {
    let api: Api<NodeMaintenance> = Api::all(ctx.client.clone());
    let name = m.name_any();
    let old = m.status.clone().unwrap_or_default();
    if d.status != old {
        // The first write carries the resourceVersion the decision was made from.
        patch_status(&api, &name, &d.status, m.metadata.resource_version.as_deref()).await?;
        announce_progress(ctx, m, &old, &d.status).await;
        announce_conditions(ctx, m, &old, &d.status).await;
    }
    if let Some(plan) = &d.write_back_plan {
        api.patch(&name, &PatchParams::default(), &Patch::Merge(json!({ "spec": { "drainPlan": plan } }))).await?;
    }
    if d.add_finalizer {
        set_finalizer(&api, m, true).await?;
    }
    for node in &d.cordon {
        set_unschedulable(ctx, node, true).await?;
        event(ctx, m, About::Node(node), EventType::Normal, "Cordoned", format!("Cordoned node {node}")).await;
    }
    for node in &d.taint {
        set_drain_taint(ctx, nodes, node, true).await?;
        event(
            ctx,
            m,
            About::Node(node),
            EventType::Normal,
            "Tainted",
            format!("Tainted node {node} with {DRAIN_TAINT_KEY}:NoSchedule"),
        )
        .await;
    }
    let held = evict_all(ctx, m, &d.evict, pods, pdbs).await;
    if !held.is_empty() {
        report_held(&mut d.status, held);
        patch_status(&api, &name, &d.status, None).await?;
    }
    for node in &d.untaint {
        set_drain_taint(ctx, nodes, node, false).await?;
        event(
            ctx,
            m,
            About::Node(node),
            EventType::Normal,
            "Untainted",
            format!("Removed the taint {DRAIN_TAINT_KEY} from node {node}"),
        )
        .await;
    }
    for node in &d.uncordon {
        set_unschedulable(ctx, node, false).await?;
        event(ctx, m, About::Node(node), EventType::Normal, "Uncordoned", format!("Uncordoned node {node}")).await;
    }
    for (node, conditions) in &d.node_conditions {
        set_node_conditions(ctx, node, conditions).await?;
    }
    if d.remove_finalizer {
        set_finalizer(&api, m, false).await?;
        event(
            ctx,
            m,
            About::Maintenance,
            EventType::Normal,
            "Completed",
            "Maintenance complete; nodes restored".to_string(),
        )
        .await;
    }
    Ok(())
}

/// Writes the status; with `resource_version`, only if the object did not change since.
async fn patch_status(
    api: &Api<NodeMaintenance>,
    name: &str,
    status: &NodeMaintenanceStatus,
    resource_version: Option<&str>,
) -> Result<(), ControllerError> {
    let body = match resource_version {
        Some(rv) => json!({ "metadata": { "resourceVersion": rv }, "status": status }),
        None => json!({ "status": status }),
    };
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(body)).await?;
    Ok(())
}

/// Adds or removes our finalizer with a JSON patch that tests the current list, so a
/// concurrent change by someone else makes this attempt fail (and retry) instead of
/// overwriting theirs.
async fn set_finalizer(api: &Api<NodeMaintenance>, m: &NodeMaintenance, present: bool) -> Result<(), ControllerError> {
    let current = m.finalizers().to_vec();
    let mut wanted: Vec<String> = current.iter().filter(|f| *f != FINALIZER).cloned().collect();
    if present {
        wanted.push(FINALIZER.to_string());
    }
    let ops = if m.metadata.finalizers.is_some() {
        json!([
            { "op": "test", "path": "/metadata/finalizers", "value": current },
            { "op": "replace", "path": "/metadata/finalizers", "value": wanted },
        ])
    } else {
        json!([{ "op": "add", "path": "/metadata/finalizers", "value": wanted }])
    };
    let patch: json_patch::Patch = serde_json::from_value(ops)?;
    match api.patch(&m.name_any(), &PatchParams::default(), &Patch::<()>::Json(patch)).await {
        Ok(_) => Ok(()),
        // Removing the last finalizer of a deleted object deletes it: nothing left to patch.
        Err(kube::Error::Api(e)) if e.code == 404 && !present => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn set_unschedulable(ctx: &Context, node: &str, cordoned: bool) -> Result<(), ControllerError> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    // Like `kubectl uncordon`, leave the field unset rather than false.
    let value = if cordoned { json!(true) } else { serde_json::Value::Null };
    api.patch(node, &PatchParams::default(), &Patch::Merge(json!({ "spec": { "unschedulable": value } }))).await?;
    tracing::info!(node, cordoned, "node schedulability changed");
    Ok(())
}

/// A strategic merge keyed by condition type: only the maintenance conditions change, the
/// node agent's own (Ready, pressure) are left as they are.
async fn set_node_conditions(ctx: &Context, node: &str, conditions: &[NodeCondition]) -> Result<(), ControllerError> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let patch = json!({ "status": { "conditions": conditions } });
    api.patch_status(node, &PatchParams::default(), &Patch::Strategic(patch)).await?;
    tracing::debug!(node, "maintenance conditions updated");
    Ok(())
}

/// Adds or removes the maintenance NoSchedule taint, testing the taints seen in the snapshot
/// so another writer's taint is never lost.
async fn set_drain_taint(ctx: &Context, nodes: &[Node], node: &str, present: bool) -> Result<(), ControllerError> {
    let current =
        nodes.iter().find(|n| n.metadata.name.as_deref() == Some(node)).and_then(|n| n.spec.as_ref()?.taints.clone());
    let mut wanted: Vec<Taint> = current.iter().flatten().filter(|t| t.key != DRAIN_TAINT_KEY).cloned().collect();
    if present {
        wanted.push(Taint { key: DRAIN_TAINT_KEY.to_string(), effect: "NoSchedule".to_string(), ..Default::default() });
    }
    let ops = match current {
        Some(current) => json!([
            { "op": "test", "path": "/spec/taints", "value": current },
            { "op": "replace", "path": "/spec/taints", "value": wanted },
        ]),
        None => json!([{ "op": "add", "path": "/spec/taints", "value": wanted }]),
    };
    let patch: json_patch::Patch = serde_json::from_value(ops)?;
    Api::<Node>::all(ctx.client.clone()).patch(node, &PatchParams::default(), &Patch::<()>::Json(patch)).await?;
    Ok(())
}

/// Evicts each pod through the policy/v1 eviction subresource (so PDBs hold); returns the
/// pods that stay, with the reason to show in the status. A pod this process already saw
/// evicted is skipped: its deletion may just not have reached the pod watch yet.
async fn evict_all(
    ctx: &Context,
    m: &NodeMaintenance,
    targets: &[PodRef],
    pods: &[Pod],
    pdbs: &[PodDisruptionBudget],
) -> Vec<(PodRef, String)> {
    let mut held = Vec::new();
    for pod in targets {
        if ctx.evicted.lock().unwrap_or_else(|p| p.into_inner()).contains(&pod.uid) {
            continue;
        }
        let result = evict(ctx, pod).await;
        ctx.metrics.eviction(match &result {
            Ok(()) => EvictionResult::Accepted,
            Err(Refusal::Refused(_)) => EvictionResult::Refused,
            Err(Refusal::Failed(_)) => EvictionResult::Failed,
        });
        match result {
            Ok(()) => {
                ctx.evicted.lock().unwrap_or_else(|p| p.into_inner()).insert(pod.uid.clone());
                let message = format!("Evicted pod {}/{} from node {}", pod.namespace, pod.name, pod.node);
                event(ctx, m, About::Pod(&pod.namespace, &pod.name), EventType::Normal, "Evicted", message).await;
            }
            Err(Refusal::Refused(reason)) => {
                let budget = guarding_budget(pod, pods, pdbs);
                let message = format!("Eviction of pod {}/{} refused by {budget}: {reason}", pod.namespace, pod.name);
                event(ctx, m, About::Pod(&pod.namespace, &pod.name), EventType::Warning, "EvictionRefused", message)
                    .await;
                held.push((pod.clone(), format!("eviction refused by {budget}: {reason}")));
            }
            Err(Refusal::Failed(reason)) => {
                let message = format!("Eviction of pod {}/{} failed: {reason}", pod.namespace, pod.name);
                event(ctx, m, About::Pod(&pod.namespace, &pod.name), EventType::Warning, "EvictionFailed", message)
                    .await;
                held.push((pod.clone(), format!("eviction failed: {reason}")));
            }
        }
    }
    held
}

/// Names the PodDisruptionBudget guarding the pod, for messages (the 429 does not).
fn guarding_budget(pod: &PodRef, pods: &[Pod], pdbs: &[PodDisruptionBudget]) -> String {
    let found = pods.iter().find(|p| p.metadata.uid.as_deref() == Some(pod.uid.as_str()));
    let names: Vec<String> = found
        .map(|p| plan::pdbs_of(p, pdbs))
        .unwrap_or_default()
        .iter()
        .map(|b| format!("{}/{}", b.metadata.namespace.as_deref().unwrap_or_default(), b.name_any()))
        .collect();
    if names.is_empty() {
        "its PodDisruptionBudget".to_string()
    } else {
        format!("PodDisruptionBudget {}", names.join(", "))
    }
}

enum Refusal {
    /// 429: a PodDisruptionBudget does not allow the disruption now.
    Refused(String),
    Failed(String),
}

async fn evict(ctx: &Context, pod: &PodRef) -> Result<(), Refusal> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &pod.namespace);
    let body = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": { "name": pod.name, "namespace": pod.namespace },
        "deleteOptions": { "preconditions": { "uid": pod.uid } },
    });
    let result: Result<serde_json::Value, kube::Error> =
        api.create_subresource("eviction", &pod.name, &PostParams::default(), &body).await;
    match result {
        Ok(_) => Ok(()),
        // Gone already, or replaced by a namesake (UID precondition): nothing to evict.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 429 => Err(Refusal::Refused(e.message)),
        Err(e) => Err(Refusal::Failed(e.to_string())),
    }
}

fn report_held(status: &mut NodeMaintenanceStatus, held: Vec<(PodRef, String)>) {
    for (pod, reason) in held {
        let Some(node) = status.node_statuses.iter_mut().find(|s| s.node_name == pod.node) else { continue };
        node.blocking_pods.retain(|b| !(b.namespace == pod.namespace && b.name == pod.name));
        node.blocking_pods.push(BlockingPod { namespace: pod.namespace, name: pod.name, reason });
    }
}

/// Events for progress visible in the status: a stage starting, a drain plan entry reached,
/// a pod newly held (by a PDB, a DaemonSet tolerating the taint, a stuck termination...).
async fn announce_progress(
    ctx: &Context,
    m: &NodeMaintenance,
    old: &NodeMaintenanceStatus,
    new: &NodeMaintenanceStatus,
) {
    for stage in new.stage_statuses.iter().filter(|s| !old.stage_statuses.iter().any(|o| o.name == s.name)) {
        event(
            ctx,
            m,
            About::Step(format!("Start{:?}", stage.name)),
            EventType::Normal,
            "StageStarted",
            format!("Stage {:?} started", stage.name),
        )
        .await;
    }
    let (before, targets) = (old.drain_status.reached_drain_targets.len(), &new.drain_status.reached_drain_targets);
    for (i, entry) in targets.iter().enumerate().skip(before) {
        let selector = if entry.pod_selector.is_some() { " with a pod selector" } else { "" };
        let message = format!(
            "Drain target {}/{} reached: {:?} pods with priority up to {}{selector}",
            i + 1,
            m.spec.drain_plan.len().max(targets.len()),
            entry.pod_type,
            entry.pod_priority
        );
        event(
            ctx,
            m,
            About::Step(format!("ReachDrainTarget{}", i + 1)),
            EventType::Normal,
            "DrainTargetReached",
            message,
        )
        .await;
    }
    let was_held = |node: &str, b: &BlockingPod| {
        old.node_statuses.iter().filter(|s| s.node_name == node).flat_map(|s| &s.blocking_pods).any(|o| o == b)
    };
    // A pod terminating after its eviction, or a DaemonSet pod waiting for the taint this
    // very reconcile adds, is progress, not a block.
    let transient =
        |b: &BlockingPod| b.reason == "terminating" || b.reason.starts_with("waiting for the maintenance taint");
    for status in &new.node_statuses {
        for b in status.blocking_pods.iter().filter(|b| !transient(b) && !was_held(&status.node_name, b)) {
            let message = format!("Pod {}/{} on node {} held: {}", b.namespace, b.name, status.node_name, b.reason);
            event(ctx, m, About::Pod(&b.namespace, &b.name), EventType::Warning, "EvictionBlocked", message).await;
        }
    }
}

/// Events (and the drain duration metric) for conditions that just became true.
async fn announce_conditions(
    ctx: &Context,
    m: &NodeMaintenance,
    old: &NodeMaintenanceStatus,
    new: &NodeMaintenanceStatus,
) {
    let was_true = |s: &NodeMaintenanceStatus, t: &str| s.conditions.iter().any(|c| c.type_ == t && c.status == "True");
    for (type_, kind) in [
        (CONDITION_DRAINED, EventType::Normal),
        (CONDITION_INVALID, EventType::Warning),
        (CONDITION_UNSAFE, EventType::Warning),
    ] {
        if was_true(new, type_) && !was_true(old, type_) {
            let message =
                new.conditions.iter().find(|c| c.type_ == type_).map(|c| c.message.clone()).unwrap_or_default();
            event(ctx, m, About::Maintenance, kind, type_, message).await;
            if type_ == CONDITION_DRAINED {
                observe_drain_duration(ctx, new);
            }
        }
    }
}

/// Drain start (from the status, so it survives restarts) to now.
fn observe_drain_duration(ctx: &Context, status: &NodeMaintenanceStatus) {
    let start = status.stage_statuses.iter().find(|s| s.name == Stage::Drain);
    if let Some(start) = start.and_then(|s| s.start_timestamp.parse::<Timestamp>().ok()) {
        let seconds = Timestamp::now().duration_since(start).as_secs_f64();
        ctx.metrics.drained_after(seconds);
    }
}

/// What else an event is about. kube's `Recorder` folds events with the same reason,
/// action and related object into one series (keeping the first note), so each pod, node or
/// step gets its own related object or action to stay visible.
enum About<'a> {
    Maintenance,
    Node(&'a str),
    Pod(&'a str, &'a str),
    Step(String),
}

/// Events are best effort: a failure to publish one never fails the reconcile.
async fn event(ctx: &Context, m: &NodeMaintenance, about: About<'_>, type_: EventType, reason: &str, note: String) {
    tracing::info!(maintenance = %m.name_any(), reason, "{note}");
    let reference = |kind: &str, namespace: Option<&str>, name: &str| ObjectReference {
        api_version: Some("v1".to_string()),
        kind: Some(kind.to_string()),
        namespace: namespace.map(str::to_string),
        name: Some(name.to_string()),
        ..Default::default()
    };
    let (action, secondary) = match about {
        About::Maintenance => (reason.to_string(), None),
        About::Node(node) => (reason.to_string(), Some(reference("Node", None, node))),
        About::Pod(namespace, name) => (reason.to_string(), Some(reference("Pod", Some(namespace), name))),
        About::Step(action) => (action, None),
    };
    let event = Event { type_, reason: reason.to_string(), note: Some(note), action, secondary };
    if let Err(e) = ctx.recorder.publish(&event, &m.object_ref(&())).await {
        tracing::debug!(error = %e, "cannot publish event");
    }
}
