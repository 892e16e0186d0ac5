//! The node Secrets: in Lamina's namespace, one Secret per node daemon,
//! labelled `lamina.io/node=NODE`, with keys `endpoint` (http://host:port),
//! `token` and, optionally, `transfer-address` (HOST:PORT of the node's
//! transfer listener, which other nodes pull snapshots from). This crate
//! owns the format: a node writing its own Secret (`register`, for `lamina
//! node register` in the node pods), reading one, and watching the whole
//! set (the Kubernetes controllers and the CSI controller), so it is written
//! once. It also owns the other Secret the node pods share: the cluster's
//! transfer CA, made once by the first node to find none ([`ensure_ca`]).
//! And a node's transfer certificate when cert-manager issues it
//! ([`ensure_certificate`]: its Certificate and the Secret cert-manager
//! writes). It must not make daemon clients or act on a node, nor make certificates
//! (its callers hand it a CA): what a node set means is its users' business.

mod ca;
mod certificate;
mod register;
pub use ca::{ca_of, ensure_ca, Ca, CaError, KEY_CA_CERT, KEY_CA_KEY};
pub use certificate::{
    certificate, certificate_name, ensure_certificate, issued, tls_of, CertificateError, IssuerRef,
    NodeTls, CERTIFICATE_FIELD_MANAGER, CERTIFICATE_PREFIX, KEY_TLS_CERT, KEY_TLS_KEY,
};
pub use register::{
    check, check_node_name, node_secret, register, secret_name, OwnerPod, RegisterError,
    FIELD_MANAGER, SECRET_PREFIX,
};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use std::collections::BTreeMap;
use std::time::Duration;

/// The label naming the node a Secret describes.
pub const NODE_LABEL: &str = "lamina.io/node";
/// Secret keys.
pub const KEY_ENDPOINT: &str = "endpoint";
pub const KEY_TOKEN: &str = "token";
pub const KEY_TRANSFER: &str = "transfer-address";

/// A node as its Secret describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    /// The daemon's API, `http://host:port`.
    pub endpoint: String,
    pub token: String,
    /// The node's transfer listener, `HOST:PORT`, if it has one.
    pub transfer_address: Option<String>,
}

/// The node's name and daemon from a Secret, or why it cannot be used.
/// The name is the label's value, or the Secret's name when it is empty.
pub fn node_of(s: &Secret) -> Result<(String, NodeSpec), String> {
    let name = s
        .labels()
        .get(NODE_LABEL)
        .filter(|n| !n.is_empty())
        .cloned()
        .unwrap_or_else(|| s.name_any());
    let field = |k: &str| -> Result<Option<String>, String> {
        let d = s.data.as_ref().and_then(|d| d.get(k));
        let sd = s.string_data.as_ref().and_then(|d| d.get(k));
        match (d, sd) {
            (Some(b), _) => String::from_utf8(b.0.clone())
                .map(|v| Some(v.trim().to_string()))
                .map_err(|_| format!("Secret {}: key {k} is not UTF-8", s.name_any())),
            (None, Some(v)) => Ok(Some(v.trim().to_string())),
            (None, None) => Ok(None),
        }
    };
    let required = |k: &str| -> Result<String, String> {
        field(k)?.ok_or_else(|| format!("Secret {} has no key {k}", s.name_any()))
    };
    Ok((
        name,
        NodeSpec {
            endpoint: required(KEY_ENDPOINT)?,
            token: required(KEY_TOKEN)?,
            transfer_address: field(KEY_TRANSFER)?.filter(|a| !a.is_empty()),
        },
    ))
}

/// The node Secrets of a namespace, as a stream of whole sets (by Secret
/// name): one when the first listing is complete, then one after every
/// change. Errors of the watch are logged and the watch goes on after a
/// pause; the stream ends only with the process.
pub fn watch(api: Api<Secret>) -> impl Stream<Item = BTreeMap<String, Secret>> + Send {
    let cfg = watcher::Config::default().labels(NODE_LABEL);
    let state = Watch {
        events: watcher(api, cfg).boxed(),
        secrets: BTreeMap::new(),
        init: None,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            let ev = st.events.next().await?;
            match ev {
                Ok(watcher::Event::Init) => st.init = Some(BTreeMap::new()),
                Ok(watcher::Event::InitApply(s)) => {
                    if let Some(i) = st.init.as_mut() {
                        i.insert(s.name_any(), s);
                    }
                }
                Ok(watcher::Event::InitDone) => st.secrets = st.init.take().unwrap_or_default(),
                Ok(watcher::Event::Apply(s)) => {
                    st.secrets.insert(s.name_any(), s);
                }
                Ok(watcher::Event::Delete(s)) => {
                    st.secrets.remove(&s.name_any());
                }
                Err(e) => {
                    tracing::warn!(error = %e, "watching node Secrets");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    continue;
                }
            }
            if st.init.is_none() {
                let set = st.secrets.clone();
                return Some((set, st));
            }
        }
    })
}

struct Watch {
    events: futures::stream::BoxStream<'static, Result<watcher::Event<Secret>, watcher::Error>>,
    secrets: BTreeMap<String, Secret>,
    init: Option<BTreeMap<String, Secret>>,
}

/// Key `key` of a Secret, if it is there and not empty (else the key's name,
/// for the error that names what is missing).
pub(crate) fn secret_key(secret: &Secret, key: &'static str) -> Result<Vec<u8>, &'static str> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .filter(|b| !b.is_empty())
        .ok_or(key)
}

/// A Secret holding these keys and values (tests).
#[cfg(test)]
pub(crate) fn secret_of(pairs: &[(&str, &[u8])]) -> Secret {
    Secret {
        data: Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), k8s_openapi::ByteString(v.to_vec())))
                .collect(),
        ),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(label: &str, data: &[(&str, &str)], string_data: &[(&str, &str)]) -> Secret {
        let mut s = Secret::default();
        s.metadata.name = Some("lamina-node-x".into());
        s.metadata.labels = Some([(NODE_LABEL.to_string(), label.to_string())].into());
        s.data = Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        );
        s.string_data = Some(
            string_data
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        s
    }

    #[test]
    fn a_secret_gives_its_node_and_optional_transfer_address() {
        let s = secret(
            "n1",
            &[("endpoint", "http://a:1\n"), ("token", "t")],
            &[("transfer-address", "a:2")],
        );
        let (n, spec) = node_of(&s).unwrap();
        assert_eq!(n, "n1");
        assert_eq!(spec.endpoint, "http://a:1");
        assert_eq!(spec.transfer_address.as_deref(), Some("a:2"));
        let s = secret("", &[("endpoint", "http://a:1"), ("token", "t")], &[]);
        let (n, spec) = node_of(&s).unwrap();
        assert_eq!(n, "lamina-node-x");
        assert_eq!(spec.transfer_address, None);
        let s = secret("n1", &[("endpoint", "http://a:1")], &[]);
        assert!(node_of(&s).unwrap_err().contains("no key token"));
    }
}
