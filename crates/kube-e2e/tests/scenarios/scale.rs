//! j. 1,000 VolumeSnapshots created at once over 10 PVCs: the time until
//! all are readyToUse, then until Lamina's controllers have a ready Snapshot
//! resource for each, and how long `kubectl get snapshots.lamina.io -A`
//! takes over them, printed as figures (not asserted against a limit).

use crate::env::{pvc, volume_snapshot, wait_every, Env};
use anyhow::{ensure, Result};
use std::time::{Duration, Instant};

const PVCS: usize = 10;
const PER_PVC: usize = 100;

pub fn thousand_snapshots(env: &Env) -> Result<()> {
    let ns = "scale-1000-snapshots";
    env.namespace(ns)?;
    let claims: String = (0..PVCS)
        .map(|i| {
            format!(
                "---\n{}",
                pvc(ns, &format!("data-{i}"), "lamina", "16Mi", None)
            )
        })
        .collect();
    env.apply(&claims)?;
    let mut volumes = Vec::new();
    for i in 0..PVCS {
        volumes.push(env.wait_bound(ns, &format!("data-{i}"), Duration::from_secs(60))?);
    }
    let total = PVCS * PER_PVC;
    let start = Instant::now();
    // One kubectl per PVC, all at once.
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = (0..PVCS)
            .map(|i| {
                let docs: String = (0..PER_PVC)
                    .map(|j| {
                        format!(
                            "---\n{}",
                            volume_snapshot(
                                ns,
                                &format!("s-{i}-{j}"),
                                &format!("data-{i}"),
                                "lamina"
                            )
                        )
                    })
                    .collect();
                s.spawn(move || env.create(&docs))
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("a kubectl create thread panicked"))??;
        }
        Ok(())
    })?;
    let created = start.elapsed();
    wait_every(
        &format!("{total} VolumeSnapshots to be readyToUse"),
        Duration::from_secs(900),
        Duration::from_secs(1),
        |last| {
            let out = env.kubectl(&[
                "get",
                "volumesnapshots",
                "-n",
                ns,
                "-o",
                "jsonpath={range .items[*]}{.status.readyToUse}{\"\\n\"}{end}",
            ])?;
            let ready = out.lines().filter(|l| *l == "true").count();
            *last = format!(
                "{ready} of {total} ready after {:.0} s",
                start.elapsed().as_secs_f64()
            );
            Ok((ready == total).then_some(()))
        },
    )?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "    figure: {total} snapshots ready in {secs:.1} s (created in {:.1} s)",
        created.as_secs_f64()
    );
    let engine = env.engine_snapshots()?;
    let ours = engine.iter().filter(|(v, _)| volumes.contains(v)).count();
    ensure!(
        ours == total,
        "the engine holds {ours} snapshots of the {PVCS} volumes, want {total}"
    );

    // Lamina's controllers mirror every engine snapshot into a Snapshot
    // resource (createSnapshot false: the CSI driver took them).
    wait_every(
        &format!("{total} ready Snapshot resources of the {PVCS} volumes"),
        Duration::from_secs(900),
        Duration::from_secs(1),
        |last| {
            let out = env.kubectl(&[
                "get",
                "snapshots.lamina.io",
                "-A",
                "-o",
                "jsonpath={range .items[*]}{.spec.volume} {.status.readyToUse} {.spec.createSnapshot}{\"\\n\"}{end}",
            ])?;
            let ready = out
                .lines()
                .filter(|l| {
                    let f: Vec<&str> = l.split(' ').collect();
                    f.len() == 3
                        && volumes.iter().any(|v| v == f[0])
                        && f[1] == "true"
                        && f[2] == "false"
                })
                .count();
            *last = format!("{ready} of {total} mirrored and ready");
            Ok((ready == total).then_some(()))
        },
    )?;
    println!(
        "    figure: {total} Snapshot resources mirrored and ready {:.1} s after the first VolumeSnapshot was created",
        start.elapsed().as_secs_f64()
    );
    let listed = Instant::now();
    let all = env.kubectl(&["get", "snapshots.lamina.io", "-A", "--no-headers"])?;
    println!(
        "    figure: kubectl get snapshots.lamina.io -A: {} objects in {:.2} s",
        all.lines().count(),
        listed.elapsed().as_secs_f64()
    );
    Ok(())
}
