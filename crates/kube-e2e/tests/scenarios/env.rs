//! The running environment as the scenarios see it: kubectl (the one
//! kube-env/build made) with the admin kubeconfig, the `lamina` command on
//! the daemon's TCP API, NBD reads and writes through qemu-io, and waiting
//! on a condition with a deadline.

use anyhow::{anyhow, bail, ensure, Context, Result};
use serde_json::Value;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const DRIVER: &str = "lamina.csi.io";
/// The node id kube-env/up gives the controller (its storage node).
pub const NODE_ID: &str = "kube-env-node";
/// The driver's topology key.
pub const TOPOLOGY_KEY: &str = "topology.lamina.io/node";
/// The second storage node (KUBE_ENV_NODES=2).
pub const NODE_2: &str = "kube-env-node-2";
/// The third storage node (KUBE_ENV_NODES=3).
pub const NODE_3: &str = "kube-env-node-3";

/// The environment; `endpoint`, `token` and `lamina_data` are node 1's
/// daemon's (see [`Env::on_node_2`]).
#[derive(Clone)]
pub struct Env {
    pub dir: PathBuf,
    pub kubectl: PathBuf,
    pub kubeconfig: PathBuf,
    pub lamina: PathBuf,
    pub endpoint: String,
    pub token: String,
    pub lamina_data: PathBuf,
    /// Node 2's daemon (endpoint, token, data directory), if it runs.
    pub node_2: Option<(String, String, PathBuf)>,
    /// Node 3's, the same.
    pub node_3: Option<(String, String, PathBuf)>,
    /// Node 1's daemon, node plugin and keeper run in the chart's pods
    /// (KUBE_ENV_NODE_POD=1); `endpoint` is then the first pod's address.
    pub node_pod: bool,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Run a command to its end; its stdout, or an error with both outputs.
pub fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Env {
    /// Build what is needed, start kube-env in `dir`, and read DIR/env.
    pub fn up(dir: &Path) -> Result<Env> {
        Env::up_with(dir, false)
    }

    /// The same with Lamina's node side in the chart's pods: the image of
    /// the `lamina` under test made by deploy/image/build (DIR/lamina.oci.tar),
    /// and kube-env/up with a kubelet, one storage node and
    /// KUBE_ENV_NODE_POD=1.
    pub fn up_node_pod(dir: &Path) -> Result<Env> {
        Env::up_with(dir, true)
    }

    fn up_with(dir: &Path, node_pod: bool) -> Result<Env> {
        let root = repo_root();
        let lamina = match std::env::var_os("LAMINA_BIN") {
            Some(p) => PathBuf::from(p),
            // The outer cargo has released the build directory by now.
            None => lamina_test_support::Lamina::built().bin().to_path_buf(),
        };
        let mut up = Command::new(root.join("kube-env/up"));
        up.arg(dir).env("LAMINA_BIN", &lamina).stdin(Stdio::null());
        if node_pod {
            let image = dir.join("lamina.oci.tar");
            let built = Command::new(root.join("deploy/image/build"))
                .arg("--binary")
                .arg(&lamina)
                .arg("--out")
                .arg(&image)
                .stdin(Stdio::null())
                .status()
                .context("run deploy/image/build")?;
            if !built.success() {
                bail!("deploy/image/build failed ({built}): its output is above");
            }
            up.env("KUBE_ENV_KUBELET", "1")
                .env("KUBE_ENV_NODES", "1")
                .env("KUBE_ENV_NODE_POD", "1")
                .env("LAMINA_IMAGE", &image);
        }
        let up = up.status().context("run kube-env/up")?;
        if !up.success() {
            bail!(
                "kube-env/up {} failed ({up}): its output is above",
                dir.display()
            );
        }
        let vars = read_env_file(&dir.join("env"))?;
        let get = |k: &str| {
            vars.get(k)
                .cloned()
                .ok_or_else(|| anyhow!("{k} missing from DIR/env"))
        };
        Ok(Env {
            dir: dir.to_path_buf(),
            kubectl: PathBuf::from(get("KUBE_ENV_BIN")?).join("kubectl"),
            kubeconfig: get("KUBECONFIG")?.into(),
            lamina,
            endpoint: get("LAMINA_ENDPOINT")?,
            token: get("LAMINA_TOKEN")?,
            lamina_data: get("LAMINA_DATA_DIR")?.into(),
            node_2: match (
                get("LAMINA_ENDPOINT_2"),
                get("LAMINA_TOKEN_2"),
                get("LAMINA_DATA_DIR_2"),
            ) {
                (Ok(e), Ok(t), Ok(d)) => Some((e, t, d.into())),
                _ => None,
            },
            node_3: match (
                get("LAMINA_ENDPOINT_3"),
                get("LAMINA_TOKEN_3"),
                get("LAMINA_DATA_DIR_3"),
            ) {
                (Ok(e), Ok(t), Ok(d)) => Some((e, t, d.into())),
                _ => None,
            },
            node_pod,
        })
    }

    /// The same environment, with `lamina` (and so attach, patterns) on
    /// node 2's daemon; an error when only one node runs.
    pub fn on_node_2(&self) -> Result<Env> {
        self.on(self.node_2.clone(), "2")
    }

    /// The same on node 3's daemon; an error unless three nodes run.
    pub fn on_node_3(&self) -> Result<Env> {
        self.on(self.node_3.clone(), "3")
    }

    fn on(&self, node: Option<(String, String, PathBuf)>, n: &str) -> Result<Env> {
        let (endpoint, token, data) = node.with_context(|| {
            format!(
                "no node {n} runs (kube-env/up with KUBE_ENV_NODES={n} starts {n} storage nodes)"
            )
        })?;
        Ok(Env {
            endpoint,
            token,
            lamina_data: data,
            node_2: None,
            node_3: None,
            ..self.clone()
        })
    }

    pub fn down(&self) -> Result<()> {
        down(&self.dir)
    }

    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        run(Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args))
    }

    pub fn kubectl_json(&self, args: &[&str]) -> Result<Value> {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let out = self.kubectl(&a)?;
        serde_json::from_str(&out)
            .with_context(|| format!("kubectl {args:?} printed no JSON: {out}"))
    }

    /// `kubectl get KIND NAME -n NS -o json`, or None when it does not exist.
    pub fn get(&self, ns: &str, kind: &str, name: &str) -> Result<Option<Value>> {
        let mut a = vec!["get", kind, name, "--ignore-not-found"];
        if !ns.is_empty() {
            a.extend(["-n", ns]);
        }
        let out = self.kubectl(&[a.as_slice(), &["-o", "json"]].concat())?;
        if out.trim().is_empty() {
            return Ok(None);
        }
        Ok(Some(serde_json::from_str(&out)?))
    }

    /// Key `key` of Secret `ns/name`, decoded (by coreutils' base64).
    pub fn secret_value(&self, ns: &str, name: &str, key: &str) -> Result<Vec<u8>> {
        let escaped = key.replace('.', "\\.");
        let b64 = self.kubectl(&[
            "get",
            "secret",
            "-n",
            ns,
            name,
            "-o",
            &format!("jsonpath={{.data.{escaped}}}"),
        ])?;
        let out = Command::new("base64")
            .arg("-d")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().unwrap().write_all(b64.trim().as_bytes())?;
                c.wait_with_output()
            })?;
        ensure!(
            out.status.success(),
            "Secret {ns}/{name} key {key} is not base64"
        );
        Ok(out.stdout)
    }

    /// `kubectl apply -f -` of a YAML or JSON document (several with `---`).
    pub fn apply(&self, doc: &str) -> Result<()> {
        self.stdin_cmd(&["apply", "-f", "-"], doc)
    }

    pub fn create(&self, doc: &str) -> Result<()> {
        self.stdin_cmd(&["create", "-f", "-"], doc)
    }

    fn stdin_cmd(&self, args: &[&str], doc: &str) -> Result<()> {
        let mut child = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("run kubectl")?;
        child
            .stdin
            .take()
            .context("kubectl stdin")?
            .write_all(doc.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "kubectl {args:?} failed: {}\n{doc}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    pub fn namespace(&self, ns: &str) -> Result<()> {
        self.apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n"
        ))
    }

    /// The `lamina` command on the environment's daemon.
    pub fn lamina(&self, args: &[&str]) -> Result<String> {
        // The token by environment, so that it stays out of error messages.
        run(Command::new(&self.lamina)
            .args(["--endpoint", &self.endpoint])
            .env("LAMINA_TOKEN", &self.token)
            .args(args))
    }

    pub fn lamina_json(&self, args: &[&str]) -> Result<Value> {
        let out = self.lamina(&[args, &["-o", "json"]].concat())?;
        serde_json::from_str(&out)
            .with_context(|| format!("lamina {args:?} printed no JSON: {out}"))
    }

    /// Export a volume over NBD; its URI.
    pub fn attach_volume(&self, volume: &str) -> Result<String> {
        uri(&self.lamina_json(&["volume", "attach", volume])?)
    }

    pub fn detach_volume(&self, volume: &str) -> Result<()> {
        self.lamina(&["volume", "detach", volume]).map(drop)
    }

    /// Write byte `pattern` over the first `len` bytes of a volume.
    pub fn write_pattern(&self, volume: &str, pattern: u8, len: &str) -> Result<()> {
        let uri = self.attach_volume(volume)?;
        qemu_io(&uri, &format!("write -P {pattern:#x} 0 {len}"))?;
        self.detach_volume(volume)
    }

    /// Check that the first `len` bytes of a volume all hold `pattern`.
    pub fn check_pattern(&self, volume: &str, pattern: u8, len: &str) -> Result<()> {
        let uri = self.attach_volume(volume)?;
        let r = qemu_io(&uri, &format!("read -P {pattern:#x} 0 {len}"))
            .with_context(|| format!("volume {volume} does not hold {pattern:#x} over {len}"));
        self.detach_volume(volume)?;
        r.map(drop)
    }

    /// DIR/pids/COMPONENT.pid, as kube-env/up wrote it.
    pub fn pid_file(&self, component: &str) -> PathBuf {
        self.dir.join("pids").join(format!("{component}.pid"))
    }

    /// The lines of the sidecars' and Lamina's controllers' logs that say
    /// a request was forbidden.
    pub fn forbidden(&self) -> Result<Vec<String>> {
        let mut lines = Vec::new();
        let components = [
            "csi-provisioner",
            "csi-snapshotter",
            "csi-resizer",
            "lamina-operator-1",
            "lamina-operator-2",
            "schedule-controller",
        ];
        for c in components {
            let path = self.log_file(c);
            // the schedule controller runs only when its scenario does
            if c == "schedule-controller" && !path.exists() {
                continue;
            }
            // In the chart's pods (node_pod) the sidecars run in the
            // controller pod and Lamina's controllers in the operator pods:
            // their containers' logs now.
            let text = match (self.node_pod, c) {
                (true, "lamina-operator-2") => continue,
                (true, "lamina-operator-1") => self.kubectl(&[
                    "-n",
                    "lamina",
                    "logs",
                    "-l",
                    "app.kubernetes.io/component=operator",
                    "--prefix",
                    "--tail=-1",
                ])?,
                (true, c) if c.starts_with("csi-") => self.kubectl(&[
                    "-n",
                    "lamina",
                    "logs",
                    "deployment/lamina-controller",
                    "-c",
                    c,
                ])?,
                _ => std::fs::read_to_string(path)?,
            };
            lines.extend(
                text.lines()
                    .filter(|l| l.contains("forbidden"))
                    .map(|l| format!("{c}: {l}")),
            );
        }
        Ok(lines)
    }

    /// DIR/logs/COMPONENT.log.
    pub fn log_file(&self, component: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{component}.log"))
    }

    /// Stop a component kube-env started (`lamina`, the daemon;
    /// `lamina-csi-node`, the node plugin) with `signal`, wait until every
    /// thread of it is gone, and start it again with the same command line
    /// and environment (read from /proc before the signal), its output
    /// appended to its log and its pid file updated so that kube-env/down
    /// stops the new one. Returns once the daemon answers again, or the
    /// plugin's socket is back.
    pub fn restart(&self, component: &str, signal: i32) -> Result<()> {
        self.stop(component, signal)?.start()
    }

    /// The first half of [`Env::restart`]: `component` stopped with
    /// `signal`, every thread of it gone; [`Stopped::start`] starts it
    /// again.
    pub fn stop(&self, component: &str, signal: i32) -> Result<Stopped<'_>> {
        let pid_file = self.pid_file(component);
        let pid: i32 = std::fs::read_to_string(&pid_file)?.trim().parse()?;
        let nul_split = |b: Vec<u8>| -> Vec<String> {
            b.split(|c| *c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        };
        let argv = nul_split(std::fs::read(format!("/proc/{pid}/cmdline"))?);
        let environ = nul_split(std::fs::read(format!("/proc/{pid}/environ"))?);
        ensure_cmd(&argv, component)?;
        // SAFETY: kill(2) of a pid kube-env wrote for this component.
        if unsafe { libc::kill(pid, signal) } != 0 {
            bail!("kill -{signal} {pid}: {}", std::io::Error::last_os_error());
        }
        // A killed process is a zombie at once, but its other threads (one
        // may be inside a long write or fdatasync) hold its files, the pool
        // lock and its sockets until they have exited too; started before
        // then, a daemon meets a socket that still accepts and refuses to
        // start.
        wait(
            &format!("{component} ({pid}) to exit"),
            Duration::from_secs(60),
            |last| {
                let exited = gone(pid);
                *last = format!("process exited: {exited}");
                Ok(exited.then_some(()))
            },
        )?;
        Ok(Stopped {
            env: self,
            component: component.to_string(),
            argv,
            environ,
        })
    }
}

