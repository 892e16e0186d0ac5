//! Entry points: one connection, or accept loops on unix and TCP listeners.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, BufReader, BufWriter};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::device::Exports;
use crate::writer::BoxedWrite;
use crate::{handshake, transmission, NbdError};

/// Socket buffer sizes for each direction of a connection.
const SOCKET_BUFFER: usize = 256 * 1024;

/// Server settings shared by every connection.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Largest READ or WRITE payload, advertised as the maximum block size.
    /// Longer reads get NBD_EINVAL; longer writes close the connection
    /// (their payload cannot be skipped safely). Default 32 MiB.
    pub max_payload: u32,
    /// Requests per connection between reading their header and queueing
    /// their reply; further requests wait. Default 64.
    pub max_in_flight: usize,
    /// READ/WRITE bytes per connection held in buffers at once (a single
    /// request may always use the whole budget). Default 256 MiB.
    pub max_buffer_bytes: u64,
    /// Parent of every connection's span (`nbd_conn`). When disabled (the
    /// default), connection spans are children of the caller's current span.
    pub span: tracing::Span,
    /// When a connection ends (the client disconnects, or the server shuts
    /// down), how long its replies still in flight may take to be written.
    /// A client that stopped reading cannot hold the server longer: its
    /// connection is then closed and its remaining replies dropped (the
    /// requests themselves have run). Default 10 s.
    pub drain_timeout: Duration,
}

impl ServerOptions {
    /// Default of [`ServerOptions::max_payload`].
    pub const MAX_PAYLOAD: u32 = 32 << 20;
    /// The least [`ServerOptions::max_payload`] that keeps the preferred
    /// block size a client is told (4 KiB) within the maximum.
    pub const MIN_MAX_PAYLOAD: u32 = crate::handshake::PREFERRED_BLOCK;
    /// Default of [`ServerOptions::max_in_flight`].
    pub const MAX_IN_FLIGHT: usize = 64;
    /// Default of [`ServerOptions::max_buffer_bytes`].
    pub const MAX_BUFFER_BYTES: u64 = 256 << 20;
    /// Default of [`ServerOptions::drain_timeout`].
    pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            max_payload: ServerOptions::MAX_PAYLOAD,
            max_in_flight: ServerOptions::MAX_IN_FLIGHT,
            max_buffer_bytes: ServerOptions::MAX_BUFFER_BYTES,
            span: tracing::Span::none(),
            drain_timeout: ServerOptions::DRAIN_TIMEOUT,
        }
    }
}

/// The server-wide stop signal as seen by one connection.
pub(crate) struct Shutdown(Option<watch::Receiver<bool>>);

impl Shutdown {
    /// A signal that never fires.
    pub(crate) fn never() -> Self {
        Shutdown(None)
    }

    /// Resolves once the server is stopping.
    pub(crate) async fn wait(&mut self) {
        if let Some(rx) = self.0.as_mut() {
            if rx.wait_for(|stop| *stop).await.is_ok() {
                return;
            }
        }
        std::future::pending::<()>().await
    }
}

fn connection_span(opts: &ServerOptions, id: u64, peer: &str) -> tracing::Span {
    if opts.span.is_none() {
        tracing::info_span!("nbd_conn", id, peer, export = tracing::field::Empty)
    } else {
        tracing::info_span!(parent: &opts.span, "nbd_conn", id, peer, export = tracing::field::Empty)
    }
}

/// Serves one client from the handshake to its disconnect. Returns `Ok` when
/// the client aborted the handshake, sent NBD_CMD_DISC or closed the stream
/// between requests (requests in flight are finished first), and an error
/// when the connection failed or the client broke the protocol.
pub async fn serve_connection<S>(
    stream: S,
    exports: Arc<dyn Exports>,
    opts: &ServerOptions,
) -> Result<(), NbdError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (r, w) = tokio::io::split(stream);
    let span = connection_span(opts, 0, "stream");
    connection(r, w, exports, opts, Shutdown::never())
        .instrument(span)
        .await
}

