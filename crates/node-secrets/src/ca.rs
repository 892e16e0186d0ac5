//! The cluster's transfer CA, kept in one Secret of Lamina's namespace
//! (keys `ca.crt` and `ca.key`, as `lamina certs create-ca` writes them)
//! that each node pod reads to issue its own certificate. The first node to
//! find none makes it, by a create (never an apply or an update), so that
//! nodes starting at once end with one CA: a node whose create is refused
//! because the Secret exists takes the one there.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::PostParams;
use kube::Api;

/// The CA certificate's key in the Secret (PEM).
pub const KEY_CA_CERT: &str = "ca.crt";
/// The CA private key's key in the Secret (PEM).
pub const KEY_CA_KEY: &str = "ca.key";

/// A CA as the Secret holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ca {
    /// The certificate, PEM.
    pub cert: Vec<u8>,
    /// The private key, PEM.
    pub key: Vec<u8>,
    /// Made by this call (else found).
    pub made: bool,
}

/// Why the CA could not be had.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error(
        "Secret {namespace}/{secret} holds no {key}: fill it (lamina certs create-ca DIR; kubectl create secret generic {secret} --from-file=DIR/ca.crt --from-file=DIR/ca.key) or delete it, and the next node to start makes one"
    )]
    Incomplete {
        namespace: String,
        secret: String,
        key: &'static str,
    },
    #[error("making a CA: {0}")]
    Make(String),
    #[error("{what} Secret {namespace}/{secret}")]
    Api {
        what: &'static str,
        namespace: String,
        secret: String,
        #[source]
        source: Box<kube::Error>,
    },
}

/// The CA a Secret holds: both keys, each not empty.
pub fn ca_of(secret: &Secret) -> Result<(Vec<u8>, Vec<u8>), &'static str> {
    let get = |key| crate::secret_key(secret, key);
    Ok((get(KEY_CA_CERT)?, get(KEY_CA_KEY)?))
}

/// The CA in Secret `name` of `api`'s namespace `namespace`: the one there,
/// or else the one `make` returns (certificate and key, PEM), stored first;
/// when another node stores one between the look and the create, that one.
pub async fn ensure_ca(
    api: &Api<Secret>,
    namespace: &str,
    name: &str,
    make: impl FnOnce() -> Result<(Vec<u8>, Vec<u8>), String>,
) -> Result<Ca, CaError> {
    let api_error = |what: &'static str| {
        move |source| CaError::Api {
            what,
            namespace: namespace.to_string(),
            secret: name.to_string(),
            source: Box::new(source),
        }
    };
    let found = |s: &Secret| {
        ca_of(s)
            .map(|(cert, key)| Ca {
                cert,
                key,
                made: false,
            })
            .map_err(|key| CaError::Incomplete {
                namespace: namespace.to_string(),
                secret: name.to_string(),
                key,
            })
    };
    if let Some(s) = api.get_opt(name).await.map_err(api_error("reading"))? {
        return found(&s);
    }
    let (cert, key) = make().map_err(CaError::Make)?;
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(
            [
                (KEY_CA_CERT.to_string(), ByteString(cert.clone())),
                (KEY_CA_KEY.to_string(), ByteString(key.clone())),
            ]
            .into(),
        ),
        ..Default::default()
    };
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(Ca {
            cert,
            key,
            made: true,
        }),
        // Another node made it first: its CA is the cluster's.
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let s = api.get(name).await.map_err(api_error("reading"))?;
            found(&s)
        }
        Err(e) => Err(api_error("creating")(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_holds_a_ca_only_with_both_keys_not_empty() {
        let secret = crate::secret_of;
        assert_eq!(
            ca_of(&secret(&[(KEY_CA_CERT, b"c"), (KEY_CA_KEY, b"k")])),
            Ok((b"c".to_vec(), b"k".to_vec()))
        );
        assert_eq!(ca_of(&secret(&[(KEY_CA_CERT, b"c")])), Err(KEY_CA_KEY));
        assert_eq!(
            ca_of(&secret(&[(KEY_CA_CERT, b""), (KEY_CA_KEY, b"k")])),
            Err(KEY_CA_CERT)
        );
        assert_eq!(ca_of(&Secret::default()), Err(KEY_CA_CERT));
    }
}
