//! Copies into a volume that survive restarts: the loop every copy runs
//! (a local full clone, a pull from another node) writes chunks, flushes the
//! destination every so many bytes, and reports how far it is durable, so
//! that its caller can record that offset and resume from it instead of
//! from zero. [`Applier`] is that loop's bookkeeping, written once; where
//! the chunks come from (a local export, a socket) is the caller's.

use crate::error::{Error, Result};
use crate::extents::{Chunk, Target};
use crate::io::Volume;
use crate::pool::Pool;

/// How far a copy ([`Pool::copy_into`]) has come, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyProgress {
    /// Data copied so far, counting what earlier runs copied.
    pub done_bytes: u64,
    /// Data to copy in all.
    pub total_bytes: u64,
    /// Everything below this offset is durable in the destination.
    pub resume_offset: u64,
}

/// How a copy ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyEnd {
    /// Everything is copied and durable.
    Done(CopyProgress),
    /// Stopped on request; start again from its `resume_offset`.
    Stopped(CopyProgress),
}

/// What the caller of a copy hears and says while it runs.
pub trait CopyControl {
    /// Live progress (not necessarily durable yet).
    fn progress(&mut self, _p: &CopyProgress) {}
    /// The destination is durable up to `p.resume_offset`: record it.
    /// Return false to stop the copy here.
    fn durable(&mut self, _p: &CopyProgress) -> bool {
        true
    }
    /// Polled before each piece: true stops the copy (after a flush).
    fn stop(&self) -> bool {
        false
    }
}

/// Applies a stream of chunks to a volume, flushing every
/// `checkpoint_bytes` of data and telling a [`CopyControl`] how far the
/// destination is durable. Chunks must come in offset order (an export's
/// order), or a resume offset would cover data not yet written.
pub struct Applier<'a> {
    dst: &'a Volume,
    p: CopyProgress,
    checkpoint_bytes: u64,
    since: u64,
}

