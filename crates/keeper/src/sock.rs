//! One message and its descriptors over a `SOCK_SEQPACKET` Unix socket.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::proto::{Message, ProtoError, MAX_FDS, MAX_MESSAGE};

/// Why a message could not be received.
#[derive(Debug)]
pub enum RecvError {
    /// The peer closed the connection.
    Closed,
    Io(io::Error),
    Proto(ProtoError),
}

/// The user id of the process at the other end of a connected Unix socket
/// (`SO_PEERCRED`).
///
/// Not rustix's `socket_peercred`: its answer holds the peer's pid as a
/// non-zero `Pid`, and the kernel gives 0 for a peer in a PID namespace
/// the caller cannot see (the keeper and the daemon in pods of their own,
/// as the chart runs them), which it then turns into an error of errno 0
/// ("Success"): no daemon in another pod could reach the keeper.
pub fn peer_uid(sock: impl AsFd) -> io::Result<u32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let size = std::mem::size_of::<libc::ucred>();
    let mut len = size as libc::socklen_t;
    // SAFETY: getsockopt(2) writes at most `len` bytes into `cred`, a live
    // `libc::ucred` of exactly that size (any bytes are a valid ucred), on
    // a descriptor borrowed for the call.
    let r = unsafe {
        libc::getsockopt(
            sock.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != size {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("SO_PEERCRED answered {len} bytes, not {size}"),
        ));
    }
    Ok(cred.uid)
}

/// A new `SOCK_SEQPACKET` Unix socket, closed on exec.
pub fn seqpacket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?)
}

pub fn send(sock: impl AsFd, m: &Message, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let bytes = m.encode();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many descriptors for one message",
        ));
    }
    let n = rustix::net::sendmsg(
        sock,
        &[IoSlice::new(&bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if n != bytes.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "message cut short",
        ));
    }
    Ok(())
}

/// Receive one message; descriptors that came with it are owned by the
/// caller (and closed with it when the message is refused).
pub fn recv(sock: impl AsFd) -> Result<(Message, Vec<OwnedFd>), RecvError> {
    let mut buf = vec![0u8; MAX_MESSAGE + 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let r = loop {
        match rustix::net::recvmsg(
            &sock,
            &mut [IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(r) => break r,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(RecvError::Io(e.into())),
        }
    };
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = m {
            fds.extend(got);
        }
    }
    if r.bytes == 0 && fds.is_empty() {
        return Err(RecvError::Closed);
    }
    if r.flags.contains(ReturnFlags::CTRUNC) {
        return Err(RecvError::Proto(ProtoError::Descriptors {
            got: MAX_FDS + 1,
            want: "at most 16",
        }));
    }
    if r.flags.contains(ReturnFlags::TRUNC) || r.bytes > MAX_MESSAGE {
        return Err(RecvError::Proto(ProtoError::TooLong(r.bytes)));
    }
    let m = Message::decode(&buf[..r.bytes]).map_err(RecvError::Proto)?;
    m.check_descriptors(fds.len()).map_err(RecvError::Proto)?;
    Ok((m, fds))
}
