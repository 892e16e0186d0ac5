//! Counters of engine calls and API writes, served at `/metrics`, so that
//! "steady state: zero engine calls and zero API writes per minute" can be
//! measured by reading them twice.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Call {
    node: String,
    call: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Write {
    kind: String,
    verb: String,
}

pub struct Metrics {
    registry: Registry,
    engine_calls: Family<Call, Counter>,
    feed_polls: Family<Call, Counter>,
    api_writes: Family<Write, Counter>,
    leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("lamina_controller");
        let engine_calls = Family::<Call, Counter>::default();
        let feed_polls = Family::<Call, Counter>::default();
        let api_writes = Family::<Write, Counter>::default();
        let leader = Gauge::default();
        registry.register(
            "engine_calls",
            "Calls to node daemons that read or change volumes and snapshots (the change feed's long polls not included)",
            engine_calls.clone(),
        );
        registry.register(
            "feed_polls",
            "Long polls of the daemons' change feeds (each waits up to a minute for a change)",
            feed_polls.clone(),
        );
        registry.register(
            "api_writes",
            "Writes to the Kubernetes API server (creates, status applies, deletes, finalizer patches, events)",
            api_writes.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the lease",
            leader.clone(),
        );
        Metrics {
            registry,
            engine_calls,
            feed_polls,
            api_writes,
            leader,
        }
    }

    pub fn engine_call(&self, node: &str, call: &str) {
        self.engine_calls
            .get_or_create(&Call {
                node: node.into(),
                call: call.into(),
            })
            .inc();
    }

    pub fn feed_poll(&self, node: &str) {
        self.feed_polls
            .get_or_create(&Call {
                node: node.into(),
                call: "changes".into(),
            })
            .inc();
    }

    pub fn api_write(&self, kind: &str, verb: &str) {
        self.api_writes
            .get_or_create(&Write {
                kind: kind.into(),
                verb: verb.into(),
            })
            .inc();
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(leading as i64);
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }
}

/// Serve `/metrics` on `addr` until the process ends.
pub async fn serve(metrics: Arc<Metrics>, addr: std::net::SocketAddr) -> Result<(), crate::Error> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| crate::Error::Metrics {
            addr: addr.to_string(),
            source,
        })?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let m = metrics.clone();
            async move {
                (
                    [(
                        "content-type",
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    m.encode(),
                )
            }
        }),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics endpoint stopped");
        }
    });
    Ok(())
}
