//! JSON patch (RFC 6902): a list of add/remove/replace/move/copy/test operations addressed
//! by JSON pointers (RFC 6901).

use serde_json::Value;

use super::PatchError;

/// Applies the operations in `ops` (a JSON array) to a copy of `doc`.
pub fn apply(doc: &Value, ops: &Value) -> Result<Value, PatchError> {
    let ops = ops.as_array().ok_or_else(|| PatchError::Malformed("a JSON patch must be a JSON array".into()))?;
    let mut doc = doc.clone();
    for op in ops {
        apply_one(&mut doc, op)?;
    }
    Ok(doc)
}

fn str_field<'a>(op: &'a Value, field: &str) -> Result<&'a str, PatchError> {
    op.get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| PatchError::Malformed(format!("operation {op} is missing the string field {field:?}")))
}

fn apply_one(doc: &mut Value, op: &Value) -> Result<(), PatchError> {
    let kind = str_field(op, "op")?;
    let path = parse_pointer(str_field(op, "path")?)?;
    let value =
        || op.get("value").cloned().ok_or_else(|| PatchError::Malformed(format!("operation {op} needs a value")));
    match kind {
        "add" => add(doc, &path, value()?),
        "remove" => remove(doc, &path).map(|_| ()),
        "replace" => {
            let target = lookup_mut(doc, &path)?;
            *target = value()?;
            Ok(())
        }
        "move" => {
            let from = parse_pointer(str_field(op, "from")?)?;
            if path.len() > from.len() && path[..from.len()] == from[..] {
                return Err(PatchError::Failed("cannot move a value into one of its children".into()));
            }
            let moved = remove(doc, &from)?;
            add(doc, &path, moved)
        }
        "copy" => {
            let from = parse_pointer(str_field(op, "from")?)?;
            let copied = lookup_mut(doc, &from)?.clone();
            add(doc, &path, copied)
        }
        "test" => {
            let actual = lookup_mut(doc, &path)?;
            if *actual != value()? {
                return Err(PatchError::Failed(format!("testing value {} failed", str_field(op, "path")?)));
            }
            Ok(())
        }
        other => Err(PatchError::Malformed(format!("unexpected kind of operation: {other:?}"))),
    }
}

/// Splits a JSON pointer into unescaped tokens (`~1` is `/`, `~0` is `~`).
fn parse_pointer(pointer: &str) -> Result<Vec<String>, PatchError> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let rest = pointer
        .strip_prefix('/')
        .ok_or_else(|| PatchError::Malformed(format!("JSON pointer {pointer:?} must start with '/'")))?;
    Ok(rest.split('/').map(|t| t.replace("~1", "/").replace("~0", "~")).collect())
}

fn index(token: &str, len: usize, allow_end: bool) -> Result<usize, PatchError> {
    if allow_end && token == "-" {
        return Ok(len);
    }
    let i: usize = token.parse().map_err(|_| PatchError::Failed(format!("invalid array index {token:?}")))?;
    let max = if allow_end { len } else { len.saturating_sub(1) };
    if i > max || (!allow_end && len == 0) {
        return Err(PatchError::Failed(format!("array index {i} out of bounds")));
    }
    Ok(i)
}

fn lookup_mut<'a>(doc: &'a mut Value, path: &[String]) -> Result<&'a mut Value, PatchError> {
    let mut cur = doc;
    for token in path {
        cur = match cur {
            Value::Object(map) => map
                .get_mut(token)
                .ok_or_else(|| PatchError::Failed(format!("path /{} does not exist", path.join("/"))))?,
            Value::Array(list) => {
                let i = index(token, list.len(), false)?;
                &mut list[i]
            }
            _ => return Err(PatchError::Failed(format!("path /{} does not exist", path.join("/")))),
        };
    }
    Ok(cur)
}

fn add(doc: &mut Value, path: &[String], value: Value) -> Result<(), PatchError> {
    let Some((last, parent_path)) = path.split_last() else {
        *doc = value;
        return Ok(());
    };
    match lookup_mut(doc, parent_path)? {
        Value::Object(map) => {
            map.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(list) => {
            let i = index(last, list.len(), true)?;
            list.insert(i, value);
            Ok(())
        }
        _ => Err(PatchError::Failed(format!("cannot add at /{}: parent is not a container", path.join("/")))),
    }
}

fn remove(doc: &mut Value, path: &[String]) -> Result<Value, PatchError> {
    let (last, parent_path) =
        path.split_last().ok_or_else(|| PatchError::Failed("cannot remove the whole document".into()))?;
    match lookup_mut(doc, parent_path)? {
        Value::Object(map) => {
            map.remove(last).ok_or_else(|| PatchError::Failed(format!("unable to remove nonexistent key: {last}")))
        }
        Value::Array(list) => {
            let i = index(last, list.len(), false)?;
            Ok(list.remove(i))
        }
        _ => Err(PatchError::Failed(format!("cannot remove /{}", path.join("/")))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn add_replace_remove() {
        let doc = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"list": [1, 2]}});
        let out = apply(
            &doc,
            &json!([
                {"op": "add", "path": "/metadata/labels/b", "value": "2"},
                {"op": "replace", "path": "/metadata/labels/a", "value": "x"},
                {"op": "add", "path": "/spec/list/-", "value": 3},
                {"op": "add", "path": "/spec/list/0", "value": 0},
                {"op": "remove", "path": "/spec/list/1"},
            ]),
        )
        .unwrap();
        assert_eq!(out, json!({"metadata": {"labels": {"a": "x", "b": "2"}}, "spec": {"list": [0, 2, 3]}}));
    }

    #[test]
    fn escaped_pointer() {
        let doc = json!({"metadata": {"annotations": {"a/b": "1", "c~d": "2"}}});
        let out = apply(
            &doc,
            &json!([{"op": "remove", "path": "/metadata/annotations/a~1b"}, {"op": "replace", "path": "/metadata/annotations/c~0d", "value": "3"}]),
        )
        .unwrap();
        assert_eq!(out, json!({"metadata": {"annotations": {"c~d": "3"}}}));
    }

    #[test]
    fn move_copy_test() {
        let doc = json!({"a": {"x": 1}, "b": {}});
        let out = apply(
            &doc,
            &json!([
                {"op": "test", "path": "/a/x", "value": 1},
                {"op": "copy", "from": "/a/x", "path": "/b/y"},
                {"op": "move", "from": "/a", "path": "/c"},
            ]),
        )
        .unwrap();
        assert_eq!(out, json!({"b": {"y": 1}, "c": {"x": 1}}));
    }

    #[test]
    fn failures() {
        let doc = json!({"a": 1});
        assert!(matches!(apply(&doc, &json!([{"op": "test", "path": "/a", "value": 2}])), Err(PatchError::Failed(_))));
        assert!(matches!(apply(&doc, &json!([{"op": "remove", "path": "/b"}])), Err(PatchError::Failed(_))));
        assert!(matches!(
            apply(&doc, &json!([{"op": "replace", "path": "/b/c", "value": 1}])),
            Err(PatchError::Failed(_))
        ));
        assert!(matches!(apply(&doc, &json!({"op": "add"})), Err(PatchError::Malformed(_))));
        assert!(matches!(apply(&doc, &json!([{"op": "frob", "path": "/a"}])), Err(PatchError::Malformed(_))));
    }
}
