//! Label and field selectors, parsed from query strings (`labelSelector`, `fieldSelector`)
//! and from `metav1.LabelSelector` objects (PDBs), with the grammar kube-apiserver accepts.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

/// Why a label or field selector does not parse, in kube-apiserver's words (the client
/// gets it in a 400 BadRequest).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("found '{found}', expected: {expected}")]
    Unexpected { found: String, expected: &'static str },
    #[error("matchLabels[{0}] must be a string")]
    LabelNotString(String),
    #[error("matchExpressions key is required")]
    NoKey,
    #[error("{0:?} is not a valid label selector operator")]
    BadOperator(Option<String>),
    #[error("unable to parse requirement: invalid character {0:?}")]
    InvalidCharacter(char),
    #[error("for 'Gt', 'Lt' operators, the value must be an integer: {0}")]
    NotAnInteger(String),
    #[error("found unexpected token, expected: '('")]
    NoOpenParenthesis,
    #[error("found unexpected token in value set, expected: ',' or ')'")]
    BadValueSet,
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
    #[error("invalid escape sequence: \\{0}")]
    InvalidEscape(String),
    #[error("invalid field selector: '{0}'")]
    InvalidFieldTerm(String),
    #[error("invalid selector: '{0}'; can't understand '{0}'")]
    Unintelligible(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelOp {
    Equals(String),
    NotEquals(String),
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
    Exists,
    DoesNotExist,
    Gt(i64),
    Lt(i64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct LabelRequirement {
    key: String,
    op: LabelOp,
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<LabelRequirement>,
}

impl LabelSelector {
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether an object with these labels (`metadata.labels`, possibly absent) is selected.
    pub fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.requirements.iter().all(|r| {
            let value = get(&r.key);
            match &r.op {
                LabelOp::Equals(v) => value == Some(v.as_str()),
                // `!=` also selects objects that lack the label, as upstream does.
                LabelOp::NotEquals(v) => value != Some(v.as_str()),
                LabelOp::In(set) => value.is_some_and(|v| set.contains(v)),
                LabelOp::NotIn(set) => value.is_none_or(|v| !set.contains(v)),
                LabelOp::Exists => value.is_some(),
                LabelOp::DoesNotExist => value.is_none(),
                LabelOp::Gt(n) => value.and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v > *n),
                LabelOp::Lt(n) => value.and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v < *n),
            }
        })
    }

    /// Matches the labels of a whole object.
    pub fn matches_object(&self, obj: &Value) -> bool {
        self.matches(obj.pointer("/metadata/labels").and_then(Value::as_object))
    }

    /// Parses the `labelSelector` query syntax: `a=b,c!=d,e in (f,g),h notin (i),j,!k`.
    pub fn parse(input: &str) -> Result<LabelSelector, SelectorError> {
        let tokens = lex(input)?;
        let mut p = Parser { tokens, pos: 0 };
        let mut requirements = Vec::new();
        if p.tokens.is_empty() {
            return Ok(LabelSelector::default());
        }
        loop {
            requirements.push(p.requirement()?);
            match p.next() {
                None => break,
                Some(Tok::Comma) => continue,
                Some(t) => {
                    return Err(SelectorError::Unexpected { found: t.text(), expected: "',' or 'end of string'" });
                }
            }
        }
        Ok(LabelSelector { requirements })
    }

    /// Converts a `metav1.LabelSelector` (`matchLabels` + `matchExpressions`).
    pub fn from_object(selector: &Value) -> Result<LabelSelector, SelectorError> {
        let mut requirements = Vec::new();
        if let Some(labels) = selector.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in labels {
                let v = v.as_str().ok_or_else(|| SelectorError::LabelNotString(k.clone()))?;
                requirements.push(LabelRequirement { key: k.clone(), op: LabelOp::Equals(v.to_string()) });
            }
        }
        for expr in selector.get("matchExpressions").and_then(Value::as_array).into_iter().flatten() {
            let key = expr.get("key").and_then(Value::as_str).ok_or(SelectorError::NoKey)?;
            let values: BTreeSet<String> = expr
                .get("values")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(String::from))
                .collect();
            let op = match expr.get("operator").and_then(Value::as_str) {
                Some("In") => LabelOp::In(values),
                Some("NotIn") => LabelOp::NotIn(values),
                Some("Exists") => LabelOp::Exists,
                Some("DoesNotExist") => LabelOp::DoesNotExist,
                other => return Err(SelectorError::BadOperator(other.map(String::from))),
            };
            requirements.push(LabelRequirement { key: key.to_string(), op });
        }
        Ok(LabelSelector { requirements })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Comma,
    Eq,
    DoubleEq,
    NotEq,
    Bang,
    Open,
    Close,
    Gt,
    Lt,
}

