//! j. A replicated PVC (KUBE_ENV_NODES=3, or 2): a StorageClass with
//! `replicas: "2"` whose topology names node 1. The volume is made on node
//! 1 with its second replica on the roomiest other node, "node 2" below
//! (node 1's daemon learns its transfer address from the CSI controller,
//! which reads it from that node's Secret); both replicas are healthy; data written through node 1's
//! export is on both, as a VolumeSnapshot taken on both shows byte for
//! byte; node 2's replica is no volume of its own to Kubernetes (no Volume
//! resource of node 2's); a class asking for 3 replicas on two nodes
//! leaves its claim Pending with an event naming what is missing (with a
//! third node, KUBE_ENV_NODES=3, it is made on all three, alike); and
//! deleting the claim deletes the replica on node 2. The Volume resource
//! shows the replicas; with node 2's daemon SIGKILLed, node 1's writes go
//! on, the volume shows Degraded with a warning (on the Volume and on the
//! claim), and once node 2 is back
//! its replica is sent no more than 1.5 times what was written meanwhile
//! and the volume is Healthy again, with a Rebuilt event; the same with
//! the volume detached before node 2 returns, rebuilt because Lamina's
//! controllers open its front end. The replica set's shared record
//! (status.replicaSet) names node 1's front end and its generation, has node
//! 2 faulted as soon as a write it missed was acknowledged, and, set to
//! another node's front end at the next generation, makes node 1's next
//! attach fail as fenced, changing nothing. With both nodes
//! labelled in one zone, a claim of 2 replicas waits (its event names the
//! zone) until node 2 is labelled in another.

