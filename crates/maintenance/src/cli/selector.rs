//! `--selector` (kubectl's label selector syntax) and `--nodes` (node names) turned into the
//! maintenance's core `NodeSelector`. Node names become a `metadata.name` field match, which
//! the controller's selector matching supports and which needs no label on the node.

use crate::api::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};

use super::FlagError;

/// What is wrong in a `--selector` (the flag and whole value are added by [`FlagError`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("nested parentheses")]
    NestedParentheses,
    #[error("')' without '('")]
    UnopenedParenthesis,
    #[error("missing ')'")]
    UnclosedParenthesis,
    #[error("{0:?}: text after ')'")]
    TextAfterList(String),
    #[error("{0:?}: expected `key in (...)` or `key notin (...)`")]
    BadSetExpression(String),
    #[error("{0:?}: empty value list")]
    EmptyValueList(String),
    #[error("{0:?}: unknown operator; use =, ==, !=, in, notin, >, < or a bare key")]
    UnknownOperator(String),
    #[error("{key}: {operator} needs an integer value, got {value:?}")]
    NotAnInteger { key: String, operator: String, value: String },
    #[error("label key {0:?}: the prefix must be a DNS subdomain")]
    KeyPrefix(String),
    #[error(
        "label key {0:?}: the name must be 1-63 letters, digits, '-', '_' or '.', starting and ending alphanumeric"
    )]
    KeyName(String),
    #[error("label value {0:?}: at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric")]
    Value(String),
}

const SELECTOR: &str = "--selector";
const NODES: &str = "--nodes";

/// `k=v,k2 in (a,b),!k3,k4,k5 notin (x),k6>3`: the requirements are ANDed in one term.
pub fn parse_selector(value: &str) -> Result<NodeSelector, FlagError> {
    let mut requirements = Vec::new();
    let invalid = |e: SelectorError| FlagError::new(SELECTOR, value, e.to_string());
    for part in split_top_level(value).map_err(invalid)? {
        let part = part.trim();
        if part.is_empty() {
            return Err(FlagError::new(SELECTOR, value, "empty requirement (stray comma?)"));
        }
        requirements.push(requirement(part).map_err(invalid)?);
    }
    if requirements.is_empty() {
        return Err(FlagError::new(SELECTOR, value, "selects no node; give at least one requirement"));
    }
    Ok(NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm { match_expressions: requirements, match_fields: vec![] }],
    })
}

/// `a,b`: the nodes with exactly these names.
pub fn parse_nodes(value: &str) -> Result<NodeSelector, FlagError> {
    let mut names = Vec::new();
    for name in value.split(',').map(str::trim) {
        if name.is_empty() {
            return Err(FlagError::new(NODES, value, "empty node name"));
        }
        if !is_subdomain(name) {
            return Err(FlagError::new(NODES, value, format!("{name:?} is not a valid node name")));
        }
        if !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
    }
    let field = NodeSelectorRequirement { key: "metadata.name".into(), operator: "In".into(), values: names };
    Ok(NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm { match_expressions: vec![], match_fields: vec![field] }],
    })
}

/// Splits at commas outside parentheses (`in (a,b)` keeps its commas).
fn split_top_level(value: &str) -> Result<Vec<&str>, SelectorError> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in value.char_indices() {
        match c {
            '(' if depth > 0 => return Err(SelectorError::NestedParentheses),
            '(' => depth += 1,
            ')' if depth == 0 => return Err(SelectorError::UnopenedParenthesis),
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(SelectorError::UnclosedParenthesis);
    }
    if !value.trim().is_empty() {
        parts.push(&value[start..]);
    }
    Ok(parts)
}

fn requirement(part: &str) -> Result<NodeSelectorRequirement, SelectorError> {
    if let Some(key) = part.strip_prefix('!') {
        return build(key.trim(), "DoesNotExist", vec![]);
    }
    if let Some(open) = part.find('(') {
        let close = part
            .rfind(')')
            .filter(|c| *c == part.len() - 1)
            .ok_or_else(|| SelectorError::TextAfterList(part.to_string()))?;
        let head: Vec<&str> = part[..open].split_whitespace().collect();
        let operator = match head.as_slice() {
            [_, "in"] => "In",
            [_, "notin"] => "NotIn",
            _ => return Err(SelectorError::BadSetExpression(part.to_string())),
        };
        let values: Vec<String> = part[open + 1..close].split(',').map(|v| v.trim().to_string()).collect();
        if values.iter().all(String::is_empty) {
            return Err(SelectorError::EmptyValueList(part.to_string()));
        }
        return build(head[0], operator, values);
    }
    for (token, operator) in [("!=", "NotIn"), ("==", "In"), ("=", "In"), (">", "Gt"), ("<", "Lt")] {
        if let Some((key, value)) = part.split_once(token) {
            return build(key.trim(), operator, vec![value.trim().to_string()]);
        }
    }
    if part.split_whitespace().count() > 1 {
        return Err(SelectorError::UnknownOperator(part.to_string()));
    }
    build(part, "Exists", vec![])
}

