//! h. A full clone (class lamina-full-clone) of a PVC with 1 GiB allocated,
//! whose daemon is killed with SIGKILL and restarted mid-copy: the copy
//! resumes and completes, the clone's PVC stays unbound until it has, and
//! then holds the source's data.

use crate::env::{run, wait, Env};
use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);
const COPY: Duration = Duration::from_secs(600);

pub fn full_clone_daemon_killed(env: &Env) -> Result<()> {
    let ns = "full-clone";
    env.namespace(ns)?;
    env.apply(&crate::env::pvc(ns, "source", "lamina", "1Gi", None))?;
    let source = env.wait_bound(ns, "source", T)?;
    // 1 GiB of non-zero data (nbdkit's pattern plugin: each 8 bytes its offset).
    let uri = env.attach_volume(&source)?;
    crate::env::fill_pattern(&uri, "1G")?;
    env.detach_volume(&source)?;

    env.apply(&crate::env::pvc(
        ns,
        "clone",
        "lamina-full-clone",
        "1Gi",
        Some(("PersistentVolumeClaim", "source")),
    ))?;
    // The copy runs: the daemon's record says so, and the claim is unbound.
    // Past its first checkpoint (the daemon records the offset every 64 MiB),
    // so that a resume is told apart from a start afresh.
    let op = wait("the full clone's copy to run past 128 MiB", T, |last| {
        let ops = running_full_clones(env)?;
        *last = format!("{ops:?}");
        Ok(ops
            .into_iter()
            .find(|o| o["done_bytes"].as_u64().unwrap_or(0) >= 128 << 20))
    })?;
    let id = op["id"].as_str().context("operation id")?.to_string();
    let (done, total) = (
        op["done_bytes"].as_u64().unwrap_or(0),
        op["total_bytes"].as_u64().unwrap_or(0),
    );
    ensure!(
        done < total,
        "the copy finished before it could be interrupted ({done} of {total})"
    );
    ensure!(
        pvc_phase(env, ns, "clone")? != "Bound",
        "the clone's PVC is bound while its copy runs"
    );

    env.restart("lamina", libc::SIGKILL)?;
    let resumed = env.lamina_json(&["operation", "get", &id])?;
    let from = resumed["done_bytes"].as_u64().unwrap_or(0);
    println!("    killed the daemon at {done} of {total} bytes of operation {id}; restarted, it resumed at {from}");
    ensure!(
        resumed["state"] == "succeeded" || from > 0,
        "after the restart the copy starts from zero: {resumed}"
    );

    // Until the copy completes the claim stays unbound; then it binds.
    wait("the resumed copy to succeed", COPY, |last| {
        let o = env.lamina_json(&["operation", "get", &id])?;
        let phase = pvc_phase(env, ns, "clone")?;
        *last = format!(
            "operation {} {} of {} bytes; PVC {phase}",
            o["state"], o["done_bytes"], o["total_bytes"]
        );
        match o["state"].as_str() {
            Some("running") if phase == "Bound" => {
                bail!("the clone's PVC bound while the copy runs: {last}")
            }
            Some("running") => Ok(None),
            Some("succeeded") => Ok(Some(())),
            _ => bail!("the copy did not resume: {o}"),
        }
    })?;
    let clone = env.wait_bound(ns, "clone", COPY)?;
    let a = env.attach_volume(&source)?;
    let b = env.attach_volume(&clone)?;
    let cmp = run(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw", &a, &b]));
    env.detach_volume(&source)?;
    env.detach_volume(&clone)?;
    cmp.context("the full clone differs from its source")?;
    Ok(())
}

fn running_full_clones(env: &Env) -> Result<Vec<Value>> {
    let v = env.lamina_json(&["operation", "list", "--state", "running"])?;
    let items = v.as_array().cloned().unwrap_or_default();
    Ok(items
        .into_iter()
        .filter(|o| o["kind"] == "full-clone")
        .collect())
}

fn pvc_phase(env: &Env, ns: &str, name: &str) -> Result<String> {
    let p = env.get(ns, "pvc", name)?.context("PVC missing")?;
    Ok(p["status"]["phase"].as_str().unwrap_or("").to_string())
}
