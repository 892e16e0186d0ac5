//! p. The chart's multiNode install without a hand step for the transfer
//! CA: the first node pod to find no CA Secret makes it (`lamina node
//! ensure-ca`, the chart's init container `ca`). Three at once, as the
//! chart's node ServiceAccount (its Role `lamina-node-register`), for a
//! Secret that does not exist: exactly one makes it, all three write the
//! same CA (its key readable by its owner alone), which is the Secret's; a
//! certificate issued from one directory verifies against another's CA
//! (openssl); asked again, the CA is found, not made; a Secret holding no
//! key is refused, naming the key, and left as it is.
//!
//! And the chart's multiNode.certManager: each node's certificate issued by
//! cert-manager (`lamina node certificate`), as kube-env's three nodes get
//! theirs ([`certs_from_cert_manager`]).

use crate::env::{run, wait, Env};
use anyhow::{ensure, Context, Result};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

const SECRET: &str = "lamina-transfer-ca-e2e";
const BAD: &str = "lamina-transfer-ca-e2e-bad";

fn ensure_ca(env: &Env, secret: &str, dir: &std::path::Path) -> Command {
    let mut c = Command::new(&env.lamina);
    c.args([
        "node",
        "ensure-ca",
        "--namespace",
        "lamina",
        "--secret",
        secret,
    ])
    .arg(dir)
    .env("KUBECONFIG", env.dir.join("node.kubeconfig"))
    .stdin(Stdio::null());
    c
}

pub fn ca_made_once(env: &Env) -> Result<()> {
    for s in [SECRET, BAD] {
        env.kubectl(&["delete", "-n", "lamina", "secret", s, "--ignore-not-found"])?;
    }
    let work = tempfile::Builder::new().prefix("kube-env-ca-").tempdir()?;
    let dirs: Vec<_> = (0..3).map(|i| work.path().join(format!("n{i}"))).collect();
    let children = dirs
        .iter()
        .map(|d| {
            ensure_ca(env, SECRET, d)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .context("start lamina node ensure-ca")
        })
        .collect::<Result<Vec<_>>>()?;
    let mut made = 0;
    for c in children {
        let out = c.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        ensure!(
            out.status.success(),
            "lamina node ensure-ca: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        made += usize::from(text.contains("made now"));
    }
    ensure!(made == 1, "{made} of the three made a CA");
    let read = |d: &std::path::Path, f: &str| std::fs::read(d.join(f)).context(f.to_string());
    let (cert, key) = (read(&dirs[0], "ca.crt")?, read(&dirs[0], "ca.key")?);
    for d in &dirs[1..] {
        ensure!(
            read(d, "ca.crt")? == cert && read(d, "ca.key")? == key,
            "{} holds another CA than {}",
            d.display(),
            dirs[0].display()
        );
    }
    let mode = std::fs::metadata(dirs[1].join("ca.key"))?
        .permissions()
        .mode()
        & 0o777;
    ensure!(mode == 0o600, "ca.key has mode {mode:o}");
    let stored = env.kubectl(&[
        "get",
        "-n",
        "lamina",
        "secret",
        SECRET,
        "-o",
        "jsonpath={.data.ca\\.crt}",
    ])?;
    let decoded = run(Command::new("sh")
        .arg("-c")
        .arg(format!("printf %s '{}' | base64 -d", stored.trim())))?;
    ensure!(
        decoded.as_bytes() == cert.as_slice(),
        "the Secret's ca.crt is not the one written"
    );

    // A node's certificate from one directory, checked against another's.
    let issued = work.path().join("issued");
    run(Command::new(&env.lamina)
        .args(["certs", "issue", "--node", "n-e2e", "--ca"])
        .arg(&dirs[0])
        .arg(&issued))?;
    run(Command::new("openssl")
        .args(["verify", "-CAfile"])
        .arg(dirs[2].join("ca.crt"))
        .arg(issued.join("tls.crt")))
    .context("the issued certificate against another node's CA")?;

    // Again: found.
    let again = run(&mut ensure_ca(env, SECRET, &dirs[0]))?;
    ensure!(again.contains("found"), "asked again: {again}");
    ensure!(read(&dirs[0], "ca.crt")? == cert, "the CA changed");

    // A Secret with no key: refused, named, left as it is.
    env.kubectl(&[
        "create",
        "-n",
        "lamina",
        "secret",
        "generic",
        BAD,
        "--from-literal=ca.crt=x",
    ])?;
    let out = ensure_ca(env, BAD, &work.path().join("bad")).output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && err.contains("holds no ca.key"),
        "an incomplete CA Secret: {err}"
    );
    let keys = env.kubectl(&[
        "get",
        "-n",
        "lamina",
        "secret",
        BAD,
        "-o",
        "jsonpath={.data}",
    ])?;
    ensure!(
        keys.contains("ca.crt") && !keys.contains("ca.key"),
        "the incomplete Secret was changed: {keys}"
    );
    for s in [SECRET, BAD] {
        env.kubectl(&["delete", "-n", "lamina", "secret", s])?;
    }
    Ok(())
}

