//! A volume as a block device, and back. First choice: the daemon serves
//! the volume as a file on this host (`attach?file=true`, its own FUSE
//! server) and a loop device turns that file into `/dev/loopN`: one hop,
//! nothing of the plugin's own on the data path, so a restart of the
//! plugin touches no I/O, and the file grows with the volume. A daemon
//! that serves no files (`--files off`, no FUSE) answers so, and the
//! export's NBD URI is used instead: where the kernel has its NBD client
//! (`/sys/module/nbd` and `nbd-client` on PATH) it becomes `/dev/nbdN`;
//! otherwise nbdfuse serves it as a file (one FUSE mount per volume under
//! the state directory) under a loop device. nbdfuse runs in a session of
//! its own, so it outlives the plugin; its pid is recorded, and it is
//! recognised by its arguments (the volume's FUSE file), never by the pid
//! alone.

use super::exec::{self, QUICK};
use super::state::{Device, Record};
use super::{sys, Error, NodeService};
use crate::status::from_client;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tonic::Status;

/// How long nbdfuse may take to connect and mount.
const FUSE_READY: Duration = Duration::from_secs(30);
/// How long a process or device may take to go away once told to.
const GONE: Duration = Duration::from_secs(10);
/// How often those waits look again.
const POLL: Duration = Duration::from_millis(20);

/// Which NBD client this node uses.
fn kernel_client() -> bool {
    Path::new("/sys/module/nbd").exists() && exec::on_path("nbd-client")
}

/// Where an NBD URI points: a unix socket or a TCP address, and the export.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    Unix {
        socket: String,
        export: String,
    },
    Tcp {
        host: String,
        port: u16,
        export: String,
    },
}

/// Parse the URIs the daemon gives (`nbd+unix:///NAME?socket=PATH`,
/// `nbd://HOST[:PORT]/NAME`); the kernel client takes them apart.
pub fn parse_uri(uri: &str) -> Option<Target> {
    if let Some(rest) = uri.strip_prefix("nbd+unix:///") {
        let (export, query) = rest.split_once('?')?;
        let socket = query.split('&').find_map(|kv| kv.strip_prefix("socket="))?;
        return Some(Target::Unix {
            socket: socket.to_string(),
            export: export.to_string(),
        });
    }
    let rest = uri.strip_prefix("nbd://")?;
    let (hostport, export) = rest.split_once('/').unwrap_or((rest, ""));
    // An IPv6 address is in brackets: `[::1]:10809`.
    let (host, port) = match hostport.strip_prefix('[') {
        Some(r) => {
            let (h, after) = r.split_once(']')?;
            (h, after.strip_prefix(':'))
        }
        None => match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        },
    };
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => 10809,
    };
    Some(Target::Tcp {
        host: host.to_string(),
        port,
        export: export.to_string(),
    })
}

impl NodeService {
    /// Whether the record's device is there and working: the kernel NBD
    /// device connected, or nbdfuse running and the loop device over its file.
    pub(super) fn device_ok(&self, rec: &Record) -> Result<(), String> {
        match &rec.device {
            None => Err("no device was made".into()),
            Some(Device::File { file, loop_dev, .. }) => {
                let Some(dev) = loop_dev else {
                    return Err("no loop device was set up".into());
                };
                let want = sys::file_id(file)
                    .ok_or_else(|| format!("the daemon's file {} is not served", file.display()))?;
                match sys::loop_backing(dev) {
                    Some(have) if have == want => Ok(()),
                    Some(_) => Err(format!(
                        "{} reads an earlier file at {} (the daemon served it again)",
                        dev.display(),
                        file.display()
                    )),
                    None => Err(format!("{} is no longer set up", dev.display())),
                }
            }
            Some(Device::Kernel { dev }) => {
                if sys::nbd_connected(dev) {
                    Ok(())
                } else {
                    Err(format!("{} is no longer connected", dev.display()))
                }
            }
            Some(Device::Fuse { pid, loop_dev, .. }) => {
                let file = self.store.fuse_file(&rec.volume_id);
                let arg = file.to_string_lossy();
                if !pid.is_some_and(|p| sys::process_alive(p, &arg)) {
                    return Err(format!(
                        "nbdfuse (pid {pid:?}) serving {} is not running",
                        file.display()
                    ));
                }
                let found = sys::loops_over(&file);
                match loop_dev {
                    Some(want) if found.contains(want) => Ok(()),
                    want => Err(format!(
                        "the loop devices over {} are {found:?}, expected {want:?}",
                        file.display()
                    )),
                }
            }
        }
    }

