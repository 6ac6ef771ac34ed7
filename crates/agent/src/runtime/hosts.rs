//! The pod's hostname, domain and managed `/etc/hosts`, as upstream builds them: the hostname is
//! `spec.hostname` or the pod name (at most 63 characters), the domain
//! `<subdomain>.<namespace>.svc.<clusterDomain>`; the hosts file lists localhost, the pod's IPs
//! with its names and the `hostAliases`. Host-network pods get the node's hosts file plus the
//! aliases. Content is pure; [`write`] puts it at `<pod-dir>/etc-hosts`.

use std::path::{Path, PathBuf};

use gantry_cri::api;
use k8s_openapi::api::core::v1::{HostAlias, Pod};

use gantry_vocab::spec;

const HEADER: &str = "# Kubernetes-managed hosts file.\n";
const MAX_HOSTNAME: usize = 63;
/// The kernel's limit for a hostname set as FQDN.
const MAX_FQDN: usize = 64;

/// The pod's hostname and domain (empty without a subdomain).
pub fn hostname_and_domain(pod: &Pod, cluster_domain: &str) -> (String, String) {
    let s = pod.spec.as_ref();
    let name = s.and_then(|s| s.hostname.as_deref()).filter(|h| !h.is_empty()).unwrap_or(spec::name(pod));
    // Upstream truncates and then trims what would end the name badly.
    let hostname: String = name.chars().take(MAX_HOSTNAME).collect();
    let hostname = hostname.trim_end_matches(['-', '.']).to_string();
    let domain = match s.and_then(|s| s.subdomain.as_deref()).filter(|d| !d.is_empty()) {
        Some(sub) => format!("{sub}.{}.svc.{cluster_domain}", spec::namespace(pod)),
        None => String::new(),
    };
    (hostname, domain)
}

/// A `setHostnameAsFQDN` pod whose FQDN does not fit the kernel's hostname.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too long ({MAX_FQDN} characters is the max, {} characters requested)",
    fqdn.len()
)]
pub struct FqdnTooLong {
    pub fqdn: String,
}

/// The sandbox hostname: the FQDN with `setHostnameAsFQDN`, else the short name.
pub fn kernel_hostname(pod: &Pod, cluster_domain: &str) -> Result<String, FqdnTooLong> {
    let (hostname, domain) = hostname_and_domain(pod, cluster_domain);
    let as_fqdn = pod.spec.as_ref().and_then(|s| s.set_hostname_as_fqdn).unwrap_or(false);
    if !as_fqdn || domain.is_empty() {
        return Ok(hostname);
    }
    let fqdn = format!("{hostname}.{domain}");
    if fqdn.len() > MAX_FQDN {
        return Err(FqdnTooLong { fqdn });
    }
    Ok(fqdn)
}

fn aliases(host_aliases: &[HostAlias]) -> String {
    if host_aliases.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n# Entries added by HostAliases.\n");
    for a in host_aliases {
        out.push_str(&format!("{}\t{}\n", a.ip, a.hostnames.as_deref().unwrap_or_default().join("\t")));
    }
    out
}

/// Upstream `managedHostsFileContent`.
pub fn managed_content(pod_ips: &[String], hostname: &str, domain: &str, host_aliases: &[HostAlias]) -> String {
    let mut out = String::from(HEADER);
    out.push_str("127.0.0.1\tlocalhost\n");
    out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
    out.push_str("fe00::0\tip6-localnet\n");
    out.push_str("fe00::0\tip6-mcastprefix\n");
    out.push_str("fe00::1\tip6-allnodes\n");
    out.push_str("fe00::2\tip6-allrouters\n");
    for ip in pod_ips {
        if domain.is_empty() {
            out.push_str(&format!("{ip}\t{hostname}\n"));
        } else {
            out.push_str(&format!("{ip}\t{hostname}.{domain}\t{hostname}\n"));
        }
    }
    out.push_str(&aliases(host_aliases));
    out
}

