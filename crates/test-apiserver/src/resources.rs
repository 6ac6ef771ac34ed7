//! The type registry: which resources exist, under which group/version, with which scope,
//! kind and subresources. Built-in types are fixed; custom resources are added and removed
//! as CustomResourceDefinitions come and go.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::status::{ApiError, FieldError, GroupResource};

/// Subresources with behaviour of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    Status,
    Eviction,
    Binding,
    Token,
    /// certificatesigningrequests/approval
    Approval,
    EphemeralContainers,
    /// pods/resize (in-place resize, KEP-1287)
    Resize,
}

impl Subresource {
    pub fn name(self) -> &'static str {
        match self {
            Subresource::Status => "status",
            Subresource::Eviction => "eviction",
            Subresource::Binding => "binding",
            Subresource::Token => "token",
            Subresource::Approval => "approval",
            Subresource::EphemeralContainers => "ephemeralcontainers",
            Subresource::Resize => "resize",
        }
    }
}

/// How a resource is handled beyond plain storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behavior {
    /// Stored objects.
    Stored,
    /// Create-only review objects answered on the spot and never stored.
    Review,
}

#[derive(Debug, Clone)]
pub struct ResourceType {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub subresources: Vec<Subresource>,
    /// Where objects live; shared by all versions of a custom resource.
    pub storage: String,
    /// Custom resources (no strategic merge patch, generation bumps on any non-metadata change).
    pub custom: bool,
    pub behavior: Behavior,
    /// Field selector labels beyond metadata.name / metadata.namespace.
    pub field_labels: Vec<String>,
    /// PUT to a missing object creates it (upstream's AllowCreateOnUpdate).
    pub create_on_update: bool,
    /// DELETE answers with the object rather than a success Status (ReturnDeletedObject).
    pub return_deleted_object: bool,
}

impl ResourceType {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    pub fn group_resource(&self) -> GroupResource {
        GroupResource::new(&self.group, &self.plural)
    }

    pub fn has(&self, sub: Subresource) -> bool {
        self.subresources.contains(&sub)
    }

    pub fn has_status(&self) -> bool {
        self.has(Subresource::Status)
    }

    pub fn verbs(&self) -> Vec<&'static str> {
        match self.behavior {
            Behavior::Review => vec!["create"],
            Behavior::Stored => vec!["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        }
    }

    pub fn field_labels(&self) -> Vec<&str> {
        self.field_labels.iter().map(String::as_str).collect()
    }
}

struct Builtin {
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
    subresources: &'static [Subresource],
    fields: &'static [&'static str],
}

const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];
const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

fn builtins() -> Vec<Builtin> {
    use Subresource::*;
    let b = |group, version, plural, kind, namespaced, short, subresources, fields| Builtin {
        group,
        version,
        plural,
        kind,
        namespaced,
        short,
        subresources,
        fields,
    };
    vec![
        b("", "v1", "namespaces", "Namespace", false, &["ns"], &[Status], &["status.phase"]),
        b("", "v1", "nodes", "Node", false, &["no"], &[Status], &["spec.unschedulable"]),
        b(
            "",
            "v1",
            "pods",
            "Pod",
            true,
            &["po"],
            &[Status, Eviction, Binding, EphemeralContainers, Resize],
            POD_FIELDS,
        ),
        b("", "v1", "events", "Event", true, &["ev"], &[], EVENT_FIELDS),
        b("", "v1", "configmaps", "ConfigMap", true, &["cm"], &[], &[]),
        b("", "v1", "secrets", "Secret", true, &[], &[], &["type"]),
        b("", "v1", "services", "Service", true, &["svc"], &[Status], &["spec.clusterIP", "spec.type"]),
        b("", "v1", "endpoints", "Endpoints", true, &["ep"], &[], &[]),
        b("", "v1", "serviceaccounts", "ServiceAccount", true, &["sa"], &[Token], &[]),
        b("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", true, &["pvc"], &[Status], &[]),
        b("", "v1", "persistentvolumes", "PersistentVolume", false, &["pv"], &[Status], &[]),
        b("coordination.k8s.io", "v1", "leases", "Lease", true, &[], &[], &[]),
        b("storage.k8s.io", "v1", "storageclasses", "StorageClass", false, &["sc"], &[], &[]),
        b("storage.k8s.io", "v1", "csidrivers", "CSIDriver", false, &[], &[], &[]),
        b("storage.k8s.io", "v1", "csinodes", "CSINode", false, &[], &[], &[]),
        b("storage.k8s.io", "v1", "volumeattachments", "VolumeAttachment", false, &[], &[Status], &[]),
        b("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", true, &["pdb"], &[Status], &[]),
        b("apps", "v1", "daemonsets", "DaemonSet", true, &["ds"], &[Status], &[]),
        b("apps", "v1", "deployments", "Deployment", true, &["deploy"], &[Status], &[]),
        b("apps", "v1", "replicasets", "ReplicaSet", true, &["rs"], &[Status], &[]),
        b("apps", "v1", "statefulsets", "StatefulSet", true, &["sts"], &[Status], &[]),
        b("events.k8s.io", "v1", "events", "Event", true, &["ev"], &[], &[]),
        b(
            "certificates.k8s.io",
            "v1",
            "certificatesigningrequests",
            "CertificateSigningRequest",
            false,
            &["csr"],
            &[Status, Approval],
            &["spec.signerName"],
        ),
        b(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
            &[Status],
            &[],
        ),
        b("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", false, &[], &[], &[]),
        b("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", false, &[], &[], &[]),
        b("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", false, &[], &[], &[]),
        b("authorization.k8s.io", "v1", "localsubjectaccessreviews", "LocalSubjectAccessReview", true, &[], &[], &[]),
    ]
}

