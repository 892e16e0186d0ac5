//! Reading and writing whole frames on a stream (async on the source,
//! blocking on the target). The header is checked, so the body's length is
//! bounded, before the body is allocated.

use crate::wire::{self, check_header, Frame, WireError, HEADER};
use std::io::{Read, Write};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Reading a frame failed: on the stream, or in the codec.
#[derive(Debug)]
pub(crate) enum ReadError {
    Io(std::io::Error),
    Wire(WireError),
}

impl From<std::io::Error> for ReadError {
    fn from(e: std::io::Error) -> Self {
        ReadError::Io(e)
    }
}

impl From<WireError> for ReadError {
    fn from(e: WireError) -> Self {
        ReadError::Wire(e)
    }
}

fn finish(buf: &[u8]) -> Result<Frame, ReadError> {
    match wire::decode(buf)? {
        Some((f, _)) => Ok(f),
        // check_header sized the buffer for exactly one frame.
        None => Err(ReadError::Io(std::io::ErrorKind::UnexpectedEof.into())),
    }
}

/// Read one frame; returns it and its size on the wire.
pub(crate) async fn read_async<R: AsyncRead + Unpin>(
    r: &mut R,
) -> Result<(Frame, usize), ReadError> {
    let mut h = [0u8; HEADER];
    r.read_exact(&mut h).await?;
    let (_, rest) = check_header(&h)?;
    let mut buf = vec![0u8; HEADER + rest];
    buf[..HEADER].copy_from_slice(&h);
    r.read_exact(&mut buf[HEADER..]).await?;
    Ok((finish(&buf)?, buf.len()))
}

/// Read one frame; returns it and its size on the wire.
pub(crate) fn read_sync<R: Read>(r: &mut R) -> Result<(Frame, usize), ReadError> {
    let mut h = [0u8; HEADER];
    r.read_exact(&mut h)?;
    let (_, rest) = check_header(&h)?;
    let mut buf = vec![0u8; HEADER + rest];
    buf[..HEADER].copy_from_slice(&h);
    r.read_exact(&mut buf[HEADER..])?;
    Ok((finish(&buf)?, buf.len()))
}

pub(crate) async fn write_async<W: AsyncWrite + Unpin>(
    w: &mut W,
    f: &Frame,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    wire::encode(f, &mut buf);
    w.write_all(&buf).await?;
    w.flush().await
}

pub(crate) fn write_sync<W: Write>(w: &mut W, f: &Frame) -> std::io::Result<()> {
    let mut buf = Vec::new();
    wire::encode(f, &mut buf);
    w.write_all(&buf)?;
    w.flush()
}