impl Tok {
    fn text(&self) -> String {
        match self {
            Tok::Ident(s) => s.clone(),
            Tok::Comma => ",".into(),
            Tok::Eq => "=".into(),
            Tok::DoubleEq => "==".into(),
            Tok::NotEq => "!=".into(),
            Tok::Bang => "!".into(),
            Tok::Open => "(".into(),
            Tok::Close => ")".into(),
            Tok::Gt => ">".into(),
            Tok::Lt => "<".into(),
        }
    }
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')
}

fn lex(input: &str) -> Result<Vec<Tok>, SelectorError> {
    let chars: Vec<char> = input.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match c {
            ' ' | '\t' => i += 1,
            ',' => {
                out.push(Tok::Comma);
                i += 1;
            }
            '(' => {
                out.push(Tok::Open);
                i += 1;
            }
            ')' => {
                out.push(Tok::Close);
                i += 1;
            }
            '>' => {
                out.push(Tok::Gt);
                i += 1;
            }
            '<' => {
                out.push(Tok::Lt);
                i += 1;
            }
            '=' if next == Some('=') => {
                out.push(Tok::DoubleEq);
                i += 2;
            }
            '=' => {
                out.push(Tok::Eq);
                i += 1;
            }
            '!' if next == Some('=') => {
                out.push(Tok::NotEq);
                i += 2;
            }
            '!' => {
                out.push(Tok::Bang);
                i += 1;
            }
            c if is_ident_char(c) => {
                let start = i;
                while i < chars.len() && is_ident_char(chars[i]) {
                    i += 1;
                }
                out.push(Tok::Ident(chars[start..i].iter().collect()));
            }
            other => return Err(SelectorError::InvalidCharacter(other)),
        }
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn next(&mut self) -> Option<Tok> {
        let t = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn peek(&self) -> Option<&Tok> {
        self.tokens.get(self.pos)
    }

    fn ident(&mut self, what: &'static str) -> Result<String, SelectorError> {
        match self.next() {
            Some(Tok::Ident(s)) => Ok(s),
            Some(t) => Err(SelectorError::Unexpected { found: t.text(), expected: what }),
            None => Err(SelectorError::Unexpected { found: "end of string".into(), expected: what }),
        }
    }

    fn requirement(&mut self) -> Result<LabelRequirement, SelectorError> {
        if self.peek() == Some(&Tok::Bang) {
            self.pos += 1;
            let key = self.ident("identifier after '!'")?;
            return Ok(LabelRequirement { key, op: LabelOp::DoesNotExist });
        }
        let key = self.ident("identifier")?;
        let op = match self.peek().cloned() {
            None | Some(Tok::Comma) => LabelOp::Exists,
            Some(Tok::Eq) | Some(Tok::DoubleEq) => {
                self.pos += 1;
                LabelOp::Equals(self.optional_value())
            }
            Some(Tok::NotEq) => {
                self.pos += 1;
                LabelOp::NotEquals(self.optional_value())
            }
            Some(Tok::Gt) | Some(Tok::Lt) => {
                let gt = self.next() == Some(Tok::Gt);
                let v = self.ident("integer value")?;
                let n = v.parse::<i64>().map_err(|_| SelectorError::NotAnInteger(v.clone()))?;
                if gt { LabelOp::Gt(n) } else { LabelOp::Lt(n) }
            }
            Some(Tok::Ident(word)) if word == "in" || word == "notin" => {
                self.pos += 1;
                let values = self.value_set()?;
                if word == "in" { LabelOp::In(values) } else { LabelOp::NotIn(values) }
            }
            Some(t) => {
                return Err(SelectorError::Unexpected { found: t.text(), expected: "in, notin, =, ==, !=, gt, lt" });
            }
        };
        Ok(LabelRequirement { key, op })
    }

    /// `a=` selects the empty value, so a missing identifier is allowed.
    fn optional_value(&mut self) -> String {
        match self.peek() {
            Some(Tok::Ident(s)) => {
                let s = s.clone();
                self.pos += 1;
                s
            }
            _ => String::new(),
        }
    }

    fn value_set(&mut self) -> Result<BTreeSet<String>, SelectorError> {
        if self.next() != Some(Tok::Open) {
            return Err(SelectorError::NoOpenParenthesis);
        }
        let mut values = BTreeSet::new();
        loop {
            match self.next() {
                Some(Tok::Ident(v)) => {
                    values.insert(v);
                }
                Some(Tok::Close) => return Ok(values),
                Some(Tok::Comma) => {}
                _ => return Err(SelectorError::BadValueSet),
            }
        }
    }
}

/// One `field=value` / `field!=value` term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    pub field: String,
    pub equals: bool,
    pub value: String,
}

