//! j. Many VolumeSnapshots created at once over a few PVCs (1,000 over 10 by
//! default): the time until all are readyToUse, then until Lamina's
//! controllers have a ready Snapshot resource for each, and how long
//! `kubectl get snapshots.lamina.io -A` takes over them, printed as figures
//! (not asserted against a limit); then, with KUBE_E2E_STEADY_SECS, what the
//! cluster keeps doing once they are all ready: API writes and CSI calls
//! over that window (zero is the goal).
//!
//! By hand, for the figures in docs/kubernetes.md:
//! KUBE_E2E_SNAPSHOTS (1000), KUBE_E2E_SNAPSHOT_PVCS (10),
//! KUBE_E2E_SCALE_LIMIT_SECS (900: how long to wait for them), and
//! KUBE_ENV_SNAPSHOT_CONTROLLER=upstream (kube-env/up) for the
//! snapshot-controller as the upstream manifest runs it.

use crate::env::{pvc, volume_snapshot, wait_every, Env};
use anyhow::{ensure, Context, Result};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A whole number from the environment, or `default`.
fn knob(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name}={v:?} is not a whole number")),
        Err(_) => Ok(default),
    }
}

/// Counters that say what the cluster is doing: the API server's requests
/// that write (by resource and verb) and the CSI calls the controller
/// sidecars made (by sidecar and method).
fn activity(env: &Env) -> Result<BTreeMap<String, f64>> {
    let mut out = BTreeMap::new();
    let api = env.kubectl(&["get", "--raw", "/metrics"])?;
    for l in api
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let label = |k: &str| {
            let at = l.find(&format!("{k}=\"")).map(|i| i + k.len() + 2)?;
            l[at..].split('"').next().map(str::to_string)
        };
        let verb = label("verb").unwrap_or_default();
        if !["POST", "PUT", "PATCH", "DELETE", "APPLY"].contains(&verb.as_str()) {
            continue;
        }
        let resource = label("resource").unwrap_or_default();
        let n: f64 = l.rsplit(' ').next().unwrap_or("0").parse().unwrap_or(0.0);
        *out.entry(format!("api {verb} {resource}")).or_default() += n;
    }
    for sidecar in ["csi-snapshotter", "csi-provisioner"] {
        // The sidecar's metrics endpoint, from its command line (the log's
        // first line).
        let log = std::fs::read_to_string(env.log_file(sidecar))?;
        let first = log.lines().next().unwrap_or_default();
        let Some(addr) = first
            .split(' ')
            .skip_while(|w| *w != "--http-endpoint")
            .nth(1)
        else {
            continue;
        };
        let m = crate::env::run(
            std::process::Command::new("curl").args(["-sf", &format!("http://{addr}/metrics")]),
        )?;
        for l in m
            .lines()
            .filter(|l| l.starts_with("csi_sidecar_operations_seconds_count{"))
        {
            let method = l
                .split("method_name=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or_default();
            let n: f64 = l.rsplit(' ').next().unwrap_or("0").parse().unwrap_or(0.0);
            *out.entry(format!("csi {sidecar} {method}")).or_default() += n;
        }
    }
    Ok(out)
}

