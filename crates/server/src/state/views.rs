//! The state as the API shows it: volumes and snapshots with their
//! exports, space and running operations, the space warning, and times in
//! RFC 3339. Reads only.

use super::{snapshot_export, State};
use crate::error::Failure;
use lamina_api as api;

pub fn rfc3339(ns: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns);
    humantime::format_rfc3339_seconds(t).to_string()
}

pub fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

impl State {
    pub fn uri(&self, export: &str) -> String {
        match self.nbd_tcp {
            Some(addr) => format!("nbd://{addr}/{export}"),
            None => format!(
                "nbd+unix:///{export}?socket={}",
                self.layout.nbd_socket.display()
            ),
        }
    }

    pub(super) fn export_of(&self, name: &str) -> Option<api::Export> {
        let read_only = self.exports.read_only(name)?;
        Some(api::Export {
            uri: self.uri(name),
            name: name.to_string(),
            read_only,
            connections: self.exports.connections(name),
            file: self.files.served(name).map(|p| p.display().to_string()),
        })
    }

    /// A volume as the API shows it. Reads the volume's exclusive size from
    /// the pool: call it off the reactor.
    pub fn volume(&self, v: lamina_engine::VolumeInfo) -> api::Volume {
        use lamina_engine::CloneState as C;
        // The oldest running operation: a background one if any.
        let operation = self
            .running
            .lock()
            .unwrap()
            .get(&v.name)
            .and_then(|rs| rs.first())
            .map(|r| r.id.clone());
        let copying = self.running_copy_into(&v.name).is_some();
        let clone_state = match v.clone_state {
            _ if copying => api::CloneState::Copying,
            C::None => api::CloneState::None,
            C::Linked => api::CloneState::Linked,
            C::Flattening => api::CloneState::Flattening,
            C::Independent => api::CloneState::Independent,
        };
        // A volume deleted meanwhile shows what it had.
        let exclusive = self
            .pool
            .usage(&v.name, None)
            .map(|u| u.exclusive_bytes)
            .unwrap_or(v.allocated_bytes);
        let replication = crate::front::replica_set(&self.store, &self.pool, &v.name)
            .ok()
            .flatten()
            .map(|r| replication(&self.store, r));
        api::Volume {
            id: v.id,
            export: self.export_of(&v.name),
            name: v.name,
            size: v.size,
            created: rfc3339(v.created),
            allocated_bytes: v.allocated_bytes,
            exclusive_bytes: exclusive,
            shared_bytes: v.allocated_bytes.saturating_sub(exclusive),
            parent_snapshot: v.parent_snapshot,
            origin: v.origin.map(|o| api::Origin {
                volume: o.volume,
                snapshot: o.snapshot,
            }),
            clone_state,
            operation,
            labels: v.labels.into_iter().collect(),
            replication,
        }
    }

    /// A volume this node fronts holding no replica of it, as the API
    /// shows it: what its record knows (its size, its replicas); no data
    /// of it is here, so it has no id, time, usage or labels of this
    /// node's pool.
    pub fn diskless_volume(&self, name: String, rec: crate::store::ReplicaSetRec) -> api::Volume {
        api::Volume {
            id: 0,
            export: self.export_of(&name),
            size: rec.size,
            created: String::new(),
            allocated_bytes: 0,
            exclusive_bytes: 0,
            shared_bytes: 0,
            parent_snapshot: None,
            origin: None,
            clone_state: api::CloneState::None,
            operation: None,
            labels: Default::default(),
            replication: Some(replication(&self.store, rec)),
            name,
        }
    }

    /// Whether the pool is past its high-water mark, and by how much
    /// (reads every refcount page: call it once per decision).
    pub fn space_warning(&self) -> Result<Option<String>, Failure> {
        Ok(self.space_warning_of(&self.pool.stats()?))
    }

