//! i. A restore on another node (KUBE_ENV_NODES=2): a PVC with 1 GiB of
//! data on node 1, a VolumeSnapshot of it, and a PVC restored from it with
//! a class whose allowedTopologies name node 2. Node 2's daemon pulls the
//! snapshot over the transfer protocol (a `remote-clone` operation); the
//! claim is not Bound while that copy runs, then binds to a PV whose node
//! affinity names node 2, and the volume on node 2 holds the snapshot's
//! data, not what the source holds since.

use crate::env::{pvc, run, volume_snapshot, wait, Env, NODE_2};
use anyhow::{bail, ensure, Context, Result};
use std::process::Command;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);
const COPY: Duration = Duration::from_secs(600);

pub fn cross_node_restore(env: &Env) -> Result<()> {
    let node2 = env.on_node_2()?;
    let ns = "cross-node-restore";
    env.namespace(ns)?;
    env.apply(&pvc(ns, "source", "lamina", "1Gi", None))?;
    let source = env.wait_bound(ns, "source", T)?;
    // 1 GiB of non-zero data (nbdkit's pattern plugin: each 8 bytes its
    // offset), enough for the copy to be seen running.
    let uri = env.attach_volume(&source)?;
    crate::env::fill_pattern(&uri, "1G")?;
    env.detach_volume(&source)?;
    env.apply(&volume_snapshot(ns, "snap", "source", "lamina"))?;
    env.wait_snapshot_ready(ns, "snap", T)?;
    let (svol, snap, _) = env.engine_snapshot(ns, "snap")?;
    ensure!(svol == source, "the snapshot is of {svol}, not {source}");
    // What the source holds after the snapshot must not reach the restore.
    env.write_pattern(&source, 0xcd, "1M")?;

    env.apply(&pvc(
        ns,
        "restored",
        "lamina-node-2",
        "1Gi",
        Some(("VolumeSnapshot", "snap")),
    ))?;
    // The copy runs on node 2, and meanwhile the claim is not bound.
    let mut seen_running = false;
    let op = wait("node 2's remote clone to succeed", COPY, |last| {
        let ops = node2.lamina_json(&["operation", "list"])?;
        let op = ops
            .as_array()
            .into_iter()
            .flatten()
            .find(|o| o["kind"] == "remote-clone")
            .cloned();
        let phase = pvc_phase(env, ns, "restored")?;
        *last = format!("operation {op:?}; PVC {phase}");
        let Some(op) = op else { return Ok(None) };
        match op["state"].as_str() {
            Some("running") if phase == "Bound" => {
                bail!("the restored PVC bound while the copy runs: {last}")
            }
            Some("running") => {
                seen_running = true;
                Ok(None)
            }
            Some("succeeded") => Ok(Some(op)),
            _ => bail!("the copy from node 1 failed: {op}"),
        }
    })?;
    ensure!(
        seen_running,
        "the copy was never seen running (it was done at first look: {op}), so binding after it is not shown"
    );
    let restored = env.wait_bound(ns, "restored", T)?;
    let pv = env.get("", "pv", &restored)?.context("no PV")?;
    let terms = &pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"];
    let text = terms.to_string();
    ensure!(
        text.contains(NODE_2) && text.contains(crate::env::TOPOLOGY_KEY),
        "the PV's node affinity does not name {NODE_2}: {terms}"
    );
    ensure!(
        env.lamina(&["volume", "get", &restored]).is_err(),
        "node 1 has a volume {restored} too"
    );
    // The restore on node 2 holds the snapshot: compare with the snapshot
    // exported on node 1.
    let a = env
        .lamina_json(&["snapshot", "attach", &source, &snap])?
        .get("uri")
        .and_then(|u| u.as_str())
        .map(str::to_string)
        .context("no uri for the snapshot")?;
    let b = node2.attach_volume(&restored)?;
    let cmp = run(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw", &a, &b]));
    env.lamina(&["snapshot", "detach", &source, &snap])?;
    node2.detach_volume(&restored)?;
    cmp.context("the volume restored on node 2 differs from the snapshot on node 1")?;
    Ok(())
}

fn pvc_phase(env: &Env, ns: &str, name: &str) -> Result<String> {
    let p = env.get(ns, "pvc", name)?.context("PVC missing")?;
    Ok(p["status"]["phase"].as_str().unwrap_or("").to_string())
}