pub fn thousand_snapshots(env: &Env) -> Result<()> {
    let ns = "scale-1000-snapshots";
    let total_asked = knob("KUBE_E2E_SNAPSHOTS", 1000)?;
    let pvcs = knob("KUBE_E2E_SNAPSHOT_PVCS", 10)?.max(1);
    let per_pvc = total_asked.div_ceil(pvcs);
    let limit = Duration::from_secs(knob("KUBE_E2E_SCALE_LIMIT_SECS", 900)? as u64);
    let steady = Duration::from_secs(knob("KUBE_E2E_STEADY_SECS", 0)? as u64);
    env.namespace(ns)?;
    let claims: String = (0..pvcs)
        .map(|i| {
            format!(
                "---\n{}",
                pvc(ns, &format!("data-{i}"), "lamina", "16Mi", None)
            )
        })
        .collect();
    env.apply(&claims)?;
    let mut volumes = Vec::new();
    for i in 0..pvcs {
        volumes.push(env.wait_bound(ns, &format!("data-{i}"), Duration::from_secs(60))?);
    }
    let total = pvcs * per_pvc;
    let at_start = activity(env)?;
    let start = Instant::now();
    // One kubectl per PVC, all at once.
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = (0..pvcs)
            .map(|i| {
                let docs: String = (0..per_pvc)
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
    let mut next_line = Duration::from_secs(30);
    wait_every(
        &format!("{total} VolumeSnapshots to be readyToUse"),
        limit,
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
            // A line every 30 s: the rate as it goes, for long runs.
            if start.elapsed() >= next_line {
                println!(
                    "    {ready} of {total} ready after {:.0} s",
                    start.elapsed().as_secs_f64()
                );
                next_line += Duration::from_secs(30);
            }
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
        "the engine holds {ours} snapshots of the {pvcs} volumes, want {total}"
    );

    // Lamina's controllers mirror every engine snapshot into a Snapshot
    // resource (createSnapshot false: the CSI driver took them).
    wait_every(
        &format!("{total} ready Snapshot resources of the {pvcs} volumes"),
        limit,
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
    // What it took: API writes and CSI calls per VolumeSnapshot, from the
    // first create until every one was ready and mirrored.
    let before = activity(env)?;
    for (k, n) in &before {
        let d = n - at_start.get(k).copied().unwrap_or(0.0);
        if d >= total as f64 / 10.0 {
            println!("    per snapshot: {k}: {:.2}", d / total as f64);
        }
    }
    if !steady.is_zero() {
        std::thread::sleep(steady);
        let after = activity(env)?;
        let mut quiet = true;
        let minutes = steady.as_secs_f64() / 60.0;
        for (k, n) in &after {
            let d = n - before.get(k).copied().unwrap_or(0.0);
            if d > 0.0 {
                quiet = false;
                println!("    steady: {k}: {:.1} a minute", d / minutes);
            }
        }
        if quiet {
            println!(
                "    steady: no API write and no CSI call in {} s",
                steady.as_secs()
            );
        }
    }
    Ok(())
}

/// A component's resident memory now and at its peak (VmRSS, VmHWM), in
/// MiB, from /proc.
fn memory(env: &Env, component: &str) -> Result<(f64, f64)> {
    let pid = std::fs::read_to_string(env.pid_file(component))?;
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid.trim()))?;
    let kib = |key: &str| -> f64 {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok((kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0))
}

/// m. Many replicated PVCs created at once (100 of 2 replicas by default,
/// KUBE_E2E_REPLICATED_PVCS): the time until all are Bound with every
/// replica healthy and each Volume resource's shared record written, and
/// the controllers' memory (Lamina's controllers and the CSI controller),
/// printed as figures; then all deleted, every replica with them.
pub fn hundred_replicated_pvcs(env: &Env) -> Result<()> {
    let ns = "scale-replicated";
    let n = knob("KUBE_E2E_REPLICATED_PVCS", 100)?;
    let limit = Duration::from_secs(knob("KUBE_E2E_SCALE_LIMIT_SECS", 900)? as u64);
    env.namespace(ns)?;
    env.apply(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: lamina-scale-2}\n\
         provisioner: lamina.csi.io\nvolumeBindingMode: Immediate\nreclaimPolicy: Delete\n\
         parameters: {replicas: \"2\"}\n\
         allowedTopologies:\n- matchLabelExpressions:\n  - {key: topology.lamina.io/node, values: [kube-env-node]}\n",
    )?;
    let claims: String = (0..n)
        .map(|i| {
            format!(
                "---\n{}",
                pvc(ns, &format!("r-{i}"), "lamina-scale-2", "16Mi", None)
            )
        })
        .collect();
    let start = Instant::now();
    env.create(&claims)?;
    wait_every(
        &format!("{n} replicated PVCs Bound"),
        limit,
        Duration::from_secs(1),
        |last| {
            let out = env.kubectl(&[
                "get",
                "pvc",
                "-n",
                ns,
                "-o",
                "jsonpath={range .items[*]}{.status.phase}{\"\\n\"}{end}",
            ])?;
            let bound = out.lines().filter(|l| *l == "Bound").count();
            *last = format!(
                "{bound} of {n} Bound after {:.0} s",
                start.elapsed().as_secs_f64()
            );
            Ok((bound == n).then_some(()))
        },
    )?;
    let bound = start.elapsed().as_secs_f64();
    let volumes: Vec<String> = env
        .kubectl(&[
            "get",
            "pvc",
            "-n",
            ns,
            "-o",
            "jsonpath={range .items[*]}{.spec.volumeName}{\"\\n\"}{end}",
        ])?
        .lines()
        .map(str::to_string)
        .collect();
    ensure!(
        volumes.len() == n,
        "{} volume names for {n} claims",
        volumes.len()
    );
    // Every replica set recorded in its Volume resource (status.replicaSet)
    // with two healthy replicas.
    wait_every(
        &format!("{n} shared records of two healthy replicas"),
        limit,
        Duration::from_secs(1),
        |last| {
            let out = env.kubectl(&[
                "get",
                "volumes.lamina.io",
                "-n",
                "lamina",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.status.replicaSet.replicas[*].node} {.status.replicaSet.replicas[*].faulted}{\"\\n\"}{end}",
            ])?;
            let ready = out
                .lines()
                .filter(|l| {
                    let f: Vec<&str> = l.split(' ').collect();
                    // name, two nodes, no fault
                    volumes.iter().any(|v| v == f[0]) && f.len() == 4 && f[3].is_empty()
                })
                .count();
            *last = format!(
                "{ready} of {n} after {:.0} s",
                start.elapsed().as_secs_f64()
            );
            Ok((ready == n).then_some(()))
        },
    )?;
    let recorded = start.elapsed().as_secs_f64();
    println!("    figure: {n} replicated PVCs (2 replicas) Bound in {bound:.1} s, every replica set recorded in the API server in {recorded:.1} s");
    let mut components = vec!["lamina-csi-controller".to_string()];
    for i in 1..=2 {
        let c = format!("lamina-operator-{i}");
        if env.pid_file(&c).exists() {
            components.push(c);
        }
    }
    for c in &components {
        let (rss, peak) = memory(env, c)?;
        println!("    figure: {c}: {rss:.0} MiB resident, {peak:.0} MiB at its peak");
    }
    let start = Instant::now();
    env.kubectl(&["delete", "namespace", ns, "--wait=true", "--timeout=600s"])?;
    wait_every(
        "every replica deleted",
        limit,
        Duration::from_secs(1),
        |last| {
            let mut left = 0;
            for node in [env.on_node_2()?, env.on_node_3()?] {
                let listed = node.lamina_json(&["volume", "list"])?;
                left += listed
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|v| {
                        v["name"]
                            .as_str()
                            .is_some_and(|name| volumes.iter().any(|x| x == name))
                    })
                    .count();
            }
            *last = format!("{left} replicas left");
            Ok((left == 0).then_some(()))
        },
    )?;
    println!(
        "    figure: {n} replicated PVCs and their replicas deleted in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    env.kubectl(&["delete", "storageclass", "lamina-scale-2"])?;
    Ok(())
}
