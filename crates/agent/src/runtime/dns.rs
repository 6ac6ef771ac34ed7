//! A pod's DNS configuration (the sandbox's resolv.conf), as upstream composes it from
//! `dnsPolicy`, `dnsConfig`, `clusterDNS`, `clusterDomain` and the host's resolv.conf, including
//! its limits on nameservers and search paths. Pure: the host file's content is passed in.

use std::net::IpAddr;

use gantry_cri::api;
use k8s_openapi::api::core::v1::{Pod, PodDNSConfigOption};

use gantry_vocab::spec;

const MAX_NAMESERVERS: usize = 3;
const MAX_SEARCH_PATHS: usize = 32;
const MAX_SEARCH_LINE_CHARS: usize = 2048;
/// DNS-1123 subdomain length: longer search paths make some resolvers abort.
const MAX_SEARCH_PATH_CHARS: usize = 253;

/// What the node contributes to pod DNS.
pub struct NodeDns<'a> {
    pub cluster_dns: &'a [IpAddr],
    pub cluster_domain: &'a str,
    /// The host resolv.conf's content; None when `resolvConf` is empty.
    pub host_resolv_conf: Option<&'a str>,
}

/// The DNS config and the events upstream records while composing it.
#[derive(Debug, Default, PartialEq)]
pub struct PodDns {
    pub config: api::DnsConfig,
    /// (reason, message) of Warning events about the pod.
    pub events: Vec<(&'static str, String)>,
}

#[derive(Debug, PartialEq, Eq)]
enum Kind {
    Cluster,
    Host,
    None,
}

/// Upstream `getPodDNSType`: ClusterFirst falls back to the host's DNS on the host network.
fn kind(pod: &Pod) -> Kind {
    match pod.spec.as_ref().and_then(|s| s.dns_policy.as_deref()).unwrap_or("ClusterFirst") {
        "None" => Kind::None,
        "ClusterFirstWithHostNet" => Kind::Cluster,
        "Default" => Kind::Host,
        _ if spec::host_network(pod) => Kind::Host,
        _ => Kind::Cluster,
    }
}

/// Nameservers, search domains (trailing dots trimmed, last `search` line wins) and options.
fn parse_resolv_conf(text: &str) -> api::DnsConfig {
    let mut config = api::DnsConfig::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or_default();
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["nameserver", server, ..] => config.servers.push(server.to_string()),
            ["search", domains @ ..] => {
                config.searches = domains.iter().map(|d| d.trim_end_matches('.').to_string()).collect();
            }
            ["options", options @ ..] => config.options.extend(options.iter().map(|o| o.to_string())),
            _ => {}
        }
    }
    config
}