/// Groups in the order /apis lists them (built-ins first, then CRD groups by name).
const BUILTIN_GROUP_ORDER: &[&str] = &[
    "apps",
    "events.k8s.io",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "certificates.k8s.io",
    "policy",
    "coordination.k8s.io",
    "storage.k8s.io",
    "apiextensions.k8s.io",
];

#[derive(Debug, Default)]
pub struct Registry {
    /// Keyed by (group, version, plural).
    types: BTreeMap<(String, String, String), Arc<ResourceType>>,
}

impl Registry {
    pub fn with_builtins() -> Registry {
        let mut r = Registry::default();
        for b in builtins() {
            let behavior = if b.plural.ends_with("reviews") { Behavior::Review } else { Behavior::Stored };
            let storage = if b.group.is_empty() { b.plural.to_string() } else { format!("{}/{}", b.group, b.plural) };
            let rt = ResourceType {
                group: b.group.into(),
                version: b.version.into(),
                plural: b.plural.into(),
                singular: b.kind.to_lowercase(),
                kind: b.kind.into(),
                namespaced: b.namespaced,
                short_names: b.short.iter().map(|s| s.to_string()).collect(),
                categories: default_categories(b.plural),
                subresources: b.subresources.to_vec(),
                storage,
                custom: false,
                behavior,
                field_labels: b.fields.iter().map(|s| s.to_string()).collect(),
                create_on_update: matches!(b.plural, "events" | "endpoints" | "leases"),
                return_deleted_object: matches!(b.plural, "pods" | "services" | "namespaces"),
            };
            r.insert(rt);
        }
        r
    }

    fn insert(&mut self, rt: ResourceType) {
        self.types.insert((rt.group.clone(), rt.version.clone(), rt.plural.clone()), Arc::new(rt));
    }

    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types.get(&(group.to_string(), version.to_string(), plural.to_string())).cloned()
    }

    /// Any served version of a resource, used to reach storage by group and plural.
    pub fn by_group_resource(&self, group: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types.values().find(|t| t.group == group && t.plural == plural).cloned()
    }

    /// Group names in discovery order, excluding the core group.
    pub fn groups(&self) -> Vec<String> {
        let mut groups: Vec<String> = BUILTIN_GROUP_ORDER.iter().map(|s| s.to_string()).collect();
        let mut custom: Vec<String> =
            self.types.values().filter(|t| t.custom).map(|t| t.group.clone()).filter(|g| !groups.contains(g)).collect();
        custom.sort();
        custom.dedup();
        groups.extend(custom);
        groups
    }

    /// Served versions of a group, preferred (storage) version first.
    pub fn versions(&self, group: &str) -> Vec<String> {
        let mut versions: Vec<String> =
            self.types.values().filter(|t| t.group == group).map(|t| t.version.clone()).collect();
        versions.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        versions.dedup();
        versions
    }

    pub fn in_group_version(&self, group: &str, version: &str) -> Vec<Arc<ResourceType>> {
        self.types.values().filter(|t| t.group == group && t.version == version).cloned().collect()
    }

    /// Replaces the resources served for the CRD `crd` (idempotent; used on create and update).
    pub fn register_crd(&mut self, crd: &Value) -> Result<(), ApiError> {
        let spec = CrdSpec::parse(crd)?;
        self.unregister_crd(&spec.group, &spec.plural);
        for v in &spec.versions {
            self.insert(ResourceType {
                group: spec.group.clone(),
                version: v.name.clone(),
                plural: spec.plural.clone(),
                singular: spec.singular.clone(),
                kind: spec.kind.clone(),
                namespaced: spec.namespaced,
                short_names: spec.short_names.clone(),
                categories: spec.categories.clone(),
                subresources: if v.status { vec![Subresource::Status] } else { vec![] },
                storage: format!("{}/{}", spec.group, spec.plural),
                custom: true,
                behavior: Behavior::Stored,
                field_labels: v.selectable_fields.clone(),
                create_on_update: false,
                return_deleted_object: true,
            });
        }
        Ok(())
    }

    pub fn unregister_crd(&mut self, group: &str, plural: &str) {
        self.types.retain(|(g, _, p), t| !(t.custom && g == group && p == plural));
    }
}

fn default_categories(plural: &str) -> Vec<String> {
    match plural {
        "pods" | "services" | "daemonsets" | "deployments" | "replicasets" | "statefulsets" => vec!["all".into()],
        _ => vec![],
    }
}

