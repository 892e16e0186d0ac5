//! Simulated storage for crash tests: files in memory that remember which
//! writes reached "the platter" (were followed by a sync) and which did not.
//! [`SimBackend::crash`] models a power cut: every unsynced write is dropped,
//! kept, or torn at 512-byte sectors at random. [`SimBackend::fail_after`]
//! makes the N-th mutating operation and all later ones fail, as a dying disk
//! would, which places a fail point at every step of every metadata update;
//! [`SimBackend::fail_on`] aims the failure at one kind of operation on one
//! file (the log's third sync, say).

use crate::storage::{Backend, BlockFile};
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

const CHUNK: u64 = 4096;

#[derive(Clone, Default)]
struct Image {
    chunks: HashMap<u64, Box<[u8; CHUNK as usize]>>,
    len: u64,
}

impl Image {
    fn write(&mut self, buf: &[u8], offset: u64) {
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let (ci, co) = (at / CHUNK, (at % CHUNK) as usize);
            let n = (CHUNK as usize - co).min(buf.len() - done);
            let chunk = self
                .chunks
                .entry(ci)
                .or_insert_with(|| Box::new([0; CHUNK as usize]));
            chunk[co..co + n].copy_from_slice(&buf[done..done + n]);
            done += n;
        }
        self.len = self.len.max(offset + buf.len() as u64);
    }

    fn read(&self, buf: &mut [u8], offset: u64) {
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let (ci, co) = (at / CHUNK, (at % CHUNK) as usize);
            let n = (CHUNK as usize - co).min(buf.len() - done);
            match self.chunks.get(&ci) {
                Some(c) if at < self.len => buf[done..done + n].copy_from_slice(&c[co..co + n]),
                _ => buf[done..done + n].fill(0),
            }
            done += n;
        }
    }

    fn zero(&mut self, offset: u64, len: u64) {
        let mut at = offset;
        let end = offset + len;
        while at < end {
            let (ci, co) = (at / CHUNK, (at % CHUNK) as usize);
            let n = (CHUNK - co as u64).min(end - at);
            if co == 0 && n == CHUNK {
                self.chunks.remove(&ci);
            } else if let Some(c) = self.chunks.get_mut(&ci) {
                c[co..co + n as usize].fill(0);
            }
            at += n;
        }
    }

    fn set_len(&mut self, len: u64) {
        if len < self.len {
            let tail = self.len - len;
            self.zero(len, tail);
        }
        self.len = len;
    }
}

/// A kind of mutating operation, to aim a fail point at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimOp {
    Write,
    Sync,
    Punch,
    Allocate,
    SetLen,
    /// A write-out of ranges ([`BlockFile::write_out`]): no barrier, so a
    /// power cut loses what it wrote out as it loses any unsynced write.
    WriteOut,
}

/// A fail point aimed at the `left`-th next `op` on the file `name`.
struct Aim {
    name: String,
    op: SimOp,
    left: u64,
}

#[derive(Clone)]
enum Op {
    Write(u64, Vec<u8>),
    Punch(u64, u64),
    SetLen(u64),
}

struct FileState {
    current: Image,
    durable: Image,
    pending: Vec<Op>,
}

/// A file held in memory by a [`SimBackend`].
pub struct SimFile {
    name: String,
    path: PathBuf,
    state: Mutex<FileState>,
    budget: Arc<AtomicI64>,
    ops: Arc<AtomicI64>,
    aim: Arc<Mutex<Option<Aim>>>,
}

fn injected() -> io::Error {
    io::Error::other("injected failure (simulated dying disk)")
}

impl SimFile {
    fn spend(&self, op: SimOp) -> io::Result<()> {
        self.ops.fetch_add(1, Ordering::SeqCst);
        {
            let mut aim = self.aim.lock().unwrap();
            if let Some(a) = aim.as_mut().filter(|a| a.name == self.name && a.op == op) {
                a.left -= 1;
                if a.left == 0 {
                    *aim = None;
                    // The disk is dying: everything from here on fails.
                    self.budget.store(0, Ordering::SeqCst);
                    return Err(injected());
                }
            }
        }
        // A negative budget means "no failure armed".
        let left = self.budget.load(Ordering::SeqCst);
        if left < 0 {
            return Ok(());
        }
        if left == 0 || self.budget.fetch_sub(1, Ordering::SeqCst) <= 1 {
            self.budget.store(0, Ordering::SeqCst);
            return Err(injected());
        }
        Ok(())
    }
}

impl BlockFile for SimFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.state.lock().unwrap().current.read(buf, offset);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.spend(SimOp::Write)?;
        let mut s = self.state.lock().unwrap();
        s.current.write(buf, offset);
        s.pending.push(Op::Write(offset, buf.to_vec()));
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.spend(SimOp::Sync)?;
        let mut s = self.state.lock().unwrap();
        s.durable = s.current.clone();
        s.pending.clear();
        Ok(())
    }

    fn write_out(&self, _ranges: &[(u64, u64)]) -> io::Result<()> {
        self.spend(SimOp::WriteOut)
    }

    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        self.spend(SimOp::Punch)?;
        let mut s = self.state.lock().unwrap();
        s.current.zero(offset, len);
        s.pending.push(Op::Punch(offset, len));
        Ok(())
    }

    fn allocate(&self, _offset: u64, _len: u64) -> io::Result<()> {
        self.spend(SimOp::Allocate)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.state.lock().unwrap().current.len)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.spend(SimOp::SetLen)?;
        let mut s = self.state.lock().unwrap();
        s.current.set_len(len);
        s.pending.push(Op::SetLen(len));
        Ok(())
    }
}

