//! The files of `configMap`, `secret`, `downwardAPI` and `projected` volumes, computed from the
//! pod and the API objects they refer to. Pure; the files are written by [`super::atomic_writer`].

use crate::cluster::objects::TokenKey;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, Pod, Secret, ServiceAccountTokenProjection, Volume,
};

use super::downward;

/// Upstream's default file mode for these volumes (0644).
pub const DEFAULT_MODE: u32 = 0o644;
/// Upstream's default token lifetime when `expirationSeconds` is not set.
pub const DEFAULT_TOKEN_SECONDS: i64 = 3600;

/// One file of a volume: its path relative to the volume root, contents and mode.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct File {
    pub path: String,
    pub data: Vec<u8>,
    pub mode: u32,
}

/// What the volumes refer to, fetched by the caller; a missing name means not found.
#[derive(Debug, Default)]
pub struct Objects {
    pub config_maps: HashMap<String, ConfigMap>,
    pub secrets: HashMap<String, Secret>,
    pub tokens: HashMap<TokenKey, String>,
}

/// What a volume of these kinds refers to: ConfigMap names, Secret names and tokens.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct References {
    pub config_maps: BTreeSet<String>,
    pub secrets: BTreeSet<String>,
    pub tokens: BTreeSet<TokenKey>,
}

/// Whether the volume is one whose files this module computes.
pub fn is_projection(v: &Volume) -> bool {
    v.config_map.is_some() || v.secret.is_some() || v.downward_api.is_some() || v.projected.is_some()
}

pub fn references(v: &Volume) -> References {
    let mut r = References::default();
    if let Some(cm) = &v.config_map {
        r.config_maps.insert(cm.name.clone());
    }
    if let Some(s) = &v.secret {
        r.secrets.extend(s.secret_name.clone());
    }
    for p in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
        if let Some(cm) = &p.config_map {
            r.config_maps.insert(cm.name.clone());
        }
        if let Some(s) = &p.secret {
            r.secrets.insert(s.name.clone());
        }
        if let Some(t) = &p.service_account_token {
            r.tokens.insert(token_key(t));
        }
    }
    r
}

/// An empty audience means the API server's own (no audience in the TokenRequest).
pub fn token_key(t: &ServiceAccountTokenProjection) -> TokenKey {
    TokenKey {
        audience: t.audience.clone().unwrap_or_default(),
        expiration_seconds: t.expiration_seconds.unwrap_or(DEFAULT_TOKEN_SECONDS),
    }
}

/// A file path in a volume that would escape it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("invalid path {0:?}: must be a non-empty relative path")]
    NotRelative(String),
    #[error("invalid path {0:?}: must not contain '..' or start with '..'")]
    DotDot(String),
}

