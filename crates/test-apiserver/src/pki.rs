//! Certificates made at start: a CA, the serving certificate (for 127.0.0.1 and the usual
//! in-cluster names), client certificates on demand, and the rustls server configuration
//! that asks for (but does not require) a client certificate signed by the CA.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;

/// The OID of the X.509 organization attribute, used to add a second `O=` entry (rcgen keeps
/// one value per attribute type).
const ORGANIZATION_OID: [u64; 4] = [2, 5, 4, 10];

pub struct Pki {
    pub ca_pem: String,
    ca_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    server_der: CertificateDer<'static>,
    server_key_der: Vec<u8>,
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, "gantry-test-apiserver-ca");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params
}

impl Pki {
    pub fn generate() -> Pki {
        let ca_key = KeyPair::generate().expect("generate CA key");
        let ca_cert = ca_params().self_signed(&ca_key).expect("self-sign CA");
        let issuer = Issuer::new(ca_params(), ca_key);

        let names: Vec<String> = [
            "127.0.0.1",
            "::1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "10.96.0.1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut params = CertificateParams::new(names).expect("server SANs");
        params.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        let server_key = KeyPair::generate().expect("generate server key");
        let server_cert = params.signed_by(&server_key, &issuer).expect("sign server certificate");

        Pki {
            ca_pem: ca_cert.pem(),
            ca_der: ca_cert.der().clone(),
            issuer,
            server_der: server_cert.der().clone(),
            server_key_der: server_key.serialize_der(),
        }
    }

    /// A client certificate (PEM cert, PEM PKCS#8 key) with CN=`cn` and one O= per group
    /// (at most two groups).
    pub fn client_cert(&self, cn: &str, groups: &[String]) -> (String, String) {
        assert!(groups.len() <= 2, "client certificates carry at most two groups (O= entries)");
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, cn);
        if let Some(g) = groups.first() {
            params.distinguished_name.push(DnType::OrganizationName, g.as_str());
        }
        if let Some(g) = groups.get(1) {
            params.distinguished_name.push(DnType::CustomDnType(ORGANIZATION_OID.to_vec()), g.as_str());
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        let key = KeyPair::generate().expect("generate client key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign client certificate");
        (cert.pem(), key.serialize_pem())
    }

    /// Issues a certificate for a PEM certificate request with the CA, valid from now for
    /// `ttl` (backdated by up to five minutes for clock skew, as kube-controller-manager's
    /// signer, but never by more than a fifth of the lifetime), with `usages` (API names) as
    /// its key usages. Subject and SANs come from the request.
    pub fn sign_request(
        &self,
        request_pem: &str,
        usages: &std::collections::BTreeSet<String>,
        ttl: std::time::Duration,
    ) -> Result<String, rcgen::Error> {
        let mut csr = rcgen::CertificateSigningRequestParams::from_pem(request_pem)?;
        let now = time::OffsetDateTime::now_utc();
        let backdate = std::time::Duration::from_secs(300).min(ttl / 5);
        let params = &mut csr.params;
        params.not_before = now - backdate;
        params.not_after = now + ttl;
        params.serial_number = Some(rcgen::SerialNumber::from_slice(uuid::Uuid::new_v4().as_bytes()));
        params.is_ca = IsCa::ExplicitNoCa;
        params.use_authority_key_identifier_extension = true;
        params.key_usages = usages.iter().filter_map(|u| key_usage(u)).collect();
        params.extended_key_usages = usages.iter().filter_map(|u| extended_key_usage(u)).collect();
        Ok(csr.signed_by(&self.issuer)?.pem())
    }

    /// TLS for the listener: h2 and http/1.1, client certificates optional but verified.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        roots.add(self.ca_der.clone()).expect("CA certificate is valid");
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .allow_unauthenticated()
            .build()
            .expect("client verifier");
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.server_key_der.clone()));
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![self.server_der.clone(), self.ca_der.clone()], key)
            .expect("server certificate");
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

fn key_usage(usage: &str) -> Option<KeyUsagePurpose> {
    Some(match usage {
        "signing" | "digital signature" => KeyUsagePurpose::DigitalSignature,
        "content commitment" => KeyUsagePurpose::ContentCommitment,
        "key encipherment" => KeyUsagePurpose::KeyEncipherment,
        "key agreement" => KeyUsagePurpose::KeyAgreement,
        "data encipherment" => KeyUsagePurpose::DataEncipherment,
        "cert sign" => KeyUsagePurpose::KeyCertSign,
        "crl sign" => KeyUsagePurpose::CrlSign,
        "encipher only" => KeyUsagePurpose::EncipherOnly,
        "decipher only" => KeyUsagePurpose::DecipherOnly,
        _ => return None,
    })
}

fn extended_key_usage(usage: &str) -> Option<ExtendedKeyUsagePurpose> {
    Some(match usage {
        "any" => ExtendedKeyUsagePurpose::Any,
        "server auth" => ExtendedKeyUsagePurpose::ServerAuth,
        "client auth" => ExtendedKeyUsagePurpose::ClientAuth,
        "code signing" => ExtendedKeyUsagePurpose::CodeSigning,
        "email protection" => ExtendedKeyUsagePurpose::EmailProtection,
        "timestamping" => ExtendedKeyUsagePurpose::TimeStamping,
        "ocsp signing" => ExtendedKeyUsagePurpose::OcspSigning,
        _ => return None,
    })
}

/// The user a verified client certificate names: CN is the user, each O a group.
pub fn identity_from_cert(der: &[u8]) -> Option<(String, Vec<String>)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let cn = subject.iter_common_name().next()?.as_str().ok()?.to_string();
    let groups = subject.iter_organization().filter_map(|o| o.as_str().ok().map(String::from)).collect();
    Some((cn, groups))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_cert_round_trip() {
        let pki = Pki::generate();
        let (cert_pem, _key) = pki.client_cert("system:node:n1", &["system:nodes".into(), "extra".into()]);
        let der = pem_to_der(&cert_pem);
        let (cn, groups) = identity_from_cert(&der).unwrap();
        assert_eq!(cn, "system:node:n1");
        assert_eq!(groups, vec!["system:nodes".to_string(), "extra".to_string()]);
    }

    fn pem_to_der(pem: &str) -> Vec<u8> {
        use base64::Engine;
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        base64::engine::general_purpose::STANDARD.decode(body).unwrap()
    }
}
