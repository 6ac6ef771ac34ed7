//! Pod-specific rules: defaulting and admission on create (status Pending, QoS class,
//! service account and its token volume), the update restrictions on `spec`, graceful
//! deletion timing, and which objects a pod references (for the Node authorizer).

use std::borrow::Cow;
use std::collections::HashMap;

use serde_json::{Map, Value, json};

use crate::status::{ApiError, FieldError, GroupResource};
use crate::store::StoreInner;

pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
const DEFAULT_GRACE_SECONDS: i64 = 30;
const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

pub fn is_mirror(pod: &Value) -> bool {
    pod.pointer("/metadata/annotations").and_then(Value::as_object).is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
}

fn container_lists() -> [&'static str; 3] {
    ["initContainers", "containers", "ephemeralContainers"]
}

fn set_default(map: &mut Map<String, Value>, key: &str, value: Value) {
    map.entry(key.to_string()).or_insert(value);
}

/// Whether an image reference has no tag (or `:latest`), which defaults imagePullPolicy to
/// Always.
fn pulls_always(image: &str) -> bool {
    if image.contains('@') {
        return false;
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rsplit_once(':') {
        Some((_, tag)) => tag == "latest",
        None => true,
    }
}

fn default_probe(probe: &mut Value) {
    if let Some(p) = probe.as_object_mut() {
        set_default(p, "timeoutSeconds", json!(1));
        set_default(p, "periodSeconds", json!(10));
        set_default(p, "successThreshold", json!(1));
        set_default(p, "failureThreshold", json!(3));
    }
}

fn default_container(c: &mut Map<String, Value>) {
    set_default(c, "terminationMessagePath", json!("/dev/termination-log"));
    set_default(c, "terminationMessagePolicy", json!("File"));
    set_default(c, "resources", json!({}));
    let image = c.get("image").and_then(Value::as_str).unwrap_or("").to_string();
    set_default(c, "imagePullPolicy", json!(if pulls_always(&image) { "Always" } else { "IfNotPresent" }));
    for port in c.get_mut("ports").and_then(Value::as_array_mut).into_iter().flatten() {
        if let Some(p) = port.as_object_mut() {
            set_default(p, "protocol", json!("TCP"));
        }
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(p) = c.get_mut(probe) {
            default_probe(p);
        }
    }
    for env in c.get_mut("env").and_then(Value::as_array_mut).into_iter().flatten() {
        if let Some(field_ref) = env.pointer_mut("/valueFrom/fieldRef").and_then(Value::as_object_mut) {
            set_default(field_ref, "apiVersion", json!("v1"));
        }
    }
}

fn default_volume(v: &mut Map<String, Value>) {
    for source in ["secret", "configMap", "projected", "downwardAPI"] {
        if let Some(s) = v.get_mut(source).and_then(Value::as_object_mut) {
            set_default(s, "defaultMode", json!(420));
        }
    }
}

/// The defaults kube-apiserver's defaulting and admission plugins (ServiceAccount,
/// DefaultTolerationSeconds, Priority) apply to a new pod, and its initial status.
/// `SetDefaults_Pod`: a limit without a request makes the request equal to the limit (for
/// regular and init containers).
fn default_requests_to_limits(c: &mut Map<String, Value>) {
    let Some(resources) = c.get_mut("resources").and_then(Value::as_object_mut) else { return };
    let Some(limits) = resources.get("limits").and_then(Value::as_object).cloned() else { return };
    let requests = resources.entry("requests").or_insert_with(|| json!({}));
    if !requests.is_object() {
        *requests = json!({});
    }
    if let Some(requests) = requests.as_object_mut() {
        for (name, value) in limits {
            requests.entry(name).or_insert(value);
        }
    }
}

/// `setDefaultResizePolicy` (1.33+): a container that requests or limits cpu or memory gets
/// `NotRequired` for each such resource its `resizePolicy` does not name.
fn default_resize_policy(c: &mut Map<String, Value>) {
    let named = |c: &Map<String, Value>, r: &str| {
        c.get("resizePolicy")
            .and_then(Value::as_array)
            .is_some_and(|l| l.iter().any(|p| p.get("resourceName").and_then(Value::as_str) == Some(r)))
    };
    let uses = |c: &Map<String, Value>, r: &str| {
        ["requests", "limits"]
            .iter()
            .any(|k| c.get("resources").and_then(|res| res.get(*k)).and_then(|m| m.get(r)).is_some())
    };
    for r in ["cpu", "memory"] {
        if uses(c, r) && !named(c, r) {
            let list = c.entry("resizePolicy").or_insert_with(|| json!([]));
            if let Some(l) = list.as_array_mut() {
                l.push(json!({"resourceName": r, "restartPolicy": "NotRequired"}));
            }
        }
    }
}

pub fn prepare_create(inner: &StoreInner, pod: &mut Value) -> Result<(), ApiError> {
    let mirror = is_mirror(pod);
    let ns = pod.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("").to_string();
    let name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
    validate_spec(pod, &name)?;
    let windows = pod.pointer("/spec/os/name").and_then(Value::as_str) == Some("windows");
    let spec = pod["spec"].as_object_mut().expect("validated");
    set_default(spec, "restartPolicy", json!("Always"));
    set_default(spec, "terminationGracePeriodSeconds", json!(DEFAULT_GRACE_SECONDS));
    set_default(spec, "dnsPolicy", json!("ClusterFirst"));
    set_default(spec, "schedulerName", json!("default-scheduler"));
    set_default(spec, "securityContext", json!({}));
    set_default(spec, "enableServiceLinks", json!(true));
    // Priority admission: the built-in classes resolve to their values (no PriorityClass
    // objects are served, so any other class resolves like no class: 0).
    let class_priority = match spec.get("priorityClassName").and_then(Value::as_str) {
        Some("system-node-critical") => 2_000_001_000,
        Some("system-cluster-critical") => 2_000_000_000,
        _ => 0,
    };
    set_default(spec, "priority", json!(class_priority));
    set_default(spec, "preemptionPolicy", json!("PreemptLowerPriority"));
    for list in container_lists() {
        for c in spec.get_mut(list).and_then(Value::as_array_mut).into_iter().flatten() {
            if let Some(c) = c.as_object_mut() {
                default_container(c);
                if list != "ephemeralContainers" {
                    default_requests_to_limits(c);
                }
                let resizable =
                    list == "containers" || c.get("restartPolicy").and_then(Value::as_str) == Some("Always");
                if resizable && !windows {
                    default_resize_policy(c);
                }
            }
        }
    }
    for v in spec.get_mut("volumes").and_then(Value::as_array_mut).into_iter().flatten() {
        if let Some(v) = v.as_object_mut() {
            default_volume(v);
        }
    }
    add_default_tolerations(spec);
    if !mirror {
        admit_service_account(inner, &ns, &name, spec)?;
    }
    let qos = qos_class(&pod["spec"]);
    pod["status"] = json!({"phase": "Pending", "qosClass": qos});
    Ok(())
}

fn validate_spec(pod: &Value, name: &str) -> Result<(), ApiError> {
    let mut errs = Vec::new();
    match pod.pointer("/spec/containers").and_then(Value::as_array) {
        Some(cs) if !cs.is_empty() => {
            for (i, c) in cs.iter().enumerate() {
                if c.get("name").and_then(Value::as_str).unwrap_or("").is_empty() {
                    errs.push(FieldError::required(&format!("spec.containers[{i}].name"), ""));
                }
                if c.get("image").and_then(Value::as_str).unwrap_or("").is_empty() {
                    errs.push(FieldError::required(&format!("spec.containers[{i}].image"), ""));
                }
            }
        }
        _ => errs.push(FieldError::required("spec.containers", "")),
    }
    if pod.pointer("/spec/ephemeralContainers").and_then(Value::as_array).is_some_and(|l| !l.is_empty()) {
        errs.push(FieldError::forbidden("spec.ephemeralContainers", "cannot be set on create"));
    }
    let never = pod.pointer("/spec/restartPolicy").and_then(Value::as_str) == Some("Never");
    for list in ["initContainers", "containers"] {
        for (i, c) in pod.pointer(&format!("/spec/{list}")).and_then(Value::as_array).into_iter().flatten().enumerate()
        {
            errs.extend(validate_resize_policy(c, &format!("spec.{list}[{i}].resizePolicy"), never));
            errs.extend(validate_recursive_read_only(c, &format!("spec.{list}[{i}].volumeMounts")));
        }
    }
    if errs.is_empty() { Ok(()) } else { Err(ApiError::invalid("Pod", "", name, errs)) }
}

/// `validateMountRecursiveReadOnly`: a known mode; other than `Disabled` only on a read-only
/// mount without propagation. Upstream names the field without the mount's index.
fn validate_recursive_read_only(c: &Value, field: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let field = format!("{field}.recursiveReadOnly");
    for m in c.get("volumeMounts").and_then(Value::as_array).into_iter().flatten() {
        let Some(mode) = m.get("recursiveReadOnly") else { continue };
        match mode.as_str() {
            Some("Disabled") => {}
            Some("Enabled" | "IfPossible") => {
                if m.get("readOnly").and_then(Value::as_bool) != Some(true) {
                    errs.push(FieldError::forbidden(&field, "may only be specified when readOnly is true"));
                }
                if m.get("mountPropagation").and_then(Value::as_str).is_some_and(|p| p != "None") {
                    let detail = "may only be specified when mountPropagation is None or not specified";
                    errs.push(FieldError::forbidden(&field, detail));
                }
            }
            _ => errs.push(FieldError::not_supported(&field, mode, &["Disabled", "Enabled", "IfPossible"])),
        }
    }
    errs
}

/// `validateResizePolicy`: each of cpu and memory at most once, with a known restart policy;
/// only `NotRequired` in a pod that never restarts its containers.
fn validate_resize_policy(c: &Value, field: &str, pod_never_restarts: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut seen = Vec::new();
    for (j, p) in c.get("resizePolicy").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let name = &p["resourceName"];
        match name.as_str() {
            Some(n @ ("cpu" | "memory")) if seen.contains(&n) => {
                errs.push(FieldError::duplicate(&format!("{field}[{j}].resourceName"), name));
            }
            Some(n @ ("cpu" | "memory")) => seen.push(n),
            _ => errs.push(FieldError::not_supported(&format!("{field}[{j}].resourceName"), name, &["cpu", "memory"])),
        }
        if !matches!(p["restartPolicy"].as_str(), Some("NotRequired" | "RestartContainer")) {
            errs.push(FieldError::not_supported(
                &format!("{field}[{j}].restartPolicy"),
                &p["restartPolicy"],
                &["NotRequired", "RestartContainer"],
            ));
        } else if pod_never_restarts && p["restartPolicy"].as_str() != Some("NotRequired") {
            errs.push(FieldError::invalid(
                &format!("{field}[{j}].restartPolicy"),
                &p["restartPolicy"],
                "must be 'NotRequired' when `restartPolicy` is 'Never'",
            ));
        }
    }
    errs
}

