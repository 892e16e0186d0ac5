//! Making a cluster CA and node certificates (for `lamina certs ...` and
//! tests). In a cluster cert-manager usually does this; the files written
//! here have the same names and PEM layout.

use crate::error::TransferError;
use crate::tls::{CA_FILE, CERT_FILE, KEY_FILE};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use std::io::Write;
use std::path::Path;

/// The CA's private key file, next to its `ca.crt`.
pub const CA_KEY_FILE: &str = "ca.key";

fn bad(path: &Path, detail: impl std::fmt::Display) -> TransferError {
    TransferError::Identity {
        path: path.to_path_buf(),
        detail: detail.to_string(),
    }
}

fn write(path: &Path, text: &str, private: bool) -> Result<(), TransferError> {
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create(true).truncate(true);
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    o.open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|_| f.sync_all()))
        .map_err(|e| bad(path, e))
}

fn read(path: &Path) -> Result<String, TransferError> {
    std::fs::read_to_string(path).map_err(|e| bad(path, e))
}

/// Make a new cluster CA: writes `ca.crt` and `ca.key` into `dir`.
pub fn create_ca(dir: &Path) -> Result<(), TransferError> {
    std::fs::create_dir_all(dir).map_err(|e| bad(dir, e))?;
    let key = KeyPair::generate().map_err(|e| bad(dir, e))?;
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(|e| bad(dir, e))?;
    // A name of its own (from its key), so that a peer of another cluster
    // is told "unknown issuer", not "bad signature" from a namesake CA.
    let tag: String = key.public_key_raw()[1..5]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    p.distinguished_name
        .push(DnType::CommonName, format!("Lamina cluster CA {tag}"));
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = p.self_signed(&key).map_err(|e| bad(dir, e))?;
    write(&dir.join(CA_FILE), &cert.pem(), false)?;
    write(&dir.join(CA_KEY_FILE), &key.serialize_pem(), true)
}

/// Issue a certificate for `node` (its DNS subjectAltName, good for both
/// server and client authentication) signed by the CA in `ca_dir`; writes
/// `ca.crt`, `tls.crt` and `tls.key` into `out`.
pub fn issue(ca_dir: &Path, node: &str, out: &Path) -> Result<(), TransferError> {
    if !matches!(
        rustls::pki_types::ServerName::try_from(node),
        Ok(rustls::pki_types::ServerName::DnsName(_))
    ) {
        return Err(TransferError::Invalid(format!(
            "node name {node:?} is not a DNS name"
        )));
    }
    let (ca_crt, ca_key) = (ca_dir.join(CA_FILE), ca_dir.join(CA_KEY_FILE));
    let ca_pem = read(&ca_crt)?;
    let ca_key = KeyPair::from_pem(&read(&ca_key)?).map_err(|e| bad(&ca_key, e))?;
    // rcgen signs with an issuer given as a certificate: rebuild the CA's
    // from its file (same name and key, so the same issuer).
    let ca = CertificateParams::from_ca_cert_pem(&ca_pem)
        .and_then(|p| p.self_signed(&ca_key))
        .map_err(|e| bad(&ca_crt, e))?;
    let key = KeyPair::generate().map_err(|e| bad(out, e))?;
    let mut p = CertificateParams::new(vec![node.to_string()]).map_err(|e| bad(out, e))?;
    p.distinguished_name.push(DnType::CommonName, node);
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    p.use_authority_key_identifier_extension = true;
    let cert = p.signed_by(&key, &ca, &ca_key).map_err(|e| bad(out, e))?;
    std::fs::create_dir_all(out).map_err(|e| bad(out, e))?;
    write(&out.join(CA_FILE), &ca_pem, false)?;
    write(&out.join(CERT_FILE), &cert.pem(), false)?;
    write(&out.join(KEY_FILE), &key.serialize_pem(), true)
}
