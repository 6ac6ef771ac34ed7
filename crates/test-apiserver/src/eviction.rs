//! The pods/eviction subresource: delete a pod unless that would violate its
//! PodDisruptionBudget, following upstream's EvictionREST (policy/v1; v1beta1 bodies too).

use serde_json::{Value, json};

use crate::UserInfo;
use crate::auth::{self, Admission, Operation};
use crate::meta;
use crate::ops::{self, DeleteOptions, WriteCtx};
use crate::pdb;
use crate::pods;
use crate::resources::ResourceType;
use crate::status::{ApiError, ApiResult, GroupResource, success_status};
use crate::store::StoreInner;

/// Above this many unconfirmed evictions a PDB refuses more (upstream's MaxDisruptedPodSize).
const MAX_DISRUPTED_PODS: usize = 2000;

/// One eviction request as the server saw it, for tests that count evictions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictionRecord {
    pub namespace: String,
    pub name: String,
    /// The pod's UID when the request came (empty if there was no such pod).
    pub uid: String,
    /// The pod was already terminating (had a deletionTimestamp) when the request came.
    pub terminating: bool,
    /// The HTTP status code of the answer.
    pub code: u16,
}

pub fn record(ns: &str, name: &str, pod: Option<&Value>, result: &ApiResult<(u16, Value)>) -> EvictionRecord {
    EvictionRecord {
        namespace: ns.to_string(),
        name: name.to_string(),
        uid: pod.map(|p| meta::uid(p).to_string()).unwrap_or_default(),
        terminating: pod.and_then(|p| p.pointer("/metadata/deletionTimestamp")).is_some_and(|t| !t.is_null()),
        code: match result {
            Ok((code, _)) => *code,
            Err(e) => e.code,
        },
    }
}

/// Handles POST pods/<name>/eviction; returns the HTTP code and Status body.
pub fn evict(
    inner: &mut StoreInner,
    user: &UserInfo,
    pods_rt: &ResourceType,
    ns: &str,
    name: &str,
    body: &Value,
) -> ApiResult<(u16, Value)> {
    let eviction = parse_eviction(body)?;
    if meta::name(&eviction) != name {
        return Err(ApiError::bad_request("name in URL does not match name in Eviction object"));
    }
    let opts = DeleteOptions::from_value(eviction.get("deleteOptions").unwrap_or(&Value::Null))?;
    let pod = ops::get(inner, pods_rt, ns, name)?;
    auth::admit(
        inner,
        &Admission {
            user,
            rt: pods_rt,
            subresource: "eviction",
            op: Operation::Create,
            namespace: ns,
            name,
            old: Some(&pod),
            new: Some(&eviction),
        },
    )?;
    if can_ignore_pdb(&pod) {
        let opts = with_rv_precondition(&opts, &pod, enforce_resource_version(&pod));
        delete_pod(inner, pods_rt, ns, name, &opts)?;
        return Ok(success());
    }
    let budgets = pdb::pdbs_for_pod(inner, &pod);
    let budget = match budgets.as_slice() {
        [] => {
            delete_pod(inner, pods_rt, ns, name, &opts)?;
            return Ok(success());
        }
        [one] => one.clone(),
        _ => {
            let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.", "code": 500});
            return Ok((500, status));
        }
    };
    if !pods::is_ready(&pod) && unhealthy_pod_may_go(&budget) {
        // An unhealthy pod does not count towards the budget, so no disruption is taken; the
        // resourceVersion precondition guards against it becoming ready meanwhile.
        let guarded = with_rv_precondition(&opts, &pod, true);
        return match delete_pod(inner, pods_rt, ns, name, &guarded) {
            Ok(()) => Ok(success()),
            Err(e) if e.code == 409 && opts.precondition_rv.is_none() => Err(still_processing(meta::name(&budget))),
            Err(e) => Err(e),
        };
    }
    check_and_decrement(inner, &budget, name)?;
    if let Err(e) = delete_pod(inner, pods_rt, ns, name, &opts) {
        // Give the disruption back: the controller would recompute the status anyway.
        pdb::sync_namespace(inner, ns);
        return Err(e);
    }
    Ok(success())
}

