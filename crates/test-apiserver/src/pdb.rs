//! PodDisruptionBudget status, computed the way the disruption controller does (there is no
//! controller manager here, so the server keeps the status current itself whenever pods,
//! PDBs or their controllers change, and a timer expires stale `disruptedPods` entries).
//!
//! expectedPods / desiredHealthy follow upstream: an integer `minAvailable` counts the
//! selected pods; a percentage `minAvailable` or any `maxUnavailable` uses the scale of the
//! pods' controllers (ReplicaSet, its Deployment, StatefulSet), and pods without a
//! controller are left out (so such a PDB over bare pods allows no disruption, as upstream).

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::meta;
use crate::pods;
use crate::selectors::LabelSelector;
use crate::store::StoreInner;

pub const STORAGE: &str = "policy/poddisruptionbudgets";
/// How long an eviction's entry in `disruptedPods` holds a pod out of the healthy count.
pub const DELETION_TIMEOUT_SECONDS: i64 = 120;

/// The pods a PDB selects; an empty or invalid selector selects none.
pub fn selected_pods(inner: &StoreInner, pdb: &Value) -> Vec<Value> {
    let ns = meta::namespace(pdb);
    let selector = match pdb.pointer("/spec/selector").map(LabelSelector::from_object) {
        Some(Ok(s)) if !s.is_empty() => s,
        _ => return Vec::new(),
    };
    inner.list("pods", Some(ns)).into_iter().filter(|p| selector.matches_object(p)).map(|p| (*p).clone()).collect()
}

/// PDBs in the pod's namespace whose selector matches it.
pub fn pdbs_for_pod(inner: &StoreInner, pod: &Value) -> Vec<Value> {
    inner
        .list(STORAGE, Some(meta::namespace(pod)))
        .into_iter()
        .filter(|pdb| match pdb.pointer("/spec/selector").map(LabelSelector::from_object) {
            Some(Ok(s)) => !s.is_empty() && s.matches_object(pod),
            _ => false,
        })
        .map(|p| (*p).clone())
        .collect()
}

/// Why a PDB's status cannot be computed (the disruption controller's messages).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PdbError {
    #[error("invalid value {0}")]
    InvalidValue(Value),
    #[error("invalid value for IntOrString: invalid value {0:?}")]
    InvalidPercent(String),
    #[error("found no controllers for pod {0:?}")]
    NoController(String),
}

/// An int-or-percent against a total, rounding up like GetScaledValueFromIntOrPercent.
fn scaled(value: &Value, total: i64) -> Result<i64, PdbError> {
    match value {
        Value::Number(n) => n.as_i64().ok_or_else(|| PdbError::InvalidValue(value.clone())),
        Value::String(s) => {
            let pct: i64 =
                s.strip_suffix('%').and_then(|p| p.parse().ok()).ok_or_else(|| PdbError::InvalidPercent(s.clone()))?;
            Ok((pct * total + 99) / 100)
        }
        other => Err(PdbError::InvalidValue(other.clone())),
    }
}

/// The replicas of the controller owning `pod` as (controller uid, scale).
fn controller_scale(inner: &StoreInner, pod: &Value) -> Result<Option<(String, i64)>, PdbError> {
    let owners = pod.pointer("/metadata/ownerReferences").and_then(Value::as_array).cloned().unwrap_or_default();
    let Some(owner) = owners.iter().find(|o| o.get("controller").and_then(Value::as_bool) == Some(true)) else {
        return Ok(None);
    };
    let ns = meta::namespace(pod);
    let (kind, name, uid) = (meta::str_at(owner, "/kind"), meta::str_at(owner, "/name"), meta::str_at(owner, "/uid"));
    let replicas = |o: &Value| o.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
    let found = match kind {
        "ReplicaSet" => inner.get("apps/replicasets", ns, name).filter(|rs| meta::uid(rs) == uid).map(|rs| {
            let deployment = rs
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|o| {
                    o.get("controller").and_then(Value::as_bool) == Some(true)
                        && meta::str_at(o, "/kind") == "Deployment"
                })
                .and_then(|o| {
                    inner
                        .get("apps/deployments", ns, meta::str_at(o, "/name"))
                        .filter(|d| meta::uid(d) == meta::str_at(o, "/uid"))
                });
            match deployment {
                Some(d) => (meta::uid(&d).to_string(), replicas(&d)),
                None => (uid.to_string(), replicas(&rs)),
            }
        }),
        "StatefulSet" => inner
            .get("apps/statefulsets", ns, name)
            .filter(|s| meta::uid(s) == uid)
            .map(|s| (uid.to_string(), replicas(&s))),
        _ => None,
    };
    match found {
        Some(f) => Ok(Some(f)),
        None => Err(PdbError::NoController(meta::name(pod).to_string())),
    }
}

