//! Kubeconfig files for the test users: the CA is embedded; credentials are a token, a
//! token file (`tokenFile`), or a client certificate and key.

use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;

/// How a kubeconfig user authenticates.
pub enum Credentials {
    Token(String),
    TokenFile(PathBuf),
    Certificate { cert_pem: String, key_pem: String },
}

const CLUSTER: &str = "gantry-test";

/// The kubeconfig YAML for one user of the server at `url`.
pub fn render(url: &str, ca_pem: &str, user: &str, creds: &Credentials) -> String {
    let user_entry = match creds {
        Credentials::Token(t) => json!({"token": t}),
        Credentials::TokenFile(p) => json!({"tokenFile": p.display().to_string()}),
        Credentials::Certificate { cert_pem, key_pem } => json!({
            "client-certificate-data": STANDARD.encode(cert_pem),
            "client-key-data": STANDARD.encode(key_pem),
        }),
    };
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CLUSTER, "cluster": {"server": url, "certificate-authority-data": STANDARD.encode(ca_pem)}}],
        "users": [{"name": user, "user": user_entry}],
        "contexts": [{"name": CLUSTER, "context": {"cluster": CLUSTER, "user": user, "namespace": "default"}}],
        "current-context": CLUSTER,
        "preferences": {},
    });
    serde_yaml_ng::to_string(&config).expect("kubeconfig serialises")
}

/// A file-name-safe form of a user label.
pub fn file_stem(label: &str) -> String {
    label.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '-' }).collect()
}

/// Writes `contents` to `dir/name`, creating `dir`.
pub fn write(dir: &Path, name: &str, contents: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_parseable_yaml() {
        let yaml = render("https://127.0.0.1:1", "CA", "admin", &Credentials::Token("t".into()));
        let kc = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some(CLUSTER));
        assert_eq!(kc.auth_infos[0].auth_info.as_ref().unwrap().token.as_ref().map(|_| ()), Some(()));
        let yaml = render("https://127.0.0.1:1", "CA", "n", &Credentials::TokenFile("/tmp/x".into()));
        assert!(yaml.contains("tokenFile: /tmp/x"));
    }

    #[test]
    fn stems() {
        assert_eq!(file_stem("system:node:a/b"), "system-node-a-b");
    }
}