    /// Make the block device for a record's volume, reusing whatever part
    /// of it is already there. The record is saved before each step.
    pub(super) async fn ensure_device(&self, rec: &mut Record) -> Result<PathBuf, Status> {
        if self.device_ok(rec).is_ok() {
            if let Some(d) = rec.device_path() {
                return Ok(d.to_path_buf());
            }
        }
        if matches!(rec.device, None | Some(Device::File { .. })) {
            match self.client.attach_volume_file(&rec.name).await {
                Ok(export) => match export.file {
                    Some(file) => return self.attach_file(rec, PathBuf::from(file)).await,
                    None => {
                        return Err(Status::internal(
                            "the daemon attached the volume but named no file",
                        ))
                    }
                },
                Err(e) if e.is_files_refused() => {
                    tracing::info!(volume = %rec.name, error = %e, "the daemon serves no files; using its NBD export");
                    if let Some(Device::File { .. }) = &rec.device {
                        self.release_device(rec).await?;
                        rec.device = None;
                        self.store.save(rec)?;
                    }
                }
                Err(e) => return Err(from_client(&e)),
            }
        }
        let kernel = match &rec.device {
            Some(Device::Kernel { .. }) => true,
            _ => kernel_client(),
        };
        if !kernel && !exec::on_path("nbdfuse") {
            return Err(Status::failed_precondition(
                "this node has no NBD block device client: load the nbd kernel module and install \
                 nbd-client, or install nbdfuse (with FUSE and loop devices)",
            ));
        }
        let export = self
            .client
            .attach_volume(&rec.name)
            .await
            .map_err(|e| from_client(&e))?;
        if kernel {
            self.attach_kernel(rec, &export.uri).await
        } else {
            self.attach_fuse(rec, &export.uri).await
        }
    }

    /// A loop device over the daemon's file: the one already over this file
    /// if any, after any over an earlier file at the same path (served by a
    /// daemon since restarted) is let go.
    async fn attach_file(&self, rec: &mut Record, file: PathBuf) -> Result<PathBuf, Status> {
        // The record keeps naming a loop device set up before, until it is
        // let go or used again.
        let (old_dev, old_seq) = match &rec.device {
            Some(Device::File {
                loop_dev, loop_seq, ..
            }) => (loop_dev.clone(), *loop_seq),
            _ => (None, None),
        };
        rec.device = Some(Device::File {
            file: file.clone(),
            loop_dev: old_dev.clone(),
            loop_seq: old_seq,
        });
        self.store.save(rec)?;
        let want = sys::file_id(&file);
        let mut dev = None;
        for found in loops_of(&file, old_dev.as_deref(), old_seq) {
            let current = want.is_some() && sys::loop_backing(&found) == want;
            if current {
                // The first over the file served now is used; any other
                // over it may be in use too, and is left alone.
                dev.get_or_insert(found);
                continue;
            }
            tracing::warn!(loop_dev = %found.display(), file = %file.display(), "detaching a loop device over an earlier file");
            self.detach_loop(&found).await?;
        }
        let dev = match dev {
            Some(d) => d,
            None => {
                // Direct I/O: the loop device submits its requests
                // asynchronously, so they reach the daemon in parallel, not
                // one after another; a kernel that refuses it still works
                // without.
                let arg = file.to_string_lossy();
                let args = ["--find", "--show", "--direct-io=on", arg.as_ref()];
                let mut o = exec::output("losetup", &args, QUICK).await?;
                if !o.success() {
                    tracing::warn!(stderr = %o.stderr.trim(), "losetup with direct I/O failed; trying without");
                    let args = ["--find", "--show", arg.as_ref()];
                    o = exec::output("losetup", &args, QUICK).await?;
                    if !o.success() {
                        return Err(exec::failed("losetup", &args, &o).into());
                    }
                }
                PathBuf::from(o.stdout.trim())
            }
        };
        rec.device = Some(Device::File {
            file,
            loop_seq: sys::loop_seq(&dev),
            loop_dev: Some(dev.clone()),
        });
        self.store.save(rec)?;
        Ok(dev)
    }

