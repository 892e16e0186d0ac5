//! g. A restore across namespaces (CrossNamespaceVolumeDataSource): a PVC in
//! one namespace naming a VolumeSnapshot in another stays Pending, with an
//! event saying why, until a ReferenceGrant in the snapshot's namespace
//! allows it; then it binds and holds the snapshot's data.

use crate::env::{pvc, volume_snapshot, wait, Env};
use anyhow::{ensure, Context, Result};
use std::time::Duration;

const T: Duration = Duration::from_secs(120);

pub fn cross_namespace_restore(env: &Env) -> Result<()> {
    let (a, b) = ("xns-source", "xns-target");
    env.namespace(a)?;
    env.namespace(b)?;
    env.apply(&pvc(a, "data", "lamina", "32Mi", None))?;
    let vol = env.wait_bound(a, "data", T)?;
    env.write_pattern(&vol, 0x91, "1M")?;
    env.apply(&volume_snapshot(a, "snap", "data", "lamina"))?;
    env.wait_snapshot_ready(a, "snap", T)?;
    env.write_pattern(&vol, 0x92, "1M")?;

    env.apply(&format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: restored, namespace: {b}}}\nspec:\n  \
         accessModes: [ReadWriteOnce]\n  storageClassName: lamina\n  resources: {{requests: {{storage: 32Mi}}}}\n  \
         dataSourceRef: {{apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: snap, namespace: {a}}}\n"
    ))?;
    // Refused, with an event that says so, while no grant exists.
    let refusal = wait("an event refusing the cross-namespace restore", T, |last| {
        let events = env.events_json(b, "restored")?;
        *last = format!("{} events", events.len());
        Ok(events
            .into_iter()
            .filter_map(|e| e["message"].as_str().map(str::to_string))
            .find(|m| m.contains("isn't allowed")))
    })
    .with_context(|| env.events(b, "restored"))?;
    ensure!(
        refusal.contains(&format!("{a}/snap")),
        "the refusal does not name the snapshot: {refusal}"
    );
    let claim = env.get(b, "pvc", "restored")?.context("the PVC is gone")?;
    ensure!(
        claim["status"]["phase"] == "Pending",
        "without a grant the PVC is {}",
        claim["status"]["phase"]
    );

    env.apply(&format!(
        "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\n\
         metadata: {{name: restores-from-{b}, namespace: {a}}}\nspec:\n  \
         from: [{{group: \"\", kind: PersistentVolumeClaim, namespace: {b}}}]\n  \
         to: [{{group: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: snap}}]\n"
    ))?;
    let restored = env.wait_bound(b, "restored", T)?;
    env.check_pattern(&restored, 0x91, "1M")
        .context("the cross-namespace restore")?;
    Ok(())
}
