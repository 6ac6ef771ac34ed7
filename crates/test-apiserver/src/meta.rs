//! Small accessors for object metadata held as JSON, and the time format of `metav1.Time`.

use serde_json::Value;

pub fn str_at<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

pub fn name(obj: &Value) -> &str {
    str_at(obj, "/metadata/name")
}

pub fn namespace(obj: &Value) -> &str {
    str_at(obj, "/metadata/namespace")
}

pub fn uid(obj: &Value) -> &str {
    str_at(obj, "/metadata/uid")
}

pub fn resource_version(obj: &Value) -> &str {
    str_at(obj, "/metadata/resourceVersion")
}

pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

pub fn is_deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp").is_some_and(|v| !v.is_null())
}

/// Sets or removes `metadata.<field>`.
pub fn set_meta(obj: &mut Value, field: &str, value: Option<Value>) {
    if !obj["metadata"].is_object() {
        obj["metadata"] = Value::Object(Default::default());
    }
    let meta = obj["metadata"].as_object_mut().expect("made an object");
    match value {
        Some(v) => {
            meta.insert(field.to_string(), v);
        }
        None => {
            meta.remove(field);
        }
    }
}

/// A `metav1.Time` string (RFC 3339, whole seconds, UTC) for now plus `offset_seconds`.
pub fn time_in(offset_seconds: i64) -> String {
    let t = jiff::Timestamp::now().as_second() + offset_seconds;
    format_time(t)
}

pub fn now() -> String {
    time_in(0)
}

pub fn format_time(unix_seconds: i64) -> String {
    jiff::Timestamp::from_second(unix_seconds).map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()).unwrap_or_default()
}

/// Seconds since the epoch of a `metav1.Time` string.
pub fn parse_time(s: &str) -> Option<i64> {
    s.parse::<jiff::Timestamp>().ok().map(|t| t.as_second())
}

/// Five characters from the alphabet upstream uses for generated names.
pub fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let bytes = uuid::Uuid::new_v4();
    bytes.as_bytes()[..5].iter().map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char).collect()
}

pub fn new_uid() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_round_trip() {
        let s = format_time(1_700_000_000);
        assert_eq!(s, "2023-11-14T22:13:20Z");
        assert_eq!(parse_time(&s), Some(1_700_000_000));
    }

    #[test]
    fn suffix_shape() {
        let s = random_suffix();
        assert_eq!(s.len(), 5);
        assert!(s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
    }
}