    async fn attach_kernel(&self, rec: &mut Record, uri: &str) -> Result<PathBuf, Status> {
        let _pick = self.nbd_pick.lock().await;
        if let Some(Device::Kernel { dev }) = &rec.device {
            if sys::nbd_connected(dev) {
                return Ok(dev.clone());
            }
        }
        let target = parse_uri(uri).ok_or_else(|| {
            Status::internal(format!(
                "the daemon's export URI {uri:?} is not one nbd-client takes"
            ))
        })?;
        let dev = sys::free_nbd().ok_or_else(|| {
            Status::resource_exhausted("every /dev/nbdN is in use (load nbd with more nbds_max)")
        })?;
        rec.device = Some(Device::Kernel { dev: dev.clone() });
        self.store.save(rec)?;
        let devs = dev.to_string_lossy().into_owned();
        let args: Vec<String> = match target {
            Target::Unix { socket, export } => {
                vec!["-unix".into(), socket, devs, "-name".into(), export]
            }
            Target::Tcp { host, port, export } => {
                vec![host, port.to_string(), devs, "-name".into(), export]
            }
        };
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        exec::run("nbd-client", &args, QUICK).await?;
        Ok(dev)
    }

    async fn attach_fuse(&self, rec: &mut Record, uri: &str) -> Result<PathBuf, Status> {
        let id = rec.volume_id.clone();
        let file = self.store.fuse_file(&id);
        let arg = file.to_string_lossy().into_owned();
        let (mut pid, mut loop_dev, mut loop_seq) = match &rec.device {
            Some(Device::Fuse {
                pid,
                loop_dev,
                loop_seq,
            }) => (*pid, loop_dev.clone(), *loop_seq),
            _ => (None, None, None),
        };
        if !pid.is_some_and(|p| sys::process_alive(p, &arg)) {
            pid = sys::find_process("nbdfuse", &arg);
        }
        if pid.is_none() {
            // A loop device over a dead nbdfuse's file cannot be used again.
            for stale in loops_of(&file, loop_dev.as_deref(), loop_seq) {
                self.detach_loop(&stale).await?;
            }
            (loop_dev, loop_seq) = (None, None);
            rec.device = Some(Device::Fuse {
                pid: None,
                loop_dev: None,
                loop_seq: None,
            });
            self.store.save(rec)?;
            pid = Some(self.start_nbdfuse(&id, uri).await?);
        }
        rec.device = Some(Device::Fuse {
            pid,
            loop_dev: loop_dev.clone(),
            loop_seq,
        });
        self.store.save(rec)?;
        let dev = match loops_of(&file, loop_dev.as_deref(), loop_seq)
            .into_iter()
            .next()
        {
            Some(d) => d,
            None => {
                let out = exec::output(
                    "losetup",
                    &["--find", "--show", "--direct-io=on", &arg],
                    QUICK,
                )
                .await?;
                let out = if out.success() {
                    out
                } else {
                    // Direct I/O keeps the page cache from holding the data
                    // twice; a kernel that refuses it for FUSE files still
                    // works without.
                    tracing::warn!(stderr = %out.stderr.trim(), "losetup with direct I/O failed; trying without");
                    let args = ["--find", "--show", arg.as_str()];
                    let o = exec::output("losetup", &args, QUICK).await?;
                    if !o.success() {
                        return Err(exec::failed("losetup", &args, &o).into());
                    }
                    o
                };
                PathBuf::from(out.stdout.trim())
            }
        };
        rec.device = Some(Device::Fuse {
            pid,
            loop_seq: sys::loop_seq(&dev),
            loop_dev: Some(dev.clone()),
        });
        self.store.save(rec)?;
        Ok(dev)
    }

