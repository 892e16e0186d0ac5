//! e. A VolumeGroupSnapshot of three PVCs: it becomes ready with its three
//! member VolumeSnapshots, and the engine holds the group.

use crate::env::{pvc, wait, Env};
use anyhow::{ensure, Context, Result};
use std::collections::BTreeSet;
use std::time::Duration;

const T: Duration = Duration::from_secs(90);

pub fn group_snapshot(env: &Env) -> Result<()> {
    let ns = "group-snapshot";
    env.namespace(ns)?;
    let mut volumes = BTreeSet::new();
    for (i, pattern) in [(0, 0xe0u8), (1, 0xe1), (2, 0xe2)] {
        let name = format!("member-{i}");
        let doc = pvc(ns, &name, "lamina", "32Mi", None).replacen(
            "metadata: {",
            "metadata: {labels: {group: e}, ",
            1,
        );
        env.apply(&doc)?;
        let vol = env.wait_bound(ns, &name, T)?;
        env.write_pattern(&vol, pattern, "1M")?;
        volumes.insert(vol);
    }
    env.apply(&format!(
        "apiVersion: groupsnapshot.storage.k8s.io/v1\nkind: VolumeGroupSnapshot\n\
         metadata: {{name: group, namespace: {ns}}}\nspec:\n  volumeGroupSnapshotClassName: lamina\n  \
         source: {{selector: {{matchLabels: {{group: e}}}}}}\n"
    ))?;
    let g = wait("the VolumeGroupSnapshot to be readyToUse", T, |last| {
        let Some(g) = env.get(ns, "volumegroupsnapshot", "group")? else {
            return Ok(None);
        };
        *last = format!("status {}", g["status"]);
        Ok((g["status"]["readyToUse"] == true).then_some(g))
    })
    .with_context(|| env.events(ns, "group"))?;
    ensure!(
        g["status"]["creationTime"].is_string(),
        "no creationTime: {}",
        g["status"]
    );

    // Its members: VolumeSnapshots naming the group, each ready, one per PVC.
    let members = wait("three ready member VolumeSnapshots", T, |last| {
        let all = env.kubectl_json(&["get", "volumesnapshots", "-n", ns])?;
        let items = all["items"].as_array().cloned().unwrap_or_default();
        let members: Vec<_> = items
            .into_iter()
            .filter(|s| s["status"]["volumeGroupSnapshotName"] == "group")
            .collect();
        *last = format!(
            "{} members, ready: {:?}",
            members.len(),
            members
                .iter()
                .map(|m| &m["status"]["readyToUse"])
                .collect::<Vec<_>>()
        );
        Ok(
            (members.len() == 3 && members.iter().all(|m| m["status"]["readyToUse"] == true))
                .then_some(members),
        )
    })?;
    let sources: BTreeSet<String> = members
        .iter()
        .filter_map(|m| {
            m["spec"]["source"]["persistentVolumeClaimName"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    // Members made by the controller name their content, not a PVC; map
    // them to engine snapshots instead.
    let mut engine_volumes = BTreeSet::new();
    let mut engine_names = BTreeSet::new();
    for m in &members {
        let name = m["metadata"]["name"].as_str().context("member name")?;
        let (vol, snap, _) = env.engine_snapshot(ns, name)?;
        engine_volumes.insert(vol);
        engine_names.insert(snap);
    }
    ensure!(
        engine_volumes == volumes,
        "members are of {engine_volumes:?} (PVC sources {sources:?}), want {volumes:?}"
    );
    ensure!(
        engine_names.len() == 1,
        "members have different engine names {engine_names:?}: not one group"
    );

    // The engine's group, by the handle of the group's content.
    let content = g["status"]["boundVolumeGroupSnapshotContentName"]
        .as_str()
        .context("no group content")?;
    let c = env
        .get("", "volumegroupsnapshotcontent", content)?
        .context("group content missing")?;
    let handle = c["status"]["volumeGroupSnapshotHandle"]
        .as_str()
        .context("no group handle")?;
    // `[NODE:]GROUP`: the node is there when the driver drives several.
    let name = handle.split_once(':').map_or(handle, |(_, g)| g);
    let group = env.lamina_json(&["snapshot", "get-group", name])?;
    let grouped: BTreeSet<String> = group["snapshots"]
        .as_array()
        .context("group has no snapshots")?
        .iter()
        .filter_map(|s| s["volume"].as_str().map(str::to_string))
        .collect();
    ensure!(
        grouped == volumes,
        "the engine group {handle} holds {grouped:?}, want {volumes:?}"
    );
    Ok(())
}