impl Env {
    /// `component`'s whole process group stopped (SIGSTOP): to whoever
    /// talks to it, a link that answers nothing. [`Paused::resume`]
    /// continues it, and so does dropping it.
    pub fn pause(&self, component: &str) -> Result<Paused> {
        let pid: i32 = std::fs::read_to_string(self.pid_file(component))?
            .trim()
            .parse()?;
        // SAFETY: kill(2) of the process group kube-env started for this
        // component (setsid: it leads its group).
        if unsafe { libc::kill(-pid, libc::SIGSTOP) } != 0 {
            bail!("kill -STOP -{pid}: {}", std::io::Error::last_os_error());
        }
        Ok(Paused { group: pid })
    }
}

/// A component [`Env::pause`] stopped.
pub struct Paused {
    group: i32,
}

impl Paused {
    pub fn resume(self) -> Result<()> {
        // SAFETY: as in Env::pause.
        if unsafe { libc::kill(-self.group, libc::SIGCONT) } != 0 {
            bail!(
                "kill -CONT -{}: {}",
                self.group,
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        // SAFETY: as in Env::pause; resuming twice is harmless.
        unsafe { libc::kill(-self.group, libc::SIGCONT) };
    }
}

/// A component [`Env::stop`] stopped.
pub struct Stopped<'a> {
    env: &'a Env,
    component: String,
    argv: Vec<String>,
    environ: Vec<String>,
}

impl Stopped<'_> {
    /// Start it again with the same command line and environment (see
    /// [`Env::restart`]); returns once it answers.
    pub fn start(self) -> Result<()> {
        let Stopped {
            env: this,
            component,
            argv,
            environ,
        } = self;
        let component = component.as_str();
        let pid_file = this.pid_file(component);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(this.log_file(component))?;
        let child = Command::new("setsid")
            .args(&argv)
            .env_clear()
            .envs(environ.iter().filter_map(|kv| kv.split_once('=')))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("restart {component}"))?;
        std::fs::write(&pid_file, format!("{}\n", child.id()))?;
        // The child is reaped by nobody but us: leave it to kube-env/down.
        std::mem::forget(child);
        let t = Duration::from_secs(60);
        match argv.get(1).map(String::as_str) {
            Some("serve") => wait("the restarted daemon to answer", t, |_| {
                Ok(this.lamina(&["status"]).ok().map(drop))
            })?,
            _ => {
                let socket = argv
                    .iter()
                    .find_map(|a| a.strip_prefix("unix://"))
                    .map(PathBuf::from);
                wait(&format!("{component} to listen again"), t, |last| {
                    *last = format!("socket {socket:?}");
                    Ok(socket
                        .as_ref()
                        .is_none_or(|s| std::os::unix::net::UnixStream::connect(s).is_ok())
                        .then_some(()))
                })?
            }
        }
        Ok(())
    }
}

