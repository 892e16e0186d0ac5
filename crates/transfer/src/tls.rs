//! A node's TLS identity and the mutual-TLS configurations built from it:
//! TLS 1.3 only, crypto by `ring`, both sides verified against the cluster
//! CA.

use crate::error::TransferError;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, DistinguishedName, OtherError,
    RootCertStore, ServerConfig, SignatureScheme,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The CA file of an identity directory.
pub const CA_FILE: &str = "ca.crt";
/// The node's certificate (chain) file.
pub const CERT_FILE: &str = "tls.crt";
/// The node's private key file.
pub const KEY_FILE: &str = "tls.key";

/// TLS identity of a node, loaded from a directory holding PEM files
/// `ca.crt`, `tls.crt`, `tls.key` (a `kubernetes.io/tls` Secret plus
/// `ca.crt`, as cert-manager writes it). The node's name is its
/// certificate's first DNS subjectAltName.
pub struct Identity {
    node: String,
    dir: PathBuf,
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    roots: Arc<RootCertStore>,
}

fn bad(path: &Path, detail: impl std::fmt::Display) -> TransferError {
    TransferError::Identity {
        path: path.to_path_buf(),
        detail: detail.to_string(),
    }
}

/// ring's provider with its TLS 1.3 suites ordered AES-128-GCM first (ring
/// puts AES-256-GCM first). Both sides list the same order, so a transfer
/// between two nodes runs AES-128-GCM: 10 AES rounds a block rather than
/// 14, on a stream where (with AES-256) encrypting was 17-18 % of the
/// source's CPU samples and decrypting 11 % of the target's. The other
/// TLS 1.3 suites stay listed, for a peer that wants them; TLS 1.2's are
/// left out (both configurations are TLS 1.3 only).
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::cipher_suite as suite;
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites = vec![
        suite::TLS13_AES_128_GCM_SHA256,
        suite::TLS13_AES_256_GCM_SHA384,
        suite::TLS13_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(p)
}

/// The first DNS subjectAltName of a certificate: the node it names (none
/// if that name is empty).
pub fn cert_node(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, x) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let san = x.subject_alternative_name().ok()??;
    let name = san.value.general_names.iter().find_map(|n| match n {
        x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
        _ => None,
    })?;
    (!name.is_empty()).then_some(name)
}

/// A client certificate of the cluster's CA that names no node.
#[derive(thiserror::Error)]
#[error("the certificate names no node (it has no DNS subjectAltName)")]
struct NoNodeName;

/// As its message: rustls shows the error inside its own with `{:?}`, and
/// that is what the source's log line says.
impl std::fmt::Debug for NoNodeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// The CA's verifier of client certificates, and one check more: the
/// certificate must name a node. A source keys its readers and its session
/// limits by that name, so a peer without one is refused in the handshake
/// (a certificate_unknown alert) rather than served under an empty name.
#[derive(Debug)]
struct NamedClients(Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for NamedClients {
    fn offer_client_auth(&self) -> bool {
        self.0.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.0.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self.0.verify_client_cert(end_entity, intermediates, now)?;
        if cert_node(end_entity).is_none() {
            let e = CertificateError::Other(OtherError(Arc::new(NoNodeName)));
            return Err(rustls::Error::InvalidCertificate(e));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TransferError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(path, e))?;
    if certs.is_empty() {
        return Err(bad(path, "no certificate in the file"));
    }
    Ok(certs)
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("node", &self.node)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// Load `ca.crt`, `tls.crt` and `tls.key` from `dir`.
    pub fn load(dir: &Path) -> Result<Identity, TransferError> {
        let ca = dir.join(CA_FILE);
        let mut roots = RootCertStore::empty();
        for c in read_certs(&ca)? {
            roots.add(c).map_err(|e| bad(&ca, e))?;
        }
        let crt = dir.join(CERT_FILE);
        let certs = read_certs(&crt)?;
        let node = cert_node(&certs[0])
            .ok_or_else(|| bad(&crt, "the certificate has no DNS subjectAltName"))?;
        let keyf = dir.join(KEY_FILE);
        let key = PrivateKeyDer::from_pem_file(&keyf).map_err(|e| bad(&keyf, e))?;
        let id = Identity {
            node,
            dir: dir.to_path_buf(),
            certs,
            key,
            roots: Arc::new(roots),
        };
        // Fail here, not at the first connection, on a key that does not
        // match its certificate or a CA that did not sign it.
        id.server_config()?;
        id.client_config()?;
        Ok(id)
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The TLS configuration of a source: TLS 1.3, and a client
    /// certificate signed by the CA and naming a node is required.
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, TransferError> {
        let p = provider();
        let ca = WebPkiClientVerifier::builder_with_provider(self.roots.clone(), p.clone())
            .build()
            .map_err(|e| bad(&self.dir.join(CA_FILE), e))?;
        let verifier = Arc::new(NamedClients(ca));
        let cfg = ServerConfig::builder_with_provider(p)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| bad(&self.dir, e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.certs.clone(), self.key.clone_key())
            .map_err(|e| bad(&self.dir.join(CERT_FILE), e))?;
        Ok(Arc::new(cfg))
    }

    /// The TLS configuration of a target: TLS 1.3, the server verified
    /// against the CA, this node's certificate presented.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, TransferError> {
        let cfg = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| bad(&self.dir, e))?
            .with_root_certificates(self.roots.clone())
            .with_client_auth_cert(self.certs.clone(), self.key.clone_key())
            .map_err(|e| bad(&self.dir.join(CERT_FILE), e))?;
        Ok(Arc::new(cfg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs;
    use rustls::pki_types::ServerName;

    /// Move one flight from `from` to `to`, every byte of it (read_tls
    /// takes at most one buffer's worth per call).
    fn flight(from: &mut rustls::Connection, to: &mut rustls::Connection) {
        let mut wire = Vec::new();
        while from.wants_write() {
            from.write_tls(&mut wire).unwrap();
        }
        let mut rd = &wire[..];
        while !rd.is_empty() {
            to.read_tls(&mut rd).unwrap();
            to.process_new_packets().unwrap();
        }
    }

    /// Two nodes of one CA handshake in memory and agree on AES-128-GCM.
    #[test]
    fn two_nodes_agree_on_aes_128_gcm() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca");
        certs::create_ca(&ca).unwrap();
        for n in ["a", "b"] {
            certs::issue(&ca, n, &dir.path().join(n)).unwrap();
        }
        let a = Identity::load(&dir.path().join("a")).unwrap();
        let b = Identity::load(&dir.path().join("b")).unwrap();
        let mut server = rustls::ServerConnection::new(a.server_config().unwrap())
            .unwrap()
            .into();
        let name = ServerName::try_from("a").unwrap();
        let mut client = rustls::ClientConnection::new(b.client_config().unwrap(), name)
            .unwrap()
            .into();
        for _ in 0..10 {
            flight(&mut client, &mut server);
            flight(&mut server, &mut client);
            if !client.is_handshaking() && !server.is_handshaking() {
                break;
            }
        }
        assert!(!server.is_handshaking(), "the handshake did not finish");
        let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256.suite();
        for got in [
            client.negotiated_cipher_suite(),
            server.negotiated_cipher_suite(),
        ] {
            assert_eq!(got.map(|s| s.suite()), Some(suite));
        }
    }
}
