//! Test kit: pools in temp dirs, certificates, a Source served on a real
//! socket, a fake source speaking the protocol over TLS, and a log capture.
#![allow(dead_code)]

use lamina_engine::{CopyControl, CopyProgress, Pool, PoolOptions};
use lamina_transfer::wire::{self, Frame, HEADER};
use lamina_transfer::{certs, Identity, Pull, Remote, Source};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tempfile::TempDir;

pub const MIB: u64 = 1 << 20;

/// Everything logged by the test binary (all threads).
static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();

struct LogWriter(Arc<Mutex<Vec<u8>>>);
impl Write for LogWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub fn capture_logs() {
    LOG.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let b = buf.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_env_filter("lamina_transfer=info")
            .with_writer(move || LogWriter(b.clone()))
            .init();
        buf
    });
}

pub fn logs() -> String {
    String::from_utf8_lossy(&LOG.get().expect("capture_logs").lock().unwrap()).into_owned()
}

/// Wait until `f` holds (things another thread finishes after the test's
/// own call returned); fails after 30 s.
pub fn eventually(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "never happened: {what}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A new pull (any snapshot id, from offset 0) of `volume`/`snapshot`
/// into `into`.
pub fn fresh<'a>(
    into: &'a str,
    remote: &'a Remote,
    volume: &'a str,
    snapshot: &'a str,
    checkpoint_bytes: u64,
) -> Pull<'a> {
    Pull {
        into,
        remote,
        volume,
        snapshot,
        expect_id: 0,
        resume_offset: 0,
        checkpoint_bytes,
        stall_timeout: lamina_transfer::Limits::STALL_TIMEOUT,
    }
}

/// Pull the source's `src/s` into the local volume `copy`, with 1 MiB
/// checkpoints: the call most tests make.
pub fn pull_copy(
    dst: &Pool,
    id: &Identity,
    remote: &Remote,
    expect_id: u64,
    from: u64,
    ctl: &mut dyn CopyControl,
) -> lamina_transfer::Pulled {
    let pull = Pull {
        expect_id,
        resume_offset: from,
        ..fresh("copy", remote, "src", "s", MIB)
    };
    lamina_transfer::pull_into(dst, id, &pull, ctl)
}

pub struct Ca(pub TempDir);

impl Ca {
    pub fn new() -> Ca {
        let d = tempfile::tempdir().unwrap();
        certs::create_ca(d.path()).unwrap();
        Ca(d)
    }
    /// An identity for `node` (its files in a fresh temp dir).
    pub fn identity(&self, node: &str) -> (TempDir, Arc<Identity>) {
        let d = tempfile::tempdir().unwrap();
        certs::issue(self.0.path(), node, d.path()).unwrap();
        let id = Identity::load(d.path()).unwrap();
        assert_eq!(id.node(), node);
        (d, Arc::new(id))
    }
}

pub fn pool() -> (TempDir, Arc<Pool>) {
    let d = tempfile::tempdir().unwrap();
    let opts = PoolOptions {
        background: false,
        ..PoolOptions::default()
    };
    let p = Pool::create_dir(d.path(), opts).unwrap();
    (d, Arc::new(p))
}

/// Volume `src` of `size` bytes with `writes` (offset, len, byte), and its
/// snapshot `s`.
pub fn source_pool(size: u64, writes: &[(u64, usize, u8)]) -> (TempDir, Arc<Pool>) {
    let (d, p) = pool();
    p.create_volume("src", size).unwrap();
    let v = p.open_volume("src").unwrap();
    for &(off, len, b) in writes {
        v.write(off, &vec![b; len]).unwrap();
    }
    v.flush().unwrap();
    p.create_snapshot("src", "s", &[]).unwrap();
    (d, p)
}

pub fn read_all(p: &Pool, volume: &str, snapshot: Option<&str>) -> Vec<u8> {
    let v = match snapshot {
        Some(s) => p.open_snapshot(volume, s).unwrap(),
        None => p.open_volume(volume).unwrap(),
    };
    let mut b = vec![0u8; v.size().unwrap() as usize];
    v.read(0, &mut b).unwrap();
    b
}

