//! The controllers against a real kube-apiserver (the kube-env scripts):
//! a Snapshot created with kubectl is taken in the engine; one taken with
//! the daemon's API appears in kubectl; deleting a Snapshot resource deletes
//! the engine snapshot; a Volume resource makes a volume, whose deletion is
//! refused while a linked clone depends on it (an event names the clone)
//! and waits for its snapshots; two controller replicas, the active one
//! killed with SIGKILL right after a Snapshot is asked for: the other takes
//! the lease and exactly one engine snapshot results.

mod support;

use lamina_api as api;
use serde_json::Value;
use std::time::Duration;
use support::{eventually, free_port, Env, NODE, NS};

const LIMIT: Duration = Duration::from_secs(120);

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The Snapshot resource of engine snapshot VOLUME/NAME, if any.
fn snapshot_resource(env: &Env, volume: &str, name: &str) -> Option<Value> {
    env.items("snapshots.lamina.io").into_iter().find(|s| {
        let engine = s["spec"]["snapshotName"]
            .as_str()
            .or(s["metadata"]["name"].as_str());
        s["spec"]["volume"] == volume && engine == Some(name)
    })
}

fn ready(v: &Value) -> bool {
    v["status"]["readyToUse"] == true
}

#[test]
fn the_controllers_against_a_real_api_server() {
    let mut env = Env::up("scenarios");
    let rt = rt();
    let c = env.client();
    env.start_controller("c1", free_port());
    eventually("c1 holds the lease", LIMIT, || {
        (env.lease_holder() == "c1").then_some(())
    });

    // An engine volume gets a Volume resource.
    rt.block_on(c.create_volume(&api::CreateVolume {
        name: "v1".into(),
        size: 16 << 20,
        ..Default::default()
    }))
    .unwrap();
    let v1 = eventually("a Volume resource for engine volume v1", LIMIT, || {
        env.items("volumes.lamina.io")
            .into_iter()
            .find(|v| v["metadata"]["name"] == "v1" && v["status"]["state"] == "Ready")
    });
    assert_eq!(v1["spec"]["node"], NODE);
    assert_eq!(v1["status"]["sizeBytes"], 16 << 20);

    kubectl_snapshot_is_taken(&env, &rt, &c);
    the_api_server_enforces_the_schema_and_cel_rules(&env);
    api_snapshot_appears(&env, &rt, &c);
    volume_resource_lifecycle(&env, &rt, &c);
    killing_the_active_controller_mid_snapshot_leaves_one(&mut env, &rt, &c);
}

fn kubectl_snapshot_is_taken(env: &Env, rt: &tokio::runtime::Runtime, c: &lamina_client::Client) {
    env.apply(&format!(
        "apiVersion: lamina.io/v1alpha1\nkind: Snapshot\nmetadata: {{name: s-kubectl, namespace: {NS}}}\nspec: {{volume: v1, createSnapshot: true, labels: {{made-by: kubectl}}}}\n"
    ));
    let s = eventually("the kubectl Snapshot is taken and ready", LIMIT, || {
        snapshot_resource(env, "v1", "s-kubectl").filter(ready)
    });
    assert_eq!(s["status"]["userCreated"], true);
    assert_eq!(s["status"]["restoreSize"], 16 << 20);
    let engine = rt.block_on(c.get_snapshot("v1", "s-kubectl")).unwrap();
    assert_eq!(
        engine.labels.get("made-by").map(String::as_str),
        Some("kubectl")
    );
    assert_eq!(s["status"]["creationTime"], engine.created.as_str());

    // Deleting the resource deletes the engine snapshot first.
    env.kubectl(&[
        "-n",
        NS,
        "delete",
        "snapshots.lamina.io",
        "s-kubectl",
        "--timeout=120s",
    ]);
    let e = rt.block_on(c.get_snapshot("v1", "s-kubectl")).unwrap_err();
    assert!(e.is_not_found(), "{e}");
}

/// The CRDs' validation runs in the real API server: patterns, and the CEL
/// rules that keep a Snapshot's spec immutable and system names reserved.
fn the_api_server_enforces_the_schema_and_cel_rules(env: &Env) {
    let snapshot = |name: &str, spec: &str| {
        format!("apiVersion: lamina.io/v1alpha1\nkind: Snapshot\nmetadata: {{name: {name}, namespace: {NS}}}\nspec: {spec}\n")
    };
    let (ok, err) = env.try_apply(&snapshot(
        "bad-volume",
        "{volume: Not_A_Name, createSnapshot: true}",
    ));
    assert!(
        !ok && err.contains("spec.volume"),
        "a bad volume name is refused: {err}"
    );
    let (ok, err) = env.try_apply(&snapshot(
        "system-name",
        "{volume: v1, snapshotName: .mine, createSnapshot: true}",
    ));
    assert!(
        !ok && err.contains("system"),
        "a system name cannot be requested: {err}"
    );

    env.apply(&snapshot(
        "s-immutable",
        "{volume: v1, createSnapshot: true}",
    ));
    eventually("s-immutable is taken", LIMIT, || {
        snapshot_resource(env, "v1", "s-immutable").filter(ready)
    });
    let (ok, err) = env.try_apply(&snapshot(
        "s-immutable",
        "{volume: v2, createSnapshot: true}",
    ));
    assert!(
        !ok && err.contains("volume is immutable"),
        "spec.volume is immutable: {err}"
    );
    env.kubectl(&[
        "-n",
        NS,
        "delete",
        "snapshots.lamina.io",
        "s-immutable",
        "--timeout=120s",
    ]);
}