async fn connection<R, W>(
    r: R,
    w: W,
    exports: Arc<dyn Exports>,
    opts: &ServerOptions,
    mut shutdown: Shutdown,
) -> Result<(), NbdError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut reader = BufReader::with_capacity(SOCKET_BUFFER, r);
    let w: BoxedWrite = Box::new(w);
    let mut writer = BufWriter::with_capacity(SOCKET_BUFFER, w);
    let session = tokio::select! {
        s = handshake::negotiate(&mut reader, &mut writer, exports, opts.max_payload) => s?,
        _ = shutdown.wait() => return Ok(()),
    };
    let Some(session) = session else {
        tracing::debug!("client aborted the handshake");
        return Ok(());
    };
    tracing::Span::current().record("export", session.export.as_str());
    tracing::debug!(
        size = session.size,
        flags = session.flags,
        structured = session.structured,
        block_status = session.meta_context.is_some(),
        "entering transmission"
    );
    transmission::run(reader, writer, session, opts, &mut shutdown).await
}

/// Accepts connections until `shutdown` resolves, serving each on its own
/// task; then stops reading new requests on every connection, lets requests
/// in flight finish, and returns once every connection has closed.
pub async fn serve_unix(
    listener: UnixListener,
    exports: Arc<dyn Exports>,
    opts: ServerOptions,
    shutdown: impl Future,
) {
    let listener = &listener;
    let accept = move || async move {
        let (stream, _) = listener.accept().await?;
        let (r, w) = stream.into_split();
        Ok((r, w, "unix".to_string()))
    };
    accept_loop(accept, exports, opts, shutdown).await
}

/// Like [`serve_unix`] on a TCP listener; sets TCP_NODELAY on every
/// connection.
pub async fn serve_tcp(
    listener: TcpListener,
    exports: Arc<dyn Exports>,
    opts: ServerOptions,
    shutdown: impl Future,
) {
    let listener = &listener;
    let accept = move || async move {
        let (stream, peer) = listener.accept().await?;
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY failed");
        }
        let (r, w) = stream.into_split();
        Ok((r, w, peer.to_string()))
    };
    accept_loop(accept, exports, opts, shutdown).await
}

