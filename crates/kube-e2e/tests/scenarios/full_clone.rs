//! h. A full clone (class lamina-full-clone) of a PVC with 1 GiB allocated,
//! whose daemon is killed with SIGKILL and restarted mid-copy: the copy
//! resumes and completes, the clone's PVC stays unbound until it has, and
//! then holds the source's data.

use crate::env::{run, wait, Env};
use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;
use std::process::{Command, Stdio};
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

    kill_and_restart_daemon(env)?;
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

/// SIGKILL the daemon kube-env/up started and start it again the same way
/// (its pid file updated, so kube-env/down stops the new one).
fn kill_and_restart_daemon(env: &Env) -> Result<()> {
    let pid_file = env.pid_file("lamina");
    let pid: i32 = std::fs::read_to_string(&pid_file)?.trim().parse()?;
    // SAFETY: kill(2) of the daemon's pid, read from the pid file up wrote.
    if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
        bail!("kill -9 {pid}: {}", std::io::Error::last_os_error());
    }
    // SIGKILL makes the process a zombie at once, but its other threads
    // (one may be inside a long write or fdatasync) hold its files, the pool
    // lock and the API socket until they have exited too; a daemon started
    // before then meets a socket that still accepts and refuses to start.
    let api = env.lamina_data.join("api.sock");
    wait("the killed daemon's threads to exit", T, |last| {
        let exited = gone(pid);
        let accepts = std::os::unix::net::UnixStream::connect(&api).is_ok();
        *last = format!("process exited: {exited}; API socket accepts: {accepts}");
        Ok((exited && !accepts).then_some(()))
    })?;
    // The same command as kube-env/up ran (the log's first line, `+ CMD`),
    // so that a transfer listener (KUBE_ENV_NODES=2) comes back too.
    let text = std::fs::read_to_string(env.log_file("lamina"))?;
    let first = text.lines().next().unwrap_or_default();
    let argv: Vec<&str> = first.split_whitespace().skip(1).collect();
    ensure!(
        argv.get(1) == Some(&"serve"),
        "the daemon's log does not start with its command: {first:?}"
    );
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(env.log_file("lamina"))?;
    let child = Command::new("setsid")
        .args(&argv)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("restart lamina serve")?;
    std::fs::write(&pid_file, format!("{}\n", child.id()))?;
    // The child is reaped by nobody but us: leave it to kube-env/down.
    std::mem::forget(child);
    wait("the restarted daemon to answer", T, |_| {
        Ok(env.lamina(&["status"]).ok())
    })?;
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