fn dedup(list: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(list.len());
    for item in list {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

/// Upstream `mergeDNSOptions`: pod options override host options of the same name (order of
/// first appearance kept, so the result is stable).
fn merge_options(existing: &[String], pod: &[PodDNSConfigOption]) -> Vec<String> {
    let mut merged: Vec<(String, String)> = Vec::new();
    let mut set = |name: &str, value: &str| match merged.iter_mut().find(|(n, _)| n == name) {
        Some(entry) => entry.1 = value.to_string(),
        None => merged.push((name.to_string(), value.to_string())),
    };
    for o in existing {
        let (name, value) = o.split_once(':').unwrap_or((o, ""));
        set(name, value);
    }
    for o in pod {
        set(o.name.as_deref().unwrap_or_default(), o.value.as_deref().unwrap_or_default());
    }
    merged.into_iter().map(|(n, v)| if v.is_empty() { n } else { format!("{n}:{v}") }).collect()
}

fn cluster_searches(pod: &Pod, domain: &str, host: &[String]) -> Vec<String> {
    if domain.is_empty() {
        return host.to_vec();
    }
    let own = [format!("{}.svc.{domain}", spec::namespace(pod)), format!("svc.{domain}"), domain.to_string()];
    dedup(own.into_iter().chain(host.iter().cloned()).collect())
}

/// Upstream `formDNSSearchFitsLimits`.
fn fit_searches(searches: Vec<String>, events: &mut Vec<(&'static str, String)>) -> Vec<String> {
    let mut exceeded = searches.len() > MAX_SEARCH_PATHS;
    let mut fitted: Vec<String> = searches.into_iter().take(MAX_SEARCH_PATHS).collect();
    let before = fitted.len();
    fitted.retain(|s| s.len() <= MAX_SEARCH_PATH_CHARS);
    exceeded |= fitted.len() != before;
    while fitted.join(" ").len() > MAX_SEARCH_LINE_CHARS {
        fitted.pop();
        exceeded = true;
    }
    if exceeded {
        events.push((
            "DNSConfigForming",
            format!(
                "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: {}",
                fitted.join(" ")
            ),
        ));
    }
    fitted
}

/// The pod's DNS config (upstream `GetPodDNS`).
pub fn compose(pod: &Pod, node: &NodeDns) -> PodDns {
    let mut events = Vec::new();
    let host = match node.host_resolv_conf {
        Some(text) => parse_resolv_conf(text),
        // Without a host resolv.conf, upstream points pods at localhost and searches nothing.
        None => api::DnsConfig { servers: vec!["127.0.0.1".into()], searches: vec![".".into()], options: vec![] },
    };
    let mut config = match kind(pod) {
        Kind::None => api::DnsConfig::default(),
        Kind::Cluster if !node.cluster_dns.is_empty() => api::DnsConfig {
            servers: node.cluster_dns.iter().map(IpAddr::to_string).collect(),
            searches: cluster_searches(pod, node.cluster_domain, &host.searches),
            options: vec!["ndots:5".into()],
        },
        Kind::Cluster => {
            events.push((
                "MissingClusterDNS",
                format!(
                    "pod: {:?}. kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy.",
                    spec::format_pod(pod)
                ),
            ));
            host
        }
        Kind::Host => host,
    };
    if let Some(d) = pod.spec.as_ref().and_then(|s| s.dns_config.as_ref()) {
        config.servers = dedup(config.servers.into_iter().chain(d.nameservers.iter().flatten().cloned()).collect());
        config.searches = dedup(config.searches.into_iter().chain(d.searches.iter().flatten().cloned()).collect());
        config.options = merge_options(&config.options, d.options.as_deref().unwrap_or_default());
    }
    if config.servers.len() > MAX_NAMESERVERS {
        config.servers.truncate(MAX_NAMESERVERS);
        events.push((
            "DNSConfigForming",
            format!(
                "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: {}",
                config.servers.join(" ")
            ),
        ));
    }
    config.searches = fit_searches(config.searches, &mut events);
    PodDns { config, events }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodDNSConfig, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    const HOST: &str = "# generated\nnameserver 192.168.1.1\nnameserver 192.168.1.2 ; second\nsearch old.example\n\
                        search corp.example. lab.example\noptions rotate timeout:2\n";

    fn pod(policy: Option<&str>, host_network: bool, dns_config: Option<PodDNSConfig>) -> Pod {
        Pod {
            metadata: ObjectMeta { name: Some("p".into()), namespace: Some("team".into()), ..Default::default() },
            spec: Some(PodSpec {
                dns_policy: policy.map(str::to_string),
                host_network: Some(host_network),
                dns_config,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn node(cluster_dns: &[IpAddr]) -> NodeDns<'_> {
        NodeDns { cluster_dns, cluster_domain: "cluster.local", host_resolv_conf: Some(HOST) }
    }

    const DNS: [IpAddr; 1] = [IpAddr::V4(std::net::Ipv4Addr::new(10, 96, 0, 10))];

    #[test]
    fn host_resolv_conf_parsing() {
        let c = parse_resolv_conf(HOST);
        assert_eq!(c.servers, ["192.168.1.1", "192.168.1.2"]);
        assert_eq!(c.searches, ["corp.example", "lab.example"], "the last search line wins");
        assert_eq!(c.options, ["rotate", "timeout:2"]);
    }

    #[test]
    fn cluster_first() {
        let d = compose(&pod(None, false, None), &node(&DNS));
        assert_eq!(d.config.servers, ["10.96.0.10"]);
        assert_eq!(
            d.config.searches,
            ["team.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example", "lab.example"]
        );
        assert_eq!(d.config.options, ["ndots:5"]);
        assert!(d.events.is_empty());
    }

    #[test]
    fn cluster_first_on_the_host_network_uses_the_host_unless_with_host_net() {
        let host = compose(&pod(Some("ClusterFirst"), true, None), &node(&DNS));
        assert_eq!(host.config.servers, ["192.168.1.1", "192.168.1.2"]);
        let with = compose(&pod(Some("ClusterFirstWithHostNet"), true, None), &node(&DNS));
        assert_eq!(with.config.servers, ["10.96.0.10"]);
    }

    #[test]
    fn missing_cluster_dns_falls_back_to_default_with_an_event() {
        let d = compose(&pod(None, false, None), &node(&[]));
        assert_eq!(d.config.servers, ["192.168.1.1", "192.168.1.2"]);
        assert_eq!(d.events[0].0, "MissingClusterDNS");
        assert!(d.events[0].1.contains("Falling back to \"Default\" policy."), "{}", d.events[0].1);
    }

    #[test]
    fn default_and_empty_resolv_conf() {
        let d = compose(&pod(Some("Default"), false, None), &node(&DNS));
        assert_eq!(d.config.options, ["rotate", "timeout:2"]);
        let none = NodeDns { host_resolv_conf: None, ..node(&DNS) };
        let d = compose(&pod(Some("Default"), false, None), &none);
        assert_eq!((d.config.servers, d.config.searches), (vec!["127.0.0.1".to_string()], vec![".".to_string()]));
    }

    #[test]
    fn none_uses_only_dns_config_and_others_merge_it() {
        let cfg = PodDNSConfig {
            nameservers: Some(vec!["1.1.1.1".into()]),
            searches: Some(vec!["extra.example".into()]),
            options: Some(vec![
                PodDNSConfigOption { name: Some("ndots".into()), value: Some("2".into()) },
                PodDNSConfigOption { name: Some("edns0".into()), value: None },
            ]),
        };
        let none = compose(&pod(Some("None"), false, Some(cfg.clone())), &node(&DNS));
        assert_eq!(none.config.servers, ["1.1.1.1"]);
        assert_eq!(none.config.searches, ["extra.example"]);
        assert_eq!(none.config.options, ["ndots:2", "edns0"]);
        let merged = compose(&pod(None, false, Some(cfg)), &node(&DNS));
        assert_eq!(merged.config.servers, ["10.96.0.10", "1.1.1.1"]);
        assert_eq!(merged.config.searches.last().unwrap(), "extra.example");
        assert_eq!(merged.config.options, ["ndots:2", "edns0"], "the pod's ndots overrides");
    }

    #[test]
    fn limits() {
        let cfg = PodDNSConfig {
            nameservers: Some(vec!["1.1.1.1".into(), "8.8.8.8".into(), "9.9.9.9".into()]),
            searches: Some((0..40).map(|i| format!("d{i}.example")).chain(["x".repeat(254)]).collect()),
            options: None,
        };
        let d = compose(&pod(None, false, Some(cfg)), &node(&DNS));
        assert_eq!(d.config.servers, ["10.96.0.10", "1.1.1.1", "8.8.8.8"]);
        assert_eq!(d.config.searches.len(), 32);
        assert_eq!(d.events.len(), 2);
        assert!(d.events[1].1.starts_with("Search Line limits were exceeded"), "{}", d.events[1].1);
        let long = PodDNSConfig {
            searches: Some((0..20).map(|i| format!("{i}{}", "y".repeat(200))).collect()),
            ..Default::default()
        };
        let d = compose(&pod(Some("None"), false, Some(long)), &node(&DNS));
        assert!(d.config.searches.join(" ").len() <= 2048);
        assert_eq!(d.config.searches.len(), 10);
    }
}
