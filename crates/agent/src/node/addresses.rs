//! The node's addresses (upstream `NodeAddress` setter without a cloud
//! provider): `InternalIP` from `--node-ip`, else the node name as an IP,
//! else a DNS lookup of the node name, else the address of the interface
//! holding the default route; then `Hostname`.
//!
//! [`choose`] is pure; [`AddressDetector`] gathers the host's interfaces,
//! routes and DNS answers.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::NodeAddress;

/// What the host's network looks like.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostNetwork {
    /// Every address on any interface (for validating a chosen IP).
    pub local_ips: Vec<IpAddr>,
    /// Global unicast addresses of up interfaces holding a default route,
    /// in route order.
    pub default_route_ips: Vec<IpAddr>,
    /// Global unicast addresses of any up, non-loopback interface (used when
    /// there is no default route at all).
    pub other_ips: Vec<IpAddr>,
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    }
}

/// Go's `IsGlobalUnicast`.
pub fn is_global_unicast(ip: &IpAddr) -> bool {
    !(ip.is_loopback()
        || ip.is_multicast()
        || ip.is_unspecified()
        || is_link_local(ip)
        || matches!(ip, IpAddr::V4(v4) if v4.is_broadcast()))
}

/// Why an address cannot be the node's IP (upstream `validateNodeIP`'s messages).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeIpError {
    #[error("nodeIP can't be loopback address")]
    Loopback,
    #[error("nodeIP can't be a multicast address")]
    Multicast,
    #[error("nodeIP can't be a link-local unicast address")]
    LinkLocal,
    #[error("nodeIP can't be an all zeros address")]
    Unspecified,
    #[error("node IP: {:?} not found in the host's network interfaces", .0.to_string())]
    NotLocal(IpAddr),
}

/// Why the node has no address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// `which` is `nodeIP` or `secondaryNodeIP`, as upstream names them.
    #[error("failed to validate {which}: {source}")]
    Given { which: &'static str, source: NodeIpError },
    #[error("can't get ip address of node {node}. error: {why}")]
    NoneFound { node: String, why: NoneFound },
}

/// The last reason an address was passed over.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoneFound {
    #[error("")]
    NoCandidate,
    #[error(transparent)]
    Invalid(#[from] NodeIpError),
    #[error("no default route and no global unicast address on any interface")]
    NoRoute,
}

/// Upstream `validateNodeIP`.
pub fn validate_node_ip(ip: &IpAddr, local_ips: &[IpAddr]) -> Result<(), NodeIpError> {
    if ip.is_loopback() {
        return Err(NodeIpError::Loopback);
    }
    if ip.is_multicast() {
        return Err(NodeIpError::Multicast);
    }
    if is_link_local(ip) {
        return Err(NodeIpError::LinkLocal);
    }
    if ip.is_unspecified() {
        return Err(NodeIpError::Unspecified);
    }
    if local_ips.contains(ip) {
        return Ok(());
    }
    Err(NodeIpError::NotLocal(*ip))
}

/// `--node-ip` as given: unlike upstream, a loopback address is accepted (with a warning) so
/// that a single-machine cluster, whose API server reaches the node API on 127.0.0.1, works.
/// Loopback answers from DNS are still skipped.
fn validate_given_node_ip(ip: &IpAddr, local_ips: &[IpAddr]) -> Result<(), NodeIpError> {
    if ip.is_loopback() {
        tracing::warn!(node_ip = %ip, "--node-ip is a loopback address: only processes on this machine can reach the node");
        return Ok(());
    }
    validate_node_ip(ip, local_ips)
}

