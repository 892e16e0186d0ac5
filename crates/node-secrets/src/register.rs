//! A node announcing itself: its Secret written by server-side apply, so a
//! second registration (a new pod, a new address) updates the one Secret
//! instead of adding another, and keys or an owner left out of it are
//! dropped from the Secret.

use crate::{NodeSpec, KEY_ENDPOINT, KEY_TOKEN, KEY_TRANSFER, NODE_LABEL};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::ByteString;
use kube::api::{Patch, PatchParams};
use kube::Api;

/// The field manager of the node Secrets' registrations.
pub const FIELD_MANAGER: &str = "lamina-node";
/// The prefix of a node Secret's name: `lamina-node-NODE`.
pub const SECRET_PREFIX: &str = "lamina-node-";

/// The longest object name Kubernetes takes (a DNS subdomain).
const MAX_NAME: usize = 253;
/// The longest label value Kubernetes takes.
const MAX_LABEL_VALUE: usize = 63;

/// The pod a node Secret belongs to: when Kubernetes deletes the pod, its
/// garbage collector deletes the Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerPod {
    pub name: String,
    pub uid: String,
}

/// Why a node could not be registered.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("node name {node:?} cannot name a node Secret: {why}")]
    InvalidNode { node: String, why: String },
    #[error("node {node}: {why}")]
    InvalidSpec { node: String, why: String },
    #[error("applying the node Secret {namespace}/{secret}")]
    Api {
        namespace: String,
        secret: String,
        #[source]
        source: kube::Error,
    },
}

/// The name of `node`'s Secret, once `node` is known to be valid.
pub fn secret_name(node: &str) -> String {
    format!("{SECRET_PREFIX}{node}")
}

/// Whether `node` can name a node and its Secret: a DNS subdomain (lower
/// case letters, digits, '-' and '.', each dot-separated part starting and
/// ending with a letter or digit), at most 63 characters (it is the value of
/// the label `lamina.io/node`), so that `lamina-node-NODE` is a valid name.
pub fn check_node_name(node: &str) -> Result<(), RegisterError> {
    let bad = |why: String| {
        Err(RegisterError::InvalidNode {
            node: node.to_string(),
            why,
        })
    };
    if node.is_empty() {
        return bad("it is empty".into());
    }
    if node.len() > MAX_LABEL_VALUE {
        return bad(format!(
            "it has {} characters, and a label value (lamina.io/node) at most {MAX_LABEL_VALUE}",
            node.len()
        ));
    }
    if secret_name(node).len() > MAX_NAME {
        return bad(format!(
            "the Secret's name would exceed {MAX_NAME} characters"
        ));
    }
    if let Some(c) = node
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.'))
    {
        return bad(format!(
            "{c:?} is not allowed (a DNS subdomain: lower case letters, digits, '-' and '.')"
        ));
    }
    for part in node.split('.') {
        let ends_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        if !ends_ok(part.chars().next()) || !ends_ok(part.chars().last()) {
            return bad(format!(
                "each dot-separated part must start and end with a letter or digit ({part:?} does not)"
            ));
        }
    }
    Ok(())
}

/// Whether `node` and `spec` make a usable registration: the checks
/// `register` makes before writing anything.
pub fn check(node: &str, spec: &NodeSpec) -> Result<(), RegisterError> {
    check_node_name(node)?;
    check_spec(node, spec)
}

fn check_spec(node: &str, spec: &NodeSpec) -> Result<(), RegisterError> {
    let bad = |why: String| {
        Err(RegisterError::InvalidSpec {
            node: node.to_string(),
            why,
        })
    };
    let ep = spec.endpoint.trim();
    let rest = ep
        .strip_prefix("http://")
        .or_else(|| ep.strip_prefix("https://"));
    if rest.is_none_or(|r| r.is_empty()) {
        return bad(format!(
            "endpoint {ep:?} is not http://HOST:PORT (or https://)"
        ));
    }
    if spec.token.trim().is_empty() {
        return bad("the token is empty".into());
    }
    if let Some(a) = &spec.transfer_address {
        let port_ok = a
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !port_ok {
            return bad(format!("transfer address {a:?} is not HOST:PORT"));
        }
    }
    Ok(())
}

