//! Matching of node selectors (against a Node's labels and `metadata.name`) and label
//! selectors (against a pod's labels), with the API's semantics. Unknown operators match
//! nothing, so a malformed selector never widens a maintenance.

use std::collections::BTreeMap;

use crate::api::{LabelSelector, NodeSelector, NodeSelectorRequirement};

/// A node selector with no terms selects no node, like the API's `NodeSelector`.
pub fn node_matches(selector: &NodeSelector, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
    selector.node_selector_terms.iter().any(|term| {
        let fields_ok = term.match_fields.iter().all(|r| r.key == "metadata.name" && requirement(r, Some(node_name)));
        let labels_ok = term.match_expressions.iter().all(|r| requirement(r, labels.get(&r.key).map(String::as_str)));
        !(term.match_expressions.is_empty() && term.match_fields.is_empty()) && fields_ok && labels_ok
    })
}

fn requirement(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| r.values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !r.values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), [bound]) = (value.and_then(|v| v.parse::<i64>().ok()), r.values.as_slice()) else {
                return false;
            };
            let Ok(bound) = bound.parse::<i64>() else { return false };
            if r.operator == "Gt" { v > bound } else { v < bound }
        }
        _ => false,
    }
}

/// An empty label selector matches every pod, like the API's `LabelSelector`.
pub fn labels_match(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = selector.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v));
    labels_ok
        && selector.match_expressions.iter().all(|r| {
            let value = labels.get(&r.key);
            match r.operator.as_str() {
                "In" => value.is_some_and(|v| r.values.contains(v)),
                "NotIn" => value.is_none_or(|v| !r.values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{LabelSelectorRequirement, NodeSelectorTerm};

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    #[test]
    fn node_terms_are_ored_and_requirements_anded() {
        let sel = NodeSelector {
            node_selector_terms: vec![
                NodeSelectorTerm {
                    match_expressions: vec![req("zone", "In", &["a"]), req("gpu", "Exists", &[])],
                    ..Default::default()
                },
                NodeSelectorTerm { match_fields: vec![req("metadata.name", "In", &["n9"])], ..Default::default() },
            ],
        };
        assert!(node_matches(&sel, "n1", &labels(&[("zone", "a"), ("gpu", "1")])));
        assert!(!node_matches(&sel, "n1", &labels(&[("zone", "a")])));
        assert!(node_matches(&sel, "n9", &labels(&[])));
        assert!(!node_matches(&NodeSelector::default(), "n1", &labels(&[])));
    }

    #[test]
    fn gt_lt_and_unknown_operators() {
        let term = |r| NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm { match_expressions: vec![r], ..Default::default() }],
        };
        assert!(node_matches(&term(req("rack", "Gt", &["3"])), "n", &labels(&[("rack", "4")])));
        assert!(!node_matches(&term(req("rack", "Lt", &["3"])), "n", &labels(&[("rack", "4")])));
        assert!(!node_matches(&term(req("rack", "Near", &["3"])), "n", &labels(&[("rack", "3")])));
    }

    #[test]
    fn label_selector_semantics() {
        let sel = LabelSelector {
            match_labels: labels(&[("app", "db")]),
            match_expressions: vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "NotIn".into(),
                values: vec!["canary".into()],
            }],
        };
        assert!(labels_match(&sel, &labels(&[("app", "db")])));
        assert!(!labels_match(&sel, &labels(&[("app", "db"), ("tier", "canary")])));
        assert!(!labels_match(&sel, &labels(&[("app", "web")])));
        assert!(labels_match(&LabelSelector::default(), &labels(&[])));
    }
}
