//! Commits and checkpoints say at debug level, each inside its own span,
//! how long they took and how much they wrote; at info level they say
//! nothing.

use lamina_engine::sim::SimBackend;
use lamina_engine::{Pool, PoolOptions, BLOCK};
use std::io::Write;
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Run `f` with engine logs at `level` captured; returns them.
fn captured(level: &str, f: impl FnOnce()) -> String {
    let buf = Buf::default();
    let out = buf.clone();
    let sub = tracing_subscriber::fmt()
        .with_env_filter(format!("lamina_engine={level}"))
        .with_writer(move || out.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(sub, f);
    let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    text
}

fn workload() {
    let opts = PoolOptions {
        background: false,
        ..PoolOptions::default()
    };
    let pool = Pool::create(Arc::new(SimBackend::new()), opts).unwrap();
    pool.create_volume("v", 1 << 20).unwrap();
    let v = pool.open_volume("v").unwrap();
    v.write(0, &[1; BLOCK]).unwrap();
    v.flush().unwrap();
    pool.checkpoint().unwrap();
    pool.close().unwrap();
}

#[test]
fn commits_and_checkpoints_log_their_cost_at_debug() {
    let text = captured("debug", workload);
    eprintln!("{text}");
    assert!(
        text.lines().any(|l| l.contains("commit:")
            && l.contains("pages=")
            && l.contains("log_bytes=")
            && l.contains("total_us=")),
        "no commit line with its cost:\n{text}"
    );
    assert!(
        text.lines().any(|l| l.contains("checkpoint:")
            && l.contains("pages=")
            && l.contains("bytes=")
            && l.contains("total_us=")),
        "no checkpoint line with its cost:\n{text}"
    );
}

#[test]
fn nothing_per_commit_above_debug() {
    let text = captured("info", workload);
    assert!(
        !text.contains("commit") && !text.contains("checkpoint:"),
        "commit or checkpoint logged above debug:\n{text}"
    );
    // The info level still says something (the volume was created).
    assert!(text.contains("volume created"), "{text}");
}
