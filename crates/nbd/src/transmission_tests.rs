//! Transmission-phase tests over an in-memory pipe.

use super::*;
use crate::device::{Extent, InlineIo, IoError, IoErrorKind};
use crate::mem::{MemDevice, MemExports};
use crate::testkit::*;
use crate::Exports;
use lamina_blockio::testing::Gated;
use lamina_blockio::IoOp;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn pattern(off: usize, len: usize) -> Vec<u8> {
    (off..off + len)
        .map(|i| if i < 65536 { i as u8 } else { 0 })
        .collect()
}

async fn disc(mut c: Client) {
    c.request(CMD_DISC, 0, 0, 0, 0).await;
    c.closed().await.unwrap();
}

#[tokio::test]
async fn structured_read_write_and_zero_length() {
    let mut c = Client::structured("disk").await;
    c.request(CMD_READ, 0, 1, 100, 1000).await;
    let ch = c.chunk().await;
    assert_eq!(
        (ch.flags, ch.kind, ch.cookie),
        (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, 1)
    );
    assert_eq!(&ch.payload[..8], &100u64.to_be_bytes());
    assert_eq!(&ch.payload[8..], &pattern(100, 1000)[..]);

    c.request(CMD_WRITE, CMD_FLAG_FUA, 2, 4096, 3).await;
    c.send(&[9, 8, 7]).await;
    let ch = c.chunk().await;
    assert_eq!(
        (ch.kind, ch.cookie, ch.errno()),
        (0xffff, 2, 0),
        "simple success reply"
    );
    c.request(CMD_READ, CMD_FLAG_DF, 3, 4095, 5).await;
    assert_eq!(
        &c.chunk().await.payload[8..],
        &[4095u16 as u8, 9, 8, 7, 4099u16 as u8]
    );

    c.request(CMD_READ, 0, 4, 0, 0).await;
    let ch = c.chunk().await;
    assert_eq!(
        (ch.flags, ch.kind, ch.payload.len()),
        (REPLY_FLAG_DONE, REPLY_TYPE_NONE, 0)
    );
    c.request(CMD_WRITE, 0, 5, 0, 0).await;
    assert_eq!(c.chunk().await.errno(), 0);
    disc(c).await;
}

#[tokio::test]
async fn simple_replies_for_the_kernel_client() {
    let (exports, disk, _, _) = exports();
    let mut c = Client::start(exports, ServerOptions::default()).await;
    c.send(&crate::mem::client_handshake("disk", false)).await;
    let mut h = [0u8; 10];
    c.r.read_exact(&mut h).await.unwrap();
    c.request(CMD_READ, 0, 7, 10, 20).await;
    assert_eq!(c.simple_reply(20).await, (0, 7, pattern(10, 20)));
    c.request(CMD_WRITE, 0, 8, 0, 4).await;
    c.send(b"abcd").await;
    assert_eq!(c.simple_reply(0).await, (0, 8, vec![]));
    assert_eq!(&disk.contents()[..4], b"abcd");
    // DF is only valid with structured replies.
    c.request(CMD_READ, CMD_FLAG_DF, 9, 0, 4).await;
    assert_eq!(c.simple_reply(4).await.0, EINVAL);
    c.request(CMD_READ, 0, 10, SIZE as u64, 1).await;
    assert_eq!(c.simple_reply(1).await.0, EINVAL);
    c.request(CMD_BLOCK_STATUS, 0, 11, 0, 512).await;
    assert_eq!(c.simple_reply(0).await.0, EINVAL);
    disc(c).await;
}

