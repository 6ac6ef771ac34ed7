//! `plan`: a dry run of a maintenance's drain on live cluster data. Lists, in the order the
//! controller would act, which pods each drain plan entry takes from which node, using the
//! planner's own node selection and entry matching; it changes nothing.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::api::{DrainPlanEntry, NodeMaintenance, PodType};
use crate::plan::{effective_drain_plan, entry_matches, loss_reason, pod_priority, pod_type, selected_nodes};

use super::table::render;

/// One pod the drain would take, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// 1-based index of the drain plan entry.
    pub entry: usize,
    pub node: String,
    pub namespace: String,
    pub pod: String,
    pub pod_type: PodType,
    pub priority: i32,
    /// Why evicting this pod would lose it or its data: it blocks its node's drain.
    pub blocks: Option<String>,
}

/// The drain plan in force, with each live pod on a selected node under the first entry that
/// matches it (an entry's pods all go before the next entry starts).
pub fn steps(m: &NodeMaintenance, nodes: &[Node], pods: &[Pod]) -> Vec<Step> {
    let plan = effective_drain_plan(m);
    let selected: BTreeSet<String> = selected_nodes(m, nodes).into_iter().collect();
    let mut candidates: Vec<&Pod> = pods
        .iter()
        .filter(|p| !terminal(p))
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some_and(|n| selected.contains(n)))
        .collect();
    candidates.sort_by_key(|p| (node_of(p), p.metadata.namespace.clone(), p.metadata.name.clone()));
    let mut out = Vec::new();
    for pod in candidates {
        if let Some(i) = plan.iter().position(|e| entry_matches(e, pod)) {
            out.push(Step {
                entry: i + 1,
                node: node_of(pod),
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                pod: pod.metadata.name.clone().unwrap_or_default(),
                pod_type: pod_type(pod),
                priority: pod_priority(pod),
                blocks: loss_reason(m, pod),
            });
        }
    }
    out.sort_by(|a, b| (a.entry, &a.node, &a.namespace, &a.pod).cmp(&(b.entry, &b.node, &b.namespace, &b.pod)));
    out
}

fn node_of(p: &Pod) -> String {
    p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default()
}

fn terminal(p: &Pod) -> bool {
    matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// `Default priority<=1000000000 app=db`: how an entry reads in the listing.
pub fn describe_entry(e: &DrainPlanEntry) -> String {
    let mut text = format!("{:?} priority<={}", e.pod_type, e.pod_priority);
    if let Some(sel) = &e.pod_selector {
        let mut parts: Vec<String> = sel.match_labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        parts
            .extend(sel.match_expressions.iter().map(|r| format!("{} {} ({})", r.key, r.operator, r.values.join(","))));
        text.push(' ');
        text.push_str(&parts.join(","));
    }
    text
}

/// How the pod leaves: an eviction (PDBs hold), after the maintenance taint for DaemonSet pods,
/// or stopped by the node agent for static pods.
fn action(t: PodType) -> &'static str {
    match t {
        PodType::Default => "evict",
        PodType::DaemonSet => "taint node, evict",
        PodType::Static => "node agent stops it",
    }
}

