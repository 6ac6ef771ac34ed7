//! Per-type rules layered on the generic operations: defaulting and status reset on
//! create, update checks, namespace lifecycle, CRD registration, and the hooks that keep
//! derived state (PDB status, served custom resources) in step with writes.

use std::collections::BTreeSet;

use base64::Engine;
use serde_json::{Value, json};

use crate::meta;
use crate::ops::{self, DeleteOptions, Deleted, WriteCtx};
use crate::pdb;
use crate::pods;
use crate::resources::{CrdSpec, ResourceType};
use crate::status::{ApiError, ApiResult, FieldError, GroupResource};
use crate::storage_workloads;
use crate::store::StoreInner;

/// Namespaces every cluster starts with; the first three may not be deleted.
pub const INITIAL_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];
const UNDELETABLE_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public"];

fn key(rt: &ResourceType) -> (&str, &str) {
    (rt.group.as_str(), rt.plural.as_str())
}

pub fn prepare_create(inner: &StoreInner, ctx: &WriteCtx<'_>, obj: &mut Value) -> ApiResult<()> {
    let rt = ctx.rt;
    match key(rt) {
        ("", "pods") => pods::prepare_create(inner, obj)?,
        ("", "namespaces") => {
            let name = meta::name(obj).to_string();
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
            obj["status"] = json!({"phase": "Active"});
            if !obj["metadata"]["labels"].is_object() {
                obj["metadata"]["labels"] = json!({});
            }
            obj["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
        }
        ("", "services") => prepare_service(inner, obj, None)?,
        ("", "secrets") => {
            fold_string_data(obj);
            if obj.get("type").is_none() {
                obj["type"] = json!("Opaque");
            }
        }
        ("", "persistentvolumeclaims") => obj["status"] = json!({"phase": "Pending"}),
        ("", "persistentvolumes") => obj["status"] = json!({"phase": "Pending"}),
        ("storage.k8s.io", "csidrivers") => default_csi_driver(obj),
        ("storage.k8s.io", "volumeattachments") => obj["status"] = json!({"attached": false}),
        ("apps", "statefulsets") => storage_workloads::prepare_stateful_set(obj)?,
        ("storage.k8s.io", "storageclasses") => storage_workloads::prepare_storage_class(obj)?,
        ("apps", "deployments" | "replicasets") => {
            if obj.pointer("/spec/replicas").is_none() && obj["spec"].is_object() {
                obj["spec"]["replicas"] = json!(1);
            }
            obj["status"] = json!({});
        }
        ("apps", "daemonsets") => {
            obj["status"] = json!({"currentNumberScheduled": 0, "desiredNumberScheduled": 0, "numberMisscheduled": 0, "numberReady": 0});
        }
        ("policy", "poddisruptionbudgets") => {
            obj["status"] =
                json!({"currentHealthy": 0, "desiredHealthy": 0, "disruptionsAllowed": 0, "expectedPods": 0});
        }
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            CrdSpec::parse(obj)?;
            obj["status"] = crd_status(obj);
        }
        ("certificates.k8s.io", "certificatesigningrequests") => crate::csr::prepare_create(ctx.user, obj)?,
        _ if rt.custom && rt.has_status() => {
            if let Some(m) = obj.as_object_mut() {
                m.remove("status");
            }
        }
        _ => {}
    }
    Ok(())
}

/// The API's defaults for a CSIDriver (storage.k8s.io/v1 `SetDefaults_CSIDriverSpec`).
fn default_csi_driver(obj: &mut Value) {
    if !obj["spec"].is_object() {
        obj["spec"] = json!({});
    }
    let spec = &mut obj["spec"];
    for (field, value) in [
        ("attachRequired", json!(true)),
        ("podInfoOnMount", json!(false)),
        ("storageCapacity", json!(false)),
        ("fsGroupPolicy", json!("ReadWriteOnceWithFSType")),
        ("requiresRepublish", json!(false)),
        ("seLinuxMount", json!(false)),
        ("volumeLifecycleModes", json!(["Persistent"])),
    ] {
        if spec.get(field).is_none_or(Value::is_null) {
            spec[field] = value;
        }
    }
}

