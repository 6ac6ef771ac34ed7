//! Request paths, parsed the way kube-apiserver's RequestInfoFactory does.

/// What a path addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// /version
    Version,
    /// /healthz, /livez, /readyz (and their sub-paths)
    Health,
    /// /api
    CoreVersions,
    /// /apis
    Groups,
    /// /apis/<group>
    Group(String),
    /// /api/v1 or /apis/<group>/<version>
    GroupVersion {
        group: String,
        version: String,
    },
    Resource(ResourcePath),
    /// Anything else (answered 404).
    Unknown,
}

/// A path under /api/v1 or /apis/<group>/<version> naming a resource.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResourcePath {
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub resource: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

/// Namespace subresources that are not resources in their own right.
const NAMESPACE_SUBRESOURCES: &[&str] = &["status", "finalize"];

pub fn parse(path: &str) -> Route {
    let parts: Vec<&str> = path.trim_matches('/').split('/').filter(|p| !p.is_empty()).collect();
    match parts.as_slice() {
        ["version"] => Route::Version,
        ["healthz" | "livez" | "readyz", ..] => Route::Health,
        ["api"] => Route::CoreVersions,
        ["apis"] => Route::Groups,
        ["apis", group] => Route::Group(group.to_string()),
        ["api", version] => Route::GroupVersion { group: String::new(), version: version.to_string() },
        ["apis", group, version] => Route::GroupVersion { group: group.to_string(), version: version.to_string() },
        ["api", version, rest @ ..] => resource_route("", version, rest),
        ["apis", group, version, rest @ ..] => resource_route(group, version, rest),
        _ => Route::Unknown,
    }
}

fn resource_route(group: &str, version: &str, rest: &[&str]) -> Route {
    let mut parts = rest;
    let mut namespace = None;
    if parts.first() == Some(&"namespaces") && parts.len() > 1 {
        namespace = Some(parts[1].to_string());
        if parts.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&parts[2]) {
            parts = &parts[2..];
        } else {
            // /namespaces/<name>[/status]: the namespace object itself.
            return Route::Resource(ResourcePath {
                group: group.into(),
                version: version.into(),
                namespace: None,
                resource: "namespaces".into(),
                name: namespace,
                subresource: parts.get(2).map(|s| s.to_string()),
            });
        }
    }
    let (resource, name, subresource) = match parts {
        [resource] => (*resource, None, None),
        [resource, name] => (*resource, Some(*name), None),
        [resource, name, sub] => (*resource, Some(*name), Some(*sub)),
        _ => return Route::Unknown,
    };
    Route::Resource(ResourcePath {
        group: group.into(),
        version: version.into(),
        namespace,
        resource: resource.into(),
        name: name.map(String::from),
        subresource: subresource.map(String::from),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(path: &str) -> ResourcePath {
        match parse(path) {
            Route::Resource(r) => r,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn discovery_paths() {
        assert_eq!(parse("/api"), Route::CoreVersions);
        assert_eq!(parse("/apis/"), Route::Groups);
        assert_eq!(parse("/apis/apps"), Route::Group("apps".into()));
        assert_eq!(parse("/api/v1"), Route::GroupVersion { group: "".into(), version: "v1".into() });
        assert_eq!(parse("/version"), Route::Version);
        assert_eq!(parse("/readyz/ping"), Route::Health);
        assert_eq!(parse("/foo"), Route::Unknown);
    }

    #[test]
    fn namespaced_resources() {
        let r = res("/api/v1/namespaces/default/pods/p1/status");
        assert_eq!(
            (r.namespace.as_deref(), r.resource.as_str(), r.name.as_deref(), r.subresource.as_deref()),
            (Some("default"), "pods", Some("p1"), Some("status"))
        );
        let r = res("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases");
        assert_eq!((r.group.as_str(), r.resource.as_str(), r.name), ("coordination.k8s.io", "leases", None));
    }

    #[test]
    fn namespace_objects() {
        let r = res("/api/v1/namespaces/foo");
        assert_eq!((r.namespace, r.resource.as_str(), r.name.as_deref()), (None, "namespaces", Some("foo")));
        let r = res("/api/v1/namespaces/foo/status");
        assert_eq!(
            (r.resource.as_str(), r.name.as_deref(), r.subresource.as_deref()),
            ("namespaces", Some("foo"), Some("status"))
        );
        let r = res("/api/v1/namespaces");
        assert_eq!((r.resource.as_str(), r.name), ("namespaces", None));
    }

    #[test]
    fn cluster_resources() {
        let r = res("/api/v1/nodes/n1/status");
        assert_eq!((r.namespace, r.name.as_deref(), r.subresource.as_deref()), (None, Some("n1"), Some("status")));
        assert_eq!(parse("/api/v1/nodes/a/b/c"), Route::Unknown);
    }
}
