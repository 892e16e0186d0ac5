//! Engine volumes and snapshots on the data path's trait (`BlockIo`, by way
//! of `InlineIo`: the engine's calls finish on the calling thread, which is
//! an NBD runner thread that may block), and the registry of exports the NBD
//! server looks names up in.

use crate::pacing::Activity;
use lamina_blockio::{
    BlockIo, Completion, InlineIo, IoError, IoErrorKind, IoObserver, IoOp, Observed,
};
use lamina_engine::{Error as E, ErrorKind, ExtentKind, Volume};
use lamina_nbd::{Exports, Extent};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, RwLock};

/// One exported volume or snapshot. Detaching marks it so that connections
/// still open get errors instead of reaching a volume that was detached.
pub struct EngineDevice {
    handle: Volume,
    attached: AtomicBool,
    /// NBD sessions open on it now (see [`Opened`]).
    connections: AtomicU32,
    /// Where its sessions' I/O is counted, if it is.
    io: Option<Arc<dyn IoObserver>>,
    /// The node's count of client I/O, which paces transfers (`pacing.rs`).
    activity: Arc<Activity>,
}

impl EngineDevice {
    pub fn new(handle: Volume, io: Option<Arc<dyn IoObserver>>, activity: Arc<Activity>) -> Self {
        EngineDevice {
            handle,
            attached: AtomicBool::new(true),
            connections: AtomicU32::new(0),
            io,
            activity,
        }
    }

    /// Make every write acknowledged so far durable.
    pub fn flush(&self) -> Result<(), lamina_engine::Error> {
        self.handle.flush()
    }

    /// Check that it is still attached, and count one client operation.
    fn check(&self) -> Result<(), IoError> {
        self.activity.bump();
        if self.attached.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(IoError::new(
                IoErrorKind::Gone,
                format!("{} was detached", self.handle.name()),
            ))
        }
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
        self.check()?;
        self.handle.size().map_err(map)
    }
    fn read_only(&self) -> bool {
        self.handle.read_only()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        self.check()?;
        self.handle.read(offset, buf).map_err(map)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), IoError> {
        self.check()?;
        self.handle.write(offset, data).map_err(map)?;
        if fua {
            self.handle.flush().map_err(map)?;
        }
        Ok(())
    }
    fn flush(&self) -> Result<(), IoError> {
        self.check()?;
        self.handle.flush().map_err(map)
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), IoError> {
        self.check()?;
        self.handle.trim(offset, len).map_err(map)
    }
    fn write_zeroes(&self, offset: u64, len: u64, _may_trim: bool) -> Result<(), IoError> {
        // Unmapped blocks read as zeros and the index has no backing chain,
        // so zeroing is unmapping, and is always fast.
        self.check()?;
        self.handle.write_zeroes(offset, len).map_err(map)
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, IoError> {
        self.check()?;
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

/// What the NBD server gets when a client opens an export: the device, and
/// one count in its `connections` for as long as the session holds it (an
/// `NBD_OPT_INFO` look-up holds it only while it answers).
struct Opened(Arc<EngineDevice>);

impl Opened {
    fn new(dev: Arc<EngineDevice>) -> Opened {
        dev.connections.fetch_add(1, Ordering::SeqCst);
        Opened(dev)
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

impl BlockIo for Opened {
    fn size(&self) -> Result<u64, IoError> {
        BlockIo::size(self.0.as_ref())
    }
    fn read_only(&self) -> bool {
        BlockIo::read_only(self.0.as_ref())
    }
    fn submit(&self, op: IoOp, done: Completion) {
        self.0.submit(op, done)
    }
}

/// The exports currently attached, by NBD export name.
#[derive(Default)]
pub struct Registry {
    map: RwLock<HashMap<String, Arc<EngineDevice>>>,
}

impl Registry {
    pub fn insert(&self, name: &str, dev: Arc<EngineDevice>) {
        self.map.write().unwrap().insert(name.to_string(), dev);
    }

    /// Remove an export; open connections to it get errors from now on.
    /// What they wrote before is flushed first.
    pub fn remove(&self, name: &str) -> Result<bool, lamina_engine::Error> {
        let dev = self.map.write().unwrap().remove(name);
        match dev {
            Some(d) => {
                d.attached.store(false, Ordering::SeqCst);
                d.flush()?;
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
            .map_or(0, |d| d.connections.load(Ordering::SeqCst))
    }

    pub fn contains(&self, name: &str) -> bool {
        self.map.read().unwrap().contains_key(name)
    }

    pub fn read_only(&self, name: &str) -> Option<bool> {
        self.map
            .read()
            .unwrap()
            .get(name)
            .map(|d| InlineIo::read_only(d.as_ref()))
    }
}

impl Exports for Registry {
    fn lookup(&self, name: &str) -> Option<Arc<dyn BlockIo>> {
        self.map.read().unwrap().get(name).map(|d| {
            let opened = Opened::new(d.clone());
            match &d.io {
                Some(io) => Arc::new(Observed::new(opened, io.clone())) as Arc<dyn BlockIo>,
                None => Arc::new(opened) as Arc<dyn BlockIo>,
            }
        })
    }
    fn list(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self
            .map
            .read()
            .unwrap()
            .iter()
            .map(|(n, d)| {
                (
                    n.clone(),
                    if InlineIo::read_only(d.as_ref()) {
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