/// Chooses the node's addresses. `node_ips` is `--node-ip` (unspecified
/// addresses only set the preferred family), `dns` the node name's DNS
/// answers.
pub fn choose(
    node_ips: &[IpAddr],
    node_name: &str,
    hostname: &str,
    dns: &[IpAddr],
    net: &HostNetwork,
) -> Result<Vec<NodeAddress>, AddressError> {
    let primary = node_ips.first().filter(|ip| !ip.is_unspecified());
    let secondary = node_ips.get(1).filter(|ip| !ip.is_unspecified());
    // IPv4 is preferred unless --node-ip is an IPv6 address (such as "::").
    let prefer_v6 = node_ips.first().is_some_and(IpAddr::is_ipv6);
    let preferred = |ip: &IpAddr| ip.is_ipv6() == prefer_v6;

    if let Some(ip) = primary {
        validate_given_node_ip(ip, &net.local_ips).map_err(|source| AddressError::Given { which: "nodeIP", source })?;
    }
    if let Some(ip) = secondary {
        validate_given_node_ip(ip, &net.local_ips)
            .map_err(|source| AddressError::Given { which: "secondaryNodeIP", source })?;
    }

    let mut last_error = NoneFound::NoCandidate;
    let chosen = if let Some(ip) = primary {
        Some(*ip)
    } else if let Ok(ip) = hostname.parse::<IpAddr>() {
        Some(ip)
    } else {
        let mut pick = None;
        for ip in dns {
            match validate_node_ip(ip, &net.local_ips) {
                Ok(()) if preferred(ip) => {
                    pick = Some(*ip);
                    break;
                }
                Ok(()) => {
                    pick = pick.or(Some(*ip));
                }
                Err(e) => last_error = e.into(),
            }
        }
        pick.or_else(|| {
            let from_route = net.default_route_ips.iter().find(|ip| preferred(ip));
            let any_route = net.default_route_ips.first();
            let other = net.other_ips.iter().find(|ip| preferred(ip)).or(net.other_ips.first());
            let found = from_route.or(any_route).or(other).copied();
            if found.is_none() {
                last_error = NoneFound::NoRoute;
            }
            found
        })
    };
    let Some(ip) = chosen else {
        return Err(AddressError::NoneFound { node: node_name.to_string(), why: last_error });
    };
    let mut out = vec![NodeAddress { type_: "InternalIP".into(), address: ip.to_string() }];
    if let Some(ip2) = secondary {
        out.push(NodeAddress { type_: "InternalIP".into(), address: ip2.to_string() });
    }
    out.push(NodeAddress { type_: "Hostname".into(), address: hostname.to_string() });
    Ok(out)
}

/// How long a DNS answer for the node name is reused.
const DNS_CACHE: Duration = Duration::from_secs(60);
const DNS_TIMEOUT: Duration = Duration::from_secs(2);

/// Gathers the host network and DNS answers for [`choose`].
#[derive(Default)]
pub struct AddressDetector {
    dns: Option<(Instant, Vec<IpAddr>)>,
}

impl AddressDetector {
    pub async fn detect(
        &mut self,
        node_ips: &[IpAddr],
        node_name: &str,
        hostname: &str,
    ) -> Result<Vec<NodeAddress>, AddressError> {
        let net = read_host_network();
        let need_dns = node_ips.first().is_none_or(IpAddr::is_unspecified) && hostname.parse::<IpAddr>().is_err();
        let dns = if need_dns { self.lookup(node_name).await } else { Vec::new() };
        choose(node_ips, node_name, hostname, &dns, &net)
    }

    async fn lookup(&mut self, name: &str) -> Vec<IpAddr> {
        if let Some((at, ips)) = &self.dns
            && at.elapsed() < DNS_CACHE
        {
            return ips.clone();
        }
        let ips = match tokio::time::timeout(DNS_TIMEOUT, tokio::net::lookup_host((name, 0))).await {
            Ok(Ok(addrs)) => {
                let mut ips: Vec<IpAddr> = Vec::new();
                for a in addrs {
                    if !ips.contains(&a.ip()) {
                        ips.push(a.ip());
                    }
                }
                ips
            }
            Ok(Err(_)) | Err(_) => Vec::new(),
        };
        self.dns = Some((Instant::now(), ips.clone()));
        ips
    }
}