/// Why a projected volume's files cannot be written, with upstream's messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProjectionError {
    #[error("service account token not available")]
    TokenUnavailable,
    #[error("invalid mode {0:o}: must be between 0 and 0777")]
    InvalidMode(i32),
    #[error(transparent)]
    Path(#[from] PathError),
    #[error("configmap {0:?} not found")]
    ConfigMapNotFound(String),
    #[error("configmap references non-existent config key: {0}")]
    ConfigMapKeyNotFound(String),
    #[error("secret {0:?} not found")]
    SecretNotFound(String),
    #[error("references non-existent secret key: {0}")]
    SecretKeyNotFound(String),
    #[error(transparent)]
    Downward(#[from] downward::DownwardError),
    #[error("downwardAPI item {0:?}: needs fieldRef or resourceFieldRef")]
    DownwardItemWithoutSource(String),
}

/// The volume's files, or the upstream error for a missing object or key.
pub fn files(
    pod: &Pod,
    v: &Volume,
    objects: &Objects,
    fields: &downward::Fields,
) -> Result<Vec<File>, ProjectionError> {
    let mut out = BTreeMap::new();
    if let Some(src) = &v.config_map {
        let mode = mode_of(src.default_mode)?;
        config_map(&src.name, src.items.as_deref(), src.optional, mode, objects, &mut out)?;
    } else if let Some(src) = &v.secret {
        let mode = mode_of(src.default_mode)?;
        let name = src.secret_name.as_deref().unwrap_or_default();
        secret(name, src.items.as_deref(), src.optional, mode, objects, &mut out)?;
    } else if let Some(src) = &v.downward_api {
        let mode = mode_of(src.default_mode)?;
        downward_files(pod, src.items.as_deref(), mode, fields, &mut out)?;
    } else if let Some(src) = &v.projected {
        let mode = mode_of(src.default_mode)?;
        for p in src.sources.iter().flatten() {
            if let Some(s) = &p.config_map {
                config_map(&s.name, s.items.as_deref(), s.optional, mode, objects, &mut out)?;
            }
            if let Some(s) = &p.secret {
                secret(&s.name, s.items.as_deref(), s.optional, mode, objects, &mut out)?;
            }
            if let Some(s) = &p.downward_api {
                downward_files(pod, s.items.as_deref(), mode, fields, &mut out)?;
            }
            if let Some(t) = &p.service_account_token {
                let token = objects.tokens.get(&token_key(t)).ok_or(ProjectionError::TokenUnavailable)?;
                add(&mut out, &t.path, token.as_bytes().to_vec(), mode)?;
            }
        }
    }
    Ok(out.into_values().collect())
}

fn mode_of(mode: Option<i32>) -> Result<u32, ProjectionError> {
    match mode {
        None => Ok(DEFAULT_MODE),
        Some(m) if (0..=0o777).contains(&m) => Ok(m as u32),
        Some(m) => Err(ProjectionError::InvalidMode(m)),
    }
}

fn add(out: &mut BTreeMap<String, File>, path: &str, data: Vec<u8>, mode: u32) -> Result<(), ProjectionError> {
    validate_path(path)?;
    out.insert(path.to_string(), File { path: path.to_string(), data, mode });
    Ok(())
}

/// Relative, no `..` element, not starting with `..` (reserved for the writer's own entries).
pub fn validate_path(path: &str) -> Result<(), PathError> {
    if path.is_empty() || path.starts_with('/') {
        return Err(PathError::NotRelative(path.to_string()));
    }
    if path.starts_with("..") || path.split('/').any(|e| e == "..") {
        return Err(PathError::DotDot(path.to_string()));
    }
    Ok(())
}

/// Keys (all of them, or the listed items) to files; `missing` names a listed key not present.
fn keyed(
    data: BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    optional: bool,
    mode: u32,
    missing: impl Fn(&str) -> ProjectionError,
    out: &mut BTreeMap<String, File>,
) -> Result<(), ProjectionError> {
    let Some(items) = items.filter(|i| !i.is_empty()) else {
        for (k, v) in data {
            add(out, &k, v, mode)?;
        }
        return Ok(());
    };
    for item in items {
        match data.get(&item.key) {
            Some(v) => add(out, &item.path, v.clone(), mode_of(item.mode.or(Some(mode as i32)))?)?,
            None if optional => {}
            None => return Err(missing(&item.key)),
        }
    }
    Ok(())
}

fn config_map(
    name: &str,
    items: Option<&[KeyToPath]>,
    optional: Option<bool>,
    mode: u32,
    objects: &Objects,
    out: &mut BTreeMap<String, File>,
) -> Result<(), ProjectionError> {
    let optional = optional == Some(true);
    let Some(cm) = objects.config_maps.get(name) else {
        return if optional { Ok(()) } else { Err(ProjectionError::ConfigMapNotFound(name.to_string())) };
    };
    let mut data: BTreeMap<String, Vec<u8>> =
        cm.data.iter().flatten().map(|(k, v)| (k.clone(), v.clone().into_bytes())).collect();
    data.extend(cm.binary_data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())));
    keyed(data, items, optional, mode, |k| ProjectionError::ConfigMapKeyNotFound(k.to_string()), out)
}

fn secret(
    name: &str,
    items: Option<&[KeyToPath]>,
    optional: Option<bool>,
    mode: u32,
    objects: &Objects,
    out: &mut BTreeMap<String, File>,
) -> Result<(), ProjectionError> {
    let optional = optional == Some(true);
    let Some(s) = objects.secrets.get(name) else {
        return if optional { Ok(()) } else { Err(ProjectionError::SecretNotFound(name.to_string())) };
    };
    let mut data: BTreeMap<String, Vec<u8>> = s.data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())).collect();
    data.extend(s.string_data.iter().flatten().map(|(k, v)| (k.clone(), v.clone().into_bytes())));
    keyed(data, items, optional, mode, |k| ProjectionError::SecretKeyNotFound(k.to_string()), out)
}

fn downward_files(
    pod: &Pod,
    items: Option<&[DownwardAPIVolumeFile]>,
    mode: u32,
    fields: &downward::Fields,
    out: &mut BTreeMap<String, File>,
) -> Result<(), ProjectionError> {
    for item in items.into_iter().flatten() {
        let value = if let Some(f) = &item.field_ref {
            downward::field(pod, &f.field_path, fields)?
        } else if let Some(r) = &item.resource_field_ref {
            downward::resource(pod, None, r, fields)?
        } else {
            return Err(ProjectionError::DownwardItemWithoutSource(item.path.clone()));
        };
        add(out, &item.path, value.into_bytes(), mode_of(item.mode.or(Some(mode as i32)))?)?;
    }
    Ok(())
}