fn api_snapshot_appears(env: &Env, rt: &tokio::runtime::Runtime, c: &lamina_client::Client) {
    // taken with the CLI, over the daemon's TCP API
    let out = std::process::Command::new(&env.lamina)
        .args([
            "--endpoint",
            env.var("LAMINA_ENDPOINT"),
            "snapshot",
            "create",
            "v1",
            "from-cli",
        ])
        .env("LAMINA_TOKEN", env.var("LAMINA_TOKEN"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "lamina snapshot create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = eventually("a Snapshot resource for v1/from-cli", LIMIT, || {
        snapshot_resource(env, "v1", "from-cli").filter(ready)
    });
    assert_eq!(s["spec"]["createSnapshot"], false);
    assert_eq!(s["status"]["userCreated"], true);
    assert_eq!(s["status"]["node"], NODE);
    assert_eq!(s["metadata"]["labels"]["lamina.io/volume"], "v1");
    let table = env.kubectl(&["-n", NS, "get", "snapshots.lamina.io"]);
    let name = s["metadata"]["name"].as_str().unwrap();
    let row = table.lines().find(|l| l.starts_with(name)).unwrap();
    assert!(
        row.contains(" v1 ") && row.contains("true"),
        "kubectl get shows volume and readiness: {row}"
    );

    // A system snapshot (a clone of a volume as it is now) gets a resource
    // too, with a valid name mapped from its '.' name.
    let clone = api::CreateClone {
        name: "v1-copy".into(),
        from_snapshot: None,
        from_volume: Some("v1".into()),
        full: false,
        from_node: None,
    };
    rt.block_on(c.create_clone(&clone)).unwrap();
    let sys = rt
        .block_on(c.list_snapshots("v1"))
        .unwrap()
        .into_iter()
        .find(|s| s.system)
        .unwrap();
    let r = eventually("a Snapshot resource for the system snapshot", LIMIT, || {
        snapshot_resource(env, "v1", &sys.name).filter(ready)
    });
    assert_eq!(r["status"]["userCreated"], false);
    assert_eq!(r["spec"]["snapshotName"], sys.name.as_str());

    // Deleting the mirrored resource deletes the engine snapshot.
    env.kubectl(&[
        "-n",
        NS,
        "delete",
        "snapshots.lamina.io",
        name,
        "--timeout=120s",
    ]);
    assert!(rt
        .block_on(c.get_snapshot("v1", "from-cli"))
        .unwrap_err()
        .is_not_found());
    // The clone going takes its system snapshot with it, and its resource goes.
    rt.block_on(c.delete_volume("v1-copy", false)).unwrap();
    eventually("the system snapshot's resource goes with it", LIMIT, || {
        snapshot_resource(env, "v1", &sys.name)
            .is_none()
            .then_some(())
    });
}

