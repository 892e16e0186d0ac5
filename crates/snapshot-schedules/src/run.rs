//! The loop: every `interval`, each SnapshotSchedule of every namespace is
//! stepped on each PVC it selects, with the schedule crate's rules. A slot
//! is claimed in the schedule's status before its VolumeSnapshot is
//! created, and a resumed slot looks for its VolumeSnapshot by labels
//! (schedule uid, PVC uid, slot) before making one, so no slot gets two.
//! One process runs it (a second would race on the status): the chart runs
//! one replica.

use crate::crd::{DeletionPolicy, PvcTrack, SnapshotSchedule, SnapshotScheduleStatus};
use crate::track::{store, to_track};
use crate::{Error, FINALIZER, PVC_UID_LABEL, SCHEDULE_UID_LABEL, SLOT_LABEL};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use lamina_schedule::{plan, step, Candidate, Clock, Retention, RetryPolicy, Step, Timing, Track};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// How to run.
#[derive(Clone)]
pub struct Options {
    pub clock: Arc<dyn Clock>,
    /// Time between passes.
    pub interval: Duration,
    /// Tests only: abort, as kill -9 would, at this named point
    /// (`schedule-after-claim`, `schedule-after-snapshot`).
    pub crash_at: Option<String>,
}

impl Options {
    fn crash_point(&self, name: &str) {
        if self.crash_at.as_deref() == Some(name) {
            eprintln!("lamina schedule-controller: crashing at {name}, as asked (--test-crash-at)");
            std::process::abort();
        }
    }
}

fn volume_snapshots() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshot"),
        "volumesnapshots",
    )
}

/// Run until `shutdown` resolves.
pub async fn run(
    client: Client,
    opts: Options,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Error> {
    tokio::pin!(shutdown);
    loop {
        if let Err(e) = pass(&client, &opts).await {
            tracing::warn!(error = %e, "a schedule pass failed; trying again");
        }
        tokio::select! {
            _ = tokio::time::sleep(opts.interval) => {}
            _ = &mut shutdown => return Ok(()),
        }
    }
}

async fn pass(client: &Client, opts: &Options) -> Result<(), Error> {
    let all: Api<SnapshotSchedule> = Api::all(client.clone());
    let list = all
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing SnapshotSchedules"))?;
    for s in list.items {
        let (ns, name) = (s.namespace().unwrap_or_default(), s.name_any());
        if let Err(e) = reconcile(client, opts, s).await {
            tracing::warn!(namespace = %ns, schedule = %name, error = %e, "schedule not run");
        }
    }
    Ok(())
}

/// The schedule's rules, or why its spec cannot run.
fn rules(s: &SnapshotSchedule) -> Result<(Timing, Retention, RetryPolicy, String), String> {
    let timing = Timing::parse(&s.spec.cron, &s.spec.time_zone).map_err(|e| e.to_string())?;
    let keep_for = match &s.spec.keep_for {
        Some(d) => Some(
            humantime::parse_duration(d)
                .map_err(|e| format!("keepFor {d:?}: {e} (e.g. 7d, 12h)"))?
                .as_secs(),
        ),
        None => None,
    };
    let retention = Retention {
        keep_last: s.spec.keep_last,
        keep_for,
    };
    retention.validate().map_err(|e| e.to_string())?;
    let sel = &s.spec.selector;
    if sel
        .match_expressions
        .as_ref()
        .is_some_and(|m| !m.is_empty())
    {
        return Err("selector: only matchLabels is supported".into());
    }
    let labels = sel.match_labels.clone().unwrap_or_default();
    if labels.is_empty() {
        return Err("selector: give matchLabels (an empty selector would take every PVC)".into());
    }
    let selector = labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let retry = RetryPolicy {
        window: s
            .spec
            .retry_window_seconds
            .map_or(RetryPolicy::default().window, i64::from),
        ..RetryPolicy::default()
    };
    Ok((timing, retention, retry, selector))
}

fn condition(ok: bool, reason: &str, message: &str, generation: Option<i64>) -> Condition {
    Condition {
        type_: "Ready".into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: Time(jiff::Timestamp::now()),
    }
}

struct Ctx<'a> {
    client: &'a Client,
    ns: String,
    name: String,
    uid: String,
    schedules: Api<SnapshotSchedule>,
    snaps: Api<DynamicObject>,
}