pub fn prepare_update(_inner: &StoreInner, ctx: &WriteCtx<'_>, existing: &Value, new: &mut Value) -> ApiResult<()> {
    match (key(ctx.rt), ctx.subresource) {
        (("", "pods"), "") => pods::validate_update(existing, new)?,
        (("", "pods"), "status") => pods::validate_status(new)?,
        (("", "pods"), "ephemeralcontainers") => pods::add_ephemeral_containers(existing, new)?,
        (("", "pods"), "resize") => crate::resize::validate(existing, new)?,
        (("", "secrets"), _) => fold_string_data(new),
        (("", "services"), "") => prepare_service(_inner, new, Some(existing))?,
        (("apps", "statefulsets"), "") => storage_workloads::validate_stateful_set_update(existing, new)?,
        (("storage.k8s.io", "storageclasses"), _) => storage_workloads::validate_storage_class_update(existing, new)?,
        // spec.finalizers changes only through the finalize subresource (not served here).
        (("", "namespaces"), _) => new["spec"] = existing["spec"].clone(),
        (("certificates.k8s.io", "certificatesigningrequests"), sub) => crate::csr::prepare_update(sub, existing, new)?,
        (("apiextensions.k8s.io", "customresourcedefinitions"), _) => {
            CrdSpec::parse(new)?;
            if ctx.subresource.is_empty() {
                new["status"] = crd_status(new);
            }
        }
        _ => {}
    }
    Ok(())
}

/// Resource-specific deletion; `Some` when the resource handled it entirely.
pub fn before_delete(
    inner: &mut StoreInner,
    ctx: &WriteCtx<'_>,
    existing: &Value,
    opts: &DeleteOptions,
) -> ApiResult<Option<Deleted>> {
    if key(ctx.rt) != ("", "namespaces") {
        return Ok(None);
    }
    let name = meta::name(existing).to_string();
    if UNDELETABLE_NAMESPACES.contains(&name.as_str()) {
        return Err(ApiError::forbidden(
            &GroupResource::new("", "namespaces"),
            &name,
            "this namespace may not be deleted",
        ));
    }
    if ctx.dry_run || opts.dry_run {
        return Ok(Some(Deleted::Pending(ops::present(ctx.rt, existing))));
    }
    if meta::is_deleting(existing) {
        return Ok(Some(Deleted::Pending(ops::present(ctx.rt, existing))));
    }
    // Namespace deletion: mark Terminating, delete the content, remove the namespace once empty.
    let mut terminating = existing.clone();
    meta::set_meta(&mut terminating, "deletionTimestamp", Some(json!(meta::now())));
    meta::set_meta(&mut terminating, "deletionGracePeriodSeconds", Some(json!(0)));
    terminating["status"]["phase"] = json!("Terminating");
    let stored = inner.put("namespaces", terminating);
    delete_namespace_content(inner, ctx, &name);
    let finished = finish_namespace(inner, &name);
    let shown = finished.unwrap_or_else(|| (*stored).clone());
    Ok(Some(Deleted::Pending(ops::present(ctx.rt, &shown))))
}

fn delete_namespace_content(inner: &mut StoreInner, ctx: &WriteCtx<'_>, ns: &str) {
    for storage in inner.storages_in_namespace(ns) {
        let (group, plural) = storage.split_once('/').unwrap_or(("", storage.as_str()));
        let Some(rt) = inner.registry.by_group_resource(group, plural) else { continue };
        for obj in inner.list(&storage, Some(ns)) {
            let sub = WriteCtx { user: ctx.user, rt: &rt, namespace: ns, subresource: "", dry_run: false };
            // Errors (e.g. an object already gone) do not stop namespace cleanup.
            let _ = ops::delete(inner, &sub, meta::name(&obj), &DeleteOptions::default());
        }
    }
}

/// Removes a terminating namespace once nothing is left in it; returns its last state.
fn finish_namespace(inner: &mut StoreInner, ns: &str) -> Option<Value> {
    let namespace = inner.get("namespaces", "", ns)?;
    if !meta::is_deleting(&namespace) || inner.namespace_has_objects(ns) || !meta::finalizers(&namespace).is_empty() {
        return None;
    }
    inner.remove("namespaces", "", ns).map(|o| (*o).clone())
}

