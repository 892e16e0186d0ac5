//! The node's records: one small JSON file per staged volume under the
//! state directory, saying what staging and publishing did, so that
//! unstage and unpublish undo exactly that, also after the plugin restarts.
//! A record is written before each step it describes (so a crash leaves a
//! record naming everything that may exist), by writing a temporary file,
//! syncing it and renaming it over the old one. Records say what was
//! meant; every call checks them against what the kernel shows (sys.rs).

use super::Error;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// How a volume is accessed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// The block device itself.
    Block,
    /// A filesystem mounted at the staging path.
    Mount {
        /// The filesystem asked for ("" when the CO left it to the driver).
        fs_type: String,
        mount_flags: Vec<String>,
    },
}

/// The block device a volume's export became.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    /// nbdfuse serving the export as a file, and a loop device over it.
    Fuse {
        /// nbdfuse's process, once it answered.
        pid: Option<u32>,
        /// The loop device, once set up.
        loop_dev: Option<PathBuf>,
        /// Its sequence number (`diskseq`) at its setup, which tells it
        /// from a later loop device of the same number.
        #[serde(default)]
        loop_seq: Option<u64>,
    },
    /// The kernel's NBD client (`nbd-client`) on this device.
    Kernel { dev: PathBuf },
    /// The daemon serving the volume as a file on this host
    /// (`attach?file=true`), and a loop device over it.
    File {
        file: PathBuf,
        /// The loop device, once set up.
        loop_dev: Option<PathBuf>,
        /// Its sequence number (`diskseq`) at its setup, which tells it
        /// from a later loop device of the same number, also once its file
        /// no longer has a name (see `sys::loops_over`).
        #[serde(default)]
        loop_seq: Option<u64>,
    },
}

/// One publish of a staged volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publish {
    pub target: PathBuf,
    pub read_only: bool,
    /// The access mode (CSI's enum value) it was published with.
    pub mode: i32,
    pub mount_flags: Vec<String>,
}

/// What the node did for one volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The CSI volume id (`NAME@ID`).
    pub volume_id: String,
    /// The Lamina volume name.
    pub name: String,
    pub staging_path: PathBuf,
    pub access: Access,
    /// The access mode (CSI's enum value) it was staged with.
    pub mode: i32,
    /// The device, once attaching began.
    pub device: Option<Device>,
    /// The filesystem found or made on the device (mount access).
    pub fs: Option<String>,
    /// Every step of staging is done.
    pub staged: bool,
    pub publishes: Vec<Publish>,
}

impl Record {
    /// The block device, when it is known.
    pub fn device_path(&self) -> Option<&Path> {
        match self.device.as_ref()? {
            Device::Fuse { loop_dev, .. } => loop_dev.as_deref(),
            Device::Kernel { dev } => Some(dev),
            Device::File { loop_dev, .. } => loop_dev.as_deref(),
        }
    }

    /// Whether `path` is the staging path or one of the publish targets.
    pub fn owns_path(&self, path: &Path) -> bool {
        same_path(&self.staging_path, path) || self.publish(path).is_some()
    }

    pub fn publish(&self, target: &Path) -> Option<&Publish> {
        self.publishes.iter().find(|p| same_path(&p.target, target))
    }
}

/// Paths compared as the CO gives them, ignoring a trailing slash.
pub fn same_path(a: &Path, b: &Path) -> bool {
    a.components().eq(b.components())
}

