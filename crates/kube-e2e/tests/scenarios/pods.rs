//! Real pods on kube-env's kubelet (KUBE_ENV_KUBELET=1): the node path as
//! a cluster runs it. The kubelet stages and publishes through Lamina's
//! node plugin, registered with it by kube-env's registrar; kube-scheduler
//! places the pods; images are kube-env's own (kube-env/kubelet.sh).
//! The scenarios: p. write, restore, read (below); q. first consumer,
//! group, clone; r. frozen snapshots of a filesystem in use; s. I/O
//! through a node plugin crash, a daemon upgrade and online growth, and
//! the volume's loop device detached at the end all the same.
//!
//! p. A pod writes files through an ext4 PVC; a VolumeSnapshot of it is
//! restored into a PVC that a second pod, placed by the scheduler, reads
//! and checks. A pod writes a Block PVC, and the Lamina volume holds what
//! it wrote. Once the pods are gone, the kubelet has unpublished and
//! unstaged every volume: no export is left attached.

use crate::env::{pvc, run, volume_snapshot, wait, Env, NODE_ID};
use anyhow::{ensure, Context, Result};
use std::process::Command;
use std::time::Duration;

const T: Duration = Duration::from_secs(90);
/// The busybox image kube-env imports (the e2e framework's name for it).
const BUSYBOX: &str = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2";

/// A pod that runs `script` once in busybox with PVC `claim` as a
/// filesystem at /data, or with `block` as a raw device at /dev/xvda.
fn pod(ns: &str, name: &str, claim: &str, block: bool, script: &str) -> String {
    let at = if block { "/dev/xvda" } else { "/data" };
    pod_on(ns, name, &[(claim, at, block)], script)
}

/// A pod that runs `script` once in busybox with each `(claim, path,
/// block)`: the PVC as a filesystem mounted at the path, or as a raw
/// device there.
fn pod_on(ns: &str, name: &str, claims: &[(&str, &str, bool)], script: &str) -> String {
    let (mut mounts, mut devices, mut volumes) = (Vec::new(), Vec::new(), String::new());
    for (i, (claim, at, block)) in claims.iter().enumerate() {
        if *block {
            devices.push(format!("{{name: v{i}, devicePath: {at}}}"));
        } else {
            mounts.push(format!("{{name: v{i}, mountPath: {at}}}"));
        }
        volumes.push_str(&format!(
            "  - {{name: v{i}, persistentVolumeClaim: {{claimName: {claim}}}}}\n"
        ));
    }
    let script = serde_json::to_string(script).expect("a string encodes");
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  \
         restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n  containers:\n  \
         - name: c\n    image: {BUSYBOX}\n    imagePullPolicy: Never\n    \
         command: [/bin/sh, -c, {script}]\n    \
         volumeMounts: [{}]\n    volumeDevices: [{}]\n  volumes:\n{volumes}",
        mounts.join(", "),
        devices.join(", ")
    )
}

impl Env {
    /// Wait until a pod has run to success; a failed pod is an error with
    /// its log and its events.
    fn wait_pod_succeeded(&self, ns: &str, name: &str) -> Result<()> {
        let r = wait(&format!("pod {ns}/{name} to succeed"), T, |last| {
            let Some(p) = self.get(ns, "pod", name)? else {
                return Ok(None);
            };
            let phase = p["status"]["phase"].as_str().unwrap_or("").to_string();
            *last = format!("phase {phase:?}, status {}", p["status"]);
            match phase.as_str() {
                "Succeeded" => Ok(Some(Ok(()))),
                "Failed" => Ok(Some(Err(anyhow::anyhow!(
                    "the pod failed: {}",
                    p["status"]["containerStatuses"]
                )))),
                _ => Ok(None),
            }
        })
        .and_then(|r| r);
        r.with_context(|| {
            let log = self
                .kubectl(&["logs", "-n", ns, name])
                .unwrap_or_else(|e| format!("(no log: {e:#})"));
            format!("its log:\n{log}\nits events:\n{}", self.events(ns, name))
        })
    }

