//! Engine volumes and snapshots on the data path's trait (`BlockIo`, by way
//! of `InlineIo`: the engine's calls finish on the calling thread, which is
//! an NBD runner thread that may block), the activation generations of the
//! engine's volumes (kept in the daemon's store), and the registry of
//! exports the NBD server looks names up in. The registry holds any volume
//! on the trait, not only the engine's.

use crate::error::ServerError;
use crate::pacing::Activity;
use crate::store::Store;
use lamina_blockio::{
    wait, Admitted, BlockIo, Caps, Completion, Fence, GenerationStore, Holder, InlineIo, IoError,
    IoErrorKind, IoObserver, IoOp, Observed,
};
use lamina_engine::{Error as E, ErrorKind, ExtentKind, Volume};
use lamina_nbd::{Exports, Extent};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

/// One engine volume or snapshot, opened. A volume's handle holds a place
/// at the volume's generation fence; a snapshot, which takes no writes, has
/// none.
pub struct EngineDevice {
    handle: Volume,
    holder: Option<Holder>,
}

impl EngineDevice {
    /// `fence` is the volume's ([`Generations::fence`]); `None` for a
    /// snapshot.
    pub fn new(handle: Volume, fence: Option<Arc<Fence>>) -> Self {
        EngineDevice {
            handle,
            holder: fence.map(Holder::new),
        }
    }

    /// Let one request through this handle's generation, or refuse it.
    fn admit(&self) -> Result<Option<Admitted<'_>>, IoError> {
        self.holder.as_ref().map(Holder::admit).transpose()
    }
}

/// The highest activation generation of each engine volume, kept in the
/// daemon's store ([`Store::generation`]), and one [`Fence`] per volume
/// shared by all its open handles. By id, not
/// name: a volume deleted and made again under its name starts afresh (ids
/// are never reused).
pub struct Generations {
    store: Arc<Store>,
    fences: Mutex<HashMap<u64, Weak<Fence>>>,
}

/// One volume's row of the store's `generations` table.
struct Stored {
    store: Arc<Store>,
    id: u64,
}

fn store_error(e: ServerError) -> IoError {
    IoError::new(
        IoErrorKind::Io,
        format!("the daemon's store of generations: {e}"),
    )
}

impl GenerationStore for Stored {
    fn load(&self) -> Result<u64, IoError> {
        self.store.generation(self.id).map_err(store_error)
    }

    fn save(&self, generation: u64) -> Result<(), IoError> {
        self.store
            .put_generation(self.id, generation)
            .map_err(store_error)
    }
}

impl Generations {
    pub fn new(store: Arc<Store>) -> Generations {
        Generations {
            store,
            fences: Mutex::new(HashMap::new()),
        }
    }

    /// The fence of volume `id` (named `name` in errors): the one its other
    /// open handles share, or one loaded from the store.
    pub fn fence(&self, id: u64, name: &str) -> Result<Arc<Fence>, IoError> {
        let mut fences = self.fences.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = fences.get(&id).and_then(Weak::upgrade) {
            return Ok(f);
        }
        let f = Fence::open(
            &format!("volume {name:?}"),
            Box::new(Stored {
                store: self.store.clone(),
                id,
            }),
        )?;
        fences.retain(|_, w| w.strong_count() > 0);
        fences.insert(id, Arc::downgrade(&f));
        Ok(f)
    }
}

/// The data path's error for an engine error, by its kind (no wildcard: a
/// new kind must be given one).
fn map(e: E) -> IoError {
    let kind = match e.kind() {
        ErrorKind::NoSpace => IoErrorKind::NoSpace,
        ErrorKind::Invalid => IoErrorKind::Invalid,
        ErrorKind::ReadOnly => IoErrorKind::ReadOnly,
        ErrorKind::NotFound => IoErrorKind::Gone,
        ErrorKind::AlreadyExists
        | ErrorKind::Conflict
        | ErrorKind::Unavailable
        | ErrorKind::Internal => IoErrorKind::Io,
    };
    IoError::new(kind, e.to_string())
}