#[tokio::test]
async fn range_and_limit_errors() {
    let mut c = Client::structured("disk").await;
    let end = SIZE as u64;
    for (kind, off, len, errno) in [
        (CMD_READ, end - 1, 2, EINVAL),
        (CMD_READ, u64::MAX, 2, EINVAL),
        (CMD_READ, 0, (32 << 20) + 1, EINVAL),
        (CMD_TRIM, end, 1, EINVAL),
        (CMD_CACHE, u64::MAX - 1, 4, EINVAL),
        (CMD_WRITE_ZEROES, end - 1, 2, ENOSPC),
        (CMD_BLOCK_STATUS, end, 1, EINVAL),
        (CMD_BLOCK_STATUS, 0, 0, EINVAL),
        (42, 0, 0, EINVAL),
    ] {
        c.request(kind, 0, 100 + u64::from(kind), off, len).await;
        let ch = c.chunk().await;
        assert_eq!(
            (ch.kind, ch.flags, ch.errno()),
            (REPLY_TYPE_ERROR, REPLY_FLAG_DONE, errno),
            "{kind} {off} {len}"
        );
    }
    // A write past the end still has its payload consumed.
    c.request(CMD_WRITE, 0, 1, end - 2, 4).await;
    c.send(&[1, 2, 3, 4]).await;
    assert_eq!(c.chunk().await.errno(), ENOSPC);
    // Flags not valid for the command.
    c.request(CMD_WRITE, CMD_FLAG_NO_HOLE, 2, 0, 1).await;
    c.send(&[1]).await;
    assert_eq!(c.chunk().await.errno(), EINVAL);
    c.request(CMD_READ, 1 << 9, 3, 0, 1).await;
    assert_eq!(c.chunk().await.errno(), EINVAL);
    c.request(CMD_CACHE, CMD_FLAG_FUA, 4, 0, 4096).await;
    assert_eq!(c.chunk().await.errno(), 0);
    // A device error maps to EIO.
    c.request(CMD_READ, 0, 5, end - 8192, 8192).await;
    let ch = c.chunk().await;
    assert_eq!((ch.cookie, ch.errno()), (5, EIO));
    disc(c).await;
}

#[tokio::test]
async fn oversized_write_closes() {
    let mut c = Client::structured("disk").await;
    c.request(CMD_WRITE, 0, 1, 0, (32 << 20) + 1).await;
    assert!(matches!(
        c.closed().await,
        Err(NbdError::PayloadTooLarge { .. })
    ));
}

#[tokio::test]
async fn bad_request_magic_closes() {
    let mut c = Client::structured("disk").await;
    let mut r = Request {
        flags: 0,
        kind: CMD_READ,
        cookie: 1,
        offset: 0,
        length: 1,
    }
    .encode();
    r[3] ^= 1;
    c.send(&r).await;
    assert!(matches!(
        c.closed().await,
        Err(NbdError::RequestMagic(0x2560_9512))
    ));
}

#[tokio::test]
async fn client_vanishing_mid_request() {
    let mut c = Client::structured("disk").await;
    c.send(
        &Request {
            flags: 0,
            kind: CMD_WRITE,
            cookie: 1,
            offset: 0,
            length: 100,
        }
        .encode(),
    )
    .await;
    c.send(&[0; 50]).await;
    c.w.shutdown().await.unwrap();
    assert!(matches!(c.closed().await, Err(NbdError::Io(_))));
    let mut c = Client::structured("disk").await;
    c.send(&[0x25, 0x60]).await;
    c.w.shutdown().await.unwrap();
    assert!(matches!(c.closed().await, Err(NbdError::Io(_))));
    // Between requests it is a clean end.
    let mut c = Client::structured("disk").await;
    c.w.shutdown().await.unwrap();
    assert!(c.closed().await.is_ok());
}

#[tokio::test]
async fn read_only_export_refuses_writes() {
    for structured in [true, false] {
        let mut c = if structured {
            Client::structured("ro").await
        } else {
            Client::simple("ro").await
        };
        c.request(CMD_WRITE, 0, 1, 0, 2).await;
        c.send(&[1, 2]).await;
        c.request(CMD_TRIM, 0, 2, 0, 4096).await;
        c.request(CMD_WRITE_ZEROES, 0, 3, 0, 4096).await;
        c.request(CMD_READ, 0, 4, 0, 2).await;
        // Replies may come in any order.
        let mut refused = Vec::new();
        for _ in 0..4 {
            let ch = c.chunk().await;
            if ch.cookie == 4 {
                if structured {
                    assert_eq!(ch.kind, REPLY_TYPE_OFFSET_DATA);
                } else {
                    assert_eq!(ch.errno(), 0);
                    let mut d = [0u8; 2];
                    c.r.read_exact(&mut d).await.unwrap();
                }
            } else {
                assert_eq!(ch.errno(), EPERM);
                refused.push(ch.cookie);
            }
        }
        refused.sort();
        assert_eq!(refused, [1, 2, 3]);
        disc(c).await;
    }
}

