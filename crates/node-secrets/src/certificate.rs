//! A node's transfer certificate issued by cert-manager, for a cluster where
//! no node may hold the CA's key: a `Certificate` (cert-manager.io/v1)
//! named `lamina-transfer-NODE` in Lamina's namespace asks the given issuer
//! for a certificate whose first DNS name is the node's, good for both ends
//! of a TLS connection; cert-manager writes it into the Secret of the same
//! name, with keys `tls.crt`, `tls.key` and `ca.crt`: the layout a node's
//! `--transfer-tls` directory has (docs/transfer.md). This module writes
//! the Certificate (server-side apply: asking again with the same issuer
//! changes nothing, with another issuer re-issues) and waits for the Secret
//! of its current spec; it must not make or check certificates itself
//! (cert-manager makes them, the caller checks what it got).

use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::Api;
use std::time::Duration;

/// The prefix of a node's Certificate and of its Secret:
/// `lamina-transfer-NODE` (not `lamina-node-...`, the node Secrets' prefix,
/// which a node named `tls-...` would share).
pub const CERTIFICATE_PREFIX: &str = "lamina-transfer-";
/// The field manager of the Certificates.
pub const CERTIFICATE_FIELD_MANAGER: &str = "lamina-node-certificate";
/// The Secret's keys, as cert-manager writes them.
pub const KEY_TLS_CERT: &str = "tls.crt";
pub const KEY_TLS_KEY: &str = "tls.key";

/// The issuer a node's certificate is asked of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuerRef {
    pub name: String,
    /// `Issuer` (in Lamina's namespace) or `ClusterIssuer`.
    pub kind: String,
    /// The issuer's API group: `cert-manager.io` for cert-manager's own.
    pub group: String,
}

/// The certificate cert-manager issued for a node, PEM, as its Secret holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeTls {
    /// `ca.crt`: the CA every node checks its peers against.
    pub ca: Vec<u8>,
    /// `tls.crt`: the node's certificate, then any intermediates.
    pub cert: Vec<u8>,
    /// `tls.key`: its private key.
    pub key: Vec<u8>,
}

/// Why a node's certificate could not be had.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error(transparent)]
    InvalidNode(#[from] crate::RegisterError),
    #[error("issuer kind {0:?}: it must be Issuer or ClusterIssuer")]
    InvalidKind(String),
    #[error("the API server serves no cert-manager.io/v1 Certificate: install cert-manager, or give the nodes a CA of Lamina's own (the chart's multiNode.certManager.enabled=false)")]
    NoCertManager,
    #[error("{what} {kind} {namespace}/{name}")]
    Api {
        what: &'static str,
        kind: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("Certificate {namespace}/{name} was not issued within {waited:?}: {why} (kubectl -n {namespace} describe certificate {name}; kubectl -n {namespace} get certificaterequests)")]
    NotIssued {
        namespace: String,
        name: String,
        waited: Duration,
        why: String,
    },
}

/// The name of `node`'s Certificate and of its Secret.
pub fn certificate_name(node: &str) -> String {
    format!("{CERTIFICATE_PREFIX}{node}")
}

fn certificates() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate"),
        "certificates",
    )
}

/// `node`'s Certificate asked of `issuer`, valid for `duration` (a Go
/// duration, as cert-manager reads it: `8760h`; cert-manager's default of
/// 90 days when none).
pub fn certificate(node: &str, issuer: &IssuerRef, duration: Option<&str>) -> serde_json::Value {
    let name = certificate_name(node);
    let mut spec = serde_json::json!({
        "secretName": name,
        "commonName": node,
        "dnsNames": [node],
        "usages": ["digital signature", "key encipherment", "server auth", "client auth"],
        // A new key at each issue; PKCS#8 (which every reader of tls.key takes).
        "privateKey": {
            "algorithm": "ECDSA",
            "size": 256,
            "encoding": "PKCS8",
            "rotationPolicy": "Always",
        },
        "issuerRef": {"name": issuer.name, "kind": issuer.kind, "group": issuer.group},
    });
    if let Some(d) = duration {
        spec["duration"] = d.into();
    }
    serde_json::json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": {"name": name, "labels": {crate::NODE_LABEL: node}},
        "spec": spec,
    })
}

/// What a Secret holds of a node's certificate: its three keys, each not
/// empty (else the first missing one).
pub fn tls_of(secret: &Secret) -> Result<NodeTls, &'static str> {
    let get = |key| crate::secret_key(secret, key);
    Ok(NodeTls {
        ca: get(crate::KEY_CA_CERT)?,
        cert: get(KEY_TLS_CERT)?,
        key: get(KEY_TLS_KEY)?,
    })
}

/// Whether a Certificate, as read, is issued for its current spec: its
/// `Ready` condition true for its current generation. Else why not, in
/// cert-manager's words where it gave some.
pub fn issued(cert: &DynamicObject) -> Result<(), String> {
    let generation = cert.metadata.generation.unwrap_or(0);
    let ready = cert.data["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"));
    let Some(ready) = ready else {
        return Err("cert-manager has not looked at it yet (no Ready condition)".into());
    };
    let observed = ready["observedGeneration"].as_i64().unwrap_or(0);
    let says = || {
        format!(
            "{}: {}",
            ready["reason"].as_str().unwrap_or("no reason"),
            ready["message"].as_str().unwrap_or("")
        )
    };
    if ready["status"] != "True" {
        return Err(format!("not ready ({})", says()));
    }
    if observed < generation {
        return Err(format!(
            "ready for generation {observed}, not yet for its current one, {generation}"
        ));
    }
    Ok(())
}