impl InlineIo for EngineDevice {
    fn size(&self) -> Result<u64, IoError> {
        self.handle.size().map_err(map)
    }
    fn read_only(&self) -> bool {
        self.handle.read_only()
    }
    fn caps(&self) -> Caps {
        Caps::ALL
    }
    fn activate(&self, generation: u64) -> Result<(), IoError> {
        match &self.holder {
            Some(h) => h.activate(generation),
            None => Err(IoError::new(
                IoErrorKind::NotSupported,
                format!(
                    "{} is a snapshot: only a volume is activated for writing",
                    self.handle.name()
                ),
            )),
        }
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        let _a = self.admit()?;
        self.handle.read(offset, buf).map_err(map)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), IoError> {
        let _a = self.admit()?;
        self.handle.write(offset, data).map_err(map)?;
        if fua {
            self.handle.flush().map_err(map)?;
        }
        Ok(())
    }
    fn flush(&self) -> Result<(), IoError> {
        let _a = self.admit()?;
        self.handle.flush().map_err(map)
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), IoError> {
        let _a = self.admit()?;
        self.handle.trim(offset, len).map_err(map)
    }
    fn write_zeroes(&self, offset: u64, len: u64, _may_trim: bool) -> Result<(), IoError> {
        // Unmapped blocks read as zeros and the index has no backing chain,
        // so zeroing is unmapping, and is always fast.
        let _a = self.admit()?;
        self.handle.write_zeroes(offset, len).map_err(map)
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, IoError> {
        let _a = self.admit()?;
        let ext = self.handle.extents(offset, len).map_err(map)?;
        Ok(ext
            .into_iter()
            .map(|e| {
                let hole = e.kind != ExtentKind::Data;
                Extent {
                    length: e.len,
                    hole,
                    zero: hole,
                }
            })
            .collect())
    }
}

/// One export: a volume on the trait, and what the registry keeps of it.
/// Detaching marks it so that connections still open get errors instead of
/// reaching a volume that was detached.
struct Export {
    name: String,
    volume: Arc<dyn BlockIo>,
    attached: AtomicBool,
    /// NBD sessions open on it now (see [`Opened`]).
    connections: AtomicU32,
    /// Where its sessions' I/O is counted, if it is.
    io: Option<Arc<dyn IoObserver>>,
    /// The node's count of client I/O, which paces transfers (`pacing.rs`).
    activity: Arc<Activity>,
}

/// What the NBD server gets when a client opens an export: the device, and
/// one count in its `connections` for as long as the session holds it (an
/// `NBD_OPT_INFO` look-up holds it only while it answers). The export's
/// file holds one that is not counted: it is no NBD client.
struct Opened(Arc<Export>, bool);

impl Opened {
    fn new(export: Arc<Export>) -> Opened {
        export.connections.fetch_add(1, Ordering::SeqCst);
        Opened(export, true)
    }

    fn uncounted(export: Arc<Export>) -> Opened {
        Opened(export, false)
    }