    /// KUBE_ENV_NODE_POD=1: the chart's node pods, as kubectl's `-o output`.
    fn node_pods(&self, output: &str) -> Result<String> {
        self.kubectl(&[
            "-n",
            "lamina",
            "get",
            "pod",
            "-l",
            "app.kubernetes.io/component=node",
            "-o",
            output,
        ])
    }

    /// KUBE_ENV_NODE_POD=1: the node pod's name.
    fn node_pod_name(&self) -> Result<String> {
        let name = self.node_pods("jsonpath={.items[*].metadata.name}")?;
        let names: Vec<&str> = name.split_whitespace().collect();
        ensure!(names.len() == 1, "not one node pod: {names:?}");
        Ok(names[0].to_string())
    }

    /// KUBE_ENV_NODE_POD=1: the node plugin's container crashes (its
    /// process, found on the host by its command line, gets SIGKILL) and
    /// the kubelet starts it again; returns once it is ready again.
    fn crash_node_plugin_container(&self) -> Result<()> {
        let pod = self.node_pod_name()?;
        let restarts = || -> Result<(u64, bool)> {
            let p = self
                .get("lamina", "pod", &pod)?
                .context("the node pod vanished")?;
            let statuses = p["status"]["containerStatuses"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let c = statuses
                .iter()
                .find(|c| c["name"] == "csi-node")
                .context("no csi-node container status")?;
            Ok((c["restartCount"].as_u64().unwrap_or(0), c["ready"] == true))
        };
        let (before, _) = restarts()?;
        let data_dir = format!("--data-dir={}", self.lamina_data.display());
        let mut killed = Vec::new();
        for entry in std::fs::read_dir("/proc")? {
            let entry = entry?;
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let argv: Vec<String> = cmdline
                .split(|c| *c == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            if argv.get(1).map(String::as_str) == Some("csi")
                && argv.iter().any(|a| a == "--mode=node")
                && argv.contains(&data_dir)
            {
                // SAFETY: kill(2) of the process whose command line is the
                // node pod's plugin (the chart's arguments).
                if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                    killed.push(pid);
                }
            }
        }
        ensure!(
            killed.len() == 1,
            "killed {killed:?}: not one node plugin process of the node pod"
        );
        wait(
            "the node plugin's container to be restarted and ready",
            T,
            |last| {
                let (n, ready) = restarts()?;
                *last = format!("restartCount {n} (was {before}), ready {ready}");
                Ok((n > before && ready).then_some(()))
            },
        )
    }

    /// KUBE_ENV_NODE_POD=1: a new image rolled out to the node pod as
    /// docs/kubernetes.md tells operators (the DaemonSet updates OnDelete):
    /// the same image under a new tag (kube-env has one build), set on the
    /// DaemonSet, then the pod deleted. Returns the new daemon's log once
    /// its pod is ready; the node Secret then gets the new pod's address,
    /// as a registering node pod writes it.
    fn roll_node_pod(&self) -> Result<String> {
        let old = self.node_pod_name()?;
        let image = self.kubectl(&[
            "-n",
            "lamina",
            "get",
            "daemonset",
            "lamina-node",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ])?;
        let next = format!("{}-next", image.trim());
        let ctr_socket = self.dir.join("containerd/containerd.sock");
        run(Command::new("ctr")
            .arg("--address")
            .arg(&ctr_socket)
            .args(["-n", "k8s.io", "images", "tag", "--force"])
            .arg(format!("docker.io/library/{}", image.trim()))
            .arg(format!("docker.io/library/{next}")))?;
        self.kubectl(&[
            "-n",
            "lamina",
            "set",
            "image",
            "daemonset/lamina-node",
            &format!("lamina={next}"),
            &format!("csi-node={next}"),
        ])?;
        self.kubectl(&[
            "-n",
            "lamina",
            "delete",
            "pod",
            &old,
            "--wait",
            "--timeout",
            "90s",
        ])?;
        let new = wait("a new node pod of the new image to be ready", T, |last| {
            let pods: serde_json::Value = serde_json::from_str(&self.node_pods("json")?)?;
            *last = pods["items"]
                .as_array()
                .map(|v| {
                    v.iter()
                        .map(|p| p["status"].to_string())
                        .collect::<Vec<_>>()
                        .join("\n")
                })
                .unwrap_or_default();
            Ok(pods["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find_map(|p| {
                    let ready = p["status"]["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True");
                    let of_next = p["spec"]["containers"][0]["image"] == next.as_str();
                    (ready && of_next && p["metadata"]["name"] != old.as_str()).then(|| {
                        (
                            p["metadata"]["name"].as_str().unwrap_or("").to_string(),
                            p["status"]["podIP"].as_str().unwrap_or("").to_string(),
                        )
                    })
                }))
        })?;
        let (pod, ip) = new;
        // The first pod's port (the chart's apiPort), at the new pod's address.
        let (_, port) = self
            .endpoint
            .rsplit_once(':')
            .with_context(|| format!("no port in {}", self.endpoint))?;
        self.kubectl(&[
            "-n",
            "lamina",
            "patch",
            "secret",
            "lamina-token",
            "-p",
            &format!(r#"{{"stringData": {{"endpoint": "http://{ip}:{port}"}}}}"#),
        ])?;
        self.kubectl(&["-n", "lamina", "logs", &pod, "-c", "lamina"])
    }

    /// Delete pods and wait until they are gone (their volumes unpublished).
    fn delete_pods(&self, ns: &str, names: &[&str]) -> Result<()> {
        let mut args = vec!["delete", "pod", "-n", ns, "--wait", "--timeout", "90s"];
        args.extend(names);
        self.kubectl(&args).map(drop)
    }
}

pub fn write_restore_read(env: &Env) -> Result<()> {
    let ns = "pods";
    env.namespace(ns)?;

    // A pod writes through the filesystem of an ext4 PVC.
    env.apply(&pvc(ns, "data", "lamina", "64Mi", None))?;
    env.wait_bound(ns, "data", T)?;
    env.apply(&pod(
        ns,
        "writer",
        "data",
        false,
        "set -e; echo written-by-a-pod > /data/note; \
         dd if=/dev/urandom of=/data/blob bs=64k count=64 2>/dev/null; \
         md5sum /data/blob > /data/blob.md5; sync",
    ))?;
    env.wait_pod_succeeded(ns, "writer")?;
    let node = env
        .get(ns, "pod", "writer")?
        .context("the writer pod vanished")?["spec"]["nodeName"]
        .as_str()
        .unwrap_or("")
        .to_string();
    ensure!(
        node == NODE_ID,
        "the scheduler placed the writer on {node:?}, not {NODE_ID}"
    );
    env.delete_pods(ns, &["writer"])?;

    // Its snapshot, restored into a new PVC that a second pod reads.
    env.apply(&volume_snapshot(ns, "snap", "data", "lamina"))?;
    env.wait_snapshot_ready(ns, "snap", T)?;
    env.apply(&pvc(
        ns,
        "restored",
        "lamina",
        "64Mi",
        Some(("VolumeSnapshot", "snap")),
    ))?;
    env.wait_bound(ns, "restored", T)?;
    env.apply(&pod(
        ns,
        "reader",
        "restored",
        false,
        "set -e; test \"$(cat /data/note)\" = written-by-a-pod; md5sum -c /data/blob.md5",
    ))?;
    env.wait_pod_succeeded(ns, "reader")?;
    env.delete_pods(ns, &["reader"])?;

    // A Block PVC: a pod writes its first MiB; the Lamina volume holds it.
    env.apply(&format!(
        "{}  volumeMode: Block\n",
        pvc(ns, "raw", "lamina", "64Mi", None)
    ))?;
    let raw = env.wait_bound(ns, "raw", T)?;
    env.apply(&pod(
        ns,
        "block-writer",
        "raw",
        true,
        "set -e; head -c 1048576 /dev/zero | tr '\\000' '\\253' > /dev/xvda; sync",
    ))?;
    env.wait_pod_succeeded(ns, "block-writer")?;
    env.delete_pods(ns, &["block-writer"])?;

    // Every volume is unstaged once its pod is gone: nothing is exported.
    wait("the kubelet to unstage every volume", T, |last| {
        let vols = env.lamina_json(&["volume", "list"])?;
        let attached: Vec<String> = vols
            .as_array()
            .context("volume list is no array")?
            .iter()
            .filter(|v| !v["export"].is_null())
            .filter_map(|v| v["name"].as_str().map(str::to_string))
            .collect();
        *last = format!("attached: {attached:?}");
        Ok(attached.is_empty().then_some(()))
    })?;
    env.check_pattern(&raw, 0xab, "1M")
        .context("the Block PVC's volume does not hold what the pod wrote")?;
    Ok(())
}

/// The pod's log (through the API server, from the kubelet).
fn log(env: &Env, ns: &str, pod: &str) -> Result<String> {
    env.kubectl(&["logs", "-n", ns, pod])
}

/// q. Claims of a WaitForFirstConsumer class bind only once a pod needs
/// them, on the node kube-scheduler chose with the capacity csi-provisioner
/// published; a VolumeGroupSnapshot of two claims in use by one running
/// pod; the pod deleted and another one placed on the same claims reads
/// what the first wrote; a clone PVC and a restored group member, each read
/// by a pod.
pub fn first_consumer_group_clone(env: &Env) -> Result<()> {
    let ns = "pods-consumer";
    env.namespace(ns)?;
    env.apply(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: lamina-wffc}\n\
         provisioner: lamina.csi.io\nvolumeBindingMode: WaitForFirstConsumer\nreclaimPolicy: Delete\n\
         allowVolumeExpansion: true\nparameters: {clone: linked}\n",
    )?;
    for claim in ["a", "b"] {
        env.apply(&pvc(ns, claim, "lamina-wffc", "64Mi", None).replacen(
            "metadata: {",
            "metadata: {labels: {group: app}, ",
            1,
        ))?;
    }
    // csi-provisioner publishes the class's capacity on the node, and the
    // claims wait for their consumer.
    wait(
        "CSIStorageCapacity for lamina-wffc on the node",
        T,
        |last| {
            let all = env.kubectl_json(&["get", "csistoragecapacities", "-A"])?;
            let found = all["items"].as_array().into_iter().flatten().any(|c| {
                c["storageClassName"] == "lamina-wffc"
                    && c["nodeTopology"]["matchLabels"][crate::env::TOPOLOGY_KEY] == NODE_ID
                    && c["capacity"].is_string()
            });
            *last = format!("{} objects", all["items"].as_array().map_or(0, Vec::len));
            Ok(found.then_some(()))
        },
    )?;
    let phase = env.get(ns, "pvc", "a")?.context("PVC a")?["status"]["phase"].clone();
    ensure!(
        phase == "Pending",
        "PVC a is {phase} before any pod uses it"
    );

