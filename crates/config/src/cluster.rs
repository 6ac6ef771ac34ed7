//! Parsing and validation of the cluster-mode settings: node IPs, node labels,
//! taints to register with, reserved resources and hard eviction thresholds.
//! Messages follow the Go kubelet's where it has one.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use gantry_vocab::quantity::{self, QuantityError};

/// A taint to register the node with (`--register-with-taints`,
/// `registerWithTaints`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

impl fmt::Display for Taint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}:{}", self.key, self.effect)
        } else {
            write!(f, "{}={}:{}", self.key, self.value, self.effect)
        }
    }
}

/// Labels the kubelet may set on its own Node (upstream `v1.KubeletLabels`),
/// sorted as upstream lists them.
pub const KUBELET_LABELS: &[&str] = &[
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "kubernetes.io/arch",
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
];

/// Label namespaces (and their subdomains) the kubelet may set labels in.
pub const KUBELET_LABEL_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

/// Default hard eviction thresholds on Linux (`defaults_linux.go`).
pub const DEFAULT_EVICTION_HARD: &[(&str, &str)] = &[
    ("imagefs.available", "15%"),
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
];

/// Eviction signals upstream knows.
const EVICTION_SIGNALS: &[&str] = &[
    "memory.available",
    "allocatableMemory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "containerfs.available",
    "containerfs.inodesFree",
    "pid.available",
];

/// Resources that may be reserved (`kubeReserved`, `systemReserved`).
const RESERVABLE: &[&str] = &["cpu", "memory", "ephemeral-storage", "pid"];

fn label_namespace(key: &str) -> &str {
    key.split_once('/').map_or("", |(ns, _)| ns)
}

fn in_namespace(namespace: &str, domain: &str) -> bool {
    namespace == domain || namespace.ends_with(&format!(".{domain}"))
}

/// Whether the kubelet may set this label on its Node (`IsKubeletLabel`).
pub fn is_kubelet_label(key: &str) -> bool {
    KUBELET_LABELS.contains(&key)
        || KUBELET_LABEL_NAMESPACES.iter().any(|allowed| in_namespace(label_namespace(key), allowed))
}

/// Whether a label is in the `kubernetes.io` or `k8s.io` namespaces.
pub fn is_kubernetes_label(key: &str) -> bool {
    let ns = label_namespace(key);
    in_namespace(ns, "kubernetes.io") || in_namespace(ns, "k8s.io")
}

/// Why a node setting (node IPs, labels, taints, reservations, eviction thresholds) is
/// invalid, with upstream's messages; the caller adds the flag or field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SettingError {
    #[error("must contain either a single IP or a dual-stack pair of IPs")]
    TooManyNodeIps,
    #[error("dual-stack node IP cannot include '0.0.0.0' or '::'")]
    UnspecifiedDualStackIp,
    #[error("malformed pair {pair:?}, expect string{separator}string")]
    MalformedPair { pair: String, separator: char },
    #[error(
        "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: [{}]\n--node-labels in the \
         'kubernetes.io' namespace must begin with an allowed prefix ({}) or be in the specifically allowed set ({})",
        .0.join(" "),
        KUBELET_LABEL_NAMESPACES.join(", "),
        KUBELET_LABELS.join(", ")
    )]
    ForbiddenNodeLabels(Vec<String>),
    /// Each problem is `'key or value' - what is wrong`.
    #[error("invalid node labels: {}", .0.join("; "))]
    InvalidNodeLabels(Vec<String>),
    #[error("invalid taint spec: {0}: the effect is required (NoSchedule, PreferNoSchedule or NoExecute)")]
    TaintWithoutEffect(Taint),
    #[error("invalid taint effect: {0}, unsupported taint effect")]
    UnsupportedTaintEffect(String),
    #[error("invalid taint spec: {taint}, {}", problems.join("; "))]
    InvalidTaint { taint: Taint, problems: Vec<String> },
    #[error("invalid taint spec: {0}")]
    MalformedTaint(String),
    #[error("duplicated taints with the same key and effect: {0}")]
    DuplicateTaint(Taint),
    #[error("cannot reserve {0:?} resource")]
    UnreservableResource(String),
    #[error("failed to parse quantity {value:?} for {resource:?} resource: {source}")]
    ReservedQuantity { resource: String, value: String, source: QuantityError },
    #[error("resource quantity for {resource:?} cannot be negative: {value}")]
    NegativeReservation { resource: String, value: String },
    #[error("unsupported eviction signal {0}")]
    UnsupportedEvictionSignal(String),
    #[error(transparent)]
    EvictionQuantity(#[from] QuantityError),
    #[error("eviction percentage threshold {signal} must be >= 0%: {value}")]
    NegativeEvictionPercentage { signal: String, value: String },
    #[error("eviction percentage threshold {signal} must be <= 100%: {value}")]
    EvictionPercentageOver100 { signal: String, value: String },
    #[error("eviction threshold {signal} must be positive: {value}")]
    NonPositiveEvictionThreshold { signal: String, value: String },
}

