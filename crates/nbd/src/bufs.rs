//! Recycled payload buffers for READ replies and WRITE payloads.
//!
//! A fresh `vec![0; 1 MiB]` per request comes from newly mapped pages: the
//! kernel faults and clears every page, then the buffer is freed and the
//! next request pays again. Under 1 MiB sequential I/O that was about a
//! tenth of the daemon's time. Buffers of at least [`MIN`] bytes are kept
//! here after use and handed out again, zeroed to the requested length, so
//! no request ever sees another's data. At most [`KEEP_BYTES`] are kept.

use std::sync::Mutex;

/// Smaller buffers come cheaply from the allocator's free lists.
const MIN: usize = 64 << 10;
/// Larger ones are rare (the default maximum payload is 32 MiB): not kept.
const MAX: usize = 4 << 20;
const KEEP_BYTES: usize = 64 << 20;

struct Kept {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

static KEPT: Mutex<Kept> = Mutex::new(Kept {
    bufs: Vec::new(),
    bytes: 0,
});

fn kept() -> std::sync::MutexGuard<'static, Kept> {
    KEPT.lock().unwrap_or_else(|e| e.into_inner())
}

/// A buffer of `len` zero bytes.
pub(crate) fn take(len: usize) -> Vec<u8> {
    let mut b = take_to_overwrite(len);
    b.fill(0);
    b
}

/// A buffer of `len` bytes that the caller overwrites whole before any of
/// it is used (a WRITE payload read off the socket): a reused one keeps
/// its old bytes rather than paying to zero them.
pub(crate) fn take_to_overwrite(len: usize) -> Vec<u8> {
    if (MIN..=MAX).contains(&len) {
        let found = {
            let mut k = kept();
            let i = k.bufs.iter().rposition(|b| b.capacity() >= len);
            i.map(|i| {
                let b = k.bufs.swap_remove(i);
                k.bytes -= b.capacity();
                b
            })
        };
        if let Some(mut b) = found {
            b.resize(len, 0);
            return b;
        }
    }
    vec![0; len]
}

/// Hands a buffer back once its contents are no longer needed.
pub(crate) fn give(b: Vec<u8>) {
    let cap = b.capacity();
    if !(MIN..=MAX).contains(&cap) {
        return;
    }
    let mut k = kept();
    if k.bytes + cap <= KEEP_BYTES {
        k.bytes += cap;
        k.bufs.push(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recycled_buffers_come_back_zeroed_and_sized() {
        let mut b = take(MIN * 2);
        assert_eq!(b.len(), MIN * 2);
        b.fill(0xAB);
        give(b);
        for len in [MIN, MIN * 2, 100, MAX + 1] {
            let b = take(len);
            assert_eq!(b.len(), len);
            assert!(
                b.iter().all(|&x| x == 0),
                "a reused buffer leaked old bytes"
            );
            give(b);
        }
        let b = take_to_overwrite(MIN + 1);
        assert_eq!(b.len(), MIN + 1);
        give(b);
    }

    #[test]
    fn the_pool_is_bounded() {
        for _ in 0..(KEEP_BYTES / MAX) * 2 {
            give(vec![0; MAX]);
        }
        assert!(kept().bytes <= KEEP_BYTES);
    }
}