/// A parsed field selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    pub requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parses `a=b,c!=d` with upstream's backslash escapes (`\,`, `\=`, `\\`).
    pub fn parse(input: &str) -> Result<FieldSelector, SelectorError> {
        let mut requirements = Vec::new();
        for term in split_unescaped(input, ',') {
            if term.trim().is_empty() {
                continue;
            }
            requirements.push(parse_field_term(&term)?);
        }
        Ok(FieldSelector { requirements })
    }

    /// The name in a `metadata.name=X` term: upstream authorizes such a list/watch as a
    /// request for the single object X.
    pub fn single_name(&self) -> Option<&str> {
        self.requirements.iter().find(|r| r.equals && r.field == "metadata.name").map(|r| r.value.as_str())
    }

    /// The value of an equality term on `field`.
    pub fn equal_value(&self, field: &str) -> Option<&str> {
        self.requirements.iter().find(|r| r.equals && r.field == field).map(|r| r.value.as_str())
    }

    /// Rejects fields the resource does not index, like upstream's "field label not supported".
    pub fn check_supported(&self, supported: &[&str]) -> Result<(), SelectorError> {
        for r in &self.requirements {
            if r.field != "metadata.name" && r.field != "metadata.namespace" && !supported.contains(&r.field.as_str()) {
                return Err(SelectorError::UnsupportedField(r.field.clone()));
            }
        }
        Ok(())
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.requirements.iter().all(|r| (field_value(obj, &r.field) == r.value) == r.equals)
    }
}

fn split_unescaped(input: &str, sep: char) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut escaped = false;
    for c in input.chars() {
        if escaped {
            parts.last_mut().expect("non-empty").push('\\');
            parts.last_mut().expect("non-empty").push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            parts.push(String::new());
        } else {
            parts.last_mut().expect("non-empty").push(c);
        }
    }
    parts
}

fn unescape(s: &str) -> Result<String, SelectorError> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                other => {
                    return Err(SelectorError::InvalidEscape(other.map(String::from).unwrap_or_default()));
                }
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

fn parse_field_term(term: &str) -> Result<FieldRequirement, SelectorError> {
    for (op, equals) in [("!=", false), ("==", true), ("=", true)] {
        if let Some(idx) = find_unescaped(term, op) {
            let field = term[..idx].trim().to_string();
            let value = unescape(&term[idx + op.len()..])?;
            if field.is_empty() {
                return Err(SelectorError::InvalidFieldTerm(term.to_string()));
            }
            return Ok(FieldRequirement { field, equals, value });
        }
    }
    Err(SelectorError::Unintelligible(term.to_string()))
}

