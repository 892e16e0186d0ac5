//! The target's connection to a source: TCP, mutual TLS, Hello, Request
//! and Answer. Blocking (the daemon calls the target side from its own job
//! thread).

use crate::error::TransferError;
use crate::frames::{read_sync_reusing, write_sync, ReadError};
use crate::source::Limits;
use crate::tls::Identity;
use crate::wire::{Answer, Code, Frame, Request, ORIGIN_VERSION, PULL_VERSION};
use rustls::pki_types::ServerName;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A source: where it listens and the node name its certificate must carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Remote {
    /// host:port
    pub address: String,
    /// The source's node name, checked against its certificate.
    pub node: String,
}

/// A TCP stream that counts the bytes it receives (TLS records included)
/// and reads them in large pieces: rustls asks for 4 KiB at a time, which
/// would cost a system call per 4 KiB.
pub(crate) struct Counted {
    tcp: TcpStream,
    pub(crate) received: Arc<AtomicU64>,
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
}

/// Bytes read from the socket at once.
const READ_AHEAD: usize = 256 << 10;

impl Read for Counted {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.pos == self.end {
            let n = self.tcp.read(&mut self.buf)?;
            self.received.fetch_add(n as u64, Ordering::Relaxed);
            (self.pos, self.end) = (0, n);
        }
        let n = out.len().min(self.end - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tcp.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.tcp.flush()
    }
}

pub(crate) struct Conn {
    pub(crate) stream: rustls::StreamOwned<rustls::ClientConnection, Counted>,
    /// "node (address)", for errors.
    pub(crate) peer: String,
}

impl Conn {
    /// Connect, authenticate both ways, and exchange Hellos.
    pub(crate) fn open(identity: &Identity, remote: &Remote) -> Result<Conn, TransferError> {
        Conn::open_counted(identity, remote, Limits::STALL_TIMEOUT, Arc::default())
    }

    /// As [`Conn::open`], counting the bytes received on the socket (the
    /// handshake's included) into `received`, and taking a source silent
    /// for `stall` for gone (a cut link shows up only this way). The source
    /// sends a frame at least every MiB of data, and it answers a request
    /// once it has listed the snapshot's extents.
    pub(crate) fn open_counted(
        identity: &Identity,
        remote: &Remote,
        stall: Duration,
        received: Arc<AtomicU64>,
    ) -> Result<Conn, TransferError> {
        // Version 3 has a source name the snapshot's other holders; one of
        // version 1 or 2 refuses it (code 1), and serves version 1, all a
        // pull needs, on a new connection.
        match Conn::open_at(identity, remote, stall, received.clone(), ORIGIN_VERSION) {
            Err(TransferError::Remote {
                code: Code::Version,
                ..
            }) => Conn::open_at(identity, remote, stall, received, PULL_VERSION),
            r => r,
        }
    }

