//! Registry credentials from image pull secrets, matched to an image the way upstream's
//! credentialprovider keyring does (pure).
//!
//! * Secrets of type `kubernetes.io/dockerconfigjson` (`.dockerconfigjson`, `{"auths": {…}}`)
//!   and legacy `kubernetes.io/dockercfg` (`.dockercfg`, the `auths` map itself).
//! * Each entry's key is a registry location: the scheme is dropped, `/v1/` or `/v2/` path
//!   prefixes stand for the host, and `*`/`?` globs are allowed in host name parts.
//! * An image matches a key when the ports are equal, the host has as many dot-separated parts
//!   and each matches, and the key's path is a prefix of the image's repository path. Keys
//!   are tried in reverse lexical order (so `quay.io/team` before `quay.io`), and every
//!   matching credential is returned: the puller tries them in order until one pull succeeds.
//! * Images on Docker Hub fall back to credentials for `index.docker.io`
//!   (`https://index.docker.io/v1/` in docker's own config files).

use std::collections::BTreeMap;

use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use serde::Deserialize;

pub const DOCKER_CONFIG_JSON_TYPE: &str = "kubernetes.io/dockerconfigjson";
pub const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
pub const DOCKERCFG_TYPE: &str = "kubernetes.io/dockercfg";
pub const DOCKERCFG_KEY: &str = ".dockercfg";

const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// One set of credentials for a registry, as CRI's `AuthConfig` carries them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credential {
    pub username: String,
    pub password: String,
    pub identity_token: String,
    pub registry_token: String,
}

/// The entries of one docker config: registry location → credential, in file order.
pub type DockerConfig = Vec<(String, Credential)>;

