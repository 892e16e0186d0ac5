//! `lamina node register` against a real kube-apiserver (the kube-env
//! scripts, through crates/controller's test support), run as the chart's
//! node ServiceAccount with the Role the chart gives it for multiNode
//! (kube-env/up writes DIR/node.kubeconfig): a node registered reads back
//! with `node_of`; registering again with a new endpoint updates that one
//! Secret and drops the transfer address left out; with an owner pod the
//! Secret carries its ownerReference and goes when the pod is deleted; a
//! bad node name is refused with a clear error and writes nothing. Also:
//! `lamina node certificate` with no cert-manager installed is refused,
//! saying so. Also:
//! `lamina certs issue` into an existing empty directory (the chart's
//! emptyDir) works, and into one it filled before (the init container run
//! again in the same pod) replaces the certificate.

use crate::kube_env::{eventually, Env, NS};
use crate::LAMINA;
use k8s_openapi::api::core::v1::Secret;
use lamina_node_secrets::{node_of, NodeSpec};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// `lamina node register ARGS` as the node ServiceAccount.
fn register(env: &Env, args: &[&str]) -> Output {
    Command::new(LAMINA.bin())
        .args(["node", "register", "--namespace", NS])
        .args(args)
        .env("KUBECONFIG", env.dir.join("node.kubeconfig"))
        .env_remove("POD_NAMESPACE")
        .output()
        .unwrap()
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "lamina node register failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The Secret NAME in Lamina's namespace (as the admin), if it exists.
fn secret(env: &Env, name: &str) -> Option<Secret> {
    env.try_kubectl(&["-n", NS, "get", "secret", name])
        .then(|| serde_json::from_value(env.json(&["-n", NS, "get", "secret", name])).unwrap())
}

/// The names of the Secrets labelled lamina.io/node=NODE.
fn labelled(env: &Env, node: &str) -> Vec<String> {
    let v = env.json(&[
        "-n",
        NS,
        "get",
        "secrets",
        "-l",
        &format!("lamina.io/node={node}"),
    ]);
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn nodes_register_themselves_against_a_real_api_server() {
    if std::env::var_os("LAMINA_BIN").is_none() {
        // kube-env/up's daemons: the binary this test is built with
        std::env::set_var("LAMINA_BIN", LAMINA.bin());
    }
    let env = Env::up("register");
    let token = env.dir.join("node-token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let token = token.to_str().unwrap();

    // A node registers: Secret lamina-node-NODE, read back as that node.
    let said = ok(register(
        &env,
        &[
            "--node",
            "reg-a",
            "--endpoint",
            "http://10.1.0.1:7480",
            "--token-file",
            token,
            "--transfer-address",
            "10.1.0.1:7481",
        ],
    ));
    assert!(said.contains("lamina/lamina-node-reg-a"), "{said}");
    let s = secret(&env, "lamina-node-reg-a").expect("no Secret lamina-node-reg-a");
    let first_uid = s.metadata.uid.clone();
    assert_eq!(
        node_of(&s).unwrap(),
        (
            "reg-a".to_string(),
            NodeSpec {
                endpoint: "http://10.1.0.1:7480".into(),
                token: "s3cret".into(),
                transfer_address: Some("10.1.0.1:7481".into()),
            }
        )
    );
    assert_eq!(s.metadata.owner_references, None);

    // Again with a new endpoint and no transfer address: the same Secret,
    // updated, and the key left out is gone.
    ok(register(
        &env,
        &[
            "--node",
            "reg-a",
            "--endpoint",
            "http://10.1.0.9:7480",
            "--token-file",
            token,
        ],
    ));
    let s = secret(&env, "lamina-node-reg-a").unwrap();
    assert_eq!(s.metadata.uid, first_uid, "the Secret was made anew");
    let (_, spec) = node_of(&s).unwrap();
    assert_eq!(spec.endpoint, "http://10.1.0.9:7480");
    assert_eq!(spec.transfer_address, None);
    assert_eq!(labelled(&env, "reg-a"), ["lamina-node-reg-a"]);

    // Owned by a pod (a real one: no kubelet runs, so it stays Pending):
    // the ownerReference is on the Secret, and the garbage collector
    // deletes the Secret with the pod.
    env.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: reg-b-pod, namespace: {NS}}}\n\
         spec: {{serviceAccountName: lamina-node, automountServiceAccountToken: false, \
         containers: [{{name: c, image: lamina}}]}}\n"
    ));
    let uid = env.kubectl(&[
        "-n",
        NS,
        "get",
        "pod",
        "reg-b-pod",
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    ok(register(
        &env,
        &[
            "--node",
            "reg-b",
            "--endpoint",
            "http://10.1.0.2:7480",
            "--token-file",
            token,
            "--owner-pod",
            "reg-b-pod",
            "--owner-uid",
            &uid,
        ],
    ));
    let s = secret(&env, "lamina-node-reg-b").unwrap();
    let owners = s.metadata.owner_references.unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(
        (
            owners[0].kind.as_str(),
            owners[0].name.as_str(),
            &owners[0].uid
        ),
        ("Pod", "reg-b-pod", &uid)
    );
    env.kubectl(&["-n", NS, "delete", "pod", "reg-b-pod", "--wait=true"]);
    eventually("the owned Secret goes with its pod", LIMIT, || {
        secret(&env, "lamina-node-reg-b").is_none().then_some(())
    });
    assert!(secret(&env, "lamina-node-reg-a").is_some());

    // A bad node name: a clear error, and nothing written.
    for bad in ["Reg_C", "reg-c-"] {
        let out = register(
            &env,
            &[
                "--node",
                bad,
                "--endpoint",
                "http://10.1.0.3:7480",
                "--token-file",
                token,
            ],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad} was accepted");
        assert!(
            err.contains(&format!("node name {bad:?} cannot name a node Secret")),
            "{err}"
        );
    }
    let all = env.json(&["-n", NS, "get", "secrets", "-l", "lamina.io/node"]);
    let names: Vec<&str> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["metadata"]["name"].as_str().unwrap())
        .collect();
    assert!(
        !names.iter().any(|n| n.to_lowercase().contains("reg-c")),
        "{names:?}"
    );
    assert!(names.contains(&"lamina-node-reg-a"), "{names:?}");

    // `lamina node certificate` where cert-manager is not installed (no
    // Certificate resource): as the admin, an error that says so; as the
    // node ServiceAccount without the chart's certManager Role, the API
    // server's refusal, naming the Certificate. Nothing is written.
    let dir = tempfile::tempdir().unwrap();
    for (kubeconfig, says) in [
        (
            "kubeconfig",
            "serves no cert-manager.io/v1 Certificate: install cert-manager",
        ),
        (
            "node.kubeconfig",
            "applying Certificate lamina/lamina-transfer-reg-a",
        ),
    ] {
        let out = Command::new(LAMINA.bin())
            .args(["node", "certificate", "--node", "reg-a", "--issuer", "ca"])
            .args(["--namespace", NS, "--wait", "2s"])
            .arg(dir.path().join("tls"))
            .env("KUBECONFIG", env.dir.join(kubeconfig))
            .env_remove("POD_NAMESPACE")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{kubeconfig}: {err}"
        );
        assert!(!dir.path().join("tls").join("tls.key").exists());
    }
}

