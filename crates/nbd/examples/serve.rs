//! Serves one export named `disk` on a unix socket until Ctrl-C, backed by
//! RAM or by a file. For trying clients and for benchmarks:
//!
//! ```text
//! cargo run --release -p lamina-nbd --example serve -- /tmp/nbd.sock mem:1G
//! cargo run --release -p lamina-nbd --example serve -- /tmp/nbd.sock /path/to/image.raw
//! nbdinfo 'nbd+unix:///disk?socket=/tmp/nbd.sock'
//! ```

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use lamina_nbd::mem::{MemDevice, MemExports};
use lamina_nbd::{serve_unix, BlockIo, Extent, InlineIo, IoError, IoErrorKind, ServerOptions};

/// A raw image file; every range is reported as data.
struct FileDevice(File);

fn io(e: std::io::Error) -> IoError {
    IoError::new(IoErrorKind::Io, e.to_string())
}

impl InlineIo for FileDevice {
    fn size(&self) -> Result<u64, IoError> {
        Ok(self.0.metadata().map_err(io)?.len())
    }
    fn read_only(&self) -> bool {
        false
    }
    fn caps(&self) -> lamina_nbd::Caps {
        lamina_nbd::Caps::ALL
    }
    fn activate(&self, _: u64) -> Result<(), IoError> {
        Err(IoError::new(IoErrorKind::NotSupported, "no generations"))
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        self.0.read_exact_at(buf, offset).map_err(io)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), IoError> {
        self.0.write_all_at(data, offset).map_err(io)?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }
    fn flush(&self) -> Result<(), IoError> {
        self.0.sync_data().map_err(io)
    }
    fn trim(&self, _offset: u64, _len: u64) -> Result<(), IoError> {
        Ok(())
    }
    fn write_zeroes(&self, _offset: u64, _len: u64, _may_trim: bool) -> Result<(), IoError> {
        Err(IoError::new(IoErrorKind::NotSupported, "plain file"))
    }
    fn block_status(&self, _offset: u64, len: u64) -> Result<Vec<Extent>, IoError> {
        Ok(vec![Extent {
            length: len,
            hole: false,
            zero: false,
        }])
    }
}

fn parse_size(s: &str) -> Option<usize> {
    let (num, shift) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 10),
        b'M' | b'm' => (&s[..s.len() - 1], 20),
        b'G' | b'g' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    num.parse::<usize>().ok().map(|n| n << shift)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, socket, backing] = &args[..] else {
        return Err("usage: serve SOCKET (mem:SIZE | FILE)".into());
    };
    let device: Arc<dyn BlockIo> = match backing.strip_prefix("mem:") {
        Some(size) => Arc::new(MemDevice::new(parse_size(size).ok_or("bad size")?)),
        None => Arc::new(FileDevice(
            File::options().read(true).write(true).open(backing)?,
        )),
    };
    let exports = Arc::new(MemExports::new().with("disk", "example export", device));
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(socket)?;
    eprintln!("serving export 'disk' on {socket}");
    serve_unix(
        listener,
        exports,
        ServerOptions::default(),
        tokio::signal::ctrl_c(),
    )
    .await;
    Ok(())
}