/// A component's command line: `lamina SUBCOMMAND ...`.
fn ensure_cmd(argv: &[String], component: &str) -> Result<()> {
    if argv.len() < 2 || !argv[0].ends_with("lamina") {
        bail!("{component} does not run a lamina command: {argv:?}");
    }
    Ok(())
}

/// The process is gone, or a zombie none of whose threads still runs (a
/// zombie leader lists its live threads under /proc/PID/task).
fn gone(pid: i32) -> bool {
    let zombie = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => return true,
        Ok(s) => s
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    };
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0);
    zombie && threads <= 1
}

fn uri(v: &Value) -> Result<String> {
    v["uri"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("no uri in {v}"))
}

/// qemu-io reports some failures on stdout with exit code 0: look for them.
pub fn qemu_io(uri: &str, cmd: &str) -> Result<String> {
    let out = run(Command::new("qemu-io").args(["-f", "raw", uri, "-c", cmd]))?;
    if out.contains("failed") || out.contains("error") || out.contains("Pattern verification") {
        bail!("qemu-io {cmd:?} on {uri}: {out}");
    }
    Ok(out)
}

/// Fill the NBD export at `uri` with `size` (e.g. `1G`) of non-zero data:
/// nbdkit's pattern plugin, each 8 bytes their offset.
pub fn fill_pattern(uri: &str, size: &str) -> Result<()> {
    let size = format!("size={size}");
    run(Command::new("nbdcopy").args([
        "--",
        "[",
        "nbdkit",
        "--exit-with-parent",
        "pattern",
        &size,
        "]",
        uri,
    ]))
    .map(drop)
    .with_context(|| format!("fill {uri} with nbdcopy"))
}

