//! The node's Lease (`kube-node-lease/<node>`), the cheap heartbeat the node
//! lifecycle controller watches (upstream `nodelease` controller).

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;

pub const LEASE_NAMESPACE: &str = "kube-node-lease";

/// The lease to write: `base` (the last one read or written) renewed now,
/// or a new one. The owner reference to the Node is added once its UID is
/// known, and never removed.
pub fn renewed_lease(
    base: Option<&Lease>,
    node: &str,
    duration_seconds: i32,
    node_uid: Option<&str>,
    now: Timestamp,
) -> Lease {
    let mut lease = base.cloned().unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(node.to_string()),
            namespace: Some(LEASE_NAMESPACE.to_string()),
            ..Default::default()
        },
        spec: None,
    });
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(node.to_string());
    spec.lease_duration_seconds = Some(duration_seconds);
    // MicroTime: the API keeps microseconds.
    let micros = now.as_microsecond();
    spec.renew_time = Some(MicroTime(Timestamp::from_microsecond(micros).unwrap_or(now)));
    if lease.metadata.owner_references.as_ref().is_none_or(Vec::is_empty)
        && let Some(uid) = node_uid
    {
        lease.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.to_string(),
            uid: uid.to_string(),
            ..Default::default()
        }]);
    }
    lease
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    #[test]
    fn new_lease_with_owner() {
        let l = renewed_lease(None, "n1", 40, Some("uid-1"), t(0));
        assert_eq!(l.metadata.name.as_deref(), Some("n1"));
        assert_eq!(l.metadata.namespace.as_deref(), Some("kube-node-lease"));
        let spec = l.spec.as_ref().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("n1"));
        assert_eq!(spec.lease_duration_seconds, Some(40));
        assert_eq!(spec.renew_time.as_ref().unwrap().0, t(0));
        let owner = &l.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.api_version.as_str(), owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("v1", "Node", "n1", "uid-1")
        );
    }

    #[test]
    fn renewal_keeps_the_object_and_adds_a_missing_owner() {
        let mut base = renewed_lease(None, "n1", 40, None, t(0));
        assert!(base.metadata.owner_references.is_none());
        base.metadata.resource_version = Some("7".into());
        let l = renewed_lease(Some(&base), "n1", 40, Some("uid-1"), t(10));
        assert_eq!(l.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(l.spec.as_ref().unwrap().renew_time.as_ref().unwrap().0, t(10));
        assert_eq!(l.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-1");
        // An existing owner reference is kept as it is.
        let again = renewed_lease(Some(&l), "n1", 40, Some("uid-2"), t(20));
        assert_eq!(again.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-1");
    }
}