/// DefaultTolerationSeconds: tolerate not-ready/unreachable nodes for 300s unless set.
fn add_default_tolerations(spec: &mut Map<String, Value>) {
    let tolerations = spec.entry("tolerations").or_insert_with(|| json!([]));
    let Some(list) = tolerations.as_array_mut() else { return };
    for key in ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"] {
        let has = list.iter().any(|t| {
            let k = t.get("key").and_then(Value::as_str);
            let effect = t.get("effect").and_then(Value::as_str).unwrap_or("");
            (k == Some(key) || k.is_none()) && (effect.is_empty() || effect == "NoExecute")
        });
        if !has {
            list.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
        }
    }
}

/// The ServiceAccount admission plugin: default the account, require that it exists, give the
/// pod the account's image pull secrets when it names none itself, and mount its token through
/// a projected volume unless automounting is off.
fn admit_service_account(
    inner: &StoreInner,
    ns: &str,
    name: &str,
    spec: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    let sa_name = match spec.get("serviceAccountName").and_then(Value::as_str) {
        Some(s) if !s.is_empty() => s.to_string(),
        _ => spec
            .get("serviceAccount")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .unwrap_or("default")
            .to_string(),
    };
    spec.insert("serviceAccountName".into(), json!(sa_name));
    spec.insert("serviceAccount".into(), json!(sa_name));
    let Some(sa) = inner.get("serviceaccounts", ns, &sa_name) else {
        return Err(ApiError::forbidden(
            &GroupResource::new("", "pods"),
            name,
            &format!("error looking up service account {ns}/{sa_name}: serviceaccount \"{sa_name}\" not found"),
        ));
    };
    let pod_pull_secrets = spec.get("imagePullSecrets").and_then(Value::as_array).is_some_and(|l| !l.is_empty());
    if let Some(secrets) = sa.get("imagePullSecrets").filter(|_| !pod_pull_secrets) {
        spec.insert("imagePullSecrets".into(), secrets.clone());
    }
    let automount = spec
        .get("automountServiceAccountToken")
        .and_then(Value::as_bool)
        .or_else(|| sa.get("automountServiceAccountToken").and_then(Value::as_bool))
        .unwrap_or(true);
    let already_mounted = container_lists().iter().any(|l| {
        spec.get(*l).and_then(Value::as_array).into_iter().flatten().any(|c| {
            c.get("volumeMounts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|m| m.get("mountPath").and_then(Value::as_str) == Some(TOKEN_MOUNT_PATH))
        })
    });
    if !automount || already_mounted {
        return Ok(());
    }
    let volume_name = format!("kube-api-access-{}", crate::meta::random_suffix());
    let volumes = spec.entry("volumes").or_insert_with(|| json!([]));
    if let Some(v) = volumes.as_array_mut() {
        v.push(token_volume(&volume_name));
    }
    for list in ["initContainers", "containers"] {
        for c in spec.get_mut(list).and_then(Value::as_array_mut).into_iter().flatten() {
            let mounts = c.as_object_mut().map(|c| c.entry("volumeMounts").or_insert_with(|| json!([])));
            if let Some(Value::Array(m)) = mounts {
                m.push(json!({"name": volume_name, "readOnly": true, "mountPath": TOKEN_MOUNT_PATH}));
            }
        }
    }
    Ok(())
}

fn token_volume(name: &str) -> Value {
    json!({
        "name": name,
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ]
        }
    })
}

