//! Bearer tokens the server issues: the admin token, per-node tokens (an HMAC of the node
//! name, so any node name works without registration), service account JWTs (HS256 with a
//! key made at start; a real server signs RS256/ES256), and tokens registered by tests.

use std::collections::HashMap;
use std::sync::Mutex;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use ring::hmac;
use serde_json::{Value, json};

use crate::UserInfo;

/// Issuer and default audience of service account tokens, as on a kubeadm cluster.
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

const NODE_TOKEN_PREFIX: &str = "gantry-node.";

pub struct Tokens {
    pub admin_token: String,
    node_key: hmac::Key,
    jwt_key: hmac::Key,
    key_id: String,
    registered: Mutex<HashMap<String, UserInfo>>,
}

fn random_bytes() -> [u8; 32] {
    let mut out = [0u8; 32];
    out[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    out[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Tokens {
    pub fn generate() -> Tokens {
        Tokens {
            admin_token: format!("gantry-admin.{}", hex(&random_bytes()[..16])),
            node_key: hmac::Key::new(hmac::HMAC_SHA256, &random_bytes()),
            jwt_key: hmac::Key::new(hmac::HMAC_SHA256, &random_bytes()),
            key_id: hex(&random_bytes()[..8]),
            registered: Mutex::new(HashMap::new()),
        }
    }

    /// The token that authenticates as `system:node:<node>`.
    pub fn node_token(&self, node: &str) -> String {
        let tag = hmac::sign(&self.node_key, node.as_bytes());
        format!("{NODE_TOKEN_PREFIX}{}.{}", B64URL.encode(node), hex(&tag.as_ref()[..16]))
    }

    /// The node a node token was issued for, if it is genuine.
    pub fn node_of_token(&self, token: &str) -> Option<String> {
        let rest = token.strip_prefix(NODE_TOKEN_PREFIX)?;
        let (name_b64, _) = rest.split_once('.')?;
        let node = String::from_utf8(B64URL.decode(name_b64).ok()?).ok()?;
        (self.node_token(&node) == token).then_some(node)
    }

    pub fn register(&self, token: &str, user: UserInfo) {
        self.registered.lock().unwrap_or_else(|p| p.into_inner()).insert(token.to_string(), user);
    }

    pub fn registered(&self, token: &str) -> Option<UserInfo> {
        self.registered.lock().unwrap_or_else(|p| p.into_inner()).get(token).cloned()
    }

    /// Signs a JWT with these claims.
    pub fn sign_jwt(&self, claims: &Value) -> String {
        let header = json!({"alg": "HS256", "kid": self.key_id, "typ": "JWT"});
        let signing_input = format!("{}.{}", B64URL.encode(header.to_string()), B64URL.encode(claims.to_string()));
        let sig = hmac::sign(&self.jwt_key, signing_input.as_bytes());
        format!("{signing_input}.{}", B64URL.encode(sig.as_ref()))
    }

    /// The claims of a JWT this server signed (None if it is not one); expiry is the
    /// caller's check.
    pub fn verify_jwt(&self, token: &str) -> Option<Value> {
        let (signing_input, sig) = token.rsplit_once('.')?;
        let sig = B64URL.decode(sig).ok()?;
        hmac::verify(&self.jwt_key, signing_input.as_bytes(), &sig).ok()?;
        let (_, claims) = signing_input.split_once('.')?;
        serde_json::from_slice(&B64URL.decode(claims).ok()?).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_tokens_verify() {
        let t = Tokens::generate();
        let tok = t.node_token("node-1");
        assert_eq!(t.node_of_token(&tok).as_deref(), Some("node-1"));
        assert_eq!(t.node_of_token(&tok.replace("node", "x")), None);
        let other = Tokens::generate();
        assert_eq!(other.node_of_token(&tok), None);
    }

    #[test]
    fn jwt_round_trip() {
        let t = Tokens::generate();
        let jwt = t.sign_jwt(&json!({"sub": "x", "exp": 5}));
        assert_eq!(t.verify_jwt(&jwt).unwrap()["sub"], "x");
        let mut forged = jwt.clone();
        forged.push('A');
        assert!(t.verify_jwt(&forged).is_none());
        assert!(Tokens::generate().verify_jwt(&jwt).is_none());
    }
}
