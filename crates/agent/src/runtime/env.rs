//! A container's environment: `envFrom`, `env` (`value`, `valueFrom`) and `$(VAR)` expansion in
//! env values, command and args. Pure: the ConfigMaps and Secrets it refers to are fetched by the
//! caller ([`referenced`] says which) and passed in.

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{ConfigMap, Container, EnvVar, Pod, Secret};

use super::downward;

/// The API objects a container's environment refers to, by name; absent means not found.
#[derive(Debug, Default)]
pub struct EnvObjects {
    pub config_maps: HashMap<String, ConfigMap>,
    pub secrets: HashMap<String, Secret>,
    /// Service environment variables; explicit ones override them.
    pub services: Vec<(String, String)>,
}

/// ConfigMap and Secret names the container's environment refers to.
pub fn referenced(c: &Container) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut cms, mut secrets) = (BTreeSet::new(), BTreeSet::new());
    for f in c.env_from.iter().flatten() {
        if let Some(r) = &f.config_map_ref {
            cms.insert(r.name.clone());
        }
        if let Some(r) = &f.secret_ref {
            secrets.insert(r.name.clone());
        }
    }
    for from in c.env.iter().flatten().filter_map(|e| e.value_from.as_ref()) {
        if let Some(r) = &from.config_map_key_ref {
            cms.insert(r.name.clone());
        }
        if let Some(r) = &from.secret_key_ref {
            secrets.insert(r.name.clone());
        }
    }
    (cms, secrets)
}

/// The resolved environment (in definition order) and the expanded command and args.
#[derive(Debug, PartialEq, Eq)]
pub struct Resolved {
    pub envs: Vec<(String, String)>,
    pub command: Vec<String>,
    pub args: Vec<String>,
}

/// Why a container's environment cannot be built, with upstream's messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("configmap {0:?} not found")]
    ConfigMapNotFound(String),
    #[error("secret {0:?} not found")]
    SecretNotFound(String),
    #[error("couldn't find key {key} in ConfigMap {namespace}/{name}")]
    ConfigMapKeyNotFound { namespace: String, name: String, key: String },
    #[error("couldn't find key {key} in Secret {namespace}/{name}")]
    SecretKeyNotFound { namespace: String, name: String, key: String },
    #[error("env {var:?}: {source}")]
    Downward { var: String, source: downward::DownwardError },
    #[error("env {0:?}: valueFrom names no source")]
    NoSource(String),
}

/// Resolves the container's environment the way upstream does: `envFrom` sources first, then
/// `env` entries, each `value` expanded against what was defined before it; command and args
/// are expanded against the final environment. Errors carry the upstream messages.
pub fn resolve(
    pod: &Pod,
    c: &Container,
    fields: &downward::Fields,
    objects: &EnvObjects,
) -> Result<Resolved, EnvError> {
    let ns = gantry_vocab::spec::namespace(pod);
    let mut envs: Vec<(String, String)> = Vec::new();
    let set = |envs: &mut Vec<(String, String)>, k: String, v: String| match envs.iter_mut().find(|(n, _)| *n == k) {
        Some(slot) => slot.1 = v,
        None => envs.push((k, v)),
    };
    for f in c.env_from.iter().flatten() {
        let prefix = f.prefix.as_deref().unwrap_or_default();
        if let Some(r) = &f.config_map_ref {
            match objects.config_maps.get(&r.name) {
                Some(cm) => {
                    for (k, v) in cm.data.iter().flatten() {
                        set(&mut envs, format!("{prefix}{k}"), v.clone());
                    }
                }
                None if r.optional == Some(true) => {}
                None => return Err(EnvError::ConfigMapNotFound(r.name.clone())),
            }
        }
        if let Some(r) = &f.secret_ref {
            match objects.secrets.get(&r.name) {
                Some(s) => {
                    for (k, v) in s.data.iter().flatten() {
                        set(&mut envs, format!("{prefix}{k}"), String::from_utf8_lossy(&v.0).into_owned());
                    }
                }
                None if r.optional == Some(true) => {}
                None => return Err(EnvError::SecretNotFound(r.name.clone())),
            }
        }
    }
    for e in c.env.iter().flatten() {
        let value = match &e.value_from {
            None => expand(e.value.as_deref().unwrap_or_default(), &defined(&envs, &objects.services)),
            Some(_) => match value_from(pod, ns, c, e, fields, objects)? {
                Some(v) => v,
                None => continue,
            },
        };
        set(&mut envs, e.name.clone(), value);
    }
    for (k, v) in &objects.services {
        if !envs.iter().any(|(n, _)| n == k) {
            envs.push((k.clone(), v.clone()));
        }
    }
    let defined = defined(&envs, &[]);
    let expand_all = |v: &Option<Vec<String>>| v.iter().flatten().map(|s| expand(s, &defined)).collect();
    let (command, args) = (expand_all(&c.command), expand_all(&c.args));
    Ok(Resolved { envs, command, args })
}

