//! The daemon's side: one short connection per call, with a time limit on
//! every send and receive, so that a stuck keeper cannot stop the daemon.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::net::SocketAddrUnix;

use crate::proto::{self, Message};
use crate::sock::{self, RecvError};
use crate::KeeperError;

/// How long one send or receive may take.
const IO_LIMIT: Duration = Duration::from_secs(10);

/// One entry the keeper holds, with copies of its descriptors.
#[derive(Debug)]
pub struct Held {
    pub key: String,
    pub token: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

/// The keeper at a socket path.
#[derive(Debug, Clone)]
pub struct Client {
    path: PathBuf,
}

impl Client {
    pub fn new(path: &Path) -> Client {
        Client {
            path: path.to_path_buf(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Have the keeper hold `fds` under `key`, with `token` beside them.
    pub fn put(&self, key: &str, token: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), KeeperError> {
        let m = Message::Put {
            key: key.to_string(),
            token: token.to_vec(),
        };
        self.check(&m, fds.len())?;
        let c = self.connect()?;
        self.send(&c, &m, fds)?;
        self.ok(&c)
    }

    /// Have the keeper let go of `key` (nothing held under it is fine).
    pub fn drop_entry(&self, key: &str) -> Result<(), KeeperError> {
        let m = Message::Drop {
            key: key.to_string(),
        };
        self.check(&m, 0)?;
        let c = self.connect()?;
        self.send(&c, &m, &[])?;
        self.ok(&c)
    }

    /// Everything the keeper holds, with copies of the descriptors (the
    /// keeper keeps its own until told to drop them).
    pub fn list(&self) -> Result<Vec<Held>, KeeperError> {
        let c = self.connect()?;
        self.send(&c, &Message::List, &[])?;
        let mut out = Vec::new();
        loop {
            match self.recv(&c)? {
                (Message::Entry { key, token }, fds) => out.push(Held { key, token, fds }),
                (Message::End, _) => return Ok(out),
                (Message::Error { text }, _) => return Err(self.refused(text)),
                (other, _) => return Err(self.refused(format!("answered {other:?} to a list"))),
            }
        }
    }

    fn check(&self, m: &Message, fds: usize) -> Result<(), KeeperError> {
        let bad = |source| KeeperError::Protocol {
            path: self.path.clone(),
            source,
        };
        match m {
            Message::Put { key, token } => {
                proto::check_key(key).map_err(bad)?;
                if token.len() > proto::MAX_TOKEN {
                    return Err(bad(proto::ProtoError::Bounds {
                        field: "token",
                        len: token.len(),
                        max: proto::MAX_TOKEN,
                    }));
                }
            }
            Message::Drop { key } => proto::check_key(key).map_err(bad)?,
            _ => {}
        }
        m.check_descriptors(fds).map_err(bad)
    }

    fn connect(&self) -> Result<OwnedFd, KeeperError> {
        let unreachable = |e: std::io::Error| KeeperError::Unreachable {
            path: self.path.clone(),
            source: e,
        };
        let addr = SocketAddrUnix::new(&self.path).map_err(|e| unreachable(e.into()))?;
        let fd = sock::seqpacket().map_err(unreachable)?;
        rustix::net::connect(&fd, &addr).map_err(|e| unreachable(e.into()))?;
        // Descriptors go only to a keeper of this process's own user: one
        // that anyone could have bound at the path would be handed the
        // files' connections, and could answer for the volumes.
        match sock::peer_uid(&fd) {
            Ok(uid) if uid == rustix::process::geteuid().as_raw() => {}
            Ok(uid) => {
                return Err(KeeperError::Refused {
                    path: self.path.clone(),
                    message: format!(
                        "the process at the socket runs as uid {uid}, not this process's"
                    ),
                })
            }
            Err(e) => return Err(unreachable(e)),
        }
        let io = |e: rustix::io::Errno| KeeperError::Io {
            path: self.path.clone(),
            source: e.into(),
        };
        rustix::net::sockopt::set_socket_timeout(
            &fd,
            rustix::net::sockopt::Timeout::Recv,
            Some(IO_LIMIT),
        )
        .map_err(io)?;
        rustix::net::sockopt::set_socket_timeout(
            &fd,
            rustix::net::sockopt::Timeout::Send,
            Some(IO_LIMIT),
        )
        .map_err(io)?;
        Ok(fd)
    }

    fn send(&self, c: &OwnedFd, m: &Message, fds: &[BorrowedFd<'_>]) -> Result<(), KeeperError> {
        sock::send(c, m, fds).map_err(|source| KeeperError::Io {
            path: self.path.clone(),
            source,
        })
    }

    fn recv(&self, c: &OwnedFd) -> Result<(Message, Vec<OwnedFd>), KeeperError> {
        sock::recv(c).map_err(|e| match e {
            RecvError::Closed => KeeperError::Io {
                path: self.path.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the keeper closed the connection",
                ),
            },
            RecvError::Io(source) => KeeperError::Io {
                path: self.path.clone(),
                source,
            },
            RecvError::Proto(source) => KeeperError::Protocol {
                path: self.path.clone(),
                source,
            },
        })
    }

    fn ok(&self, c: &OwnedFd) -> Result<(), KeeperError> {
        match self.recv(c)? {
            (Message::Ok, _) => Ok(()),
            (Message::Error { text }, _) => Err(self.refused(text)),
            (other, _) => Err(self.refused(format!("answered {other:?}"))),
        }
    }

    fn refused(&self, message: String) -> KeeperError {
        KeeperError::Refused {
            path: self.path.clone(),
            message,
        }
    }
}
