//! The daemon's Prometheus metrics (prometheus-client), served at
//! `GET /metrics` on the API listeners: operations by kind and outcome with
//! their durations, schedule runs by outcome, the pool's space (read when
//! scraped), and each export's I/O (operations, errors, bytes and latency,
//! counted at the data path's seam by [`VolumeIo`]).

use lamina_blockio::{IoError, IoObserver, OpKind};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// One operation kind's series of one export.
struct Handles {
    ops: Counter,
    errors: Counter,
    bytes: Counter,
    latency: Histogram,
}

/// An export's I/O series, told of each completed operation by the data
/// path's [`lamina_blockio::Observed`] wrapper.
pub struct VolumeIo {
    per: [Handles; 6],
}

impl IoObserver for VolumeIo {
    fn completed(&self, op: OpKind, bytes: u64, elapsed: Duration, r: Result<(), &IoError>) {
        let h = &self.per[op as usize];
        h.ops.inc();
        if r.is_err() {
            h.errors.inc();
        } else if bytes > 0 {
            h.bytes.inc_by(bytes);
        }
        h.latency.observe(elapsed.as_secs_f64());
    }
}

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VolumeOp {
    volume: String,
    op: String,
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
    io_ops: Family<VolumeOp, Counter>,
    io_errors: Family<VolumeOp, Counter>,
    io_bytes: Family<VolumeOp, Counter>,
    io_latency: Family<VolumeOp, Histogram>,
    /// Handed to the transfer's pace (`pacing.rs`).
    pub transfer_paced: Counter<f64, AtomicU64>,
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
        let io_ops = Family::<VolumeOp, Counter>::default();
        let io_errors = Family::<VolumeOp, Counter>::default();
        let io_bytes = Family::<VolumeOp, Counter>::default();
        // 10 µs to about 40 s.
        let io_latency = Family::<VolumeOp, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_01, 4.0, 12))
        });
        registry.register(
            "volume_io",
            "I/O operations completed on an export (a volume, or VOLUME@SNAPSHOT), by operation",
            io_ops.clone(),
        );
        registry.register(
            "volume_io_errors",
            "I/O operations that failed, by export and operation",
            io_errors.clone(),
        );
        registry.register(
            "volume_io_bytes",
            "Bytes read, written, trimmed or zeroed, by export and operation",
            io_bytes.clone(),
        );
        registry.register(
            "volume_io_duration_seconds",
            "Time from an I/O's submission to its completion, by export and operation",
            io_latency.clone(),
        );
        let transfer_paced = Counter::<f64, AtomicU64>::default();
        registry.register(
            "transfer_paced_seconds",
            "Time this node's transfer streams were held back because its volumes had I/O (--transfer-busy-rate)",
            transfer_paced.clone(),
        );
        Metrics {
            transfer_paced,
            io_ops,
            io_errors,
            io_bytes,
            io_latency,
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

    /// The observer an export's data path reports to: the handles of its
    /// series, looked up once here so that an I/O costs a few atomic adds
    /// and a histogram observation, not a map look-up.
    pub fn volume_io(&self, export: &str) -> Arc<VolumeIo> {
        let per = OpKind::ALL.map(|k| {
            let l = VolumeOp {
                volume: export.into(),
                op: k.name().into(),
            };
            Handles {
                ops: self.io_ops.get_or_create(&l).clone(),
                errors: self.io_errors.get_or_create(&l).clone(),
                bytes: self.io_bytes.get_or_create(&l).clone(),
                latency: self.io_latency.get_or_create(&l).clone(),
            }
        });
        Arc::new(VolumeIo { per })
    }

    /// An export went away: its series go too (a later attach starts them
    /// again from zero, which Prometheus reads as a counter reset).
    pub fn forget_volume(&self, export: &str) {
        for k in OpKind::ALL {
            let l = VolumeOp {
                volume: export.into(),
                op: k.name().into(),
            };
            self.io_ops.remove(&l);
            self.io_errors.remove(&l);
            self.io_bytes.remove(&l);
            self.io_latency.remove(&l);
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
