//! SnapshotSchedule: `lamina schedule-controller` (on a clock the scenario
//! moves) makes VolumeSnapshots of the labelled PVCs at each slot, through
//! Kubernetes' own snapshot-controller and csi-snapshotter; they become
//! ready, a PVC restores from one as usual, retention deletes the oldest,
//! an unlabelled PVC gets none, and deleting the schedule with
//! `deletionPolicy: Delete` deletes its VolumeSnapshots.

use crate::env::{pvc, wait, Env};
use anyhow::{ensure, Context, Result};
use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(90);
const H: i64 = 3600;
/// 2030-01-01T00:10:00Z.
const T0: i64 = 1_893_456_600;

fn slot(h: i64) -> i64 {
    T0 - 600 + h * H
}

/// The controller process, killed when dropped.
struct Controller(Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn labelled_pvc(ns: &str, name: &str, tier: Option<&str>) -> String {
    let doc = pvc(ns, name, "lamina", "64Mi", None);
    match tier {
        Some(t) => doc.replacen(
            &format!("metadata: {{name: {name}, namespace: {ns}}}"),
            &format!("metadata: {{name: {name}, namespace: {ns}, labels: {{tier: {t}}}}}"),
            1,
        ),
        None => doc,
    }
}

/// The schedule's VolumeSnapshots of `pvc`, by name.
fn snapshots_of(env: &Env, ns: &str, pvc: &str) -> Result<Vec<String>> {
    let list = env.kubectl_json(&[
        "get",
        "volumesnapshots",
        "-n",
        ns,
        "-l",
        "lamina.io/schedule-uid",
    ])?;
    let mut out: Vec<String> = list["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter(|v| v["spec"]["source"]["persistentVolumeClaimName"] == pvc)
        .filter(|v| v["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|v| v["metadata"]["name"].as_str().map(String::from))
        .collect();
    out.sort();
    Ok(out)
}

fn stamp(t: i64) -> String {
    let secs = t.rem_euclid(86_400);
    format!(
        "2030010{}-{:02}{:02}",
        t.div_euclid(86_400) - 21_915 + 1,
        secs / 3600,
        secs % 3600 / 60
    )
}

fn track<'a>(s: &'a Value, pvc: &str) -> Option<&'a Value> {
    s["status"]["pvcs"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == pvc)
}

pub fn snapshot_schedule(env: &Env) -> Result<()> {
    let ns = "snapshot-schedule";
    env.namespace(ns)?;
    env.kubectl(&[
        "wait",
        "--for",
        "condition=established",
        "--timeout",
        "60s",
        "crd/snapshotschedules.lamina.io",
    ])?;
    let mut vols = Vec::new();
    for (name, tier, pattern) in [
        ("db", Some("gold"), 0xd1u8),
        ("web", Some("gold"), 0xe1),
        ("scratch", None, 0xf1),
    ] {
        env.apply(&labelled_pvc(ns, name, tier))?;
        let vol = env.wait_bound(ns, name, T)?;
        env.write_pattern(&vol, pattern, "1M")?;
        vols.push(vol);
    }
    // Selected, but never bound (its class does not exist): no slot is
    // claimed for it and no VolumeSnapshot made; its track says why.
    env.apply(&pvc(ns, "unbound", "no-such-class", "64Mi", None).replacen(
        "metadata: {name: unbound, namespace: snapshot-schedule}",
        "metadata: {name: unbound, namespace: snapshot-schedule, labels: {tier: gold}}",
        1,
    ))?;
    let clock = env.dir.join("schedule-clock");
    let set = |t: i64| -> Result<()> {
        let tmp = clock.with_extension("tmp");
        std::fs::write(&tmp, t.to_string())?;
        std::fs::rename(&tmp, &clock)?;
        Ok(())
    };
    set(T0)?;
    let start = |crash_at: Option<&str>| -> Result<Controller> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(env.log_file("schedule-controller"))?;
        let mut c = Command::new(&env.lamina);
        c.args(["schedule-controller", "--interval", "200ms", "--test-clock"])
            .arg(&clock)
            // as the chart runs it: its ServiceAccount, its ClusterRole
            .env("KUBECONFIG", env.dir.join("schedules.kubeconfig"))
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(p) = crash_at {
            c.args(["--test-crash-at", p]);
        }
        Ok(Controller(
            c.spawn().context("starting lamina schedule-controller")?,
        ))
    };
    // The first one dies right after claiming slot 1 (before its
    // VolumeSnapshots exist), as kill -9 would.
    let mut ctl = start(Some("schedule-after-claim"))?;
    env.apply(&format!(
        "apiVersion: lamina.io/v1alpha1\nkind: SnapshotSchedule\nmetadata: {{name: hourly, namespace: {ns}}}\n\
         spec:\n  cron: '0 * * * *'\n  keepLast: 2\n  volumeSnapshotClassName: lamina\n  deletionPolicy: Delete\n  \
         selector: {{matchLabels: {{tier: gold}}}}\n  snapshotLabels: {{made-by: schedule}}\n"
    ))?;
    // The controller has seen the schedule cover both PVCs from T0 on.
    wait("the schedule to cover db and web", T, |last| {
        let s = env
            .get(ns, "snapshotschedule", "hourly")?
            .context("the schedule")?;
        *last = s["status"].to_string();
        Ok(["db", "web"]
            .iter()
            .all(|p| track(&s, p).is_some_and(|t| t["since"] == T0))
            .then_some(()))
    })?;
    for h in 1..=3 {
        set(slot(h) + 5)?;
        if h == 1 {
            let status = wait("the controller to crash after its claim", T, |_| {
                Ok(ctl.0.try_wait()?)
            })?;
            ensure!(!status.success(), "the controller exited cleanly");
            // Restarted, it resumes slot 1: one VolumeSnapshot per PVC, not two.
            ctl = start(None)?;
        }
        wait(&format!("slot {h} done on db and web"), T, |last| {
            let s = env
                .get(ns, "snapshotschedule", "hourly")?
                .context("the schedule")?;
            *last = s["status"].to_string();
            Ok(["db", "web"]
                .iter()
                .all(|p| track(&s, p).is_some_and(|t| t["slot"] == slot(h) && t["state"] == "done"))
                .then_some(()))
        })?;
        for p in ["db", "web"] {
            let name = format!("{p}-hourly-{}", stamp(slot(h)));
            let vs = env.wait_snapshot_ready(ns, &name, T)?;
            ensure!(
                vs["metadata"]["labels"]["made-by"] == "schedule",
                "labels: {}",
                vs["metadata"]
            );
        }
        if h == 1 {
            for p in ["db", "web"] {
                let have = snapshots_of(env, ns, p)?;
                ensure!(have.len() == 1, "{p} after the resumed slot 1: {have:?}");
            }
            // What db holds from now on is not what slot 1's snapshot holds.
            env.write_pattern(&vols[0], 0xd2, "1M")?;
        }
        if h == 2 {
            // A restore from slot 1's snapshot, as users restore any VolumeSnapshot.
            let src = format!("db-hourly-{}", stamp(slot(1)));
            env.apply(&pvc(
                ns,
                "restored",
                "lamina",
                "64Mi",
                Some(("VolumeSnapshot", &src)),
            ))?;
            let restored = env.wait_bound(ns, "restored", T)?;
            env.check_pattern(&restored, 0xd1, "1M")
                .context("the restore from a scheduled snapshot")?;
        }
    }
    // keepLast 2: slot 1's VolumeSnapshots are deleted, slots 2 and 3 stay.
    for p in ["db", "web"] {
        env.wait_gone(
            ns,
            "volumesnapshot",
            &format!("{p}-hourly-{}", stamp(slot(1))),
            T,
        )?;
        let have = snapshots_of(env, ns, p)?;
        let want: Vec<String> = (2..=3)
            .map(|h| format!("{p}-hourly-{}", stamp(slot(h))))
            .collect();
        ensure!(have == want, "{p}: {have:?}, want {want:?}");
    }
    ensure!(
        snapshots_of(env, ns, "scratch")?.is_empty(),
        "the unlabelled PVC was snapshotted"
    );
    ensure!(
        snapshots_of(env, ns, "unbound")?.is_empty(),
        "the unbound PVC was snapshotted"
    );
    let s = env
        .get(ns, "snapshotschedule", "hourly")?
        .context("the schedule")?;
    let t = track(&s, "unbound").context("no track for the unbound PVC")?;
    ensure!(
        t["lastOutcome"] == "waiting"
            && t["lastError"]
                .as_str()
                .is_some_and(|e| e.contains("not Bound"))
            && t["slot"].is_null(),
        "the unbound PVC's track: {t}"
    );
    // The restored volume keeps its data after its source snapshot went.
    env.check_pattern(&env.wait_bound(ns, "restored", T)?, 0xd1, "1M")?;
    // Deleted with deletionPolicy Delete: its VolumeSnapshots go with it.
    env.kubectl(&[
        "delete",
        "snapshotschedule",
        "hourly",
        "-n",
        ns,
        "--wait=false",
    ])?;
    env.wait_gone(ns, "snapshotschedule", "hourly", T)?;
    for p in ["db", "web"] {
        for h in 2..=3 {
            env.wait_gone(
                ns,
                "volumesnapshot",
                &format!("{p}-hourly-{}", stamp(slot(h))),
                T,
            )?;
        }
    }
    Ok(())
}