/// The variables `$(VAR)` can refer to: those defined so far, then the service variables.
fn defined<'a>(envs: &'a [(String, String)], services: &'a [(String, String)]) -> HashMap<&'a str, &'a str> {
    services.iter().chain(envs).map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// `Ok(None)`: an optional reference that is missing, so the variable is left out.
fn value_from(
    pod: &Pod,
    ns: &str,
    c: &Container,
    e: &EnvVar,
    fields: &downward::Fields,
    objects: &EnvObjects,
) -> Result<Option<String>, EnvError> {
    let from = e.value_from.as_ref().expect("called for valueFrom only");
    let downward = |source| EnvError::Downward { var: e.name.clone(), source };
    if let Some(f) = &from.field_ref {
        return downward::field(pod, &f.field_path, fields).map(Some).map_err(downward);
    }
    if let Some(r) = &from.resource_field_ref {
        return downward::resource(pod, Some(c), r, fields).map(Some).map_err(downward);
    }
    if let Some(r) = &from.config_map_key_ref {
        let optional = r.optional == Some(true);
        return match objects.config_maps.get(&r.name) {
            None if optional => Ok(None),
            None => Err(EnvError::ConfigMapNotFound(r.name.clone())),
            Some(cm) => match cm.data.as_ref().and_then(|d| d.get(&r.key)) {
                Some(v) => Ok(Some(v.clone())),
                None if optional => Ok(None),
                None => Err(EnvError::ConfigMapKeyNotFound {
                    namespace: ns.to_string(),
                    name: r.name.clone(),
                    key: r.key.clone(),
                }),
            },
        };
    }
    if let Some(r) = &from.secret_key_ref {
        let optional = r.optional == Some(true);
        return match objects.secrets.get(&r.name) {
            None if optional => Ok(None),
            None => Err(EnvError::SecretNotFound(r.name.clone())),
            Some(s) => match s.data.as_ref().and_then(|d| d.get(&r.key)) {
                Some(v) => Ok(Some(String::from_utf8_lossy(&v.0).into_owned())),
                None if optional => Ok(None),
                None => Err(EnvError::SecretKeyNotFound {
                    namespace: ns.to_string(),
                    name: r.name.clone(),
                    key: r.key.clone(),
                }),
            },
        };
    }
    Err(EnvError::NoSource(e.name.clone()))
}