/// The nodes' transfer certificates issued by cert-manager (kube-env's
/// default with three nodes, as the chart's multiNode.certManager): the
/// three nodes' Certificates ready, each node's files its Secret's and
/// signed by the ClusterIssuer's CA for its name; node 3's certificate
/// issued again (its Secret deleted) reaches its running daemon through
/// `lamina node certificate --renew-every`, presented from then on; a
/// 3-replica volume
/// written through node 1 is healthy on all three (replica sessions over
/// those certificates, mutual TLS); the node ServiceAccount cannot read the
/// CA's key; asked again, a node gets the certificate it has at once; a new
/// node gets one; an issuer that does not exist, a bad node name and a bad
/// issuer kind are refused with errors that say so.
pub fn certs_from_cert_manager(env: &Env) -> Result<()> {
    const NODES: [&str; 3] = ["kube-env-node", "kube-env-node-2", "kube-env-node-3"];
    let node_sa = env.dir.join("node.kubeconfig");
    let certificate = |node: &str, issuer: &str, kind: &str, dir: &std::path::Path, wait: &str| {
        let mut c = Command::new(&env.lamina);
        c.args(["node", "certificate", "--node", node, "--issuer", issuer])
            .args([
                "--issuer-kind",
                kind,
                "--namespace",
                "lamina",
                "--wait",
                wait,
            ])
            .arg(dir)
            .env("KUBECONFIG", &node_sa)
            .stdin(Stdio::null());
        c
    };
    let secret_cert = |name: &str| env.secret_value("lamina", name, "tls.crt");
    let verify = |dir: &std::path::Path, node: &str| -> Result<()> {
        run(Command::new("openssl")
            .args(["verify", "-CAfile"])
            .arg(dir.join("ca.crt"))
            .arg(dir.join("tls.crt")))
        .with_context(|| format!("{}'s certificate against its CA", dir.display()))?;
        let san = run(Command::new("openssl")
            .args(["x509", "-noout", "-ext", "subjectAltName", "-in"])
            .arg(dir.join("tls.crt")))?;
        ensure!(
            san.contains(&format!("DNS:{node}")),
            "{}: names {san}, not {node}",
            dir.display()
        );
        Ok(())
    };

    let listed = env.kubectl(&["get", "-n", "lamina", "certificates", "-o", "name"]);
    ensure!(
        listed.as_deref().is_ok_and(|l| l.contains("lamina-transfer-kube-env-node-3")),
        "the environment's node certificates are not cert-manager's (run with KUBE_ENV_CERTS=cert-manager and three nodes): {listed:?}"
    );
    let mut ca = None;
    for node in NODES {
        let name = format!("lamina-transfer-{node}");
        let ready = env.kubectl(&[
            "get",
            "-n",
            "lamina",
            "certificate",
            &name,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ])?;
        ensure!(ready == "True", "Certificate {name}: Ready is {ready:?}");
        let dir = env.dir.join("transfer").join(node);
        verify(&dir, node)?;
        ensure!(
            std::fs::read(dir.join("tls.crt"))? == secret_cert(&name)?,
            "node {node}'s tls.crt is not its Secret's"
        );
        let this_ca = std::fs::read(dir.join("ca.crt"))?;
        ensure!(
            ca.get_or_insert_with(|| this_ca.clone()) == &this_ca,
            "node {node} has another CA than node 1"
        );
    }

    // Renewal reaches a running daemon: node 3's certificate issued again
    // (its Secret deleted, which cert-manager answers with a new key and
    // certificate), `--renew-every` (the chart's container certs-renew)
    // writes it into node 3's directory, and node 3's daemon presents it
    // from its next connection on, with no restart.
    let dir3 = env.dir.join("transfer").join(NODES[2]);
    let old3 = std::fs::read(dir3.join("tls.crt"))?;
    let renew_log = std::fs::File::create(env.dir.join("logs/certs-renew-3.log"))?;
    let mut renew = certificate(
        NODES[2],
        "lamina-transfer-ca",
        "ClusterIssuer",
        &dir3,
        "60s",
    )
    .args(["--renew-every", "1s"])
    .stdout(renew_log.try_clone()?)
    .stderr(renew_log)
    .spawn()
    .context("lamina node certificate --renew-every")?;
    let renewed = (|| -> Result<()> {
        let address3 = crate::replicated::transfer_address(env, NODES[2])?;
        let t = std::time::Instant::now();
        env.kubectl(&[
            "delete",
            "-n",
            "lamina",
            "secret",
            &format!("lamina-transfer-{}", NODES[2]),
        ])?;
        let new3 = wait("node 3's renewed certificate in its directory", T, |last| {
            let now = std::fs::read(dir3.join("tls.crt"))?;
            *last = format!("{} bytes, the old one's: {}", now.len(), now == old3);
            Ok((now != old3).then_some(now))
        })?;
        verify(&dir3, NODES[2])?;
        let dir1 = env.dir.join("transfer").join(NODES[0]);
        let first_pem = |text: &str| -> Option<String> {
            let a = text.find("-----BEGIN CERTIFICATE-----")?;
            let end = "-----END CERTIFICATE-----";
            let b = text[a..].find(end)? + a + end.len();
            Some(text[a..b].to_string())
        };
        let want = first_pem(&String::from_utf8_lossy(&new3)).context("no PEM in tls.crt")?;
        wait(
            "node 3's daemon presenting its renewed certificate",
            Duration::from_secs(90),
            |last| {
                let out = Command::new("openssl")
                    .args(["s_client", "-connect", &address3, "-servername", NODES[2]])
                    .arg("-cert")
                    .arg(dir1.join("tls.crt"))
                    .arg("-key")
                    .arg(dir1.join("tls.key"))
                    .arg("-CAfile")
                    .arg(dir1.join("ca.crt"))
                    .stdin(Stdio::null())
                    .output()?;
                let text = String::from_utf8_lossy(&out.stdout);
                let got = first_pem(&text);
                *last = match &got {
                    Some(_) => "the old certificate".to_string(),
                    None => format!("no certificate: {}", String::from_utf8_lossy(&out.stderr)),
                };
                Ok((got.as_deref() == Some(want.as_str())).then_some(()))
            },
        )?;
        println!(
            "    renewal: node 3's daemon presented the renewed certificate {:.1} s after its Secret was deleted",
            t.elapsed().as_secs_f64()
        );
        Ok(())
    })();
    let _ = renew.kill();
    let _ = renew.wait();
    renewed?;

    // Replica sessions between the three daemons over these certificates
    // (node 3's renewed).
    for node in &NODES[1..] {
        let address = crate::replicated::transfer_address(env, node)?;
        env.lamina(&["node", "add", node, &address])?;
    }
    env.lamina(&[
        "volume",
        "create",
        "cm-e2e",
        "--size",
        "16MiB",
        "--replicas",
        "3",
        "--replica-node",
        NODES[1],
        "--replica-node",
        NODES[2],
    ])?;
    env.write_pattern("cm-e2e", 0x5c, "4M")?;
    let v = env.lamina_json(&["volume", "get", "cm-e2e"])?;
    let state = &v["replication"]["state"];
    ensure!(state == "healthy", "the 3-replica volume is {state}: {v}");
    env.lamina(&["volume", "delete", "cm-e2e"])?;

    // The CA's key is out of the node pods' reach.
    let can = Command::new(&env.kubectl)
        .args(["--kubeconfig"])
        .arg(&env.kubeconfig)
        .args([
            "auth",
            "can-i",
            "get",
            "secret/lamina-transfer-ca",
            "-n",
            "cert-manager",
        ])
        .args(["--as", "system:serviceaccount:lamina:lamina-node"])
        .output()?;
    let said = String::from_utf8_lossy(&can.stdout);
    ensure!(
        said.trim() == "no",
        "the node ServiceAccount may read the CA's Secret: {said}"
    );

    let work = tempfile::Builder::new().prefix("kube-env-cm-").tempdir()?;
    // Asked again: the certificate there, at once.
    let again = work.path().join("again");
    let t = std::time::Instant::now();
    run(&mut certificate(
        NODES[1],
        "lamina-transfer-ca",
        "ClusterIssuer",
        &again,
        "20s",
    ))?;
    ensure!(
        std::fs::read(again.join("tls.crt"))? == secret_cert("lamina-transfer-kube-env-node-2")?,
        "asked again, node 2 got another certificate than its Secret's"
    );
    ensure!(
        std::fs::read(again.join("tls.crt"))?
            == std::fs::read(env.dir.join("transfer").join(NODES[1]).join("tls.crt"))?,
        "asked again, node 2's certificate changed"
    );
    println!("    asked again: {:.1} s", t.elapsed().as_secs_f64());
    let mode = std::fs::metadata(again.join("tls.key"))?
        .permissions()
        .mode()
        & 0o777;
    ensure!(mode == 0o600, "tls.key has mode {mode:o}");

    // A new node.
    let new = work.path().join("new");
    run(&mut certificate(
        "cm-e2e-new",
        "lamina-transfer-ca",
        "ClusterIssuer",
        &new,
        "20s",
    ))?;
    verify(&new, "cm-e2e-new")?;
    ensure!(
        std::fs::read(new.join("ca.crt"))? == ca.clone().unwrap_or_default(),
        "the new node's CA is not the others'"
    );

    // Refused: an issuer that is not there (cert-manager's reason in the
    // error, after the wait), a bad node name and a bad kind (before any call).
    let out = certificate(
        "cm-e2e-bad",
        "no-such-issuer",
        "Issuer",
        &work.path().join("bad"),
        "3s",
    )
    .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success()
            && err.contains("lamina-transfer-cm-e2e-bad was not issued within 3s"),
        "an issuer that is not there: {err}"
    );
    ensure!(
        !work.path().join("bad").join("tls.key").exists(),
        "a certificate that was not issued left a key behind"
    );
    for (node, kind, says) in [
        ("Bad_Name", "Issuer", "cannot name a node Secret"),
        (
            "cm-e2e-kind",
            "Certificate",
            "must be Issuer or ClusterIssuer",
        ),
    ] {
        let out = certificate(
            node,
            "lamina-transfer-ca",
            kind,
            &work.path().join("refused"),
            "20s",
        )
        .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && err.contains(says),
            "{node} ({kind}): {err}"
        );
    }
    ensure!(
        env.get("lamina", "certificate", "lamina-transfer-cm-e2e-kind")?
            .is_none(),
        "a refused kind made a Certificate"
    );
    for name in ["lamina-transfer-cm-e2e-new", "lamina-transfer-cm-e2e-bad"] {
        env.kubectl(&["delete", "-n", "lamina", "certificate", name])?;
        env.kubectl(&[
            "delete",
            "-n",
            "lamina",
            "secret",
            name,
            "--ignore-not-found",
        ])?;
    }
    Ok(())
}