/// Parses `--node-ip` as upstream's `ParseNodeIPArgument` does: comma
/// separated, blanks trimmed, at most one address per family. Values that are
/// not IP addresses are returned separately (upstream logs and ignores them).
pub fn parse_node_ips(value: &str) -> Result<(Vec<IpAddr>, Vec<String>), SettingError> {
    let mut ips = Vec::new();
    let mut invalid = Vec::new();
    if !value.is_empty() {
        for part in value.split(',') {
            let part = part.trim();
            match parse_ip_sloppy(part) {
                Some(ip) => ips.push(ip),
                None => invalid.push(part.to_string()),
            }
        }
    }
    if ips.len() > 2 || (ips.len() == 2 && ips[0].is_ipv6() == ips[1].is_ipv6()) {
        return Err(SettingError::TooManyNodeIps);
    }
    if ips.len() == 2 && ips.iter().any(IpAddr::is_unspecified) {
        return Err(SettingError::UnspecifiedDualStackIp);
    }
    Ok((ips, invalid))
}

/// Go's `ParseIPSloppy`: also accepts IPv4 parts with leading zeros.
fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() != 4 {
        return None;
    }
    let mut octets = [0u8; 4];
    for (o, p) in octets.iter_mut().zip(&parts) {
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *o = p.parse().ok()?;
    }
    Some(IpAddr::from(octets))
}

/// `key=value,key2=value2` (upstream `MapStringString`): blanks trimmed,
/// empty pairs skipped, a later key overrides an earlier one.
pub fn parse_key_value_list(value: &str, separator: char) -> Result<Vec<(String, String)>, SettingError> {
    let mut out = Vec::new();
    for pair in value.split(',') {
        let pair = pair.trim();
        if pair.is_empty() {
            continue;
        }
        let Some((k, v)) = pair.split_once(separator) else {
            return Err(SettingError::MalformedPair { pair: pair.to_string(), separator });
        };
        out.push((k.trim().to_string(), v.trim().to_string()));
    }
    Ok(out)
}

/// Upstream's `--node-labels` checks (`ValidateKubeletFlags`): labels in the
/// kubernetes.io/k8s.io namespaces must be ones the kubelet may set, and
/// keys and values must be valid label keys and values.
pub fn validate_node_labels(labels: &BTreeMap<String, String>) -> Result<(), SettingError> {
    let unknown: Vec<String> =
        labels.keys().filter(|k| is_kubernetes_label(k) && !is_kubelet_label(k)).cloned().collect();
    if !unknown.is_empty() {
        return Err(SettingError::ForbiddenNodeLabels(unknown));
    }
    let mut problems = Vec::new();
    for (k, v) in labels {
        let errs = qualified_name_errors(k);
        if !errs.is_empty() {
            problems.push(format!("'{k}' - {}", errs.join(", ")));
        }
        let errs = label_value_errors(v);
        if !errs.is_empty() {
            problems.push(format!("'{v}' - {}", errs.join(", ")));
        }
    }
    if !problems.is_empty() {
        return Err(SettingError::InvalidNodeLabels(problems));
    }
    Ok(())
}

fn is_name_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.'
}

fn valid_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|&c| is_name_char(c))
}

fn valid_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
                && (b[b.len() - 1].is_ascii_lowercase() || b[b.len() - 1].is_ascii_digit())
                && b.iter().all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        })
}

