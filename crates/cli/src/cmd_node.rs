//! `lamina node register`: a storage node announces its daemon to Lamina's
//! controllers by writing its node Secret (crates/node-secrets owns the
//! format); and `lamina node ensure-ca`: it gets the cluster's transfer CA
//! from its Secret, made there by the first node to find none; and `lamina
//! node certificate`: it has cert-manager issue its transfer certificate
//! instead, so that no node holds the CA's key. All three talk
//! to the Kubernetes API, not to a daemon, so they have their own flags,
//! parsed apart from the API commands' (whose global --endpoint would
//! clash with the endpoint it registers).

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// A storage node's registration with Lamina's controllers. The kubeconfig
/// is found as kubectl finds it (KUBECONFIG, ~/.kube/config, or the pod's
/// service account).
#[derive(Parser, Debug)]
#[command(name = "lamina node", bin_name = "lamina node", version)]
pub struct NodeCli {
    #[command(subcommand)]
    cmd: NodeCmd,
}

#[derive(Subcommand, Debug)]
enum NodeCmd {
    /// Write (or update) this node's Secret lamina-node-NAME, labelled
    /// lamina.io/node=NAME, so the controllers and the CSI controller reach its daemon.
    Register {
        /// The node's name (its Kubernetes node name): a DNS subdomain of at most 63 characters.
        #[arg(long, value_name = "NAME")]
        node: String,
        /// Where the daemon's API answers, e.g. http://10.0.0.7:7480.
        #[arg(long, value_name = "URL")]
        endpoint: String,
        /// A file holding the daemon's bearer token.
        #[arg(long, value_name = "PATH")]
        token_file: PathBuf,
        /// Where the node's transfer listener answers other nodes, e.g. 10.0.0.7:7481.
        #[arg(long, value_name = "HOST:PORT")]
        transfer_address: Option<String>,
        /// Lamina's namespace [default: POD_NAMESPACE, else the kubeconfig's namespace].
        #[arg(long, env = "POD_NAMESPACE", value_name = "NS")]
        namespace: Option<String>,
        /// The pod that owns the Secret: Kubernetes deletes the Secret with it.
        #[arg(long, value_name = "NAME", requires = "owner_uid")]
        owner_pod: Option<String>,
        /// That pod's uid (metadata.uid).
        #[arg(long, value_name = "UID", requires = "owner_pod")]
        owner_uid: Option<String>,
    },
    /// Write the cluster's transfer CA (ca.crt, ca.key) from Secret NAME into
    /// DIR, making it first if there is none: nodes starting at once end with
    /// one CA (the first Secret made). DIR is what `lamina certs issue --ca` takes.
    EnsureCa {
        /// The CA's Secret.
        #[arg(long, value_name = "NAME")]
        secret: String,
        /// Lamina's namespace [default: POD_NAMESPACE, else the kubeconfig's namespace].
        #[arg(long, env = "POD_NAMESPACE", value_name = "NS")]
        namespace: Option<String>,
        /// Where ca.crt and ca.key go (created if absent; files there replaced).
        dir: PathBuf,
    },
    /// Have cert-manager issue this node's transfer certificate (Certificate
    /// lamina-transfer-NODE, from the given issuer), wait until it is issued,
    /// and write its Secret's ca.crt, tls.crt and tls.key into DIR: what
    /// `lamina serve --transfer-tls DIR` reads. No node holds the CA's key.
    Certificate {
        /// The node's name: the certificate's DNS name, which peers know it by.
        #[arg(long, value_name = "NAME")]
        node: String,
        /// The cert-manager issuer that signs it.
        #[arg(long, value_name = "NAME")]
        issuer: String,
        /// Issuer (in Lamina's namespace) or ClusterIssuer.
        #[arg(long, value_name = "KIND", default_value = "Issuer")]
        issuer_kind: String,
        /// The issuer's API group.
        #[arg(long, value_name = "GROUP", default_value = "cert-manager.io")]
        issuer_group: String,
        /// How long the certificate is valid, as cert-manager reads it (e.g.
        /// 8760h) [default: the issuer's, else cert-manager's 90 days].
        /// cert-manager renews it at two thirds of that: keep
        /// `--renew-every` running to bring the renewed one to the daemon.
        #[arg(long, value_name = "DURATION")]
        duration: Option<String>,
        /// How long to wait for cert-manager to issue it.
        #[arg(long, value_name = "DURATION", default_value = "5m")]
        wait: humantime::Duration,
        /// Keep running: look at the certificate again this often, and
        /// write it into DIR whenever cert-manager renewed it (the daemon
        /// reads DIR again every 30 s). Errors then are printed and the
        /// next look tries again.
        #[arg(long, value_name = "DURATION")]
        renew_every: Option<humantime::Duration>,
        /// Lamina's namespace [default: POD_NAMESPACE, else the kubeconfig's namespace].
        #[arg(long, env = "POD_NAMESPACE", value_name = "NS")]
        namespace: Option<String>,
        /// Where ca.crt, tls.crt and tls.key go (created if absent; files there replaced).
        dir: PathBuf,
    },
}

