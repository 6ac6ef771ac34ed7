//! Strategic merge patch for the built-in types this server serves.
//!
//! Like a JSON merge patch, except that some lists merge element-wise by a key instead of
//! being replaced (upstream's `patchStrategy:"merge"` / `patchMergeKey` struct tags), and
//! the patch may carry directives: `$patch: replace|delete|merge`,
//! `$deleteFromPrimitiveList/<field>`, `$retainKeys`. `$setElementOrder/<field>` is accepted
//! and ignored (element order is then: existing elements first, new ones appended).
//!
//! The merge keys below follow the upstream tags of k8s.io/api (v1.34); lists without a tag
//! (tolerations, taints, containerStatuses, args, ...) are atomic and replaced.

use serde_json::{Map, Value};

use super::PatchError;

/// The Go type a JSON value corresponds to, as far as patch strategies are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    /// A top-level object of the given kind.
    Root(&'static str),
    ObjectMeta,
    PodSpec,
    PodTemplateSpec,
    /// The spec of a workload (Deployment, ReplicaSet, DaemonSet, StatefulSet, Job).
    WorkloadSpec,
    Container,
    PodStatus,
    NodeSpec,
    NodeStatus,
    ServiceSpec,
    /// A status whose only merged list is `conditions`, keyed by `type`.
    ConditionsStatus,
    Other,
}

/// How a list field merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListKind {
    Replace,
    /// Objects merged by the value of this key.
    MergeByKey(&'static str),
    /// Scalars merged as a set (e.g. `metadata.finalizers`).
    MergeScalars,
}

/// Normalises a kind to one of the names the schema knows, so Root can hold a `&'static str`.
fn known_kind(kind: &str) -> &'static str {
    const KINDS: &[&str] = &[
        "Pod",
        "Node",
        "Service",
        "Namespace",
        "Deployment",
        "ReplicaSet",
        "DaemonSet",
        "StatefulSet",
        "Job",
        "PodTemplate",
        "PodDisruptionBudget",
        "PersistentVolumeClaim",
        "CustomResourceDefinition",
    ];
    KINDS.iter().find(|k| **k == kind).copied().unwrap_or("")
}

fn child(ty: Ty, field: &str) -> (Ty, ListKind) {
    use ListKind::*;
    use Ty::*;
    match (ty, field) {
        (Root(_), "metadata") => (ObjectMeta, Replace),
        (Root("Pod"), "spec") => (PodSpec, Replace),
        (Root("Pod"), "status") => (PodStatus, Replace),
        (Root("PodTemplate"), "template") => (PodTemplateSpec, Replace),
        (Root("Node"), "spec") => (NodeSpec, Replace),
        (Root("Node"), "status") => (NodeStatus, Replace),
        (Root("Service"), "spec") => (ServiceSpec, Replace),
        (Root("Deployment" | "ReplicaSet" | "DaemonSet" | "StatefulSet" | "Job"), "spec") => (WorkloadSpec, Replace),
        (
            Root(
                "Deployment"
                | "ReplicaSet"
                | "DaemonSet"
                | "StatefulSet"
                | "Job"
                | "Namespace"
                | "Service"
                | "PodDisruptionBudget"
                | "PersistentVolumeClaim"
                | "CustomResourceDefinition",
            ),
            "status",
        ) => (ConditionsStatus, Replace),
        (ObjectMeta, "ownerReferences") => (Other, MergeByKey("uid")),
        (ObjectMeta, "finalizers") => (Other, MergeScalars),
        (WorkloadSpec, "template") => (PodTemplateSpec, Replace),
        (PodTemplateSpec, "metadata") => (ObjectMeta, Replace),
        (PodTemplateSpec, "spec") => (PodSpec, Replace),
        (PodSpec, "containers" | "initContainers" | "ephemeralContainers") => (Container, MergeByKey("name")),
        (PodSpec, "volumes" | "imagePullSecrets" | "schedulingGates" | "resourceClaims") => (Other, MergeByKey("name")),
        (PodSpec, "hostAliases") => (Other, MergeByKey("ip")),
        (PodSpec, "topologySpreadConstraints") => (Other, MergeByKey("topologyKey")),
        (Container, "env") => (Other, MergeByKey("name")),
        (Container, "ports") => (Other, MergeByKey("containerPort")),
        (Container, "volumeMounts") => (Other, MergeByKey("mountPath")),
        (Container, "volumeDevices") => (Other, MergeByKey("devicePath")),
        (PodStatus, "conditions") => (Other, MergeByKey("type")),
        (PodStatus, "podIPs" | "hostIPs") => (Other, MergeByKey("ip")),
        (PodStatus, "resourceClaimStatuses") => (Other, MergeByKey("name")),
        (NodeSpec, "podCIDRs") => (Other, MergeScalars),
        (NodeStatus, "conditions" | "addresses") => (Other, MergeByKey("type")),
        (ServiceSpec, "ports") => (Other, MergeByKey("port")),
        (ConditionsStatus, "conditions") => (Other, MergeByKey("type")),
        _ => (Other, Replace),
    }
}

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_PRIMITIVE: &str = "$deleteFromPrimitiveList/";