    fn open_at(
        identity: &Identity,
        remote: &Remote,
        stall: Duration,
        received: Arc<AtomicU64>,
        version: u16,
    ) -> Result<Conn, TransferError> {
        let unreachable = |source| TransferError::Unreachable {
            address: remote.address.clone(),
            source,
        };
        let mut last = None;
        let mut tcp = None;
        for a in remote.address.to_socket_addrs().map_err(unreachable)? {
            match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let tcp = tcp.ok_or_else(|| {
            unreachable(last.unwrap_or_else(|| std::io::ErrorKind::NotFound.into()))
        })?;
        let peer = format!("{} ({})", remote.node, remote.address);
        let io = |e| TransferError::Io {
            context: format!("socket to {peer}"),
            source: e,
        };
        tcp.set_nodelay(true).map_err(io)?;
        tcp.set_read_timeout(Some(stall)).map_err(io)?;
        tcp.set_write_timeout(Some(stall)).map_err(io)?;
        let name = ServerName::try_from(remote.node.clone()).map_err(|_| {
            TransferError::Invalid(format!("node name {:?} is not a DNS name", remote.node))
        })?;
        let tls = rustls::ClientConnection::new(identity.client_config(), name).map_err(|e| {
            TransferError::Refused {
                peer: peer.clone(),
                detail: e.to_string(),
            }
        })?;
        let counted = Counted {
            tcp,
            received,
            buf: vec![0; READ_AHEAD].into_boxed_slice(),
            pos: 0,
            end: 0,
        };
        let mut c = Conn {
            stream: rustls::StreamOwned::new(tls, counted),
            peer,
        };
        while c.stream.conn.is_handshaking() {
            let s = &mut c.stream;
            s.conn.complete_io(&mut s.sock).map_err(|e| c.io_error(e))?;
        }
        c.send(&Frame::Hello { version })?;
        match c.read()? {
            Frame::Hello { version: v } if v == version => Ok(c),
            Frame::Hello { version: v } => Err(c.protocol(format!(
                "the source speaks transfer protocol version {v}, this node asked for {version}"
            ))),
            f => Err(c.unexpected("Hello", f, "", "")),
        }
    }

    /// Send a request and read its answer.
    pub(crate) fn request(&mut self, r: &Request) -> Result<Answer, TransferError> {
        self.send(&Frame::Request(r.clone()))?;
        match self.read()? {
            Frame::Answer(a) => Ok(a),
            f => Err(self.unexpected("Answer", f, &r.volume, &r.snapshot)),
        }
    }

    /// A handle on the socket that can cut it from another thread.
    pub(crate) fn cutter(&self) -> Option<TcpStream> {
        self.stream.sock.tcp.try_clone().ok()
    }

    pub(crate) fn send(&mut self, f: &Frame) -> Result<(), TransferError> {
        write_sync(&mut self.stream, f).map_err(|e| self.io_error(e))
    }

    pub(crate) fn read(&mut self) -> Result<Frame, TransferError> {
        self.read_reusing(&mut Vec::new())
    }

    /// [`Conn::read`], a Data payload read into `spare`'s allocation.
    pub(crate) fn read_reusing(&mut self, spare: &mut Vec<u8>) -> Result<Frame, TransferError> {
        match read_sync_reusing(&mut self.stream, spare) {
            Ok((f, _)) => Ok(f),
            Err(ReadError::Io(e)) => Err(self.io_error(e)),
            Err(ReadError::Wire(e @ crate::wire::WireError::Checksum { .. })) => {
                Err(TransferError::Checksum {
                    peer: self.peer.clone(),
                    source: e,
                })
            }
            Err(ReadError::Wire(e)) => Err(self.protocol(e.to_string())),
        }
    }

    pub(crate) fn protocol(&self, detail: String) -> TransferError {
        TransferError::Protocol {
            peer: self.peer.clone(),
            detail,
        }
    }

    /// An Error frame becomes the source's refusal; anything else is a
    /// protocol error.
    pub(crate) fn unexpected(
        &self,
        want: &str,
        f: Frame,
        volume: &str,
        snapshot: &str,
    ) -> TransferError {
        match f {
            Frame::Error { code, message } => TransferError::Remote {
                peer: self.peer.clone(),
                volume: volume.to_string(),
                snapshot: snapshot.to_string(),
                code,
                message,
            },
            f => self.protocol(format!("expected {want}, got {}", f.summary())),
        }
    }

    /// TLS failures that mean "not authenticated" become Refused; the rest
    /// is a lost connection.
    pub(crate) fn io_error(&self, e: std::io::Error) -> TransferError {
        io_error(&self.peer, e)
    }
}

/// A stream's error, from `peer`: TLS failures that mean "not
/// authenticated" are Refused, other TLS failures a protocol error, the
/// rest a lost connection.
pub(crate) fn io_error(peer: &str, e: std::io::Error) -> TransferError {
    use rustls::Error as R;
    match e.get_ref().and_then(|i| i.downcast_ref::<R>()) {
        Some(
            r @ (R::InvalidCertificate(_)
            | R::NoCertificatesPresented
            | R::AlertReceived(_)
            | R::PeerIncompatible(_)),
        ) => TransferError::Refused {
            peer: peer.to_string(),
            detail: r.to_string(),
        },
        Some(r) => TransferError::Protocol {
            peer: peer.to_string(),
            detail: format!("TLS: {r}"),
        },
        None => TransferError::Connection {
            peer: peer.to_string(),
            source: e,
        },
    }
}