impl Ctx<'_> {
    async fn write_status(&self, st: &SnapshotScheduleStatus) -> Result<(), Error> {
        self.schedules
            .patch_status(
                &self.name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": st })),
            )
            .await
            .map_err(Error::kube(format!(
                "writing the status of {}/{}",
                self.ns, self.name
            )))?;
        Ok(())
    }

    /// Write the status only if it changed: a pass with nothing due writes
    /// nothing.
    async fn write_if_changed(
        &self,
        before: &SnapshotScheduleStatus,
        st: &SnapshotScheduleStatus,
    ) -> Result<(), Error> {
        if before == st {
            return Ok(());
        }
        self.write_status(st).await
    }

    /// The VolumeSnapshots this schedule made, of one PVC or of all.
    async fn own(&self, pvc_uid: Option<&str>) -> Result<Vec<DynamicObject>, Error> {
        let mut sel = format!("{SCHEDULE_UID_LABEL}={}", self.uid);
        if let Some(u) = pvc_uid {
            sel.push_str(&format!(",{PVC_UID_LABEL}={u}"));
        }
        Ok(self
            .snaps
            .list(&ListParams::default().labels(&sel))
            .await
            .map_err(Error::kube("listing VolumeSnapshots"))?
            .items)
    }
}

async fn reconcile(client: &Client, opts: &Options, s: SnapshotSchedule) -> Result<(), Error> {
    let ns = s.namespace().unwrap_or_default();
    let cx = Ctx {
        client,
        name: s.name_any(),
        uid: s.uid().unwrap_or_default(),
        schedules: Api::namespaced(client.clone(), &ns),
        snaps: Api::namespaced_with(client.clone(), &ns, &volume_snapshots()),
        ns,
    };
    let has_finalizer = s.finalizers().iter().any(|f| f == FINALIZER);
    if s.metadata.deletion_timestamp.is_some() {
        if has_finalizer {
            finish_delete(&cx, &s).await?;
        }
        return Ok(());
    }
    if !has_finalizer {
        let mut f = s.finalizers().to_vec();
        f.push(FINALIZER.into());
        cx.schedules
            .patch(
                &cx.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": f}})),
            )
            .await
            .map_err(Error::kube("adding the finalizer"))?;
    }
    let before = s.status.clone().unwrap_or_default();
    let mut status = before.clone();
    let gen = s.metadata.generation;
    let (timing, retention, retry, selector) = match rules(&s) {
        Ok(r) => r,
        Err(why) => {
            status.conditions = settle(&before, condition(false, "InvalidSpec", &why, gen));
            status.next_run = None;
            return cx.write_if_changed(&before, &status).await;
        }
    };
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &cx.ns);
    let selected = pvcs
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(Error::kube("listing PVCs"))?
        .items;
    // Tracks of PVCs no longer selected (or gone) are dropped.
    let uids: Vec<String> = selected.iter().filter_map(|p| p.uid()).collect();
    status.pvcs.retain(|t| uids.contains(&t.uid));
    for pvc in &selected {
        let (pname, puid) = (pvc.name_any(), pvc.uid().unwrap_or_default());
        let i = match status.pvcs.iter().position(|t| t.uid == puid) {
            Some(i) => i,
            None => {
                let mut t = PvcTrack {
                    name: pname.clone(),
                    uid: puid.clone(),
                    ..Default::default()
                };
                store(&mut t, &Track::new(opts.clock.now()));
                status.pvcs.push(t);
                cx.write_status(&status).await?;
                status.pvcs.len() - 1
            }
        };
        // A PVC not bound yet has no volume to snapshot: its slots wait
        // (no claim, no VolumeSnapshot that could never become ready), and
        // once bound it gets one catch-up snapshot like any late run.
        let phase = pvc
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("Pending");
        if phase != "Bound" {
            let why =
                format!("the PVC is {phase}, not Bound: its snapshots start once it is bound");
            let p = &mut status.pvcs[i];
            if p.last_error.as_deref() != Some(why.as_str()) {
                p.last_outcome = Some("waiting".into());
                p.last_error = Some(why);
            }
            continue;
        }
        for _ in 0..8 {
            let now = opts.clock.now();
            let track = to_track(&status.pvcs[i]);
            let (slot, catch_up) = match step(&timing, &retry, &track, now) {
                Step::Wait { .. } => break,
                Step::GiveUp { slot, .. } => {
                    let p = &mut status.pvcs[i];
                    store(p, &track.gave_up(now));
                    p.last_outcome = Some("gave-up".into());
                    p.last_error = Some(format!(
                        "slot {} given up: {}",
                        slot,
                        p.last_error.clone().unwrap_or_default()
                    ));
                    cx.write_status(&status).await?;
                    continue;
                }
                Step::ClockSetBack { now, .. } => {
                    // The clock was set back: start afresh from now, so
                    // the next slot is taken.
                    store(&mut status.pvcs[i], &Track::new(now));
                    cx.write_status(&status).await?;
                    continue;
                }
                Step::Take { slot, skipped, .. } => (slot, skipped),
                Step::Retry { slot, .. } | Step::Resume { slot } => (slot, false),
            };
            // The claim is written before the VolumeSnapshot is made.
            let claimed = track.claim(slot);
            store(&mut status.pvcs[i], &claimed);
            cx.write_status(&status).await?;
            opts.crash_point("schedule-after-claim");
            let made = take(&cx, &s, &pname, &puid, slot).await;
            opts.crash_point("schedule-after-snapshot");
            let now = opts.clock.now();
            let p = &mut status.pvcs[i];
            match made {
                Ok((outcome, vs)) => {
                    p.last_outcome = Some(if catch_up {
                        format!("{outcome} (catch-up)")
                    } else {
                        outcome.into()
                    });
                    p.last_snapshot = Some(vs);
                    p.last_error = None;
                    let (deleted, kept) = apply_retention(&cx, &retention, &puid, now).await?;
                    let p = &mut status.pvcs[i];
                    p.deleted = deleted;
                    p.kept = kept;
                    store(p, &claimed.done(now));
                }
                Err(e) => {
                    tracing::warn!(namespace = %cx.ns, schedule = %cx.name, pvc = %pname, error = %e, "scheduled VolumeSnapshot failed; will retry");
                    p.last_outcome = Some("failed".into());
                    p.last_error = Some(e.to_string());
                    store(p, &claimed.failed(now));
                }
            }
            cx.write_status(&status).await?;
        }
    }
    status.next_run = timing.next_after(opts.clock.now()).map(|t| timing.local(t));
    status.conditions = settle(&before, condition(true, "Running", "", gen));
    cx.write_if_changed(&before, &status).await
}