/// Applies a strategic merge patch to an object of `kind`.
pub fn apply(kind: &str, original: &Value, patch: &Value) -> Result<Value, PatchError> {
    let patch_map = patch
        .as_object()
        .ok_or_else(|| PatchError::Malformed("a strategic merge patch must be a JSON object".into()))?;
    let original_map = original.as_object().cloned().unwrap_or_default();
    match merge_map(original_map, patch_map, Ty::Root(known_kind(kind)))? {
        Some(m) => Ok(Value::Object(m)),
        None => Err(PatchError::Failed("the patch deletes the whole object".into())),
    }
}

/// Merges a patch map into an original; `None` means the map was deleted (`$patch: delete`).
fn merge_map(
    mut original: Map<String, Value>,
    patch: &Map<String, Value>,
    ty: Ty,
) -> Result<Option<Map<String, Value>>, PatchError> {
    match patch.get(DIRECTIVE).and_then(Value::as_str) {
        Some("delete") => return Ok(None),
        Some("replace") => return Ok(Some(strip_directives_map(patch, ty))),
        Some("merge") | None => {}
        Some(other) => return Err(PatchError::Failed(format!("unknown patch type: {other:?}"))),
    }
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix(DELETE_PRIMITIVE) {
            delete_from_primitive_list(&mut original, field, value);
            continue;
        }
        if key.starts_with('$') {
            continue;
        }
        let (child_ty, list_kind) = child(ty, key);
        if value.is_null() {
            original.remove(key);
            continue;
        }
        let merged = match (original.remove(key), value) {
            (Some(Value::Object(o)), Value::Object(p)) => merge_map(o, p, child_ty)?.map(Value::Object),
            (Some(Value::Array(o)), Value::Array(p)) => Some(Value::Array(merge_list(o, p, list_kind, child_ty)?)),
            (_, Value::Object(p)) => match p.get(DIRECTIVE).and_then(Value::as_str) {
                Some("delete") => None,
                _ => Some(Value::Object(strip_directives_map(p, child_ty))),
            },
            (_, Value::Array(p)) => Some(Value::Array(merge_list(Vec::new(), p, list_kind, child_ty)?)),
            (_, scalar) => Some(scalar.clone()),
        };
        if let Some(v) = merged {
            original.insert(key.clone(), v);
        }
    }
    if let Some(retain) = patch.get(RETAIN_KEYS).and_then(Value::as_array) {
        let keep: Vec<&str> = retain.iter().filter_map(Value::as_str).collect();
        original.retain(|k, _| keep.contains(&k.as_str()));
    }
    Ok(Some(original))
}

fn delete_from_primitive_list(original: &mut Map<String, Value>, field: &str, values: &Value) {
    let Some(Value::Array(list)) = original.get_mut(field) else { return };
    let doomed = values.as_array().cloned().unwrap_or_default();
    list.retain(|v| !doomed.contains(v));
}