    // One pod on both claims: it writes, then runs on.
    let both = [("a", "/a", false), ("b", "/b", false)];
    env.apply(&pod_on(
        ns,
        "app",
        &both,
        "set -e; echo in-a > /a/f; echo in-b > /b/f; sync; echo written; exec sleep 3600",
    ))?;
    wait("pod app to write both claims", T, |last| {
        *last = log(env, ns, "app").unwrap_or_else(|e| format!("{e:#}"));
        Ok(last.contains("written").then_some(()))
    })
    .with_context(|| env.events(ns, "app"))?;
    for claim in ["a", "b"] {
        let pv = env.wait_bound(ns, claim, T)?;
        let pv = env.get("", "pv", &pv)?.context("the PV")?;
        let term = &pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0];
        ensure!(
            term.to_string().contains(NODE_ID),
            "PV of {claim} is not on {NODE_ID}: {term}"
        );
    }

    // A group snapshot of both, taken while the pod runs.
    env.apply(&format!(
        "apiVersion: groupsnapshot.storage.k8s.io/v1\nkind: VolumeGroupSnapshot\n\
         metadata: {{name: group, namespace: {ns}}}\nspec:\n  volumeGroupSnapshotClassName: lamina\n  \
         source: {{selector: {{matchLabels: {{group: app}}}}}}\n"
    ))?;
    let member_of_b = wait("the group snapshot and its member of b", T, |last| {
        let g = env.get(ns, "volumegroupsnapshot", "group")?;
        *last = g
            .as_ref()
            .map_or("none".into(), |g| g["status"].to_string());
        if !g.is_some_and(|g| g["status"]["readyToUse"] == true) {
            return Ok(None);
        }
        let all = env.kubectl_json(&["get", "volumesnapshots", "-n", ns])?;
        Ok(all["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| {
                s["status"]["volumeGroupSnapshotName"] == "group"
                    && s["spec"]["source"]["persistentVolumeClaimName"] == "b"
                    && s["status"]["readyToUse"] == true
            })
            .and_then(|s| s["metadata"]["name"].as_str().map(str::to_string)))
    })
    .with_context(|| env.events(ns, "group"))?;

    // The pod goes; another one on the same claims reads what it wrote.
    env.delete_pods(ns, &["app"])?;
    env.apply(&pod_on(
        ns,
        "app-again",
        &both,
        "set -e; test \"$(cat /a/f)\" = in-a; test \"$(cat /b/f)\" = in-b",
    ))?;
    env.wait_pod_succeeded(ns, "app-again")?;
    env.delete_pods(ns, &["app-again"])?;

    // A clone of a, and b's group member restored, each read by a pod.
    env.apply(&pvc(
        ns,
        "a-clone",
        "lamina-wffc",
        "64Mi",
        Some(("PersistentVolumeClaim", "a")),
    ))?;
    env.apply(&pod(
        ns,
        "clone-reader",
        "a-clone",
        false,
        "test \"$(cat /data/f)\" = in-a",
    ))?;
    env.apply(&pvc(
        ns,
        "b-restored",
        "lamina-wffc",
        "64Mi",
        Some(("VolumeSnapshot", &member_of_b)),
    ))?;
    env.apply(&pod(
        ns,
        "member-reader",
        "b-restored",
        false,
        "test \"$(cat /data/f)\" = in-b",
    ))?;
    env.wait_pod_succeeded(ns, "clone-reader")?;
    env.wait_pod_succeeded(ns, "member-reader")?;
    env.delete_pods(ns, &["clone-reader", "member-reader"])?;
    Ok(())
}