/// Kubernetes version ordering: GA > beta > alpha, higher numbers first.
fn version_priority(v: &str) -> (u8, u32, u32) {
    let Some(rest) = v.strip_prefix('v') else { return (0, 0, 0) };
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let major: u32 = digits.parse().unwrap_or(0);
    let tail = &rest[digits.len()..];
    if tail.is_empty() {
        return (3, major, 0);
    }
    let (level, num) = if let Some(n) = tail.strip_prefix("beta") {
        (2, n)
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (1, n)
    } else {
        (0, "0")
    };
    (level, major, num.parse().unwrap_or(0))
}

struct CrdVersion {
    name: String,
    status: bool,
    selectable_fields: Vec<String>,
}

/// The parts of a CRD that decide how its resources are served.
pub struct CrdSpec {
    pub group: String,
    pub plural: String,
    singular: String,
    kind: String,
    namespaced: bool,
    short_names: Vec<String>,
    categories: Vec<String>,
    versions: Vec<CrdVersion>,
}

impl CrdSpec {
    pub fn parse(crd: &Value) -> Result<CrdSpec, ApiError> {
        let name = crd.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
        let invalid =
            |errs: Vec<FieldError>| ApiError::invalid("CustomResourceDefinition", "apiextensions.k8s.io", name, errs);
        let s = |p: &str| crd.pointer(p).and_then(Value::as_str).unwrap_or("").to_string();
        let strings = |p: &str| -> Vec<String> {
            crd.pointer(p)
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
                .unwrap_or_default()
        };
        let group = s("/spec/group");
        let plural = s("/spec/names/plural");
        let kind = s("/spec/names/kind");
        let mut errs = Vec::new();
        if group.is_empty() {
            errs.push(FieldError::required("spec.group", ""));
        }
        if plural.is_empty() {
            errs.push(FieldError::required("spec.names.plural", ""));
        }
        if kind.is_empty() {
            errs.push(FieldError::required("spec.names.kind", ""));
        }
        if !group.is_empty() && !plural.is_empty() && name != format!("{plural}.{group}") {
            errs.push(FieldError::invalid(
                "metadata.name",
                &Value::String(name.into()),
                "must be spec.names.plural+\".\"+spec.group",
            ));
        }
        let scope = s("/spec/scope");
        if scope != "Namespaced" && scope != "Cluster" {
            errs.push(FieldError::invalid(
                "spec.scope",
                &Value::String(scope.clone()),
                "should be either Cluster or Namespaced",
            ));
        }
        let versions: Vec<CrdVersion> = crd
            .pointer("/spec/versions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|v| v.get("served").and_then(Value::as_bool).unwrap_or(false))
            .map(|v| CrdVersion {
                name: v.get("name").and_then(Value::as_str).unwrap_or("").to_string(),
                status: v.pointer("/subresources/status").is_some(),
                selectable_fields: v
                    .get("selectableFields")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|f| f.get("jsonPath").and_then(Value::as_str))
                    .map(|p| p.trim_start_matches('.').to_string())
                    .collect(),
            })
            .collect();
        if versions.is_empty() {
            errs.push(FieldError::invalid(
                "spec.versions",
                &Value::Null,
                "must have exactly one version marked as storage version",
            ));
        }
        if !errs.is_empty() {
            return Err(invalid(errs));
        }
        let singular = match s("/spec/names/singular") {
            x if x.is_empty() => kind.to_lowercase(),
            x => x,
        };
        Ok(CrdSpec {
            group,
            plural,
            singular,
            kind,
            namespaced: scope == "Namespaced",
            short_names: strings("/spec/names/shortNames"),
            categories: strings("/spec/names/categories"),
            versions,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn version_order() {
        let mut v = vec!["v1alpha1", "v2", "v1beta2", "v1", "v1beta1"];
        v.sort_by_key(|x| std::cmp::Reverse(version_priority(x)));
        assert_eq!(v, vec!["v2", "v1", "v1beta2", "v1beta1", "v1alpha1"]);
    }

    #[test]
    fn crd_registration() {
        let mut r = Registry::with_builtins();
        let crd = json!({
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                     "names": {"plural": "widgets", "kind": "Widget"},
                     "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}}},
                                  {"name": "v1beta1", "served": true, "storage": false}]}
        });
        r.register_crd(&crd).unwrap();
        let v1 = r.lookup("example.com", "v1", "widgets").unwrap();
        assert!(v1.has_status() && v1.namespaced && v1.custom);
        assert!(!r.lookup("example.com", "v1beta1", "widgets").unwrap().has_status());
        assert_eq!(r.versions("example.com"), vec!["v1", "v1beta1"]);
        r.unregister_crd("example.com", "widgets");
        assert!(r.lookup("example.com", "v1", "widgets").is_none());
    }

    #[test]
    fn crd_name_must_match() {
        let crd = json!({"metadata": {"name": "x"}, "spec": {"group": "g.io", "scope": "Cluster", "names": {"plural": "ps", "kind": "P"}, "versions": [{"name": "v1", "served": true}]}});
        assert_eq!(CrdSpec::parse(&crd).err().unwrap().code, 422);
    }
}