/// Upstream `nodeHostsFileContent`: the node's file with the aliases appended.
pub fn node_content(node_hosts: &str, host_aliases: &[HostAlias]) -> String {
    format!("{node_hosts}{}", aliases(host_aliases))
}

/// The pod's hosts file content: managed, or the node's for host-network pods.
pub fn content(pod: &Pod, pod_ip: Option<&str>, cluster_domain: &str, node_hosts: &str) -> String {
    let host_aliases = pod.spec.as_ref().and_then(|s| s.host_aliases.as_deref()).unwrap_or_default();
    if spec::host_network(pod) {
        return node_content(node_hosts, host_aliases);
    }
    let (hostname, domain) = hostname_and_domain(pod, cluster_domain);
    let ips: Vec<String> = pod_ip.into_iter().map(str::to_string).collect();
    managed_content(&ips, &hostname, &domain, host_aliases)
}

/// Writes the pod's hosts file and returns the mount for `/etc/hosts`.
pub fn write(pod_dir: &Path, content: &str) -> std::io::Result<api::Mount> {
    std::fs::create_dir_all(pod_dir)?;
    let path: PathBuf = pod_dir.join(gantry_vocab::paths::ETC_HOSTS);
    std::fs::write(&path, content)?;
    Ok(api::Mount {
        container_path: "/etc/hosts".into(),
        host_path: path.to_string_lossy().into_owned(),
        selinux_relabel: true,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod(name: &str, hostname: Option<&str>, subdomain: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta { name: Some(name.into()), namespace: Some("ns".into()), ..Default::default() },
            spec: Some(PodSpec {
                hostname: hostname.map(str::to_string),
                subdomain: subdomain.map(str::to_string),
                host_aliases: Some(vec![HostAlias {
                    ip: "10.1.2.3".into(),
                    hostnames: Some(vec!["foo.local".into(), "bar.local".into()]),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn names() {
        assert_eq!(hostname_and_domain(&pod("web", None, None), "cluster.local"), ("web".into(), String::new()));
        let (h, d) = hostname_and_domain(&pod("web", Some("db-0"), Some("db")), "cluster.local");
        assert_eq!((h.as_str(), d.as_str()), ("db-0", "db.ns.svc.cluster.local"));
        let long = format!("{}-x", "a".repeat(62));
        assert_eq!(hostname_and_domain(&pod(&long, None, None), "c").0, "a".repeat(62), "truncated, no trailing dash");
    }

    #[test]
    fn fqdn_hostname() {
        let mut p = pod("web", Some("db-0"), Some("db"));
        assert_eq!(kernel_hostname(&p, "cluster.local").unwrap(), "db-0");
        p.spec.as_mut().unwrap().set_hostname_as_fqdn = Some(true);
        assert_eq!(kernel_hostname(&p, "cluster.local").unwrap(), "db-0.db.ns.svc.cluster.local");
        let e = kernel_hostname(&p, &"x".repeat(60)).unwrap_err();
        assert!(e.to_string().contains("is too long (64 characters is the max"), "{e}");
    }

    #[test]
    fn managed_file() {
        let text = content(&pod("web", None, Some("sub")), Some("10.0.0.5"), "cluster.local", "");
        assert!(text.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"));
        assert!(text.contains("::1\tlocalhost ip6-localhost ip6-loopback\n"));
        assert!(text.contains("10.0.0.5\tweb.sub.ns.svc.cluster.local\tweb\n"));
        assert!(text.ends_with("\n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n"), "{text}");
        let plain = content(&pod("web", None, None), Some("10.0.0.5"), "cluster.local", "");
        assert!(plain.contains("10.0.0.5\tweb\n"));
    }

    #[test]
    fn host_network_file_is_the_nodes_plus_aliases() {
        let mut p = pod("web", None, None);
        p.spec.as_mut().unwrap().host_network = Some(true);
        let text = content(&p, Some("192.168.0.2"), "cluster.local", "127.0.0.1 localhost\n192.168.0.2 node1\n");
        assert_eq!(
            text,
            "127.0.0.1 localhost\n192.168.0.2 node1\n\n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n"
        );
    }
}