/// Upstream `IsQualifiedName` (label keys, taint keys).
pub fn qualified_name_errors(key: &str) -> Vec<String> {
    let parts: Vec<&str> = key.split('/').collect();
    let (prefix, name) = match parts.as_slice() {
        [name] => (None, *name),
        [prefix, name] => (Some(*prefix), *name),
        _ => {
            return vec![
                "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end \
                 with an alphanumeric character, with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
                    .to_string(),
            ];
        }
    };
    let mut errs = Vec::new();
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            errs.push("prefix part must be non-empty".to_string());
        } else if !valid_dns1123_subdomain(prefix) {
            errs.push(
                "prefix part must be a lowercase RFC 1123 subdomain of at most 253 characters (e.g. 'example.com')"
                    .to_string(),
            );
        }
    }
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else {
        if name.len() > 63 {
            errs.push("name part must be no more than 63 characters".to_string());
        }
        if !valid_name_part(name) {
            errs.push(
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an \
                 alphanumeric character (e.g. 'MyName', or 'my.name', or '123-abc')"
                    .to_string(),
            );
        }
    }
    errs
}

/// Upstream `IsValidLabelValue` (label values, taint values).
pub fn label_value_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !value.is_empty() && !valid_name_part(value) {
        errs.push(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must \
             start and end with an alphanumeric character (e.g. 'MyValue', or 'my_value', or '12345')"
                .to_string(),
        );
    }
    errs
}

/// Checks one taint's key, value and effect.
pub fn check_taint(key: &str, value: &str, effect: &str) -> Result<Taint, SettingError> {
    let spec = Taint { key: key.to_string(), value: value.to_string(), effect: effect.to_string() };
    if effect.is_empty() {
        return Err(SettingError::TaintWithoutEffect(spec));
    }
    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return Err(SettingError::UnsupportedTaintEffect(effect.to_string()));
    }
    for problems in [qualified_name_errors(key), label_value_errors(value)] {
        if !problems.is_empty() {
            return Err(SettingError::InvalidTaint { taint: spec, problems });
        }
    }
    Ok(spec)
}

/// `--register-with-taints`: `key=value:Effect` or `key:Effect`, comma
/// separated (upstream `ParseTaints`; removals `key-` are ignored).
pub fn parse_taints(value: &str) -> Result<Vec<Taint>, SettingError> {
    let mut out: Vec<Taint> = Vec::new();
    if value.trim().is_empty() {
        return Ok(out);
    }
    for spec in value.split(',') {
        if spec.ends_with('-') {
            continue;
        }
        let (kv, effect) = match spec.split(':').collect::<Vec<_>>().as_slice() {
            [kv] => (*kv, ""),
            [kv, effect] => (*kv, *effect),
            _ => return Err(SettingError::MalformedTaint(spec.to_string())),
        };
        let (key, val) = match kv.split('=').collect::<Vec<_>>().as_slice() {
            [key] => (*key, ""),
            [key, val] => (*key, *val),
            _ => return Err(SettingError::MalformedTaint(spec.to_string())),
        };
        if effect.is_empty() {
            return Err(SettingError::MalformedTaint(spec.to_string()));
        }
        let taint = check_taint(key, val, effect)?;
        if out.iter().any(|t| t.key == taint.key && t.effect == taint.effect) {
            return Err(SettingError::DuplicateTaint(taint));
        }
        out.push(taint);
    }
    Ok(out)
}

/// `kubeReserved` / `systemReserved`: cpu, memory, ephemeral-storage and pid
/// with non-negative quantities (upstream `parseResourceList`).
pub fn check_reserved(map: &BTreeMap<String, String>) -> Result<(), SettingError> {
    for (k, v) in map {
        if !RESERVABLE.contains(&k.as_str()) {
            return Err(SettingError::UnreservableResource(k.clone()));
        }
        let q = quantity::parse_milli(v).map_err(|source| SettingError::ReservedQuantity {
            resource: k.clone(),
            value: v.clone(),
            source,
        })?;
        if q < 0 {
            return Err(SettingError::NegativeReservation { resource: k.clone(), value: v.clone() });
        }
    }
    Ok(())
}

/// Every key is an eviction signal upstream knows (`evictionSoftGracePeriod`).
pub fn check_signals(map: &BTreeMap<String, String>) -> Result<(), SettingError> {
    match map.keys().find(|s| !EVICTION_SIGNALS.contains(&s.as_str())) {
        Some(signal) => Err(SettingError::UnsupportedEvictionSignal(signal.clone())),
        None => Ok(()),
    }
}