/// Interfaces (getifaddrs) and default routes (/proc/net/route, ipv6_route).
pub fn read_host_network() -> HostNetwork {
    let mut ifaces: Vec<(String, IpAddr, bool)> = Vec::new();
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for ifa in addrs {
            let Some(addr) = ifa.address else { continue };
            let ip = if let Some(v4) = addr.as_sockaddr_in() {
                IpAddr::V4(v4.ip())
            } else if let Some(v6) = addr.as_sockaddr_in6() {
                IpAddr::V6(v6.ip())
            } else {
                continue;
            };
            let up = ifa.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP);
            ifaces.push((ifa.interface_name, ip, up));
        }
    }
    let v4_routes = std::fs::read_to_string("/proc/net/route").map(|t| default_route_ifaces_v4(&t)).unwrap_or_default();
    let v6_routes =
        std::fs::read_to_string("/proc/net/ipv6_route").map(|t| default_route_ifaces_v6(&t)).unwrap_or_default();
    host_network(&ifaces, &v4_routes, &v6_routes)
}

/// Pure part of [`read_host_network`].
pub fn host_network(ifaces: &[(String, IpAddr, bool)], v4_routes: &[String], v6_routes: &[String]) -> HostNetwork {
    let mut net = HostNetwork { local_ips: ifaces.iter().map(|(_, ip, _)| *ip).collect(), ..Default::default() };
    let usable = |name: &str, v6: bool| -> Vec<IpAddr> {
        ifaces
            .iter()
            .filter(|(n, ip, up)| n == name && *up && ip.is_ipv6() == v6 && is_global_unicast(ip))
            .map(|(_, ip, _)| *ip)
            .collect()
    };
    for (routes, v6) in [(v4_routes, false), (v6_routes, true)] {
        for iface in routes {
            for ip in usable(iface, v6) {
                if !net.default_route_ips.contains(&ip) {
                    net.default_route_ips.push(ip);
                }
            }
        }
    }
    for (_, ip, up) in ifaces {
        if *up && is_global_unicast(ip) && !net.other_ips.contains(ip) {
            net.other_ips.push(*ip);
        }
    }
    net.other_ips.sort_by_key(IpAddr::is_ipv6);
    net
}

/// Interfaces with an IPv4 default route (destination and mask 0).
pub fn default_route_ifaces_v4(route: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in route.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 8 && f[1] == "00000000" && f[7] == "00000000" && !out.contains(&f[0].to_string()) {
            out.push(f[0].to_string());
        }
    }
    out
}

