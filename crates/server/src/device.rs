//! Engine volumes and snapshots as NBD block devices, and the registry of
//! exports the NBD server looks names up in.

use lamina_engine::{Error as E, ExtentKind, Volume};
use lamina_nbd::{BlockDevice, DeviceError, Exports, Extent};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// One exported volume or snapshot. Detaching marks it so that connections
/// still open get errors instead of reaching a volume that was detached.
pub struct EngineDevice {
    handle: Volume,
    attached: AtomicBool,
}

impl EngineDevice {
    pub fn new(handle: Volume) -> Self {
        EngineDevice {
            handle,
            attached: AtomicBool::new(true),
        }
    }

    fn check(&self) -> Result<(), DeviceError> {
        if self.attached.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(DeviceError::Io(format!(
                "{} was detached",
                self.handle.name()
            )))
        }
    }
}

fn map(e: E) -> DeviceError {
    let msg = e.to_string();
    match e {
        E::NoSpace { .. } => DeviceError::NoSpace(msg),
        E::OutOfRange { .. } | E::InvalidArgument(_) => DeviceError::Invalid(msg),
        E::ReadOnly(_) => DeviceError::ReadOnly(msg),
        _ => DeviceError::Io(msg),
    }
}

impl BlockDevice for EngineDevice {
    fn size(&self) -> Result<u64, DeviceError> {
        self.check()?;
        self.handle.size().map_err(map)
    }
    fn read_only(&self) -> bool {
        self.handle.read_only()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.check()?;
        self.handle.read(offset, buf).map_err(map)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), DeviceError> {
        self.check()?;
        self.handle.write(offset, data).map_err(map)?;
        if fua {
            self.handle.flush().map_err(map)?;
        }
        Ok(())
    }
    fn flush(&self) -> Result<(), DeviceError> {
        self.check()?;
        self.handle.flush().map_err(map)
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        self.check()?;
        self.handle.trim(offset, len).map_err(map)
    }
    fn write_zeroes(&self, offset: u64, len: u64, _may_trim: bool) -> Result<(), DeviceError> {
        // Unmapped blocks read as zeros and the index has no backing chain,
        // so zeroing is unmapping, and is always fast.
        self.check()?;
        self.handle.write_zeroes(offset, len).map_err(map)
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, DeviceError> {
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
    pub fn remove(&self, name: &str) -> bool {
        match self.map.write().unwrap().remove(name) {
            Some(d) => {
                d.attached.store(false, Ordering::SeqCst);
                true
            }
            None => false,
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.map.read().unwrap().contains_key(name)
    }

    pub fn read_only(&self, name: &str) -> Option<bool> {
        self.map.read().unwrap().get(name).map(|d| d.read_only())
    }
}

impl Exports for Registry {
    fn lookup(&self, name: &str) -> Option<Arc<dyn BlockDevice>> {
        self.map
            .read()
            .unwrap()
            .get(name)
            .map(|d| d.clone() as Arc<dyn BlockDevice>)
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
                    if d.read_only() {
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
