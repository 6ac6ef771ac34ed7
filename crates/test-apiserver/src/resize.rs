//! The `pods/resize` subresource (in-place pod resize, KEP-1287), as kube-apiserver 1.34
//! serves it: the resize strategy keeps only the containers' `resources` and
//! `resizePolicy` from the request (`keep_resize_fields`), and `ValidatePodResize` admits
//! only CPU/memory changes of regular and sidecar containers that keep the QoS class.

use gantry_vocab::quantity::parse_milli;
use serde_json::{Value, json};

use crate::pods::{is_mirror, qos_class};
use crate::status::{ApiError, FieldError};

const LISTS: [&str; 2] = ["initContainers", "containers"];
const RESIZABLE: [&str; 2] = ["cpu", "memory"];

/// Upstream's `dropNonResizeUpdates`: the stored pod with, per container matched by name,
/// the request's `resources` and `resizePolicy`. Everything else in the request is ignored.
pub fn keep_resize_fields(existing: &Value, request: &Value) -> Value {
    let mut out = existing.clone();
    for list in LISTS {
        let wanted = request.pointer(&format!("/spec/{list}")).and_then(Value::as_array).cloned().unwrap_or_default();
        let Some(stored) = out.pointer_mut(&format!("/spec/{list}")).and_then(Value::as_array_mut) else { continue };
        for c in stored.iter_mut() {
            let Some(new) = wanted.iter().find(|w| w.get("name") == c.get("name")) else { continue };
            for field in ["resources", "resizePolicy"] {
                match (new.get(field), c.as_object_mut()) {
                    (Some(v), Some(m)) => {
                        m.insert(field.into(), v.clone());
                    }
                    (None, Some(m)) => {
                        m.remove(field);
                    }
                    _ => {}
                }
            }
        }
    }
    out
}

/// `ValidatePodResize` (1.34) on the pod after `keep_resize_fields`.
pub fn validate(old: &Value, new: &Value) -> Result<(), ApiError> {
    let name = new.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    let invalid = |errs| ApiError::invalid("Pod", "", name, errs);
    if is_mirror(old) {
        return Err(invalid(vec![FieldError::forbidden("", "static pods cannot be resized")]));
    }
    if old.pointer("/spec/os/name").and_then(Value::as_str) == Some("windows") {
        return Err(invalid(vec![FieldError::forbidden("", "windows pods cannot be resized")]));
    }
    let mut errs = Vec::new();
    let old_qos = old.pointer("/status/qosClass").and_then(Value::as_str).unwrap_or_else(|| qos_class(&old["spec"]));
    if qos_class(&new["spec"]) != old_qos {
        errs.push(FieldError::invalid("spec", &json!(old_qos), "Pod QOS Class may not change as a result of resizing"));
    }
    for list in LISTS {
        let olds = old.pointer(&format!("/spec/{list}")).and_then(Value::as_array).cloned().unwrap_or_default();
        let news = new.pointer(&format!("/spec/{list}")).and_then(Value::as_array).cloned().unwrap_or_default();
        for (i, (o, n)) in olds.iter().zip(&news).enumerate() {
            errs.extend(validate_container(list, i, o, n));
        }
    }
    if errs.is_empty() { Ok(()) } else { Err(invalid(errs)) }
}

/// One container: requests/limits not removed, only cpu/memory changed (and only for
/// regular containers and sidecars), every request at most its limit.
fn validate_container(list: &str, i: usize, old: &Value, new: &Value) -> Vec<FieldError> {
    let path = format!("spec.{list}[{i}].resources");
    let mut errs = Vec::new();
    for kind in ["requests", "limits"] {
        let keys = |c: &Value| -> Vec<String> {
            c.pointer(&format!("/resources/{kind}"))
                .and_then(Value::as_object)
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default()
        };
        let now = keys(new);
        if keys(old).iter().any(|k| !now.contains(k)) {
            errs.push(FieldError::forbidden(&format!("{path}.{kind}"), &format!("resource {kind} cannot be removed")));
        }
    }
    let sidecar = new.get("restartPolicy").and_then(Value::as_str) == Some("Always");
    let refused = match list {
        "containers" if without_cpu_memory(new, old) != *old => Some("only cpu and memory resources are mutable"),
        "initContainers" if sidecar && without_cpu_memory(new, old) != *old => {
            Some("only cpu and memory resources for sidecar containers are mutable")
        }
        "initContainers" if !sidecar && new != old => Some("resources for non-sidecar init containers are immutable"),
        _ => None,
    };
    if let Some(detail) = refused {
        errs.push(FieldError::forbidden("spec", detail));
    }
    for r in RESIZABLE {
        let get = |kind: &str| new.pointer(&format!("/resources/{kind}/{r}")).and_then(Value::as_str);
        let (Some(request), Some(limit)) = (get("requests"), get("limits")) else { continue };
        if let (Ok(q), Ok(l)) = (parse_milli(request), parse_milli(limit))
            && q > l
        {
            errs.push(FieldError::invalid(
                &format!("{path}.requests"),
                &json!(request),
                &format!("must be less than or equal to {r} limit of {limit}"),
            ));
        }
    }
    errs
}

/// `new` with its cpu/memory requests and limits put back to `old`'s (upstream's
/// `dropCPUMemoryResourcesFromContainer`): equal to `old` iff nothing else changed.
fn without_cpu_memory(new: &Value, old: &Value) -> Value {
    let mut out = new.clone();
    for kind in ["requests", "limits"] {
        let old_map = old.pointer(&format!("/resources/{kind}")).and_then(Value::as_object).cloned();
        let Some(map) = out.pointer_mut(&format!("/resources/{kind}")).and_then(Value::as_object_mut) else { continue };
        for r in RESIZABLE {
            match old_map.as_ref().and_then(|m| m.get(r)) {
                Some(v) => {
                    map.insert(r.into(), v.clone());
                }
                None => {
                    map.remove(r);
                }
            }
        }
        if map.is_empty() && old_map.is_none() {
            out["resources"].as_object_mut().map(|m| m.remove(kind));
        }
    }
    out
}