/// QoS class from container requests/limits (quantities compared as written).
pub fn qos_class(spec: &Value) -> &'static str {
    let containers: Vec<&Value> = ["initContainers", "containers"]
        .iter()
        .flat_map(|l| spec.get(*l).and_then(Value::as_array).into_iter().flatten())
        .collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in containers {
        let requests = c.pointer("/resources/requests").and_then(Value::as_object);
        let limits = c.pointer("/resources/limits").and_then(Value::as_object);
        for r in ["cpu", "memory"] {
            let req = requests.and_then(|m| m.get(r));
            let lim = limits.and_then(|m| m.get(r));
            any |= req.is_some() || lim.is_some();
            match (req, lim) {
                (_, None) => guaranteed = false,
                (Some(q), Some(l)) if q != l => guaranteed = false,
                _ => {}
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

/// ValidatePodUpdate: the spec may only change images, activeDeadlineSeconds, added
/// tolerations, and (from a negative value to 1) terminationGracePeriodSeconds.
pub fn validate_update(old: &Value, new: &Value) -> Result<(), ApiError> {
    let mut allowed = old["spec"].clone();
    let new_spec = &new["spec"];
    for list in ["containers", "initContainers"] {
        let (Some(a), Some(n)) =
            (allowed.get_mut(list).and_then(Value::as_array_mut), new_spec.get(list).and_then(Value::as_array))
        else {
            continue;
        };
        if a.len() != n.len() {
            continue;
        }
        for (ac, nc) in a.iter_mut().zip(n) {
            if let Some(image) = nc.get("image") {
                ac["image"] = image.clone();
            }
        }
    }
    copy_field(&mut allowed, new_spec, "activeDeadlineSeconds");
    let old_tolerations = old.pointer("/spec/tolerations").and_then(Value::as_array).cloned().unwrap_or_default();
    let new_tolerations = new_spec.get("tolerations").and_then(Value::as_array).cloned().unwrap_or_default();
    if old_tolerations.iter().all(|t| new_tolerations.contains(t)) {
        copy_field(&mut allowed, new_spec, "tolerations");
    }
    let old_grace = old.pointer("/spec/terminationGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(0);
    if old_grace < 0 && new_spec.get("terminationGracePeriodSeconds").and_then(Value::as_i64) == Some(1) {
        copy_field(&mut allowed, new_spec, "terminationGracePeriodSeconds");
    }
    if allowed == *new_spec {
        return Ok(());
    }
    let name = new.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    Err(ApiError::invalid(
        "Pod",
        "",
        name,
        vec![FieldError::forbidden(
            "spec",
            "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
        )],
    ))
}

/// The checks `ValidatePodStatusUpdate` (1.34, unchanged in 1.35) makes on the fields a kubelet
/// reports: `observedGeneration` (pod and conditions) non-negative, the container `user` ids in
/// the uid/gid range, and no Linux `user` for a pod whose `spec.os` is Windows.
pub fn validate_status(pod: &Value) -> Result<(), ApiError> {
    let status = &pod["status"];
    let mut errs = Vec::new();
    let mut nonnegative = |field: String, v: Option<&Value>| {
        if let Some(v) = v.filter(|v| v.as_i64().is_some_and(|n| n < 0)) {
            errs.push(FieldError::invalid(&field, v, "must be greater than or equal to 0"));
        }
    };
    nonnegative("status.observedGeneration".into(), status.get("observedGeneration"));
    for (i, c) in status.get("conditions").and_then(Value::as_array).into_iter().flatten().enumerate() {
        nonnegative(format!("status.conditions[{i}].observedGeneration"), c.get("observedGeneration"));
    }
    let windows = pod.pointer("/spec/os/name").and_then(Value::as_str) == Some("windows");
    for list in ["initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"] {
        for (i, cs) in status.get(list).and_then(Value::as_array).into_iter().flatten().enumerate() {
            let (linux, field) = (&cs["user"]["linux"], format!("status.{list}[{i}].user.linux"));
            if windows && !linux.is_null() {
                errs.push(FieldError::forbidden(&field, "cannot be set for a windows pod"));
            } else if !windows {
                errs.extend(validate_container_user(linux, &field));
            }
        }
    }
    if errs.is_empty() {
        return Ok(());
    }
    let name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    Err(ApiError::invalid("Pod", "", name, errs))
}

/// `IsValidUserID`/`IsValidGroupID` on the ids of a reported `LinuxContainerUser`.
fn validate_container_user(linux: &Value, field: &str) -> Vec<FieldError> {
    const RANGE: &str = "must be between 0 and 2147483647, inclusive";
    let out_of_range = |v: &&Value| !v.as_i64().is_some_and(|n| (0..=i64::from(i32::MAX)).contains(&n));
    let mut errs = Vec::new();
    for id in ["uid", "gid"] {
        if let Some(v) = linux.get(id).filter(out_of_range) {
            errs.push(FieldError::invalid(&format!("{field}.{id}"), v, RANGE));
        }
    }
    for (g, v) in linux.get("supplementalGroups").and_then(Value::as_array).into_iter().flatten().enumerate() {
        if out_of_range(&v) {
            errs.push(FieldError::invalid(&format!("{field}.supplementalGroups[{g}]"), v, RANGE));
        }
    }
    errs
}

/// Fields an ephemeral container may not set (upstream's allow-list, inverted).
const NOT_FOR_EPHEMERAL: [&str; 8] = [
    "ports",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "resources",
    "resizePolicy",
    "restartPolicy",
];

/// The `ephemeralcontainers` subresource (upstream `ValidatePodEphemeralContainersUpdate`):
/// ephemeral containers may only be added, each valid on its own; the new ones get the
/// container defaults.
pub fn add_ephemeral_containers(old: &Value, new: &mut Value) -> Result<(), ApiError> {
    let name = new.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
    let list = |pod: &Value| pod.pointer("/spec/ephemeralContainers").and_then(Value::as_array).cloned();
    let (before, mut after) = (list(old).unwrap_or_default(), list(new).unwrap_or_default());
    let mut errs = Vec::new();
    for (i, c) in after.iter_mut().enumerate() {
        let field = format!("spec.ephemeralContainers[{i}]");
        let c_name = c.get("name").and_then(Value::as_str).unwrap_or("").to_string();
        match before.iter().find(|b| b.get("name").and_then(Value::as_str) == Some(&c_name)) {
            Some(existing) if existing != c => errs.push(FieldError::forbidden(
                &field,
                &format!("existing ephemeral containers {c_name:?} may not be changed"),
            )),
            Some(_) => {}
            None => {
                errs.extend(validate_ephemeral(&old["spec"], c, &field));
                if let Some(m) = c.as_object_mut() {
                    default_container(m);
                    m.remove("resources");
                }
            }
        }
    }
    for b in &before {
        let b_name = b.get("name").and_then(Value::as_str).unwrap_or("");
        if !after.iter().any(|c| c.get("name").and_then(Value::as_str) == Some(b_name)) {
            errs.push(FieldError::forbidden(
                "spec.ephemeralContainers",
                &format!("existing ephemeral containers {b_name:?} may not be removed"),
            ));
        }
    }
    if !errs.is_empty() {
        return Err(ApiError::invalid("Pod", "", &name, errs));
    }
    new["spec"]["ephemeralContainers"] = json!(after);
    Ok(())
}

/// One new ephemeral container: a unique DNS-label name, an image, none of the fields that
/// only long-running containers have, a target that exists, no subPath mounts.
fn validate_ephemeral(spec: &Value, c: &Value, field: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name = c.get("name").and_then(Value::as_str).unwrap_or("");
    let names_in = |list: &str| -> Vec<String> {
        spec.get(list)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("name").and_then(Value::as_str).map(String::from))
            .collect()
    };
    let regular: Vec<String> = names_in("containers").into_iter().chain(names_in("initContainers")).collect();
    if name.is_empty() {
        errs.push(FieldError::required(&format!("{field}.name"), ""));
    } else if !crate::ops::is_label(name) {
        errs.push(FieldError::invalid(&format!("{field}.name"), &json!(name), crate::ops::LABEL_MSG));
    } else if regular.iter().chain(&names_in("ephemeralContainers")).any(|n| n == name) {
        errs.push(FieldError::duplicate(&format!("{field}.name"), &json!(name)));
    }
    if c.get("image").and_then(Value::as_str).unwrap_or("").is_empty() {
        errs.push(FieldError::required(&format!("{field}.image"), ""));
    }
    for key in NOT_FOR_EPHEMERAL {
        let set = match c.get(key) {
            None | Some(Value::Null) => false,
            Some(Value::Object(m)) => !m.is_empty(),
            Some(Value::Array(a)) => !a.is_empty(),
            Some(_) => true,
        };
        if set {
            errs.push(FieldError::forbidden(&format!("{field}.{key}"), "cannot be set for an Ephemeral Container"));
        }
    }
    if let Some(target) = c.get("targetContainerName").and_then(Value::as_str)
        && !regular.iter().any(|n| n == target)
    {
        errs.push(FieldError::not_found(&format!("{field}.targetContainerName"), &json!(target)));
    }
    for (j, m) in c.get("volumeMounts").and_then(Value::as_array).into_iter().flatten().enumerate() {
        for key in ["subPath", "subPathExpr"] {
            if m.get(key).and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
                errs.push(FieldError::forbidden(
                    &format!("{field}.volumeMounts[{j}].{key}"),
                    "cannot be set for an Ephemeral Container",
                ));
            }
        }
    }
    errs
}

fn copy_field(target: &mut Value, source: &Value, field: &str) {
    match source.get(field) {
        Some(v) => target[field] = v.clone(),
        None => {
            if let Some(m) = target.as_object_mut() {
                m.remove(field);
            }
        }
    }
}

/// The grace period a DELETE of this pod gets: 0 for unscheduled or terminal pods (they are
/// removed at once), else the request's, else the pod's terminationGracePeriodSeconds.
pub fn grace_period(pod: &Value, requested: Option<i64>) -> i64 {
    let unbound = pod.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or("").is_empty();
    let phase = pod.pointer("/status/phase").and_then(Value::as_str).unwrap_or("");
    if unbound || phase == "Succeeded" || phase == "Failed" {
        return 0;
    }
    let grace = requested
        .or_else(|| pod.pointer("/spec/terminationGracePeriodSeconds").and_then(Value::as_i64))
        .unwrap_or(DEFAULT_GRACE_SECONDS);
    // Upstream turns a negative grace period into the minimum of 1 second.
    if grace < 0 { 1 } else { grace }
}

/// Whether the pod has condition Ready=True.
pub fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions").and_then(Value::as_array).into_iter().flatten().any(|c| {
        c.get("type").and_then(Value::as_str) == Some("Ready")
            && c.get("status").and_then(Value::as_str) == Some("True")
    })
}