    /// Start nbdfuse for a volume in a session of its own and wait until it
    /// serves the file. Returns its pid.
    async fn start_nbdfuse(&self, id: &str, uri: &str) -> Result<u32, Status> {
        let dir = self.store.fuse_dir(id);
        let file = self.store.fuse_file(id);
        let pidfile = self.store.fuse_pidfile(id);
        let logp = self.store.fuse_log(id);
        // A FUSE mount left by an nbdfuse that died answers nothing.
        if sys::mount_at(&dir)?.is_some() {
            exec::run("umount", &["-l", &dir.to_string_lossy()], QUICK).await?;
        }
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create", &dir, e))?;
        match std::fs::remove_file(&pidfile) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("remove", &pidfile, e).into()),
        }
        let log = std::fs::File::create(&logp).map_err(|e| Error::io("create", &logp, e))?;
        let log2 = log.try_clone().map_err(|e| Error::io("open", &logp, e))?;
        let mut cmd = std::process::Command::new("nbdfuse");
        cmd.arg("-P")
            .arg(&pidfile)
            .arg(&file)
            .arg(uri)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2);
        // SAFETY: setsid(2) is async-signal-safe and touches no memory; the
        // closure runs in the forked child before exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|source| Error::Spawn {
            cmd: "nbdfuse".into(),
            source,
        })?;
        let pid = child.id();
        tracing::info!(pid, file = %file.display(), %uri, "started nbdfuse");
        // Reap it when it exits while this process lives (after a restart
        // of the plugin, init does).
        let (tx, mut exited) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        let start = Instant::now();
        loop {
            let ready = std::fs::read_to_string(&pidfile)
                .is_ok_and(|s| s.trim().parse::<u32>().is_ok())
                && file.exists();
            if ready {
                return Ok(pid);
            }
            if let Ok(status) = exited.try_recv() {
                let text = std::fs::read_to_string(&logp).unwrap_or_default();
                return Err(Status::unavailable(format!(
                    "nbdfuse for {uri} exited ({status:?}) before serving: {}",
                    text.trim()
                )));
            }
            if start.elapsed() > FUSE_READY {
                sys::signal(pid, libc::SIGKILL);
                let text = std::fs::read_to_string(&logp).unwrap_or_default();
                return Err(Status::unavailable(format!(
                    "nbdfuse for {uri} did not serve {} within {FUSE_READY:?} (killed): {}",
                    file.display(),
                    text.trim()
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Detach a loop device and wait until the kernel has let it go.
    async fn detach_loop(&self, dev: &Path) -> Result<(), Error> {
        let d = dev.to_string_lossy();
        if sys::loop_in_use(dev) {
            exec::run("losetup", &["-d", &d], QUICK).await?;
        }
        if !wait_for(GONE, || !sys::loop_in_use(dev)).await {
            return Err(Error::Busy(format!(
                "{d} is still set up {GONE:?} after losetup -d: something holds it open"
            )));
        }
        Ok(())
    }

    /// Take the block device away: disconnect the kernel client, or detach
    /// the loop device and stop nbdfuse. Works from what the kernel shows,
    /// so that a record written just before a step it describes is enough.
    pub(super) async fn release_device(&self, rec: &Record) -> Result<(), Error> {
        if let Some(Device::Kernel { dev }) = &rec.device {
            if sys::nbd_connected(dev) {
                exec::run("nbd-client", &["-d", &dev.to_string_lossy()], QUICK).await?;
            }
            if !wait_for(GONE, || !sys::nbd_connected(dev)).await {
                return Err(Error::Busy(format!(
                    "{} is still connected after nbd-client -d",
                    dev.display()
                )));
            }
            return Ok(());
        }
        if let Some(Device::File {
            file,
            loop_dev,
            loop_seq,
        }) = &rec.device
        {
            // The file is the daemon's: it stops serving it at the detach.
            for dev in loops_of(file, loop_dev.as_deref(), *loop_seq) {
                self.detach_loop(&dev).await?;
            }
            return Ok(());
        }
        let id = &rec.volume_id;
        let dir = self.store.fuse_dir(id);
        let file = self.store.fuse_file(id);
        let arg = file.to_string_lossy().into_owned();
        let (loop_dev, loop_seq) = match &rec.device {
            Some(Device::Fuse {
                loop_dev, loop_seq, ..
            }) => (loop_dev.as_deref(), *loop_seq),
            _ => (None, None),
        };
        for dev in loops_of(&file, loop_dev, loop_seq) {
            self.detach_loop(&dev).await?;
        }
        let recorded = match &rec.device {
            Some(Device::Fuse { pid: Some(p), .. }) if sys::process_alive(*p, &arg) => Some(*p),
            _ => None,
        };
        let pid = recorded.or_else(|| sys::find_process("nbdfuse", &arg));
        if sys::mount_at(&dir)?.is_some() {
            let d = dir.to_string_lossy();
            let o = exec::output("umount", &[&d], QUICK).await?;
            if !o.success() {
                tracing::warn!(stderr = %o.stderr.trim(), dir = %d, "umount failed; detaching lazily");
                exec::run("umount", &["-l", &d], QUICK).await?;
            }
        }
        if let Some(pid) = pid {
            // Unmounting makes nbdfuse flush and exit; it is told harder only
            // when it does not.
            let mut gone = wait_for(GONE, || !sys::process_alive(pid, &arg)).await;
            for sig in [libc::SIGTERM, libc::SIGKILL] {
                if gone {
                    break;
                }
                tracing::warn!(
                    pid,
                    sig,
                    "nbdfuse did not exit after its unmount; signalling it"
                );
                sys::signal(pid, sig);
                gone = wait_for(GONE, || !sys::process_alive(pid, &arg)).await;
            }
            if !gone {
                return Err(Error::Busy(format!("nbdfuse (pid {pid}) does not exit")));
            }
        }
        for p in [self.store.fuse_pidfile(id), self.store.fuse_log(id)] {
            let _ = std::fs::remove_file(p);
        }
        match std::fs::remove_dir(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("remove", &dir, e)),
        }
    }
}

/// The loop devices over a volume's file: the one its record names, while
/// that is still the device set up then (the same sequence number: its
/// file may have no name now, see [`sys::loops_over`]), then every one over
/// the file now.
fn loops_of(file: &Path, loop_dev: Option<&Path>, loop_seq: Option<u64>) -> Vec<PathBuf> {
    let mut all = Vec::new();
    if let (Some(d), Some(seq)) = (loop_dev, loop_seq) {
        if sys::loop_seq(d) == Some(seq) {
            all.push(d.to_path_buf());
        }
    }
    for d in sys::loops_over(file) {
        if !all.contains(&d) {
            all.push(d);
        }
    }
    all
}

/// Poll `done` until it holds or `limit` passes; whether it held.
async fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if done() {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemons_uris_parse() {
        assert_eq!(
            parse_uri("nbd+unix:///pvc-1?socket=/var/lib/lamina/nbd.sock"),
            Some(Target::Unix {
                socket: "/var/lib/lamina/nbd.sock".into(),
                export: "pvc-1".into()
            })
        );
        assert_eq!(
            parse_uri("nbd://10.0.0.5:10900/pvc-2"),
            Some(Target::Tcp {
                host: "10.0.0.5".into(),
                port: 10900,
                export: "pvc-2".into()
            })
        );
        assert_eq!(
            parse_uri("nbd://[::1]/v"),
            Some(Target::Tcp {
                host: "::1".into(),
                port: 10809,
                export: "v".into()
            })
        );
        assert_eq!(parse_uri("nbd+unix:///v"), None);
        assert_eq!(parse_uri("http://x/v"), None);
    }
}
