//! The process: metrics endpoint, leader election on a Lease (only the
//! holder runs the controllers; losing the lease ends the process, so two
//! replicas never act at once), then the node watcher with its mirrors and
//! the two reconcilers.

use crate::crd::{Snapshot, Volume};
use crate::ctx::Ctx;
use crate::metrics::{self, Metrics};
use crate::{snapshot, volume, Error};
use futures::StreamExt;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, Controller};
use kube::Api;
use kube_lease_manager::LeaseManagerBuilder;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

/// How to run the controllers.
#[derive(Clone, Debug)]
pub struct Options {
    /// Lamina's namespace: its resources, node Secrets and Lease live there.
    pub namespace: String,
    /// This replica's name in the Lease (the pod's name).
    pub identity: String,
    pub lease_name: String,
    /// Seconds a lease holds without renewal: the longest a standby waits
    /// after the active replica dies.
    pub lease_duration: u64,
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// A replica faulted this long, on a node silent this long, is replaced
    /// by one on another node (`crate::replicas`).
    pub replace_replicas_after: std::time::Duration,
}

/// Run until `shutdown` resolves (Ok) or the lease is lost (Err).
pub async fn run(
    opts: Options,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Error> {
    let client = kube::Client::try_default()
        .await
        .map_err(Error::kube("connecting to the API server"))?;
    let metrics = Arc::new(Metrics::new());
    if let Some(addr) = opts.metrics_listen {
        metrics::serve(metrics.clone(), addr).await?;
    }
    let duration = opts.lease_duration.max(2);
    // Renew halfway through the lease (client-go's defaults are alike: 10 s
    // of 15), so an API server slow for a moment on a busy machine does not
    // cost the holder its lease; a lost lease ends the process.
    let grace = (duration / 2).max(1);
    let lease = LeaseManagerBuilder::new(client.clone(), &opts.lease_name)
        .with_namespace(&opts.namespace)
        .with_identity(&opts.identity)
        .with_duration(duration)
        .with_grace(grace)
        .build()
        .await?;
    let (mut leading, lease_task) = lease.watch().await;
    tokio::pin!(shutdown);
    tracing::info!(identity = %opts.identity, lease = %opts.lease_name, "waiting for the lease");
    loop {
        if *leading.borrow_and_update() {
            break;
        }
        tokio::select! {
            r = leading.changed() => if r.is_err() {
                return Err(Error::LostLease(opts.lease_name.clone()));
            },
            _ = &mut shutdown => return Ok(()),
        }
    }
    tracing::info!(identity = %opts.identity, "holding the lease: running the controllers");
    eprintln!(
        "lamina controller: {} holds lease {}",
        opts.identity, opts.lease_name
    );
    metrics.set_leader(true);
    let work = controllers(client, &opts, metrics.clone());
    tokio::pin!(work);
    let end = loop {
        tokio::select! {
            r = leading.changed() => {
                if r.is_err() || !*leading.borrow_and_update() {
                    break Err(Error::LostLease(opts.lease_name.clone()));
                }
            }
            () = &mut work => break Err(Error::Refused("the controllers stopped".into())),
            _ = &mut shutdown => break Ok(()),
        }
    };
    metrics.set_leader(false);
    // Closing the channel ends the lease task; a clean stop releases the
    // lease so a standby need not wait for it to expire.
    drop(leading);
    if end.is_ok() {
        if let Ok(Ok(m)) = lease_task.await {
            let _ = m.release().await;
        }
    }
    end
}

async fn controllers(client: kube::Client, opts: &Options, metrics: Arc<Metrics>) {
    let ns = &opts.namespace;
    let snaps: Api<Snapshot> = Api::namespaced(client.clone(), ns);
    let vols: Api<Volume> = Api::namespaced(client.clone(), ns);
    let snap_ctl = Controller::new(snaps.clone(), watcher::Config::default());
    let ns2 = ns.clone();
    let (kick_tx, kick_rx) = tokio::sync::mpsc::unbounded_channel();
    let kicks =
        futures::stream::unfold(
            kick_rx,
            |mut rx| async move { rx.recv().await.map(|r| (r, rx)) },
        );
    let vol_ctl = Controller::new(vols, watcher::Config::default())
        .reconcile_all_on(kicks)
        .watches(snaps, watcher::Config::default(), move |s: Snapshot| {
            // A snapshot going may let its volume go.
            let name = crate::names::volume_resource(&s.spec.volume);
            Some(ObjectRef::<Volume>::new(&name).within(&ns2))
        });
    let reporter = Reporter {
        controller: crate::MANAGER.into(),
        instance: Some(opts.identity.clone()),
    };
    let ctx = Arc::new(Ctx {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        namespace: ns.clone(),
        metrics,
        snapshots: snap_ctl.store(),
        volumes: vol_ctl.store(),
        engines: RwLock::new(BTreeMap::new()),
        views: RwLock::new(HashMap::new()),
        failures: Mutex::new(HashMap::new()),
        kick_volumes: kick_tx,
        nodes_known: std::sync::atomic::AtomicBool::new(false),
        silent: RwLock::new(HashMap::new()),
    });
    tokio::spawn(crate::replicas::run(
        ctx.clone(),
        opts.replace_replicas_after,
    ));
    let snap_run = snap_ctl
        .run(snapshot::reconcile, snapshot::error_policy, ctx.clone())
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "snapshot reconcile");
            }
        });
    let vol_run = vol_ctl
        .run(volume::reconcile, volume::error_policy, ctx.clone())
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "volume reconcile");
            }
        });
    // The mirrors start once both stores hold what exists.
    let c = ctx.clone();
    let nodes = async move {
        let _ = c.snapshots.wait_until_ready().await;
        let _ = c.volumes.wait_until_ready().await;
        crate::nodes::run(c).await
    };
    tokio::join!(snap_run, vol_run, nodes);
}