    /// Check that it is still attached, and count one client operation.
    fn check(&self) -> Result<(), IoError> {
        self.0.activity.bump();
        if self.0.attached.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(IoError::new(
                IoErrorKind::Gone,
                format!("export {} was detached", self.0.name),
            ))
        }
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        if self.1 {
            self.0.connections.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl BlockIo for Opened {
    fn size(&self) -> Result<u64, IoError> {
        self.check()?;
        self.0.volume.size()
    }
    fn read_only(&self) -> bool {
        self.0.volume.read_only()
    }
    fn caps(&self) -> Caps {
        self.0.volume.caps()
    }
    fn activate(&self, generation: u64) -> Result<(), IoError> {
        self.check()?;
        self.0.volume.activate(generation)
    }
    fn submit(&self, op: IoOp, done: Completion) {
        match self.check() {
            Ok(()) => self.0.volume.submit(op, done),
            Err(e) => done(Err(e.at(op.describe()))),
        }
    }
}

/// The exports currently attached, by NBD export name (any volume on the
/// trait), and the generations of the engine's volumes they open.
pub struct Registry {
    map: RwLock<HashMap<String, Arc<Export>>>,
    generations: Generations,
}

impl Registry {
    pub fn new(store: Arc<Store>) -> Registry {
        Registry {
            map: RwLock::default(),
            generations: Generations::new(store),
        }
    }

    /// Open engine volume `volume` (or its `snapshot`) for an export: a
    /// volume's handle starts at generation 0 at its volume's fence.
    pub fn open_engine(
        &self,
        pool: &lamina_engine::Pool,
        volume: &str,
        snapshot: Option<&str>,
    ) -> Result<EngineDevice, ServerError> {
        Ok(match snapshot {
            Some(s) => EngineDevice::new(pool.open_snapshot(volume, s)?, None),
            None => {
                let handle = pool.open_volume(volume)?;
                let id = pool.volume_info_by_name(volume)?.id;
                let fence = self
                    .generations
                    .fence(id, volume)
                    .map_err(|e| ServerError::StoreUnavailable(e.to_string()))?;
                EngineDevice::new(handle, Some(fence))
            }
        })
    }

    pub fn insert(
        &self,
        name: &str,
        volume: Arc<dyn BlockIo>,
        io: Option<Arc<dyn IoObserver>>,
        activity: Arc<Activity>,
    ) {
        let export = Export {
            name: name.to_string(),
            volume,
            attached: AtomicBool::new(true),
            connections: AtomicU32::new(0),
            io,
            activity,
        };
        self.map
            .write()
            .unwrap()
            .insert(name.to_string(), Arc::new(export));
    }

    /// Remove an export; open connections to it get errors from now on.
    /// What they wrote before is flushed first.
    pub fn remove(&self, name: &str) -> Result<bool, IoError> {
        let export = self.map.write().unwrap().remove(name);
        match export {
            Some(x) => {
                x.attached.store(false, Ordering::SeqCst);
                if x.volume.caps().flush {
                    wait(&*x.volume, IoOp::Flush)?;
                }
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// NBD clients connected to an export now (0 if it is not attached).
    pub fn connections(&self, name: &str) -> u32 {
        self.map
            .read()
            .unwrap()
            .get(name)
            .map_or(0, |x| x.connections.load(Ordering::SeqCst))
    }

    pub fn contains(&self, name: &str) -> bool {
        self.map.read().unwrap().contains_key(name)
    }

    pub fn read_only(&self, name: &str) -> Option<bool> {
        self.map
            .read()
            .unwrap()
            .get(name)
            .map(|x| x.volume.read_only())
    }
}

impl Registry {
    /// The volume behind export `name` for its file: like an NBD client's,
    /// with I/O refused once detached and counted in the metrics, but not
    /// counted among the export's clients.
    pub fn open_for_file(&self, name: &str) -> Option<Arc<dyn BlockIo>> {
        self.map
            .read()
            .unwrap()
            .get(name)
            .map(|x| observed(x, Opened::uncounted(x.clone())))
    }
}

fn observed(x: &Export, opened: Opened) -> Arc<dyn BlockIo> {
    match &x.io {
        Some(io) => Arc::new(Observed::new(opened, io.clone())),
        None => Arc::new(opened),
    }
}

impl Exports for Registry {
    fn lookup(&self, name: &str) -> Option<Arc<dyn BlockIo>> {
        self.map
            .read()
            .unwrap()
            .get(name)
            .map(|x| observed(x, Opened::new(x.clone())))
    }
    fn list(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self
            .map
            .read()
            .unwrap()
            .iter()
            .map(|(n, x)| {
                (
                    n.clone(),
                    if x.volume.read_only() {
                        "Lamina snapshot (read-only)".into()
                    } else {
                        "Lamina volume".into()
                    },
                )
            })
            .collect();
        v.sort();
        v
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use lamina_blockio::testing::{contract, Mirror};
    use lamina_engine::{Pool, PoolOptions};

    /// The daemon's pool and store in a directory, with volumes "a", "b"
    /// and "c" of 8 MiB. A restart abandons the pool, as a killed daemon
    /// would, and opens both again.
    struct Daemon {
        dir: tempfile::TempDir,
        pool: Option<Pool>,
        registry: Option<Registry>,
        mirror: bool,
        /// Opened as a replicated volume of the three, whose faults land
        /// here (the contract faults none).
        replicated: Option<Arc<Faults>>,
    }

    /// A replicated volume's membership that records faults in memory
    /// (`replicas.rs`'s tests use it too).
    #[derive(Default)]
    pub(crate) struct Faults(pub(crate) std::sync::Mutex<Vec<String>>);

    impl lamina_replica::Membership for Faults {
        fn fault(&self, _index: usize, name: &str, reason: &str, _: &[u64]) -> Result<(), IoError> {
            self.0.lock().unwrap().push(format!("{name}: {reason}"));
            Ok(())
        }
    }

    impl Daemon {
        fn new(mirror: bool) -> Daemon {
            let dir = tempfile::tempdir().unwrap();
            let pool = Pool::create_dir(dir.path().join("pool"), PoolOptions::default()).unwrap();
            for v in ["a", "b", "c"] {
                pool.create_volume(v, 8 << 20).unwrap();
            }
            let mut d = Daemon {
                dir,
                pool: Some(pool),
                registry: None,
                mirror,
                replicated: None,
            };
            d.open_store();
            d
        }

        fn open_store(&mut self) {
            let store = Store::open(&self.dir.path().join("store.redb")).unwrap();
            self.registry = Some(Registry::new(Arc::new(store)));
        }

        /// Each of `volumes` holds the contract suite's last write (4s at
        /// offset 0, by a holder of generation 4).
        fn hold_the_last_write(&self, volumes: &[&str]) {
            for name in volumes {
                let v = self.engine(name);
                v.activate(4).unwrap();
                match wait(
                    &*v,
                    IoOp::Read {
                        offset: 0,
                        buf: vec![0; 4096],
                    },
                ) {
                    Ok(lamina_blockio::IoDone::Read(b)) => assert_eq!(b, vec![4; 4096], "{name}"),
                    r => panic!("{name}: {r:?}"),
                }
            }
        }

        fn engine(&self, volume: &str) -> Arc<dyn BlockIo> {
            let r = self.registry.as_ref().unwrap();
            Arc::new(
                r.open_engine(self.pool.as_ref().unwrap(), volume, None)
                    .unwrap(),
            )
        }
    }

    impl contract::Subject for Daemon {
        fn open(&mut self) -> Arc<dyn BlockIo> {
            if let Some(faults) = &self.replicated {
                let replicas = ["a", "b", "c"]
                    .into_iter()
                    .map(|v| lamina_replica::Replica {
                        name: v.into(),
                        io: self.engine(v),
                    })
                    .collect();
                return Arc::new(
                    lamina_replica::Replicated::new("r", replicas, faults.clone()).unwrap(),
                );
            }
            if self.mirror {
                Arc::new(Mirror::new(self.engine("a"), self.engine("b")))
            } else {
                self.engine("a")
            }
        }

        fn restart(&mut self) {
            self.registry = None;
            self.pool.take().unwrap().abandon();
            let pool =
                Pool::open_dir(self.dir.path().join("pool"), PoolOptions::default()).unwrap();
            self.pool = Some(pool);
            self.open_store();
        }
    }

    #[test]
    fn the_engine_volume_keeps_the_contract() {
        contract::run(&mut Daemon::new(false));
    }

    #[test]
    fn a_mirror_of_two_engine_volumes_keeps_the_contract() {
        let mut d = Daemon::new(true);
        contract::run(&mut d);
        // Both legs hold what the mirror wrote.
        d.hold_the_last_write(&["a", "b"]);
    }

    #[test]
    fn a_replicated_volume_of_three_engine_volumes_keeps_the_contract() {
        let mut d = Daemon::new(false);
        let faults = Arc::new(Faults::default());
        d.replicated = Some(faults.clone());
        contract::run(&mut d);
        assert_eq!(*faults.0.lock().unwrap(), Vec::<String>::new());
        // Every replica holds what the volume wrote.
        d.hold_the_last_write(&["a", "b", "c"]);
    }

    #[test]
    fn the_registry_exports_any_volume_and_cuts_off_a_detached_one() {
        let d = Daemon::new(false);
        let r = d.registry.as_ref().unwrap();
        let mirror: Arc<dyn BlockIo> = Arc::new(Mirror::new(d.engine("a"), d.engine("b")));
        r.insert("m", mirror, None, Arc::new(Activity::default()));
        let session = r.lookup("m").unwrap();
        assert_eq!(r.connections("m"), 1);
        assert_eq!(
            r.list(),
            vec![("m".to_string(), "Lamina volume".to_string())]
        );
        wait(
            &*session,
            IoOp::Write {
                offset: 0,
                data: vec![7; 4096],
                fua: false,
            },
        )
        .unwrap();
        assert!(r.remove("m").unwrap());
        let e = wait(&*session, IoOp::Flush).unwrap_err();
        assert_eq!(
            (e.kind, e.to_string().as_str()),
            (
                IoErrorKind::Gone,
                "flush at offset 0 (0 bytes): volume gone: export m was detached"
            )
        );
        drop(session);
        assert_eq!(r.connections("m"), 0);
    }
}