/// The condition to show: the one there already if it says the same (so
/// its transition time stays, and a quiet pass writes nothing).
fn settle(before: &SnapshotScheduleStatus, c: Condition) -> Vec<Condition> {
    match before.conditions.first() {
        Some(old)
            if old.status == c.status
                && old.reason == c.reason
                && old.message == c.message
                && old.observed_generation == c.observed_generation =>
        {
            vec![old.clone()]
        }
        _ => vec![c],
    }
}

fn stamp(slot: i64) -> String {
    jiff::Timestamp::from_second(slot)
        .map(|t| t.strftime("%Y%m%d-%H%M").to_string())
        .unwrap_or_else(|_| slot.to_string())
}

/// `PVC-SCHEDULE-YYYYMMDD-HHMM`, cut to a valid name's 253 characters.
fn vs_name(pvc: &str, schedule: &str, slot: i64) -> String {
    let tail = format!("-{}", stamp(slot));
    let mut head = format!("{pvc}-{schedule}");
    head.truncate(253 - tail.len());
    format!("{}{tail}", head.trim_end_matches(['-', '.']))
}

/// Find the slot's VolumeSnapshot or make it: `(outcome, name)`.
async fn take(
    cx: &Ctx<'_>,
    s: &SnapshotSchedule,
    pvc: &str,
    pvc_uid: &str,
    slot: i64,
) -> Result<(&'static str, String), Error> {
    let slot_s = slot.to_string();
    for vs in cx.own(Some(pvc_uid)).await? {
        if vs.labels().get(SLOT_LABEL) == Some(&slot_s) {
            return Ok(("existed", vs.name_any()));
        }
    }
    let name = vs_name(pvc, &cx.name, slot);
    let mut labels = s.spec.snapshot_labels.clone();
    labels.insert(SCHEDULE_UID_LABEL.into(), cx.uid.clone());
    labels.insert(PVC_UID_LABEL.into(), pvc_uid.into());
    labels.insert(SLOT_LABEL.into(), slot_s);
    let mut spec = json!({"source": {"persistentVolumeClaimName": pvc}});
    if let Some(c) = &s.spec.volume_snapshot_class_name {
        spec["volumeSnapshotClassName"] = json!(c);
    }
    let mut obj = DynamicObject::new(&name, &volume_snapshots()).within(&cx.ns);
    obj.metadata.labels = Some(labels);
    obj.data = json!({ "spec": spec });
    cx.snaps
        .create(&PostParams::default(), &obj)
        .await
        .map_err(Error::kube(format!(
            "creating VolumeSnapshot {}/{name}",
            cx.ns
        )))?;
    tracing::info!(namespace = %cx.ns, schedule = %cx.name, pvc, snapshot = %name, "VolumeSnapshot created");
    Ok(("taken", name))
}