/// The whole listing: selected nodes, the plan, then one row per pod in order.
pub fn render_plan(m: &NodeMaintenance, nodes: &[Node], pods: &[Pod]) -> String {
    let plan = effective_drain_plan(m);
    let selected = selected_nodes(m, nodes);
    let mut out = format!(
        "Dry run: nothing is changed.\nNodes ({}): {}\n",
        selected.len(),
        if selected.is_empty() { "<none>".to_string() } else { selected.join(", ") }
    );
    let steps = steps(m, nodes, pods);
    if steps.is_empty() {
        out.push_str("No pod would be evicted.\n");
        return out;
    }
    out.push('\n');
    let rows: Vec<Vec<String>> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            vec![
                (i + 1).to_string(),
                format!("{}: {}", s.entry, describe_entry(&plan[s.entry - 1])),
                s.node.clone(),
                format!("{}/{}", s.namespace, s.pod),
                s.priority.to_string(),
                match &s.blocks {
                    Some(why) => format!("BLOCKS the drain: {why}"),
                    None => action(s.pod_type).to_string(),
                },
            ]
        })
        .collect();
    out.push_str(&render(&["ORDER", "ENTRY", "NODE", "POD", "PRIORITY", "ACTION"], &rows));
    let blocked: BTreeSet<&str> = steps.iter().filter(|s| s.blocks.is_some()).map(|s| s.node.as_str()).collect();
    if !blocked.is_empty() {
        let count = steps.iter().filter(|s| s.blocks.is_some()).count();
        out.push_str(&format!(
            "\n{count} pods block the drain: nothing would be evicted from {}.\n",
            blocked.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{LabelSelector, Stage};
    use crate::cli::{new_maintenance, selector::parse_nodes};
    use crate::fixtures::{bare, mirror, node, owned_by, pod};

    fn m(nodes: &str) -> NodeMaintenance {
        new_maintenance("m", parse_nodes(nodes).unwrap(), Stage::Idle, "")
    }

    #[test]
    fn pods_are_listed_in_plan_order_across_nodes() {
        let nodes = [node("n1", &[]), node("n2", &[]), node("n3", &[])];
        let pods = [
            owned_by(pod("fluentd", "n1", 0, "log"), "DaemonSet", "fluentd"),
            pod("dns", "n2", 2_000_000_000, "dns"),
            pod("web", "n2", 0, "web"),
            mirror(pod("etcd", "n1", 2_000_001_000, "etcd")),
            pod("api", "n1", 100, "api"),
            pod("elsewhere", "n3", 0, "web"),
        ];
        let order: Vec<(usize, String, PodType)> =
            steps(&m("n1,n2"), &nodes, &pods).into_iter().map(|s| (s.entry, s.pod, s.pod_type)).collect();
        assert_eq!(
            order,
            [
                (1, "api".to_string(), PodType::Default),
                (1, "web".to_string(), PodType::Default),
                (2, "dns".to_string(), PodType::Default),
                (5, "fluentd".to_string(), PodType::DaemonSet),
                (11, "etcd".to_string(), PodType::Static),
            ]
        );
    }

    #[test]
    fn a_selector_entry_goes_first_and_terminal_pods_are_skipped() {
        let mut maintenance = m("n1");
        let db = LabelSelector { match_labels: [("app".to_string(), "db".to_string())].into(), ..Default::default() };
        maintenance.spec.drain_plan = vec![
            DrainPlanEntry { pod_selector: Some(db), pod_priority: 1000, pod_type: PodType::Default },
            DrainPlanEntry { pod_selector: None, pod_priority: 1000, pod_type: PodType::Default },
        ];
        let mut done = pod("job", "n1", 0, "job");
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let pods = [pod("a-web", "n1", 0, "web"), pod("z-db", "n1", 0, "db"), done];
        let text = render_plan(&maintenance, &[node("n1", &[])], &pods);
        let rows: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("ORDER")).collect();
        assert_eq!(
            rows,
            [
                "ORDER   ENTRY                              NODE   POD             PRIORITY   ACTION",
                "1       1: Default priority<=1000 app=db   n1     default/z-db    0          evict",
                "2       2: Default priority<=1000          n1     default/a-web   0          evict",
            ]
        );
        assert!(text.starts_with("Dry run: nothing is changed.\nNodes (1): n1\n"), "{text}");
    }

    #[test]
    fn nothing_to_do_is_said_plainly() {
        let text = render_plan(&m("n9"), &[node("n1", &[])], &[pod("a", "n1", 0, "a")]);
        assert_eq!(text, "Dry run: nothing is changed.\nNodes (0): <none>\nNo pod would be evicted.\n");
    }

    #[test]
    fn pods_that_would_block_are_marked_and_summed_up() {
        let pods = [pod("web", "n1", 0, "web"), bare("lonely", "n1", 0, "lonely")];
        let text = render_plan(&m("n1"), &[node("n1", &[])], &pods);
        let row = text.lines().find(|l| l.contains("default/lonely")).unwrap();
        assert!(
            row.ends_with(
                "BLOCKS the drain: no controller: would not be recreated (set spec.evictBarePods to evict it)"
            ),
            "{row}"
        );
        assert!(text.lines().find(|l| l.contains("default/web")).unwrap().ends_with("evict"), "{text}");
        assert!(text.ends_with("\n1 pods block the drain: nothing would be evicted from n1.\n"), "{text}");
        let mut allowed = m("n1");
        allowed.spec.evict_bare_pods = true;
        assert!(!render_plan(&allowed, &[node("n1", &[])], &pods).contains("BLOCKS"));
    }
}
