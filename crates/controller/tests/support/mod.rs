//! A real Kubernetes control plane for the controller's tests: the kube-env
//! scripts (`LAMINA_KUBE_ENV_SCRIPTS`, default `<repo>/kube-env`) start
//! etcd, kube-apiserver and the rest on loopback with a `lamina serve`, and
//! install the chart's CRDs, the operator's ServiceAccount and Role and the
//! node Secret (`KUBE_ENV_CONTROLLERS=0`: no controller of theirs); this
//! module starts and kills `lamina controller` processes under that
//! ServiceAccount, and runs kubectl.
//! An environment that cannot start fails the test with the scripts' output.

#![allow(dead_code)]

use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const NS: &str = "lamina";
pub const NODE: &str = "kube-env-node";

pub struct Env {
    pub dir: PathBuf,
    scripts: PathBuf,
    pub vars: HashMap<String, String>,
    pub lamina: PathBuf,
    controllers: Vec<(String, Child)>,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The `lamina` binary: LAMINA_BIN, else the one test-support has cargo
/// build (with the test flags).
fn lamina_bin() -> PathBuf {
    if let Some(b) = std::env::var_os("LAMINA_BIN") {
        return PathBuf::from(b);
    }
    lamina_test_support::Lamina::built().bin().to_path_buf()
}

impl Env {
    pub fn up(name: &str) -> Env {
        let scripts = std::env::var_os("LAMINA_KUBE_ENV_SCRIPTS")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo().join("kube-env"));
        assert!(
            scripts.join("up").is_file(),
            "no kube-env scripts at {} (set LAMINA_KUBE_ENV_SCRIPTS to the directory holding up and down)",
            scripts.display()
        );
        let lamina = lamina_bin();
        let dir = std::env::temp_dir().join(format!("lamina-ctl-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new(scripts.join("up"))
            .arg(&dir)
            .env("LAMINA_BIN", &lamina)
            // up installs the CRDs (the chart's file), the operator's
            // ServiceAccount and Role, and the node Secret; the tests start
            // and kill their own controllers
            .env("KUBE_ENV_CONTROLLERS", "0")
            .output()
            .expect("running kube-env/up");
        if !out.status.success() {
            let _ = Command::new(scripts.join("down")).arg(&dir).status();
            panic!(
                "the Kubernetes test environment did not start ({}/up {}):\n{}\n{}",
                scripts.display(),
                dir.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let mut vars = HashMap::new();
        for line in std::fs::read_to_string(dir.join("env")).unwrap().lines() {
            if let Some((k, v)) = line.strip_prefix("export ").and_then(|l| l.split_once('=')) {
                vars.insert(k.to_string(), v.to_string());
            }
        }
        Env {
            dir,
            scripts,
            vars,
            lamina,
            controllers: Vec::new(),
        }
    }

    pub fn var(&self, k: &str) -> &str {
        self.vars
            .get(k)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("kube-env's env file lacks {k}"))
    }

    pub fn client(&self) -> lamina_client::Client {
        lamina_client::Client::tcp(self.var("LAMINA_ENDPOINT"), Some(self.var("LAMINA_TOKEN")))
            .unwrap()
    }

    fn kubectl_cmd(&self) -> Command {
        let mut c = Command::new(Path::new(self.var("KUBE_ENV_BIN")).join("kubectl"));
        c.arg("--kubeconfig").arg(self.dir.join("kubeconfig"));
        c
    }

    /// kubectl ARGS, which must succeed; its stdout.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = self.kubectl_cmd().args(args).output().unwrap();
        assert!(
            out.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// kubectl ARGS; whether it succeeded.
    pub fn try_kubectl(&self, args: &[&str]) -> bool {
        self.kubectl_cmd()
            .args(args)
            .output()
            .unwrap()
            .status
            .success()
    }

    /// kubectl apply -f - of `yaml`.
    pub fn apply(&self, yaml: &str) {
        let (ok, err) = self.try_apply(yaml);
        assert!(ok, "kubectl apply:\n{yaml}\n{err}");
    }

    /// kubectl apply -f - of `yaml`: whether it succeeded, and its stderr.
    pub fn try_apply(&self, yaml: &str) -> (bool, String) {
        use std::io::Write;
        let mut c = self
            .kubectl_cmd()
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(yaml.as_bytes()).unwrap();
        let out = c.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&a)).unwrap()
    }

    /// The Lamina resources of a kind (snapshots.lamina.io...) in NS.
    pub fn items(&self, kind: &str) -> Vec<Value> {
        self.json(&["-n", NS, "get", kind])["items"]
            .as_array()
            .unwrap()
            .clone()
    }

    /// Start `lamina controller` as `identity` (logs in DIR/logs).
    pub fn start_controller(&mut self, identity: &str, metrics_port: u16) {
        let log = std::fs::File::create(self.dir.join(format!("logs/controller-{identity}.log")))
            .unwrap();
        let child = Command::new(&self.lamina)
            .args([
                "controller",
                "--namespace",
                NS,
                "--identity",
                identity,
                "--lease-duration",
                "6s",
                "--metrics-listen",
                &format!("127.0.0.1:{metrics_port}"),
            ])
            // the chart's ServiceAccount and Role, as kube-env/up made them
            .env("KUBECONFIG", self.dir.join("operator.kubeconfig"))
            .env("LAMINA_LOG", "info,kube=warn")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.controllers.push((identity.to_string(), child));
    }

    /// SIGKILL a controller.
    pub fn kill_controller(&mut self, identity: &str) {
        let i = self
            .controllers
            .iter()
            .position(|(n, _)| n == identity)
            .unwrap();
        let (_, mut c) = self.controllers.remove(i);
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// Whether a controller process is still running.
    pub fn controller_running(&mut self, identity: &str) -> bool {
        let c = self
            .controllers
            .iter_mut()
            .find(|(n, _)| n == identity)
            .unwrap();
        c.1.try_wait().unwrap().is_none()
    }

    pub fn lease_holder(&self) -> String {
        self.kubectl(&[
            "-n",
            NS,
            "get",
            "lease",
            "lamina-controller",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])
    }

    /// Events in NS about object `name` with `reason`: their messages.
    pub fn events(&self, name: &str, reason: &str) -> Vec<String> {
        let v = self.json(&["-n", NS, "get", "events.events.k8s.io"]);
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["regarding"]["name"] == name && e["reason"] == reason)
            .map(|e| e["note"].as_str().unwrap_or_default().to_string())
            .collect()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for (_, c) in &mut self.controllers {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new(self.scripts.join("down"))
            .arg(&self.dir)
            .status();
        if std::thread::panicking() {
            eprintln!(
                "the environment's logs are kept in {}/logs",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Poll `f` until it gives a value; panics with `what` after `limit` (a
/// safety net against hanging, not a measurement).
pub fn eventually<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t.elapsed() < limit, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