/// The Secret a registration applies (exactly the fields this manager owns).
pub fn node_secret(node: &str, spec: &NodeSpec, owner: Option<&OwnerPod>) -> Secret {
    let mut s = Secret::default();
    s.metadata.name = Some(secret_name(node));
    s.metadata.labels = Some([(NODE_LABEL.to_string(), node.to_string())].into());
    s.metadata.owner_references = owner.map(|o| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: o.name.clone(),
            uid: o.uid.clone(),
            ..Default::default()
        }]
    });
    s.type_ = Some("Opaque".into());
    let mut data = vec![
        (KEY_ENDPOINT, spec.endpoint.trim()),
        (KEY_TOKEN, spec.token.trim()),
    ];
    if let Some(a) = &spec.transfer_address {
        data.push((KEY_TRANSFER, a.trim()));
    }
    s.data = Some(
        data.into_iter()
            .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
            .collect(),
    );
    s
}

/// Register `node` in the namespace of `api`: server-side apply of Secret
/// `lamina-node-NODE` (label `lamina.io/node=NODE`; keys endpoint, token and
/// transfer-address if given), owned by `owner` if given. Applied with
/// force, so this registration wins over any earlier writer; a key or owner
/// an earlier registration set and this one leaves out is removed. Nothing
/// is written when the name or the spec is invalid. Returns the Secret as
/// stored.
pub async fn register(
    api: &Api<Secret>,
    node: &str,
    spec: &NodeSpec,
    owner: Option<&OwnerPod>,
) -> Result<Secret, RegisterError> {
    check(node, spec)?;
    let secret = node_secret(node, spec, owner);
    let name = secret_name(node);
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&secret),
    )
    .await
    .map_err(|source| RegisterError::Api {
        namespace: api.namespace().unwrap_or_default().to_string(),
        secret: name,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(transfer: Option<&str>) -> NodeSpec {
        NodeSpec {
            endpoint: "http://10.0.0.7:7480".into(),
            token: "t0k".into(),
            transfer_address: transfer.map(str::to_string),
        }
    }

    #[test]
    fn node_names_are_dns_subdomains_short_enough_for_the_label() {
        for ok in ["n1", "worker-3.example.org", "a", &"a".repeat(63)] {
            check_node_name(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for (bad, why) in [
            ("", "empty"),
            ("Node1", "'N' is not allowed"),
            ("n_1", "'_' is not allowed"),
            ("-n", "start and end"),
            ("n.", "start and end"),
            ("a..b", "start and end"),
            (&"a".repeat(64), "at most 63"),
        ] {
            let e = check_node_name(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
            assert!(e.contains("cannot name a node Secret"), "{e}");
        }
    }

    #[test]
    fn the_applied_secret_reads_back_as_the_node_registered() {
        let owner = OwnerPod {
            name: "lamina-node-abcde".into(),
            uid: "1234".into(),
        };
        let s = node_secret("n1", &spec(Some("10.0.0.7:7481")), Some(&owner));
        assert_eq!(s.metadata.name.as_deref(), Some("lamina-node-n1"));
        assert_eq!(
            crate::node_of(&s).unwrap(),
            ("n1".into(), spec(Some("10.0.0.7:7481")))
        );
        let o = &s.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (o.kind.as_str(), o.name.as_str(), o.uid.as_str()),
            ("Pod", "lamina-node-abcde", "1234")
        );
        let s = node_secret("n1", &spec(None), None);
        assert_eq!(s.metadata.owner_references, None);
        assert!(!s.data.as_ref().unwrap().contains_key(KEY_TRANSFER));
    }

    #[test]
    fn a_spec_without_a_usable_endpoint_token_or_address_is_refused() {
        check_spec("n1", &spec(Some("10.0.0.7:7481"))).unwrap();
        let mut s = spec(None);
        s.endpoint = "10.0.0.7:7480".into();
        assert!(check_spec("n1", &s)
            .unwrap_err()
            .to_string()
            .contains("endpoint"));
        let mut s = spec(None);
        s.token = " \n".into();
        assert!(check_spec("n1", &s)
            .unwrap_err()
            .to_string()
            .contains("token is empty"));
        for a in ["10.0.0.7", ":7481", "h:port"] {
            let e = check_spec("n1", &spec(Some(a))).unwrap_err().to_string();
            assert!(e.contains("transfer address"), "{a}: {e}");
        }
    }
}
