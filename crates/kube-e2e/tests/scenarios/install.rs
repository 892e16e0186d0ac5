//! p. The chart's multiNode install without a hand step for the transfer
//! CA: the first node pod to find no CA Secret makes it (`lamina node
//! ensure-ca`, the chart's init container `ca`). Three at once, as the
//! chart's node ServiceAccount (its Role `lamina-node-register`), for a
//! Secret that does not exist: exactly one makes it, all three write the
//! same CA (its key readable by its owner alone), which is the Secret's; a
//! certificate issued from one directory verifies against another's CA
//! (openssl); asked again, the CA is found, not made; a Secret holding no
//! key is refused, naming the key, and left as it is.

use crate::env::{run, Env};
use anyhow::{ensure, Context, Result};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

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