impl<'a> Applier<'a> {
    /// Start at `p` (what earlier runs made durable, and the total).
    pub fn new(dst: &'a Volume, p: CopyProgress, checkpoint_bytes: u64) -> Applier<'a> {
        Applier {
            dst,
            p,
            checkpoint_bytes,
            since: 0,
        }
    }

    pub fn progress(&self) -> CopyProgress {
        self.p
    }

    /// Before each chunk: if `ctl` asks to stop, flush and say so.
    pub fn stop_asked(&self, ctl: &dyn CopyControl) -> Result<Option<CopyEnd>> {
        if !ctl.stop() {
            return Ok(None);
        }
        self.dst.flush()?;
        Ok(Some(CopyEnd::Stopped(self.p)))
    }

    /// Write one chunk, report progress, and at a checkpoint flush and
    /// report the durable offset; `Some` when `ctl` then asks to stop.
    pub fn apply(&mut self, chunk: &Chunk, ctl: &mut dyn CopyControl) -> Result<Option<CopyEnd>> {
        let (end, data) = match chunk {
            Chunk::Data { offset, bytes } => (offset + bytes.len() as u64, bytes.len() as u64),
            Chunk::Zero { offset, len } => (offset + len, 0),
        };
        self.dst.apply(chunk)?;
        self.p.done_bytes += data;
        self.since += data;
        ctl.progress(&self.p);
        if self.since >= self.checkpoint_bytes {
            self.dst.flush()?;
            self.since = 0;
            self.p.resume_offset = end;
            if !ctl.durable(&self.p) {
                return Ok(Some(CopyEnd::Stopped(self.p)));
            }
        }
        Ok(None)
    }

    /// The stream is whole: flush, and the copy is durable up to `size`
    /// (the source's size).
    pub fn finish(mut self, size: u64, ctl: &mut dyn CopyControl) -> Result<CopyEnd> {
        self.dst.flush()?;
        self.p.resume_offset = size.max(self.p.resume_offset);
        ctl.progress(&self.p);
        Ok(CopyEnd::Done(self.p))
    }
}

impl Pool {
    /// Copy the data of `from` into the existing volume `into` (at least as
    /// large), from `resume_offset` on (0 for a new copy; after a restart,
    /// the last durable offset reported). Only allocated data moves. Every
    /// `checkpoint_bytes` of data the destination is flushed and
    /// [`CopyControl::durable`] is told how far the copy is durable; a
    /// caller that records that offset resumes from it after a crash
    /// instead of from zero. The source must not change meanwhile (a
    /// snapshot), or a resumed copy could mix two points in time.
    pub fn copy_into(
        &self,
        from: &Target,
        into: &str,
        resume_offset: u64,
        checkpoint_bytes: u64,
        ctl: &mut dyn CopyControl,
    ) -> Result<CopyEnd> {
        let mut export = self.export(None, from)?;
        let dst = self.open_volume(into)?;
        let need = export.source.size()?;
        if dst.size()? < need {
            return Err(Error::InvalidArgument(format!(
                "volume {into:?} is smaller than the {need} bytes to copy into it"
            )));
        }
        let total_bytes = export.data_bytes();
        // Below resume_offset an earlier run copied and made it durable:
        // skip it without reading it.
        let done_bytes = export.skip_to(resume_offset);
        let start = CopyProgress {
            done_bytes,
            total_bytes,
            resume_offset,
        };
        let mut a = Applier::new(&dst, start, checkpoint_bytes);
        for chunk in export {
            if let Some(end) = a.stop_asked(ctl)? {
                return Ok(end);
            }
            if let Some(end) = a.apply(&chunk?, ctl)? {
                return Ok(end);
            }
        }
        a.finish(need, ctl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolOptions;

    const PIECE: usize = 64 << 10;

    fn piece(i: usize) -> Vec<u8> {
        (0..PIECE).map(|k| (i * 31 + k % 251) as u8 | 1).collect()
    }

    /// Every offset reported durable covers only data already written.
    struct Check<'a> {
        dst: &'a Volume,
        durable: Vec<u64>,
        stop_after: Option<usize>,
    }

    impl<'a> Check<'a> {
        fn new(dst: &'a Volume, stop_after: Option<usize>) -> Check<'a> {
            Check {
                dst,
                durable: Vec::new(),
                stop_after,
            }
        }
    }

    impl CopyControl for Check<'_> {
        fn durable(&mut self, p: &CopyProgress) -> bool {
            let mut buf = vec![0u8; p.resume_offset as usize];
            self.dst.read(0, &mut buf).unwrap();
            for (i, c) in buf.chunks(PIECE).enumerate() {
                assert!(
                    c == &piece(i)[..c.len()],
                    "piece {i} below {} not written",
                    p.resume_offset
                );
            }
            self.durable.push(p.resume_offset);
            self.stop_after.is_none_or(|n| self.durable.len() < n)
        }
    }

    fn setup() -> (tempfile::TempDir, Pool, Volume) {
        let d = tempfile::tempdir().unwrap();
        let p = Pool::create_dir(d.path(), PoolOptions::default()).unwrap();
        p.create_volume("v", 8 << 20).unwrap();
        let v = p.open_volume("v").unwrap();
        (d, p, v)
    }

    /// Drive an Applier over a stream, as copy_into does.
    fn run(
        v: &Volume,
        chunks: impl Iterator<Item = Result<Chunk>>,
        ctl: &mut dyn CopyControl,
    ) -> Result<CopyEnd> {
        let mut a = Applier::new(v, CopyProgress::default(), 1 << 20);
        for c in chunks {
            if let Some(end) = a.stop_asked(ctl)? {
                return Ok(end);
            }
            if let Some(end) = a.apply(&c?, ctl)? {
                return Ok(end);
            }
        }
        a.finish(8 << 20, ctl)
    }

    fn stream(n: usize) -> impl Iterator<Item = Result<Chunk>> {
        (0..n).map(|i| {
            Ok(Chunk::Data {
                offset: (i * PIECE) as u64,
                bytes: piece(i),
            })
        })
    }

    #[test]
    fn durable_offsets_cover_only_written_data() {
        let (_d, _p, v) = setup();
        let mut ctl = Check::new(&v, None);
        let end = run(&v, stream(96), &mut ctl).unwrap();
        let want = (96 * PIECE) as u64;
        assert_eq!(ctl.durable, (1..=6).map(|k| k << 20).collect::<Vec<u64>>());
        let CopyEnd::Done(p) = end else {
            panic!("{end:?}")
        };
        assert_eq!((p.done_bytes, p.resume_offset), (want, 8 << 20));
        let mut buf = vec![0u8; want as usize];
        v.read(0, &mut buf).unwrap();
        assert!(buf.chunks(PIECE).enumerate().all(|(i, c)| c == piece(i)));
    }

    #[test]
    fn a_stop_at_a_checkpoint_reports_it() {
        let (_d, _p, v) = setup();
        let mut ctl = Check::new(&v, Some(2));
        let end = run(&v, stream(96), &mut ctl).unwrap();
        let CopyEnd::Stopped(p) = end else {
            panic!("{end:?}")
        };
        assert_eq!(p.resume_offset, 2 << 20);
        assert_eq!(p.done_bytes, 2 << 20);
    }

    #[test]
    fn a_broken_stream_ends_the_copy_with_its_error() {
        let (_d, _p, v) = setup();
        let mut ctl = Check::new(&v, None);
        let broken = stream(40).chain(std::iter::once(Err(Error::InvalidArgument("cut".into()))));
        let e = run(&v, broken.chain(stream(96).skip(41)), &mut ctl).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument(ref m) if m == "cut"),
            "{e}"
        );
        // 40 pieces of 64 KiB: two checkpoints passed, none after the break.
        assert_eq!(ctl.durable, vec![1 << 20, 2 << 20]);
    }
}