/// Keeps derived state in step after a write of `rt` in `ns` (`new` None: deleted).
pub fn after_write(inner: &mut StoreInner, rt: &ResourceType, ns: &str, new: Option<&Value>, old: Option<&Value>) {
    match key(rt) {
        ("", "pods")
        | ("policy", "poddisruptionbudgets")
        | ("apps", "replicasets" | "deployments" | "statefulsets") => pdb::sync_namespace(inner, ns),
        ("", "namespaces") if old.is_none() => {
            if let Some(created) = new {
                populate_namespace(inner, meta::name(created));
            }
        }
        ("apiextensions.k8s.io", "customresourcedefinitions") => match new {
            Some(crd) => {
                // Validated before the write; a failure here cannot happen.
                let _ = inner.registry.register_crd(crd);
            }
            None => {
                if let Some(gone) = old {
                    drop_custom_resources(inner, gone);
                }
            }
        },
        _ => {}
    }
    if !ns.is_empty() && new.is_none() {
        finish_namespace(inner, ns);
    }
}

/// What the service account and root CA publisher controllers put in every namespace.
fn populate_namespace(inner: &mut StoreInner, ns: &str) {
    if inner.get("serviceaccounts", ns, "default").is_none() {
        system_create(
            inner,
            "serviceaccounts",
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}}),
        );
    }
    if inner.get("configmaps", ns, "kube-root-ca.crt").is_none() {
        let ca = inner.ca_pem.clone();
        system_create(
            inner,
            "configmaps",
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "kube-root-ca.crt", "namespace": ns,
                                "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
                   "data": {"ca.crt": ca}}),
        );
    }
}

/// Stores an object written by a built-in controller (no admission, no validation).
pub fn system_create(inner: &mut StoreInner, storage: &str, mut obj: Value) -> Value {
    meta::set_meta(&mut obj, "uid", Some(json!(meta::new_uid())));
    meta::set_meta(&mut obj, "creationTimestamp", Some(json!(meta::now())));
    let stored = (*inner.put(storage, obj)).clone();
    if storage == "namespaces" {
        populate_namespace(inner, meta::name(&stored));
    }
    stored
}

/// Creates a namespace as the server does at start.
pub fn bootstrap_namespace(inner: &mut StoreInner, name: &str) {
    system_create(
        inner,
        "namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
               "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}),
    );
}

/// A deleted CRD takes its custom resources with it.
fn drop_custom_resources(inner: &mut StoreInner, crd: &Value) {
    let group = meta::str_at(crd, "/spec/group").to_string();
    let plural = meta::str_at(crd, "/spec/names/plural").to_string();
    let storage = format!("{group}/{plural}");
    for obj in inner.list(&storage, None) {
        inner.remove(&storage, meta::namespace(&obj), meta::name(&obj));
    }
    inner.registry.unregister_crd(&group, &plural);
}

fn crd_status(crd: &Value) -> Value {
    let names = crd.pointer("/spec/names").cloned().unwrap_or_else(|| json!({}));
    let mut accepted = names.clone();
    let kind = meta::str_at(&names, "/kind").to_string();
    if accepted.get("singular").is_none() {
        accepted["singular"] = json!(kind.to_lowercase());
    }
    if accepted.get("listKind").is_none() {
        accepted["listKind"] = json!(format!("{kind}List"));
    }
    let storage = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .and_then(|v| v.get("name").cloned())
        .unwrap_or_else(|| json!("v1"));
    let mut stored: Vec<Value> =
        crd.pointer("/status/storedVersions").and_then(Value::as_array).cloned().unwrap_or_default();
    if !stored.contains(&storage) {
        stored.push(storage);
    }
    let since = crd.pointer("/status/conditions/0/lastTransitionTime").cloned().unwrap_or_else(|| json!(meta::now()));
    json!({
        "acceptedNames": accepted,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": since},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": since}
        ],
        "storedVersions": stored,
    })
}

/// Secrets: `stringData` is write-only and folds into base64 `data`.
fn fold_string_data(obj: &mut Value) {
    let Some(string_data) = obj.as_object_mut().and_then(|m| m.remove("stringData")) else { return };
    let Some(entries) = string_data.as_object() else { return };
    if !obj["data"].is_object() {
        obj["data"] = json!({});
    }
    for (k, v) in entries {
        let text = v.as_str().unwrap_or_default();
        obj["data"][k] = json!(base64::engine::general_purpose::STANDARD.encode(text));
    }
}

fn used_service_values(inner: &StoreInner, pointer_fn: impl Fn(&Value) -> Vec<String>) -> BTreeSet<String> {
    inner.list("services", None).iter().flat_map(|s| pointer_fn(s)).collect()
}