fn build(key: &str, operator: &str, values: Vec<String>) -> Result<NodeSelectorRequirement, SelectorError> {
    check_key(key)?;
    for v in &values {
        check_value(v)?;
        if matches!(operator, "Gt" | "Lt") && v.parse::<i64>().is_err() {
            return Err(SelectorError::NotAnInteger {
                key: key.to_string(),
                operator: operator.to_string(),
                value: v.clone(),
            });
        }
    }
    Ok(NodeSelectorRequirement { key: key.to_string(), operator: operator.to_string(), values })
}

/// A label key: an optional DNS subdomain prefix and `/`, then a name of at most 63 characters.
fn check_key(key: &str) -> Result<(), SelectorError> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if prefix.is_some_and(|p| !is_subdomain(p)) {
        return Err(SelectorError::KeyPrefix(key.to_string()));
    }
    if name.is_empty() || name.len() > 63 || !is_label_text(name) {
        return Err(SelectorError::KeyName(key.to_string()));
    }
    Ok(())
}

/// A label value: empty, or at most 63 characters like a key's name part.
fn check_value(value: &str) -> Result<(), SelectorError> {
    if value.is_empty() || (value.len() <= 63 && is_label_text(value)) {
        Ok(())
    } else {
        Err(SelectorError::Value(value.to_string()))
    }
}

fn is_label_text(s: &str) -> bool {
    let edges = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && edges(s.chars().next())
        && edges(s.chars().last())
}

fn is_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::selector::node_matches;

    fn reqs(sel: &NodeSelector) -> Vec<(String, String, Vec<String>)> {
        let term = &sel.node_selector_terms[0];
        term.match_expressions.iter().map(|r| (r.key.clone(), r.operator.clone(), r.values.clone())).collect()
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn kubectl_selector_syntax_becomes_node_selector_requirements() {
        let sel = parse_selector("zone=a, tier==db,env!=prod,rack in (r1, r2),gpu notin (x),ssd,!spot,cpu>8").unwrap();
        assert_eq!(sel.node_selector_terms.len(), 1);
        assert_eq!(
            reqs(&sel),
            vec![
                ("zone".into(), "In".into(), s(&["a"])),
                ("tier".into(), "In".into(), s(&["db"])),
                ("env".into(), "NotIn".into(), s(&["prod"])),
                ("rack".into(), "In".into(), s(&["r1", "r2"])),
                ("gpu".into(), "NotIn".into(), s(&["x"])),
                ("ssd".into(), "Exists".into(), vec![]),
                ("spot".into(), "DoesNotExist".into(), vec![]),
                ("cpu".into(), "Gt".into(), s(&["8"])),
            ]
        );
    }

    #[test]
    fn parsed_selector_matches_nodes_as_the_controller_does() {
        let sel = parse_selector("node-role.kubernetes.io/worker,zone in (a,b)").unwrap();
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        assert!(node_matches(&sel, "n1", &labels(&[("node-role.kubernetes.io/worker", ""), ("zone", "b")])));
        assert!(!node_matches(&sel, "n1", &labels(&[("zone", "b")])));
    }

    #[test]
    fn bad_selectors_name_the_flag_and_the_problem() {
        for (bad, why) in [
            ("", "selects no node"),
            ("a=b,", "empty requirement"),
            ("zone in (a,b", "missing ')'"),
            ("zone in (a) x", "text after ')'"),
            ("zone like a", "unknown operator"),
            ("Bad Key=1", "label key"),
            ("-x=1", "label key"),
            ("cpu>many", "integer"),
            ("zone=a b", "label value"),
        ] {
            let err = parse_selector(bad).unwrap_err();
            assert_eq!(err.flag, "--selector");
            let text = err.to_string();
            assert!(text.starts_with("invalid --selector"), "{text}");
            assert!(text.contains(why), "{bad:?}: {text}");
        }
    }

    #[test]
    fn nodes_become_a_metadata_name_field_match() {
        let sel = parse_nodes("n1, n2,n1").unwrap();
        let field = &sel.node_selector_terms[0].match_fields[0];
        assert_eq!((field.key.as_str(), field.operator.as_str()), ("metadata.name", "In"));
        assert_eq!(field.values, s(&["n1", "n2"]));
        assert!(node_matches(&sel, "n2", &BTreeMap::new()));
        assert!(!node_matches(&sel, "n3", &BTreeMap::new()));
        for bad in ["", "n1,,n2", "N1"] {
            assert_eq!(parse_nodes(bad).unwrap_err().flag, "--nodes", "{bad:?}");
        }
    }
}