fn expected_scale(inner: &StoreInner, pods: &[Value]) -> Result<i64, PdbError> {
    let mut scales: BTreeMap<String, i64> = BTreeMap::new();
    for pod in pods {
        if let Some((uid, scale)) = controller_scale(inner, pod)? {
            scales.insert(uid, scale);
        }
    }
    Ok(scales.values().sum())
}

/// (expectedPods, desiredHealthy) per getExpectedPodCount.
fn expected_and_desired(inner: &StoreInner, pdb: &Value, pods: &[Value]) -> Result<(i64, i64), PdbError> {
    if let Some(max_unavailable) = pdb.pointer("/spec/maxUnavailable") {
        let expected = expected_scale(inner, pods)?;
        let max = scaled(max_unavailable, expected)?;
        return Ok((expected, (expected - max).max(0)));
    }
    match pdb.pointer("/spec/minAvailable") {
        Some(Value::Number(n)) => Ok((pods.len() as i64, n.as_i64().unwrap_or(0))),
        Some(v @ Value::String(_)) => {
            let expected = expected_scale(inner, pods)?;
            Ok((expected, scaled(v, expected)?))
        }
        _ => Ok((0, 0)),
    }
}

/// The disrupted-pod map without entries for pods that are gone, being deleted, or whose
/// eviction is older than the deletion timeout.
fn live_disruptions(pdb: &Value, pods: &[Value], now: i64) -> Map<String, Value> {
    let Some(recorded) = pdb.pointer("/status/disruptedPods").and_then(Value::as_object) else {
        return Map::new();
    };
    pods.iter()
        .filter(|p| !meta::is_deleting(p))
        .filter_map(|p| {
            let at = recorded.get(meta::name(p))?;
            let when = meta::parse_time(at.as_str()?)?;
            (when + DELETION_TIMEOUT_SECONDS > now).then(|| (meta::name(p).to_string(), at.clone()))
        })
        .collect()
}

fn condition(old: &Value, allowed: bool, observed_generation: i64, failure: Option<&str>) -> Value {
    let status = if allowed { "True" } else { "False" };
    let reason = match failure {
        Some(_) => "SyncFailed",
        None if allowed => "SufficientPods",
        None => "InsufficientPods",
    };
    let previous = old
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("DisruptionAllowed"));
    let since = match previous {
        Some(p) if p.get("status").and_then(Value::as_str) == Some(status) => {
            p.get("lastTransitionTime").cloned().unwrap_or(json!(meta::now()))
        }
        _ => json!(meta::now()),
    };
    json!({
        "type": "DisruptionAllowed",
        "status": status,
        "reason": reason,
        "message": failure.unwrap_or(""),
        "observedGeneration": observed_generation,
        "lastTransitionTime": since,
    })
}

