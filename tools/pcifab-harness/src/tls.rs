// SPDX-License-Identifier: GPL-2.0-only
//! TLS material of the test world (Documentation/testing.rst, "TLS material"): a CA made
//! for the run, a server certificate for the fabric manager naming every address h0 has on
//! the management network and the DNS name `pcifab-manager`, and client certificates whose
//! common name is a principal. Everything is PEM: certificates as `CERTIFICATE`, keys as
//! PKCS#8 `PRIVATE KEY` (ECDSA P-256).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// Where the guests find the material.
pub const GUEST_DIR: &str = "/etc/pcifab/tls";
/// The DNS name in the manager's certificate.
pub const MANAGER_DNS_NAME: &str = "pcifab-manager";
/// The common name of the run's CA.
pub const CA_NAME: &str = "pcifab test world CA";
/// Longest principal name accepted.
pub const PRINCIPAL_MAX: usize = 64;

/// A certificate and its private key, both PEM.
#[derive(Clone, Debug)]
pub struct Pem {
    pub cert: String,
    pub key: String,
}

/// The run's CA and what it issued.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate, PEM.
    pub ca: String,
    /// The manager's server certificate and key.
    pub manager: Pem,
    /// Client certificates by principal.
    pub clients: BTreeMap<String, Pem>,
}

fn tls_err(what: &str) -> impl Fn(rcgen::Error) -> String + '_ {
    move |e| format!("TLS material: {what}: {e}")
}

/// Checks that `name` can be a principal: the common name of a client certificate and the
/// stem of its files (`NAME.crt`, `NAME.key`). 1 to [`PRINCIPAL_MAX`] characters of
/// `[A-Za-z0-9._-]`, not starting with `.` or `-`, and not `ca` or `manager`, whose files
/// are the CA's and the server's.
pub fn check_principal(name: &str) -> Result<(), String> {
    let ok_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if name.is_empty()
        || name.len() > PRINCIPAL_MAX
        || !ok_chars
        || name.starts_with(['.', '-'])
        || matches!(name, "ca" | "manager")
    {
        return Err(format!(
            "principal {name:?}: a principal is 1 to {PRINCIPAL_MAX} characters of \
             [A-Za-z0-9._-], not starting with '.' or '-', and not \"ca\" or \"manager\""
        ));
    }
    Ok(())
}

impl Authority {
    /// A new CA, and the manager's certificate for the addresses `manager_ips` (h0's
    /// management addresses) and [`MANAGER_DNS_NAME`].
    pub fn new(manager_ips: &[Ipv4Addr]) -> Result<Self, String> {
        let ca_key = KeyPair::generate().map_err(tls_err("CA key"))?;
        let mut p = CertificateParams::default();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, CA_NAME);
        p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = p.self_signed(&ca_key).map_err(tls_err("CA certificate"))?;
        let issuer = Issuer::new(p, ca_key);

        let mut sans = vec![SanType::DnsName(
            MANAGER_DNS_NAME
                .try_into()
                .map_err(tls_err("manager DNS name"))?,
        )];
        sans.extend(
            manager_ips
                .iter()
                .map(|ip| SanType::IpAddress(IpAddr::V4(*ip))),
        );
        let manager = issue(
            &issuer,
            MANAGER_DNS_NAME,
            sans,
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        Ok(Authority {
            issuer,
            ca: ca.pem(),
            manager,
            clients: BTreeMap::new(),
        })
    }

    /// Issues a client certificate for `principal` (its common name) unless there is one.
    pub fn add_client(&mut self, principal: &str) -> Result<&Pem, String> {
        check_principal(principal)?;
        if !self.clients.contains_key(principal) {
            let pem = issue(
                &self.issuer,
                principal,
                Vec::new(),
                ExtendedKeyUsagePurpose::ClientAuth,
            )?;
            self.clients.insert(principal.to_string(), pem);
        }
        self.clients
            .get(principal)
            .ok_or_else(|| format!("TLS material: no certificate for {principal} (harness bug)"))
    }
}

