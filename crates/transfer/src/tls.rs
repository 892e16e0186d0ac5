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
/// certificate's first DNS subjectAltName. [`Identity::reload`] takes in
/// the files again once they changed (a renewed certificate): connections
/// made from then on use the new ones, and those open keep theirs.
pub struct Identity {
    node: String,
    dir: PathBuf,
    material: std::sync::RwLock<Arc<Material>>,
}

/// What an identity's files hold, and the configurations built from them.
struct Material {
    /// The three files' bytes, in `FILES` order, as read.
    files: [Vec<u8>; 3],
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

/// The files of an identity directory, in the order `Material::files`
/// keeps them.
const FILES: [&str; 3] = [CA_FILE, CERT_FILE, KEY_FILE];

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

fn parse_certs(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TransferError> {
    let certs = CertificateDer::pem_slice_iter(pem)
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
        let files = read_files(dir)?;
        let (node, material) = Material::build(dir, files)?;
        Ok(Identity {
            node,
            dir: dir.to_path_buf(),
            material: std::sync::RwLock::new(Arc::new(material)),
        })
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The directory its files are read from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn material(&self) -> Arc<Material> {
        self.material
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Read the files again, and take them in if they changed: whether
    /// they did. Files that do not load (a renewal half written, a key
    /// that does not match its certificate) or that name another node are
    /// an error, and the identity stays as it was.
    pub fn reload(&self) -> Result<bool, TransferError> {
        let files = read_files(&self.dir)?;
        if files == self.material().files {
            return Ok(false);
        }
        let (node, material) = Material::build(&self.dir, files)?;
        if node != self.node {
            return Err(bad(
                &self.dir.join(CERT_FILE),
                format!(
                    "the certificate now names node {node:?}, not {:?}: not taken",
                    self.node
                ),
            ));
        }
        *self.material.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(material);
        Ok(true)
    }

    /// The TLS configuration of a source: TLS 1.3, and a client
    /// certificate signed by the CA and naming a node is required.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.material().server.clone()
    }

    /// The TLS configuration of a target: TLS 1.3, the server verified
    /// against the CA, this node's certificate presented.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.material().client.clone()
    }
}

/// The bytes of `dir`'s identity files, in `FILES` order.
fn read_files(dir: &Path) -> Result<[Vec<u8>; 3], TransferError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|e| bad(&path, e))
    };
    Ok([read(FILES[0])?, read(FILES[1])?, read(FILES[2])?])
}

impl Material {
    /// Parse `files` (read from `dir`) and build both configurations, so
    /// that a key that does not match its certificate or a CA that did
    /// not sign it fails here, not at the first connection; the node the
    /// certificate names, and the material.
    fn build(dir: &Path, files: [Vec<u8>; 3]) -> Result<(String, Material), TransferError> {
        let ca = dir.join(CA_FILE);
        let mut roots = RootCertStore::empty();
        for c in parse_certs(&ca, &files[0])? {
            roots.add(c).map_err(|e| bad(&ca, e))?;
        }
        let roots = Arc::new(roots);
        let crt = dir.join(CERT_FILE);
        let certs = parse_certs(&crt, &files[1])?;
        let node = cert_node(&certs[0])
            .ok_or_else(|| bad(&crt, "the certificate has no DNS subjectAltName"))?;
        let keyf = dir.join(KEY_FILE);
        let key = PrivateKeyDer::from_pem_slice(&files[2]).map_err(|e| bad(&keyf, e))?;
        let p = provider();
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), p.clone())
            .build()
            .map_err(|e| bad(&ca, e))?;
        let server = ServerConfig::builder_with_provider(p.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| bad(dir, e))?
            .with_client_cert_verifier(Arc::new(NamedClients(verifier)))
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(|e| bad(&crt, e))?;
        let client = ClientConfig::builder_with_provider(p)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| bad(dir, e))?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| bad(&crt, e))?;
        Ok((
            node,
            Material {
                files,
                server: Arc::new(server),
                client: Arc::new(client),
            },
        ))
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

    /// A handshake in memory of `client` with `server`: both ends, done.
    fn handshake(server: &Identity, client: &Identity) -> (rustls::Connection, rustls::Connection) {
        let mut s: rustls::Connection = rustls::ServerConnection::new(server.server_config())
            .unwrap()
            .into();
        let name = ServerName::try_from(server.node().to_string()).unwrap();
        let mut c: rustls::Connection = rustls::ClientConnection::new(client.client_config(), name)
            .unwrap()
            .into();
        for _ in 0..10 {
            flight(&mut c, &mut s);
            flight(&mut s, &mut c);
            if !c.is_handshaking() && !s.is_handshaking() {
                break;
            }
        }
        assert!(
            !c.is_handshaking() && !s.is_handshaking(),
            "the handshake did not finish"
        );
        (s, c)
    }

    /// The certificate `server` presents to `client`.
    fn presented(server: &Identity, client: &Identity) -> CertificateDer<'static> {
        let (_, c) = handshake(server, client);
        c.peer_certificates().unwrap()[0].clone().into_owned()
    }

    /// A renewed certificate is taken in by a reload, and presented from
    /// then on, to peers that verify it; files that do not load, or that
    /// name another node, leave the identity as it was.
    #[test]
    fn a_reload_takes_a_renewed_certificate_and_refuses_a_bad_one() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca");
        certs::create_ca(&ca).unwrap();
        for n in ["a", "b"] {
            certs::issue(&ca, n, &dir.path().join(n)).unwrap();
        }
        let a_dir = dir.path().join("a");
        let a = Identity::load(&a_dir).unwrap();
        let b = Identity::load(&dir.path().join("b")).unwrap();
        let first = presented(&a, &b);
        assert!(!a.reload().unwrap(), "nothing changed");

        // Renewed: a new key and certificate of the same name.
        let renewed = dir.path().join("a2");
        certs::issue(&ca, "a", &renewed).unwrap();
        for f in [CERT_FILE, KEY_FILE] {
            std::fs::copy(renewed.join(f), a_dir.join(f)).unwrap();
        }
        assert!(a.reload().unwrap());
        let second = presented(&a, &b);
        assert_ne!(first, second, "the old certificate is still presented");
        assert_eq!(
            second.as_ref(),
            CertificateDer::pem_file_iter(renewed.join(CERT_FILE))
                .unwrap()
                .next()
                .unwrap()
                .unwrap()
                .as_ref()
        );

        // Half written: the new certificate with the old key.
        let third = dir.path().join("a3");
        certs::issue(&ca, "a", &third).unwrap();
        std::fs::copy(third.join(CERT_FILE), a_dir.join(CERT_FILE)).unwrap();
        assert!(a.reload().is_err());
        assert_eq!(
            presented(&a, &b),
            second,
            "a bad reload changed the identity"
        );
        // Another node's name.
        for f in [CERT_FILE, KEY_FILE] {
            std::fs::copy(dir.path().join("b").join(f), a_dir.join(f)).unwrap();
        }
        let e = a.reload().unwrap_err().to_string();
        assert!(e.contains("names node \"b\""), "{e}");
        assert_eq!(presented(&a, &b), second);
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
        let (server, client) = handshake(&a, &b);
        let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256.suite();
        for got in [
            client.negotiated_cipher_suite(),
            server.negotiated_cipher_suite(),
        ] {
            assert_eq!(got.map(|s| s.suite()), Some(suite));
        }
    }
}
