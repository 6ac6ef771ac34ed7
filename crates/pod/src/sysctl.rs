//! Pod sysctl admission, as upstream's: safe sysctls are always allowed, others only when
//! `allowedUnsafeSysctls` lists them; namespaced sysctls are refused when the pod shares that
//! namespace with the host. A refused pod fails with reason `SysctlForbidden`.

use k8s_openapi::api::core::v1::Pod;

pub const FORBIDDEN_REASON: &str = "SysctlForbidden";

/// Upstream's safe sysctls (namespaced, isolated from other pods).
const SAFE: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// Which namespace a sysctl belongs to, if any (upstream `NamespacedBy`).
#[derive(Debug, PartialEq, Eq)]
enum Namespace {
    Ipc,
    Net,
}

fn namespace_of(name: &str) -> Option<Namespace> {
    const IPC: &[&str] = &["kernel.sem", "kernel.shmall", "kernel.shmmax", "kernel.shmmni", "kernel.shm_rmid_forced"];
    if IPC.contains(&name) || name.starts_with("kernel.msg") || name.starts_with("fs.mqueue.") {
        Some(Namespace::Ipc)
    } else if name.starts_with("net.") {
        Some(Namespace::Net)
    } else {
        None
    }
}

/// Sysctl names may use `/` as the separator (then dots are part of a component); upstream
/// compares them in dotted form, swapping the two.
fn normalize(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|c| {
                if c == '/' {
                    '.'
                } else if c == '.' {
                    '/'
                } else {
                    c
                }
            })
            .collect(),
        _ => name.to_string(),
    }
}

fn allowed(name: &str, unsafe_allowed: &[String]) -> bool {
    SAFE.contains(&name)
        || unsafe_allowed.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => p == name,
        })
}

/// Why a pod's sysctl is refused, with upstream's wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Forbidden {
    #[error("not allowed with host net enabled")]
    HostNet,
    #[error("not allowed with host ipc enabled")]
    HostIpc,
    #[error("not allowlisted")]
    NotAllowlisted,
}

/// A sysctl that makes the node reject the pod (the pod status shows the message prefixed
/// with "Pod was rejected: ").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("forbidden sysctl: {name:?} {why}")]
pub struct ForbiddenSysctl {
    pub name: String,
    pub why: Forbidden,
}

/// The first sysctl of the pod this node refuses, if any.
pub fn admit(pod: &Pod, unsafe_allowed: &[String]) -> Result<(), ForbiddenSysctl> {
    let spec = pod.spec.as_ref();
    let sysctls = spec.and_then(|s| s.security_context.as_ref()).and_then(|s| s.sysctls.as_deref()).unwrap_or_default();
    let host_net = spec.and_then(|s| s.host_network).unwrap_or(false);
    let host_ipc = spec.and_then(|s| s.host_ipc).unwrap_or(false);
    for s in sysctls {
        let name = normalize(&s.name);
        let why = match namespace_of(&name) {
            Some(Namespace::Net) if host_net => Forbidden::HostNet,
            Some(Namespace::Ipc) if host_ipc => Forbidden::HostIpc,
            _ if !allowed(&name, unsafe_allowed) => Forbidden::NotAllowlisted,
            _ => continue,
        };
        return Err(ForbiddenSysctl { name: s.name.clone(), why });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSecurityContext, PodSpec, Sysctl};

    use super::*;

    fn pod(names: &[&str], host_network: bool) -> Pod {
        let sysctls = names.iter().map(|n| Sysctl { name: n.to_string(), value: "1".into() }).collect();
        Pod {
            spec: Some(PodSpec {
                host_network: Some(host_network),
                security_context: Some(PodSecurityContext { sysctls: Some(sysctls), ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn safe_sysctls_are_allowed() {
        assert!(admit(&pod(&["net.ipv4.ip_local_port_range", "kernel.shm_rmid_forced"], false), &[]).is_ok());
        assert!(admit(&pod(&["net/ipv4/tcp_syncookies"], false), &[]).is_ok(), "slash-separated names");
    }

    #[test]
    fn unsafe_sysctls_need_the_allow_list() {
        let p = pod(&["net.core.somaxconn"], false);
        assert_eq!(admit(&p, &[]).unwrap_err().to_string(), "forbidden sysctl: \"net.core.somaxconn\" not allowlisted");
        assert!(admit(&p, &["net.core.*".to_string()]).is_ok());
        assert!(admit(&p, &["net.core.somaxconn".to_string()]).is_ok());
        assert!(admit(&p, &["net.core.other".to_string()]).is_err());
    }

    #[test]
    fn namespaced_sysctls_clash_with_host_namespaces() {
        let e = admit(&pod(&["net.ipv4.tcp_syncookies"], true), &[]).unwrap_err();
        assert!(e.to_string().ends_with("\"net.ipv4.tcp_syncookies\" not allowed with host net enabled"), "{e}");
        let mut p = pod(&["kernel.shm_rmid_forced"], false);
        p.spec.as_mut().unwrap().host_ipc = Some(true);
        assert_eq!(admit(&p, &[]).unwrap_err().why, Forbidden::HostIpc);
    }
}