fn status(ch: &Chunk) -> Vec<(u32, u32)> {
    assert_eq!(ch.kind, REPLY_TYPE_BLOCK_STATUS);
    assert_eq!(&ch.payload[..4], &BASE_ALLOCATION_ID.to_be_bytes());
    ch.payload[4..]
        .chunks(8)
        .map(|d| {
            (
                u32::from_be_bytes(d[..4].try_into().unwrap()),
                u32::from_be_bytes(d[4..].try_into().unwrap()),
            )
        })
        .collect()
}

#[tokio::test]
async fn block_status_trim_and_zeroes() {
    let mut c = Client::structured("disk").await;
    c.request(CMD_BLOCK_STATUS, 0, 1, 0, 128 * 1024).await;
    assert_eq!(status(&c.chunk().await), vec![(65536, 0), (65536, 3)]);
    c.request(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 2, 100, 128 * 1024)
        .await;
    assert_eq!(status(&c.chunk().await), vec![(65436, 0)]);
    c.request(CMD_TRIM, 0, 3, 4096, 8192).await;
    c.request(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 4, 16384, 8192)
        .await;
    c.request(CMD_WRITE_ZEROES, CMD_FLAG_FUA, 5, 32768, 4096)
        .await;
    let mut cookies: Vec<u64> = Vec::new();
    for _ in 0..3 {
        let ch = c.chunk().await;
        assert_eq!(ch.errno(), 0);
        cookies.push(ch.cookie);
    }
    cookies.sort();
    assert_eq!(cookies, vec![3, 4, 5]);
    c.request(CMD_BLOCK_STATUS, 0, 6, 0, 40960).await;
    assert_eq!(
        status(&c.chunk().await),
        vec![(4096, 0), (8192, 3), (20480, 0), (4096, 3), (4096, 0)]
    );
    c.request(CMD_READ, 0, 7, 4096, 8192).await;
    assert!(c.chunk().await.payload[8..].iter().all(|b| *b == 0));
    disc(c).await;
}

#[tokio::test]
async fn fast_zero_and_emulated_zeroes() {
    let (exports, _, _, nz) = exports();
    nz.load(0, &[0xff; 8192]);
    let mut c = Client::scripted(exports, ServerOptions::default(), "slow-zero").await;
    c.request(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 1, 0, 4096)
        .await;
    let ch = c.chunk().await;
    assert_eq!(
        (ch.kind, ch.errno()),
        (REPLY_TYPE_ERROR, EINVAL),
        "FAST_ZERO is not advertised for a volume without native zeroing"
    );
    assert!(
        nz.contents()[..4096].iter().all(|b| *b == 0xff),
        "fast zero must not write"
    );
    c.request(CMD_WRITE_ZEROES, 0, 2, 0, 4096).await;
    assert_eq!(c.chunk().await.errno(), 0);
    assert!(nz.contents()[..4096].iter().all(|b| *b == 0));
    assert!(nz.contents()[4096..8192].iter().all(|b| *b == 0xff));
    disc(c).await;
}