/// A set of in-memory files standing in for a pool directory.
pub struct SimBackend {
    dir: PathBuf,
    files: Mutex<HashMap<String, Arc<SimFile>>>,
    budget: Arc<AtomicI64>,
    ops: Arc<AtomicI64>,
    aim: Arc<Mutex<Option<Aim>>>,
}

impl Default for SimBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl SimBackend {
    pub fn new() -> Self {
        SimBackend {
            dir: PathBuf::from("sim:"),
            files: Mutex::new(HashMap::new()),
            budget: Arc::new(AtomicI64::new(-1)),
            ops: Arc::new(AtomicI64::new(0)),
            aim: Arc::new(Mutex::new(None)),
        }
    }

    /// Mutating operations performed so far (writes, syncs, punches...).
    pub fn ops(&self) -> u64 {
        self.ops.load(Ordering::SeqCst) as u64
    }

    /// Make the `n`-th mutating operation from now (1-based) and every one
    /// after it fail. `None` disarms (this and [`SimBackend::fail_on`]).
    pub fn fail_after(&self, n: Option<u64>) {
        if n.is_none() {
            *self.aim.lock().unwrap() = None;
        }
        self.budget
            .store(n.map(|n| n as i64).unwrap_or(-1), Ordering::SeqCst);
    }

    /// Make the `n`-th `op` from now (1-based) on the file `name` fail, and
    /// every mutating operation on any file after it, as a disk that dies
    /// at that moment would.
    pub fn fail_on(&self, name: &str, op: SimOp, n: u64) {
        assert!(n > 0, "operations are counted from 1");
        *self.aim.lock().unwrap() = Some(Aim {
            name: name.to_string(),
            op,
            left: n,
        });
    }

    /// Whether a fail point aimed by [`SimBackend::fail_on`] is still waiting.
    pub fn aimed(&self) -> bool {
        self.aim.lock().unwrap().is_some()
    }

    /// Mutating operations left before the armed failure (None if disarmed).
    pub fn remaining(&self) -> Option<u64> {
        let v = self.budget.load(Ordering::SeqCst);
        (v >= 0).then_some(v as u64)
    }

    /// Simulate a power cut. Unsynced operations are dropped; with a `seed`,
    /// each unsynced write instead survives, is lost, or is torn at 512-byte
    /// sectors, at random (as a disk's write cache would reorder them).
    /// Failure injection is disarmed afterwards.
    pub fn crash(&self, seed: Option<u64>) {
        let mut rng = seed.unwrap_or(0) | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for f in self.files.lock().unwrap().values() {
            let mut s = f.state.lock().unwrap();
            let mut img = s.durable.clone();
            if seed.is_some() {
                for op in s.pending.clone() {
                    match op {
                        Op::Write(off, data) => {
                            for (i, sector) in data.chunks(512).enumerate() {
                                if next() % 3 != 0 {
                                    img.write(sector, off + 512 * i as u64);
                                }
                            }
                        }
                        Op::Punch(off, len) => {
                            if next() % 2 == 0 {
                                img.zero(off, len)
                            }
                        }
                        Op::SetLen(len) => {
                            if next() % 2 == 0 {
                                img.set_len(len)
                            }
                        }
                    }
                }
            }
            s.durable = img.clone();
            s.current = img;
            s.pending.clear();
        }
        self.fail_after(None);
    }

    /// Overwrite bytes of a file, durably, behind the pool's back.
    pub fn write_raw(&self, name: &str, offset: u64, bytes: &[u8]) {
        let files = self.files.lock().unwrap();
        let f = files.get(name).expect("no such sim file");
        let mut s = f.state.lock().unwrap();
        s.current.write(bytes, offset);
        s.durable = s.current.clone();
    }

    /// Length of a file.
    pub fn file_len(&self, name: &str) -> u64 {
        self.files
            .lock()
            .unwrap()
            .get(name)
            .map(|f| f.state.lock().unwrap().current.len)
            .unwrap_or(0)
    }

    /// Flip bits of a byte in a file, as media corruption would.
    pub fn corrupt(&self, name: &str, offset: u64) {
        let files = self.files.lock().unwrap();
        let f = files.get(name).expect("no such sim file");
        let mut s = f.state.lock().unwrap();
        let mut b = [0u8];
        s.current.read(&mut b, offset);
        b[0] ^= 0xff;
        s.current.write(&b, offset);
        s.durable = s.current.clone();
    }
}

impl Backend for SimBackend {
    fn location(&self) -> &Path {
        &self.dir
    }

    fn exists(&self, name: &str) -> bool {
        self.files.lock().unwrap().contains_key(name)
    }

    fn open(&self, name: &str, create: bool) -> io::Result<Arc<dyn BlockFile>> {
        let mut files = self.files.lock().unwrap();
        if let Some(f) = files.get(name) {
            return Ok(f.clone());
        }
        if !create {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{name}: not found"),
            ));
        }
        let f = Arc::new(SimFile {
            name: name.to_string(),
            path: self.dir.join(name),
            state: Mutex::new(FileState {
                current: Image::default(),
                durable: Image::default(),
                pending: Vec::new(),
            }),
            budget: self.budget.clone(),
            ops: self.ops.clone(),
            aim: self.aim.clone(),
        });
        files.insert(name.to_string(), f.clone());
        Ok(f)
    }
}
