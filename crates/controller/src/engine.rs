//! One node's daemon as the controllers call it: every call is counted in
//! the metrics and its failure carries the node and the call.

use crate::metrics::Metrics;
use crate::Error;
use lamina_api as api;
use lamina_client::Client;
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone)]
pub struct Engine {
    pub node: String,
    /// Its transfer listener (`HOST:PORT`), from its node Secret.
    pub transfer_address: Option<String>,
    client: Client,
    metrics: Arc<Metrics>,
}

type R<T> = Result<T, Error>;

impl Engine {
    pub fn new(
        node: &str,
        transfer_address: Option<String>,
        client: Client,
        metrics: Arc<Metrics>,
    ) -> Engine {
        Engine {
            node: node.into(),
            transfer_address,
            client,
            metrics,
        }
    }

    fn err(&self, call: &'static str) -> impl FnOnce(lamina_client::Error) -> Error + '_ {
        move |source| Error::Engine {
            node: self.node.clone(),
            call,
            source,
        }
    }

    fn count(&self, call: &str) {
        self.metrics.engine_call(&self.node, call);
    }

    pub async fn changes(&self, after: Option<(&str, u64)>, wait: Duration) -> R<api::Changes> {
        self.metrics.feed_poll(&self.node);
        self.client
            .changes(after.map(|a| a.1), after.map(|a| a.0), wait)
            .await
            .map_err(self.err("watch changes"))
    }

    pub async fn list_volumes(&self) -> R<Vec<api::Volume>> {
        self.count("list_volumes");
        self.client
            .list_volumes()
            .await
            .map_err(self.err("list volumes"))
    }

    pub async fn list_snapshots(&self) -> R<Vec<api::Snapshot>> {
        self.count("list_snapshots");
        self.client
            .list_all_snapshots()
            .await
            .map_err(self.err("list snapshots"))
    }

    pub async fn latest_operation(&self, volume: &str) -> R<Option<api::Operation>> {
        self.count("list_operations");
        let f = api::OperationFilter {
            volume: Some(volume.into()),
            state: None,
            limit: Some(1),
        };
        Ok(self
            .client
            .list_operations(&f)
            .await
            .map_err(self.err("read operations"))?
            .into_iter()
            .next())
    }

    pub async fn create_snapshot(
        &self,
        volume: &str,
        req: &api::CreateSnapshot,
    ) -> R<api::Snapshot> {
        self.count("create_snapshot");
        Ok(self
            .client
            .create_snapshot(volume, req)
            .await
            .map_err(self.err("take snapshot"))?
            .value)
    }

    pub async fn delete_snapshot(&self, volume: &str, name: &str) -> R<bool> {
        self.count("delete_snapshot");
        Ok(self
            .client
            .delete_snapshot(volume, name)
            .await
            .map_err(self.err("delete snapshot"))?
            .existed)
    }

    pub async fn create_volume(&self, req: &api::CreateVolume) -> R<api::Volume> {
        self.count("create_volume");
        Ok(self
            .client
            .create_volume(req)
            .await
            .map_err(self.err("create volume"))?
            .value)
    }

    pub async fn create_clone(&self, req: &api::CreateClone) -> R<api::CloneCreated> {
        self.count("create_clone");
        Ok(self
            .client
            .create_clone(req)
            .await
            .map_err(self.err("clone"))?
            .value)
    }

    pub async fn expand_volume(&self, name: &str, size: u64) -> R<api::Volume> {
        self.count("expand_volume");
        self.client
            .expand_volume(name, &api::ExpandVolume { size })
            .await
            .map_err(self.err("expand volume"))
    }

    pub async fn delete_volume(&self, name: &str) -> R<bool> {
        self.count("delete_volume");
        Ok(self
            .client
            .delete_volume(name, false)
            .await
            .map_err(self.err("delete volume"))?
            .existed)
    }

    /// The bytes its pool can still take (`GET /v1/health`).
    pub async fn free_bytes(&self) -> R<u64> {
        self.count("health");
        Ok(self
            .client
            .health()
            .await
            .map_err(self.err("health"))?
            .capacity_bytes)
    }

    /// Put node `name` at `address` in this daemon's node list, in place
    /// of an entry of another address.
    pub async fn put_node(&self, name: &str, address: &str) -> R<()> {
        self.count("put_node");
        let req = api::AddNode {
            name: name.into(),
            address: address.into(),
        };
        self.client
            .put_node(&req)
            .await
            .map_err(self.err("put node"))
    }

    pub async fn add_replica(&self, volume: &str, node: &str) -> R<api::Volume> {
        self.count("add_replica");
        self.client
            .add_replica(volume, node)
            .await
            .map_err(self.err("add replica"))
    }

    pub async fn remove_replica(&self, volume: &str, node: &str) -> R<()> {
        self.count("remove_replica");
        self.client
            .remove_replica(volume, node)
            .await
            .map(drop)
            .map_err(self.err("remove replica"))
    }
}