/// kube-env/down DIR.
pub fn down(dir: &Path) -> Result<()> {
    run(Command::new(repo_root().join("kube-env/down")).arg(dir)).map(drop)
}

/// DIR/env: `export K=V` lines.
fn read_env_file(path: &Path) -> Result<HashMap<String, String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// Call `probe` until it gives `Some`, for at most `limit`; the error names
/// `what` and the last thing `probe` saw (its error, or the state it
/// reported through `last`).
pub fn wait<T>(
    what: &str,
    limit: Duration,
    probe: impl FnMut(&mut String) -> Result<Option<T>>,
) -> Result<T> {
    wait_every(what, limit, Duration::from_millis(100), probe)
}

/// [`wait`], looking every `every` (for probes that cost the API server).
pub fn wait_every<T>(
    what: &str,
    limit: Duration,
    every: Duration,
    mut probe: impl FnMut(&mut String) -> Result<Option<T>>,
) -> Result<T> {
    let deadline = Instant::now() + limit;
    let mut last = String::new();
    loop {
        match probe(&mut last) {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if Instant::now() >= deadline {
            bail!("gave up after {limit:?} waiting for {what}; last seen: {last}");
        }
        std::thread::sleep(every);
    }
}

/// A PVC of class `class` and `size`, optionally from a data source.
pub fn pvc(ns: &str, name: &str, class: &str, size: &str, source: Option<(&str, &str)>) -> String {
    let source = match source {
        Some((kind, src)) => {
            let group = if kind == "VolumeSnapshot" {
                "apiGroup: snapshot.storage.k8s.io, "
            } else {
                ""
            };
            format!("  dataSource: {{{group}kind: {kind}, name: {src}}}\n")
        }
        None => String::new(),
    };
    format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  \
         accessModes: [ReadWriteOnce]\n  storageClassName: {class}\n  resources: {{requests: {{storage: {size}}}}}\n{source}"
    )
}