/// Kinds of objects the Node authorizer relates to nodes through pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefKind {
    Pod,
    Secret,
    ConfigMap,
    Pvc,
    Pv,
    ServiceAccount,
}

/// Names of objects a pod references, borrowed from the pod: the node authorizer reads them
/// for every pod of the node on each request for a Secret or ConfigMap.
#[derive(Debug, Default)]
pub struct References<'a> {
    pub secrets: Vec<&'a str>,
    pub configmaps: Vec<&'a str>,
    pub pvcs: Vec<Cow<'a, str>>,
    pub service_account: Option<&'a str>,
}

fn push_str<'a, T: From<&'a str>>(out: &mut Vec<T>, v: Option<&'a Value>) {
    if let Some(s) = v.and_then(Value::as_str).filter(|s| !s.is_empty()) {
        out.push(s.into());
    }
}

/// Every secret, configmap and PVC a pod names (volumes, projections, env, envFrom,
/// imagePullSecrets, CSI secrets), as upstream's VisitPod*Names do.
pub fn references(pod: &Value) -> References<'_> {
    let mut r = References::default();
    let spec = &pod["spec"];
    for s in spec.get("imagePullSecrets").and_then(Value::as_array).into_iter().flatten() {
        push_str(&mut r.secrets, s.get("name"));
    }
    let pod_name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    for v in spec.get("volumes").and_then(Value::as_array).into_iter().flatten() {
        push_str(&mut r.secrets, v.pointer("/secret/secretName"));
        push_str(&mut r.secrets, v.pointer("/csi/nodePublishSecretRef/name"));
        push_str(&mut r.configmaps, v.pointer("/configMap/name"));
        push_str(&mut r.pvcs, v.pointer("/persistentVolumeClaim/claimName"));
        if v.get("ephemeral").is_some() {
            let vol = v.get("name").and_then(Value::as_str).unwrap_or("");
            r.pvcs.push(Cow::Owned(format!("{pod_name}-{vol}")));
        }
        for src in v.pointer("/projected/sources").and_then(Value::as_array).into_iter().flatten() {
            push_str(&mut r.secrets, src.pointer("/secret/name"));
            push_str(&mut r.configmaps, src.pointer("/configMap/name"));
        }
    }
    for list in container_lists() {
        for c in spec.get(list).and_then(Value::as_array).into_iter().flatten() {
            for e in c.get("env").and_then(Value::as_array).into_iter().flatten() {
                push_str(&mut r.secrets, e.pointer("/valueFrom/secretKeyRef/name"));
                push_str(&mut r.configmaps, e.pointer("/valueFrom/configMapKeyRef/name"));
            }
            for e in c.get("envFrom").and_then(Value::as_array).into_iter().flatten() {
                push_str(&mut r.secrets, e.pointer("/secretRef/name"));
                push_str(&mut r.configmaps, e.pointer("/configMapRef/name"));
            }
        }
    }
    r.service_account = spec.get("serviceAccountName").and_then(Value::as_str).filter(|s| !s.is_empty());
    r
}

