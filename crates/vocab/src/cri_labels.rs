//! Labels and annotations Gantry puts on CRI objects. They are how a restarted Gantry finds
//! its own sandboxes and containers again, so they are part of the on-node format: the
//! `io.kubernetes.*` keys match the Go kubelet's, so tools such as crictl show them as usual.

use std::collections::HashMap;

pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Which node agent owns the object; Gantry leaves everything else in the runtime alone.
pub const NODE: &str = "gantry.dev/node";

pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
pub const RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub const GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
pub const TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
pub const TERMINATION_MESSAGE_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";

/// Identity labels of a pod's sandbox.
pub fn sandbox(node: &str, name: &str, namespace: &str, uid: &str) -> HashMap<String, String> {
    HashMap::from([
        (POD_NAME.to_string(), name.to_string()),
        (POD_NAMESPACE.to_string(), namespace.to_string()),
        (POD_UID.to_string(), uid.to_string()),
        (NODE.to_string(), node.to_string()),
    ])
}

/// Identity labels of one of a pod's containers.
pub fn container(node: &str, name: &str, namespace: &str, uid: &str, container: &str) -> HashMap<String, String> {
    let mut labels = sandbox(node, name, namespace, uid);
    labels.insert(CONTAINER_NAME.to_string(), container.to_string());
    labels
}

/// The selector that finds every object this node agent owns.
pub fn owned_by(node: &str) -> HashMap<String, String> {
    HashMap::from([(NODE.to_string(), node.to_string())])
}

/// The selector that finds one pod's objects.
pub fn of_pod(node: &str, uid: &str) -> HashMap<String, String> {
    HashMap::from([(NODE.to_string(), node.to_string()), (POD_UID.to_string(), uid.to_string())])
}