fn parse_eviction(body: &Value) -> ApiResult<Value> {
    if !body.is_object() {
        return Err(ApiError::bad_request("the body of the request must be an Eviction object"));
    }
    let api_version = body.get("apiVersion").and_then(Value::as_str).unwrap_or("policy/v1");
    let kind = body.get("kind").and_then(Value::as_str).unwrap_or("Eviction");
    if kind != "Eviction" || !matches!(api_version, "policy/v1" | "policy/v1beta1") {
        return Err(ApiError::bad_request(format!("not a Eviction object: {api_version}, Kind={kind}")));
    }
    Ok(body.clone())
}

fn success() -> (u16, Value) {
    (201, success_status(201, None))
}

fn phase(pod: &Value) -> &str {
    meta::str_at(pod, "/status/phase")
}

/// Terminal, pending or already terminating pods are deleted without consulting PDBs.
fn can_ignore_pdb(pod: &Value) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed" | "Pending") || meta::is_deleting(pod)
}

fn enforce_resource_version(pod: &Value) -> bool {
    !matches!(phase(pod), "Succeeded" | "Failed") && !meta::is_deleting(pod)
}

fn with_rv_precondition(opts: &DeleteOptions, pod: &Value, enforce: bool) -> DeleteOptions {
    let mut opts = opts.clone();
    if enforce && opts.precondition_rv.is_none() {
        opts.precondition_rv = Some(meta::resource_version(pod).to_string());
    }
    opts
}

/// `unhealthyPodEvictionPolicy`: AlwaysAllow lets not-ready pods go; IfHealthyBudget (the
/// default) only while the budget is met.
fn unhealthy_pod_may_go(budget: &Value) -> bool {
    if meta::str_at(budget, "/spec/unhealthyPodEvictionPolicy") == "AlwaysAllow" {
        return true;
    }
    let num = |f: &str| budget.pointer(&format!("/status/{f}")).and_then(Value::as_i64).unwrap_or(0);
    num("currentHealthy") >= num("desiredHealthy") && num("desiredHealthy") > 0
}

fn still_processing(pdb_name: &str) -> ApiError {
    ApiError::too_many_requests(
        "Cannot evict pod as it would violate the pod's disruption budget.",
        10,
        vec![
            json!({"reason": "DisruptionBudget", "message": format!("The disruption budget {pdb_name} is still being processed by the server.")}),
        ],
    )
}

fn check_and_decrement(inner: &mut StoreInner, budget: &Value, pod_name: &str) -> ApiResult<()> {
    let name = meta::name(budget);
    let num = |p: &str| budget.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    if num("/status/observedGeneration") < num("/metadata/generation") {
        return Err(still_processing(name));
    }
    let gr = GroupResource::new("policy", "poddisruptionbudget");
    let allowed = num("/status/disruptionsAllowed");
    if allowed < 0 {
        return Err(ApiError::forbidden(&gr, name, "pdb disruptions allowed is negative"));
    }
    let disrupted = budget.pointer("/status/disruptedPods").and_then(Value::as_object).map_or(0, |m| m.len());
    if disrupted > MAX_DISRUPTED_PODS {
        return Err(ApiError::forbidden(
            &gr,
            name,
            "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
        ));
    }
    if allowed == 0 {
        let message = format!(
            "The disruption budget {name} needs {} healthy pods and has {} currently",
            num("/status/desiredHealthy"),
            num("/status/currentHealthy")
        );
        return Err(ApiError::too_many_requests(
            "Cannot evict pod as it would violate the pod's disruption budget.",
            0,
            vec![json!({"reason": "DisruptionBudget", "message": message})],
        ));
    }
    let mut updated = budget.clone();
    updated["status"] = pdb::take_disruption(budget, pod_name);
    inner.put(pdb::STORAGE, updated);
    Ok(())
}

fn delete_pod(
    inner: &mut StoreInner,
    pods_rt: &ResourceType,
    ns: &str,
    name: &str,
    opts: &DeleteOptions,
) -> ApiResult<()> {
    // The eviction was admitted as a whole; its delete is internal (no second admission).
    let system = auth::admin_user();
    let ctx = WriteCtx { user: &system, rt: pods_rt, namespace: ns, subresource: "", dry_run: opts.dry_run };
    ops::delete(inner, &ctx, name, opts).map(|_| ())
}
