//! Measure a pull between two pools on this machine over loopback TLS.
//!
//! `cargo run --release -p lamina-transfer --example pull_bench -- [DATA_MIB] [DIR]`
//! writes DATA_MIB (default 1024) of data in 8 MiB extents with 8 MiB holes
//! between them, snapshots it, pulls it into a second pool and prints the
//! rate and the wire bytes over the allocated bytes. Pools go under DIR
//! (default the temp dir). It then times the engine's local `copy_into` of
//! the same data, the bound a pull cannot beat.

use lamina_engine::{CopyControl, CopyEnd, Pool, PoolOptions};
use lamina_transfer::{certs, pull_into, Identity, Pull, Remote, Source};
use std::sync::Arc;
use std::time::Instant;

struct Quiet;
impl CopyControl for Quiet {}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let data_mib: u64 = args
        .get(1)
        .map(|a| a.parse().expect("DATA_MIB"))
        .unwrap_or(1024);
    let base = args
        .get(2)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(base).unwrap();
    let (ca, s_dir, t_dir) = (
        dir.path().join("ca"),
        dir.path().join("s"),
        dir.path().join("t"),
    );
    certs::create_ca(&ca).unwrap();
    certs::issue(&ca, "source", &s_dir).unwrap();
    certs::issue(&ca, "target", &t_dir).unwrap();
    let s_id = Arc::new(Identity::load(&s_dir).unwrap());
    let t_id = Identity::load(&t_dir).unwrap();

    let mib = 1u64 << 20;
    let size = 2 * data_mib * mib;
    let src = Arc::new(Pool::create_dir(dir.path().join("p1"), PoolOptions::default()).unwrap());
    src.create_volume("v", size).unwrap();
    let v = src.open_volume("v").unwrap();
    let mut buf = vec![0u8; (8 * mib) as usize];
    let mut x = 0x9e3779b97f4a7c15u64;
    for e in 0..data_mib / 8 {
        for w in buf.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        v.write(e * 16 * mib, &buf).unwrap();
    }
    v.flush().unwrap();
    src.create_snapshot("v", "s", &[]).unwrap();
    let allocated = src.snapshot_info_by_name("v", "s").unwrap().allocated_bytes;

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let source = Source::new(src.clone(), s_id);
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            source.serve(l, std::future::pending()).await.unwrap();
        })
    });

    let dst = Pool::create_dir(dir.path().join("p2"), PoolOptions::default()).unwrap();
    dst.create_volume("copy", size).unwrap();
    let remote = Remote {
        address: addr.to_string(),
        node: "source".into(),
    };
    let t = Instant::now();
    let pull = Pull {
        into: "copy",
        remote: &remote,
        volume: "v",
        snapshot: "s",
        expect_id: 0,
        resume_offset: 0,
        checkpoint_bytes: 256 * mib,
        stall_timeout: lamina_transfer::Limits::STALL_TIMEOUT,
    };
    let end = pull_into(&dst, &t_id, &pull, &mut Quiet);
    let secs = t.elapsed().as_secs_f64();
    assert!(matches!(end.end, Ok(CopyEnd::Done(_))), "{end:?}");
    println!(
        "pulled {} MiB allocated (of {} MiB) in {secs:.2} s: {:.0} MB/s; wire bytes / allocated = {:.4}",
        allocated / mib,
        size / mib,
        allocated as f64 / secs / 1e6,
        end.wire_bytes as f64 / allocated as f64
    );
    // Check the copy, 16 MiB at a time.
    let (a, b) = (
        src.open_snapshot("v", "s").unwrap(),
        dst.open_volume("copy").unwrap(),
    );
    let (mut x, mut y) = (
        vec![0u8; (16 * mib) as usize],
        vec![0u8; (16 * mib) as usize],
    );
    for i in 0..size / (16 * mib) {
        a.read(i * 16 * mib, &mut x).unwrap();
        b.read(i * 16 * mib, &mut y).unwrap();
        assert!(x == y, "differs in the 16 MiB at {}", i * 16 * mib);
    }
    println!("the copy equals the snapshot");
    // For comparison: the same copy inside the target's pool, no network.
    dst.create_volume("local", size).unwrap();
    let t = Instant::now();
    let from = lamina_engine::Target::volume("copy");
    dst.copy_into(&from, "local", 0, 256 * mib, &mut Quiet)
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    println!(
        "local copy_into of the same data: {secs:.2} s, {:.0} MB/s",
        allocated as f64 / secs / 1e6
    );
}