/// Whether a pod bound to `node` relates the node to the object `kind ns/name`.
pub fn node_references(inner: &StoreInner, node: &str, kind: RefKind, ns: &str, name: &str) -> bool {
    let on_node = |p: &Value| p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node);
    if kind == RefKind::Pod {
        return inner.get("pods", ns, name).is_some_and(|p| on_node(&p));
    }
    if kind == RefKind::Pv {
        // node <- pod <- pvc <- pv
        return inner.list("persistentvolumeclaims", None).iter().any(|pvc| {
            pvc.pointer("/spec/volumeName").and_then(Value::as_str) == Some(name) && {
                let pvc_ns = pvc.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("");
                let pvc_name = pvc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
                node_references(inner, node, RefKind::Pvc, pvc_ns, pvc_name)
            }
        });
    }
    // node <- pod <- pvc <- pv <- secret (the secrets a CSI PV names for its driver).
    if kind == RefKind::Secret && pv_secret_of_node(inner, node, ns, name) {
        return true;
    }
    inner.node_refs.contains(node, kind, ns, name)
}

/// The Node authorizer's graph: for each node, the Secrets, ConfigMaps, PVCs and
/// ServiceAccounts its pods reference, with how many of its pods reference each. The store
/// keeps it as pods are written, so a request for an object does not read every pod.
#[derive(Debug, Default)]
pub struct NodeRefs {
    by_node: HashMap<String, HashMap<(RefKind, String, String), usize>>,
}

