//! apps/v1 StatefulSets and storage.k8s.io/v1 StorageClasses as the real API server stores
//! them: the API's defaults on create, the validation a client meets (a StatefulSet's selector
//! must select its template, its pods restart `Always`; a StorageClass names a provisioner),
//! and the fields an update may not change. No controller acts on them here: a test plays the
//! StatefulSet controller and the provisioner.

use serde_json::{Value, json};

use crate::meta;
use crate::selectors::LabelSelector;
use crate::status::{ApiError, ApiResult, FieldError};

/// `SetDefaults_StatefulSet` (apps/v1) with the gates of a v1.34 server, the status reset, and
/// `ValidateStatefulSet`'s rules on the selector and the template.
pub fn prepare_stateful_set(obj: &mut Value) -> ApiResult<()> {
    if !obj["spec"].is_object() {
        obj["spec"] = json!({});
    }
    let spec = &mut obj["spec"];
    for (field, value) in [
        ("replicas", json!(1)),
        ("podManagementPolicy", json!("OrderedReady")),
        ("revisionHistoryLimit", json!(10)),
        ("persistentVolumeClaimRetentionPolicy", json!({"whenDeleted": "Retain", "whenScaled": "Retain"})),
    ] {
        if spec.get(field).is_none_or(Value::is_null) {
            spec[field] = value;
        }
    }
    if spec.pointer("/updateStrategy/type").is_none_or(Value::is_null) {
        spec["updateStrategy"] = json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}});
    } else if spec["updateStrategy"]["type"] == "RollingUpdate"
        && spec.pointer("/updateStrategy/rollingUpdate").is_some_and(Value::is_object)
        && spec.pointer("/updateStrategy/rollingUpdate/partition").is_none()
    {
        spec["updateStrategy"]["rollingUpdate"]["partition"] = json!(0);
    }
    for template in spec.get_mut("volumeClaimTemplates").and_then(Value::as_array_mut).into_iter().flatten() {
        if template.pointer("/spec/volumeMode").is_none() && template["spec"].is_object() {
            template["spec"]["volumeMode"] = json!("Filesystem");
        }
    }
    obj["status"] = json!({"replicas": 0, "availableReplicas": 0});
    validate_stateful_set(obj)
}

fn validate_stateful_set(obj: &Value) -> ApiResult<()> {
    let spec = &obj["spec"];
    let mut errors = Vec::new();
    let selector = spec.get("selector").filter(|s| s.is_object());
    match selector.map(LabelSelector::from_object) {
        None => errors.push(FieldError::required("spec.selector", "")),
        Some(Err(e)) => errors.push(FieldError::invalid("spec.selector", &spec["selector"], &e.to_string())),
        Some(Ok(s)) if s.is_empty() => errors.push(FieldError::invalid(
            "spec.selector",
            &spec["selector"],
            "empty selector is invalid for statefulset",
        )),
        Some(Ok(s)) => {
            let labels = spec.pointer("/template/metadata/labels");
            if !s.matches(labels.and_then(Value::as_object)) {
                let shown = labels.cloned().unwrap_or(json!({}));
                errors.push(FieldError::invalid(
                    "spec.template.metadata.labels",
                    &shown,
                    "`selector` does not match template `labels`",
                ));
            }
        }
    }
    if let Some(policy) = spec.pointer("/template/spec/restartPolicy").and_then(Value::as_str)
        && policy != "Always"
    {
        errors.push(FieldError::not_supported("spec.template.spec.restartPolicy", &json!(policy), &["Always"]));
    }
    if errors.is_empty() { Ok(()) } else { Err(ApiError::invalid("StatefulSet", "apps", meta::name(obj), errors)) }
}

/// The spec fields of a StatefulSet an update may change (`ValidateStatefulSetUpdate`).
const STATEFUL_SET_MUTABLE: &[&str] =
    &["replicas", "ordinals", "template", "updateStrategy", "persistentVolumeClaimRetentionPolicy", "minReadySeconds"];

pub fn validate_stateful_set_update(existing: &Value, new: &mut Value) -> ApiResult<()> {
    let strip = |v: &Value| {
        let mut spec = v["spec"].clone();
        if let Some(m) = spec.as_object_mut() {
            m.retain(|k, _| !STATEFUL_SET_MUTABLE.contains(&k.as_str()));
        }
        spec
    };
    if strip(existing) != strip(new) {
        let detail = "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', \
                      'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden";
        return Err(ApiError::invalid(
            "StatefulSet",
            "apps",
            meta::name(new),
            vec![FieldError::forbidden("spec", detail)],
        ));
    }
    validate_stateful_set(new)
}

/// `SetDefaults_StorageClass` and `ValidateStorageClass`'s provisioner rule.
pub fn prepare_storage_class(obj: &mut Value) -> ApiResult<()> {
    for (field, value) in [("reclaimPolicy", "Delete"), ("volumeBindingMode", "Immediate")] {
        if obj.get(field).is_none_or(Value::is_null) {
            obj[field] = json!(value);
        }
    }
    if obj.get("provisioner").and_then(Value::as_str).is_none_or(str::is_empty) {
        return Err(ApiError::invalid(
            "StorageClass",
            "storage.k8s.io",
            meta::name(obj),
            vec![FieldError::required("provisioner", "")],
        ));
    }
    Ok(())
}

/// `ValidateStorageClassUpdate`: the provisioner, parameters, reclaim policy and binding mode
/// are fixed once created.
pub fn validate_storage_class_update(existing: &Value, new: &Value) -> ApiResult<()> {
    let mut errors = Vec::new();
    if existing.get("parameters") != new.get("parameters") {
        errors.push(FieldError::forbidden("parameters", "updates to parameters are forbidden."));
    }
    if existing.get("provisioner") != new.get("provisioner") {
        errors.push(FieldError::forbidden("provisioner", "updates to provisioner are forbidden."));
    }
    if existing.get("reclaimPolicy") != new.get("reclaimPolicy") {
        errors.push(FieldError::forbidden("reclaimPolicy", "updates to reclaimPolicy are forbidden."));
    }
    if existing.get("volumeBindingMode") != new.get("volumeBindingMode") {
        errors.push(FieldError::invalid("volumeBindingMode", &new["volumeBindingMode"], "field is immutable"));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid("StorageClass", "storage.k8s.io", meta::name(new), errors))
    }
}
