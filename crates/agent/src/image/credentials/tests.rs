use std::collections::BTreeMap;

use k8s_openapi::ByteString;

use super::*;

fn cred(user: &str) -> Credential {
    Credential { username: user.into(), password: format!("{user}-pw"), ..Default::default() }
}

fn keyring(entries: &[(&str, &str)]) -> Keyring {
    Keyring::new([entries.iter().map(|(loc, user)| (loc.to_string(), cred(user))).collect()])
}

fn users(k: &Keyring, image: &str) -> Vec<String> {
    k.lookup(image).into_iter().map(|c| c.username).collect()
}

fn secret(kind: &str, key: &str, data: &str) -> Secret {
    Secret {
        type_: Some(kind.into()),
        data: Some(BTreeMap::from([(key.to_string(), ByteString(data.as_bytes().to_vec()))])),
        ..Default::default()
    }
}

#[test]
fn repositories_are_normalized_like_docker_references() {
    assert_eq!(repository("busybox").unwrap(), "docker.io/library/busybox");
    assert_eq!(repository("busybox:1.36").unwrap(), "docker.io/library/busybox");
    assert_eq!(repository("library/busybox@sha256:abc").unwrap(), "docker.io/library/busybox");
    assert_eq!(repository("index.docker.io/team/app:v1").unwrap(), "docker.io/team/app");
    assert_eq!(repository("team/app").unwrap(), "docker.io/team/app");
    assert_eq!(repository("127.0.0.1:5000/nope:1").unwrap(), "127.0.0.1:5000/nope");
    assert_eq!(repository("localhost/app").unwrap(), "localhost/app");
    assert_eq!(repository("quay.io/team/app:v1@sha256:abc").unwrap(), "quay.io/team/app");
    assert!(repository("").is_err());
}

#[test]
fn docker_hub_images_use_index_docker_io_credentials() {
    let k = keyring(&[("https://index.docker.io/v1/", "hub")]);
    assert_eq!(users(&k, "busybox"), ["hub"]);
    assert_eq!(users(&k, "docker.io/team/app:v1"), ["hub"]);
    assert!(users(&k, "quay.io/team/app").is_empty());
    // A "docker.io" key matches Docker Hub images directly.
    let k = keyring(&[("docker.io", "short")]);
    assert_eq!(users(&k, "busybox:latest"), ["short"]);
}

#[test]
fn scheme_and_api_version_prefix_are_ignored() {
    for location in ["http://registry.example.com", "https://registry.example.com/v2/", "registry.example.com/"] {
        let k = keyring(&[(location, "u")]);
        assert_eq!(users(&k, "registry.example.com/app:1"), ["u"], "{location}");
    }
}

#[test]
fn ports_must_match() {
    let k = keyring(&[("127.0.0.1:5000", "five"), ("127.0.0.1", "none")]);
    assert_eq!(users(&k, "127.0.0.1:5000/app:1"), ["five"]);
    assert_eq!(users(&k, "127.0.0.1/app:1"), ["none"]);
    assert!(users(&k, "127.0.0.1:6000/app:1").is_empty());
}

#[test]
fn path_is_a_prefix_and_more_specific_keys_come_first() {
    let k = keyring(&[("quay.io", "all"), ("quay.io/team", "team"), ("quay.io/other", "other")]);
    assert_eq!(users(&k, "quay.io/team/app"), ["team", "all"]);
    assert_eq!(users(&k, "quay.io/solo/app"), ["all"]);
    // Upstream compares paths as strings, so a key path also covers longer names.
    assert_eq!(users(&k, "quay.io/teamwork/app"), ["team", "all"]);
}

