use rcgen::{CertificateParams, DnType, KeyPair};

use super::*;
use crate::pki::Pki;

/// A PEM certificate request like the kubelet's: subject only, or with SANs.
fn request(cn: &str, orgs: &[&str], sans: &[&str]) -> String {
    let mut params = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, cn);
    if let Some(o) = orgs.first() {
        params.distinguished_name.push(DnType::OrganizationName, *o);
    }
    let key = KeyPair::generate().unwrap();
    params.serialize_request(&key).unwrap().pem().unwrap()
}

fn csr(signer: &str, req: &str, usages: &[&str], requestor: &str) -> Value {
    json!({
        "metadata": {"name": "node-csr-x", "resourceVersion": "1"},
        "spec": {"request": STANDARD.encode(req), "signerName": signer, "usages": usages, "username": requestor},
        "status": {},
    })
}

fn client_csr(requestor: &str) -> Value {
    let req = request("system:node:n1", &["system:nodes"], &[]);
    csr(KUBELET_CLIENT_SIGNER, &req, &["digital signature", "client auth"], requestor)
}

fn field_errors(e: ApiError) -> String {
    e.message
}

#[test]
fn create_records_the_requestor_and_clears_status() {
    let mut obj = client_csr("forged");
    obj["status"] = json!({"certificate": "Zm9v"});
    let user = UserInfo {
        username: "system:bootstrap:abcdef".into(),
        groups: vec!["system:bootstrappers".into(), "system:authenticated".into()],
        ..Default::default()
    };
    prepare_create(&user, &mut obj).unwrap();
    assert_eq!(obj["spec"]["username"], "system:bootstrap:abcdef");
    assert_eq!(obj["spec"]["groups"], json!(["system:bootstrappers", "system:authenticated"]));
    assert_eq!(obj["status"], json!({}));
}

#[test]
fn create_validates_request_signer_and_usages() {
    let user = UserInfo::default();
    let mut obj = json!({"metadata": {"name": "x"}, "spec": {"request": STANDARD.encode("not a pem")}});
    let msg = field_errors(prepare_create(&user, &mut obj).unwrap_err());
    assert!(msg.contains("spec.request: Invalid value"), "{msg}");
    assert!(msg.contains("spec.signerName: Required value"), "{msg}");
    assert!(msg.contains("spec.usages: Required value"), "{msg}");

    let mut obj = client_csr("u");
    obj["spec"]["signerName"] = json!("kubernetes.io/legacy-unknown");
    obj["spec"]["usages"] = json!(["client auth", "client auth", "flying"]);
    let msg = field_errors(prepare_create(&user, &mut obj).unwrap_err());
    assert!(msg.contains("legacy signerName is not allowed"), "{msg}");
    assert!(msg.contains("spec.usages[1]: Duplicate value"), "{msg}");
    assert!(msg.contains("spec.usages[2]: Unsupported value: \"flying\""), "{msg}");

    let mut obj = client_csr("u");
    obj["spec"]["expirationSeconds"] = json!(60);
    let msg = field_errors(prepare_create(&user, &mut obj).unwrap_err());
    assert!(msg.contains("less than 600 seconds"), "{msg}");
}

fn approved(mut obj: Value) -> Value {
    obj["status"]["conditions"] = json!([{"type": "Approved", "status": "True", "reason": "r"}]);
    obj
}

#[test]
fn approval_subresource_changes_conditions_only() {
    let existing = client_csr("u");
    let mut new = approved(existing.clone());
    new["spec"]["signerName"] = json!("example.com/other");
    new["status"]["certificate"] = json!(STANDARD.encode("-----BEGIN CERTIFICATE-----"));
    prepare_update("approval", &existing, &mut new).unwrap();
    assert_eq!(new["spec"], existing["spec"]);
    assert!(new["status"].get("certificate").is_none(), "the approval subresource cannot set the certificate");
    assert!(has_condition(&new, "Approved"));

    let mut both = approved(existing.clone());
    both["status"]["conditions"].as_array_mut().unwrap().push(json!({"type": "Denied", "status": "True"}));
    let msg = field_errors(prepare_update("approval", &existing, &mut both).unwrap_err());
    assert!(msg.contains("mutually exclusive"), "{msg}");

    let mut removed = existing.clone();
    let msg = field_errors(prepare_update("approval", &approved(existing.clone()), &mut removed).unwrap_err());
    assert!(msg.contains("may not remove a condition of type \"Approved\""), "{msg}");
}

