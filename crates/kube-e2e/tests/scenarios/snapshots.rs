//! The standard snapshot API on one volume: a VolumeSnapshot becomes ready,
//! restores and clones hold the right data, deletion policies, and a
//! pre-provisioned VolumeSnapshotContent importing a CLI-made snapshot.

use crate::env::{pvc, volume_snapshot, wait, Env, DRIVER};
use anyhow::{bail, ensure, Context, Result};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);
const MIB64: u64 = 64 << 20;

/// A bound 64 MiB PVC holding byte `pattern` over its first MiB; its volume.
fn bound_pvc_with(env: &Env, ns: &str, name: &str, pattern: u8) -> Result<String> {
    env.apply(&pvc(ns, name, "lamina", "64Mi", None))?;
    let vol = env.wait_bound(ns, name, T)?;
    env.write_pattern(&vol, pattern, "1M")?;
    Ok(vol)
}

/// a. A PVC binds; a VolumeSnapshot of it becomes readyToUse with
/// restoreSize equal to the volume's size and a creationTime.
pub fn snapshot_ready(env: &Env) -> Result<()> {
    let ns = "snapshot-ready";
    env.namespace(ns)?;
    let vol = bound_pvc_with(env, ns, "data", 0xa1)?;
    let size = env.lamina_json(&["volume", "get", &vol])?["size"]
        .as_u64()
        .context("volume size")?;
    ensure!(
        size == MIB64,
        "volume {vol} has {size} bytes, the PVC asked 64 MiB"
    );
    env.apply(&volume_snapshot(ns, "snap", "data", "lamina"))?;
    let s = env.wait_snapshot_ready(ns, "snap", T)?;
    let restore = s["status"]["restoreSize"]
        .as_str()
        .context("no restoreSize")?;
    ensure!(
        restore == "64Mi" || restore == MIB64.to_string(),
        "restoreSize {restore}, want 64Mi"
    );
    ensure!(
        s["status"]["creationTime"].is_string(),
        "no creationTime: {}",
        s["status"]
    );
    let (svol, snap, _) = env.engine_snapshot(ns, "snap")?;
    ensure!(svol == vol, "the snapshot is of {svol}, not {vol}");
    ensure!(
        env.engine_snapshots()?.contains(&(vol, snap)),
        "the engine has no such snapshot"
    );
    Ok(())
}

/// b. A PVC restored from a snapshot holds the snapshot's data, not what
/// the source holds since.
pub fn restore_from_snapshot(env: &Env) -> Result<()> {
    let ns = "restore-from-snapshot";
    env.namespace(ns)?;
    let vol = bound_pvc_with(env, ns, "data", 0xb1)?;
    env.apply(&volume_snapshot(ns, "snap", "data", "lamina"))?;
    env.wait_snapshot_ready(ns, "snap", T)?;
    env.write_pattern(&vol, 0xb2, "1M")?;
    env.apply(&pvc(
        ns,
        "restored",
        "lamina",
        "64Mi",
        Some(("VolumeSnapshot", "snap")),
    ))?;
    let restored = env.wait_bound(ns, "restored", T)?;
    env.check_pattern(&restored, 0xb1, "1M")
        .context("the restore")?;
    env.check_pattern(&vol, 0xb2, "1M")
        .context("the source after the restore")?;
    Ok(())
}

/// c. A PVC cloned from a PVC holds the source's data.
pub fn clone_from_pvc(env: &Env) -> Result<()> {
    let ns = "clone-from-pvc";
    env.namespace(ns)?;
    let vol = bound_pvc_with(env, ns, "data", 0xc1)?;
    env.apply(&pvc(
        ns,
        "clone",
        "lamina",
        "64Mi",
        Some(("PersistentVolumeClaim", "data")),
    ))?;
    let clone = env.wait_bound(ns, "clone", T)?;
    env.check_pattern(&clone, 0xc1, "1M").context("the clone")?;
    // They are independent: a write to the source does not reach the clone.
    env.write_pattern(&vol, 0xc2, "1M")?;
    env.check_pattern(&clone, 0xc1, "1M")
        .context("the clone after the source changed")?;
    Ok(())
}

