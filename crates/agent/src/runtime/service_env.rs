//! Service environment variables (upstream `pkg/kubelet/envvars`): `<SVC>_SERVICE_HOST`,
//! `<SVC>_SERVICE_PORT[_<PORT>]` and the Docker-link `<SVC>_PORT…` variables, for the services
//! of the pod's namespace when `enableServiceLinks` is on, and always for the `kubernetes`
//! service in `default`. Pure: the caller lists the services.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Service};

use gantry_vocab::spec;

/// The API server's own service, whose variables every pod gets.
const MASTER_SERVICE: &str = "kubernetes";

/// The variables for `pod`, given the services of its namespace and of `default`.
pub fn for_pod(pod: &Pod, services: &[Service]) -> Vec<(String, String)> {
    let ns = spec::namespace(pod);
    let links = pod.spec.as_ref().and_then(|s| s.enable_service_links).unwrap_or(true);
    let mut chosen: BTreeMap<&str, &Service> = BTreeMap::new();
    for s in services.iter().filter(|s| cluster_ip(s).is_some()) {
        let name = s.metadata.name.as_deref().unwrap_or_default();
        let svc_ns = s.metadata.namespace.as_deref().unwrap_or_default();
        if svc_ns == "default" && name == MASTER_SERVICE {
            chosen.entry(name).or_insert(s);
        } else if svc_ns == ns && links {
            chosen.insert(name, s);
        }
    }
    chosen.values().flat_map(|s| variables(s)).collect()
}

/// A ClusterIP that is set (not empty, not `None`).
fn cluster_ip(s: &Service) -> Option<&str> {
    s.spec.as_ref()?.cluster_ip.as_deref().filter(|ip| !ip.is_empty() && *ip != "None")
}

fn env_name(s: &str) -> String {
    s.replace('-', "_").to_uppercase()
}

/// Upstream `FromServices` for one service.
fn variables(s: &Service) -> Vec<(String, String)> {
    let (Some(ip), Some(ports)) = (cluster_ip(s), s.spec.as_ref().and_then(|sp| sp.ports.as_ref())) else {
        return Vec::new();
    };
    let Some(first) = ports.first() else { return Vec::new() };
    let prefix = env_name(s.metadata.name.as_deref().unwrap_or_default());
    let port_var = format!("{prefix}_SERVICE_PORT");
    let mut out = vec![(format!("{prefix}_SERVICE_HOST"), ip.to_string()), (port_var.clone(), first.port.to_string())];
    for p in ports {
        if let Some(name) = p.name.as_deref().filter(|n| !n.is_empty()) {
            out.push((format!("{port_var}_{}", env_name(name)), p.port.to_string()));
        }
    }
    for (i, p) in ports.iter().enumerate() {
        let protocol = p.protocol.as_deref().unwrap_or("TCP");
        let lower = protocol.to_lowercase();
        let url = format!("{lower}://{}", super::http_get::join_host_port(ip, p.port as u16));
        if i == 0 {
            out.push((format!("{prefix}_PORT"), url.clone()));
        }
        let port_prefix = format!("{prefix}_PORT_{}_{}", p.port, protocol.to_uppercase());
        out.push((port_prefix.clone(), url));
        out.push((format!("{port_prefix}_PROTO"), lower));
        out.push((format!("{port_prefix}_PORT"), p.port.to_string()));
        out.push((format!("{port_prefix}_ADDR"), ip.to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSpec, ServicePort, ServiceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn service(ns: &str, name: &str, ip: &str, ports: &[(Option<&str>, i32, Option<&str>)]) -> Service {
        Service {
            metadata: ObjectMeta { name: Some(name.into()), namespace: Some(ns.into()), ..Default::default() },
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.into()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(n, port, proto)| ServicePort {
                            name: n.map(Into::into),
                            port: *port,
                            protocol: proto.map(Into::into),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(ns: &str, links: Option<bool>) -> Pod {
        Pod {
            metadata: ObjectMeta { name: Some("p".into()), namespace: Some(ns.into()), ..Default::default() },
            spec: Some(PodSpec { enable_service_links: links, ..Default::default() }),
            ..Default::default()
        }
    }

    fn get<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
        env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn upstream_format_for_one_service() {
        let svc =
            service("app", "my-db", "10.96.0.7", &[(Some("sql"), 5432, None), (Some("metrics"), 9187, Some("UDP"))]);
        let env = for_pod(&pod("app", None), &[svc]);
        let expected = [
            ("MY_DB_SERVICE_HOST", "10.96.0.7"),
            ("MY_DB_SERVICE_PORT", "5432"),
            ("MY_DB_SERVICE_PORT_SQL", "5432"),
            ("MY_DB_SERVICE_PORT_METRICS", "9187"),
            ("MY_DB_PORT", "tcp://10.96.0.7:5432"),
            ("MY_DB_PORT_5432_TCP", "tcp://10.96.0.7:5432"),
            ("MY_DB_PORT_5432_TCP_PROTO", "tcp"),
            ("MY_DB_PORT_5432_TCP_PORT", "5432"),
            ("MY_DB_PORT_5432_TCP_ADDR", "10.96.0.7"),
            ("MY_DB_PORT_9187_UDP", "udp://10.96.0.7:9187"),
            ("MY_DB_PORT_9187_UDP_PROTO", "udp"),
            ("MY_DB_PORT_9187_UDP_PORT", "9187"),
            ("MY_DB_PORT_9187_UDP_ADDR", "10.96.0.7"),
        ];
        let got: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn master_service_always_other_namespaces_never_headless_skipped() {
        let services = [
            service("default", "kubernetes", "10.96.0.1", &[(Some("https"), 443, None)]),
            service("default", "other", "10.96.0.2", &[(None, 80, None)]),
            service("app", "web", "10.96.0.3", &[(None, 80, None)]),
            service("app", "headless", "None", &[(None, 80, None)]),
        ];
        let env = for_pod(&pod("app", None), &services);
        assert_eq!(get(&env, "KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert_eq!(get(&env, "KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"));
        assert_eq!(get(&env, "WEB_SERVICE_HOST"), Some("10.96.0.3"));
        assert_eq!(get(&env, "OTHER_SERVICE_HOST"), None);
        assert_eq!(get(&env, "HEADLESS_SERVICE_HOST"), None);

        let env = for_pod(&pod("app", Some(false)), &services);
        assert_eq!(get(&env, "KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert_eq!(get(&env, "WEB_SERVICE_HOST"), None, "enableServiceLinks: false");

        let env = for_pod(&pod("default", None), &services);
        assert_eq!(get(&env, "OTHER_SERVICE_HOST"), Some("10.96.0.2"));
    }
}