fn merge_list(original: Vec<Value>, patch: &[Value], kind: ListKind, elem_ty: Ty) -> Result<Vec<Value>, PatchError> {
    let replace_all = patch.iter().any(|p| p.get(DIRECTIVE).and_then(Value::as_str) == Some("replace"));
    match kind {
        _ if replace_all => {
            Ok(patch.iter().filter(|p| p.get(DIRECTIVE).is_none()).map(|p| strip_directives(p, elem_ty)).collect())
        }
        ListKind::Replace => Ok(patch
            .iter()
            .filter(|p| p.get(DIRECTIVE).and_then(Value::as_str) != Some("delete"))
            .map(|p| strip_directives(p, elem_ty))
            .collect()),
        ListKind::MergeScalars => {
            let mut out = original;
            for p in patch {
                if !out.contains(p) {
                    out.push(p.clone());
                }
            }
            Ok(out)
        }
        ListKind::MergeByKey(key) => merge_keyed_list(original, patch, key, elem_ty),
    }
}

fn merge_keyed_list(mut out: Vec<Value>, patch: &[Value], key: &str, elem_ty: Ty) -> Result<Vec<Value>, PatchError> {
    for p in patch {
        let Value::Object(pm) = p else {
            // A keyed list holding scalars: upstream treats it as a set merge.
            if !out.contains(p) {
                out.push(p.clone());
            }
            continue;
        };
        let Some(key_value) = pm.get(key) else {
            return Err(PatchError::Failed(format!("map: {p} does not contain declared merge key: {key}")));
        };
        let position = out.iter().position(|o| o.get(key) == Some(key_value));
        if pm.get(DIRECTIVE).and_then(Value::as_str) == Some("delete") {
            out.retain(|o| o.get(key) != Some(key_value));
            continue;
        }
        match position {
            Some(i) => {
                let existing = out[i].as_object().cloned().unwrap_or_default();
                match merge_map(existing, pm, elem_ty)? {
                    Some(m) => out[i] = Value::Object(m),
                    None => {
                        out.remove(i);
                    }
                }
            }
            None => out.push(Value::Object(strip_directives_map(pm, elem_ty))),
        }
    }
    Ok(out)
}

/// A patch value that lands where nothing existed: drop directives, and list elements that
/// ask to be deleted.
fn strip_directives(v: &Value, ty: Ty) -> Value {
    match v {
        Value::Object(m) => Value::Object(strip_directives_map(m, ty)),
        other => other.clone(),
    }
}