/// The number a writer pod keeps in /data/count.
fn written(env: &Env, ns: &str, pod: &str) -> Result<u64> {
    let c = env.kubectl(&["exec", "-n", ns, pod, "--", "cat", "/data/count"])?;
    Ok(c.trim().parse()?)
}

/// What a Lamina volume's ext4 shows, read whole through its export:
/// whether its journal needs replaying (`dumpe2fs -h`), and whether
/// `e2fsck -fn` (which replays nothing) finds it clean.
fn ext4_state(env: &Env, volume: &str) -> Result<(bool, bool)> {
    let uri = env.attach_volume(volume)?;
    let img = env.dir.join(format!("{volume}.img"));
    let copied = crate::env::run(
        std::process::Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw", &uri])
            .arg(&img),
    );
    env.detach_volume(volume)?;
    copied?;
    let head = crate::env::run(std::process::Command::new("dumpe2fs").arg("-h").arg(&img))?;
    let replay = head
        .lines()
        .find(|l| l.starts_with("Filesystem features:"))
        .with_context(|| format!("no features in dumpe2fs's output: {head}"))?
        .contains("needs_recovery");
    let clean = std::process::Command::new("e2fsck")
        .arg("-fn")
        .arg(&img)
        .output()?
        .status
        .success();
    std::fs::remove_file(&img)?;
    Ok((replay, clean))
}