#[tokio::test]
async fn an_export_offers_exactly_what_its_volume_declares() {
    let bare = Arc::new(MemDevice::new(SIZE).with_caps(crate::Caps {
        flush: false,
        fua: false,
        trim: false,
        write_zeroes: false,
        block_status: false,
    }));
    bare.load(0, &[0xff; 8192]);
    let exports: Arc<dyn Exports> = Arc::new(MemExports::new().with("bare", "", bare.clone()));
    let mut c = Client::start(exports, ServerOptions::default()).await;
    c.send(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .await;
    assert_eq!(c.option(OPT_STRUCTURED_REPLY, &[]).await[0].kind, REP_ACK);
    let r = c
        .option(
            OPT_SET_META_CONTEXT,
            &meta_request("bare", &[BASE_ALLOCATION]),
        )
        .await;
    assert_eq!(
        r.iter().map(|r| r.kind).collect::<Vec<_>>(),
        [REP_ACK],
        "no base:allocation for a volume without block status"
    );
    let r = c.option(OPT_GO, &info_request("bare", &[])).await;
    assert_eq!(r.last().unwrap().kind, REP_ACK);
    let f = u16::from_be_bytes(r[0].data[10..12].try_into().unwrap());
    assert_eq!(
        f,
        FLAG_HAS_FLAGS | FLAG_SEND_CACHE | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_DF,
        "{f:#x}"
    );
    // What was not advertised is refused before it reaches the volume.
    c.request(CMD_FLUSH, 0, 1, 0, 0).await;
    assert_eq!(c.chunk().await.errno(), EINVAL);
    c.request(CMD_TRIM, 0, 2, 0, 4096).await;
    assert_eq!(c.chunk().await.errno(), EINVAL);
    c.request(CMD_WRITE, CMD_FLAG_FUA, 3, 0, 4).await;
    c.send(&[1, 2, 3, 4]).await;
    assert_eq!(c.chunk().await.errno(), EINVAL);
    c.request(CMD_BLOCK_STATUS, 0, 4, 0, 4096).await;
    assert_eq!(c.chunk().await.errno(), EINVAL);
    assert_eq!(bare.flush_count(), 0);
    assert!(bare.contents()[..4096].iter().all(|b| *b == 0xff));
    // WRITE_ZEROES is the server's: zeros written for the volume.
    c.request(CMD_WRITE_ZEROES, 0, 5, 0, 4096).await;
    assert_eq!(c.chunk().await.errno(), 0);
    assert!(bare.contents()[..4096].iter().all(|b| *b == 0));
    assert!(bare.contents()[4096..8192].iter().all(|b| *b == 0xff));
    disc(c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_all_answered_before_disc_closes() {
    let (exports, disk, _, _) = exports();
    let opts = ServerOptions {
        max_in_flight: 4,
        ..ServerOptions::default()
    };
    let mut c = Client::scripted(exports, opts, "disk").await;
    // 100 writes and reads, then a flush and DISC, all without waiting.
    let mut batch = Vec::new();
    for i in 0..100u64 {
        let w = Request {
            flags: 0,
            kind: CMD_WRITE,
            cookie: i,
            offset: 65536 + i * 512,
            length: 512,
        };
        batch.extend_from_slice(&w.encode());
        batch.extend_from_slice(&[i as u8; 512]);
        let r = Request {
            flags: 0,
            kind: CMD_READ,
            cookie: 1000 + i,
            offset: i * 512,
            length: 512,
        };
        batch.extend_from_slice(&r.encode());
    }
    batch.extend_from_slice(
        &Request {
            flags: 0,
            kind: CMD_FLUSH,
            cookie: 5000,
            offset: 0,
            length: 0,
        }
        .encode(),
    );
    batch.extend_from_slice(
        &Request {
            flags: 0,
            kind: CMD_DISC,
            cookie: 0,
            offset: 0,
            length: 0,
        }
        .encode(),
    );
    // The pipe holds all of it; the server reads while it answers.
    c.w.write_all(&batch).await.unwrap();
    let mut seen = std::collections::BTreeSet::new();
    {
        while seen.len() < 201 {
            let ch = c.chunk().await;
            assert_eq!(ch.errno(), 0);
            if ch.cookie >= 1000 && ch.cookie < 5000 {
                let i = (ch.cookie - 1000) as usize;
                assert_eq!(&ch.payload[8..], &pattern(i * 512, 512)[..]);
            }
            assert!(seen.insert(ch.cookie), "duplicate reply");
        }
    }
    c.closed().await.unwrap();
    let data = disk.contents();
    for i in 0..100usize {
        assert!(data[65536 + i * 512..65536 + (i + 1) * 512]
            .iter()
            .all(|b| *b == i as u8));
    }
    assert_eq!(disk.flush_count(), 1);
}

/// A volume behind `Gated`: operations the test holds complete only when
/// it releases them, from the test's thread.
fn gated() -> (Arc<Gated<MemDevice>>, Arc<dyn Exports>) {
    let g = Arc::new(Gated::new(Arc::new(MemDevice::new(SIZE))));
    let exports: Arc<dyn Exports> = Arc::new(MemExports::new().with("d", "", g.clone()));
    (g, exports)
}

/// Releases held operations from a blocking thread (the test's reactor must
/// stay free to read replies), once `n` are held.
async fn release(g: &Arc<Gated<MemDevice>>, n: usize, index: Option<usize>) {
    let g = g.clone();
    tokio::task::spawn_blocking(move || {
        g.wait_held(n, Duration::from_secs(60));
        match index {
            Some(i) => g.release(i),
            None => g.release_all(),
        }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_waits_for_earlier_writes_only() {
    let (g, exports) = gated();
    g.hold(|op| matches!(op, IoOp::Write { offset: 0, .. }) || matches!(op, IoOp::Flush));
    let mut c = Client::scripted(exports, ServerOptions::default(), "d").await;
    // held write, flush A, write, flush B: A must follow the held write;
    // B must follow both writes; the second write need not wait for either.
    c.request(CMD_WRITE, 0, 1, 0, 1).await;
    c.send(&[1]).await;
    c.request(CMD_FLUSH, 0, 2, 0, 0).await;
    c.request(CMD_WRITE, 0, 3, 4096, 1).await;
    c.send(&[1]).await;
    c.request(CMD_FLUSH, 0, 4, 0, 0).await;
    assert_eq!(
        c.chunk().await.cookie,
        3,
        "the free write is answered first"
    );
    g.wait_held(1, Duration::from_secs(60));
    assert_eq!(
        g.held(),
        vec![("write", 0, 1)],
        "no flush reaches the volume while an earlier write is in flight"
    );
    release(&g, 1, Some(0)).await;
    assert_eq!(c.chunk().await.cookie, 1);
    // Now both flushes may go.
    release(&g, 2, None).await;
    let mut rest = vec![c.chunk().await.cookie, c.chunk().await.cookie];
    rest.sort();
    assert_eq!(rest, [2, 4]);
    disc(c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_completions_from_another_thread_answer_in_their_own_order() {
    let (g, exports) = gated();
    g.hold(|op| matches!(op, IoOp::Read { .. }));
    g.fail(IoErrorKind::NoSpace, |op| {
        matches!(op, IoOp::Write { offset: 8192, .. })
    });
    g.fail(IoErrorKind::Gone, |op| {
        matches!(op, IoOp::BlockStatus { .. })
    });
    let mut c = Client::scripted(exports, ServerOptions::default(), "d").await;
    for i in 0..3u64 {
        c.request(CMD_WRITE, 0, 10 + i, i * 4096, 3).await;
        c.send(&[i as u8 + 1; 3]).await;
    }
    let mut w: Vec<u64> = Vec::new();
    for _ in 0..3 {
        let ch = c.chunk().await;
        w.push(ch.cookie);
        if ch.cookie == 12 {
            assert_eq!(ch.errno(), ENOSPC, "the injected error is the client's");
        } else {
            assert_eq!(ch.errno(), 0);
        }
    }
    w.sort();
    assert_eq!(w, [10, 11, 12]);
    for i in 0..3u64 {
        c.request(CMD_READ, 0, 20 + i, i * 4096, 3).await;
    }
    // Released newest first: the replies come in that order, each with its
    // own data. Each read is found by its offset: the server may hand the
    // three to the volume in any order (on 2 busy cores the second came
    // first).
    g.wait_held(3, Duration::from_secs(60));
    for (i, want) in [(2u64, 22u64), (1, 21), (0, 20)] {
        let at = g
            .held()
            .iter()
            .position(|&(_, offset, _)| offset == i * 4096)
            .expect("the read is held");
        release(&g, i as usize + 1, Some(at)).await;
        let ch = c.chunk().await;
        assert_eq!(ch.cookie, want);
        let data = &ch.payload[8..];
        match want {
            20 => assert_eq!(data, [1, 1, 1]),
            21 => assert_eq!(data, [2, 2, 2]),
            _ => assert_eq!(data, [0, 0, 0], "the failed write wrote nothing"),
        }
    }
    c.request(CMD_BLOCK_STATUS, 0, 30, 0, 4096).await;
    assert_eq!(c.chunk().await.errno(), EIO);
    disc(c).await;
}

/// A read here takes 5 ms: slow, by the runners' measure.
const SLOW_AT: u64 = 3 * 4096;

/// Reads at offset 0 block until the test opens the gate, reads at
/// [`SLOW_AT`] take 5 ms; everything else is instant. A plain blocking volume, as the engine is: it shows that one
/// stuck call on a runner does not hold up the requests behind it.
struct StuckRead {
    inner: MemDevice,
    gate: std::sync::Mutex<(bool, bool)>,
    changed: std::sync::Condvar,
}

impl StuckRead {
    fn wait(&self, f: impl Fn(&(bool, bool)) -> bool) {
        let g = self.gate.lock().unwrap();
        let (g, t) = self
            .changed
            .wait_timeout_while(g, Duration::from_secs(60), |s| !f(s))
            .unwrap();
        assert!(!t.timed_out(), "gate never moved: {:?}", *g);
    }
    fn set(&self, f: impl FnOnce(&mut (bool, bool))) {
        f(&mut self.gate.lock().unwrap());
        self.changed.notify_all();
    }
}

impl InlineIo for StuckRead {
    fn size(&self) -> Result<u64, IoError> {
        InlineIo::size(&self.inner)
    }
    fn read_only(&self) -> bool {
        false
    }
    fn caps(&self) -> crate::Caps {
        crate::Caps::ALL
    }
    fn activate(&self, _: u64) -> Result<(), IoError> {
        Err(IoError::new(IoErrorKind::NotSupported, "no generations"))
    }
    fn read(&self, o: u64, b: &mut [u8]) -> Result<(), IoError> {
        if o == 0 {
            self.set(|s| s.0 = true); // entered
            self.wait(|s| s.1); // opened
        }
        if o == SLOW_AT {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.inner.read(o, b)
    }
    fn write(&self, o: u64, d: &[u8], f: bool) -> Result<(), IoError> {
        self.inner.write(o, d, f)
    }
    fn flush(&self) -> Result<(), IoError> {
        Ok(())
    }
    fn trim(&self, o: u64, l: u64) -> Result<(), IoError> {
        self.inner.trim(o, l)
    }
    fn write_zeroes(&self, o: u64, l: u64, t: bool) -> Result<(), IoError> {
        self.inner.write_zeroes(o, l, t)
    }
    fn block_status(&self, o: u64, l: u64) -> Result<Vec<Extent>, IoError> {
        self.inner.block_status(o, l)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_call_does_not_hold_up_later_requests() {
    let dev = Arc::new(StuckRead {
        inner: MemDevice::new(SIZE),
        gate: std::sync::Mutex::new((false, false)),
        changed: std::sync::Condvar::new(),
    });
    let exports: Arc<dyn Exports> = Arc::new(MemExports::new().with("d", "", dev.clone()));
    let mut c = Client::scripted(exports, ServerOptions::default(), "d").await;
    // Enough fast calls for the server to treat the device as fast.
    for i in 0..64 {
        c.request(CMD_READ, 0, 100 + i, 4096, 512).await;
        c.chunk().await;
    }
    // The last call slow: the stuck one is a runner's, not a lone call the
    // reader runs itself (it would be, after fast ones, if no runner were
    // lingering: docs/nbd.md, "Concurrency").
    c.request(CMD_READ, 0, 99, SLOW_AT, 512).await;
    c.chunk().await;
    c.request(CMD_READ, 0, 1, 0, 512).await;
    let d2 = dev.clone();
    tokio::task::spawn_blocking(move || d2.wait(|s| s.0))
        .await
        .unwrap();
    for i in 0..10 {
        c.request(CMD_READ, 0, 10 + i, 8192, 512).await;
    }
    // All ten are answered while the first is still stuck.
    let mut order = Vec::new();
    for _ in 0..10 {
        order.push(c.chunk().await.cookie);
    }
    assert!(!order.contains(&1), "{order:?}");
    dev.set(|s| s.1 = true);
    assert_eq!(c.chunk().await.cookie, 1);
    disc(c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_cannot_hold_the_connection() {
    let opts = ServerOptions {
        drain_timeout: Duration::from_millis(200),
        ..ServerOptions::default()
    };
    let mut c = Client::scripted(exports().0, opts, "disk").await;
    // Reads whose replies (4 × 512 KiB) overflow the 1 MiB pipe: the
    // server's writes block, since this client never reads them.
    for i in 0..4 {
        c.request(CMD_READ, 0, i, 0, 512 << 10).await;
    }
    c.request(CMD_DISC, 0, 0, 0, 0).await;
    // The connection ends (its replies dropped) instead of waiting forever.
    // The 60 s bound is a safety net, not a measurement.
    let ended = tokio::time::timeout(Duration::from_secs(60), &mut c.server).await;
    assert!(
        ended.is_ok(),
        "the connection is still waiting on its client"
    );
    drop(c);
}