impl NodeRefs {
    /// A pod was written: `old` is what the store held before (if anything), `new` what it
    /// holds now (nothing after a deletion).
    pub fn replace(&mut self, old: Option<&Value>, new: Option<&Value>) {
        if let Some(old) = old {
            self.count(old, false);
        }
        if let Some(new) = new {
            self.count(new, true);
        }
    }

    pub fn contains(&self, node: &str, kind: RefKind, ns: &str, name: &str) -> bool {
        self.by_node.get(node).is_some_and(|refs| refs.contains_key(&(kind, ns.to_string(), name.to_string())))
    }

    fn count(&mut self, pod: &Value, add: bool) {
        let Some(node) = pod.pointer("/spec/nodeName").and_then(Value::as_str).filter(|n| !n.is_empty()) else {
            return;
        };
        let ns = pod.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("");
        let r = references(pod);
        let names = r.secrets.iter().map(|s| (RefKind::Secret, *s));
        let names = names.chain(r.configmaps.iter().map(|c| (RefKind::ConfigMap, *c)));
        let names = names.chain(r.pvcs.iter().map(|p| (RefKind::Pvc, p.as_ref())));
        let names = names.chain(r.service_account.map(|a| (RefKind::ServiceAccount, a)));
        let refs = self.by_node.entry(node.to_string()).or_default();
        for (kind, name) in names {
            let key = (kind, ns.to_string(), name.to_string());
            if add {
                *refs.entry(key).or_insert(0) += 1;
            } else if let Some(n) = refs.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    refs.remove(&key);
                }
            }
        }
        if refs.is_empty() {
            self.by_node.remove(node);
        }
    }
}