/// `evictionMinimumReclaim`: known signals with a non-negative quantity or a percentage
/// from 0% to 100%.
pub fn check_minimum_reclaim(map: &BTreeMap<String, String>) -> Result<(), SettingError> {
    check_signals(map)?;
    for (signal, v) in map {
        if v.ends_with('%') {
            check_percentage(signal, v)?;
        } else if quantity::parse_milli(v)? < 0 {
            return Err(SettingError::NonPositiveEvictionThreshold { signal: signal.clone(), value: v.clone() });
        }
    }
    Ok(())
}

/// A percentage threshold lies within 0% and 100%.
fn check_percentage(signal: &str, v: &str) -> Result<(), SettingError> {
    let p = quantity::parse_percentage(v)?;
    if p < 0.0 {
        return Err(SettingError::NegativeEvictionPercentage { signal: signal.into(), value: v.into() });
    }
    if p > 1.0 {
        return Err(SettingError::EvictionPercentageOver100 { signal: signal.into(), value: v.into() });
    }
    Ok(())
}

/// Hard eviction thresholds (`evictionHard`): known signals with a positive
/// quantity or a percentage (upstream `parseThresholdStatement`).
pub fn check_eviction(map: &BTreeMap<String, String>) -> Result<(), SettingError> {
    for (signal, v) in map {
        if !EVICTION_SIGNALS.contains(&signal.as_str()) {
            return Err(SettingError::UnsupportedEvictionSignal(signal.clone()));
        }
        if v.ends_with('%') {
            check_percentage(signal, v)?;
            continue;
        }
        let q = quantity::parse_milli(v)?;
        if q <= 0 {
            return Err(SettingError::NonPositiveEvictionThreshold { signal: signal.clone(), value: v.clone() });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ips() {
        let (ips, bad) = parse_node_ips("10.0.0.1").unwrap();
        assert_eq!(ips, vec!["10.0.0.1".parse::<IpAddr>().unwrap()]);
        assert!(bad.is_empty());
        let (ips, _) = parse_node_ips(" 10.0.0.1 , fd00::1").unwrap();
        assert_eq!(ips.len(), 2);
        let (ips, bad) = parse_node_ips("10.0.0.1,nonsense").unwrap();
        assert_eq!(ips.len(), 1);
        assert_eq!(bad, vec!["nonsense"]);
        assert_eq!(parse_node_ips("010.000.000.001").unwrap().0, vec!["10.0.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(
            parse_node_ips("10.0.0.1,10.0.0.2").unwrap_err().to_string(),
            "must contain either a single IP or a dual-stack pair of IPs"
        );
        assert!(parse_node_ips("1.1.1.1,::1,2.2.2.2").is_err());
        assert_eq!(
            parse_node_ips("0.0.0.0,fd00::1").unwrap_err().to_string(),
            "dual-stack node IP cannot include '0.0.0.0' or '::'"
        );
        assert!(parse_node_ips("").unwrap().0.is_empty());
        assert_eq!(parse_node_ips("::").unwrap().0, vec!["::".parse::<IpAddr>().unwrap()]);
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn node_label_namespaces() {
        for ok in [
            "kubernetes.io/hostname",
            "node.kubernetes.io/exclude-from-external-load-balancers",
            "foo.node.kubernetes.io/x",
            "kubelet.kubernetes.io/role",
            "topology.kubernetes.io/zone",
            "example.com/team",
            "plain",
            "node-role.example.com/worker",
        ] {
            validate_node_labels(&labels(&[(ok, "v")])).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        let e = validate_node_labels(&labels(&[("node-role.kubernetes.io/worker", ""), ("k8s.io/x", "1")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: [k8s.io/x node-role.kubernetes.io/worker]"
            ),
            "{e}"
        );
        assert!(e.contains("allowed prefix (kubelet.kubernetes.io, node.kubernetes.io)"), "{e}");
        assert!(validate_node_labels(&labels(&[("sub.k8s.io/x", "1")])).is_err());
    }

    #[test]
    fn node_label_syntax() {
        let e = validate_node_labels(&labels(&[("bad key", "v")])).unwrap_err().to_string();
        assert!(e.starts_with("invalid node labels: 'bad key' - name part must consist"), "{e}");
        let e = validate_node_labels(&labels(&[("k", "-v")])).unwrap_err().to_string();
        assert!(e.contains("'-v' - a valid label"), "{e}");
        let e = validate_node_labels(&labels(&[("Example.com/k", "v")])).unwrap_err().to_string();
        assert!(e.contains("prefix part"), "{e}");
        let long = "a".repeat(64);
        assert!(validate_node_labels(&labels(&[("k", &long)])).is_err());
        assert!(validate_node_labels(&labels(&[(&long, "v")])).is_err());
        assert!(validate_node_labels(&labels(&[("a/b/c", "v")])).is_err());
        validate_node_labels(&labels(&[("k", "")])).unwrap();
    }

    #[test]
    fn key_value_lists() {
        assert_eq!(
            parse_key_value_list(" a = 1 ,b=2,,c=x=y", '=').unwrap(),
            vec![("a".into(), "1".into()), ("b".into(), "2".into()), ("c".into(), "x=y".into())]
        );
        assert!(parse_key_value_list("novalue", '=').unwrap_err().to_string().contains("malformed pair"));
        assert_eq!(
            parse_key_value_list("memory.available<1Gi,nodefs.available<5%", '<').unwrap(),
            vec![("memory.available".into(), "1Gi".into()), ("nodefs.available".into(), "5%".into())]
        );
    }

    #[test]
    fn taints() {
        let t = parse_taints("dedicated=gpu:NoSchedule,node.example.com/maint:NoExecute").unwrap();
        assert_eq!(
            t,
            vec![
                Taint { key: "dedicated".into(), value: "gpu".into(), effect: "NoSchedule".into() },
                Taint { key: "node.example.com/maint".into(), value: String::new(), effect: "NoExecute".into() },
            ]
        );
        assert_eq!(t[0].to_string(), "dedicated=gpu:NoSchedule");
        assert_eq!(parse_taints("").unwrap(), vec![]);
        assert_eq!(parse_taints("a:NoSchedule,b-").unwrap().len(), 1);
        assert_eq!(parse_taints("a=b").unwrap_err(), SettingError::MalformedTaint("a=b".into()));
        assert_eq!(
            parse_taints("a=b:Sometimes").unwrap_err().to_string(),
            "invalid taint effect: Sometimes, unsupported taint effect"
        );
        assert!(parse_taints("a=b=c:NoSchedule").unwrap_err().to_string().starts_with("invalid taint spec"));
        assert!(parse_taints("a:b:NoSchedule").is_err());
        assert!(parse_taints("bad key:NoSchedule").unwrap_err().to_string().contains("name part"));
        assert!(parse_taints("a=b:NoSchedule,a=c:NoSchedule").unwrap_err().to_string().contains("duplicated taints"));
        assert_eq!(parse_taints("a=b:NoSchedule,a=c:NoExecute").unwrap().len(), 2);
    }

    #[test]
    fn reserved_and_eviction() {
        check_reserved(&labels(&[("cpu", "100m"), ("memory", "1Gi"), ("ephemeral-storage", "1G"), ("pid", "100")]))
            .unwrap();
        assert_eq!(
            check_reserved(&labels(&[("gpu", "1")])).unwrap_err().to_string(),
            "cannot reserve \"gpu\" resource"
        );
        assert!(check_reserved(&labels(&[("memory", "-1Gi")])).unwrap_err().to_string().contains("cannot be negative"));
        assert!(
            check_reserved(&labels(&[("memory", "lots")]))
                .unwrap_err()
                .to_string()
                .contains("failed to parse quantity")
        );

        check_eviction(&labels(&[("memory.available", "100Mi"), ("nodefs.available", "10%")])).unwrap();
        assert!(
            check_eviction(&labels(&[("memory.free", "1")]))
                .unwrap_err()
                .to_string()
                .contains("unsupported eviction signal")
        );
        assert!(
            check_eviction(&labels(&[("memory.available", "0")])).unwrap_err().to_string().contains("must be positive")
        );
        assert!(check_eviction(&labels(&[("nodefs.available", "101%")])).unwrap_err().to_string().contains("<= 100%"));
        assert!(check_eviction(&labels(&[("nodefs.available", "-1%")])).unwrap_err().to_string().contains(">= 0%"));
    }
}