fn lamina(args: &[&str], out_dir: &Path) -> Output {
    Command::new(LAMINA.bin())
        .args(args)
        .arg(out_dir)
        .output()
        .unwrap()
}

#[test]
fn certs_issue_fills_an_existing_empty_directory_and_replaces_its_own_files() {
    let d = tempfile::tempdir().unwrap();
    let ca = d.path().join("ca");
    let out = lamina(&["certs", "create-ca"], &ca);
    assert!(out.status.success(), "{out:?}");
    let ca = ca.to_str().unwrap();
    // an emptyDir volume: the directory exists and is empty
    let tls = d.path().join("tls");
    std::fs::create_dir(&tls).unwrap();
    let out = lamina(&["certs", "issue", "--ca", ca, "--node", "n1"], &tls);
    assert!(out.status.success(), "{out:?}");
    let first = std::fs::read(tls.join("tls.crt")).unwrap();
    for f in ["ca.crt", "tls.crt", "tls.key"] {
        assert!(tls.join(f).is_file(), "no {f}");
    }
    // the init container run again in the same pod (a sandbox restart
    // keeps the emptyDir): a fresh certificate replaces the old one
    let out = lamina(&["certs", "issue", "--ca", ca, "--node", "n1"], &tls);
    assert!(out.status.success(), "{out:?}");
    assert_ne!(std::fs::read(tls.join("tls.crt")).unwrap(), first);
}
