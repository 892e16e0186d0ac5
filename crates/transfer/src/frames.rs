//! Reading and writing whole frames on a stream (async on the source,
//! blocking on the target). The header is checked, so the body's length is
//! bounded, before the body is allocated.

use crate::wire::{self, check_header, Frame, Kind, WireError, HEADER, TRAILER};
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

/// Read one frame; returns it and its size on the wire. A Data frame's
/// payload is read straight into its own buffer (the bulk of a transfer:
/// one copy fewer per byte than reading the frame whole and cutting it),
/// and that buffer is `spare`'s allocation
/// (taken: the frame owns it) rather than a new one: a receiver handing
/// applied payloads back keeps a few warm buffers instead of faulting in a
/// fresh MiB per frame.
pub(crate) fn read_sync_reusing<R: Read>(
    r: &mut R,
    spare: &mut Vec<u8>,
) -> Result<(Frame, usize), ReadError> {
    let mut h = [0u8; HEADER];
    r.read_exact(&mut h)?;
    let (kind, rest) = check_header(&h)?;
    if kind == Kind::Data && rest > 8 + TRAILER {
        let mut offset = [0u8; 8];
        r.read_exact(&mut offset)?;
        let mut payload = std::mem::take(spare);
        payload.resize(rest - 8 - TRAILER, 0);
        r.read_exact(&mut payload)?;
        let mut sum = [0u8; TRAILER];
        r.read_exact(&mut sum)?;
        return Ok((
            wire::data_from_parts(&h, offset, payload, sum)?,
            HEADER + rest,
        ));
    }
    let mut buf = vec![0u8; HEADER + rest];
    buf[..HEADER].copy_from_slice(&h);
    r.read_exact(&mut buf[HEADER..])?;
    Ok((finish(&buf)?, buf.len()))
}

/// Bytes of queued frames written at once, at most (about).
pub(crate) const BATCH: usize = 256 << 10;

/// Frames for one write to a session's socket: `taken` holds the first
/// one received; those queued on `rx` meanwhile join it, up to about
/// [`BATCH`] bytes, so many small frames go out in one TLS record and one
/// system call. Returns the bytes to write: the first frame itself when it
/// is alone (no copy), else copies of them all in `batch`. The frames stay
/// in `taken` (with whatever they hold) until the caller clears it.
pub(crate) fn gather<'a, T: AsRef<[u8]>>(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<T>,
    taken: &'a mut Vec<T>,
    batch: &'a mut Vec<u8>,
) -> &'a [u8] {
    batch.clear();
    while batch.len() < BATCH {
        let Ok(next) = rx.try_recv() else { break };
        if batch.is_empty() {
            batch.extend_from_slice(taken[0].as_ref());
        }
        batch.extend_from_slice(next.as_ref());
        taken.push(next);
    }
    if batch.is_empty() {
        taken[0].as_ref()
    } else {
        batch
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{decode, encode_data};
    use proptest::prelude::*;

    /// What the stream reader makes of `bytes` agrees with [`decode`] on
    /// the whole buffer: the same frame and size, the same error, or (a
    /// frame cut short) an early end of the stream.
    fn agrees(bytes: &[u8], spare: Vec<u8>) -> Result<(), TestCaseError> {
        let mut spare = spare;
        let read = read_sync_reusing(&mut &bytes[..], &mut spare);
        match (decode(bytes), read) {
            (Ok(Some(want)), Ok(got)) => prop_assert_eq!(want, got),
            (Err(want), Err(ReadError::Wire(got))) => {
                prop_assert_eq!(want.to_string(), got.to_string())
            }
            (Ok(None), Err(ReadError::Io(e))) => {
                prop_assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof)
            }
            (want, got) => prop_assert!(false, "decode gave {want:?}, the reader {got:?}"),
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn the_stream_reader_agrees_with_decode(
            kind in 0u8..13,
            body in proptest::collection::vec(any::<u8>(), 0..600),
            flip in proptest::option::of(any::<usize>()),
            cut in proptest::option::of(any::<usize>()),
            spare in proptest::collection::vec(any::<u8>(), 0..2000),
        ) {
            let mut buf = wire::framed(kind, &body);
            if let Some(bit) = flip {
                let bit = bit % (buf.len() * 8);
                buf[bit / 8] ^= 1 << (bit % 8);
            }
            if let Some(c) = cut {
                buf.truncate(c % (buf.len() + 1));
            }
            agrees(&buf, spare)?;
        }

        #[test]
        fn a_reused_frame_buffer_encodes_as_encode_data(
            offset in any::<u64>(),
            payload in proptest::collection::vec(any::<u8>(), 1..5000),
            dirty in proptest::collection::vec(any::<u8>(), 0..6000),
        ) {
            let mut want = Vec::new();
            encode_data(offset, &payload, &mut want);
            let mut buf = dirty;
            wire::data_frame_start(&mut buf, offset, payload.len()).copy_from_slice(&payload);
            wire::seal_data(&mut buf);
            prop_assert_eq!(&buf, &want);
            agrees(&buf, Vec::new())?;
        }
    }
}