async fn accept_loop<A, Fut, R, W>(
    mut accept: A,
    exports: Arc<dyn Exports>,
    opts: ServerOptions,
    shutdown: impl Future,
) where
    A: FnMut() -> Fut,
    Fut: Future<Output = std::io::Result<(R, W, String)>>,
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut next_id = 0u64;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = accept() => match accepted {
                Ok((r, w, peer)) => {
                    next_id += 1;
                    let span = connection_span(&opts, next_id, &peer);
                    let (exports, opts) = (exports.clone(), opts.clone());
                    let stop = Shutdown(Some(stop_rx.clone()));
                    connections.spawn(
                        async move {
                            tracing::info!("connection opened");
                            match connection(r, w, exports, &opts, stop).await {
                                Ok(()) => tracing::info!("connection closed"),
                                Err(e) => tracing::info!(error = %e, "connection ended with an error"),
                            }
                        }
                        .instrument(span),
                    );
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    tracing::info!(connections = connections.len(), "NBD server stopping");
    let _ = stop_tx.send(true);
    while connections.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::client_handshake;
    use crate::proto::*;
    use crate::testkit::exports;
    use proptest::prelude::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Feeds `input` as the whole client side, then closes it; returns the
    /// server's output and result.
    fn run_client_bytes(input: Vec<u8>) -> (Vec<u8>, Result<(), NbdError>) {
        let opts = ServerOptions {
            max_payload: 1 << 20,
            ..ServerOptions::default()
        };
        crate::mem::run_script(exports().0, &opts, &input)
    }

    /// Checks that `out` (after the handshake) is a sequence of well-formed
    /// structured chunks and data-less simple replies.
    fn well_formed_structured(mut out: &[u8]) {
        while !out.is_empty() {
            assert!(out.len() >= 16, "truncated reply {out:?}");
            let magic = u32::from_be_bytes(out[0..4].try_into().unwrap());
            if magic == SIMPLE_REPLY_MAGIC {
                out = &out[16..];
                continue;
            }
            assert_eq!(magic, STRUCTURED_REPLY_MAGIC);
            assert!(out.len() >= 20);
            let len = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
            assert!(out.len() >= 20 + len, "chunk longer than the stream");
            out = &out[20 + len..];
        }
    }

    fn segment() -> impl Strategy<Value = Vec<u8>> {
        let offset = prop_oneof![0u64..(1 << 20) + 8192, any::<u64>()];
        let length = prop_oneof![0u32..8192, any::<u32>()];
        prop_oneof![
            4 => (0u16..10, any::<u16>(), any::<u64>(), offset, length, proptest::collection::vec(any::<u8>(), 0..64))
                .prop_map(|(kind, flags, cookie, offset, length, extra)| {
                    let flags = flags & 0x3f;
                    let mut b = Request { flags, kind, cookie, offset, length }.encode().to_vec();
                    b.extend_from_slice(&extra);
                    b
                }),
            1 => proptest::collection::vec(any::<u8>(), 0..64),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
        #[test]
        fn random_requests_after_a_valid_handshake(
            structured in any::<bool>(),
            segments in proptest::collection::vec(segment(), 0..24),
        ) {
            let prefix = client_handshake("disk", structured);
            // The server's answer to the handshake alone (it ends cleanly).
            let (reference, res) = run_client_bytes(prefix.clone());
            prop_assert!(res.is_ok());
            let mut input = prefix;
            for s in &segments {
                input.extend_from_slice(s);
            }
            let (out, _) = run_client_bytes(input);
            prop_assert!(out.len() >= reference.len());
            prop_assert_eq!(&out[..reference.len()], &reference[..]);
            if structured {
                well_formed_structured(&out[reference.len()..]);
            }
        }

        #[test]
        fn random_bytes_from_the_start(input in proptest::collection::vec(any::<u8>(), 0..512)) {
            let (out, _) = run_client_bytes(input);
            prop_assert!(out.len() >= 18);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unix_accept_loop_serves_and_shuts_down() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nbd.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_unix(
            listener,
            exports().0,
            ServerOptions::default(),
            stop_rx,
        ));

        let mut streams = Vec::new();
        for _ in 0..3 {
            let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
            s.write_all(&client_handshake("disk", false)).await.unwrap();
            let mut h = [0u8; 18 + 10];
            s.read_exact(&mut h).await.unwrap();
            s.write_all(
                &Request {
                    flags: 0,
                    kind: CMD_READ,
                    cookie: 1,
                    offset: 0,
                    length: 4,
                }
                .encode(),
            )
            .await
            .unwrap();
            let mut r = [0u8; 20];
            s.read_exact(&mut r).await.unwrap();
            assert_eq!(&r[16..], &[0, 1, 2, 3]);
            streams.push(s);
        }
        // Shut down with idle connections open: they are closed.
        stop_tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .unwrap()
            .unwrap();
        for mut s in streams {
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).await.unwrap();
            assert!(rest.is_empty());
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_does_not_wait_for_half_sent_requests() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nbd.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_unix(
            listener,
            exports().0,
            ServerOptions::default(),
            stop_rx,
        ));
        // One client mid-handshake, one mid-write.
        let mut a = tokio::net::UnixStream::connect(&path).await.unwrap();
        a.write_all(&[0, 0, 0, 3]).await.unwrap();
        let mut b = tokio::net::UnixStream::connect(&path).await.unwrap();
        b.write_all(&client_handshake("disk", false)).await.unwrap();
        let mut h = [0u8; 18 + 10];
        b.read_exact(&mut h).await.unwrap();
        let w = Request {
            flags: 0,
            kind: CMD_WRITE,
            cookie: 1,
            offset: 0,
            length: 4096,
        };
        b.write_all(&w.encode()).await.unwrap();
        b.write_all(&[1; 100]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        stop_tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .unwrap()
            .unwrap();
        for s in [&mut a, &mut b] {
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tcp_accept_loop() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_tcp(
            listener,
            exports().0,
            ServerOptions::default(),
            stop_rx,
        ));
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(&client_handshake("disk", false)).await.unwrap();
        let mut h = [0u8; 18 + 10];
        s.read_exact(&mut h).await.unwrap();
        assert_eq!(&h[18..26], &(crate::testkit::SIZE as u64).to_be_bytes());
        s.write_all(
            &Request {
                flags: 0,
                kind: CMD_DISC,
                cookie: 1,
                offset: 0,
                length: 0,
            }
            .encode(),
        )
        .await
        .unwrap();
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        stop_tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .unwrap()
            .unwrap();
    }
}