fn strip_directives_map(m: &Map<String, Value>, ty: Ty) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, v) in m {
        if k.starts_with('$') {
            continue;
        }
        let (child_ty, _) = child(ty, k);
        let cleaned = match v {
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .filter(|i| i.get(DIRECTIVE).and_then(Value::as_str) != Some("delete"))
                    .map(|i| strip_directives(i, child_ty))
                    .collect(),
            ),
            Value::Null => continue,
            other => strip_directives(other, child_ty),
        };
        out.insert(k.clone(), cleaned);
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod() -> Value {
        json!({
            "metadata": {"name": "p", "finalizers": ["a"], "labels": {"x": "1"}},
            "spec": {
                "containers": [
                    {"name": "app", "image": "img:1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                     "ports": [{"containerPort": 80}]},
                    {"name": "side", "image": "side:1"}
                ],
                "tolerations": [{"key": "k1", "operator": "Exists"}]
            },
            "status": {
                "conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [{"name": "app", "ready": false}, {"name": "side", "ready": false}]
            }
        })
    }

    #[test]
    fn containers_merge_by_name() {
        let out = apply("Pod", &pod(), &json!({"spec": {"containers": [{"name": "app", "image": "img:2"}]}})).unwrap();
        let containers = out["spec"]["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 2);
        assert_eq!(containers[0]["image"], "img:2");
        assert_eq!(containers[0]["env"].as_array().unwrap().len(), 2, "untouched fields stay");
        assert_eq!(containers[1]["image"], "side:1");
    }

    #[test]
    fn env_merge_and_delete_directive() {
        let out = apply(
            "Pod",
            &pod(),
            &json!({"spec": {"containers": [{"name": "app", "env": [{"name": "A", "$patch": "delete"}, {"name": "C", "value": "3"}]}]}}),
        )
        .unwrap();
        let env = &out["spec"]["containers"][0]["env"];
        assert_eq!(env, &json!([{"name": "B", "value": "2"}, {"name": "C", "value": "3"}]));
    }

    #[test]
    fn conditions_merge_by_type() {
        let out =
            apply("Pod", &pod(), &json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})).unwrap();
        assert_eq!(
            out["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}])
        );
    }

    #[test]
    fn atomic_lists_are_replaced() {
        let out = apply(
            "Pod",
            &pod(),
            &json!({"spec": {"tolerations": [{"key": "k2"}]}, "status": {"containerStatuses": [{"name": "app", "ready": true}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["tolerations"], json!([{"key": "k2"}]));
        assert_eq!(out["status"]["containerStatuses"], json!([{"name": "app", "ready": true}]));
    }

    #[test]
    fn node_conditions_and_addresses() {
        let node = json!({"status": {
            "conditions": [{"type": "Ready", "status": "False"}, {"type": "MemoryPressure", "status": "False"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]
        }});
        let out = apply(
            "Node",
            &node,
            &json!({"status": {"conditions": [{"type": "Ready", "status": "True"}], "addresses": [{"type": "Hostname", "address": "n1"}]}}),
        )
        .unwrap();
        assert_eq!(out["status"]["conditions"][0]["status"], "True");
        assert_eq!(out["status"]["conditions"].as_array().unwrap().len(), 2);
        assert_eq!(out["status"]["addresses"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn replace_directives() {
        let out = apply(
            "Pod",
            &pod(),
            &json!({"spec": {"containers": [{"name": "only", "image": "i"}, {"$patch": "replace"}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["containers"], json!([{"name": "only", "image": "i"}]));
        let out = apply("Pod", &pod(), &json!({"metadata": {"labels": {"$patch": "replace", "y": "2"}}})).unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"y": "2"}));
        let out = apply("Pod", &pod(), &json!({"metadata": {"labels": {"$patch": "delete"}}})).unwrap();
        assert!(out["metadata"].get("labels").is_none());
    }

    #[test]
    fn finalizers_merge_as_a_set_and_delete_from_primitive_list() {
        let out = apply("Pod", &pod(), &json!({"metadata": {"finalizers": ["b", "a"]}})).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b"]));
        let out = apply("Pod", &pod(), &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}})).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!([]));
    }

    #[test]
    fn null_deletes_and_set_element_order_is_ignored() {
        let out = apply(
            "Pod",
            &pod(),
            &json!({"metadata": {"labels": {"x": null}}, "status": {"$setElementOrder/conditions": [{"type": "PodScheduled"}, {"type": "Ready"}]}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"], json!({}));
        assert_eq!(out["status"]["conditions"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn retain_keys() {
        let out = apply(
            "Pod",
            &json!({"spec": {"volumes": [{"name": "v", "emptyDir": {}, "hostPath": {"path": "/x"}}]}}),
            &json!({"spec": {"volumes": [{"name": "v", "$retainKeys": ["name", "hostPath"], "hostPath": {"path": "/y"}}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["volumes"], json!([{"name": "v", "hostPath": {"path": "/y"}}]));
    }

    #[test]
    fn deployment_template_containers_merge() {
        let d = json!({"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}]}}}});
        let out = apply(
            "Deployment",
            &d,
            &json!({"spec": {"template": {"spec": {"containers": [{"name": "b", "image": "2"}]}}}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["template"]["spec"]["containers"][1]["image"], "2");
        assert_eq!(out["spec"]["template"]["spec"]["containers"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn missing_merge_key_is_an_error() {
        assert!(apply("Pod", &pod(), &json!({"spec": {"containers": [{"image": "x"}]}})).is_err());
    }
}