fn find_unescaped(s: &str, needle: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        // Bytes, not `&s[i..]`: after a multi-byte character `i` is not a char boundary.
        if bytes[i..].starts_with(needle.as_bytes()) {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// The selectable value of a field: strings as is, booleans and numbers formatted, and
/// absent fields as "" (upstream's field sets format Go zero values; known booleans default
/// to "false").
pub fn field_value(obj: &Value, field: &str) -> String {
    let lookup = match field {
        // Events select `source` by its component.
        "source" => "source.component",
        f => f,
    };
    let mut cur = obj;
    for part in lookup.split('.') {
        match cur.get(part) {
            Some(v) => cur = v,
            None => return default_for(field),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => default_for(field),
        other => other.to_string(),
    }
}

fn default_for(field: &str) -> String {
    match field {
        "spec.hostNetwork" | "spec.unschedulable" => "false".into(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn labels(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    /// Fuzzing found (fuzz/regressions/selectors/): a multi-byte character after an
    /// operator's first byte panicked on a char boundary.
    #[test]
    fn field_values_with_multi_byte_characters() {
        assert!(FieldSelector::parse(":=Ʃ").is_ok());
        let s = FieldSelector::parse("metadata.name=Ʃé,metadata.namespace!=ñ").unwrap();
        assert!(s.matches(&json!({"metadata": {"name": "Ʃé", "namespace": "b"}})));
        assert!(!s.matches(&json!({"metadata": {"name": "Ʃé", "namespace": "ñ"}})));
    }

    #[test]
    fn equality_and_inequality() {
        let s = LabelSelector::parse("app=web,tier!=db").unwrap();
        assert!(s.matches(Some(&labels(json!({"app": "web"})))));
        assert!(s.matches(Some(&labels(json!({"app": "web", "tier": "fe"})))));
        assert!(!s.matches(Some(&labels(json!({"app": "web", "tier": "db"})))));
        assert!(!s.matches(None));
        let s = LabelSelector::parse("app==web").unwrap();
        assert!(s.matches(Some(&labels(json!({"app": "web"})))));
    }

    #[test]
    fn set_based() {
        let s = LabelSelector::parse("env in (prod, staging), tier notin (db),owner,!legacy").unwrap();
        assert!(s.matches(Some(&labels(json!({"env": "prod", "owner": "x"})))));
        assert!(!s.matches(Some(&labels(json!({"env": "dev", "owner": "x"})))));
        assert!(!s.matches(Some(&labels(json!({"env": "prod", "owner": "x", "tier": "db"})))));
        assert!(!s.matches(Some(&labels(json!({"env": "prod"})))));
        assert!(!s.matches(Some(&labels(json!({"env": "prod", "owner": "x", "legacy": "y"})))));
    }

    #[test]
    fn empty_selector_matches_all() {
        assert!(LabelSelector::parse("").unwrap().matches(None));
        assert!(LabelSelector::parse("  ").unwrap().is_empty());
    }

    #[test]
    fn bad_label_syntax_is_an_error() {
        assert!(LabelSelector::parse("a in b").is_err());
        assert!(LabelSelector::parse("a=b c").is_err());
        assert!(LabelSelector::parse("=b").is_err());
    }

    #[test]
    fn label_selector_object() {
        let s = LabelSelector::from_object(&json!({
            "matchLabels": {"app": "x"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]
        }))
        .unwrap();
        assert!(s.matches(Some(&labels(json!({"app": "x", "tier": "a"})))));
        assert!(!s.matches(Some(&labels(json!({"app": "x", "tier": "c"})))));
        assert!(LabelSelector::from_object(&json!({})).unwrap().is_empty());
    }

    #[test]
    fn field_selectors() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        let s = FieldSelector::parse("spec.nodeName=n1,status.phase!=Failed").unwrap();
        assert!(s.matches(&pod));
        assert!(!FieldSelector::parse("spec.nodeName==n2").unwrap().matches(&pod));
        assert!(FieldSelector::parse("spec.nodeName=").unwrap().matches(&json!({"spec": {}})));
        assert!(FieldSelector::parse("spec.hostNetwork=false").unwrap().matches(&pod));
        assert_eq!(FieldSelector::parse("metadata.name=p").unwrap().single_name(), Some("p"));
    }

    #[test]
    fn field_selector_escapes() {
        let s = FieldSelector::parse(r"metadata.name=a\,b\=c").unwrap();
        assert_eq!(s.requirements[0].value, "a,b=c");
        assert!(FieldSelector::parse("novalue").is_err());
    }

    #[test]
    fn unsupported_field() {
        let s = FieldSelector::parse("spec.foo=bar").unwrap();
        assert_eq!(
            s.check_supported(&["spec.nodeName"]).unwrap_err().to_string(),
            "field label not supported: spec.foo"
        );
    }
}
