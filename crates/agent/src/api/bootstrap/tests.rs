use k8s_openapi::api::certificates::v1::{CertificateSigningRequestCondition, CertificateSigningRequestStatus};
use rcgen::KeyPair;

use super::*;

/// A self-signed certificate valid between two Unix times.
fn cert_between(not_before: i64, not_after: i64) -> String {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.not_before = time_at(not_before);
    params.not_after = time_at(not_after);
    params.self_signed(&KeyPair::generate().unwrap()).unwrap().pem()
}

fn time_at(secs: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(secs).unwrap()
}

#[test]
fn csr_name_is_stable_per_key_and_subject() {
    let key = KeyPair::generate().unwrap();
    let spki = key.subject_public_key_info();
    let a = csr_name(&spki, "system:node:n1", &["system:nodes"], CLIENT_USAGES);
    assert_eq!(a, csr_name(&spki, "system:node:n1", &["system:nodes"], CLIENT_USAGES));
    assert!(a.starts_with("node-csr-") && a.len() == "node-csr-".len() + 43, "{a}");
    assert_ne!(a, csr_name(&spki, "system:node:n2", &["system:nodes"], CLIENT_USAGES));
    let other = KeyPair::generate().unwrap().subject_public_key_info();
    assert_ne!(a, csr_name(&other, "system:node:n1", &["system:nodes"], CLIENT_USAGES));
    // The delimiter keeps "CN:foo,O:bar" and "CN:foob,O:ar" apart.
    assert_ne!(csr_name(&spki, "foo", &["bar"], &[]), csr_name(&spki, "foob", &["ar"], &[]));
}

#[test]
fn request_names_the_node() {
    let key = KeyPair::generate().unwrap();
    let pem = certificate_request(&key, "n1", &CertNames::default()).unwrap();
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    assert_eq!(block.label, "CERTIFICATE REQUEST");
    use x509_parser::prelude::FromDer;
    let (_, req) = x509_parser::certification_request::X509CertificationRequest::from_der(&block.contents).unwrap();
    let subject = &req.certification_request_info.subject;
    assert_eq!(subject.iter_common_name().next().unwrap().as_str().unwrap(), "system:node:n1");
    assert_eq!(subject.iter_organization().next().unwrap().as_str().unwrap(), "system:nodes");
    assert!(req.requested_extensions().is_none(), "no extensions, as the kubelet's request");
}

#[test]
fn validity_window() {
    let pem = cert_between(1_000, 2_000);
    assert!(cert_valid_at(pem.as_bytes(), 1_500).is_ok());
    assert!(cert_valid_at(pem.as_bytes(), 2_000).unwrap_err().contains("expired"));
    assert!(cert_valid_at(pem.as_bytes(), 999).unwrap_err().contains("not valid before"));
    assert_eq!(cert_valid_at(b"", 0).unwrap_err(), "no certificate");
}

fn with_conditions(conds: &[(&str, &str)], cert: Option<&str>) -> CertificateSigningRequest {
    CertificateSigningRequest {
        status: Some(CertificateSigningRequestStatus {
            certificate: cert.map(|c| ByteString(c.as_bytes().to_vec())),
            conditions: Some(
                conds
                    .iter()
                    .map(|(t, r)| CertificateSigningRequestCondition {
                        type_: t.to_string(),
                        status: "True".into(),
                        reason: Some(r.to_string()),
                        message: Some(format!("{r} message")),
                        ..Default::default()
                    })
                    .collect(),
            ),
        }),
        ..Default::default()
    }
}

#[test]
fn csr_states() {
    assert_eq!(csr_state(&CertificateSigningRequest::default()), CsrState::Pending);
    assert_eq!(csr_state(&with_conditions(&[("Approved", "AutoApproved")], None)), CsrState::Pending);
    assert_eq!(
        csr_state(&with_conditions(&[("Approved", "AutoApproved")], Some("PEM"))),
        CsrState::Issued("PEM".into())
    );
    assert_eq!(
        csr_state(&with_conditions(&[("Denied", "Nope")], None)),
        CsrState::Denied { reason: "Nope".into(), message: "Nope message".into() }
    );
    assert!(matches!(
        csr_state(&with_conditions(&[("Approved", "A"), ("Failed", "Bad")], None)),
        CsrState::Failed { .. }
    ));
}

#[test]
fn written_kubeconfig_points_at_the_current_pem() {
    let dir = tempfile::tempdir().unwrap();
    let pem = cert_between(0, 4_000_000_000);
    let key = KeyPair::generate().unwrap();
    let link = write_current(dir.path(), CLIENT_FILE_PREFIX, &pem, &key.serialize_pem()).unwrap();
    assert_eq!(link, dir.path().join(CURRENT_PEM_FILE));
    let target = std::fs::read_link(&link).unwrap();
    let file_name = target.file_name().unwrap().to_str().unwrap().to_string();
    assert!(file_name.starts_with("kubelet-client-20") && file_name.ends_with(".pem"), "{file_name}");
    let kubeconfig = dir.path().join("kubelet.conf");
    write_private(&kubeconfig, render_kubeconfig("https://10.0.0.1:6443", "CA PEM", false, &link).as_bytes()).unwrap();
    let parsed = Kubeconfig::read_from(&kubeconfig).unwrap();
    let user = parsed.auth_infos[0].auth_info.clone().unwrap();
    assert_eq!(user.client_certificate.as_deref(), Some(link.to_str().unwrap()));
    assert_eq!(user.client_key.as_deref(), Some(link.to_str().unwrap()));
    assert!(cert_valid_at(&kubeconfig_client_cert(&kubeconfig).unwrap(), 1_000).is_ok());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&kubeconfig).unwrap().permissions().mode() & 0o777, 0o600);
}

#[test]
fn pending_key_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let first = pending_key(dir.path()).unwrap();
    let again = pending_key(dir.path()).unwrap();
    assert_eq!(first.subject_public_key_info(), again.subject_public_key_info());
}

fn spec_for(request: &str) -> CertificateSigningRequestSpec {
    CertificateSigningRequestSpec {
        request: ByteString(request.as_bytes().to_vec()),
        signer_name: KUBELET_CLIENT_SIGNER.into(),
        usages: Some(CLIENT_USAGES.iter().map(|u| u.to_string()).collect()),
        ..Default::default()
    }
}

#[test]
fn a_request_made_again_with_the_same_key_is_compatible() {
    let key = KeyPair::generate().unwrap();
    let first = spec_for(&certificate_request(&key, "n1", &CertNames::default()).unwrap());
    let again = spec_for(&certificate_request(&key, "n1", &CertNames::default()).unwrap());
    let existing = CertificateSigningRequest { spec: first, ..Default::default() };
    assert!(compatible(&existing, &again).is_ok());
    let other_key = spec_for(&certificate_request(&KeyPair::generate().unwrap(), "n1", &CertNames::default()).unwrap());
    assert_eq!(compatible(&existing, &other_key).unwrap_err(), "its public key differs");
    let other_node = spec_for(&certificate_request(&key, "n2", &CertNames::default()).unwrap());
    assert_eq!(compatible(&existing, &other_node).unwrap_err(), "its subject differs");
}