/// Interfaces with an IPv6 default route (`::/0`).
pub fn default_route_ifaces_v6(route: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in route.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 10 && f[0] == "00000000000000000000000000000000" && f[1] == "00" && f[9] != "lo" {
            let iface = f[9].to_string();
            if !out.contains(&iface) {
                out.push(iface);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn net() -> HostNetwork {
        HostNetwork {
            local_ips: vec![ip("127.0.0.1"), ip("192.0.2.2"), ip("10.1.0.5"), ip("fd00::2"), ip("fe80::1")],
            default_route_ips: vec![ip("192.0.2.2"), ip("fd00::2")],
            other_ips: vec![ip("192.0.2.2"), ip("10.1.0.5"), ip("fd00::2")],
        }
    }

    fn addrs(a: &[NodeAddress]) -> Vec<String> {
        a.iter().map(|a| format!("{}={}", a.type_, a.address)).collect()
    }

    #[test]
    fn node_ip_flag_wins_and_is_validated() {
        let a = choose(&[ip("10.1.0.5")], "n1", "n1", &[], &net()).unwrap();
        assert_eq!(addrs(&a), vec!["InternalIP=10.1.0.5", "Hostname=n1"]);
        let a = choose(&[ip("10.1.0.5"), ip("fd00::2")], "n1", "n1", &[], &net()).unwrap();
        assert_eq!(addrs(&a), vec!["InternalIP=10.1.0.5", "InternalIP=fd00::2", "Hostname=n1"]);
        // Loopback is allowed when given explicitly (single-machine clusters).
        let a = choose(&[ip("127.0.0.1")], "n1", "n1", &[], &net()).unwrap();
        assert_eq!(addrs(&a), vec!["InternalIP=127.0.0.1", "Hostname=n1"]);
        assert_eq!(
            validate_node_ip(&ip("127.0.0.1"), &net().local_ips).unwrap_err().to_string(),
            "nodeIP can't be loopback address"
        );
        assert_eq!(
            choose(&[ip("10.9.9.9")], "n1", "n1", &[], &net()).unwrap_err().to_string(),
            "failed to validate nodeIP: node IP: \"10.9.9.9\" not found in the host's network interfaces"
        );
        assert!(choose(&[ip("fe80::1")], "n1", "n1", &[], &net()).unwrap_err().to_string().contains("link-local"));
        assert!(
            choose(&[ip("10.1.0.5"), ip("fd00::9")], "n1", "n1", &[], &net())
                .unwrap_err()
                .to_string()
                .starts_with("failed to validate secondaryNodeIP")
        );
    }

    #[test]
    fn hostname_as_ip_then_dns_then_default_route() {
        let a = choose(&[], "10.3.3.3", "10.3.3.3", &[], &net()).unwrap();
        assert_eq!(addrs(&a), vec!["InternalIP=10.3.3.3", "Hostname=10.3.3.3"]);
        // DNS answers are validated: loopback and foreign ones are skipped; IPv4 preferred.
        let a = choose(&[], "n1", "n1", &[ip("127.0.1.1"), ip("fd00::2"), ip("10.1.0.5")], &net()).unwrap();
        assert_eq!(addrs(&a), vec!["InternalIP=10.1.0.5", "Hostname=n1"]);
        let a = choose(&[], "n1", "n1", &[ip("127.0.1.1"), ip("fd00::2")], &net()).unwrap();
        assert_eq!(addrs(&a), vec!["InternalIP=fd00::2", "Hostname=n1"]);
        // Nothing from DNS: the default route's interface.
        let a = choose(&[], "n1", "n1", &[ip("127.0.1.1")], &net()).unwrap();
        assert_eq!(addrs(&a), vec!["InternalIP=192.0.2.2", "Hostname=n1"]);
        // "::" prefers IPv6.
        let a = choose(&[ip("::")], "n1", "n1", &[], &net()).unwrap();
        assert_eq!(addrs(&a), vec!["InternalIP=fd00::2", "Hostname=n1"]);
    }

    #[test]
    fn without_default_route_any_interface_and_then_an_error() {
        let mut n = net();
        n.default_route_ips.clear();
        let a = choose(&[], "n1", "n1", &[], &n).unwrap();
        assert_eq!(addrs(&a), vec!["InternalIP=192.0.2.2", "Hostname=n1"]);
        let n = HostNetwork { local_ips: vec![ip("127.0.0.1")], ..Default::default() };
        assert!(
            choose(&[], "n1", "n1", &[], &n).unwrap_err().to_string().starts_with("can't get ip address of node n1")
        );
    }

    #[test]
    fn routes_and_interfaces() {
        let route = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                     eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                     eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        assert_eq!(default_route_ifaces_v4(route), vec!["eth0"]);
        let v6 = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003     eth1\n\
                  00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n";
        assert_eq!(default_route_ifaces_v6(v6), vec!["eth1"]);
        let ifaces = vec![
            ("lo".to_string(), ip("127.0.0.1"), true),
            ("eth0".to_string(), ip("192.0.2.2"), true),
            ("eth0".to_string(), ip("fe80::5"), true),
            ("eth1".to_string(), ip("fd00::7"), true),
            ("eth2".to_string(), ip("10.0.0.9"), false),
        ];
        let n = host_network(&ifaces, &["eth0".into()], &["eth1".into()]);
        assert_eq!(n.default_route_ips, vec![ip("192.0.2.2"), ip("fd00::7")]);
        assert_eq!(n.other_ips, vec![ip("192.0.2.2"), ip("fd00::7")]);
        assert_eq!(n.local_ips.len(), 5);
    }

    #[test]
    fn reads_this_host() {
        let n = read_host_network();
        assert!(n.local_ips.iter().any(IpAddr::is_loopback), "{n:?}");
    }
}
