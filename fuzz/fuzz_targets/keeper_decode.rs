//! The keeper's message decoder on arbitrary bytes: an error or a message,
//! never a panic; a message decoded is encoded back to exactly its bytes
//! (one encoding per message, every field inside its bounds).
#![no_main]

use lamina_keeper::proto::Message;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Message::decode(data) {
        assert_eq!(m.encode(), data);
    }
});