/// The mode upstream gives files and directories of a volume owned by an `fsGroup`: group
/// readable (and writable unless read-only), directories also group-searchable and setgid.
pub fn fs_group_mode(mode: u32, dir: bool, read_only: bool) -> u32 {
    let mask = if read_only { 0o440 } else { 0o660 };
    let mut m = mode | mask;
    if dir {
        m |= 0o2000 | 0o110;
    }
    m
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{
        ConfigMapProjection, ConfigMapVolumeSource, DownwardAPIProjection, ObjectFieldSelector, PodSpec,
        ProjectedVolumeSource, SecretVolumeSource, VolumeProjection,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta { name: Some("p".into()), namespace: Some("ns".into()), ..Default::default() },
            spec: Some(PodSpec::default()),
            ..Default::default()
        }
    }

    fn objects() -> Objects {
        let cm = ConfigMap {
            data: Some([("ca.crt".to_string(), "PEM".to_string()), ("b".to_string(), "2".to_string())].into()),
            ..Default::default()
        };
        let s = Secret {
            data: Some(
                [("user".to_string(), ByteString(b"u".to_vec())), ("pw".to_string(), ByteString(b"p".to_vec()))].into(),
            ),
            ..Default::default()
        };
        let tokens = [(TokenKey { audience: String::new(), expiration_seconds: 3607 }, "TOKEN".to_string())].into();
        Objects { config_maps: [("root".to_string(), cm)].into(), secrets: [("s".to_string(), s)].into(), tokens }
    }

    fn run(v: Volume) -> Result<Vec<(String, String, u32)>, ProjectionError> {
        let files = files(&pod(), &v, &objects(), &downward::Fields::default())?;
        Ok(files.into_iter().map(|f| (f.path, String::from_utf8(f.data).unwrap(), f.mode)).collect())
    }

    fn item(key: &str, path: &str, mode: Option<i32>) -> KeyToPath {
        KeyToPath { key: key.into(), path: path.into(), mode }
    }

    #[test]
    fn secret_items_and_modes() {
        let v = Volume {
            name: "v".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some("s".into()),
                default_mode: Some(0o400),
                items: Some(vec![item("user", "creds/user", None), item("pw", "pw", Some(0o600))]),
                optional: None,
            }),
            ..Default::default()
        };
        assert_eq!(run(v).unwrap(), [("creds/user".into(), "u".into(), 0o400), ("pw".into(), "p".into(), 0o600)]);
    }

    #[test]
    fn missing_objects_and_keys_give_upstream_messages() {
        let cm = |name: &str, items, optional| Volume {
            name: "v".into(),
            config_map: Some(ConfigMapVolumeSource { name: name.into(), items, optional, default_mode: None }),
            ..Default::default()
        };
        assert_eq!(run(cm("nope", None, None)).unwrap_err(), ProjectionError::ConfigMapNotFound("nope".into()));
        assert!(run(cm("nope", None, Some(true))).unwrap().is_empty());
        let items = Some(vec![item("zz", "zz", None)]);
        assert_eq!(
            run(cm("root", items, None)).unwrap_err().to_string(),
            "configmap references non-existent config key: zz"
        );
        let all = run(cm("root", None, None)).unwrap();
        assert_eq!(all, [("b".into(), "2".into(), 0o644), ("ca.crt".into(), "PEM".into(), 0o644)]);
    }

    #[test]
    fn projected_service_account_volume() {
        let v = Volume {
            name: "kube-api-access-x".into(),
            projected: Some(ProjectedVolumeSource {
                default_mode: Some(0o644),
                sources: Some(vec![
                    VolumeProjection {
                        service_account_token: Some(ServiceAccountTokenProjection {
                            expiration_seconds: Some(3607),
                            path: "token".into(),
                            audience: None,
                        }),
                        ..Default::default()
                    },
                    VolumeProjection {
                        config_map: Some(ConfigMapProjection {
                            name: "root".into(),
                            items: Some(vec![item("ca.crt", "ca.crt", None)]),
                            optional: None,
                        }),
                        ..Default::default()
                    },
                    VolumeProjection {
                        downward_api: Some(DownwardAPIProjection {
                            items: Some(vec![DownwardAPIVolumeFile {
                                path: "namespace".into(),
                                field_ref: Some(ObjectFieldSelector {
                                    field_path: "metadata.namespace".into(),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            }]),
                        }),
                        ..Default::default()
                    },
                ]),
            }),
            ..Default::default()
        };
        let refs = references(&v);
        assert_eq!(refs.config_maps.into_iter().collect::<Vec<_>>(), ["root"]);
        assert_eq!(refs.tokens.into_iter().next().unwrap().expiration_seconds, 3607);
        let got = run(v).unwrap();
        let paths: Vec<&str> = got.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(paths, ["ca.crt", "namespace", "token"]);
        assert_eq!(got[1].1, "ns");
        assert_eq!(got[2].1, "TOKEN");
    }

    #[test]
    fn paths_must_stay_inside_the_volume() {
        assert!(validate_path("a/b").is_ok());
        for bad in ["", "/etc/x", "../x", "a/../b", "..data"] {
            assert!(validate_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn fs_group_makes_files_group_readable() {
        assert_eq!(fs_group_mode(0o600, false, true), 0o640);
        assert_eq!(fs_group_mode(0o644, false, false), 0o664);
        assert_eq!(fs_group_mode(0o755, true, false), 0o2775);
    }
}