/// Upstream's `$(VAR)` expansion: defined names are replaced, undefined references stay as
/// written, `$$` escapes a `$`, and anything else after `$` is kept.
pub fn expand(input: &str, defined: &HashMap<&str, &str>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        match after.chars().next() {
            None => {
                out.push('$');
                rest = after;
            }
            Some('$') => {
                out.push('$');
                rest = &after[1..];
            }
            Some('(') => match after.find(')') {
                Some(close) => {
                    let name = &after[1..close];
                    match defined.get(name) {
                        Some(v) => out.push_str(v),
                        None => out.push_str(&format!("$({name})")),
                    }
                    rest = &after[close + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = &after[1..];
                }
            },
            Some(ch) => {
                out.push('$');
                out.push(ch);
                rest = &after[ch.len_utf8()..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{
        ConfigMapEnvSource, ConfigMapKeySelector, EnvFromSource, EnvVarSource, PodSpec, SecretKeySelector,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn defined() -> HashMap<&'static str, &'static str> {
        HashMap::from([("A", "1"), ("B", "two")])
    }

    #[test]
    fn expansion_follows_upstream_rules() {
        let d = defined();
        assert_eq!(expand("$(A)-$(B)", &d), "1-two");
        assert_eq!(expand("$(MISSING)", &d), "$(MISSING)");
        assert_eq!(expand("$$(A)", &d), "$(A)");
        assert_eq!(expand("a$$b", &d), "a$b");
        assert_eq!(expand("$(A", &d), "$(A");
        assert_eq!(expand("$A $", &d), "$A $");
        assert_eq!(expand("ü$(B)ü", &d), "ütwoü");
    }

    fn env(name: &str, value: &str) -> EnvVar {
        EnvVar { name: name.into(), value: Some(value.into()), ..Default::default() }
    }

    fn from(name: &str, source: EnvVarSource) -> EnvVar {
        EnvVar { name: name.into(), value_from: Some(source), ..Default::default() }
    }

    fn cm_key(name: &str, key: &str, optional: bool) -> EnvVarSource {
        EnvVarSource {
            config_map_key_ref: Some(ConfigMapKeySelector {
                name: name.into(),
                key: key.into(),
                optional: Some(optional),
            }),
            ..Default::default()
        }
    }

    fn pod(c: Container) -> Pod {
        Pod {
            metadata: ObjectMeta { name: Some("p".into()), namespace: Some("ns".into()), ..Default::default() },
            spec: Some(PodSpec { containers: vec![c], ..Default::default() }),
            ..Default::default()
        }
    }

    fn objects() -> EnvObjects {
        let cm = ConfigMap {
            data: Some([("host".to_string(), "db".to_string()), ("port".to_string(), "5432".to_string())].into()),
            ..Default::default()
        };
        let secret =
            Secret { data: Some([("pw".to_string(), ByteString(b"hunter2".to_vec()))].into()), ..Default::default() };
        EnvObjects {
            config_maps: [("cfg".to_string(), cm)].into(),
            secrets: [("s".to_string(), secret)].into(),
            services: vec![],
        }
    }

    fn run(c: Container) -> Result<Resolved, EnvError> {
        let p = pod(c);
        let c = &p.spec.as_ref().unwrap().containers[0];
        resolve(&p, c, &downward::Fields::default(), &objects())
    }

    #[test]
    fn env_from_then_env_with_expansion_in_order() {
        let c = Container {
            name: "c".into(),
            env_from: Some(vec![EnvFromSource {
                prefix: Some("DB_".into()),
                config_map_ref: Some(ConfigMapEnvSource { name: "cfg".into(), optional: None }),
                ..Default::default()
            }]),
            env: Some(vec![
                env("URL", "$(DB_host):$(DB_port)/$(LATER)"),
                from(
                    "PW",
                    EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector { name: "s".into(), key: "pw".into(), optional: None }),
                        ..Default::default()
                    },
                ),
                env("LATER", "x"),
                from("OPT", cm_key("cfg", "absent", true)),
            ]),
            command: Some(vec!["echo".into(), "$(URL)".into()]),
            args: Some(vec!["$$(PW)".into(), "$(PW)".into()]),
            ..Default::default()
        };
        let r = run(c).unwrap();
        let envs: Vec<(&str, &str)> = r.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            envs,
            [("DB_host", "db"), ("DB_port", "5432"), ("URL", "db:5432/$(LATER)"), ("PW", "hunter2"), ("LATER", "x")]
        );
        assert_eq!(r.command, ["echo", "db:5432/$(LATER)"]);
        assert_eq!(r.args, ["$(PW)", "hunter2"]);
    }

    #[test]
    fn service_variables_come_last_and_explicit_env_overrides_them() {
        let c = Container {
            env: Some(vec![env("URL", "http://$(WEB_SERVICE_HOST)"), env("WEB_SERVICE_PORT", "8080")]),
            args: Some(vec!["$(WEB_SERVICE_PORT)".into()]),
            ..Default::default()
        };
        let services = vec![("WEB_SERVICE_HOST".into(), "10.96.0.3".into()), ("WEB_SERVICE_PORT".into(), "80".into())];
        let p = pod(c);
        let objects = EnvObjects { services, ..objects() };
        let r = resolve(&p, &p.spec.as_ref().unwrap().containers[0], &downward::Fields::default(), &objects).unwrap();
        let envs: Vec<(&str, &str)> = r.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            envs,
            [("URL", "http://10.96.0.3"), ("WEB_SERVICE_PORT", "8080"), ("WEB_SERVICE_HOST", "10.96.0.3")]
        );
        assert_eq!(r.args, ["8080"]);
    }

    #[test]
    fn missing_required_key_or_object_gives_upstream_message() {
        let c = Container { env: Some(vec![from("X", cm_key("cfg", "K", false))]), ..Default::default() };
        assert_eq!(run(c).unwrap_err().to_string(), "couldn't find key K in ConfigMap ns/cfg");
        let c = Container { env: Some(vec![from("X", cm_key("nope", "K", false))]), ..Default::default() };
        assert_eq!(run(c).unwrap_err().to_string(), "configmap \"nope\" not found");
        let c = Container { env: Some(vec![from("X", cm_key("nope", "K", true))]), ..Default::default() };
        assert!(run(c).unwrap().envs.is_empty(), "an optional missing ConfigMap leaves the variable out");
    }

    #[test]
    fn referenced_lists_every_source() {
        let c = Container {
            env_from: Some(vec![EnvFromSource {
                config_map_ref: Some(ConfigMapEnvSource { name: "a".into(), optional: None }),
                ..Default::default()
            }]),
            env: Some(vec![from("X", cm_key("b", "k", false))]),
            ..Default::default()
        };
        let (cms, secrets) = referenced(&c);
        assert_eq!(cms.into_iter().collect::<Vec<_>>(), ["a", "b"]);
        assert!(secrets.is_empty());
    }
}