#[test]
fn status_subresource_keeps_approval_and_sets_the_certificate_once() {
    let pending = client_csr("u");
    let cert = json!(STANDARD.encode("-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n"));
    let mut early = pending.clone();
    early["status"]["certificate"] = cert.clone();
    let msg = field_errors(prepare_update("status", &pending, &mut early).unwrap_err());
    assert!(msg.contains("once the request is approved"), "{msg}");

    let mut self_approved = approved(pending.clone());
    prepare_update("status", &pending, &mut self_approved).unwrap();
    assert!(!has_condition(&self_approved, "Approved"), "approval goes through the approval subresource only");

    let ok = approved(pending);
    let mut issued = ok.clone();
    issued["status"]["certificate"] = cert;
    prepare_update("status", &ok, &mut issued).unwrap();
    let mut changed = issued.clone();
    changed["status"]["certificate"] = json!(STANDARD.encode("-----BEGIN CERTIFICATE-----\nAQ==\n"));
    let msg = field_errors(prepare_update("status", &issued, &mut changed).unwrap_err());
    assert!(msg.contains("field is immutable"), "{msg}");
}

#[test]
fn recognizes_node_client_requests_only() {
    assert_eq!(recognize(&client_csr("system:bootstrap:abcdef")), vec![Recognized::NodeClient]);
    assert_eq!(recognize(&client_csr("system:node:n1")), vec![Recognized::SelfNodeClient, Recognized::NodeClient]);
    let wrong_org = csr(
        KUBELET_CLIENT_SIGNER,
        &request("system:node:n1", &["other"], &[]),
        &["digital signature", "client auth"],
        "u",
    );
    assert!(recognize(&wrong_org).is_empty());
    let with_san = csr(
        KUBELET_CLIENT_SIGNER,
        &request("system:node:n1", &["system:nodes"], &["n1"]),
        &["digital signature", "client auth"],
        "u",
    );
    assert!(recognize(&with_san).is_empty());
    let serving = csr(
        KUBELET_SERVING_SIGNER,
        &request("system:node:n1", &["system:nodes"], &["n1", "10.0.0.1"]),
        &["digital signature", "server auth"],
        "system:node:n1",
    );
    assert!(recognize(&serving).is_empty(), "serving certificates wait for an approver");
}

#[test]
fn signs_with_the_ca_for_the_configured_lifetime() {
    let pki = Pki::generate();
    let req = request("system:node:n1", &["system:nodes"], &["n1", "10.0.0.1"]);
    let obj = csr(KUBELET_SERVING_SIGNER, &req, &["key encipherment", "digital signature", "server auth"], "u");
    let Signed::Issued(pem) = sign(&obj, &pki, Duration::from_secs(100)) else { panic!("not issued") };
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    let cert = pem.parse_x509().unwrap();
    assert_eq!(cert.subject().iter_common_name().next().unwrap().as_str().unwrap(), "system:node:n1");
    assert_eq!(cert.issuer().iter_common_name().next().unwrap().as_str().unwrap(), "gantry-test-apiserver-ca");
    let validity = cert.validity();
    let lifetime = validity.not_after.timestamp() - validity.not_before.timestamp();
    assert_eq!(lifetime, 120, "100 s, backdated by a fifth of it");
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && !eku.client_auth);

    let capped = {
        let mut o = obj.clone();
        o["spec"]["expirationSeconds"] = json!(600);
        o
    };
    let Signed::Issued(pem) = sign(&capped, &pki, DEFAULT_SIGNING_DURATION) else { panic!("not issued") };
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    let v = pem.parse_x509().unwrap().validity().clone();
    assert_eq!(v.not_after.timestamp() - v.not_before.timestamp(), 600 + 120);
}

#[test]
fn signer_fails_requests_that_break_its_rules() {
    let pki = Pki::generate();
    let no_sans = csr(
        KUBELET_SERVING_SIGNER,
        &request("system:node:n1", &["system:nodes"], &[]),
        &["digital signature", "server auth"],
        "u",
    );
    let Signed::Failed(why) = sign(&no_sans, &pki, Duration::from_secs(100)) else { panic!("signed") };
    assert_eq!(why, "DNS or IP subjectAltName is required");
    let other = csr("example.com/x", &request("a", &[], &[]), &["client auth"], "u");
    assert!(matches!(sign(&other, &pki, Duration::from_secs(100)), Signed::NotOurs));
}