/// Put cert-manager's certificate `tls` for node `node` into `dir`, unless
/// `dir` holds it already: whether it was written. Checked first in a
/// scratch directory of `dir`, as the daemon will read it: it must load (a
/// key that matches, a CA that signed it) and name this node first (an
/// issuer may rewrite the DNS names). Only then are `dir`'s files
/// replaced, each written beside it and renamed over it, the key first
/// (the daemon, reading them meanwhile, finds a key that does not match
/// its certificate and keeps the identity it has until the next read).
fn write_checked(
    dir: &std::path::Path,
    node: &str,
    ns: &str,
    issuer: &str,
    tls: &lamina_node_secrets::NodeTls,
) -> Result<bool> {
    use lamina_transfer::{CA_FILE, CERT_FILE, KEY_FILE};
    let files = [
        (KEY_FILE, &tls.key, true),
        (CERT_FILE, &tls.cert, false),
        (CA_FILE, &tls.ca, false),
    ];
    let same = files
        .iter()
        .all(|(f, bytes, _)| std::fs::read(dir.join(f)).is_ok_and(|b| b == **bytes));
    if same {
        return Ok(false);
    }
    let scratch = dir.join(".issued");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let checked = (|| -> Result<()> {
        for (f, bytes, secret) in files {
            replace_file(&scratch.join(f), bytes, secret)?;
        }
        let id = lamina_transfer::Identity::load(&scratch)
            .with_context(|| format!("the certificate cert-manager issued for node {node}"))?;
        anyhow::ensure!(
            id.node() == node,
            "the certificate cert-manager issued (Secret {ns}/{}) names node {:?} first, not {node:?}: the issuer {issuer} rewrote its DNS names",
            lamina_node_secrets::certificate_name(node),
            id.node(),
        );
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    checked?;
    for (f, bytes, secret) in files {
        replace_file(&dir.join(f), bytes, secret)?;
    }
    Ok(true)
}

/// Write `bytes` to `path` through a file beside it, renamed over it: a
/// reader sees the old file or the new one. `secret`: readable by the owner
/// alone.
fn replace_file(path: &std::path::Path, bytes: &[u8], secret: bool) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("new");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {}", tmp.display()))
}

/// `lamina node ARGS...`; `args` starts with the program name.
pub fn main(mut args: Vec<std::ffi::OsString>) -> Result<()> {
    args.remove(1);
    let cli = NodeCli::parse_from(args);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(run(cli.cmd))
}

async fn run(cmd: NodeCmd) -> Result<()> {
    match cmd {
        NodeCmd::Register {
            node,
            endpoint,
            token_file,
            transfer_address,
            namespace,
            owner_pod,
            owner_uid,
        } => {
            let token = std::fs::read_to_string(&token_file)
                .with_context(|| format!("reading the token from {}", token_file.display()))?;
            let spec = lamina_node_secrets::NodeSpec {
                endpoint,
                token,
                transfer_address,
            };
            let owner = owner_pod
                .zip(owner_uid)
                .map(|(name, uid)| lamina_node_secrets::OwnerPod { name, uid });
            // Checked before connecting: a bad name is refused whether or
            // not the API server answers.
            lamina_node_secrets::check(&node, &spec)?;
            // kube's error says its causes itself: not chained again.
            let client = kube::Client::try_default()
                .await
                .map_err(|e| anyhow::anyhow!("connecting to the API server: {e}"))?;
            let ns = namespace.unwrap_or_else(|| client.default_namespace().to_string());
            let api = kube::Api::namespaced(client, &ns);
            lamina_node_secrets::register(&api, &node, &spec, owner.as_ref()).await?;
            let owned = match &owner {
                Some(o) => format!(", owned by pod {}", o.name),
                None => String::new(),
            };
            crate::output::outln!(
                "registered node {node} in Secret {ns}/{} (endpoint {}{}{owned})",
                lamina_node_secrets::secret_name(&node),
                spec.endpoint.trim(),
                spec.transfer_address
                    .as_deref()
                    .map(|a| format!(", transfer {a}"))
                    .unwrap_or_default(),
            );
            Ok(())
        }
        NodeCmd::EnsureCa {
            secret,
            namespace,
            dir,
        } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let client = kube::Client::try_default()
                .await
                .map_err(|e| anyhow::anyhow!("connecting to the API server: {e}"))?;
            let ns = namespace.unwrap_or_else(|| client.default_namespace().to_string());
            let api = kube::Api::namespaced(client, &ns);
            // Made only if the Secret has none: in a scratch directory of
            // DIR, as `lamina certs create-ca` makes one, then read back.
            let make = || -> std::result::Result<(Vec<u8>, Vec<u8>), String> {
                let scratch = dir.join(".made");
                let _ = std::fs::remove_dir_all(&scratch);
                let read = |f: &str| std::fs::read(scratch.join(f)).map_err(|e| e.to_string());
                let made = lamina_transfer::certs::create_ca(&scratch)
                    .map_err(|e| e.to_string())
                    .and_then(|()| {
                        Ok((
                            read(lamina_node_secrets::KEY_CA_CERT)?,
                            read(lamina_node_secrets::KEY_CA_KEY)?,
                        ))
                    });
                let _ = std::fs::remove_dir_all(&scratch);
                made
            };
            let ca = lamina_node_secrets::ensure_ca(&api, &ns, &secret, make).await?;
            replace_file(&dir.join(lamina_node_secrets::KEY_CA_CERT), &ca.cert, false)?;
            replace_file(&dir.join(lamina_node_secrets::KEY_CA_KEY), &ca.key, true)?;
            crate::output::outln!(
                "the cluster CA from Secret {ns}/{secret} ({}) in {}",
                if ca.made { "made now" } else { "found" },
                dir.display()
            );
            Ok(())
        }
        NodeCmd::Certificate {
            node,
            issuer,
            issuer_kind,
            issuer_group,
            duration,
            wait,
            renew_every,
            namespace,
            dir,
        } => {
            // Checked before connecting: a bad name is refused whether or
            // not the API server answers.
            lamina_node_secrets::check_node_name(&node)?;
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let client = kube::Client::try_default()
                .await
                .map_err(|e| anyhow::anyhow!("connecting to the API server: {e}"))?;
            let ns = namespace.unwrap_or_else(|| client.default_namespace().to_string());
            let issuer = lamina_node_secrets::IssuerRef {
                name: issuer,
                kind: issuer_kind,
                group: issuer_group,
            };
            let certificate = lamina_node_secrets::certificate_name(&node);
            let ask = || {
                lamina_node_secrets::ensure_certificate(
                    client.clone(),
                    &ns,
                    &node,
                    &issuer,
                    duration.as_deref(),
                    *wait,
                )
            };
            let tls = ask().await?;
            write_checked(&dir, &node, &ns, &issuer.name, &tls)?;
            crate::output::outln!(
                "node {node}'s transfer certificate from {} {} (Secret {ns}/{certificate}) in {}",
                issuer.kind,
                issuer.name,
                dir.display()
            );
            let Some(every) = renew_every else {
                return Ok(());
            };
            loop {
                tokio::time::sleep(*every).await;
                let written = match ask().await {
                    Ok(tls) => write_checked(&dir, &node, &ns, &issuer.name, &tls),
                    Err(e) => Err(e.into()),
                };
                match written {
                    Ok(true) => crate::output::outln!(
                        "node {node}'s transfer certificate renewed (Secret {ns}/{certificate}) in {}",
                        dir.display()
                    ),
                    Ok(false) => {}
                    Err(e) => eprintln!(
                        "lamina: node {node}'s transfer certificate not looked at: {e:#} (again in {every})"
                    ),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_node_command_line_is_consistent() {
        NodeCli::command().debug_assert();
        let base = [
            "lamina node",
            "register",
            "--node",
            "n1",
            "--endpoint",
            "http://10.0.0.7:7480",
            "--token-file",
            "/t",
        ];
        let c = NodeCli::try_parse_from(base).unwrap();
        let NodeCmd::Register {
            node, owner_pod, ..
        } = c.cmd
        else {
            panic!("not register: {:?}", c.cmd)
        };
        assert_eq!((node.as_str(), owner_pod), ("n1", None));
        // an owner needs both its name and its uid
        let mut half = base.to_vec();
        half.extend(["--owner-pod", "p"]);
        assert!(NodeCli::try_parse_from(half).is_err());
        let mut both = base.to_vec();
        both.extend(["--owner-pod", "p", "--owner-uid", "u"]);
        assert!(NodeCli::try_parse_from(both).is_ok());
    }
}