/// The secret references of a CSI PersistentVolume (upstream's `VisitPVSecretNames` for CSI).
const PV_CSI_SECRETS: &[&str] = &[
    "controllerPublishSecretRef",
    "controllerExpandSecretRef",
    "nodeExpandSecretRef",
    "nodePublishSecretRef",
    "nodeStageSecretRef",
];

/// Whether a PV related to `node` names the secret `ns/name`.
fn pv_secret_of_node(inner: &StoreInner, node: &str, ns: &str, name: &str) -> bool {
    inner.list("persistentvolumes", None).iter().any(|pv| {
        let names = |field: &&str| {
            let r = pv.pointer(&format!("/spec/csi/{field}"));
            r.and_then(|r| r.get("name")?.as_str()) == Some(name)
                && r.and_then(|r| r.get("namespace")?.as_str()) == Some(ns)
        };
        PV_CSI_SECRETS.iter().any(names) && node_references(inner, node, RefKind::Pv, "", crate::meta::name(pv))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_pull_policy_defaults() {
        assert!(pulls_always("nginx"));
        assert!(pulls_always("nginx:latest"));
        assert!(pulls_always("localhost:5000/nginx"));
        assert!(!pulls_always("localhost:5000/nginx:1.2"));
        assert!(!pulls_always("nginx@sha256:abc"));
    }

    #[test]
    fn qos() {
        assert_eq!(qos_class(&json!({"containers": [{"name": "a"}]})), "BestEffort");
        assert_eq!(
            qos_class(&json!({"containers": [{"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]})),
            "Guaranteed"
        );
        assert_eq!(qos_class(&json!({"containers": [{"resources": {"requests": {"cpu": "1"}}}]})), "Burstable");
    }

    #[test]
    fn update_allows_image_only() {
        let old = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a", "image": "1"}], "tolerations": []}});
        let mut new = old.clone();
        new["spec"]["containers"][0]["image"] = json!("2");
        assert!(validate_update(&old, &new).is_ok());
        new["spec"]["tolerations"] = json!([{"key": "k"}]);
        assert!(validate_update(&old, &new).is_ok());
        new["spec"]["containers"][0]["command"] = json!(["x"]);
        assert_eq!(validate_update(&old, &new).unwrap_err().code, 422);
    }

    #[test]
    fn grace() {
        let bound =
            json!({"spec": {"nodeName": "n", "terminationGracePeriodSeconds": 10}, "status": {"phase": "Running"}});
        assert_eq!(grace_period(&bound, None), 10);
        assert_eq!(grace_period(&bound, Some(3)), 3);
        assert_eq!(grace_period(&bound, Some(-5)), 1);
        assert_eq!(grace_period(&json!({"spec": {}}), Some(30)), 0);
        let done = json!({"spec": {"nodeName": "n"}, "status": {"phase": "Succeeded"}});
        assert_eq!(grace_period(&done, None), 0);
    }

    #[test]
    fn the_node_graph_follows_pod_writes() {
        let mut inner = StoreInner::new(crate::resources::Registry::default(), 100);
        let pod = |name: &str, node: &str, secret: &str| {
            json!({"metadata": {"namespace": "ns", "name": name}, "spec": {"nodeName": node,
                "volumes": [{"name": "v", "secret": {"secretName": secret}}]}})
        };
        let related =
            |inner: &StoreInner, node: &str, secret: &str| node_references(inner, node, RefKind::Secret, "ns", secret);
        inner.put("pods", pod("a", "n1", "s"));
        inner.put("pods", pod("b", "n1", "s"));
        assert!(related(&inner, "n1", "s"));
        assert!(!related(&inner, "n2", "s"), "another node");
        assert!(!node_references(&inner, "n1", RefKind::Secret, "other", "s"), "another namespace");
        inner.remove("pods", "ns", "a");
        assert!(related(&inner, "n1", "s"), "pod b still references it");
        inner.put("pods", pod("b", "n1", "t"));
        assert!(!related(&inner, "n1", "s"), "no pod references it any more");
        assert!(related(&inner, "n1", "t"));
        inner.put("pods", pod("b", "", "t"));
        assert!(!related(&inner, "n1", "t"), "an unbound pod relates no node");
    }

    #[test]
    fn references_cover_volumes_and_env() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {
            "serviceAccountName": "sa",
            "imagePullSecrets": [{"name": "pull"}],
            "volumes": [{"name": "v", "secret": {"secretName": "s1"}}, {"name": "c", "configMap": {"name": "c1"}},
                        {"name": "pr", "projected": {"sources": [{"secret": {"name": "s2"}}]}},
                        {"name": "d", "persistentVolumeClaim": {"claimName": "claim"}}],
            "containers": [{"name": "a", "env": [{"name": "E", "valueFrom": {"configMapKeyRef": {"name": "c2", "key": "k"}}}],
                            "envFrom": [{"secretRef": {"name": "s3"}}]}]
        }});
        let r = references(&pod);
        assert_eq!(r.secrets, vec!["pull", "s1", "s2", "s3"]);
        assert_eq!(r.configmaps, vec!["c1", "c2"]);
        assert_eq!(r.pvcs, vec!["claim"]);
        assert_eq!(r.service_account, Some("sa"));
    }
}