/// An end-entity certificate with common name `cn`, names `sans` and the one extended key
/// usage `eku`, signed by `issuer`, with a fresh key.
fn issue(
    issuer: &Issuer<'static, KeyPair>,
    cn: &str,
    sans: Vec<SanType>,
    eku: ExtendedKeyUsagePurpose,
) -> Result<Pem, String> {
    let key = KeyPair::generate().map_err(tls_err("key"))?;
    let mut p = CertificateParams::default();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.subject_alt_names = sans;
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![eku];
    p.use_authority_key_identifier_extension = true;
    let cert = p
        .signed_by(&key, issuer)
        .map_err(tls_err(&format!("certificate for {cn}")))?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
    use webpki::{EndEntityCert, KeyUsage};

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).expect("a PEM certificate")
    }

    /// Verifies `cert` up to the CA `ca` for `usage`, as a TLS peer would.
    fn verify(ca: &str, cert: &str, usage: KeyUsage) -> Result<(), webpki::Error> {
        let ca = der(ca);
        let anchor = webpki::anchor_from_trusted_cert(&ca)?;
        let cert = der(cert);
        let ee = EndEntityCert::try_from(&cert)?;
        ee.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &[anchor],
            &[],
            UnixTime::now(),
            usage,
            None,
            None,
        )
        .map(|_| ())
    }

    fn names_ok(cert: &str, name: &str) -> bool {
        let d = der(cert);
        let ee = EndEntityCert::try_from(&d).expect("an end-entity certificate");
        let name = ServerName::try_from(name).expect("a server name");
        ee.verify_is_valid_for_subject_name(&name).is_ok()
    }

    const IPS: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 77, 1, 1), Ipv4Addr::new(10, 77, 2, 1)];

    #[test]
    fn manager_certificate_verifies_for_h0_addresses() {
        let a = Authority::new(&IPS).unwrap();
        verify(&a.ca, &a.manager.cert, KeyUsage::server_auth()).unwrap();
        for name in ["10.77.1.1", "10.77.2.1", MANAGER_DNS_NAME] {
            assert!(
                names_ok(&a.manager.cert, name),
                "{name} not in the certificate"
            );
        }
        // Not the hosts' own ends of the links, nor anything else.
        for name in ["10.77.1.2", "10.77.3.1", "127.0.0.1", "localhost"] {
            assert!(
                !names_ok(&a.manager.cert, name),
                "{name} in the certificate"
            );
        }
        // A server certificate is no client certificate.
        assert!(verify(&a.ca, &a.manager.cert, KeyUsage::client_auth()).is_err());
        // The key is PKCS#8.
        let k = PrivateKeyDer::from_pem_slice(a.manager.key.as_bytes()).unwrap();
        assert!(matches!(k, PrivateKeyDer::Pkcs8(_)));
    }

    #[test]
    fn client_certificates_verify_for_client_auth_only() {
        let mut a = Authority::new(&IPS).unwrap();
        let alice = a.add_client("alice").unwrap().clone();
        let again = a.add_client("alice").unwrap().clone();
        assert_eq!(alice.cert, again.cert, "a second call must not reissue");
        a.add_client("h1-operator").unwrap();
        assert_eq!(a.clients.len(), 2);
        verify(&a.ca, &alice.cert, KeyUsage::client_auth()).unwrap();
        assert!(verify(&a.ca, &alice.cert, KeyUsage::server_auth()).is_err());
        assert!(alice.cert.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(alice.key.starts_with("-----BEGIN PRIVATE KEY-----"));
        // The subject is exactly one RDN: CN = the principal (UTF8String).
        assert_eq!(subject(&alice.cert), cn_rdn("alice"));
        // The CA issued it.
        assert_eq!(issuer(&alice.cert), cn_rdn(CA_NAME));
        assert_eq!(subject(&a.manager.cert), cn_rdn(MANAGER_DNS_NAME));
    }

    /// DER of a Name's contents holding only CN = `cn`.
    fn cn_rdn(cn: &str) -> Vec<u8> {
        let n = cn.len();
        assert!(n < 100);
        let n = n as u8;
        // SET { SEQUENCE { OID 2.5.4.3, UTF8String cn } }
        let mut v = vec![0x31, n + 9, 0x30, n + 7, 0x06, 0x03, 0x55, 0x04, 0x03];
        v.extend_from_slice(&[0x0c, n]);
        v.extend_from_slice(cn.as_bytes());
        v
    }

    fn subject(cert: &str) -> Vec<u8> {
        let d = der(cert);
        EndEntityCert::try_from(&d).unwrap().subject().to_vec()
    }

    fn issuer(cert: &str) -> Vec<u8> {
        let d = der(cert);
        EndEntityCert::try_from(&d).unwrap().issuer().to_vec()
    }

    #[test]
    fn another_ca_does_not_verify() {
        let a = Authority::new(&IPS).unwrap();
        let b = Authority::new(&IPS).unwrap();
        assert!(verify(&b.ca, &a.manager.cert, KeyUsage::server_auth()).is_err());
    }

    #[test]
    fn principal_names_are_checked() {
        for good in ["alice", "h1", "ops.team_2-a"] {
            check_principal(good).unwrap();
        }
        let long = "a".repeat(PRINCIPAL_MAX + 1);
        for bad in [
            "", "ca", "manager", ".x", "-x", "a/b", "../x", "a b", "é", &long,
        ] {
            assert!(check_principal(bad).is_err(), "{bad:?} accepted");
        }
        let mut a = Authority::new(&IPS).unwrap();
        assert!(a.add_client("../etc").is_err());
        assert!(a.clients.is_empty());
    }
}