/// Why a VolumeSnapshot must stay: a PVC not yet bound is being restored
/// from it.
async fn pinned(cx: &Ctx<'_>, vs: &str) -> Result<Option<String>, Error> {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(cx.client.clone(), &cx.ns);
    for p in pvcs
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing PVCs"))?
        .items
    {
        let Some(spec) = &p.spec else { continue };
        let from_it = spec
            .data_source
            .as_ref()
            .is_some_and(|d| d.kind == "VolumeSnapshot" && d.name == vs)
            || spec.data_source_ref.as_ref().is_some_and(|d| {
                d.kind == "VolumeSnapshot" && d.name == vs && d.namespace.is_none()
            });
        let bound = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        if from_it && !bound {
            return Ok(Some(format!(
                "PVC {} is being restored from it",
                p.name_any()
            )));
        }
    }
    Ok(None)
}

fn slot_of(vs: &DynamicObject) -> i64 {
    vs.labels()
        .get(SLOT_LABEL)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

async fn apply_retention(
    cx: &Ctx<'_>,
    retention: &Retention,
    pvc_uid: &str,
    now: i64,
) -> Result<(Vec<String>, Vec<String>), Error> {
    let mine = cx.own(Some(pvc_uid)).await?;
    let mut candidates = Vec::new();
    for vs in mine
        .iter()
        .filter(|v| v.metadata.deletion_timestamp.is_none())
    {
        candidates.push(Candidate {
            name: vs.name_any(),
            created: slot_of(vs),
            pinned: pinned(cx, &vs.name_any()).await?,
        });
    }
    let p = plan(retention, &candidates, now);
    let mut deleted = Vec::new();
    for name in p.delete {
        cx.snaps
            .delete(&name, &DeleteParams::default())
            .await
            .map_err(Error::kube(format!(
                "deleting VolumeSnapshot {}/{name}",
                cx.ns
            )))?;
        tracing::info!(namespace = %cx.ns, schedule = %cx.name, snapshot = %name, "retention deleted a VolumeSnapshot");
        deleted.push(name);
    }
    let kept = p
        .kept
        .into_iter()
        .map(|k| format!("{}: {}", k.name, k.reason))
        .collect();
    Ok((deleted, kept))
}

/// A deleted schedule: apply its deletion policy, then let it go.
async fn finish_delete(cx: &Ctx<'_>, s: &SnapshotSchedule) -> Result<(), Error> {
    if s.spec.deletion_policy == DeletionPolicy::Delete {
        let mut left = Vec::new();
        for vs in cx.own(None).await? {
            let name = vs.name_any();
            if let Some(why) = pinned(cx, &name).await? {
                left.push(format!("{name}: {why}"));
                continue;
            }
            match cx.snaps.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(st)) if st.code == 404 => {}
                Err(e) => {
                    return Err(Error::kube(format!(
                        "deleting VolumeSnapshot {}/{name}",
                        cx.ns
                    ))(e))
                }
            }
        }
        if !left.is_empty() {
            // Deleted later, once nothing restores from them.
            return Err(Error::Spec(format!(
                "waiting to delete VolumeSnapshots still in use: {}",
                left.join("; ")
            )));
        }
    }
    let f: Vec<String> = s
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    cx.schedules
        .patch(
            &cx.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": f}})),
        )
        .await
        .map_err(Error::kube("removing the finalizer"))?;
    tracing::info!(namespace = %cx.ns, schedule = %cx.name, policy = ?s.spec.deletion_policy, "schedule deleted");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid_and_deterministic() {
        let slot = 1_893_459_600; // 2030-01-01T01:00Z
        assert_eq!(vs_name("data", "hourly", slot), "data-hourly-20300101-0100");
        let long = vs_name(&"p".repeat(250), "hourly", slot);
        assert_eq!(long.len(), 253);
        assert!(long.ends_with("-20300101-0100"));
        assert_eq!(long, vs_name(&"p".repeat(250), "hourly", slot));
    }
}