/// Services: allocate a ClusterIP (10.96.0.0/16) and node ports, default ports' protocol
/// and targetPort; the ClusterIP cannot change once set.
fn prepare_service(inner: &StoreInner, svc: &mut Value, old: Option<&Value>) -> ApiResult<()> {
    if !svc["spec"].is_object() {
        svc["spec"] = json!({});
    }
    let name = meta::name(svc).to_string();
    let spec_type = meta::str_at(svc, "/spec/type").to_string();
    let spec_type = if spec_type.is_empty() { "ClusterIP".to_string() } else { spec_type };
    svc["spec"]["type"] = json!(spec_type);
    if let Some(old) = old {
        let old_ip = meta::str_at(old, "/spec/clusterIP");
        let new_ip = meta::str_at(svc, "/spec/clusterIP").to_string();
        if new_ip.is_empty() {
            svc["spec"]["clusterIP"] = json!(old_ip);
            svc["spec"]["clusterIPs"] = old.pointer("/spec/clusterIPs").cloned().unwrap_or(json!([old_ip]));
        } else if new_ip != old_ip {
            return Err(ApiError::invalid(
                "Service",
                "",
                &name,
                vec![FieldError::invalid("spec.clusterIPs[0]", &json!(new_ip), "may not change once set")],
            ));
        }
    } else if spec_type != "ExternalName" && meta::str_at(svc, "/spec/clusterIP").is_empty() {
        let used = used_service_values(inner, |s| vec![meta::str_at(s, "/spec/clusterIP").to_string()]);
        let ip = (10..65_534u32)
            .map(|n| format!("10.96.{}.{}", n / 256, n % 256))
            .find(|ip| !used.contains(ip))
            .ok_or_else(|| ApiError::internal("failed to allocate a serviceIP: range is full"))?;
        svc["spec"]["clusterIP"] = json!(ip);
        svc["spec"]["clusterIPs"] = json!([ip]);
    }
    if spec_type != "ExternalName" {
        let spec = svc["spec"].as_object_mut().expect("object");
        spec.entry("sessionAffinity").or_insert(json!("None"));
        spec.entry("internalTrafficPolicy").or_insert(json!("Cluster"));
        spec.entry("ipFamilies").or_insert(json!(["IPv4"]));
        spec.entry("ipFamilyPolicy").or_insert(json!("SingleStack"));
    }
    let used_ports = used_service_values(inner, |s| {
        s.pointer("/spec/ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|p| p.get("nodePort").and_then(Value::as_i64).map(|n| n.to_string()))
            .collect()
    });
    let needs_node_port = spec_type == "NodePort" || spec_type == "LoadBalancer";
    let mut next_port = 30000;
    for port in svc.pointer_mut("/spec/ports").and_then(Value::as_array_mut).into_iter().flatten() {
        let Some(p) = port.as_object_mut() else { continue };
        p.entry("protocol").or_insert(json!("TCP"));
        if let Some(number) = p.get("port").cloned() {
            p.entry("targetPort").or_insert(number);
        }
        if needs_node_port && p.get("nodePort").is_none() {
            while used_ports.contains(&next_port.to_string()) {
                next_port += 1;
            }
            p.insert("nodePort".into(), json!(next_port));
            next_port += 1;
        }
    }
    if old.is_none() {
        svc["status"] = json!({"loadBalancer": {}});
    }
    Ok(())
}

/// The `kubernetes` service in `default`, pointing at this server, as on a real cluster.
pub fn bootstrap_kubernetes_service(inner: &mut StoreInner, port: u16) {
    system_create(
        inner,
        "services",
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "kubernetes", "namespace": "default", "labels": {"component": "apiserver", "provider": "kubernetes"}},
               "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"],
                        "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}],
                        "sessionAffinity": "None", "internalTrafficPolicy": "Cluster", "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack"},
               "status": {"loadBalancer": {}}}),
    );
    system_create(
        inner,
        "endpoints",
        json!({"apiVersion": "v1", "kind": "Endpoints",
               "metadata": {"name": "kubernetes", "namespace": "default", "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
               "subsets": [{"addresses": [{"ip": "127.0.0.1"}], "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}]}),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_data_folds_into_data() {
        let mut s = json!({"stringData": {"a": "hello"}, "data": {"b": "eA=="}});
        fold_string_data(&mut s);
        assert_eq!(s, json!({"data": {"a": "aGVsbG8=", "b": "eA=="}}));
    }
}