/// Ask `issuer` for `node`'s certificate in namespace `namespace` and wait,
/// up to `wait`, until cert-manager has issued it for this spec; then its
/// Secret's keys. Asking again for a node whose certificate is issued
/// returns the one there at once.
pub async fn ensure_certificate(
    client: kube::Client,
    namespace: &str,
    node: &str,
    issuer: &IssuerRef,
    duration: Option<&str>,
    wait: Duration,
) -> Result<NodeTls, CertificateError> {
    crate::check_node_name(node)?;
    if issuer.kind != "Issuer" && issuer.kind != "ClusterIssuer" {
        return Err(CertificateError::InvalidKind(issuer.kind.clone()));
    }
    let name = certificate_name(node);
    let api_error = |what: &'static str, kind: &'static str| {
        let (namespace, name) = (namespace.to_string(), name.clone());
        move |source: kube::Error| {
            if let kube::Error::Api(e) = &source {
                // 404 on the resource itself (not on one object of it):
                // cert-manager's CRD is not installed.
                if what == "applying" && e.code == 404 {
                    return CertificateError::NoCertManager;
                }
            }
            CertificateError::Api {
                what,
                kind,
                namespace,
                name,
                source: Box::new(source),
            }
        }
    };
    let certs: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &certificates());
    let secrets: Api<Secret> = Api::namespaced(client, namespace);
    let body = certificate(node, issuer, duration);
    certs
        .patch(
            &name,
            &PatchParams::apply(CERTIFICATE_FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(api_error("applying", "Certificate"))?;
    let start = tokio::time::Instant::now();
    loop {
        let c = certs
            .get(&name)
            .await
            .map_err(api_error("reading", "Certificate"))?;
        let why = match issued(&c) {
            Ok(()) => match secrets
                .get_opt(&name)
                .await
                .map_err(api_error("reading", "Secret"))?
            {
                Some(s) => match tls_of(&s) {
                    Ok(tls) => return Ok(tls),
                    Err(key) => format!("its Secret {name} holds no {key}"),
                },
                None => format!("its Secret {name} is not there"),
            },
            Err(w) => w,
        };
        if start.elapsed() >= wait {
            return Err(CertificateError::NotIssued {
                namespace: namespace.to_string(),
                name,
                waited: wait,
                why,
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issuer() -> IssuerRef {
        IssuerRef {
            name: "lamina-transfer-ca".into(),
            kind: "Issuer".into(),
            group: "cert-manager.io".into(),
        }
    }

    #[test]
    fn a_nodes_certificate_names_it_first_for_both_ends_of_tls() {
        let c = certificate("n1", &issuer(), Some("8760h"));
        assert_eq!(c["metadata"]["name"], "lamina-transfer-n1");
        assert_eq!(c["metadata"]["labels"]["lamina.io/node"], "n1");
        assert_eq!(c["spec"]["secretName"], "lamina-transfer-n1");
        assert_eq!(c["spec"]["dnsNames"], serde_json::json!(["n1"]));
        let usages = c["spec"]["usages"].as_array().unwrap();
        for u in ["server auth", "client auth", "digital signature"] {
            assert!(usages.iter().any(|x| x == u), "{u}");
        }
        assert_eq!(c["spec"]["privateKey"]["encoding"], "PKCS8");
        assert_eq!(c["spec"]["issuerRef"]["kind"], "Issuer");
        assert_eq!(c["spec"]["duration"], "8760h");
        assert!(certificate("n1", &issuer(), None)["spec"]
            .get("duration")
            .is_none());
    }

    #[test]
    fn a_certificate_counts_as_issued_only_ready_for_its_current_generation() {
        let cert = |generation: i64, status: &str, observed: i64| {
            let mut o = DynamicObject::new("c", &certificates());
            o.metadata.generation = Some(generation);
            o.data = serde_json::json!({"status": {"conditions": [{
                "type": "Ready", "status": status, "observedGeneration": observed,
                "reason": "Pending", "message": "waiting on CertificateRequest"}]}});
            o
        };
        assert_eq!(issued(&cert(2, "True", 2)), Ok(()));
        // Ready for the issuer it had before the last apply.
        assert!(issued(&cert(3, "True", 2))
            .unwrap_err()
            .contains("generation"));
        let e = issued(&cert(1, "False", 1)).unwrap_err();
        assert!(e.contains("waiting on CertificateRequest"), "{e}");
        let mut none = cert(1, "True", 1);
        none.data = serde_json::json!({});
        assert!(issued(&none).is_err());
    }

    #[test]
    fn a_secret_holds_a_nodes_certificate_only_with_its_three_keys() {
        let secret = crate::secret_of;
        let all = secret(&[("ca.crt", b"a"), ("tls.crt", b"c"), ("tls.key", b"k")]);
        assert_eq!(
            tls_of(&all),
            Ok(NodeTls {
                ca: b"a".to_vec(),
                cert: b"c".to_vec(),
                key: b"k".to_vec()
            })
        );
        // An issuer that writes no ca.crt (some external ones) is refused:
        // a node could not check its peers.
        assert_eq!(
            tls_of(&secret(&[("tls.crt", b"c"), ("tls.key", b"k")])),
            Err("ca.crt")
        );
        assert_eq!(
            tls_of(&secret(&[
                ("ca.crt", b"a"),
                ("tls.crt", b""),
                ("tls.key", b"k")
            ])),
            Err("tls.crt")
        );
    }
}
