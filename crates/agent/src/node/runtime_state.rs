//! The container runtime's health as the Ready condition reports it
//! (upstream `runtimeState` and `updateRuntimeUp`): fed with CRI `Status`
//! answers, read as the list of errors that make the node NotReady.

use gantry_cri::api::{RuntimeCondition, StatusResponse};
use k8s_openapi::api::core::v1::{NodeRuntimeHandler, NodeRuntimeHandlerFeatures};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// After this long without a healthy runtime status the runtime is "down"
/// (upstream `maxWaitForContainerRuntime`).
pub const RUNTIME_SYNC_THRESHOLD: SignedDuration = SignedDuration::from_secs(30);

/// The initial network error (upstream `ErrNetworkUnknown`).
pub const NETWORK_UNKNOWN: &str = "network state unknown";

#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeState {
    last_sync: Option<Timestamp>,
    runtime_error: Option<String>,
    network_error: Option<String>,
    /// The runtime handlers and their features, as the last `Status` listed them (none for a
    /// runtime that does not list them, such as containerd before 2.0).
    handlers: Vec<NodeRuntimeHandler>,
}

impl Default for RuntimeState {
    fn default() -> Self {
        RuntimeState {
            last_sync: None,
            runtime_error: None,
            network_error: Some(NETWORK_UNKNOWN.to_string()),
            handlers: Vec::new(),
        }
    }
}