/// The status the disruption controller would write for `pdb` now.
pub fn compute_status(inner: &StoreInner, pdb: &Value, now: i64) -> Value {
    let generation = pdb.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
    let pods = selected_pods(inner, pdb);
    let (expected, desired) = match expected_and_desired(inner, pdb, &pods) {
        Ok(v) => v,
        Err(failure) => {
            // failSafe: keep the counts, allow nothing.
            let mut status = pdb.get("status").cloned().unwrap_or_else(|| json!({}));
            status["disruptionsAllowed"] = json!(0);
            status["observedGeneration"] = json!(generation);
            status["conditions"] = json!([condition(pdb, false, generation, Some(&failure.to_string()))]);
            return status;
        }
    };
    let disrupted = live_disruptions(pdb, &pods, now);
    let healthy = pods
        .iter()
        .filter(|p| !meta::is_deleting(p) && !disrupted.contains_key(meta::name(p)) && pods::is_ready(p))
        .count() as i64;
    let allowed = if expected <= 0 { 0 } else { (healthy - desired).max(0) };
    let mut status = json!({
        "observedGeneration": generation,
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": [condition(pdb, allowed > 0, generation, None)],
    });
    if !disrupted.is_empty() {
        status["disruptedPods"] = Value::Object(disrupted);
    }
    status
}

/// Recomputes and stores the status of every PDB in `ns` whose status changed.
pub fn sync_namespace(inner: &mut StoreInner, ns: &str) {
    let now = jiff::Timestamp::now().as_second();
    for pdb in inner.list(STORAGE, Some(ns)) {
        let status = compute_status(inner, &pdb, now);
        if pdb.get("status") != Some(&status) {
            let mut updated = (*pdb).clone();
            updated["status"] = status;
            inner.put(STORAGE, updated);
        }
    }
}

/// Whether any PDB holds a `disruptedPods` entry past its timeout, so its status is due.
pub fn namespaces_with_expired_disruptions(inner: &StoreInner) -> Vec<String> {
    let now = jiff::Timestamp::now().as_second();
    let mut out: Vec<String> = inner
        .list(STORAGE, None)
        .iter()
        .filter(|pdb| {
            pdb.pointer("/status/disruptedPods").and_then(Value::as_object).is_some_and(|m| {
                m.values().any(|t| {
                    t.as_str().and_then(meta::parse_time).is_none_or(|at| at + DELETION_TIMEOUT_SECONDS <= now)
                })
            })
        })
        .map(|pdb| meta::namespace(pdb).to_string())
        .collect();
    out.dedup();
    out
}

/// The status after the eviction handler takes one disruption for `pod_name`.
pub fn take_disruption(pdb: &Value, pod_name: &str) -> Value {
    let mut status = pdb.get("status").cloned().unwrap_or_else(|| json!({}));
    let allowed = status.get("disruptionsAllowed").and_then(Value::as_i64).unwrap_or(0) - 1;
    status["disruptionsAllowed"] = json!(allowed);
    if allowed == 0 {
        let generation = status.get("observedGeneration").and_then(Value::as_i64).unwrap_or(0);
        status["conditions"] = json!([condition(pdb, false, generation, None)]);
    }
    if !status.get("disruptedPods").is_some_and(Value::is_object) {
        status["disruptedPods"] = json!({});
    }
    status["disruptedPods"][pod_name] = json!(meta::now());
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaled_rounds_up() {
        assert_eq!(scaled(&json!(2), 10).unwrap(), 2);
        assert_eq!(scaled(&json!("50%"), 3).unwrap(), 2);
        assert_eq!(scaled(&json!("10%"), 3).unwrap(), 1);
        assert!(scaled(&json!("abc"), 3).is_err());
    }

    #[test]
    fn expired_disruptions_are_dropped() {
        let now = 1_000_000;
        let pdb =
            json!({"status": {"disruptedPods": {"a": meta::format_time(now - 10), "b": meta::format_time(now - 500)}}});
        let pods = vec![json!({"metadata": {"name": "a"}}), json!({"metadata": {"name": "b"}})];
        let live = live_disruptions(&pdb, &pods, now);
        assert!(live.contains_key("a"));
        assert!(!live.contains_key("b"));
    }
}