/// The records' directory and the per-volume working directories.
#[derive(Clone, Debug)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// Open (creating) the state directory. It is made absolute, since
    /// loop devices and processes are matched by the paths under it.
    pub fn open(root: &Path) -> Result<Store, Error> {
        let root = std::path::absolute(root).map_err(|e| Error::io("resolve", root, e))?;
        for d in [root.join("volumes"), root.join("fuse")] {
            std::fs::create_dir_all(&d).map_err(|e| Error::io("create", &d, e))?;
        }
        Ok(Store { root })
    }

    fn record_path(&self, volume_id: &str) -> PathBuf {
        self.root.join("volumes").join(format!("{volume_id}.json"))
    }

    /// The directory nbdfuse mounts for a volume.
    pub fn fuse_dir(&self, volume_id: &str) -> PathBuf {
        self.root.join("fuse").join(volume_id)
    }

    /// The file nbdfuse serves the export as.
    pub fn fuse_file(&self, volume_id: &str) -> PathBuf {
        self.fuse_dir(volume_id).join("disk")
    }

    /// nbdfuse's pid file (written when it is ready) and its log.
    pub fn fuse_pidfile(&self, volume_id: &str) -> PathBuf {
        self.root.join("fuse").join(format!("{volume_id}.pid"))
    }

    pub fn fuse_log(&self, volume_id: &str) -> PathBuf {
        self.root.join("fuse").join(format!("{volume_id}.log"))
    }

    /// The record of a volume, if there is one. A record that does not
    /// parse is an error (it is never half-written, so someone changed it).
    pub fn load(&self, volume_id: &str) -> Result<Option<Record>, Error> {
        // Only well-formed ids name files: no id can reach outside the
        // directory.
        if crate::ids::VolumeId::parse(volume_id).is_none() {
            return Ok(None);
        }
        let p = self.record_path(volume_id);
        let bytes = match std::fs::read(&p) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io("read", &p, e)),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::Record {
                path: p.display().to_string(),
                reason: e.to_string(),
            })
    }

    /// Every record (for finding who owns a path).
    pub fn all(&self) -> Result<Vec<Record>, Error> {
        let dir = self.root.join("volumes");
        let entries = std::fs::read_dir(&dir).map_err(|e| Error::io("list", &dir, e))?;
        let mut out = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            if let Some(r) = self.load(id)? {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// Write a record durably: a temporary file, synced, renamed over the
    /// old one, and the directory synced.
    pub fn save(&self, r: &Record) -> Result<(), Error> {
        let p = self.record_path(&r.volume_id);
        let tmp = p.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(r).map_err(|e| Error::Record {
            path: p.display().to_string(),
            reason: e.to_string(),
        })?;
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()
        };
        write().map_err(|e| Error::io("write", &tmp, e))?;
        std::fs::rename(&tmp, &p).map_err(|e| Error::io("rename", &p, e))?;
        self.sync_dir()
    }

    /// Forget a volume (no record is fine).
    pub fn remove(&self, volume_id: &str) -> Result<(), Error> {
        let p = self.record_path(volume_id);
        match std::fs::remove_file(&p) {
            Ok(()) => self.sync_dir(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("remove", &p, e)),
        }
    }

    fn sync_dir(&self) -> Result<(), Error> {
        let d = self.root.join("volumes");
        std::fs::File::open(&d)
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::io("sync", &d, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> Record {
        Record {
            volume_id: id.into(),
            name: "pvc-1".into(),
            staging_path: "/s/pvc-1".into(),
            access: Access::Mount {
                fs_type: "ext4".into(),
                mount_flags: vec!["noatime".into()],
            },
            mode: 1,
            device: Some(Device::Fuse {
                pid: Some(42),
                loop_dev: Some("/dev/loop3".into()),
                loop_seq: Some(9),
            }),
            fs: Some("ext4".into()),
            staged: true,
            publishes: vec![Publish {
                target: "/t/a".into(),
                read_only: true,
                mode: 1,
                mount_flags: vec![],
            }],
        }
    }

    #[test]
    fn records_round_trip_and_absent_ones_are_none() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.load("pvc-1@7").unwrap(), None);
        let r = record("pvc-1@7");
        s.save(&r).unwrap();
        assert_eq!(s.load("pvc-1@7").unwrap(), Some(r.clone()));
        assert_eq!(s.all().unwrap(), vec![r.clone()]);
        assert!(r.owns_path(Path::new("/t/a/")));
        assert!(r.owns_path(Path::new("/s/pvc-1")));
        assert!(!r.owns_path(Path::new("/t/b")));
        assert_eq!(r.device_path(), Some(Path::new("/dev/loop3")));
        s.remove("pvc-1@7").unwrap();
        s.remove("pvc-1@7").unwrap();
        assert_eq!(s.load("pvc-1@7").unwrap(), None);
    }

    #[test]
    fn a_record_from_before_loop_sequence_numbers_reads_without_one() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let old = r#"{"volume_id":"v@1","name":"v","staging_path":"/s","access":"block",
            "mode":1,"device":{"file":{"file":"/d/files/v","loop_dev":"/dev/loop4"}},
            "fs":null,"staged":true,"publishes":[]}"#;
        std::fs::write(s.record_path("v@1"), old).unwrap();
        let r = s.load("v@1").unwrap().unwrap();
        assert_eq!(
            r.device,
            Some(Device::File {
                file: "/d/files/v".into(),
                loop_dev: Some("/dev/loop4".into()),
                loop_seq: None,
            })
        );
    }

    #[test]
    fn a_damaged_record_is_an_error_not_an_absent_one() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        std::fs::write(s.record_path("v@1"), b"{not json").unwrap();
        assert!(matches!(s.load("v@1"), Err(Error::Record { .. })));
        assert_eq!(s.load("../v@1").unwrap(), None);
    }
}
