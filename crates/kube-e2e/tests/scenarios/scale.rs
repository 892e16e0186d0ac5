//! j. 1,000 VolumeSnapshots created at once over 10 PVCs: the time until
//! all are readyToUse, printed as a figure (not asserted against a limit).

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
    Ok(())
}