pub fn volume_snapshot(ns: &str, name: &str, pvc: &str, class: &str) -> String {
    format!(
        "apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshot\nmetadata: {{name: {name}, namespace: {ns}}}\n\
         spec:\n  volumeSnapshotClassName: {class}\n  source: {{persistentVolumeClaimName: {pvc}}}\n"
    )
}

impl Env {
    /// Wait until a PVC is Bound; the name of its PV (= the Lamina volume).
    pub fn wait_bound(&self, ns: &str, pvc: &str, limit: Duration) -> Result<String> {
        wait(&format!("PVC {ns}/{pvc} to bind"), limit, |last| {
            let Some(p) = self.get(ns, "pvc", pvc)? else {
                return Ok(None);
            };
            *last = format!("phase {}", p["status"]["phase"]);
            if p["status"]["phase"] == "Bound" {
                return Ok(p["spec"]["volumeName"].as_str().map(str::to_string));
            }
            Ok(None)
        })
        .with_context(|| self.events(ns, pvc))
    }

    /// Wait until a VolumeSnapshot is readyToUse; its object.
    pub fn wait_snapshot_ready(&self, ns: &str, name: &str, limit: Duration) -> Result<Value> {
        wait(
            &format!("VolumeSnapshot {ns}/{name} to be readyToUse"),
            limit,
            |last| {
                let Some(s) = self.get(ns, "volumesnapshot", name)? else {
                    return Ok(None);
                };
                *last = format!("status {}", s["status"]);
                Ok((s["status"]["readyToUse"] == true).then_some(s))
            },
        )
        .with_context(|| self.events(ns, name))
    }

