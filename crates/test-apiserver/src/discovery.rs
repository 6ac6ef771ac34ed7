//! Discovery documents (/api, /apis, group and group-version resource lists), in both the
//! legacy form and the aggregated `apidiscovery.k8s.io/v2` form kubectl asks for first.

use serde_json::{Value, json};

use crate::resources::{Registry, ResourceType, Subresource};

/// The media type of aggregated discovery, as requested in `Accept` and echoed back.
pub const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

pub fn wants_aggregated(accept: &str) -> bool {
    accept.split(',').next().is_some_and(|first| first.contains("as=APIGroupDiscoveryList") && first.contains("v=v2"))
}

pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_version(group: &str, version: &str) -> Value {
    json!({"groupVersion": format!("{group}/{version}"), "version": version})
}

fn api_group(registry: &Registry, group: &str) -> Option<Value> {
    let versions = registry.versions(group);
    let preferred = versions.first()?;
    Some(json!({
        "name": group,
        "versions": versions.iter().map(|v| group_version(group, v)).collect::<Vec<_>>(),
        "preferredVersion": group_version(group, preferred),
    }))
}

pub fn group_list(registry: &Registry) -> Value {
    let groups: Vec<Value> = registry.groups().iter().filter_map(|g| api_group(registry, g)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub fn group(registry: &Registry, group: &str) -> Option<Value> {
    let mut g = api_group(registry, group)?;
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    Some(g)
}

/// (group, version, kind, verbs) of a subresource's response.
fn subresource_kind(rt: &ResourceType, sub: Subresource) -> (&str, &str, &str, Vec<&'static str>) {
    match sub {
        Subresource::Status | Subresource::Approval => {
            (&rt.group, &rt.version, &rt.kind, vec!["get", "patch", "update"])
        }
        Subresource::Eviction => ("policy", "v1", "Eviction", vec!["create"]),
        Subresource::Binding => ("", "v1", "Binding", vec!["create"]),
        Subresource::Token => ("authentication.k8s.io", "v1", "TokenRequest", vec!["create"]),
        Subresource::EphemeralContainers | Subresource::Resize => {
            (&rt.group, &rt.version, &rt.kind, vec!["get", "patch", "update"])
        }
    }
}

fn resource_entries(rt: &ResourceType) -> Vec<Value> {
    let mut main = json!({
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": rt.verbs(),
    });
    if !rt.short_names.is_empty() {
        main["shortNames"] = json!(rt.short_names);
    }
    if !rt.categories.is_empty() {
        main["categories"] = json!(rt.categories);
    }
    let mut out = vec![main];
    for sub in &rt.subresources {
        let (group, version, kind, verbs) = subresource_kind(rt, *sub);
        let mut entry = json!({
            "name": format!("{}/{}", rt.plural, sub.name()),
            "singularName": "",
            "namespaced": rt.namespaced,
            "kind": kind,
            "verbs": verbs,
        });
        if group != rt.group || version != rt.version {
            entry["group"] = json!(group);
            entry["version"] = json!(version);
        }
        out.push(entry);
    }
    out
}

pub fn resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let types = registry.in_group_version(group, version);
    if types.is_empty() {
        return None;
    }
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    let resources: Vec<Value> = types.iter().flat_map(|t| resource_entries(t)).collect();
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}))
}

fn aggregated_resource(rt: &ResourceType) -> Value {
    let subresources: Vec<Value> = rt
        .subresources
        .iter()
        .map(|s| {
            let (group, version, kind, verbs) = subresource_kind(rt, *s);
            json!({"subresource": s.name(), "responseKind": {"group": group, "version": version, "kind": kind}, "verbs": verbs})
        })
        .collect();
    let mut r = json!({
        "resource": rt.plural,
        "responseKind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
        "scope": if rt.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": rt.singular,
        "verbs": rt.verbs(),
    });
    if !rt.short_names.is_empty() {
        r["shortNames"] = json!(rt.short_names);
    }
    if !rt.categories.is_empty() {
        r["categories"] = json!(rt.categories);
    }
    if !subresources.is_empty() {
        r["subresources"] = json!(subresources);
    }
    r
}

fn aggregated_group(registry: &Registry, group: &str) -> Value {
    let versions: Vec<Value> = registry
        .versions(group)
        .iter()
        .map(|v| {
            let resources: Vec<Value> =
                registry.in_group_version(group, v).iter().map(|t| aggregated_resource(t)).collect();
            json!({"version": v, "resources": resources, "freshness": "Current"})
        })
        .collect();
    let metadata = if group.is_empty() {
        json!({"creationTimestamp": null})
    } else {
        json!({"name": group, "creationTimestamp": null})
    };
    json!({"metadata": metadata, "versions": versions})
}

/// Aggregated discovery for /api (core only) or /apis (every named group).
pub fn aggregated(registry: &Registry, core: bool) -> Value {
    let items: Vec<Value> = if core {
        vec![aggregated_group(registry, "")]
    } else {
        registry.groups().iter().map(|g| aggregated_group(registry, g)).collect()
    };
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_resource_list_has_subresources() {
        let r = Registry::with_builtins();
        let list = resource_list(&r, "", "v1").unwrap();
        let names: Vec<&str> =
            list["resources"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
        for want in ["pods", "pods/status", "pods/eviction", "nodes/status", "serviceaccounts/token", "namespaces"] {
            assert!(names.contains(&want), "{want} missing");
        }
        assert!(resource_list(&r, "", "v2").is_none());
    }

    #[test]
    fn aggregated_accept_header() {
        assert!(wants_aggregated(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
        ));
        assert!(!wants_aggregated("application/json"));
    }

    #[test]
    fn group_list_prefers_ga() {
        let r = Registry::with_builtins();
        let groups = group_list(&r);
        let apps = groups["groups"].as_array().unwrap().iter().find(|g| g["name"] == "apps").unwrap();
        assert_eq!(apps["preferredVersion"]["groupVersion"], "apps/v1");
    }
}