/// r. A pod writes and syncs files without pause on an ext4 PVC; a
/// VolumeSnapshot of the `lamina-frozen` class (parameter `freeze`) and
/// one of the plain class are taken while it runs, and each is restored
/// into a PVC. The frozen one holds a clean filesystem (no journal
/// replay needed, `e2fsck -fn` clean); the plain one needs its journal
/// replayed (so the check tells them apart). The pod ran on through both.
pub fn frozen_snapshot(env: &Env) -> Result<()> {
    let ns = "frozen";
    env.namespace(ns)?;
    env.apply(&pvc(ns, "busy", "lamina", "64Mi", None))?;
    env.wait_bound(ns, "busy", T)?;
    env.apply(&pod(
        ns,
        "writer",
        "busy",
        false,
        "i=0; while true; do \
         dd if=/dev/urandom of=/data/f$((i % 32)) bs=4k count=4 conv=fsync 2>/dev/null; \
         echo $i > /data/count; i=$((i+1)); done",
    ))?;
    wait("the writer to run and write", T, |last| {
        let out = written(env, ns, "writer");
        *last = format!("{out:?}");
        Ok(out.ok().filter(|&n| n > 10).map(drop))
    })?;
    env.apply(&volume_snapshot(ns, "plain", "busy", "lamina"))?;
    env.apply(&volume_snapshot(ns, "frozen", "busy", "lamina-frozen"))?;
    env.wait_snapshot_ready(ns, "plain", T)?;
    env.wait_snapshot_ready(ns, "frozen", T)?;
    // The writer was not stopped by the freeze: it goes on writing.
    let before = written(env, ns, "writer")?;
    wait("the writer to go on after the freeze", T, |last| {
        let now = written(env, ns, "writer")?;
        *last = format!("count {now}, was {before}");
        Ok((now > before).then_some(()))
    })?;
    let phase = env
        .get(ns, "pod", "writer")?
        .context("the writer vanished")?["status"]["phase"]
        .as_str()
        .unwrap_or("")
        .to_string();
    ensure!(phase == "Running", "the writer is {phase}, not Running");

    let mut restored = Vec::new();
    for snap in ["plain", "frozen"] {
        let claim = format!("from-{snap}");
        env.apply(&pvc(
            ns,
            &claim,
            "lamina",
            "64Mi",
            Some(("VolumeSnapshot", snap)),
        ))?;
        restored.push(env.wait_bound(ns, &claim, T)?);
    }
    let plain = ext4_state(env, &restored[0])?;
    ensure!(
        plain.0,
        "the plain snapshot of a filesystem in use does not need its journal replayed: \
         the check cannot tell a frozen snapshot from it"
    );
    let frozen = ext4_state(env, &restored[1])?;
    ensure!(
        frozen == (false, true),
        "the frozen snapshot's filesystem: needs replay {}, e2fsck -fn clean {}",
        frozen.0,
        frozen.1
    );
    // Its loop device goes with the unstage once the pod is gone, though
    // the plugin that set it up (in the chart, in a container now gone
    // with its mount namespace) is not the one that unstages.
    let pv = env.get(ns, "pvc", "busy")?.context("PVC busy")?["spec"]["volumeName"]
        .as_str()
        .context("PVC busy has no volume")?
        .to_string();
    let (dev, seq) = published_loop(&pv)?;
    env.delete_pods(ns, &["writer"])?;
    wait(&format!("{dev} to be detached at the unstage"), T, |last| {
        let now = loop_seq(&dev);
        *last = format!("{dev} set up with sequence number {now:?}, was {seq}");
        Ok((now != Some(seq)).then_some(()))
    })?;
    Ok(())
}