    /// [`State::space_warning`] from stats already read.
    pub fn space_warning_of(&self, stats: &lamina_engine::PoolStats) -> Option<String> {
        let used = stats.used_bytes;
        let room = crate::paths::capacity_bytes(&self.layout.root, stats);
        let total = used.saturating_add(room);
        let past = used >= self.high_water.threshold(total);
        past.then(|| {
            format!(
                "the pool is {}% full ({} used of {}: its used bytes and what new data can still take), past its high-water mark of {}",
                if total == 0 { 100 } else { (used as u128 * 100 / total as u128) as u64 },
                api::format_size(used),
                api::format_size(total),
                self.high_water
            )
        })
    }

    pub fn snapshot(&self, s: lamina_engine::SnapshotInfo) -> api::Snapshot {
        // A deleted volume's snapshot is attached under `VOLUME@ID`, the
        // name that reaches it alone.
        let reference = if s.volume_deleted {
            format!("{}@{}", s.volume, s.volume_id)
        } else {
            s.volume.clone()
        };
        api::Snapshot {
            export: self.export_of(&snapshot_export(&reference, &s.name)),
            id: s.id,
            volume_id: s.volume_id,
            volume_deleted: s.volume_deleted,
            volume: s.volume,
            name: s.name,
            created: rfc3339(s.created),
            parent: s.parent,
            children: s.children,
            system: s.system,
            labels: s.labels.into_iter().collect(),
            restore_size: s.restore_size,
            allocated_bytes: s.allocated_bytes,
            exclusive_bytes: s.exclusive_bytes,
            shared_bytes: s.allocated_bytes.saturating_sub(s.exclusive_bytes),
            clones: s.clones,
        }
    }
}

/// A replica set as the API shows it: each other node's replica at the
/// address the front end reaches it at (its node list's, else the one
/// recorded with it).
fn replication(store: &crate::store::Store, rec: crate::store::ReplicaSetRec) -> api::Replication {
    let diskless = rec.diskless;
    let replicas: Vec<api::ReplicaInfo> = rec
        .replicas
        .into_iter()
        .map(|r| {
            let secs = |t: i64| rfc3339((t.max(0) as u64).saturating_mul(1_000_000_000));
            let rebuild = r
                .rebuild
                .as_ref()
                .filter(|_| r.faulted.is_some())
                .and_then(|b| b.round.as_ref().map(|t| (b, t)))
                .map(|(b, t)| {
                    let took = (crate::front::now() - b.started).max(1) as u64;
                    let rate = b.sent / took;
                    api::RebuildProgress {
                        sent_bytes: b.sent,
                        round_bytes: t.bytes,
                        round_sent_bytes: t.done,
                        started: secs(b.started),
                        rate_bytes_per_second: rate,
                        eta_seconds: (rate > 0).then(|| t.bytes.saturating_sub(t.done) / rate),
                    }
                });
            api::ReplicaInfo {
                state: match (&r.faulted, &rebuild) {
                    (None, _) => api::ReplicaState::Healthy,
                    (Some(_), Some(_)) => api::ReplicaState::Rebuilding,
                    (Some(_), None) => api::ReplicaState::Faulted,
                },
                address: (!r.address.is_empty())
                    .then(|| crate::front::remote_of(store, &r).address),
                node: r.node,
                reason: r.faulted,
                since: secs(r.since),
                rebuild,
                last_rebuild: r.last_rebuild.map(|l| api::RebuildDone {
                    sent_bytes: l.sent,
                    started: secs(l.started),
                    ended: secs(l.ended),
                }),
            }
        })
        .collect();
    let healthy = replicas
        .iter()
        .filter(|r| r.state == api::ReplicaState::Healthy)
        .count();
    api::Replication {
        generation: rec.generation,
        state: match healthy {
            0 => api::ReplicationState::Unavailable,
            n if n == replicas.len() => api::ReplicationState::Healthy,
            _ => api::ReplicationState::Degraded,
        },
        replicas,
        diskless,
    }
}