#[test]
fn globs_match_one_host_part_each() {
    let k = keyring(&[("*.example.com", "star"), ("reg?.example.org", "q")]);
    assert_eq!(users(&k, "eu.example.com/app"), ["star"]);
    assert!(users(&k, "example.com/app").is_empty(), "the glob needs its own part");
    assert!(users(&k, "a.b.example.com/app").is_empty(), "the number of parts must be equal");
    assert_eq!(users(&k, "reg1.example.org/app"), ["q"]);
    assert!(users(&k, "reg12.example.org/app").is_empty());
}

#[test]
fn same_location_in_two_secrets_keeps_both_in_secret_order() {
    let first = vec![("quay.io".to_string(), cred("first"))];
    let second = vec![("https://quay.io".to_string(), cred("second"))];
    let k = Keyring::new([first, second]);
    assert_eq!(users(&k, "quay.io/app"), ["first", "second"]);
}

#[test]
fn dockerconfigjson_with_auth_and_tokens() {
    // base64("alice:s3cret:with:colons")
    let data = r#"{"auths":{"127.0.0.1:5000":{"auth":"YWxpY2U6czNjcmV0OndpdGg6Y29sb25z","identitytoken":"id-tok"},
        "quay.io":{"username":"bob","password":"pw","registrytoken":"reg-tok"}}}"#;
    let config = parse_secret(&secret(DOCKER_CONFIG_JSON_TYPE, DOCKER_CONFIG_JSON_KEY, data)).unwrap();
    let map: BTreeMap<_, _> = config.into_iter().collect();
    assert_eq!(map["127.0.0.1:5000"].username, "alice");
    assert_eq!(map["127.0.0.1:5000"].password, "s3cret:with:colons");
    assert_eq!(map["127.0.0.1:5000"].identity_token, "id-tok");
    assert_eq!(map["quay.io"], Credential { registry_token: "reg-tok".into(), ..cred("bob") }.with_password("pw"));
}

impl Credential {
    fn with_password(mut self, password: &str) -> Self {
        self.password = password.into();
        self
    }
}

#[test]
fn legacy_dockercfg_is_the_auths_map_itself() {
    let data = r#"{"https://index.docker.io/v1/":{"username":"hub","password":"pw","email":"x@y"}}"#;
    let config = parse_secret(&secret(DOCKERCFG_TYPE, DOCKERCFG_KEY, data)).unwrap();
    let k = Keyring::new([config]);
    assert_eq!(users(&k, "busybox"), ["hub"]);
}

#[test]
fn malformed_secrets_say_what_is_wrong() {
    let bad_json =
        parse_secret(&secret(DOCKER_CONFIG_JSON_TYPE, DOCKER_CONFIG_JSON_KEY, "{nope")).unwrap_err().to_string();
    assert!(bad_json.starts_with(".dockerconfigjson: invalid JSON"), "{bad_json}");

    let bad_base64 = r#"{"auths":{"quay.io":{"auth":"%%%"}}}"#;
    let err =
        parse_secret(&secret(DOCKER_CONFIG_JSON_TYPE, DOCKER_CONFIG_JSON_KEY, bad_base64)).unwrap_err().to_string();
    assert!(err.contains(r#"entry "quay.io": auth is not valid base64"#), "{err}");

    // base64("nocolon")
    let no_colon = r#"{"auths":{"quay.io":{"auth":"bm9jb2xvbg=="}}}"#;
    let err = parse_secret(&secret(DOCKER_CONFIG_JSON_TYPE, DOCKER_CONFIG_JSON_KEY, no_colon)).unwrap_err().to_string();
    assert!(err.contains("must be formatted as base64(username:password)"), "{err}");

    let missing = parse_secret(&secret(DOCKER_CONFIG_JSON_TYPE, DOCKERCFG_KEY, "{}")).unwrap_err().to_string();
    assert_eq!(missing, "missing key .dockerconfigjson");

    let opaque = parse_secret(&secret("Opaque", DOCKER_CONFIG_JSON_KEY, "{}")).unwrap_err().to_string();
    assert!(opaque.starts_with("type Opaque is neither"), "{opaque}");
}