/// d. deletionPolicy Delete removes the engine snapshot; Retain keeps it
/// (and its VolumeSnapshotContent) after the VolumeSnapshot is deleted.
pub fn deletion_policy(env: &Env) -> Result<()> {
    let ns = "deletion-policy";
    env.namespace(ns)?;
    bound_pvc_with(env, ns, "data", 0xd1)?;
    env.apply(&volume_snapshot(ns, "deleted", "data", "lamina"))?;
    env.apply(&volume_snapshot(ns, "retained", "data", "lamina-retain"))?;
    env.wait_snapshot_ready(ns, "deleted", T)?;
    env.wait_snapshot_ready(ns, "retained", T)?;
    let (dvol, dsnap, _) = env.engine_snapshot(ns, "deleted")?;
    let (rvol, rsnap, _) = env.engine_snapshot(ns, "retained")?;
    let rcontent = env
        .get(ns, "volumesnapshot", "retained")?
        .context("retained")?["status"]["boundVolumeSnapshotContentName"]
        .as_str()
        .context("retained: no content")?
        .to_string();
    env.kubectl(&[
        "delete",
        "volumesnapshot",
        "-n",
        ns,
        "deleted",
        "retained",
        "--wait=false",
    ])?;
    env.wait_gone(ns, "volumesnapshot", "deleted", T)?;
    env.wait_gone(ns, "volumesnapshot", "retained", T)?;
    wait("the engine snapshot of the Delete class to go", T, |last| {
        let all = env.engine_snapshots()?;
        *last = format!("{all:?}");
        Ok((!all.contains(&(dvol.clone(), dsnap.clone()))).then_some(()))
    })?;
    ensure!(
        env.engine_snapshots()?.contains(&(rvol, rsnap)),
        "the engine snapshot of the Retain class is gone"
    );
    let c = env.get("", "volumesnapshotcontent", &rcontent)?;
    ensure!(
        c.is_some(),
        "the Retain class's VolumeSnapshotContent {rcontent} is gone"
    );
    Ok(())
}

/// f. A pre-provisioned VolumeSnapshotContent whose handle names a snapshot
/// taken with the CLI binds a VolumeSnapshot that becomes ready; a restore
/// from it holds the snapshot's data.
pub fn pre_provisioned_content(env: &Env) -> Result<()> {
    let ns = "pre-provisioned-content";
    env.namespace(ns)?;
    let vol = "imported-by-cli";
    env.lamina(&["volume", "create", vol, "--size", "32M"])?;
    env.write_pattern(vol, 0xf1, "1M")?;
    env.lamina(&["snapshot", "create", vol, "gold"])?;
    env.write_pattern(vol, 0xf2, "1M")?;
    let id = env.lamina_json(&["snapshot", "get", vol, "gold"])?["id"]
        .as_u64()
        .context("snapshot id")?;
    let handle = format!("{vol}/gold@{id}");
    env.apply(&format!(
        "apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshotContent\nmetadata: {{name: {ns}-gold}}\n\
         spec:\n  deletionPolicy: Retain\n  driver: {DRIVER}\n  volumeSnapshotClassName: lamina-retain\n  \
         source: {{snapshotHandle: \"{handle}\"}}\n  volumeSnapshotRef: {{name: gold, namespace: {ns}}}\n---\n\
         apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshot\nmetadata: {{name: gold, namespace: {ns}}}\n\
         spec:\n  volumeSnapshotClassName: lamina-retain\n  source: {{volumeSnapshotContentName: {ns}-gold}}\n"
    ))?;
    let s = env.wait_snapshot_ready(ns, "gold", T)?;
    let restore = s["status"]["restoreSize"].as_str().unwrap_or_default();
    if restore != "32Mi" && restore != (32u64 << 20).to_string() {
        bail!("restoreSize {restore}, want 32Mi (the CLI volume's size)");
    }
    env.apply(&pvc(
        ns,
        "restored",
        "lamina",
        "32Mi",
        Some(("VolumeSnapshot", "gold")),
    ))?;
    let restored = env.wait_bound(ns, "restored", T)?;
    env.check_pattern(&restored, 0xf1, "1M")
        .context("the restore of the imported snapshot")?;
    Ok(())
}
