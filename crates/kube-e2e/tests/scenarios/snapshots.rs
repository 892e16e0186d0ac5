//! The standard snapshot API on one volume: a VolumeSnapshot becomes ready,
//! restores and clones hold the right data, deletion policies, a snapshot
//! that outlives its PVC, and a pre-provisioned VolumeSnapshotContent
//! importing a CLI-made snapshot.

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

/// The pool's used bytes (`lamina pool stats`).
fn used_bytes(env: &Env) -> Result<u64> {
    env.lamina_json(&["pool", "stats"])?["used_bytes"]
        .as_u64()
        .context("pool: no used_bytes")
}

/// e. A VolumeSnapshot outlives its PVC, as a backup does: deleting the
/// PVC deletes its volume at once (the PV does not linger `Released`);
/// the snapshot restores into a new PVC whose data is read back through
/// NBD; deleting the restore and then the VolumeSnapshot frees the space
/// the data took.
pub fn snapshot_outlives_its_pvc(env: &Env) -> Result<()> {
    let ns = "snapshot-outlives-its-pvc";
    env.namespace(ns)?;
    env.apply(&pvc(ns, "data", "lamina", "64Mi", None))?;
    let vol = env.wait_bound(ns, "data", T)?;
    // 8 MiB of data, so that its going shows in the pool's used bytes.
    env.write_pattern(&vol, 0xe1, "8M")?;
    env.apply(&volume_snapshot(ns, "snap", "data", "lamina"))?;
    env.wait_snapshot_ready(ns, "snap", T)?;
    let (svol, snap, _) = env.engine_snapshot(ns, "snap")?;
    ensure!(svol == vol, "the snapshot is of {svol}, not {vol}");
    let pv = env
        .get(ns, "persistentvolumeclaim", "data")?
        .context("no PVC data")?["spec"]["volumeName"]
        .as_str()
        .context("PVC data: no volumeName")?
        .to_string();

    env.kubectl(&["delete", "pvc", "-n", ns, "data", "--wait=false"])?;
    env.wait_gone(ns, "persistentvolumeclaim", "data", T)?;
    env.wait_gone("", "persistentvolume", &pv, T)
        .with_context(|| env.events("", &pv))?;
    let vols = env.lamina_json(&["volume", "list"])?;
    ensure!(
        !vols.to_string().contains(&format!("\"{vol}\"")),
        "volume {vol} is still listed: {vols}"
    );
    let kept = env.lamina_json(&["snapshot", "list", &vol])?;
    ensure!(
        kept[0]["name"] == snap.as_str() && kept[0]["volume_deleted"] == true,
        "the snapshot of the deleted {vol}: {kept}"
    );

    env.apply(&pvc(
        ns,
        "restored",
        "lamina",
        "64Mi",
        Some(("VolumeSnapshot", "snap")),
    ))?;
    let restored = env.wait_bound(ns, "restored", T)?;
    env.check_pattern(&restored, 0xe1, "8M")
        .context("the restore of a deleted PVC's snapshot")?;

    // The restore (a linked clone) shares the data: it goes first, then
    // the VolumeSnapshot, and the data's space with it.
    env.kubectl(&["delete", "pvc", "-n", ns, "restored"])?;
    wait("the restored volume to go", T, |last| {
        let vols = env.lamina_json(&["volume", "list"])?;
        *last = vols.to_string();
        Ok((!last.contains(&format!("\"{restored}\""))).then_some(()))
    })?;
    let before = used_bytes(env)?;
    env.kubectl(&["delete", "volumesnapshot", "-n", ns, "snap"])?;
    wait("the engine snapshot to go", T, |last| {
        let all = env.engine_snapshots()?;
        *last = format!("{all:?}");
        Ok((!all.contains(&(vol.clone(), snap.clone()))).then_some(()))
    })?;
    // Freed blocks go back to the pool as reclaim runs: wait for it.
    wait("the snapshot's 8 MiB to be freed", T, |last| {
        let now = used_bytes(env)?;
        *last = format!("used {before} bytes before, {now} now");
        Ok((now + (8 << 20) <= before).then_some(()))
    })?;
    ensure!(
        env.lamina(&["snapshot", "list", &vol]).is_err(),
        "the deleted volume's record outlived its last snapshot"
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