impl RuntimeState {
    /// Takes in one CRI `Status` answer (upstream `updateRuntimeUp`). A
    /// failed `Status` call changes nothing: the runtime turns "down" once
    /// the last good answer is older than [`RUNTIME_SYNC_THRESHOLD`].
    pub fn observe(&mut self, status: &StatusResponse, now: Timestamp) {
        self.handlers = status.runtime_handlers.iter().map(node_runtime_handler).collect();
        let conditions = status.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        let find = |t: &str| conditions.iter().find(|c| c.r#type == t);
        let network = find("NetworkReady");
        self.network_error = match network {
            Some(c) if c.status => None,
            other => Some(format!("container runtime network not ready: {}", condition_string(other))),
        };
        let runtime = find("RuntimeReady");
        match runtime {
            Some(c) if c.status => {
                self.runtime_error = None;
                self.last_sync = Some(now);
            }
            other => {
                self.runtime_error = Some(format!("container runtime not ready: {}", condition_string(other)));
            }
        }
    }

    /// `status.runtimeHandlers` of the Node.
    pub fn handlers(&self) -> &[NodeRuntimeHandler] {
        &self.handlers
    }

    /// The errors that make the node NotReady, in upstream's order (runtime,
    /// then network).
    pub fn errors(&self, now: Timestamp) -> Vec<String> {
        let mut errs = Vec::new();
        match self.last_sync {
            None => errs.push("container runtime status check may not have completed yet".to_string()),
            Some(t) if t + RUNTIME_SYNC_THRESHOLD <= now => errs.push("container runtime is down".to_string()),
            Some(_) => {}
        }
        errs.extend(self.runtime_error.clone());
        errs.extend(self.network_error.clone());
        errs
    }
}

/// A CRI runtime handler as the Node reports it (upstream's `RuntimeHandlers` setter: both
/// features always present).
fn node_runtime_handler(h: &gantry_cri::api::RuntimeHandler) -> NodeRuntimeHandler {
    let features = h.features.unwrap_or_default();
    NodeRuntimeHandler {
        name: Some(h.name.clone()),
        features: Some(NodeRuntimeHandlerFeatures {
            recursive_read_only_mounts: Some(features.recursive_read_only_mounts),
            user_namespaces: Some(features.user_namespaces),
        }),
    }
}

/// Upstream `RuntimeCondition.String()`; `<nil>` when the runtime did not
/// report the condition.
fn condition_string(c: Option<&RuntimeCondition>) -> String {
    match c {
        Some(c) => format!("{}={} reason:{} message:{}", c.r#type, c.status, c.reason, c.message),
        None => "<nil>".to_string(),
    }
}

/// Upstream `utilerrors.NewAggregate(...).Error()`: one message as is, more
/// as `[a, b]`, duplicates dropped.
pub fn aggregate(errors: &[String]) -> Option<String> {
    let mut seen: Vec<&str> = Vec::new();
    for e in errors {
        if !seen.contains(&e.as_str()) {
            seen.push(e);
        }
    }
    match seen.len() {
        0 => None,
        1 => Some(seen[0].to_string()),
        _ => Some(format!("[{}]", seen.join(", "))),
    }
}

#[cfg(test)]
mod tests {
    use gantry_cri::api::RuntimeStatus;

    use super::*;

    fn status(runtime: Option<bool>, network: Option<(bool, &str, &str)>) -> StatusResponse {
        let mut conditions = Vec::new();
        if let Some(ok) = runtime {
            conditions.push(RuntimeCondition { r#type: "RuntimeReady".into(), status: ok, ..Default::default() });
        }
        if let Some((ok, reason, message)) = network {
            conditions.push(RuntimeCondition {
                r#type: "NetworkReady".into(),
                status: ok,
                reason: reason.into(),
                message: message.into(),
            });
        }
        StatusResponse { status: Some(RuntimeStatus { conditions }), ..Default::default() }
    }

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    #[test]
    fn handlers_are_those_of_the_last_status_with_both_features() {
        let mut state = RuntimeState::default();
        let mut answer = status(Some(true), Some((true, "", "")));
        answer.runtime_handlers = vec![gantry_cri::api::RuntimeHandler { name: String::new(), features: None }];
        state.observe(&answer, t(0));
        let reported = serde_json::to_value(state.handlers()).unwrap();
        let expected =
            serde_json::json!([{"name": "", "features": {"recursiveReadOnlyMounts": false, "userNamespaces": false}}]);
        assert_eq!(reported, expected);
        state.observe(&status(Some(true), Some((true, "", ""))), t(1));
        assert!(state.handlers().is_empty(), "a runtime that lists none");
    }

    #[test]
    fn before_the_first_status() {
        let st = RuntimeState::default();
        assert_eq!(
            st.errors(t(0)),
            vec!["container runtime status check may not have completed yet", "network state unknown"]
        );
        assert_eq!(
            aggregate(&st.errors(t(0))).unwrap(),
            "[container runtime status check may not have completed yet, network state unknown]"
        );
    }

    #[test]
    fn healthy_runtime_has_no_errors() {
        let mut st = RuntimeState::default();
        st.observe(&status(Some(true), Some((true, "", ""))), t(0));
        assert!(st.errors(t(10)).is_empty());
        assert_eq!(aggregate(&st.errors(t(10))), None);
    }

    #[test]
    fn network_not_ready_message_is_upstreams() {
        let mut st = RuntimeState::default();
        st.observe(
            &status(
                Some(true),
                Some((false, "NetworkPluginNotReady", "Network plugin returns error: cni plugin not initialized")),
            ),
            t(0),
        );
        assert_eq!(
            st.errors(t(1)),
            vec![
                "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized"
            ]
        );
    }

    #[test]
    fn runtime_not_ready_and_missing_conditions() {
        let mut st = RuntimeState::default();
        st.observe(&status(None, None), t(0));
        assert_eq!(
            st.errors(t(1)),
            vec![
                "container runtime status check may not have completed yet",
                "container runtime not ready: <nil>",
                "container runtime network not ready: <nil>"
            ]
        );
    }

    #[test]
    fn runtime_goes_down_after_the_threshold() {
        let mut st = RuntimeState::default();
        st.observe(&status(Some(true), Some((true, "", ""))), t(0));
        assert!(st.errors(t(29)).is_empty());
        assert_eq!(st.errors(t(30)), vec!["container runtime is down"]);
        // A good answer brings it back.
        st.observe(&status(Some(true), Some((true, "", ""))), t(31));
        assert!(st.errors(t(32)).is_empty());
    }

    #[test]
    fn aggregate_dedupes() {
        assert_eq!(aggregate(&["a".into(), "a".into()]).unwrap(), "a");
        assert_eq!(aggregate(&["a".into(), "b".into(), "a".into()]).unwrap(), "[a, b]");
    }
}