/// A Source served on 127.0.0.1 by its own runtime; stopped on drop.
pub struct Served {
    pub source: Arc<Source>,
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Served {
    pub fn new(pool: Arc<Pool>, identity: Arc<Identity>) -> Served {
        Served::paced(pool, identity, None)
    }

    /// A source whose streams wait as `pace` says (see [`Source::paced`]).
    pub fn paced(
        pool: Arc<Pool>,
        identity: Arc<Identity>,
        pace: Option<Arc<dyn lamina_transfer::Pace>>,
    ) -> Served {
        Served::limited(pool, identity, pace, lamina_transfer::Limits::default())
    }

    /// A source holding at most what `limits` allow.
    pub fn limited(
        pool: Arc<Pool>,
        identity: Arc<Identity>,
        pace: Option<Arc<dyn lamina_transfer::Pace>>,
        limits: lamina_transfer::Limits,
    ) -> Served {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let source = Source::limited(pool, identity, pace, limits);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let s = source.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(std_listener).unwrap();
                s.serve(l, async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
            });
        });
        Served {
            source,
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn remote(&self, node: &str) -> Remote {
        Remote {
            address: self.addr.to_string(),
            node: node.to_string(),
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Records the first durable checkpoint and stops there.
#[derive(Default)]
pub struct StopAtFirstCheckpoint(pub Option<CopyProgress>);
impl CopyControl for StopAtFirstCheckpoint {
    fn durable(&mut self, p: &CopyProgress) -> bool {
        self.0 = Some(*p);
        false
    }
}

/// Calls `f` on every progress report.
pub struct OnProgress<F: FnMut(&CopyProgress)>(pub F);
impl<F: FnMut(&CopyProgress)> CopyControl for OnProgress<F> {
    fn progress(&mut self, p: &CopyProgress) {
        (self.0)(p)
    }
}

pub struct Nothing;
impl CopyControl for Nothing {}

/// Read one frame from a blocking stream.
pub fn read_frame(r: &mut impl Read) -> Frame {
    let mut h = [0u8; HEADER];
    r.read_exact(&mut h).unwrap();
    let (_, rest) = wire::check_header(&h).unwrap();
    let mut buf = h.to_vec();
    buf.resize(HEADER + rest, 0);
    r.read_exact(&mut buf[HEADER..]).unwrap();
    wire::decode(&buf).unwrap().unwrap().0
}

pub fn write_frame(w: &mut impl Write, f: &Frame) {
    let mut buf = Vec::new();
    wire::encode(f, &mut buf);
    w.write_all(&buf).unwrap();
    w.flush().unwrap();
}

/// A fake source: accepts one TLS connection with `identity`'s server
/// configuration and hands the stream to `script`.
pub fn fake_source(
    identity: Arc<Identity>,
    script: impl FnOnce(&mut rustls::StreamOwned<rustls::ServerConnection, std::net::TcpStream>)
        + Send
        + 'static,
) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let script = std::sync::Mutex::new(Some(script));
    fake_sources(identity, 1, move |_, s| {
        let script = script.lock().unwrap().take();
        script.expect("one connection")(s)
    })
}

/// A fake source of `n` connections, one after the other: `script` runs
/// each, given its number (0 first).
pub fn fake_sources(
    identity: Arc<Identity>,
    n: usize,
    script: impl Fn(usize, &mut rustls::StreamOwned<rustls::ServerConnection, std::net::TcpStream>)
        + Send
        + 'static,
) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        for i in 0..n {
            let (tcp, _) = l.accept().unwrap();
            let conn = rustls::ServerConnection::new(identity.server_config()).unwrap();
            let mut s = rustls::StreamOwned::new(conn, tcp);
            script(i, &mut s);
            s.conn.send_close_notify();
            let _ = s.flush();
        }
    });
    (addr, t)
}

/// The identity a source reports for snapshot `info` of pool `p`.
pub fn identity_of(p: &lamina_engine::Pool, info: &lamina_engine::SnapshotInfo) -> u64 {
    lamina_transfer::identity::of_snapshot(p.pool_id(), info.id, &info.labels)
}

/// A fake client: connects to `addr` as `identity`, expecting `node`.
pub fn fake_client(
    identity: &Identity,
    addr: SocketAddr,
    node: &str,
) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    let name = rustls::pki_types::ServerName::try_from(node.to_string()).unwrap();
    let conn = rustls::ClientConnection::new(identity.client_config(), name).unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

pub fn path_of(d: &TempDir) -> &Path {
    d.path()
}
