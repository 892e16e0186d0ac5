//! The daemon's Prometheus metrics (prometheus-client), served at
//! `GET /metrics` on the API listeners: operations by kind and outcome with
//! their durations, schedule runs by outcome, and the pool's space, read
//! when scraped. Per-volume I/O counters are not here yet (docs/daemon.md).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Op {
    kind: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Kind {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Run {
    schedule: String,
    outcome: String,
}

pub struct Metrics {
    registry: Registry,
    operations: Family<Op, Counter>,
    durations: Family<Kind, Histogram>,
    schedule_runs: Family<Run, Counter>,
    pool_used: Gauge<u64, AtomicU64>,
    pool_capacity: Gauge<u64, AtomicU64>,
    volumes: Gauge<u64, AtomicU64>,
    snapshots: Gauge<u64, AtomicU64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("lamina");
        let operations = Family::<Op, Counter>::default();
        // 1 ms to about 9 hours.
        let durations = Family::<Kind, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 4.0, 13))
        });
        let schedule_runs = Family::<Run, Counter>::default();
        let pool_used = Gauge::<u64, AtomicU64>::default();
        let pool_capacity = Gauge::<u64, AtomicU64>::default();
        let volumes = Gauge::<u64, AtomicU64>::default();
        let snapshots = Gauge::<u64, AtomicU64>::default();
        registry.register(
            "operations",
            "Operations ended, by kind (create-snapshot, full-clone...) and outcome (succeeded, failed)",
            operations.clone(),
        );
        registry.register(
            "operation_duration_seconds",
            "Time from an operation's record to its end, by kind (a restart in between counts)",
            durations.clone(),
        );
        registry.register(
            "schedule_runs",
            "Schedule runs by schedule and outcome (taken, existed, failed, paused, gave-up)",
            schedule_runs.clone(),
        );
        registry.register(
            "pool_used_bytes",
            "Bytes of the pool in use (data, metadata and snapshots)",
            pool_used.clone(),
        );
        registry.register(
            "pool_capacity_bytes",
            "Bytes the pool can hold: used, plus what new data can still take",
            pool_capacity.clone(),
        );
        registry.register("volumes", "Volumes in the pool", volumes.clone());
        registry.register(
            "snapshots",
            "Snapshots in the pool, system ones included",
            snapshots.clone(),
        );
        Metrics {
            registry,
            operations,
            durations,
            schedule_runs,
            pool_used,
            pool_capacity,
            volumes,
            snapshots,
        }
    }

    /// An operation ended.
    pub fn operation(&self, kind: &str, ok: bool, seconds: Option<f64>) {
        self.operations
            .get_or_create(&Op {
                kind: kind.into(),
                outcome: if ok { "succeeded" } else { "failed" }.into(),
            })
            .inc();
        if let Some(s) = seconds {
            self.durations
                .get_or_create(&Kind { kind: kind.into() })
                .observe(s);
        }
    }

    /// A schedule ran on a volume.
    pub fn schedule_run(&self, schedule: &str, outcome: &str) {
        self.schedule_runs
            .get_or_create(&Run {
                schedule: schedule.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// The text exposition format, with the pool's figures as given.
    pub fn encode(&self, used: u64, capacity: u64, volumes: u64, snapshots: u64) -> String {
        self.pool_used.set(used);
        self.pool_capacity.set(capacity);
        self.volumes.set(volumes);
        self.snapshots.set(snapshots);
        let mut s = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }
}