use crate::env::{pvc, run, volume_snapshot, wait, Env, NODE_2, NODE_3, NODE_ID};
use anyhow::{ensure, Context, Result};
use lamina_csi::proto::volume_capability::{
    access_mode::Mode, AccessMode, AccessType, BlockVolume,
};
use lamina_csi::proto::*;
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn class(name: &str, replicas: u8) -> String {
    format!(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {{name: {name}}}\n\
         provisioner: lamina.csi.io\nvolumeBindingMode: Immediate\nreclaimPolicy: Delete\n\
         parameters: {{replicas: \"{replicas}\"}}\n\
         allowedTopologies:\n- matchLabelExpressions:\n  - {{key: topology.lamina.io/node, values: [{NODE_ID}]}}\n"
    )
}

/// Each replica's (node, state) in a `replicas` array (of `lamina volume
/// get`'s replication, or a Volume resource's status.replication).
fn node_states(replicas: &Value) -> Vec<(String, String)> {
    replicas
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["node"].as_str().unwrap_or("").to_string(),
                r["state"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// The replicas of `volume` as `lamina volume get` on `env`'s node shows
/// them: (node, state).
fn replicas(env: &Env, volume: &str) -> Result<Vec<(String, String)>> {
    let v = env.lamina_json(&["volume", "get", volume])?;
    Ok(node_states(&v["replication"]["replicas"]))
}

/// Wait until `volume` has `n` replicas, all healthy; them.
fn all_healthy(env: &Env, volume: &str, n: usize) -> Result<Vec<(String, String)>> {
    wait(&format!("{n} healthy replicas of {volume}"), T, |last| {
        let r = replicas(env, volume)?;
        *last = format!("{r:?}");
        Ok((r.len() == n && r.iter().all(|(_, s)| s == "healthy")).then_some(r))
    })
}

fn uri_of(v: &Value) -> Result<String> {
    v.get("uri")
        .and_then(|u| u.as_str())
        .map(str::to_string)
        .context("no uri")
}

/// The other node holding `set`'s second replica: its name, the
/// environment on its daemon, and its daemon's component in kube-env.
fn peer(env: &Env, set: &[(String, String)]) -> Result<(String, Env, &'static str)> {
    let other = set.get(1).map(|r| r.0.clone()).unwrap_or_default();
    match other.as_str() {
        NODE_2 => Ok((other, env.on_node_2()?, "lamina-2")),
        NODE_3 => Ok((other, env.on_node_3()?, "lamina-3")),
        n => anyhow::bail!("the second replica is on {n:?}, not on node 2 or 3: {set:?}"),
    }
}

/// A claim `claim` of a new 2-replica class `class_name` in new namespace
/// `ns`, bound, both replicas healthy: its volume, and the other replica's
/// node as [`peer`] gives it.
fn two_replica_claim(
    env: &Env,
    ns: &str,
    class_name: &str,
    claim: &str,
) -> Result<(String, String, Env, &'static str)> {
    env.namespace(ns)?;
    env.apply(&class(class_name, 2))?;
    env.apply(&pvc(ns, claim, class_name, "64Mi", None))?;
    let vol = env.wait_bound(ns, claim, T)?;
    let set = all_healthy(env, &vol, 2)?;
    let (other, node_x, component) = peer(env, &set)?;
    Ok((vol, other, node_x, component))
}

pub fn replicated_pvc(env: &Env) -> Result<()> {
    let ns = "replicated-pvc";
    env.namespace(ns)?;
    env.apply(&class("lamina-replicated-2", 2))?;
    env.apply(&pvc(ns, "data", "lamina-replicated-2", "256Mi", None))?;
    let vol = env.wait_bound(ns, "data", T)?;
    let set = all_healthy(env, &vol, 2)?;
    // Node 1 (the topology's) and the roomiest other node.
    ensure!(
        set[0].0 == NODE_ID,
        "replicas on {set:?}, the first not on {NODE_ID}"
    );
    let (other, node2, component) = peer(env, &set)?;
    let there = node2.lamina_json(&["volume", "get", &vol])?;
    ensure!(
        there["labels"]["lamina.io/replica-of"] == NODE_ID,
        "node 2's volume {vol} is not node 1's replica: {there}"
    );

    // Written through node 1, on both.
    let uri = env.attach_volume(&vol)?;
    crate::env::fill_pattern(&uri, "64M")?;
    env.detach_volume(&vol)?;
    env.apply(&volume_snapshot(ns, "snap", "data", "lamina"))?;
    env.wait_snapshot_ready(ns, "snap", T)?;
    let (svol, snap, _) = env.engine_snapshot(ns, "snap")?;
    ensure!(svol == vol, "the snapshot is of {svol}, not {vol}");
    let a = uri_of(&env.lamina_json(&["snapshot", "attach", &vol, &snap])?)?;
    let b = uri_of(&node2.lamina_json(&["snapshot", "attach", &vol, &snap])?)?;
    let cmp = run(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw", &a, &b]));
    env.lamina(&["snapshot", "detach", &vol, &snap])?;
    node2.lamina(&["snapshot", "detach", &vol, &snap])?;
    cmp.context("node 2's replica differs from node 1's")?;

    // Lamina's controllers mirror node 1's volume, and node 2's replica
    // (the same name) not: one Volume resource, node 1's, ready.
    let mirrored = |v: &Value| v["metadata"]["name"] == vol.as_str();
    wait("the volume's Volume resource", T, |last| {
        let vols = env.kubectl_json(&["get", "volumes.lamina.io", "-n", "lamina"])?;
        let named: Vec<Value> = vols["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| mirrored(v))
            .cloned()
            .collect();
        *last = format!("{named:?}");
        ensure!(
            named.iter().all(|v| v["spec"]["node"] == NODE_ID),
            "a Volume resource of {vol} on another node: {named:?}"
        );
        Ok((named.len() == 1 && named[0]["status"]["state"] == "Ready").then_some(()))
    })?;

    // The Volume resource shows the replicas, the front end and its
    // generation.
    let shown = |want_state: &str, want: [&str; 2]| {
        let want = [(NODE_ID, want[0]), (other.as_str(), want[1])];
        wait(
            &format!("the Volume resource to show {want_state} {want:?}"),
            T,
            |last| {
                let v = env
                    .get("lamina", "volumes.lamina.io", &vol)?
                    .context("no Volume resource")?;
                let r = v["status"]["replication"].clone();
                *last = r.to_string();
                let got = node_states(&r["replicas"]);
                let same =
                    got.len() == 2 && got.iter().zip(want).all(|(a, b)| a.0 == b.0 && a.1 == b.1);
                Ok((r["state"] == want_state && r["frontEnd"] == NODE_ID && same).then_some(r))
            },
        )
    };
    let r = shown("Healthy", ["Healthy", "Healthy"])?;
    ensure!(
        r["generation"].as_u64().is_some_and(|g| g >= 1),
        "no generation: {r}"
    );
    // The shared record (status.replicaSet), written by node 1's daemon
    // before it acts: its front end, generation and replicas.
    let record = || -> Result<Value> {
        let v = env
            .get("lamina", "volumes.lamina.io", &vol)?
            .context("no Volume resource")?;
        Ok(v["status"]["replicaSet"].clone())
    };
    let healthy_record = || {
        wait("the shared record of two healthy replicas", T, |last| {
            let r = record()?;
            *last = r.to_string();
            let nodes: Vec<&str> = r["replicas"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|x| x["faulted"].is_null())
                .filter_map(|x| x["node"].as_str())
                .collect();
            Ok((r["frontEnd"] == NODE_ID && nodes == [NODE_ID, other.as_str()]).then_some(r))
        })
    };
    let rec = healthy_record()?;
    ensure!(
        rec["generation"] == r["generation"],
        "the shared record's generation is not the daemon's: {rec} and {r}"
    );

    // Node 2's daemon killed: node 1's writes go on, the volume degraded,
    // and a warning says so; node 2 back, its replica is sent only what it
    // missed and the volume is healthy again.
    // The volume stays attached throughout, as a pod's would be staged: its
    // front end stays open and rebuilds the replica once it can (a
    // detached volume's is rebuilt at its next attach: docs/replicas.md).
    let uri = env.attach_volume(&vol)?;
    let stopped = node2.stop(component, libc::SIGKILL)?;
    const AWAY: u64 = 16 << 20;
    crate::env::qemu_io(&uri, "write -P 0x5a 0 16M")?;
    // Node 2 missed acknowledged writes, so its fault was recorded in the
    // API server before they were acknowledged: read now, not waited for.
    let rec = record()?;
    ensure!(
        rec["replicas"][1]["node"] == other.as_str() && rec["replicas"][1]["faulted"].is_string(),
        "writes node 2 missed were acknowledged, and the shared record has it healthy: {rec}"
    );
    shown("Degraded", ["Healthy", "Faulted"])?;
    let events = |reason: &str| -> Result<bool> {
        Ok(env
            .events_json("lamina", &vol)?
            .iter()
            .any(|e| e["reason"] == reason))
    };
    wait("a Degraded warning on the Volume", T, |last| {
        *last = env.events("lamina", &vol);
        Ok(events("Degraded")?.then_some(()))
    })?;
    // And on the claim, in its namespace.
    let claim_events = |reason: &str| -> Result<bool> {
        Ok(env
            .events_json(ns, "data")?
            .iter()
            .any(|e| e["reason"] == reason))
    };
    wait("a Degraded warning on the claim", T, |last| {
        *last = env.events(ns, "data");
        Ok(claim_events("Degraded")?.then_some(()))
    })?;
    stopped.start()?;
    let sent = wait(
        "node 2's replica rebuilt",
        Duration::from_secs(120),
        |last| {
            let v = env.lamina_json(&["volume", "get", &vol])?;
            let r = &v["replication"]["replicas"][1];
            *last = r.to_string();
            Ok((r["state"] == "healthy")
                .then(|| r["last_rebuild"]["sent_bytes"].as_u64())
                .flatten())
        },
    )?;
    println!(
        "    node 2's replica rebuilt: {sent} bytes sent for {AWAY} written while it was away"
    );
    ensure!(
        sent * 2 <= AWAY * 3,
        "the rebuild sent {sent} bytes for {AWAY} written while node 2 was away (more than 1.5 times)"
    );
    shown("Healthy", ["Healthy", "Healthy"])?;
    wait("a Rebuilt event on the Volume", T, |last| {
        *last = env.events("lamina", &vol);
        Ok(events("Rebuilt")?.then_some(()))
    })?;
    wait("a Rebuilt event on the claim", T, |last| {
        *last = env.events(ns, "data");
        Ok(claim_events("Rebuilt")?.then_some(()))
    })?;
    env.detach_volume(&vol)?;
    env.check_pattern(&vol, 0x5a, "16M")?;

    // Fencing: the shared record names another node's front end, at the
    // next generation. Node 1's next front end must not open: its attach
    // fails, saying so, and its own record is unchanged (node 3 is not the
    // record's first replica, so this is no takeover node 1 yields its
    // volume to: front-end-moved has one); the record given back, it opens.
    let rec = healthy_record()?;
    let g = rec["generation"].as_u64().context("no generation")?;
    let set_record = |front_end: &str, generation: u64| {
        let patch = serde_json::json!({"status": {"replicaSet": {
            "frontEnd": front_end, "generation": generation}}});
        env.kubectl(&[
            "patch",
            "volumes.lamina.io",
            &vol,
            "-n",
            "lamina",
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch.to_string(),
        ])
    };
    set_record(NODE_3, g + 1)?;
    let refused = env.attach_volume(&vol);
    ensure!(
        refused.as_ref().is_err_and(
            |e| format!("{e:#}").contains("fenced") && format!("{e:#}").contains(NODE_3)
        ),
        "node 1 opened a front end while the record names {NODE_3}'s: {refused:?}"
    );
    let mine = env.lamina_json(&["volume", "get", &vol])?;
    ensure!(
        mine["replication"]["generation"] == g && mine["export"].is_null(),
        "a refused attach changed node 1's record: {}",
        mine["replication"]
    );
    set_record(NODE_ID, g + 1)?;
    env.attach_volume(&vol)?;
    env.detach_volume(&vol)?;
    let rec = healthy_record()?;
    ensure!(
        rec["generation"].as_u64() == Some(g + 1),
        "the record after the attach: {rec}"
    );

    // Again, but the volume detached before node 2 comes back: no front
    // end is open to rebuild it, so Lamina's controllers open one (the
    // replica reconciler), and it is healthy again with no client.
    let uri = env.attach_volume(&vol)?;
    let stopped = node2.stop(component, libc::SIGKILL)?;
    crate::env::qemu_io(&uri, "write -P 0x3c 0 4M")?;
    env.detach_volume(&vol)?;
    shown("Degraded", ["Healthy", "Faulted"])?;
    stopped.start()?;
    shown("Healthy", ["Healthy", "Healthy"])?;
    env.check_pattern(&vol, 0x3c, "4M")?;

    // Zones: both nodes in z1, a second replica has no zone of its own,
    // and the claim waits, the event saying so; node 2 moved to z2, the
    // controller's watch of the Nodes sees it and the claim binds.
    let zone = |node: &str, z: &str| {
        let label = format!("topology.kubernetes.io/zone={z}");
        env.kubectl(&["label", "node", node, &label, "--overwrite"])
    };
    zone(NODE_ID, "z1")?;
    zone(NODE_2, "z1")?;
    env.apply(&pvc(ns, "zoned", "lamina-replicated-2", "16Mi", None))?;
    wait("the zoned claim's refusal", T, |last| {
        let events = env.events(ns, "zoned");
        *last = events.clone();
        Ok((events.contains("ProvisioningFailed") && events.contains("zone z1")).then_some(()))
    })?;
    zone(NODE_2, "z2")?;
    let zoned = env.wait_bound(ns, "zoned", T)?;
    let r = replicas(env, &zoned)?;
    ensure!(
        r.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>() == [NODE_ID, NODE_2],
        "the zoned volume's replicas: {r:?}"
    );
    for n in [NODE_ID, NODE_2] {
        env.kubectl(&["label", "node", n, "topology.kubernetes.io/zone-"])?;
    }

    // Three replicas: one on each node, written through node 1 and alike
    // on all three. (With two nodes only: Pending, the event saying why.)
    env.apply(&class("lamina-replicated-3", 3))?;
    env.apply(&pvc(ns, "three", "lamina-replicated-3", "64Mi", None))?;
    match env.on_node_3() {
        Ok(node3) => {
            let three = env.wait_bound(ns, "three", T)?;
            let r = all_healthy(env, &three, 3)?;
            // Node 1 first, then the others, roomiest first.
            let mut others: Vec<&str> = r[1..].iter().map(|(n, _)| n.as_str()).collect();
            others.sort();
            ensure!(
                r[0].0 == NODE_ID && others == [NODE_2, NODE_3],
                "the 3-replica volume's replicas: {r:?}"
            );
            let uri = env.attach_volume(&three)?;
            crate::env::fill_pattern(&uri, "64M")?;
            env.detach_volume(&three)?;
            env.lamina(&["snapshot", "create", &three, "end"])?;
            let a = uri_of(&env.lamina_json(&["snapshot", "attach", &three, "end"])?)?;
            for n in [&env.on_node_2()?, &node3] {
                let b = uri_of(&n.lamina_json(&["snapshot", "attach", &three, "end"])?)?;
                let cmp =
                    run(Command::new("qemu-img")
                        .args(["compare", "-f", "raw", "-F", "raw", &a, &b]));
                n.lamina(&["snapshot", "detach", &three, "end"])?;
                cmp.with_context(|| format!("a replica of {three} differs from node 1's"))?;
            }
            env.lamina(&["snapshot", "detach", &three, "end"])?;
        }
        Err(_) => {
            wait("the 3-replica claim's refusal", T, |last| {
                let events = env.events(ns, "three");
                *last = events.clone();
                Ok(events
                    .contains("ProvisioningFailed")
                    .then_some(())
                    .filter(|_| events.contains("1 found")))
            })?;
            let p = env.get(ns, "pvc", "three")?.context("PVC three")?;
            ensure!(
                p["status"]["phase"] == "Pending",
                "PVC three: {}",
                p["status"]
            );
        }
    }

    // Deleting the claims deletes both replicas.
    env.kubectl(&["delete", "-n", ns, "volumesnapshot", "snap", "--wait=true"])?;
    env.kubectl(&[
        "delete",
        "-n",
        ns,
        "pvc",
        "data",
        "three",
        "zoned",
        "--wait=true",
    ])?;
    wait("the replica on node 2 deleted", T, |last| {
        let r = node2.lamina(&["volume", "get", &vol]);
        *last = format!("{r:?}");
        Ok(r.is_err().then_some(()))
    })?;
    env.kubectl(&[
        "delete",
        "storageclass",
        "lamina-replicated-2",
        "lamina-replicated-3",
    ])?;
    Ok(())
}

/// k. A replica's node gone past the replacement delay (KUBE_ENV_NODES=3,
/// Lamina's controllers replacing after REPLACE_AFTER): a PVC of 2
/// replicas on node 1 and one other node; that node's daemon SIGKILLed
/// and left down while the volume is in use; its replica is faulted, then
/// replaced by one on the third node, built in full; the volume is healthy
/// again on nodes 1 and 3 with the data written meanwhile, and the Volume
/// has a `Replaced` event. The killed node is started again; then the new
/// replica is removed by hand, and the controllers add one back (the
/// class's count), with a `ReplicaAdded` event.
pub fn replica_replaced(env: &Env) -> Result<()> {
    let ns = "replica-replaced";
    let (vol, other, gone, component) = two_replica_claim(env, ns, "lamina-replaced-2", "data")?;
    let stays = if other == NODE_2 {
        env.on_node_3()?
    } else {
        env.on_node_2()?
    };
    let uri = env.attach_volume(&vol)?;
    crate::env::fill_pattern(&uri, "32M")?;
    let stopped = gone.stop(component, libc::SIGKILL)?;
    crate::env::qemu_io(&uri, "write -P 0x77 0 8M")?;
    let t0 = std::time::Instant::now();
    let replaced = wait(
        "the replica replaced and healthy",
        Duration::from_secs(240),
        |last| {
            let r = replicas(env, &vol)?;
            *last = format!("{r:?}");
            Ok(
                (r.len() == 2 && r[1].0 != other && r.iter().all(|(_, s)| s == "healthy"))
                    .then_some(r),
            )
        },
    )?;
    println!(
        "    {other}'s replica replaced by one on {} in {:.0} s",
        replaced[1].0,
        t0.elapsed().as_secs_f64()
    );
    env.detach_volume(&vol)?;
    env.check_pattern(&vol, 0x77, "8M")?;
    // The new replica holds what node 1 does.
    env.lamina(&["snapshot", "create", &vol, "end"])?;
    let a = uri_of(&env.lamina_json(&["snapshot", "attach", &vol, "end"])?)?;
    let b = uri_of(&stays.lamina_json(&["snapshot", "attach", &vol, "end"])?)?;
    let cmp = run(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw", &a, &b]));
    env.lamina(&["snapshot", "detach", &vol, "end"])?;
    stays.lamina(&["snapshot", "detach", &vol, "end"])?;
    cmp.context("the replacement replica differs from node 1's")?;
    wait("a Replaced event on the Volume", T, |last| {
        let evs = env.events_json("lamina", &vol)?;
        *last = env.events("lamina", &vol);
        Ok(evs.iter().any(|e| e["reason"] == "Replaced").then_some(()))
    })?;
    stopped.start()?;

    // A replica taken out by hand: the volume has fewer than its class
    // asks for, and Lamina's controllers add one back.
    let now = replaced[1].0.clone();
    env.lamina(&["replica", "remove", &vol, &now])?;
    let back = wait("a replica added back", Duration::from_secs(120), |last| {
        let r = replicas(env, &vol)?;
        *last = format!("{r:?}");
        Ok((r.len() == 2 && r.iter().all(|(_, s)| s == "healthy")).then_some(r))
    })?;
    println!("    removed from {now}, added back on {}", back[1].0);
    wait("a ReplicaAdded event on the Volume", T, |last| {
        let evs = env.events_json("lamina", &vol)?;
        *last = env.events("lamina", &vol);
        Ok(evs
            .iter()
            .any(|e| e["reason"] == "ReplicaAdded")
            .then_some(()))
    })?;
    env.kubectl(&["delete", "-n", ns, "pvc", "data", "--wait=true"])?;
    env.kubectl(&["delete", "storageclass", "lamina-replaced-2"])?;
    Ok(())
}

/// The volume's shared record (its Volume resource's status.replicaSet),
/// read through the admin's own link to the API server.
fn shared_record(env: &Env, vol: &str) -> Result<Value> {
    let v = env
        .get("lamina", "volumes.lamina.io", vol)?
        .context("no Volume resource")?;
    Ok(v["status"]["replicaSet"].clone())
}

/// Each replica's (node, faulted) in a shared record.
fn faults(rec: &Value) -> Vec<(String, bool)> {
    rec["replicas"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| {
            (
                x["node"].as_str().unwrap_or("").to_string(),
                x["faulted"].is_string(),
            )
        })
        .collect()
}

/// l. Node 1's link to the API server cut for 30 s (kube-env's api-link-1
/// stopped: every connection through it silent), a 2-replica volume
/// attached there. Writes that both replicas answer go on. Node 2's
/// daemon then SIGKILLed: its fault cannot be recorded, so the next write
/// fails (never acknowledged on node 1 alone without the API server
/// knowing), and node 1 changes no record, in its store or the API server.
/// The link back, the next write records the fault first and succeeds;
/// node 2 back, its replica is rebuilt, and the data is what was
/// acknowledged.
pub fn api_server_cut(env: &Env) -> Result<()> {
    let ns = "api-server-cut";
    let (vol, other, node2, component) = two_replica_claim(env, ns, "lamina-cut-2", "data")?;
    let uri = env.attach_volume(&vol)?;
    crate::env::qemu_io(&uri, "write -P 0x11 0 4M")?;
    let before = wait("the shared record of the attached volume", T, |last| {
        let r = shared_record(env, &vol)?;
        *last = r.to_string();
        let healthy = faults(&r) == [(NODE_ID.to_string(), false), (other.clone(), false)];
        Ok((healthy && r["generation"].as_u64().is_some_and(|g| g >= 1)).then_some(r))
    })?;
    let mine = env.lamina_json(&["volume", "get", &vol])?["replication"].clone();

    let cut = env.pause("api-link-1")?;
    let t0 = std::time::Instant::now();
    crate::env::qemu_io(&uri, "write -P 0x22 0 4M")
        .context("a write both replicas answer, node 1 cut from the API server")?;
    let stopped = node2.stop(component, libc::SIGKILL)?;
    let failed = crate::env::qemu_io(&uri, "write -P 0x33 0 1M");
    ensure!(
        failed.is_err(),
        "a write node 2 missed was acknowledged while node 1 could not record its fault"
    );
    println!(
        "    the write node 2 missed failed after {:.1} s of the cut",
        t0.elapsed().as_secs_f64()
    );
    let now = env.lamina_json(&["volume", "get", &vol])?["replication"].clone();
    ensure!(
        now["generation"] == mine["generation"]
            && now["replicas"]
                .as_array()
                .is_some_and(|r| r.iter().all(|x| x["state"] == "healthy")),
        "node 1 changed its record while cut from the API server: {now}"
    );
    ensure!(
        shared_record(env, &vol)? == before,
        "the shared record changed while node 1 was cut from it"
    );
    std::thread::sleep(Duration::from_secs(30).saturating_sub(t0.elapsed()));
    cut.resume()?;

    // The link back: the fault is recorded before the next write is
    // acknowledged.
    wait("a write once the link is back", T, |last| {
        let r = crate::env::qemu_io(&uri, "write -P 0x33 0 1M");
        *last = format!("{r:?}");
        Ok(r.ok().map(drop))
    })?;
    let rec = shared_record(env, &vol)?;
    ensure!(
        faults(&rec) == [(NODE_ID.to_string(), false), (other.clone(), true)],
        "a write node 2 missed was acknowledged, and the shared record has it healthy: {rec}"
    );
    stopped.start()?;
    all_healthy(env, &vol, 2)?;
    env.detach_volume(&vol)?;
    let uri = env.attach_volume(&vol)?;
    let checked = crate::env::qemu_io(&uri, "read -P 0x33 0 1M")
        .and_then(|_| crate::env::qemu_io(&uri, "read -P 0x22 1M 3M"));
    env.detach_volume(&vol)?;
    checked.context("the volume after the cut")?;
    env.kubectl(&["delete", "-n", ns, "pvc", "data", "--wait=true"])?;
    env.kubectl(&["delete", "storageclass", "lamina-cut-2"])?;
    Ok(())
}

/// n. A VolumeSnapshot of a degraded volume, restored onto the node that
/// holds no replica of it: a 2-replica PVC on node 1, its other replica's
/// daemon SIGKILLed and a write made without it; the snapshot is taken on
/// node 1's replica alone and restored by a claim whose class names the
/// third node, which copies it from node 1; the restore holds what the
/// volume held at the snapshot, and nothing written after.
pub fn degraded_snapshot_restore(env: &Env) -> Result<()> {
    let ns = "degraded-restore";
    let (vol, other, node_x, component) =
        two_replica_claim(env, ns, "lamina-degraded-2", "source")?;
    let (third, on_third) = if other == NODE_2 {
        (NODE_3, env.on_node_3()?)
    } else {
        (NODE_2, env.on_node_2()?)
    };
    let uri = env.attach_volume(&vol)?;
    crate::env::qemu_io(&uri, "write -P 0x44 0 8M")?;
    let stopped = node_x.stop(component, libc::SIGKILL)?;
    crate::env::qemu_io(&uri, "write -P 0x55 0 4M")?;
    wait("the volume degraded", T, |last| {
        let r = replicas(env, &vol)?;
        *last = format!("{r:?}");
        Ok((r.len() == 2 && r[0].1 == "healthy" && r[1].1 != "healthy").then_some(()))
    })?;
    env.apply(&volume_snapshot(ns, "snap", "source", "lamina"))?;
    env.wait_snapshot_ready(ns, "snap", T)?;
    crate::env::qemu_io(&uri, "write -P 0x66 0 1M")?;
    env.apply(&format!(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {{name: lamina-on-{third}}}\n\
         provisioner: lamina.csi.io\nvolumeBindingMode: Immediate\nreclaimPolicy: Delete\n\
         allowedTopologies:\n- matchLabelExpressions:\n  - {{key: topology.lamina.io/node, values: [{third}]}}\n"
    ))?;
    env.apply(&pvc(
        ns,
        "restored",
        &format!("lamina-on-{third}"),
        "64Mi",
        Some(("VolumeSnapshot", "snap")),
    ))?;
    let restored = env.wait_bound(ns, "restored", Duration::from_secs(180))?;
    let there = on_third.lamina_json(&["volume", "get", &restored])?;
    ensure!(
        there["name"] == restored.as_str(),
        "the restore is not on {third}: {there}"
    );
    let ruri = on_third.attach_volume(&restored)?;
    let checked = crate::env::qemu_io(&ruri, "read -P 0x55 0 4M")
        .and_then(|_| crate::env::qemu_io(&ruri, "read -P 0x44 4M 4M"));
    on_third.detach_volume(&restored)?;
    checked.with_context(|| format!("the restore on {third} of the degraded volume's snapshot"))?;
    stopped.start()?;
    all_healthy(env, &vol, 2)?;
    env.detach_volume(&vol)?;
    env.kubectl(&["delete", "-n", ns, "pvc", "restored", "--wait=true"])?;
    env.kubectl(&["delete", "-n", ns, "volumesnapshot", "snap", "--wait=true"])?;
    env.kubectl(&["delete", "-n", ns, "pvc", "source", "--wait=true"])?;
    env.kubectl(&[
        "delete",
        "storageclass",
        "lamina-degraded-2",
        &format!("lamina-on-{third}"),
    ])?;
    Ok(())
}

/// Node `node`'s transfer address, from its node Secret.
pub(crate) fn transfer_address(env: &Env, node: &str) -> Result<String> {
    let a = env.secret_value("lamina", &format!("lamina-node-{node}"), "transfer-address")?;
    let a = String::from_utf8(a)?.trim().to_string();
    ensure!(
        !a.is_empty(),
        "node {node}'s Secret has no transfer-address"
    );
    Ok(a)
}

/// Node 1's node Secret written again (as its next pod registers it),
/// when dropped: after a scenario step that deleted it.
struct RegisterAgain<'a> {
    env: &'a Env,
    address: String,
}

impl Drop for RegisterAgain<'_> {
    fn drop(&mut self) {
        let env = self.env;
        let token = env.dir.join("node-1.token");
        let registered = std::fs::write(&token, &env.token)
            .map_err(anyhow::Error::from)
            .and_then(|()| {
                run(Command::new(&env.lamina)
                    .args([
                        "node",
                        "register",
                        "--node",
                        NODE_ID,
                        "--namespace",
                        "lamina",
                    ])
                    .args([
                        "--endpoint",
                        &env.endpoint,
                        "--transfer-address",
                        &self.address,
                    ])
                    .arg("--token-file")
                    .arg(&token)
                    .env("KUBECONFIG", env.dir.join("node.kubeconfig")))
            });
        if let Err(e) = registered {
            println!("    node 1's Secret could not be written again: {e:#}");
        }
    }
}

/// Volume `vol`'s PV as the node plugin gets it: its volume handle and
/// volume attributes. A replicated volume is usable from every node: no
/// accessible topology, so its PV has no node affinity.
fn pv_of(env: &Env, vol: &str) -> Result<(String, std::collections::HashMap<String, String>)> {
    let pv = env.get("", "pv", vol)?.context("no PV")?;
    ensure!(
        pv["spec"]["nodeAffinity"].is_null(),
        "the PV's node affinity: {}",
        pv["spec"]["nodeAffinity"]
    );
    let csi = &pv["spec"]["csi"];
    let handle = csi["volumeHandle"]
        .as_str()
        .context("the PV has no volumeHandle")?
        .to_string();
    let context = csi["volumeAttributes"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect();
    Ok((handle, context))
}

/// Volume `vol` attached on node 1 and its first 8 MiB written with
/// `pattern`; the generation its front end took, as the shared record
/// shows it.
fn written_on_node_1(env: &Env, vol: &str, pattern: u8) -> Result<u64> {
    let uri = env.attach_volume(vol)?;
    crate::env::qemu_io(&uri, &format!("write -P {pattern:#x} 0 8M"))?;
    wait("the attached volume's shared record", T, |last| {
        let r = shared_record(env, vol)?;
        *last = r.to_string();
        Ok((r["frontEnd"] == NODE_ID)
            .then(|| r["generation"].as_u64())
            .flatten()
            .filter(|g| *g >= 1))
    })
}

/// Kubelet's calls for block access to one volume through a node plugin:
/// staged and published under the plugin's work directory.
struct BlockCalls {
    staging: std::path::PathBuf,
    target: std::path::PathBuf,
    stage: NodeStageVolumeRequest,
    publish: NodePublishVolumeRequest,
    unpublish: NodeUnpublishVolumeRequest,
    unstage: NodeUnstageVolumeRequest,
}

fn block_calls(
    plugin: &crate::node::NodePlugin,
    handle: &str,
    context: std::collections::HashMap<String, String>,
) -> BlockCalls {
    let staging = plugin.work.path().join("staging");
    let target = plugin.work.path().join("target");
    let cap = VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    };
    BlockCalls {
        stage: NodeStageVolumeRequest {
            volume_id: handle.to_string(),
            staging_target_path: crate::node::path(&staging),
            volume_capability: Some(cap.clone()),
            volume_context: context.clone(),
            ..Default::default()
        },
        publish: NodePublishVolumeRequest {
            volume_id: handle.to_string(),
            staging_target_path: crate::node::path(&staging),
            target_path: crate::node::path(&target),
            volume_capability: Some(cap),
            volume_context: context,
            ..Default::default()
        },
        unpublish: NodeUnpublishVolumeRequest {
            volume_id: handle.to_string(),
            target_path: crate::node::path(&target),
        },
        unstage: NodeUnstageVolumeRequest {
            volume_id: handle.to_string(),
            staging_target_path: crate::node::path(&staging),
        },
        staging,
        target,
    }
}

/// Node 1, back after a takeover by node `front` (`on`, its daemon): its
/// volume made that front end's replica and rebuilt, both replicas
/// healthy, node 1's second.
fn back_as_replica(env: &Env, on: &Env, vol: &str, front: &str) -> Result<()> {
    let rebuilt = wait(
        "node 1's replica rebuilt by the new front end",
        Duration::from_secs(120),
        |last| {
            let all = replicas(on, vol)?;
            *last = format!("{all:?}");
            Ok((all.len() == 2 && all.iter().all(|(_, s)| s == "healthy")).then_some(all))
        },
    )?;
    ensure!(
        rebuilt[1].0 == NODE_ID,
        "the replicas after node 1 returned: {rebuilt:?}"
    );
    let mine = env.lamina_json(&["volume", "get", vol])?;
    ensure!(
        mine["labels"]["lamina.io/replica-of"] == front && mine["replication"].is_null(),
        "node 1's volume is not the new front end's replica: {mine}"
    );
    Ok(())
}

/// o. The front end's node lost: a 2-replica PVC, its PV usable on every
/// node (no node affinity), attached and written on node 1,
/// node 1's daemon SIGKILLed. Playing kubelet's part once the pod moved,
/// NodeStageVolume and NodePublishVolume with the PV's handle on the other
/// replica's node (its node plugin): the volume is taken over there, its
/// front end at the next generation (the shared record names it, node 1's
/// replica faulted), the data intact through the published device,
/// writes go on, and the Volume resource moves to that node. Node 1 back,
/// its daemon's front end is refused (fenced by the shared record), its
/// volume becomes the new front end's replica and is rebuilt from it, the
/// two replicas alike; attaching it on node 1 is refused. A VolumeSnapshot
/// and a VolumeGroupSnapshot taken before the takeover, deleted after it
/// by the ids that name node 1, are deleted on both nodes: both while
/// node 1 is down and its node Secret gone (then a
/// new VolumeSnapshot of the claim is taken on the new front end too). Unstaged and
/// staged again there, the volume is found by the PV's handle; the PVC
/// deleted, the CSI controller deletes it from its new front end.
pub fn front_end_moved(env: &Env) -> Result<()> {
    let ns = "front-end-moved";
    let (vol, other, node_x, _) = two_replica_claim(env, ns, "lamina-moved-2", "data")?;
    let (handle, context) = pv_of(env, &vol)?;
    ensure!(
        context.get("csi.lamina.io/replicas").map(String::as_str) == Some("2"),
        "the PV's volume attributes: {context:?}"
    );
    // Node X's node list lacks node 1 (the CSI controller put there only
    // the nodes it placed replicas on): Lamina's controllers give it node
    // 1's address once node X's front end holds the volume.
    let _ = node_x.lamina(&["node", "remove", NODE_ID]);
    let g = written_on_node_1(env, &vol, 0x71)?;

    // A VolumeSnapshot through node 1's front end: its id names node 1.
    env.apply(&volume_snapshot(ns, "before", "data", "lamina"))?;
    env.wait_snapshot_ready(ns, "before", T)?;
    let (_, before, _) = env.engine_snapshot(ns, "before")?;
    // And a VolumeGroupSnapshot of the claim: its id names node 1 too.
    env.kubectl(&["label", "-n", ns, "pvc", "data", "group=moved"])?;
    env.apply(&format!(
        "apiVersion: groupsnapshot.storage.k8s.io/v1\nkind: VolumeGroupSnapshot\n\
         metadata: {{name: grp, namespace: {ns}}}\nspec:\n  volumeGroupSnapshotClassName: lamina\n  \
         source: {{selector: {{matchLabels: {{group: moved}}}}}}\n"
    ))?;
    wait("the VolumeGroupSnapshot to be readyToUse", T, |last| {
        let Some(g) = env.get(ns, "volumegroupsnapshot", "grp")? else {
            return Ok(None);
        };
        *last = format!("status {}", g["status"]);
        Ok((g["status"]["readyToUse"] == true).then_some(()))
    })
    .with_context(|| env.events(ns, "grp"))?;
    let member = env
        .lamina_json(&["snapshot", "list", &vol])?
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| !s["labels"]["lamina.io/group"].is_null())
        .and_then(|s| s["name"].as_str().map(str::to_string))
        .context("no member of the group snapshot on node 1")?;

    let node1 = env.stop("lamina", libc::SIGKILL)?;
    // Kubelet's part on the other node, block access.
    let plugin = crate::node::NodePlugin::start(&node_x, &other, "front-end-moved")?;
    let mut csi_node = plugin.client.clone();
    let BlockCalls {
        staging,
        target,
        stage,
        publish,
        unpublish,
        unstage,
    } = block_calls(&plugin, &handle, context);
    let guard = plugin.staged(&handle, &staging, Some(&target));
    plugin
        .rt
        .block_on(csi_node.node_stage_volume(stage.clone()))
        .context("NodeStageVolume on the other replica's node")?;
    plugin
        .rt
        .block_on(csi_node.node_publish_volume(publish.clone()))
        .context("NodePublishVolume")?;
    let device = crate::node::path(&target);
    let rec = shared_record(env, &vol)?;
    ensure!(
        rec["frontEnd"] == other.as_str()
            && rec["generation"].as_u64() == Some(g + 1)
            && faults(&rec) == [(other.clone(), false), (NODE_ID.to_string(), true)],
        "the shared record after the takeover: {rec}"
    );
    let taken = node_x.lamina_json(&["volume", "get", &vol])?;
    ensure!(
        taken["labels"]["csi.lamina.io/volume-id"] == handle.as_str()
            && taken["labels"]["csi.lamina.io/replicas"] == "2"
            && taken["labels"]["lamina.io/replica-of"].is_null(),
        "the volume taken over on {other}: {taken}"
    );
    crate::env::qemu_io(&device, "read -P 0x71 0 8M").context("the data after the takeover")?;
    crate::env::qemu_io(&device, "write -P 0x72 0 4M")?;
    let address = transfer_address(env, NODE_ID)?;
    wait(
        "node 1 in the new front end's node list, at its Secret's address",
        T,
        |last| {
            let listed = node_x.lamina_json(&["node", "list"])?;
            *last = listed.to_string();
            Ok(listed
                .as_array()
                .into_iter()
                .flatten()
                .any(|n| n["name"] == NODE_ID && n["address"] == address.as_str())
                .then_some(()))
        },
    )?;
    wait(
        "the Volume resource on the new front end's node",
        T,
        |last| {
            let v = env
                .get("lamina", "volumes.lamina.io", &vol)?
                .context("no Volume resource")?;
            *last = format!("{} {}", v["spec"], v["status"]["replication"]);
            Ok((v["spec"]["node"] == other.as_str()
                && v["status"]["replication"]["frontEnd"] == other.as_str())
            .then_some(()))
        },
    )?;
    for (where_, name) in [("lamina", vol.as_str()), (ns, "data")] {
        wait(&format!("a Fenced warning on {where_}/{name}"), T, |last| {
            *last = env.events(where_, name);
            Ok(env
                .events_json(where_, name)?
                .iter()
                .any(|e| e["reason"] == "Fenced" && e["type"] == "Warning")
                .then_some(()))
        })?;
    }

    // Node 1 still down, and its node Secret gone (as when its pod is
    // deleted): the ids that name node 1 are found on the node that took
    // the volume over. A VolumeSnapshot of the claim is taken there; the
    // one taken before the takeover is deleted there (and on node 1 once
    // it is back, by the rebuild).
    let secret = format!("lamina-node-{NODE_ID}");
    env.kubectl(&["delete", "-n", "lamina", "secret", &secret])?;
    let _register_again = RegisterAgain {
        env,
        address: address.clone(),
    };
    env.apply(&volume_snapshot(ns, "during", "data", "lamina"))?;
    env.wait_snapshot_ready(ns, "during", T)
        .context("a VolumeSnapshot of the claim while node 1 and its Secret are gone")?;
    let (_, during, _) = env.engine_snapshot(ns, "during")?;
    ensure!(
        node_x
            .lamina(&["snapshot", "list", &vol])?
            .contains(&during),
        "the VolumeSnapshot taken while node 1 was gone is not on {other}"
    );
    env.kubectl(&[
        "delete",
        "-n",
        ns,
        "volumesnapshot",
        "before",
        "--wait=true",
    ])?;
    wait(
        &format!("snapshot {before} deleted on {other}"),
        T,
        |last| {
            let list = node_x.lamina(&["snapshot", "list", &vol])?;
            *last = list.clone();
            Ok((!list.contains(&before)).then_some(()))
        },
    )?;
    // The group snapshot taken before the takeover, whose id names node 1,
    // deleted while node 1 and its Secret are gone.
    env.kubectl(&[
        "delete",
        "-n",
        ns,
        "volumegroupsnapshot",
        "grp",
        "--wait=true",
    ])
    .context("deleting a group snapshot whose node is gone")?;
    wait(
        &format!("group member {member} deleted on {other}"),
        T,
        |last| {
            let list = node_x.lamina(&["snapshot", "list", &vol])?;
            *last = list.clone();
            Ok((!list.contains(&member)).then_some(()))
        },
    )?;
    drop(_register_again);

    // Node 1 back: refused, made the new front end's replica, rebuilt.
    node1.start()?;
    back_as_replica(env, &node_x, &vol, &other)?;
    let refused = env.attach_volume(&vol);
    ensure!(
        refused.is_err(),
        "node 1 attached the volume it lost: {refused:?}"
    );
    // Alike: a snapshot taken through the new front end, on both.
    node_x.lamina(&["snapshot", "create", &vol, "moved"])?;
    let a = uri_of(&node_x.lamina_json(&["snapshot", "attach", &vol, "moved"])?)?;
    let b = uri_of(&env.lamina_json(&["snapshot", "attach", &vol, "moved"])?)?;
    let cmp = run(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw", &a, &b]));
    // Read-only: a snapshot's export takes no writer.
    let read = |cmd: &str| -> Result<()> {
        let out = run(Command::new("qemu-io").args(["-r", "-f", "raw", &b, "-c", cmd]))?;
        ensure!(
            !out.contains("Pattern verification") && !out.contains("failed"),
            "{cmd}: {out}"
        );
        Ok(())
    };
    let pattern = read("read -P 0x72 0 4M").and_then(|_| read("read -P 0x71 4M 4M"));
    node_x.lamina(&["snapshot", "detach", &vol, "moved"])?;
    env.lamina(&["snapshot", "detach", &vol, "moved"])?;
    cmp.context("node 1's rebuilt replica differs from the new front end's")?;
    pattern.context("node 1's rebuilt replica")?;
    // The snapshot taken before the takeover, deleted while node 1 was
    // away: gone from node 1's replica too. The one taken while node 1
    // was away, deleted now through the front end, on every replica.
    wait(
        &format!("snapshot {before} deleted on {NODE_ID}"),
        T,
        |last| {
            let list = env.lamina(&["snapshot", "list", &vol])?;
            *last = list.clone();
            Ok((!list.contains(&before)).then_some(()))
        },
    )?;
    env.kubectl(&[
        "delete",
        "-n",
        ns,
        "volumesnapshot",
        "during",
        "--wait=true",
    ])?;
    for (n, on) in [(NODE_ID, env), (other.as_str(), &node_x)] {
        wait(&format!("snapshot {during} deleted on {n}"), T, |last| {
            let list = on.lamina(&["snapshot", "list", &vol])?;
            *last = list.clone();
            Ok((!list.contains(&during)).then_some(()))
        })?;
    }
    // So is the group snapshot taken before it, deleted while node 1 was
    // down (its id names node 1): member by member, by the members' ids,
    // through the front end now serving each, and on node 1 by its
    // rebuild.
    for (n, on) in [(NODE_ID, env), (other.as_str(), &node_x)] {
        wait(
            &format!("group member {member} deleted on {n}"),
            T,
            |last| {
                let list = on.lamina(&["snapshot", "list", &vol])?;
                *last = list.clone();
                Ok((!list.contains(&member)).then_some(()))
            },
        )?;
    }
    // The pod gone and back on the same node: its handle still names the
    // volume there, whose pool id is that node's own.
    for round in ["", ", again"] {
        plugin
            .rt
            .block_on(csi_node.node_unpublish_volume(unpublish.clone()))
            .with_context(|| format!("NodeUnpublishVolume{round}"))?;
        plugin
            .rt
            .block_on(csi_node.node_unstage_volume(unstage.clone()))
            .with_context(|| format!("NodeUnstageVolume{round}"))?;
        ensure!(
            node_x.lamina_json(&["volume", "get", &vol])?["export"].is_null(),
            "the volume is still exported after NodeUnstageVolume{round}"
        );
        if round.is_empty() {
            plugin
                .rt
                .block_on(csi_node.node_stage_volume(stage.clone()))
                .context("NodeStageVolume, again")?;
            plugin
                .rt
                .block_on(csi_node.node_publish_volume(publish.clone()))
                .context("NodePublishVolume, again")?;
            crate::env::qemu_io(&device, "read -P 0x72 0 4M").context("the data staged again")?;
        }
    }
    guard.done();
    drop(plugin);
    // The pod moved back to node 1, both nodes up: node 1 takes the volume
    // over again, and node X, whose daemon lives on with the volume
    // detached, is made node 1's replica as soon as node 1's front end
    // reaches it, and rebuilt.
    let back = crate::node::NodePlugin::start(env, NODE_ID, "front-end-moved-back")?;
    let mut csi_back = back.client.clone();
    let staging = back.work.path().join("staging");
    let stage_back = NodeStageVolumeRequest {
        staging_target_path: crate::node::path(&staging),
        ..stage
    };
    let guard = back.staged(&handle, &staging, None);
    back.rt
        .block_on(csi_back.node_stage_volume(stage_back.clone()))
        .context("NodeStageVolume back on node 1")?;
    let rec = shared_record(env, &vol)?;
    ensure!(
        // Each open of a front end takes a generation: node X's took
        // g + 1 and one more when staged again.
        rec["frontEnd"] == NODE_ID && rec["generation"].as_u64() > Some(g + 2),
        "the shared record after the move back: {rec}"
    );
    wait(
        "node X's volume made node 1's replica and rebuilt, with no restart",
        Duration::from_secs(120),
        |last| {
            let all = replicas(env, &vol)?;
            let there = node_x.lamina_json(&["volume", "get", &vol])?;
            *last = format!("{all:?} {}", there["labels"]);
            Ok((all.len() == 2
                && all.iter().all(|(_, s)| s == "healthy")
                && there["labels"]["lamina.io/replica-of"] == NODE_ID)
                .then_some(()))
        },
    )?;
    back.rt
        .block_on(csi_back.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: handle.clone(),
            staging_target_path: crate::node::path(&staging),
        }))
        .context("NodeUnstageVolume on node 1")?;
    guard.done();
    drop(back);
    env.kubectl(&["delete", "-n", ns, "pvc", "data", "--wait=true"])?;
    for (n, on) in [(NODE_ID, env), (other.as_str(), &node_x)] {
        wait(&format!("the volume deleted on {n}"), T, |last| {
            let r = on.lamina(&["volume", "get", &vol]);
            *last = format!("{r:?}");
            Ok(r.is_err().then_some(()))
        })?;
    }
    env.kubectl(&["delete", "storageclass", "lamina-moved-2"])?;
    Ok(())
}

/// p. A front end on a node that holds no replica: a 2-replica PVC made on
/// node 1 (its PV with no node affinity), written there, node 1's daemon
/// SIGKILLed. Playing kubelet's part once the pod moved to the third node,
/// which holds neither replica: NodeStageVolume there (tried again until
/// its daemon reaches the replicas, as kubelet does) starts a front end
/// holding no replica, at a higher generation (the shared record names
/// it, `diskless`, the other replica healthy and node 1's faulted); the
/// data reads back through the published device, writes go on, the
/// Volume resource moves there, and a snapshot is refused there, saying
/// where to take one. Node 1 back: its front end refused, its volume made
/// the third node's replica and copied through the front end, its attach
/// refused. The other replica's daemon SIGKILLed under a write: the write
/// succeeds, every byte reads back from node 1's rebuilt replica alone;
/// back, the other replica is sent no more than 1.5 times what was
/// written while it was away. Unstaged, and the PVC deleted: the CSI
/// controller finds the volume through node 1's replica and deletes it on
/// every node.
pub fn front_end_without_replica(env: &Env) -> Result<()> {
    let ns = "front-end-no-replica";
    let (vol, other, node_x, component_x) =
        two_replica_claim(env, ns, "lamina-no-replica-2", "data")?;
    let (third, node_z) = match other.as_str() {
        NODE_2 => (NODE_3, env.on_node_3()?),
        _ => (NODE_2, env.on_node_2()?),
    };
    let (handle, context) = pv_of(env, &vol)?;
    // The third node's daemon lists neither replica's node: Lamina's
    // controllers give it their addresses once it fronts the volume.
    for n in [NODE_ID, other.as_str()] {
        let _ = node_z.lamina(&["node", "remove", n]);
    }
    let g = written_on_node_1(env, &vol, 0x61)?;

    let node1 = env.stop("lamina", libc::SIGKILL)?;
    let plugin = crate::node::NodePlugin::start(&node_z, third, "front-end-without-replica")?;
    let mut csi_node = plugin.client.clone();
    let BlockCalls {
        staging,
        target,
        stage,
        publish,
        unpublish,
        unstage,
    } = block_calls(&plugin, &handle, context);
    let guard = plugin.staged(&handle, &staging, Some(&target));
    let t0 = std::time::Instant::now();
    wait(
        "NodeStageVolume on the node holding no replica",
        Duration::from_secs(90),
        |last| {
            let mut c = csi_node.clone();
            match plugin.rt.block_on(c.node_stage_volume(stage.clone())) {
                Ok(_) => Ok(Some(())),
                Err(e) => {
                    *last = e.to_string();
                    Ok(None)
                }
            }
        },
    )?;
    eprintln!(
        "front-end-without-replica: staged on {third} {:.1} s after node 1 was killed",
        t0.elapsed().as_secs_f64()
    );
    plugin
        .rt
        .block_on(csi_node.node_publish_volume(publish.clone()))
        .context("NodePublishVolume")?;
    let device = crate::node::path(&target);
    let rec = shared_record(env, &vol)?;
    ensure!(
        rec["frontEnd"] == third
            && rec["diskless"] == true
            && rec["generation"].as_u64() > Some(g)
            && faults(&rec) == [(other.clone(), false), (NODE_ID.to_string(), true)],
        "the shared record after the takeover: {rec}"
    );
    crate::env::qemu_io(&device, "read -P 0x61 0 8M").context("the data after the takeover")?;
    crate::env::qemu_io(&device, "write -P 0x62 0 4M")?;
    let here = node_z.lamina_json(&["volume", "get", &vol])?;
    ensure!(
        here["replication"]["diskless"] == true
            && here["size"].as_u64() == Some(64 << 20)
            && !here["export"].is_null(),
        "the volume on {third}: {here}"
    );
    wait(
        "the Volume resource on the node holding no replica",
        T,
        |last| {
            let v = env
                .get("lamina", "volumes.lamina.io", &vol)?
                .context("no Volume resource")?;
            *last = format!("{} {}", v["spec"], v["status"]["replication"]);
            Ok(
                (v["spec"]["node"] == third && v["status"]["replication"]["frontEnd"] == third)
                    .then_some(()),
            )
        },
    )?;
    let refused = node_z.lamina(&["snapshot", "create", &vol, "there"]);
    ensure!(
        refused
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("holds no replica")),
        "a snapshot on the front end holding no replica: {refused:?}"
    );

    // Node 1 back: refused, made the third node's replica, copied whole.
    node1.start()?;
    back_as_replica(env, &node_z, &vol, third)?;
    let refused = env.attach_volume(&vol);
    ensure!(
        refused.is_err(),
        "node 1 attached the volume it lost: {refused:?}"
    );

    // The other replica lost under a write: the write succeeds, and every
    // byte reads back from node 1's rebuilt replica alone.
    let away = node_x.stop(component_x, libc::SIGKILL)?;
    crate::env::qemu_io(&device, "write -P 0x63 8M 4M")
        .context("a write while the other replica's daemon is down")?;
    for (pattern, at) in [(0x62, "0 4M"), (0x61, "4M 4M"), (0x63, "8M 4M")] {
        crate::env::qemu_io(&device, &format!("read -P {pattern:#x} {at}"))
            .with_context(|| format!("node 1's rebuilt replica at {at}"))?;
    }
    away.start()?;
    let sent = wait(
        "the other replica rebuilt through the front end",
        Duration::from_secs(120),
        |last| {
            let v = node_z.lamina_json(&["volume", "get", &vol])?;
            let all = node_states(&v["replication"]["replicas"]);
            *last = format!("{all:?}");
            let done = all.len() == 2 && all.iter().all(|(_, s)| s == "healthy");
            Ok(done
                .then(|| {
                    v["replication"]["replicas"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|r| r["node"] == other.as_str())
                        .and_then(|r| r["last_rebuild"]["sent_bytes"].as_u64())
                })
                .flatten())
        },
    )?;
    eprintln!(
        "front-end-without-replica: the returning replica was sent {sent} bytes for {} written while it was away",
        4u64 << 20
    );
    ensure!(
        sent <= 6 << 20,
        "the returning replica was sent {sent} bytes for 4 MiB written while it was away"
    );
    for (pattern, at) in [(0x62, "0 4M"), (0x61, "4M 4M"), (0x63, "8M 4M")] {
        crate::env::qemu_io(&device, &format!("read -P {pattern:#x} {at}"))
            .with_context(|| format!("the volume at {at}"))?;
    }

    plugin
        .rt
        .block_on(csi_node.node_unpublish_volume(unpublish))
        .context("NodeUnpublishVolume")?;
    plugin
        .rt
        .block_on(csi_node.node_unstage_volume(unstage))
        .context("NodeUnstageVolume")?;
    guard.done();
    drop(plugin);
    env.kubectl(&["delete", "-n", ns, "pvc", "data", "--wait=true"])?;
    for (n, on) in [(NODE_ID, env), (other.as_str(), &node_x), (third, &node_z)] {
        wait(&format!("the volume deleted on {n}"), T, |last| {
            let r = on.lamina(&["volume", "get", &vol]);
            *last = format!("{r:?}");
            Ok(r.is_err().then_some(()))
        })?;
    }
    env.kubectl(&["delete", "storageclass", "lamina-no-replica-2"])?;
    Ok(())
}