#[derive(Deserialize)]
struct DockerConfigJson {
    #[serde(default)]
    auths: BTreeMap<String, Entry>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Entry {
    username: String,
    password: String,
    auth: String,
    identitytoken: String,
    registrytoken: String,
}

/// Why a pull secret cannot be used, naming the key and entry.
#[derive(Debug, thiserror::Error)]
pub enum PullSecretError {
    #[error("type {0} is neither {DOCKER_CONFIG_JSON_TYPE} nor {DOCKERCFG_TYPE}")]
    WrongType(String),
    #[error("missing key {0}")]
    MissingKey(&'static str),
    #[error("{key}: invalid JSON: {source}")]
    InvalidJson { key: &'static str, source: serde_json::Error },
    #[error("{key}: entry {location:?}: {source}")]
    Entry { key: &'static str, location: String, source: EntryError },
}

/// Why one registry entry of a docker config has no usable credential.
#[derive(Debug, thiserror::Error)]
pub enum EntryError {
    #[error("auth is not valid base64: {0}")]
    Base64(#[from] base64::DecodeError),
    #[error("unable to parse auth field, must be formatted as base64(username:password)")]
    NoColon,
}

/// An image name that is not a valid reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid image reference {0:?}")]
pub struct InvalidReference(pub String);

/// The docker config in a pull secret, or why it cannot be used (naming the key and entry).
pub fn parse_secret(secret: &Secret) -> Result<DockerConfig, PullSecretError> {
    let kind = secret.type_.as_deref().unwrap_or("Opaque");
    let key = match kind {
        DOCKER_CONFIG_JSON_TYPE => DOCKER_CONFIG_JSON_KEY,
        DOCKERCFG_TYPE => DOCKERCFG_KEY,
        other => return Err(PullSecretError::WrongType(other.to_string())),
    };
    let data = secret.data.as_ref().and_then(|d| d.get(key)).map(|b| b.0.as_slice()).unwrap_or_default();
    if data.is_empty() {
        return Err(PullSecretError::MissingKey(key));
    }
    let entries = if key == DOCKER_CONFIG_JSON_KEY {
        serde_json::from_slice::<DockerConfigJson>(data).map(|c| c.auths)
    } else {
        serde_json::from_slice::<BTreeMap<String, Entry>>(data)
    }
    .map_err(|source| PullSecretError::InvalidJson { key, source })?;
    entries
        .into_iter()
        .map(|(location, entry)| {
            let credential = entry.credential().map_err(|source| PullSecretError::Entry {
                key,
                location: location.clone(),
                source,
            })?;
            Ok((location, credential))
        })
        .collect()
}

impl Entry {
    /// A non-empty `auth` (base64 of `user:password`) takes precedence, as in docker.
    fn credential(self) -> Result<Credential, EntryError> {
        let (username, password) = if self.auth.is_empty() {
            (self.username, self.password)
        } else {
            let decoded = base64::engine::general_purpose::STANDARD.decode(self.auth.trim())?;
            let text = String::from_utf8_lossy(&decoded);
            let (user, pass) = text.split_once(':').ok_or(EntryError::NoColon)?;
            (user.to_string(), pass.to_string())
        };
        Ok(Credential { username, password, identity_token: self.identitytoken, registry_token: self.registrytoken })
    }
}

/// The credentials of all usable pull secrets, indexed by registry location.
#[derive(Debug, Default)]
pub struct Keyring {
    /// Location keys, most specific (reverse lexical) first.
    index: Vec<String>,
    creds: BTreeMap<String, Vec<Credential>>,
}

impl Keyring {
    /// Builds the keyring from docker configs in pull secret order; the same location in two
    /// secrets keeps both credentials, first secret first.
    pub fn new(configs: impl IntoIterator<Item = DockerConfig>) -> Self {
        let mut creds: BTreeMap<String, Vec<Credential>> = BTreeMap::new();
        for (location, credential) in configs.into_iter().flatten() {
            creds.entry(location_key(&location)).or_default().push(credential);
        }
        let index = creds.keys().rev().cloned().collect();
        Keyring { index, creds }
    }

    /// Every credential that may apply to `image`, in the order to try them; empty means an
    /// anonymous pull.
    pub fn lookup(&self, image: &str) -> Vec<Credential> {
        let Ok(repository) = repository(image) else { return Vec::new() };
        let target = Location::parse(&repository);
        let found: Vec<Credential> = self
            .index
            .iter()
            .filter(|key| Location::parse(key).matches(&target))
            .flat_map(|key| self.creds[key].iter().cloned())
            .collect();
        if found.is_empty() && is_default_registry(&repository) {
            return self.creds.get(DEFAULT_REGISTRY_HOST).cloned().unwrap_or_default();
        }
        found
    }
}

/// The key upstream files a docker config location under: host, plus the path unless it is
/// empty or only docker's `/v1/` or `/v2/` API prefix.
fn location_key(location: &str) -> String {
    let rest = location.strip_prefix("https://").or_else(|| location.strip_prefix("http://")).unwrap_or(location);
    let (host, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    let path = if path.starts_with("/v1/") || path.starts_with("/v2/") { &path[3..] } else { path };
    if path.is_empty() || path == "/" { host.to_string() } else { format!("{host}{path}") }
}

/// A schemeless registry location or image repository, split for matching.
struct Location<'a> {
    host_parts: Vec<&'a str>,
    port: &'a str,
    path: &'a str,
}

impl<'a> Location<'a> {
    fn parse(s: &'a str) -> Self {
        let (host, path) = s.find('/').map_or((s, ""), |i| s.split_at(i));
        let (host, port) = host.rsplit_once(':').unwrap_or((host, ""));
        Location { host_parts: host.split('.').collect(), port, path }
    }

    /// Whether `self` (a keyring key, possibly with globs) covers `target`.
    fn matches(&self, target: &Location) -> bool {
        self.port == target.port
            && self.host_parts.len() == target.host_parts.len()
            && target.path.starts_with(self.path)
            && self.host_parts.iter().zip(&target.host_parts).all(|(glob, part)| glob_match(glob, part))
    }
}

/// Shell-style match of one host name part: `*` any run of characters, `?` one character.
fn glob_match(glob: &str, text: &str) -> bool {
    fn go(g: &[char], t: &[char]) -> bool {
        match g.split_first() {
            None => t.is_empty(),
            Some(('*', rest)) => (0..=t.len()).any(|i| go(rest, &t[i..])),
            Some(('?', rest)) => !t.is_empty() && go(rest, &t[1..]),
            Some((c, rest)) => t.first() == Some(c) && go(rest, &t[1..]),
        }
    }
    let (g, t): (Vec<char>, Vec<char>) = (glob.chars().collect(), text.chars().collect());
    go(&g, &t)
}

/// Whether the (normalized) repository is on Docker Hub.
fn is_default_registry(repository: &str) -> bool {
    repository.split('/').next() == Some("docker.io")
}

/// The image's repository with its registry made explicit and tag and digest dropped, as
/// docker's reference normalization does: `busybox:1` → `docker.io/library/busybox`,
/// `index.docker.io/x/y` → `docker.io/x/y`, `127.0.0.1:5000/a:1` → `127.0.0.1:5000/a`.
pub fn repository(image: &str) -> Result<String, InvalidReference> {
    let name = image.split('@').next().unwrap_or_default();
    let name = match name.rfind(':') {
        Some(i) if !name[i..].contains('/') => &name[..i],
        _ => name,
    };
    if name.is_empty() {
        return Err(InvalidReference(image.to_string()));
    }
    let (domain, rest) = match name.split_once('/') {
        Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => (first, rest),
        _ => ("docker.io", name),
    };
    let domain = if domain == DEFAULT_REGISTRY_HOST { "docker.io" } else { domain };
    if domain == "docker.io" && !rest.contains('/') {
        return Ok(format!("docker.io/library/{rest}"));
    }
    Ok(format!("{domain}/{rest}"))
}

#[cfg(test)]
mod tests;