    /// Wait until an object is gone.
    pub fn wait_gone(&self, ns: &str, kind: &str, name: &str, limit: Duration) -> Result<()> {
        wait(&format!("{kind} {ns}/{name} to be gone"), limit, |_| {
            Ok(self.get(ns, kind, name)?.is_none().then_some(()))
        })
    }

    /// The events about an object, one a line (context for a failure).
    pub fn events(&self, ns: &str, name: &str) -> String {
        self.events_json(ns, name)
            .map(|evs| {
                let lines: Vec<String> = evs
                    .iter()
                    .map(|e| {
                        format!(
                            "{} {} {} (x{}, last {}): {}",
                            e["type"],
                            e["reason"],
                            e["source"]["component"],
                            e["count"],
                            e["lastTimestamp"],
                            e["message"]
                        )
                    })
                    .collect();
                format!("events of {ns}/{name}:\n{}", lines.join("\n"))
            })
            .unwrap_or_else(|e| format!("no events of {ns}/{name}: {e:#}"))
    }

    pub fn events_json(&self, ns: &str, name: &str) -> Result<Vec<Value>> {
        let sel = format!("involvedObject.name={name}");
        let v = self.kubectl_json(&["get", "events", "-n", ns, "--field-selector", &sel])?;
        Ok(v["items"].as_array().cloned().unwrap_or_default())
    }

    /// The engine snapshot behind a bound VolumeSnapshot: (volume, snapshot)
    /// from its content's snapshotHandle `[NODE:]VOLUME/SNAPSHOT@ID`.
    pub fn engine_snapshot(&self, ns: &str, vs: &str) -> Result<(String, String, String)> {
        let s = self
            .get(ns, "volumesnapshot", vs)?
            .context("no VolumeSnapshot")?;
        let content = s["status"]["boundVolumeSnapshotContentName"]
            .as_str()
            .context("not bound to a content")?;
        let c = self
            .get("", "volumesnapshotcontent", content)?
            .context("no VolumeSnapshotContent")?;
        let handle = c["status"]["snapshotHandle"]
            .as_str()
            .context("content has no snapshotHandle")?;
        let path = handle.split_once(':').map_or(handle, |(_, p)| p);
        let (vol, rest) = path
            .split_once('/')
            .with_context(|| format!("handle {handle}"))?;
        let (snap, _) = rest
            .split_once('@')
            .with_context(|| format!("handle {handle}"))?;
        Ok((vol.to_string(), snap.to_string(), handle.to_string()))
    }

    /// `lamina snapshot list` as (volume, name) pairs.
    pub fn engine_snapshots(&self) -> Result<Vec<(String, String)>> {
        let v = self.lamina_json(&["snapshot", "list"])?;
        let items = v
            .as_array()
            .or_else(|| v["snapshots"].as_array())
            .cloned()
            .unwrap_or_default();
        Ok(items
            .iter()
            .map(|s| {
                (
                    s["volume"].as_str().unwrap_or_default().to_string(),
                    s["name"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect())
    }
}