/// The loop device under PV `pv`'s publish mount (seen from the host: the
/// kubelet's mounts propagate), and its sequence number (`diskseq`, new at
/// every setup, so a device number set up again is told apart).
fn published_loop(pv: &str) -> Result<(String, u64)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let suffix = format!("/kubernetes.io~csi/{pv}/mount");
    let dev = info
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|m| m.ends_with(&suffix)))
        .find_map(|l| l.split_once(" - ")?.1.split(' ').nth(1).map(str::to_string))
        .with_context(|| format!("no mount of {pv} on this host"))?;
    ensure!(dev.starts_with("/dev/loop"), "{pv} is mounted from {dev}");
    let seq = loop_seq(&dev).with_context(|| format!("{dev} is not set up"))?;
    Ok((dev, seq))
}

/// A loop device's `diskseq` while it is set up.
fn loop_seq(dev: &str) -> Option<u64> {
    let sys = std::path::Path::new("/sys/block").join(dev.trim_start_matches("/dev/"));
    std::fs::metadata(sys.join("loop/backing_file")).ok()?;
    std::fs::read_to_string(sys.join("diskseq"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// s. A pod writes and checks without pause on an xfs PVC while Lamina
/// changes under it: the node plugin killed with SIGKILL and started again
/// (a crash, a new version of its container), the daemon stopped with
/// SIGTERM and started again (an upgrade: the keeper holds its files'
/// connections meanwhile), and the claim grown from 320Mi to 640Mi while
/// the pod runs (the kubelet grows the loop device and the filesystem).
/// The claim is xfs: growing ext4 online needs CAP_SYS_RESOURCE, which
/// root lacks on this VM (a privileged container has it).
/// Every write is `O_DIRECT` with fsync, so an I/O error fails the pod;
/// at the end the pod reads every file back with `O_DIRECT` and checks it.
pub fn io_through_restarts_and_growth(env: &Env) -> Result<()> {
    let ns = "pods-restarts";
    env.namespace(ns)?;
    env.apply(
        // Bound at once, so kept on node 1, the node with a kubelet, as
        // kube-env's classes are: with other nodes placement would take the
        // roomiest, where no pod can run.
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: lamina-xfs}\n\
         provisioner: lamina.csi.io\nreclaimPolicy: Delete\nallowVolumeExpansion: true\n\
         parameters: {csi.storage.k8s.io/fstype: xfs}\n\
         allowedTopologies:\n- matchLabelExpressions:\n  - {key: topology.lamina.io/node, values: [kube-env-node]}\n",
    )?;
    env.apply(&pvc(ns, "busy", "lamina-xfs", "320Mi", None))?;
    env.wait_bound(ns, "busy", T)?;
    env.apply(&pod(
        ns,
        "writer",
        "busy",
        false,
        "set -e; i=0; \
         while [ ! -e /data/stop ]; do \
           k=$((i % 16)); \
           dd if=/dev/urandom of=/tmp/b bs=64k count=4 2>/dev/null; \
           dd if=/tmp/b of=/data/f$k bs=64k oflag=direct conv=fsync 2>/dev/null; \
           md5sum < /tmp/b > /data/f$k.md5; \
           echo $i > /data/count; i=$((i+1)); \
         done; \
         n=0; for k in $(seq 0 15); do \
           [ -e /data/f$k.md5 ] || continue; \
           test \"$(dd if=/data/f$k bs=64k iflag=direct 2>/dev/null | md5sum)\" = \"$(cat /data/f$k.md5)\"; \
           n=$((n+1)); \
         done; \
         echo verified $n files after $i writes",
    ))?;
    let count = || written(env, ns, "writer");
    let running = |what: &str| -> Result<()> {
        let p = env
            .get(ns, "pod", "writer")?
            .context("the writer vanished")?;
        let phase = p["status"]["phase"].as_str().unwrap_or("");
        ensure!(
            phase == "Running",
            "after {what} the writer is {phase}: {}\n{}",
            p["status"],
            log(env, ns, "writer").unwrap_or_default()
        );
        Ok(())
    };
    // Goes on writing: a few more writes counted after `what`.
    let goes_on = |what: &str| -> Result<()> {
        let before = count().unwrap_or(0);
        wait(&format!("the writer to go on after {what}"), T, |last| {
            running(what)?;
            let now = count().unwrap_or(0);
            *last = format!("count {now}, was {before}");
            Ok((now >= before + 3).then_some(()))
        })?;
        Ok(())
    };
    goes_on("its start")?;

    // The node plugin crashes and comes back: the volume's loop device
    // and the daemon's file do not depend on it.
    if env.node_pod {
        env.crash_node_plugin_container()?;
    } else {
        env.restart("lamina-csi-node", libc::SIGKILL)?;
    }
    goes_on("the node plugin's restart")?;

    // The daemon is upgraded: SIGTERM hands the file's connection to the
    // keeper, the writes wait, the new daemon answers them. In the chart's
    // pods: a new image rolled out as docs/kubernetes.md says (the
    // DaemonSet's image changed, its pod deleted), the keeper's pod holding
    // the connection in between.
    let daemon_log = if env.node_pod {
        env.roll_node_pod()?
    } else {
        env.restart("lamina", libc::SIGTERM)?;
        std::fs::read_to_string(env.log_file("lamina"))?
    };
    // (the old pod's log is gone with it: only the new daemon's is read)
    ensure!(
        (env.node_pod || daemon_log.contains("handed to the keeper"))
            && daemon_log.contains("on the connection the keeper held"),
        "the daemon did not hand its file over and take it back: {}",
        daemon_log
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .join("\n")
    );
    goes_on("the daemon's restart")?;
    if env.node_pod {
        // The controller reaches the daemon through the chart's Service,
        // whose endpoints follow the new pod's readiness a moment later: a
        // resize in between is refused and retried by the resizer with its
        // backoff. Grown once the Service leads to the new daemon.
        let ip = env.kubectl(&[
            "-n",
            "lamina",
            "get",
            "service",
            "lamina-api",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])?;
        let (_, port) = env
            .endpoint
            .rsplit_once(':')
            .with_context(|| format!("no port in {}", env.endpoint))?;
        let through = format!("http://{}:{port}", ip.trim());
        wait("the daemon to answer through its Service", T, |last| {
            let r = run(Command::new(&env.lamina)
                .args(["--endpoint", &through, "status"])
                .env("LAMINA_TOKEN", &env.token));
            Ok(match r {
                Ok(_) => Some(()),
                Err(e) => {
                    *last = format!("{e:#}");
                    None
                }
            })
        })?;
    }

    // Grown while the pod runs.
    let df = || -> Result<u64> {
        let out = env.kubectl(&["exec", "-n", ns, "writer", "--", "df", "-k", "/data"])?;
        let line = out.lines().last().unwrap_or_default().to_string();
        line.split_whitespace()
            .nth(1)
            .and_then(|k| k.parse().ok())
            .with_context(|| format!("df printed {out:?}"))
    };
    let before = df()?;
    env.kubectl(&[
        "patch",
        "pvc",
        "busy",
        "-n",
        ns,
        "-p",
        r#"{"spec":{"resources":{"requests":{"storage":"640Mi"}}}}"#,
    ])?;
    // Longer than the sidecars' timeout (90 s): a call that timed out is
    // retried, and shown below.
    let asked = std::time::Instant::now();
    wait("the claim to show 640Mi, grown online", 2 * T, |last| {
        let p = env.get(ns, "pvc", "busy")?.context("PVC busy")?;
        *last = p["status"].to_string();
        Ok((p["status"]["capacity"]["storage"] == "640Mi").then_some(()))
    })
    .with_context(|| {
        let mut why = env.events(ns, "busy");
        if env.node_pod {
            why.push_str(&pod_logs(env));
        }
        why
    })?;
    if asked.elapsed() > T / 3 {
        println!(
            "    the claim grew {:.0} s after it was asked to:\n{}{}",
            asked.elapsed().as_secs_f64(),
            env.events(ns, "busy"),
            if env.node_pod {
                pod_logs(env)
            } else {
                String::new()
            }
        );
    }
    let after = df()?;
    ensure!(
        after > before * 3 / 2,
        "the filesystem the pod sees did not grow: {before} KiB, then {after} KiB"
    );
    goes_on("the growth")?;

    // The pod stops writing and checks every file it wrote.
    env.kubectl(&["exec", "-n", ns, "writer", "--", "touch", "/data/stop"])?;
    env.wait_pod_succeeded(ns, "writer")?;
    let out = log(env, ns, "writer")?;
    ensure!(out.contains("verified"), "the writer's log: {out}");
    println!(
        "    {}; filesystem {before} KiB, then {after} KiB",
        out.trim()
    );
    env.delete_pods(ns, &["writer"])?;
    Ok(())
}

/// In the chart's pods, the logs that go with the environment: the
/// resizer's and the CSI controller's in the controller pod, the daemon's
/// in the node pod (their last lines).
fn pod_logs(env: &Env) -> String {
    let mut out = String::new();
    for (what, c) in [
        ("deployment/lamina-controller", "csi-resizer"),
        ("deployment/lamina-controller", "csi-controller"),
        ("daemonset/lamina-node", "lamina"),
    ] {
        let logs = env
            .kubectl(&["-n", "lamina", "logs", what, "-c", c, "--tail=40"])
            .unwrap_or_else(|e| format!("{e:#}"));
        out.push_str(&format!("\n{what} {c}'s log:\n{logs}"));
    }
    out
}