fn volume_resource_lifecycle(env: &Env, rt: &tokio::runtime::Runtime, c: &lamina_client::Client) {
    env.apply(&format!(
        "apiVersion: lamina.io/v1alpha1\nkind: Volume\nmetadata: {{name: vol-k, namespace: {NS}}}\nspec: {{size: 8Mi, node: {NODE}}}\n"
    ));
    eventually(
        "the Volume resource makes engine volume vol-k",
        LIMIT,
        || rt.block_on(c.get_volume("vol-k")).ok(),
    );
    eventually("vol-k Ready", LIMIT, || {
        (env.json(&["-n", NS, "get", "volumes.lamina.io", "vol-k"])["status"]["state"] == "Ready")
            .then_some(())
    });
    // Data, so that a clone of its snapshot shares blocks with it.
    let export = rt.block_on(c.attach_volume("vol-k")).unwrap();
    let out = std::process::Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x11 0 64k", &export.uri])
        .output()
        .expect("qemu-io (qemu-utils) runs");
    assert!(
        out.status.success(),
        "qemu-io: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    rt.block_on(c.detach_volume("vol-k", false)).unwrap();
    env.apply(&format!(
        "apiVersion: lamina.io/v1alpha1\nkind: Snapshot\nmetadata: {{name: vol-k-s, namespace: {NS}}}\nspec: {{volume: vol-k, createSnapshot: true}}\n---\napiVersion: lamina.io/v1alpha1\nkind: Volume\nmetadata: {{name: clone-k, namespace: {NS}}}\nspec: {{size: 8Mi, node: {NODE}, dataSource: {{kind: Snapshot, name: vol-k-s, mode: linked}}}}\n"
    ));
    let clone = eventually("the clone Volume makes a linked clone", LIMIT, || {
        rt.block_on(c.get_volume("clone-k")).ok()
    });
    assert_eq!(clone.clone_state, api::CloneState::Linked);
    assert_eq!(clone.origin.unwrap().volume.as_deref(), Some("vol-k"));
    eventually("clone-k's status names its origin", LIMIT, || {
        let v = env.json(&["-n", NS, "get", "volumes.lamina.io", "clone-k"]);
        (v["status"]["clone"]["origin"] == "vol-k/vol-k-s"
            && v["status"]["clone"]["state"] == "completed")
            .then_some(())
    });

    // Deleting the Volume retires its engine volume at once, though a
    // snapshot and a linked clone of it remain: both stay usable.
    let before = rt.block_on(c.get_snapshot("vol-k", "vol-k-s")).unwrap();
    env.kubectl(&[
        "-n",
        NS,
        "delete",
        "volumes.lamina.io",
        "vol-k",
        "--timeout=120s",
    ]);
    let kept = rt.block_on(c.get_snapshot("vol-k", "vol-k-s")).unwrap();
    assert!(kept.volume_deleted, "{kept:?}");
    assert_eq!(kept.id, before.id);
    let export = rt.block_on(c.attach_volume("clone-k")).unwrap();
    let out = std::process::Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read -P 0x11 0 64k", &export.uri])
        .output()
        .expect("qemu-io (qemu-utils) runs");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !said.contains("Pattern verification failed"),
        "the clone lost its data with its origin's volume: {said}"
    );
    rt.block_on(c.detach_volume("clone-k", false)).unwrap();
    let r = env.json(&["-n", NS, "get", "snapshots.lamina.io", "vol-k-s"]);
    assert_eq!(r["status"]["readyToUse"], true, "{r}");

    // The name is free at once: a new Volume of that name is a new, empty
    // engine volume; deleting the old snapshot's resource deletes the old
    // snapshot (by its id), and never touches the new volume.
    env.apply(&format!(
        "apiVersion: lamina.io/v1alpha1\nkind: Volume\nmetadata: {{name: vol-k, namespace: {NS}}}\nspec: {{size: 8Mi, node: {NODE}}}\n"
    ));
    let fresh = eventually("a new engine volume vol-k", LIMIT, || {
        rt.block_on(c.get_volume("vol-k")).ok()
    });
    assert_ne!(fresh.id, before.volume_id);
    env.kubectl(&[
        "-n",
        NS,
        "delete",
        "snapshots.lamina.io",
        "vol-k-s",
        "--timeout=120s",
    ]);
    let old = format!("vol-k@{}", before.volume_id);
    assert!(rt
        .block_on(c.get_snapshot(&old, "vol-k-s"))
        .unwrap_err()
        .is_not_found());
    assert!(rt.block_on(c.get_volume("vol-k")).is_ok());
    for name in ["clone-k", "vol-k"] {
        env.kubectl(&[
            "-n",
            NS,
            "delete",
            "volumes.lamina.io",
            name,
            "--timeout=120s",
        ]);
    }
    eventually(
        "vol-k and clone-k leave the engine and the API",
        LIMIT,
        || {
            let gone = |n| {
                rt.block_on(c.get_volume(n))
                    .is_err_and(|e| e.is_not_found())
            };
            (gone("vol-k")
                && gone("clone-k")
                && !env.try_kubectl(&["-n", NS, "get", "volumes.lamina.io", "vol-k"]))
            .then_some(())
        },
    );
}

fn killing_the_active_controller_mid_snapshot_leaves_one(
    env: &mut Env,
    rt: &tokio::runtime::Runtime,
    c: &lamina_client::Client,
) {
    rt.block_on(c.create_volume(&api::CreateVolume {
        name: "ha".into(),
        size: 4 << 20,
        ..Default::default()
    }))
    .unwrap();
    env.start_controller("c2", free_port());
    eventually("the Volume resource for ha", LIMIT, || {
        env.items("volumes.lamina.io")
            .into_iter()
            .find(|v| v["metadata"]["name"] == "ha")
    });
    assert_eq!(
        env.lease_holder(),
        "c1",
        "the standby does not take a held lease"
    );
    env.apply(&format!(
        "apiVersion: lamina.io/v1alpha1\nkind: Snapshot\nmetadata: {{name: ha-s, namespace: {NS}}}\nspec: {{volume: ha, createSnapshot: true}}\n"
    ));
    env.kill_controller("c1");
    eventually("c2 takes the lease", LIMIT, || {
        (env.lease_holder() == "c2").then_some(())
    });
    eventually("the snapshot is ready", LIMIT, || {
        snapshot_resource(env, "ha", "ha-s").filter(ready)
    });
    let snaps = rt.block_on(c.list_snapshots("ha")).unwrap();
    let names: Vec<&str> = snaps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["ha-s"], "exactly one engine snapshot");
    assert!(env.controller_running("c2"));
}
